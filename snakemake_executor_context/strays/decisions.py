"""Which processes a job left running: pure decisions over the facts of processes.

Each decision takes :class:`ProcessFacts` (read from ``/proc`` by
:func:`.processes.read_processes`) and returns :class:`Leftovers`: the processes to
end, and those kept on purpose (``SNAKEMAKE_CONTEXT_KEEP=1`` in their environment, or
below one that has it). :func:`job_leftovers` for a plain job (its mark),
:func:`span_leftovers` for in-process jobs (what started below the server while they
ran), :func:`server_orphans` for a server that died (what its parent adopted).
:func:`.processes.end_leftovers` carries a decision out. Standard library only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Leftovers",
    "ProcessFacts",
    "describe",
    "job_leftovers",
    "server_orphans",
    "span_leftovers",
    "subtree",
]


@dataclass(frozen=True)
class ProcessFacts:
    """What the decisions need to know of one process."""

    pid: int
    ppid: int
    #: When it started, in clock ticks after boot: with the pid, its identity.
    started: int
    command: str = ""
    #: Its environment's marks (as it was exec'd): the plain job it belongs to, the
    #: server below which it started, and whether it is kept on purpose.
    job: str = ""
    server: str = ""
    keep: bool = False
    zombie: bool = False

    @property
    def identity(self) -> tuple[int, int]:
        """Pid and start: what names this process and no later one with its pid."""
        return self.pid, self.started

    def describe(self) -> str:
        """'1234 (sleep 300)'."""
        command = self.command if len(self.command) <= 120 else self.command[:117] + "..."
        return f"{self.pid} ({command})"


@dataclass(frozen=True)
class Leftovers:
    """A decision: the processes to end, and those kept on purpose (named, not ended)."""

    end: tuple[ProcessFacts, ...] = ()
    kept: tuple[ProcessFacts, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.end or self.kept)


def describe(processes: Sequence[ProcessFacts]) -> str:
    """'1234 (sleep 300), 1240 (sh -c ...)'."""
    return ", ".join(process.describe() for process in processes)


def subtree(facts: Iterable[ProcessFacts], roots: Collection[int]) -> set[int]:
    """The pids of ``roots`` (those among ``facts``) and of everything below them."""
    children: dict[int, list[int]] = {}
    present = set()
    for fact in facts:
        children.setdefault(fact.ppid, []).append(fact.pid)
        present.add(fact.pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in present]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _split(candidates: Sequence[ProcessFacts], facts: Sequence[ProcessFacts]) -> Leftovers:
    """Candidates kept on purpose (marked, or below one that is) apart from the rest."""
    kept = subtree(facts, {c.pid for c in candidates if c.keep})
    return Leftovers(
        end=tuple(c for c in candidates if c.pid not in kept),
        kept=tuple(c for c in candidates if c.pid in kept),
    )


def job_leftovers(facts: Sequence[ProcessFacts], mark: str) -> Leftovers:
    """What a plain job left: every process carrying its mark (its environment's
    :data:`~..defaults.JOB_MARK_VARIABLE`, inherited through ``setsid`` and double
    forks), once the job has ended."""
    return _split([fact for fact in facts if fact.job == mark], facts)


def span_leftovers(
    facts: Sequence[ProcessFacts],
    since: int,
    owned: Collection[tuple[int, int]],
    server: int,
    spared: Collection[tuple[int, int]] = (),
) -> Leftovers:
    """What in-process jobs left, once none runs: of ``facts`` (the processes below
    the ``server`` process), those started at or after ``since`` (the first job's
    start, in clock ticks), and the server's zombie children (orphans it adopted that
    ended since); never a plain job's (marked: its own end ends them), nor any below a
    process the server's own machinery started (``owned`` identities: its zygote, a
    plain job's launcher, gang ranks, what a context's loader started): a zombie's
    mark cannot be read, so a child someone still waits for must be owned. The
    ``spared`` identities are left running, but not what is below them (the
    interpreter's own helpers, which every later job shares, and their forks)."""
    protected = subtree(facts, {f.pid for f in facts if f.job or f.identity in owned})
    return _split(
        [
            f
            for f in facts
            if f.pid not in protected
            and f.identity not in spared
            and (f.started >= since or (f.zombie and f.ppid == server))
        ],
        facts,
    )


def server_orphans(
    facts: Sequence[ProcessFacts],
    parent: int,
    mark: str,
    server: ProcessFacts | None,
    own: Collection[int],
) -> Leftovers:
    """What a server that died left, as the process above it sees it: it is a
    subreaper, so the orphans are its children. Those carrying the server's ``mark``
    (what the server started and exec'd), copies of the ``server`` process forked
    without an exec (its command, started after it), and its zombies started after
    it, with everything below them; never one of ``own`` (the parent's own children:
    the other servers' processes). Kept processes too: nothing outlives its server."""
    after = server.started if server is not None else None

    def orphan(fact: ProcessFacts) -> bool:
        if fact.ppid != parent or fact.pid in own:
            return False
        if fact.server == mark:
            return True
        if server is None or after is None or fact.started < after:
            return False
        return fact.zombie or (fact.command == server.command and bool(fact.command))

    below = subtree(facts, {fact.pid for fact in facts if orphan(fact)})
    return Leftovers(end=tuple(fact for fact in facts if fact.pid in below))
