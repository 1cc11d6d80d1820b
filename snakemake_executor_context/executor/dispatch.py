"""Dispatch: the executor's state machine, in Snakemake's process.

It takes *stimuli* and returns *commands* (:mod:`.vocabulary`), imports neither Dask
nor Snakemake, and does no I/O: :class:`~.adapter.Executor` feeds it from one thread
and carries out its commands in one function.

**One route for a job's end.** An attempt's *result* (the Dask task's value, or its
failure to produce one) is authoritative: only a result reports a job, and a given-up
attempt's result is fenced off. The server's ``JobFinished`` event (best-effort) only
frees the slot early; each slot is released once, by whichever comes first; an attempt
whose event came but whose result did not is polled at the next fleet check, and a
result that beats its event records the attempt's end itself: nothing waits.

**Membership** comes from the hub's events and the attach snapshot (Dask's list of
workers is only compared with it, unless there is no hub). A server that leaves takes
its attempts: their jobs go back to the queue, at most ``max_requeues`` times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ContextExecutorError, NoServerError
from ..fleet import events as ev
from ..fleet.keys import attempt_key
from ..fleet.placement import PlacementStep, choose_server
from ..fleet.resources import explain_unrunnable
from ..fleet.state import FleetState
from .demand import Demand
from .vocabulary import (
    AttemptEnded,
    CachesProbed,
    Cancel,
    CancelAll,
    Command,
    DagPlanned,
    FleetEvent,
    JobReady,
    JobTicket,
    Log,
    LossReason,
    Poll,
    ProbeCaches,
    Record,
    ReportError,
    ReportSuccess,
    ServersPolled,
    Stimulus,
    StopRunning,
    Submit,
    Tick,
)

__all__ = ["FLEET_CHECK_SECONDS", "Dispatch"]

#: Seconds between two fleet checks (the executor's poll of Dask's workers).
FLEET_CHECK_SECONDS = 2.0


@dataclass
class _Job:
    ticket: JobTicket
    seq: int
    dispatches: int = 0
    attempt: str | None = None
    waiting_since: float | None = None
    cancelled: bool = False


@dataclass
class _Attempt:
    key: str
    job: _Job
    address: str | None
    step: PlacementStep
    holds_slot: bool = True
    event_seen: float | None = None
    pinned: bool = True


class Dispatch:
    """The queue, the attempts in flight, requeues and unrunnable jobs of one run.

    ``embedded``: the run owns its fixed fleet: a job no server can run fails at once
    (unless none is up: one restarts); attached, it waits ``wait_for_server`` s for
    servers to join. ``placement``: ``affinity`` (ours) or ``dask`` (Dask chooses).
    """

    def __init__(
        self,
        run_id: str,
        *,
        embedded: bool,
        wait_for_server: float,
        placement: str = "affinity",
        max_requeues: int | None = None,
        fleet: FleetState | None = None,
    ) -> None:
        self.run_id = run_id
        self.embedded = embedded
        self.wait_for_server = wait_for_server
        self.placement = placement
        self.max_requeues = max_requeues
        self.fleet = fleet if fleet is not None else FleetState()
        #: Whether fleet membership comes from the hub's events (else from polls).
        self.hub = True
        #: Per-context work still to come, which placement weighs against a load.
        self.demand = Demand()
        self.failures = 0
        self._jobs: dict[str, _Job] = {}
        self._queue: list[_Job] = []
        self._attempts: dict[str, _Attempt] = {}
        self._seq = 0

    # -- the one entry point ---------------------------------------------------------

    def handle(self, stimulus: Stimulus) -> list[Command]:
        """Take one stimulus; return the commands it leads to (in order)."""
        out: list[Command] = []
        if isinstance(stimulus, JobReady):
            self._ready(stimulus, out)
        elif isinstance(stimulus, AttemptEnded):
            self._ended(stimulus, out)
        elif isinstance(stimulus, FleetEvent):
            self._fleet_event(stimulus.event, stimulus.now, out)
        elif isinstance(stimulus, ServersPolled):
            self._polled(stimulus, out)
        elif isinstance(stimulus, Tick):
            self._tick(stimulus.now, out)
        elif isinstance(stimulus, CancelAll):
            self._cancel_all(out)
        elif isinstance(stimulus, DagPlanned):
            self.demand.plan(stimulus.jobs)
        elif isinstance(stimulus, CachesProbed):
            self.fleet.probed(stimulus.found)
        if not isinstance(stimulus, CancelAll):
            self._place(stimulus.now, out)
        return out

    @property
    def queued(self) -> int:
        """Jobs waiting in the queue."""
        return len(self._queue)

    # -- jobs ------------------------------------------------------------------------

    def _ready(self, stimulus: JobReady, out: list[Command]) -> None:
        ticket = stimulus.ticket
        if stimulus.error is not None:
            error = stimulus.error
            self._report_error(ticket, str(error), ev.JobOutcome.INVALID, out, error=error)
            return
        self._seq += 1
        job = self._jobs[ticket.key] = _Job(ticket, self._seq)
        self.demand.ready(ticket.identity, ticket.jobid)
        if not self.fleet.runnable(ticket.wanted):
            job.waiting_since = stimulus.now
            if self.embedded and self.fleet.servers:
                self._fail_unrunnable(job, stimulus.now, out)
                return
        self._queue.append(job)

    def _place(self, now: float, out: list[Command]) -> None:
        """Submit the queued jobs placement finds a server for, in Snakemake's
        priority order; the others stay queued."""
        if not self._queue:
            return
        self._queue.sort(key=lambda j: (-j.ticket.priority, j.seq))
        held = [j.ticket.identity for j in self._queue] + [
            a.job.ticket.identity for a in self._attempts.values()
        ]
        demand = self.demand.counts(identity for identity in held if identity)
        ahead: Counter[str] = Counter()
        placed: list[_Job] = []
        for job in self._queue:
            ticket = job.ticket
            if not self.fleet.runnable(ticket.wanted):
                if job.waiting_since is None:
                    job.waiting_since = now
                continue
            job.waiting_since = None
            if self.placement == "dask":
                self._submit(job, None, PlacementStep.DASK, now, out)
                placed.append(job)
                continue
            decision = choose_server(
                self.fleet,
                ticket.wanted,
                ticket.identity,
                remaining=self._remaining(ticket.identity, demand, ahead),
                demand=demand,
                now=now,
            )
            if decision.address is not None:
                self._submit(job, decision.address, decision.step, now, out)
                placed.append(job)
        if placed:
            done = {id(job) for job in placed}
            self._queue = [job for job in self._queue if id(job) not in done]

    def _remaining(self, identity: str | None, demand: Counter[str], ahead: Counter[str]) -> int:
        """The work to weigh a load against: the run's, when its DAG named the context;
        else the jobs queued ahead of this one, and this one."""
        if identity is None:
            return 1
        ahead[identity] += 1
        return demand[identity] if self.demand.knows(identity) else ahead[identity]

    def _submit(
        self, job: _Job, address: str | None, step: PlacementStep, now: float, out: list[Command]
    ) -> None:
        job.dispatches += 1
        key = attempt_key(job.ticket.key, job.dispatches)
        job.attempt = key
        self._attempts[key] = _Attempt(key, job, address, step, pinned=address is not None)
        if address is not None:
            self.fleet.dispatched(key, address, job.ticket.identity, now)
        out.append(Submit(key, job.ticket, address, step))
        out.append(Record(job.ticket.dispatched(self.run_id, key, address, str(step), now)))

    # -- ends ------------------------------------------------------------------------

    def _ended(self, ended: AttemptEnded, out: list[Command]) -> None:
        attempt = self._attempts.pop(ended.key, None)
        if attempt is None:
            out.append(Log("debug", f"fenced off the result of given-up attempt {ended.key}"))
            return
        job = attempt.job
        self._release(attempt)
        self._jobs.pop(job.ticket.key, None)
        learned = ended.learned
        address = learned.address if learned is not None else None
        if learned is not None and address is not None:
            self.fleet.learn(
                address,
                identity=job.ticket.identity,
                started=learned.started,
                loaded=learned.loaded,
                reused=learned.reused,
                evicted=learned.evicted,
                job_seconds=learned.job_seconds if ended.ok else None,
                load_seconds=learned.load_seconds,
                conversions=learned.conversions,
                reload_seconds=learned.reload_seconds,
            )
            if attempt.event_seen is None:  # record the end from the result
                server = self.fleet.servers.get(address)
                model = ended.gpu_model or (server.gpu_model if server else "")
                event = learned.finished_event(self.run_id, ended, job.ticket.identity, model)
                out.append(Record(event))
        if ended.ok:
            out.append(ReportSuccess(job.ticket))
            out.append(self._reported(attempt.key, job.ticket, ev.JobOutcome.OK, None))
        elif ended.cancelled and job.cancelled:
            out.append(
                self._reported(attempt.key, job.ticket, ev.JobOutcome.CANCELLED, ended.message)
            )
        else:
            message = ended.message or f"{job.ticket.title}: failed without a message."
            self._report_error(
                job.ticket, message, ev.JobOutcome.FAILED, out, ended.aux_logs, key=attempt.key
            )

    def _release(self, attempt: _Attempt) -> None:
        if attempt.holds_slot:
            attempt.holds_slot = False
            self.fleet.release(attempt.key)

    def _report_error(
        self,
        ticket: JobTicket,
        message: str,
        outcome: ev.JobOutcome,
        out: list[Command],
        aux_logs: Sequence[str] = (),
        *,
        key: str | None = None,
        error: ContextExecutorError | None = None,
    ) -> None:
        self._jobs.pop(ticket.key, None)
        out.append(ReportError(ticket, message, tuple(aux_logs), error))
        out.append(self._reported(key or ticket.key, ticket, outcome, message))

    def _reported(
        self, key: str, ticket: JobTicket, outcome: ev.JobOutcome, message: str | None
    ) -> Record:
        if outcome not in (ev.JobOutcome.OK, ev.JobOutcome.CANCELLED):
            self.failures += 1
        self.demand.ended(ticket.identity, ticket.jobid)
        return Record(ticket.reported(self.run_id, key, outcome, message))

    def _fail_unrunnable(self, job: _Job, now: float, out: list[Command]) -> None:
        waited = 0.0 if job.waiting_since is None else now - job.waiting_since
        message = explain_unrunnable(
            job.ticket.label, job.ticket.requirements, self.fleet.servers.values(), waited=waited
        )
        job.cancelled = True
        key = None
        if job.attempt is not None and job.attempt in self._attempts:
            attempt = self._attempts.pop(job.attempt)
            self._release(attempt)
            out.append(Cancel(attempt.key))
            key = attempt.key
        self._queue = [queued for queued in self._queue if queued is not job]
        error = NoServerError(message)
        self._report_error(job.ticket, message, ev.JobOutcome.UNRUNNABLE, out, key=key, error=error)

    # -- the fleet -------------------------------------------------------------------

    def _fleet_event(self, event: ev.Event, now: float, out: list[Command]) -> None:
        mine = getattr(event, "run_id", None) == self.run_id
        if isinstance(event, (ev.JobStarted, ev.JobFinished)) and mine:
            attempt = self._attempts.get(event.key)
            if attempt is None or not attempt.holds_slot:
                return  # late: the attempt has ended or its slot is free already
            if isinstance(event, ev.JobStarted):
                self.fleet.hold(event.key, event.address, event.context)
                self.fleet.mark_started(event.key, event.at)
            else:
                attempt.event_seen = now
                self._release(attempt)
                self.fleet.touch(event.address, event.context, event.finished)
            return
        if mine:
            return  # this run's own dispatches and reports, echoed by the scheduler
        if isinstance(event, ev.ContextReady) and event.conversions:
            out.append(ProbeCaches())  # the conversion may have filled other caches
        if isinstance(event, ev.ServerLeft):
            reason = LossReason(expected=event.expected, detail=event.reason)
            self._server_left(event.address, reason, out)
        self.fleet.apply(event)

    def _server_left(self, address: str, reason: LossReason, out: list[Command]) -> None:
        lost = [a for a in self._attempts.values() if a.pinned and a.address == address]
        for attempt in lost:
            del self._attempts[attempt.key]
            self._release(attempt)
            out.append(Cancel(attempt.key))
            job = attempt.job
            requeues = job.dispatches
            if self.max_requeues is not None and requeues > self.max_requeues:
                self._report_error(
                    job.ticket,
                    f"{job.ticket.title}: its server was lost {requeues} time(s) "
                    f"({reason.describe()}), more than the {self.max_requeues} requeue(s) "
                    "allowed.",
                    ev.JobOutcome.FAILED,
                    out,
                    key=attempt.key,
                )
                continue
            job.attempt = None
            self._queue.append(job)

    def _polled(self, polled: ServersPolled, out: list[Command]) -> None:
        present = polled.workers
        known = set(self.fleet.servers)
        if self.hub:
            missing, extra = sorted(known - set(present)), sorted(set(present) - known)
            if missing or extra:
                text = (
                    f"membership differs from Dask's: {missing} not listed, {extra} not announced"
                )
                out.append(Log("debug", text))
            return
        for address, worker in present.items():
            self.fleet.add_server(
                address, name=worker["name"], resources=worker["resources"], slots=worker["slots"]
            )
        for address in known - set(present):
            self._server_left(address, LossReason(detail="gone from Dask's list of workers"), out)
            self.fleet.remove_server(address)

    def _tick(self, now: float, out: list[Command]) -> None:
        for job in list(self._queue):
            if job.waiting_since is None:
                continue
            fixed = self.embedded and bool(self.fleet.servers)  # none: one restarts
            if fixed or now - job.waiting_since >= self.wait_for_server:
                self._fail_unrunnable(job, now, out)
        for attempt in list(self._attempts.values()):
            job = attempt.job
            if not self.fleet.runnable(job.ticket.wanted):
                if job.waiting_since is None:
                    job.waiting_since = now
                if now - job.waiting_since >= self.wait_for_server:
                    self._fail_unrunnable(job, now, out)
                continue
            job.waiting_since = None
            if attempt.event_seen is not None and now - attempt.event_seen >= FLEET_CHECK_SECONDS:
                out.append(Poll(attempt.key))

    def _cancel_all(self, out: list[Command]) -> None:
        for job in [*self._queue, *(attempt.job for attempt in self._attempts.values())]:
            job.cancelled = True
        self._queue = []
        if self._attempts:
            out.append(StopRunning(tuple(self._attempts)))
