"""Which of a server's jobs may run now: the slot gate.

A server offers N slots (Dask runs up to N of its tasks at once, one thread each).
Jobs in one process share what is process-global (cwd, environment, ``sys.path``,
thread pools, fd-level stdio), so the gate lets context jobs overlap only when they
agree on all of it: the same *group* (workflow directory, script, threads,
environment and search paths; see :func:`group_of`). On top of that:

- a context that cannot be shared (``shareable=False``) gets the whole server: its
  job starts alone, and nothing else starts beside it;
- each context runs at most its *limit* of jobs at once: 1 until its per-job working
  memory is known, then what the server's memory holds (:func:`fitting_slots`);
- waiting jobs go in arrival order when they are blocked by a group or an exclusive
  job: later jobs of the running group do not overtake them (no starvation).

Plain jobs (their own processes) take a slot but never wait here. The policy,
:func:`may_start`, is a pure function of what runs and what waits;
:class:`SlotGate` blocks threads on it. Standard library only: the GPU check script
loads this file by path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = ["Entry", "SlotGate", "fitting_slots", "may_start"]


@dataclass(frozen=True)
class Entry:
    """One job at the gate."""

    key: str
    #: What the job shares with others in the process (None: a plain job).
    group: Hashable | None = None
    #: Its context's identity (None: a plain job).
    identity: str | None = None
    #: Whether it needs the whole server (a context that cannot be shared).
    exclusive: bool = False


def may_start(
    entry: Entry,
    running: Sequence[Entry],
    ahead: Sequence[Entry],
    limits: Mapping[str, int],
    unshareable: Collection[str] = (),
    slots: int | None = None,
) -> bool:
    """Whether ``entry`` may start beside ``running``, with ``ahead`` waiting before it.

    ``limits`` caps the jobs of a context at once (absent: no cap beyond the slots);
    the jobs of ``unshareable`` contexts are exclusive whatever their entries say
    (a loader may tell so only once it has loaded). With ``slots``, at most that
    many jobs run at once (a Dask worker already runs no more tasks than its threads).
    """
    if slots is not None and len(running) >= slots:
        return False
    if entry.group is None:
        return True
    if unshareable:
        entry, running, ahead = (
            _marked(entry, unshareable),
            [_marked(e, unshareable) for e in running],
            [_marked(e, unshareable) for e in ahead],
        )
    in_process = [e for e in running if e.group is not None]
    if any(e.exclusive for e in in_process):
        return False
    if entry.exclusive:
        return not in_process and not any(e.group is not None for e in ahead)
    if any(e.group != entry.group for e in in_process):
        return False
    # An earlier job waiting for the running group to drain goes first.
    if any(e.group is not None and (e.exclusive or e.group != entry.group) for e in ahead):
        return False
    if entry.identity is not None:
        limit = limits.get(entry.identity)
        same = sum(1 for e in in_process if e.identity == entry.identity)
        if limit is not None and same >= limit:
            return False
    return True


def _marked(entry: Entry, unshareable: Collection[str]) -> Entry:
    if entry.exclusive or entry.identity not in unshareable:
        return entry
    return replace(entry, exclusive=True)


def fitting_slots(slots: int, capacity: int, loaded: int, per_job: int) -> int:
    """How many jobs of one context fit at once: ``capacity`` bytes hold the loaded
    contexts (``loaded``, counted once) plus ``per_job`` working memory per job; at
    least 1, at most ``slots``."""
    if per_job <= 0:
        return max(1, slots)
    return max(1, min(slots, (capacity - loaded) // per_job))


class SlotGate:
    """Blocks a server's job threads until :func:`may_start` lets them run."""

    def __init__(self, slots: int = 1) -> None:
        self.slots = max(1, int(slots))
        self._cond = threading.Condition()
        self._running: dict[str, Entry] = {}
        self._waiting: list[Entry] = []
        self._limits: dict[str, int] = {}
        #: Jobs that had another in-process job beside them at some time.
        self._overlapped: set[str] = set()
        self._unshareable: set[str] = set()

    def enter(self, entry: Entry, *, poll: float = 0.1) -> None:
        """Wait until ``entry`` may start, then count it as running. The wait is in
        short steps: a job's cancellation (an asynchronous exception) lands between
        them, and the entry then leaves the queue."""
        with self._cond:
            self._waiting.append(entry)
        try:
            while True:
                with self._cond:
                    if self._admit(entry):
                        return
                    self._cond.wait(poll)
        except BaseException:
            with self._cond:
                if entry in self._waiting:
                    self._waiting.remove(entry)
                self._running.pop(entry.key, None)
                self._cond.notify_all()
            raise

    def _admit(self, entry: Entry) -> bool:
        index = self._waiting.index(entry)
        running = list(self._running.values())
        ahead = self._waiting[:index]
        if not may_start(entry, running, ahead, self._limits, self._unshareable, self.slots):
            return False
        self._waiting.pop(index)
        beside = [k for k, e in self._running.items() if e.group is not None]
        if entry.group is not None and beside:
            self._overlapped.update(beside)
            self._overlapped.add(entry.key)
        self._running[entry.key] = entry
        self._cond.notify_all()
        return True

    def leave(self, key: str) -> bool:
        """The job ``key`` ended: its slot is free. Whether another in-process job
        ran beside it at some time."""
        with self._cond:
            self._running.pop(key, None)
            self._cond.notify_all()
            overlapped = key in self._overlapped
            self._overlapped.discard(key)
            return overlapped

    def set_limit(self, identity: str, jobs: int) -> None:
        """Run at most ``jobs`` jobs of that context at once."""
        with self._cond:
            self._limits[identity] = max(1, int(jobs))
            self._cond.notify_all()

    def mark_unshareable(self, identity: str) -> None:
        """From now on, that context's jobs each get the whole server."""
        with self._cond:
            self._unshareable.add(identity)
            self._cond.notify_all()

    def limit(self, identity: str) -> int | None:
        """The cap on that context's jobs at once (None: none set)."""
        with self._cond:
            return self._limits.get(identity)

    def snapshot(self) -> dict[str, object]:
        """Slots, and the jobs running and waiting (for a server's inventory)."""
        with self._cond:
            return {
                "slots": self.slots,
                "running": sorted(self._running),
                "waiting": [e.key for e in self._waiting],
                "limits": dict(self._limits),
            }

    def run(self, entry: Entry, body: Callable[[], object]) -> object:
        """Run ``body`` as ``entry`` (enter, call, leave)."""
        self.enter(entry)
        try:
            return body()
        finally:
            self.leave(entry.key)
