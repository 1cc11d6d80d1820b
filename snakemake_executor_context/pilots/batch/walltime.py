"""A pilot's walltime as its batch system reads it: pure functions.

The same text means different times to different batch systems: ``04:00`` is 4
minutes to SLURM (MM:SS) and PBS (MM:SS), 4 hours to LSF (HH:MM), and no time at all
to SGE (whose ``h_rt`` wants H:M:S or seconds). :func:`read_walltime` reads it as the
chosen backend does and returns that reading, which the run prints; a text whose
reading is doubtful (a field beyond its range, such as the 99 seconds of SLURM's
``99:99``, or a form the batch system does not define) is refused in one line.

Each batch system's forms, from its documentation, are in its module of
:mod:`..batch` (:attr:`~.system.BatchSystem.walltime_forms`); how each writes a
walltime for its jobs is there too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .registry import BACKENDS

__all__ = ["WalltimeError", "WalltimeReading", "read_walltime", "slurm_time"]

_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: The largest value of a field that follows a larger unit.
_RANGE = {"h": 23, "m": 59, "s": 59}


class WalltimeError(ValueError):
    """A walltime the backend cannot read, or reads doubtfully: the reason."""


@dataclass(frozen=True)
class WalltimeReading:
    """A walltime as one batch system reads it."""

    backend: str
    text: str
    #: Which of the backend's forms it is ("MM:SS").
    form: str
    #: Seconds the batch system enforces (SLURM rounds up to whole minutes).
    seconds: int

    def describe(self) -> str:
        """'SLURM reads '04:00' as MM:SS: 00:04:00 (4 min)'."""
        return (
            f"{BACKENDS[self.backend].title} reads {self.text!r} as {self.form}: "
            f"{slurm_time(self.seconds)} ({_spoken(self.seconds)})"
        )


def slurm_time(seconds: int) -> str:
    """Seconds as ``scontrol show job`` prints a time limit: HH:MM:SS, D-HH:MM:SS."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def _spoken(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts) or "0 s"


def read_walltime(backend: str, text: str) -> WalltimeReading:
    """``text`` as ``backend`` reads it; WalltimeError (the reason, and the forms it
    takes) when that batch system cannot read it, or its reading is doubtful."""
    system = BACKENDS.get(backend)
    if system is None:
        raise WalltimeError(f"no batch system {backend!r} (one of {', '.join(sorted(BACKENDS))})")
    name = system.title
    spelled = " or ".join(form.name for form in system.walltime_forms)
    clean = str(text).strip()
    for form in system.walltime_forms:
        match = re.fullmatch(form.pattern, clean)
        if match is None:
            continue
        fields = form.fields
        values = [int(part) if part else 0 for part in match.groups()]
        seconds = sum(_SECONDS[field] * value for field, value in zip(fields, values, strict=True))
        if system.whole_minutes:
            seconds = math.ceil(seconds / 60) * 60
        for position, (field, value) in enumerate(zip(fields, values, strict=True)):
            if position > 0 and value > _RANGE[field]:
                unit = {"h": "hours", "m": "minutes", "s": "seconds"}[field]
                raise WalltimeError(
                    f"{name} reads it as {form.name}, {slurm_time(seconds)} ({_spoken(seconds)}), "
                    f"with {value} {unit} (more than {_RANGE[field]}), which is easy to "
                    f"misread: write {form.name} with each field in its range"
                )
        if seconds <= 0:
            raise WalltimeError(
                f"{name} reads it as no time limit, and a pilot must retire before its "
                f"walltime: write {spelled}, above 0"
            )
        return WalltimeReading(backend, clean, form.name, seconds)
    raise WalltimeError(f"it is not a walltime {name} reads: write {spelled}")
