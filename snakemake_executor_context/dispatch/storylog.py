"""The story of a job: every decision the dispatch machine took about it, in order,
each with the stimulus that caused it (as distributed's worker state machine keeps a
``stimulus_id`` on every instruction and answers ``story(key)``).

:class:`StoryLog` keeps the machine's own entries (bounded, newest kept) and answers
:meth:`StoryLog.story` for a job key or an attempt key. The decisions a placement and
a report do not already record in the catalog (losses and the budget each was
charged to, requeues, results fenced off, cancellations, waits for a server) also go
to the catalog as :class:`~..fleet.events.JobStory` events, which
``snakemake-context story`` reads. Plain data, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from ..fleet import events as ev
from ..fleet.keys import job_key_of
from .vocabulary import (
    AttemptEnded,
    CachesProbed,
    CancelAll,
    Command,
    DagPlanned,
    FleetEvent,
    JobReady,
    Record,
    SchedulerLost,
    ServersPolled,
    Stimulus,
    Stopped,
    StopQueued,
    Tick,
)

__all__ = ["StoryEntry", "StoryLog", "stamped", "stimulus_id"]

#: Entries kept in memory (the catalog keeps what matters for good).
STORY_LIMIT = 50_000


@dataclass(frozen=True)
class StoryEntry:
    """One decision about one job."""

    at: float
    #: The stimulus that caused it ("fleet-server-left-12").
    stimulus: str
    #: The job key, and the attempt the decision is about (if one).
    job: str
    attempt: str | None
    #: What happened ("ready", "placed", "lost", "requeued", ...), and its detail.
    what: str
    detail: str = ""

    def line(self) -> str:
        """One line: what, detail, the attempt and the stimulus."""
        attempt = f" [{self.attempt}]" if self.attempt else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.what}{detail}{attempt} (stimulus {self.stimulus})"


_KINDS: dict[type, str] = {
    JobReady: "job-ready",
    AttemptEnded: "attempt-ended",
    ServersPolled: "servers-polled",
    Tick: "tick",
    CancelAll: "cancel-all",
    DagPlanned: "dag-planned",
    CachesProbed: "caches-probed",
    SchedulerLost: "scheduler-lost",
    StopQueued: "stop-queued",
    Stopped: "stopped",
}


def stimulus_id(stimulus: Stimulus, number: int) -> str:
    """A stimulus's id: its kind and its number in the run ("attempt-ended-42",
    "fleet-server-left-7")."""
    if isinstance(stimulus, FleetEvent):
        return f"fleet-{stimulus.event.kind}-{number}"
    return f"{_KINDS.get(type(stimulus), 'stimulus')}-{number}"


def stamped(command: Command, stimulus: str) -> Command:
    """The command, and the catalog record it carries, marked with its stimulus."""
    event = command.event if isinstance(command, Record) else None
    if isinstance(event, (ev.JobDispatched, ev.JobReported, ev.JobStory)):
        event.stimulus = stimulus  # made by this stimulus, never sent yet
    return replace(command, stimulus=stimulus)


class StoryLog:
    """The machine's decisions, newest :data:`STORY_LIMIT` kept."""

    def __init__(self, limit: int = STORY_LIMIT) -> None:
        self._entries: deque[StoryEntry] = deque(maxlen=limit)

    def add(self, entry: StoryEntry) -> None:
        """Keep one decision."""
        self._entries.append(entry)

    def story(self, key: str) -> list[StoryEntry]:
        """The decisions about a job, in order, from its job key or any of its
        attempt keys."""
        job = job_key_of(key)
        return [entry for entry in self._entries if entry.job == job]
