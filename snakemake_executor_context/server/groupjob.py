"""A Snakemake group on its server: its members run against the loaded contexts,
layer after layer of the group's topological order, the members of one layer at once
as the server's slots let them (each member still passes the slot gate).

Snakemake's semantics for a group: a member that fails fails the group, and no
member starts after it (the ones running finish); a ``temp()`` file only members
need is removed once its last consumer is done. Each member is a job of its own: it
runs under its own limits (its rule's ``runtime``, not the group's sum), and the
group's result carries each member's result, one for a member not run too (cancelled
where it never started), so that the executor records every member; its failure is its
server's fault when its failed member's is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..fleet.outcome import Outcome, ServerIdentity
from ..jobspec import ContextJobSpec, GroupJobSpec, JobResult, PlainJobSpec, remove_path
from .processwide import open_own_file
from .running import RunningJob

__all__ = ["run_group"]

Member = ContextJobSpec | PlainJobSpec


def run_group(
    spec: GroupJobSpec,
    running: RunningJob,
    run_member: Callable[[Member, RunningJob], JobResult | None],
    server: ServerIdentity,
    width: int,
) -> JobResult:
    """Run the group's members (``run_member`` runs one, or returns None when the
    group was cancelled before it started) at most ``width`` at once."""
    started = time.time()
    stop = threading.Event()
    results: list[JobResult] = []
    lock = threading.Lock()
    log = _GroupLog(spec)

    def one(member: Member) -> None:
        if stop.is_set() or running.cancel_requested:
            return
        log.started(member)
        result = run_member(member, running)
        if result is None:
            return
        log.ended(result)
        with lock:
            results.append(result)
        if not result.ok:
            stop.set()

    try:
        for number, layer in enumerate(spec.layers):
            if stop.is_set() or running.cancel_requested:
                break
            if len(layer) == 1 or width <= 1:
                for member in layer:
                    one(member)
            else:
                with ThreadPoolExecutor(max_workers=min(width, len(layer))) as pool:
                    list(pool.map(one, layer))
            if not stop.is_set() and number < len(spec.temp_ends):
                for path in spec.temp_ends[number]:
                    remove_path(os.path.join(spec.workdir, path))
    finally:
        log.close(len(results))
    return _sealed(spec, running, server, started, results, log.path)


def _sealed(
    spec: GroupJobSpec,
    running: RunningJob,
    server: ServerIdentity,
    started: float,
    results: list[JobResult],
    log_path: str,
) -> JobResult:
    ran = len(results)
    failed = next((r for r in results if not r.ok and not r.outcome.cancelled), None)
    cancelled = running.cancel_requested or any(r.outcome.cancelled for r in results)
    ok = failed is None and not cancelled and ran == len(spec.members)
    unrun = _not_run(spec, server, results, failed)
    outcomes = [r.outcome for r in results]
    outcome = Outcome(
        spec.key,
        server,
        ok=ok,
        cancelled=cancelled and failed is None,
        fault=failed.outcome.fault if failed is not None else "",
        started=started,
        finished=time.time(),
        items=sum(o.items for o in outcomes),
        load_seconds=sum(o.load_seconds for o in outcomes),
        loaded=tuple(dict.fromkeys(i for o in outcomes for i in o.loaded)),
        reused=tuple(dict.fromkeys(i for o in outcomes for i in o.reused)),
    )
    message = None
    if failed is not None:
        message = (
            f"{failed.message or failed.key} ({ran} of {len(spec.members)} members of "
            f"{spec.title} ran; group log: {log_path})"
        )
    elif not ok:
        message = f"{spec.title}: cancelled on {server.describe()} after {ran} member(s)."
    result = JobResult(
        outcome,
        message=message,
        log_path=failed.log_path if failed is not None else log_path,
        members=results + unrun,
    )
    for member in results:
        for say in ("warnings", "notes"):
            result.extra.setdefault(say, []).extend(member.extra.get(say, ()))
    return result


def _not_run(
    spec: GroupJobSpec, server: ServerIdentity, results: list[JobResult], failed: JobResult | None
) -> list[JobResult]:
    """A cancelled result for each member that never started, saying why."""
    ran = {r.key for r in results}
    titles = {member.key: member.title for member in spec.members}
    why = "the group was cancelled"
    if failed is not None:
        why = f"{titles.get(failed.key, failed.key)} failed first"
    now = time.time()
    return [
        JobResult(
            Outcome(member.key, server, cancelled=True, started=now, finished=now),
            message=f"{member.title}: not run: {why}.",
        )
        for member in spec.members
        if member.key not in ran
    ]


class _GroupLog:
    """The group's own log, written as it runs (each member's start, then its end), so
    that it names the member that ran when its server died mid-group."""

    def __init__(self, spec: GroupJobSpec) -> None:
        self.spec, self.path = spec, os.path.join(spec.workdir, spec.log_path)
        self._lock = threading.Lock()
        self._file = open(open_own_file(self.path), "w", encoding="utf-8")
        self._write(f"{spec.title}: {len(spec.members)} member(s)")

    def _write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()  # the server may die before the group ends

    def started(self, member: Member) -> None:
        """A member starts."""
        log = os.path.join(self.spec.workdir, member.log_path)
        self._write(f"{member.title}: started (log: {log})")

    def ended(self, result: JobResult) -> None:
        """A member ended."""
        o = result.outcome
        how = "ok" if o.ok else ("cancelled" if o.cancelled else "failed")
        title = next((m.title for m in self.spec.members if m.key == o.key), o.key)
        self._write(f"{title}: {how} in {o.finished - o.started:.2f} s")

    def close(self, ran: int) -> None:
        """The group ended after ``ran`` of its members."""
        self._write(f"{self.spec.title}: {ran} of {len(self.spec.members)} member(s) ran")
        self._file.close()
