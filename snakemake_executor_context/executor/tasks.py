"""The Dask side of attempts: their futures, submitted, cancelled, stopped, polled.

Used only by :meth:`~.adapter.Executor._execute`, which carries out the dispatch
machine's commands: no other code submits or cancels a task.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..dispatch.vocabulary import AttemptEnded, JobTicket, Stopped, Submit
from ..fleet import events as ev
from ..fleet.keys import attempt_key, attempt_log, attempt_number
from ..jobspec import (
    RULE_PARTS,
    ContextJobSpec,
    GroupJobSpec,
    JobResult,
    OutputSpec,
    RulePart,
    remove_outputs,
)
from .results import attempt_ended, fetch_results

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = ["Tasks"]

logger = logging.getLogger(__name__)


class Tasks:
    """The futures of this run's attempts, by attempt key."""

    def __init__(self, connection: ClusterConnection) -> None:
        self.connection = connection
        self._futures: dict[str, Any] = {}
        self._steps: dict[str, str] = {}
        #: Results fetched together, for :meth:`ended` to take.
        self._fetched: dict[str, JobResult] = {}
        #: (run, digest) of the rule parts the scheduler holds for the servers.
        self._published: set[tuple[str, str]] = set()

    def submit(
        self, batch: list[tuple[Submit, Any]], on_done: Callable[[str], None]
    ) -> list[tuple[str, str]]:
        """Submit attempts (each ``command.key`` with its ``spec``) together: one
        message to the scheduler for those of the same pin, resources and priority.
        Returns (key, why not) of those refused."""
        groups: dict[tuple[Any, ...], list[tuple[Submit, Any]]] = {}
        for command, spec in batch:
            wanted = tuple(sorted(command.ticket.wanted.items()))
            where = (command.address, wanted, command.ticket.priority)
            groups.setdefault(where, []).append((command, self._prepared(command, spec)))
        refused = []
        for (address, wanted, priority), members in groups.items():
            refusal = self._send(address, dict(wanted), priority, members, on_done)
            if refusal is not None:
                refused += [
                    (command.key, f"{command.ticket.title}: {refusal}") for command, _ in members
                ]
        return refused

    @staticmethod
    def _prepared(command: Submit, spec: Any) -> Any:
        """``spec`` as attempt ``command.key`` runs it: its own log; what a lost
        attempt wrote removed, so that it cannot pass for the rerun's. A group's
        members take the group's attempt number."""
        number = attempt_number(command.key)
        if number > 1:
            outputs = [o if isinstance(o, OutputSpec) else OutputSpec(str(o)) for o in spec.outputs]
            remove_outputs(o for o in outputs if not o.keep)
        log_path = attempt_log(spec.log_path, number)
        if isinstance(spec, GroupJobSpec):
            layers = [
                [
                    dataclasses.replace(
                        m, key=attempt_key(m.key, number), log_path=attempt_log(m.log_path, number)
                    )
                    for m in layer
                ]
                for layer in spec.layers
            ]
            return dataclasses.replace(spec, key=command.key, log_path=log_path, layers=layers)
        return dataclasses.replace(spec, key=command.key, log_path=log_path)

    def _send(
        self,
        address: str | None,
        wanted: dict[str, float],
        priority: int,
        members: list[tuple[Submit, Any]],
        on_done: Callable[[str], None],
    ) -> str | None:
        from ..server.calls import execute_job

        pin: dict[str, Any] = {}
        if address is not None:
            # Pinned hard: work stealing leaves it where placement put it. If the
            # server leaves, dispatch takes the job back (Dask would hold it forever).
            pin = {"workers": [address], "allow_other_workers": False}
        try:
            for _, spec in members:
                self._publish_rule_parts(spec)
            futures = self.connection.client.map(
                execute_job,
                [spec for _, spec in members],
                key=[command.key for command, _ in members],
                pure=False,
                # Pinned, placement counted the slots; Dask would count a gpu=1 job
                # as the whole server's gpu and run one at a time whatever its slots.
                resources=None if pin else (wanted or None),
                priority=priority,
                **pin,
            )
        except Exception as error:
            return f"could not be submitted to Dask: {error}"
        for (command, _), future in zip(members, futures, strict=True):
            self._futures[command.key] = future
            self._steps[command.key] = str(command.step)
            future.add_done_callback(lambda _, key=command.key: on_done(key))
        return None

    def _publish_rule_parts(self, spec: Any) -> None:
        """Hand each rule part of a prepared spec (a group's: of each member) to the
        scheduler once, for every server that lacks it to fetch, and send the spec with
        its digest only."""
        members = spec.members if isinstance(spec, GroupJobSpec) else [spec]
        for member in members:
            if not isinstance(member, ContextJobSpec) or member.rule_part.data is None:
                continue
            part = member.rule_part
            if (member.run_id, part.digest) not in self._published:
                where = [*RULE_PARTS, member.run_id, part.digest]
                self.connection.client.set_metadata(where, part.data)
                self._published.add((member.run_id, part.digest))
            member.rule_part = RulePart(part.digest)

    def forget_rule_parts(self) -> None:
        """Drop this run's rule parts from the scheduler (an attached one outlives the
        run)."""
        for run_id in {run_id for run_id, _ in self._published}:
            try:
                self.connection.client.set_metadata([*RULE_PARTS, run_id], {})
            except Exception as error:  # the scheduler gone: nothing is left to drop
                logger.debug("dropping the rule parts of %s: %r", run_id, error)
        self._published.clear()

    def pop(self, key: str) -> tuple[Any, str] | None:
        """Take attempt ``key``'s future and its placement step (None: cancelled)."""
        future = self._futures.pop(key, None)
        step = self._steps.pop(key, "")
        return (future, step) if future is not None else None

    def fetch(self, keys: list[str]) -> None:
        """Fetch the results of these attempts that finished, together (for
        :meth:`ended`; what cannot be had together is fetched there, alone)."""
        finished = {
            key: future
            for key in keys
            if (future := self._futures.get(key)) is not None and future.status == "finished"
        }
        if finished:
            self._fetched.update(fetch_results(self.connection.client, finished))

    def ended(
        self, key: str, ticket: JobTicket | None, on_done: Callable[[str], None]
    ) -> tuple[AttemptEnded | None, list[dict[str, Any]] | None]:
        """The end of attempt ``key``, whose future is done, and its run-summary entries.
        (None, None) if dispatch cancelled it, or if the task had finished but its
        result died with its server before it was fetched (a job that crashed the
        server next): then the future is held again, since the server's loss requeues
        a pinned attempt (cancelling this future), and Dask reruns an unpinned one,
        whose end comes back here."""
        found = self.pop(key)
        fetched = self._fetched.pop(key, None)
        if found is None or ticket is None:
            return None, None
        ended, entries = attempt_ended(key, *found, ticket, fetched)
        if ended is None:
            future, step = found
            self._futures[key] = future
            self._steps[key] = step
            future.add_done_callback(lambda _: on_done(key))
        return ended, entries

    def cancel(self, key: str) -> None:
        """Drop attempt ``key`` in Dask; its result, if one comes, is ignored."""
        found = self.pop(key)
        if found is not None:
            try:
                found[0].cancel()
            except Exception as error:  # a client closed with its lost scheduler
                logger.debug("cancelling %s: %r", key, error)

    def done(self, key: str) -> bool:
        """Whether attempt ``key``'s future has finished (for a poll)."""
        future = self._futures.get(key)
        return future is not None and future.done()

    def stop(self, keys: tuple[str, ...]) -> Stopped:
        """Stop running attempts: the embedded cluster is killed outright; on an
        attached one each job is stopped where it runs, and a server whose job does
        not stop within 10 s is restarted. Returns the stimulus that says so."""
        from ..server.calls import cancel_jobs

        if self.connection.embedded:
            self.connection.kill()
            return Stopped(keys, time.time())
        client = self.connection.client
        futures = [self._futures[key] for key in keys if key in self._futures]
        try:
            outcome = self.connection.run(cancel_jobs, list(keys), 10.0, timeout=30.0)
            stuck = [
                address
                for address, per_job in outcome.items()
                if isinstance(per_job, dict) and "running" in per_job.values()
            ]
            if stuck:
                # Announced first: the hub records these ends as restarts, not crashes.
                why = "a job did not stop within 10 s of being cancelled"
                notes = [ev.ServerRestarting(address=a, why=why) for a in stuck]
                client.log_event(ev.RECORD_TOPIC, ev.encode(notes))
                client.restart_workers(stuck, raise_for_error=False)
            client.cancel(futures, force=True)
        except Exception as error:
            logger.debug("stopping jobs on the servers: %r", error)
        return Stopped(keys, time.time())
