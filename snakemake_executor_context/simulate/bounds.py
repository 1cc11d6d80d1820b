"""What the ``simulate`` command's values may be, and the flags that hold several
(``a10:10,titanx:10``, ``1/min``, ``RULE=S``) read into them.

Every value is checked by :mod:`..settings.checks` (one line naming the flag, the value and
what is allowed); the bounds say what keeps a simulation finite. Its events are the
jobs' (each attempt a few, attempts bounded by the loss budgets), a fleet check every
2 simulated seconds, the pool's decision every second, and one per preemption; and it
stops at :data:`SPAN` simulated seconds. So a fleet of at most :data:`MAX_SERVERS`,
at most :data:`MAX_RATE` preemptions a second per partition, and times that fit the
span bound what one run costs; a run that reaches the span is refused, not reported
as a prediction (:func:`.simcommand.run_command`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import SettingError
from ..settings.checks import NUMBER, SIZE, WHOLE, Allowed, check_value
from .model import Options, ServerKind
from .simdefaults import SLOTS

__all__ = [
    "BYTES",
    "GAIN",
    "GAIN_JOBS",
    "ITEMS",
    "MAX_RATE",
    "MAX_SERVERS",
    "PAIR_FLAGS",
    "SECONDS",
    "SLOWDOWN",
    "SPAN",
    "pair_form",
    "parse_counts",
    "parse_gpus",
    "parse_pairs",
    "parse_rate",
    "parse_rates",
    "read_pairs",
]

#: Simulated seconds after which a simulation stops (the run did not end).
SPAN = Options.limit
#: Servers of one simulated fleet: placement weighs every server for every job, so a
#: simulation's time grows with the fleet times the jobs (10,000 servers took 100 s
#: and 2 GB for 8 jobs here, 1,000 took 1.8 s).
MAX_SERVERS = 4096
#: Preemptions a second of one partition: each is an event, so over the span a
#: partition has at most 2.6 million; a fixed fleet's server takes 1 s to come back.
MAX_RATE = 1.0
_DAYS = f"{SPAN / 86400:g} simulated days"

#: Seconds of an item, a load, a local rule: at most the span (a longer one never ends).
SECONDS = Allowed(NUMBER, least=0, most=SPAN, unit="seconds")
#: A GPU model's time over the ``*`` time.
SLOWDOWN = Allowed(NUMBER, least=0.001, most=1000)
#: Items per job.
ITEMS = Allowed(WHOLE, least=1, most=10**9, unit="items")
#: Jobs at once on one server (of --slot-gain K=G) and their throughput over one alone:
#: below 0.01 a job takes a hundred times its time, above K it gains more than K jobs.
GAIN_JOBS = Allowed(WHOLE, least=1, most=256, unit="jobs at once")
GAIN = Allowed(NUMBER, least=0.01, most=256)
#: A context's bytes, or what a server fills with contexts (0: not modelled / no limit).
BYTES = Allowed(SIZE, most=2**50, zero="not modelled")
#: GPUs of one model, and servers of a fleet over GPU counts (--counts).
GPU_COUNT = Allowed(WHOLE, least=1, most=MAX_SERVERS, unit="GPUs")

#: The flags of ``KEY=VALUE`` pairs: what each one's values may be, and its keys
#: (None: any name).
PAIR_FLAGS: dict[str, tuple[Allowed, Allowed | None]] = {
    "--item-seconds": (SECONDS, None),
    "--slowdown": (SLOWDOWN, None),
    "--items": (ITEMS, None),
    "--load-seconds": (SECONDS, None),
    "--context-bytes": (BYTES, None),
    "--local-seconds": (SECONDS, None),
    "--slot-gain": (GAIN, GAIN_JOBS),
}

_UNITS = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_pairs(values: Iterable[str], flag: str) -> dict[str, str]:
    """'KEY=VALUE' flags as a mapping (a bad one named in one line)."""
    out = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise SettingError(f"{flag} {value!r} is not allowed: expected KEY=VALUE.")
        out[key.strip()] = text.strip()
    return out


def read_pairs(values: Iterable[str], flag: str) -> dict[Any, Any]:
    """A flag of :data:`PAIR_FLAGS` read: each key (parsed, where the flag bounds its
    keys) to its value parsed, a bad one refused in one line naming it."""
    value, key = PAIR_FLAGS[flag]
    out = {}
    for name, text in parse_pairs(values, flag).items():
        shown = f"{name}={text}"
        parsed = name if key is None else check_value(flag, name, key, shown)
        out[parsed] = check_value(flag, text, value, shown)
    return out


def pair_form(flag: str, item: str) -> None:
    """The form of a flag of :data:`PAIR_FLAGS`: refuses a bad pair as the command line
    is read."""
    read_pairs([item], flag)


def parse_rate(text: str, what: str) -> float:
    """Preemptions per second from '1/min', '0.5/s', '2/h' (or 0, 'none'), at most
    :data:`MAX_RATE` (``what``: the flag and the part, for the message)."""
    text = text.strip().lower()
    if text in ("0", "none", "off"):
        return 0.0
    found = re.fullmatch(r"([0-9.]+(?:e[-+]?[0-9]+)?)\s*/\s*([a-z]+)", text)
    rate = None
    if found and found.group(2) in _UNITS:
        try:
            rate = float(found.group(1)) / _UNITS[found.group(2)]
        except ValueError:
            pass
    if rate is None:
        raise SettingError(
            f"{what} is not allowed: {text!r} is not a rate. Fix: give a count per unit, "
            "like 1/min, 0.5/s or 2/h."
        )
    if not rate <= MAX_RATE:
        raise SettingError(
            f"{what} is not allowed: at most {MAX_RATE * 60:g}/min per partition. "
            f"Each preemption is an event of the simulation, which stops after {_DAYS}: "
            f"{MAX_RATE:g}/s bounds a partition's to {MAX_RATE * SPAN / 1e6:.1f} million "
            "(and a fixed fleet's server takes 1 s to come back)."
        )
    return rate


def parse_rates(text: str) -> dict[str, float]:
    """'1/min' (the whole fleet) or 'a10:1/min,titanx:2/h' (per partition)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        where, _, rate = part.rpartition(":")
        out[where or "*"] = parse_rate(rate, f"--preempt {part!r}")
    return out


