"""A server's slots: which of its jobs run at once, and how many of each context.

The slot gate (:mod:`.gate`) admits jobs; the shared group (:mod:`.sharing`) sets up
what the admitted jobs share. Each context starts at one job at a time; its per-job
working memory, declared by its loader (:func:`...contexts.declare_job_memory`) or
measured on its first job that ran alone (the peak of the process's RSS, or of
allocated CUDA memory on a GPU, above what it was once the context was loaded), then
raises that to what the server's memory holds: the loaded contexts once, plus the
working memory of each job (:func:`..fitting_slots`). On a GPU the memory is the
GPU's, so the slots never need more than the GPU has.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ...jobspec import ContextJobSpec
from ...terminal import format_bytes
from ..running import RunningJob
from .gate import Entry, SlotGate, fitting_slots
from .sharing import SharedGroup, group_of

__all__ = ["PeakMeter", "ServerSlots"]

logger = logging.getLogger(__name__)


@dataclass
class PeakMeter:
    """The peak memory of this process (or of its GPU) since :meth:`start`."""

    gpu: bool
    baseline: int = 0

    @classmethod
    def start(cls, gpu: bool) -> PeakMeter:
        """Reset the peak and take the current use as the baseline."""
        meter = cls(gpu)
        torch = sys.modules.get("torch")
        if gpu and torch is not None and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            meter.baseline = int(torch.cuda.memory_allocated())
        else:
            meter.gpu = False
            try:  # "5" resets the process's peak RSS (VmHWM), Linux 4.0+
                with open("/proc/self/clear_refs", "w") as refs:
                    refs.write("5")
            except OSError:
                pass
            meter.baseline = _status_bytes("VmRSS")
        return meter

    def peak_above_baseline(self) -> int:
        """Bytes the peak rose above the baseline."""
        torch = sys.modules.get("torch")
        if self.gpu and torch is not None:
            return max(0, int(torch.cuda.max_memory_allocated()) - self.baseline)
        return max(0, _status_bytes("VmHWM") - self.baseline)


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class ServerSlots:
    """The slots of one server (see the module)."""

    def __init__(
        self,
        slots: int,
        *,
        capacity: int,
        gpu: bool,
        where: str,
        loaded_bytes: Callable[[], int],
        said: Callable[[str, int], None] = lambda identity, jobs: None,
    ) -> None:
        self.gate = SlotGate(slots)
        self.group = SharedGroup()
        self.capacity = capacity
        self.gpu = gpu
        self.where = where
        self._loaded_bytes = loaded_bytes
        #: Tells the fleet how many jobs of a context the server runs at once.
        self._said = said
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()
        #: Working memory per job of each context: bytes, and "declared" or "measured".
        self.job_memory: dict[str, tuple[int, str]] = {}
        self._meters: dict[str, PeakMeter] = {}
        #: What the run's output should say, by the job whose run learned it.
        self._notes: dict[str, list[str]] = {}

    @property
    def slots(self) -> int:
        """How many jobs the server runs at once."""
        return self.gate.slots

    @contextmanager
    def admitted(self, spec: ContextJobSpec, running: RunningJob) -> Iterator[None]:
        """Wait (cancellable) until the job may run beside the others, then hold its
        slot; at its end, settle what its run measured."""
        identity = spec.declaration.identity
        self._names.setdefault(identity, spec.declaration.name)
        if self.gate.limit(identity) is None:
            self.gate.set_limit(identity, 1)
        exclusive = not spec.declaration.shareable
        entry = Entry(spec.key, group_of(spec), identity, exclusive)
        with running.interruptible_phase():
            self.gate.enter(entry)
        ok = False
        try:
            yield
            ok = True
        finally:
            overlapped = self.gate.leave(spec.key)
            meter = self._meters.pop(spec.key, None)
            if meter is not None and ok and not overlapped and identity not in self.job_memory:
                self._settle(spec.key, identity, meter.peak_above_baseline(), "measured")

    def loaded(self, key: str, identity: str, traits: tuple[bool, int | None] | None) -> None:
        """The job ``key`` holds its context now (``traits``: the cache's): learn
        whether it may be shared and its declared working memory, or start measuring."""
        if traits is None:
            return
        shareable, declared = traits
        if not shareable:
            self.gate.mark_unshareable(identity)
        if identity in self.job_memory or self.slots == 1:
            return
        if declared is not None:
            self._settle(key, identity, declared, "declared")
        else:
            self._meters[key] = PeakMeter.start(self.gpu)

    def _settle(self, key: str, identity: str, per_job: int, how: str) -> None:
        with self._lock:
            if identity in self.job_memory:
                return
            self.job_memory[identity] = (per_job, how)
        loaded = self._loaded_bytes()
        fit = fitting_slots(self.slots, self.capacity, loaded, per_job)
        self.gate.set_limit(identity, fit)
        self._said(identity, fit)
        need = (
            f"{format_bytes(loaded)} loaded + {self.slots} x {format_bytes(per_job)} per job "
            f"({how}) = {format_bytes(loaded + self.slots * per_job)}"
        )
        name = self._names.get(identity, identity[:12])
        if fit < self.slots:
            message = (
                f"{self.where} refuses {self.slots} slots for context '{name}': {need}, "
                f"more than its {format_bytes(self.capacity)}; it runs {fit} of its jobs at once."
            )
            logger.warning("%s", message)
        else:
            message = (
                f"{self.where} runs up to {fit} jobs of context '{name}' at once: {need} "
                f"of its {format_bytes(self.capacity)}."
            )
            logger.info("%s", message)
        with self._lock:
            self._notes.setdefault(key, []).append(message)

    def take_notes(self, key: str) -> list[str]:
        """What the job ``key``'s run learned about the slots (for the run's output)."""
        with self._lock:
            return self._notes.pop(key, [])

    def snapshot(self) -> dict[str, object]:
        """Slots, jobs running and waiting, and each context's limit and memory."""
        state = self.gate.snapshot()
        state["job_memory"] = {k: v[0] for k, v in self.job_memory.items()}
        return state