def parse_gpus(text: str, slots: int = SLOTS, budget: int = 0) -> list[ServerKind]:
    """'a10:10,titanx:10' as kinds of servers (a model's count after its colon), at
    most :data:`MAX_SERVERS` in all."""
    kinds = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, _, count = part.rpartition(":")
        if not model or not count.strip():
            raise SettingError(
                f"--gpus {part!r}: expected MODEL:COUNT, like a10:10. Fix: --gpus "
                "a10:10,titanx:10 (cpu:2 for CPU servers)."
            )
        number = check_value("--gpus", count, GPU_COUNT, part)
        kinds.append(ServerKind(model.lower(), int(number), slots, budget))
    if not kinds:
        raise SettingError("--gpus names no servers. Fix: --gpus a10:10,titanx:10.")
    total = sum(kind.count for kind in kinds)
    if total > MAX_SERVERS:
        raise SettingError(
            f"--gpus {text!r} is not allowed: {total} GPUs, at most {MAX_SERVERS} in all "
            "(placement weighs every server for every job: a larger fleet takes hours to "
            "simulate). Fix: fewer GPUs."
        )
    return kinds


def parse_counts(text: str) -> list[int] | None:
    """--counts: GPU counts for the table ('none': no table; '': the default)."""
    if text.strip().lower() == "none":
        return []
    if not text.strip():
        return None
    counts = [check_value("--counts", t.strip(), GPU_COUNT) for t in text.split(",")]
    return [int(n) for n in counts]
