"""Dispatch: the executor's state machine, in Snakemake's process.

It takes *stimuli* and returns *commands* (:mod:`.vocabulary`), imports neither Dask
nor Snakemake, and does no I/O: :class:`~..executor.adapter.Executor` feeds it from one thread
and carries out its commands in one function.

**One route for a job's end.** An attempt's *result* (the Dask task's value, or its
failure to produce one) is authoritative: only a result reports a job, and a given-up
attempt's result is fenced off. The server's ``JobFinished`` event (best-effort) only
frees the slot early; each slot is released once, by whichever comes first; an attempt
whose event came but whose result did not is polled at the next fleet check, and a
result that beats its event records the attempt's end itself: nothing waits. One
exception: when the server dies holding the result of an attempt whose event said ok,
that event is its end (the job is not run twice). A
cancellation that no server seals (a task cancelled in Dask, the embedded cluster
killed on Ctrl-C, a server restarted while its job was being stopped) is recorded from
what dispatch knows: from the attempt's start to now.

**A cancelled run** (Ctrl-C, or Snakemake stopping on SIGTERM) is ``interrupted``;
its jobs end cancelled, each attempt once, and none is placed again, even when the
server stopping it leaves.

**Its story.** Every command carries the id of the stimulus that caused it, and
every decision about a job is kept (:mod:`.storylog`): :meth:`Dispatch.story` answers
what happened to a job, and the decisions its dispatch and report do not record go
to the catalog too (``snakemake-context story``).

**Membership** comes from the hub's events and the attach snapshot (Dask's list of
workers is only compared with it, unless there is no hub). A server that leaves takes
its attempts: their jobs go back to the queue, each loss charged to the job's
preemption or crash budget (:mod:`..fleet.losses`), never to Snakemake's retries.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from statistics import mean

from ..errors import ContextExecutorError, NoServerError
from ..fleet import events as ev
from ..fleet.keys import attempt_key, attempt_log, attempt_number
from ..fleet.losses import Budgets, loss_line, ran_there
from ..fleet.pilotkinds import PilotKinds
from ..fleet.placement import PlacementStep, choose_server
from ..fleet.poolsizing import PoolDemand
from ..fleet.resources import explain_unrunnable
from ..fleet.state import FleetState
from .inflight import Attempt, Demand, QueuedJob, Refusals
from .storylog import StoryEntry, StoryLog, stamped, stimulus_id
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
    Poll,
    PoolFailed,
    ProbeCaches,
    Record,
    ReportError,
    ReportSuccess,
    SchedulerLost,
    ServersPolled,
    Stimulus,
    Stopped,
    StopQueued,
    StopRunning,
    Submit,
    Tick,
)

__all__ = ["FLEET_CHECK_SECONDS", "Dispatch"]

#: Seconds between two fleet checks (the executor's poll of Dask's workers).
FLEET_CHECK_SECONDS = 2.0


class Dispatch:
    """The queue, the attempts in flight, requeues and unrunnable jobs of one run.

    ``embedded``: the run owns its cluster, of ``planned`` servers: a job none of
    them can run fails at once, unless servers are restarting; on an attached cluster
    (or while restarts go on) it waits ``wait_for_server`` seconds for servers.
    ``placement``: ``affinity`` (this project's policy) or ``dask`` (Dask chooses).
    ``lease_wait``: how long a job lost with a server that may still run it waits.
    ``pool``: the kinds of pilot of a pool: a job none can run, once pilots have
    registered, fails instead of waiting for the batch queue.
    """

    def __init__(
        self,
        run_id: str,
        *,
        embedded: bool,
        wait_for_server: float,
        placement: str = "affinity",
        budgets: Budgets | None = None,
        fleet: FleetState | None = None,
        planned: int = 0,
        lease_wait: float = 0.0,
        pool: PilotKinds | None = None,
        survival_placement: bool = False,
    ) -> None:
        self.run_id, self.embedded, self.placement = run_id, embedded, placement
        self.wait_for_server, self.budgets = wait_for_server, budgets or Budgets()
        self.planned, self.lease_wait = planned, lease_wait
        self.fleet = fleet if fleet is not None else FleetState()
        self.fleet.survival_placement = survival_placement
        #: What each kind of pilot of a pool can run; why the scheduler is gone.
        self.pool = pool
        self.scheduler_lost: str | None = None
        #: Whether fleet membership comes from the hub's events (else from polls).
        self.hub = True
        #: Per-context work still to come, which placement weighs against a load.
        self.demand = Demand()
        self._jobs: dict[str, QueuedJob] = {}
        self._queue: list[QueuedJob] = []
        self._attempts: dict[str, Attempt] = {}
        self._seq = self.failures = 0
        #: The run was cancelled (Ctrl-C) or told to stop (SIGTERM).
        self.interrupted = False
        #: Why no job starts any more (Snakemake stops after its running jobs).
        self.stopping: str | None = None
        #: Every decision about a job, with its stimulus (:meth:`story`).
        self.log = StoryLog()
        self._stimuli, self._stimulus, self._now = 0, "", 0.0

    # -- the one entry point ---------------------------------------------------------

    def handle(self, stimulus: Stimulus) -> list[Command]:
        """Take one stimulus; return the commands it leads to (in order), each
        stamped with the stimulus's id."""
        self._stimuli += 1
        self._stimulus, self._now = stimulus_id(stimulus, self._stimuli), stimulus.now
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
        elif isinstance(stimulus, SchedulerLost):
            self._scheduler_lost(stimulus.why, out)
        elif isinstance(stimulus, StopQueued):
            self.interrupted = True
            self._stop_queued(stimulus.why, out)
        elif isinstance(stimulus, PoolFailed):
            self._pool_failed(stimulus.why, out)
        elif isinstance(stimulus, Stopped):
            self._stopped(stimulus, out)
        elif isinstance(stimulus, DagPlanned):
            self.demand.plan(stimulus.jobs)
        elif isinstance(stimulus, CachesProbed):
            self.fleet.probed(stimulus.found)
        if not isinstance(stimulus, CancelAll) and self.scheduler_lost is None:
            self._place(stimulus.now, out)
        return [stamped(command, self._stimulus) for command in out]

    def run_end(self) -> ev.RunFinished:
        """How the run ended: ok when no job failed and it was not interrupted."""
        ok = self.failures == 0 and not self.interrupted
        return ev.RunFinished(run_id=self.run_id, ok=ok, interrupted=self.interrupted)

    def story(self, key: str) -> list[StoryEntry]:
        """What happened to a job (its key, or an attempt's), in order."""
        return self.log.story(key)

    def _tell(
        self,
        ticket: JobTicket,
        what: str,
        detail: str = "",
        attempt: str | None = None,
        out: list[Command] | None = None,
    ) -> None:
        """Keep a decision in the job's story; with ``out``, record it in the catalog."""
        self.log.add(StoryEntry(self._now, self._stimulus, ticket.key, attempt, what, detail))
        if out is not None:
            out.append(Record(ticket.story(self.run_id, attempt, what, detail, self._now)))

    @property
    def queued(self) -> int:
        """Jobs waiting in the queue."""
        return len(self._queue)

    def pool_demand(self) -> PoolDemand:
        """What the run asks of a pool of pilots (:mod:`..pilots.pool` sizes itself
        from it, not from Dask's task count, which affinity placement keeps low): jobs
        ready (queued and running) and still to come, per GPU model too, and the
        measured job and load times (0 when unmeasured)."""
        queued = [job.ticket for job in self._queue if not job.cancelled]
        tickets = queued + [attempt.job.ticket for attempt in self._attempts.values()]
        by_model = Counter(t.requirements.gpu_model for t in queued if t.requirements.gpu_model)
        to_come = self.demand.counts(t.identity for t in tickets if t.identity)
        jobs = [m.value for m in self.fleet.measure.job.values()]
        loads = [m.value for m in self.fleet.measure.load.values()]
        return PoolDemand(
            ready=len(tickets),
            remaining=max(len(tickets), sum(to_come.values())),
            by_gpu_model=dict(by_model),
            job_seconds=mean(jobs) if jobs else 0.0,
            load_seconds=mean(loads) if loads else 0.0,
            survival=self.fleet.survival_placement,
        )

    # -- jobs ------------------------------------------------------------------------

    def _ready(self, stimulus: JobReady, out: list[Command]) -> None:
        ticket = stimulus.ticket
        if stimulus.error is not None:
            error = stimulus.error
            self._report_error(ticket, str(error), ev.JobOutcome.INVALID, out, error=error)
            return
        if self.scheduler_lost is not None:
            message = f"{ticket.title}: not run: the cluster's scheduler died."
            self._report_error(ticket, message, ev.JobOutcome.FAILED, out)
            return
        if self.stopping is not None:  # handed by a selection the stop overtook
            self._tell(ticket, "cancelled", self.stopping)
            message = f"{ticket.title}: not started: {self.stopping}."
            self._report_error(ticket, message, ev.JobOutcome.CANCELLED, out)
            return
        self._seq += 1
        job = self._jobs[ticket.key] = QueuedJob(ticket, self._seq)
        self._tell(ticket, "ready")
        for one in ticket.members or (ticket,):
            self.demand.ready(one.identity, one.jobid)
        self.fleet.note_context(ticket.identity, shareable=ticket.shareable)
        if not self._runnable(job):
            job.waiting_since = stimulus.now
            if self._fixed_fleet:
                self._fail_unrunnable(job, stimulus.now, out)
                return
        insort(self._queue, job, key=attrgetter("order"))

    def _runnable(self, job: QueuedJob) -> bool:
        """Whether a server of the fleet has the resources the job wants."""
        fleet = self.fleet
        return bool(fleet.index.candidates(fleet.servers, job.ticket.wanted, job.wanted).runnable)

    @property
    def _fixed_fleet(self) -> bool:  # embedded, and no server is restarting
        return self.embedded and len(self.fleet.servers) >= max(1, self.planned)

    def _place(self, now: float, out: list[Command]) -> None:
        """Submit the queued jobs placement finds a server for, in Snakemake's
        priority order (the queue's); the others stay queued. A job asking what an
        earlier one of this pass was refused is refused the same until a job is
        placed (:class:`.inflight.Refusals`)."""
        if not self._queue:
            return
        demand: Counter[str] | None = None  # the pass's, once a job needs it
        ahead: Counter[str] = Counter()
        refusals = Refusals()
        placed: list[QueuedJob] = []
        for job in self._queue:
            ticket = job.ticket
            if job.not_before > now:
                continue
            if not self._runnable(job):
                if job.waiting_since is None:
                    job.waiting_since = now
                continue
            job.waiting_since = None
            if self.placement == "dask":
                self._submit(job, None, PlacementStep.DASK, now, out)
                placed.append(job)
                continue
            if demand is None:
                demand = self._demand()
            remaining = self._remaining(ticket.identity, demand, ahead)
            decision = refusals.get(job.wanted, ticket.identity, remaining) or choose_server(
                self.fleet,
                ticket.wanted,
                ticket.identity,
                remaining=remaining,
                demand=demand,
                now=now,
            )
            if decision.address is None:
                refusals.refused(job.wanted, ticket.identity, remaining, decision)
                continue
            self._submit(job, decision.address, decision.step, now, out)
            placed.append(job)
            refusals.forget()
        if placed:
            done = {id(job) for job in placed}
            self._queue = [job for job in self._queue if id(job) not in done]

    def _demand(self) -> Counter[str]:
        """The work to come per context: the DAG's for the contexts it named, else
        the jobs held (queued and in flight; counted only when a job of a context it
        did not name became ready)."""
        if not self.demand.unplanned:
            return self.demand.counts(())
        held = [j.ticket.identity for j in self._queue] + [
            a.job.ticket.identity for a in self._attempts.values()
        ]
        return self.demand.counts(identity for identity in held if identity)

    def _remaining(self, identity: str | None, demand: Counter[str], ahead: Counter[str]) -> int:
        """The work to weigh a load against: the run's, when its DAG named the context;
        else the jobs queued ahead of this one, and this one."""
        if identity is None:
            return 1
        ahead[identity] += 1
        return demand[identity] if self.demand.knows(identity) else ahead[identity]

    def _submit(
        self,
        job: QueuedJob,
        address: str | None,
        step: PlacementStep,
        now: float,
        out: list[Command],
    ) -> None:
        job.dispatches += 1
        key = attempt_key(job.ticket.key, job.dispatches)
        job.attempt = key
        self._attempts[key] = Attempt(key, job, address, step, pinned=address is not None)
        if address is not None:
            self.fleet.dispatched(key, address, job.ticket.identity, now)
        out.append(Submit(key, job.ticket, address, step))
        out.append(Record(job.ticket.dispatched(self.run_id, key, address, str(step), now)))
        where = f"on {self.fleet.name_of(address)}" if address else "to Dask's choice"
        self._tell(job.ticket, "placed", f"{where} ({step})", attempt=key)

    # -- ends ------------------------------------------------------------------------

    def _ended(self, ended: AttemptEnded, out: list[Command]) -> None:
        attempt = self._attempts.pop(ended.key, None)
        if attempt is None:
            out.append(Log("debug", f"fenced off the result of given-up attempt {ended.key}"))
            return
        job = attempt.job
        how = "ok" if ended.ok else ("cancelled" if ended.cancelled else "failed")
        self._tell(job.ticket, "ended", how, attempt=ended.key)
        outcome = ended.outcome
        sealed = outcome is not None and bool(outcome.server.address)
        if not sealed and attempt.event_seen is None and ended.cancelled and job.cancelled:
            out.append(self._unsealed_end(attempt, ended.now))  # no server said it ended
        self._release(attempt)
        self._jobs.pop(job.ticket.key, None)
        if outcome is not None and sealed:
            self.fleet.learn(outcome)
            if attempt.event_seen is None:  # record the end from the result
                out.append(Record(outcome.finished_event(self.run_id, at=ended.now)))
            self._members_ended(attempt, ended, out)
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

    def _members_ended(self, attempt: Attempt, ended: AttemptEnded, out: list[Command]) -> None:
        """A group's members that ran, each recorded as a job of its own (placed with
        the group, its end, its report) and measured. Only from the group's result: a
        group lost with its server records none, and its rerun records each once."""
        number = attempt_number(attempt.key)
        tickets = {attempt_key(t.key, number): t for t in attempt.job.ticket.members}
        group = attempt.job.ticket.label
        for outcome, message in ended.members:
            ticket = tickets.get(outcome.key)
            if ticket is None:
                continue
            self.fleet.learn(outcome)
            how = ev.JobOutcome.OK if ended.ok else ev.JobOutcome.FAILED
            if ended.cancelled and attempt.job.cancelled:
                how = ev.JobOutcome.CANCELLED
            at = outcome.started
            address = outcome.server.address
            out.append(Record(ticket.dispatched(self.run_id, outcome.key, address, "group", at)))
            out.append(Record(outcome.finished_event(self.run_id, at=ended.now)))
            said = message or (None if ended.ok else f"{group} failed: {ended.message}")
            out.append(Record(ticket.reported(self.run_id, outcome.key, how, said, counted=False)))
            self._tell(ticket, "ran", f"in {group}, attempt {attempt.key}", outcome.key, out)

    def _unsealed_end(self, attempt: Attempt, now: float) -> Record:
        """The end of a cancelled attempt that no server sealed, as dispatch knows
        it: from when it started (0: not known; taken before its slot is released) to
        ``now``. No address: the catalog keeps the server it recorded the attempt on
        (that one may have left: a second row for its address would be a server that
        never was)."""
        where = self.fleet.where(attempt.key) or attempt.address or ""
        server = self.fleet.servers.get(where)
        started = server.started.get(attempt.key, 0.0) if server else 0.0
        return Record(
            ev.JobFinished(
                at=now,
                run_id=self.run_id,
                key=attempt.key,
                address="",
                ok=False,
                cancelled=True,
                started=started,
                finished=now,
                context=attempt.job.ticket.identity,
            )
        )

    def _release(self, attempt: Attempt) -> None:
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
        self._tell(ticket, "reported", outcome, attempt=key)
        if outcome not in (ev.JobOutcome.OK, ev.JobOutcome.CANCELLED):
            self.failures += 1
        for one in ticket.members or (ticket,):
            self.demand.ended(one.identity, one.jobid)
        return Record(ticket.reported(self.run_id, key, outcome, message))

    def _fail_unrunnable(
        self, job: QueuedJob, now: float, out: list[Command], message: str = ""
    ) -> None:
        waited = 0.0 if job.waiting_since is None else now - job.waiting_since
        message = message or explain_unrunnable(
            job.ticket.unplaced_label(),
            job.ticket.requirements,
            self.fleet.servers.values(),
            waited=waited,
            planned=self.planned,
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
                attempt.event_ok = event.ok and not event.cancelled
                self._release(attempt)
                self.fleet.touch(event.address, event.context, event.finished)
                self._tell(attempt.job.ticket, "slot freed", attempt=event.key)
            return
        if mine:
            # Its servers' other word on its jobs. The run's own records go to the
            # hub on a topic no run follows (fleet/events.py RECORD_TOPIC).
            return
        if isinstance(event, ev.ServerJoined) and self.pool is not None:
            self.pool.joined(event.name, event.resources)
        if isinstance(event, ev.ServerJoined) or getattr(event, "conversions", None):
            out.append(ProbeCaches())  # a new server's disk, or caches a conversion filled
        if isinstance(event, ev.ServerLeft):
            self._server_left(event, now, out)
        self.fleet.apply(event)

    def _server_left(self, event: ev.ServerLeft, now: float, out: list[Command]) -> None:
        address, name, cause = event.address, event.name, event.cause()
        placed = [a for a in self._attempts.values() if a.pinned and a.address == address]
        for attempt in placed:
            if attempt.event_ok:  # it ended ok; only its result died with the server
                self._ended_by_event(attempt, name or address, out)
        lost = [a for a in placed if not a.event_ok]
        server = self.fleet.servers.get(address)
        keys = [a.key for a in lost]
        ran = ran_there(keys, server.started if server else {}, server, event.running)
        if lost or cause.kind != "closed":
            titles = [a.job.ticket.title for a in lost if a.key in ran]
            fleet = (len(self.fleet.servers) - 1, self.planned)
            out.append(Log("warning", loss_line(name or address, cause, titles, len(lost), fleet)))
        listed = {job.key for job in event.lost_jobs()}
        unlisted = [a for a in lost if a.key not in listed and not a.job.cancelled]
        cut_off = [a for a in unlisted if a.key in ran]
        if cut_off:  # the hub did not see them run there: dispatch knows it placed them
            starts = server.started if server else {}
            wire = [
                ev.LostJob(key=a.key, run_id=self.run_id, started=starts.get(a.key)).to_wire()
                for a in cut_off
            ]
            reason = event.reason or f"{cause.kind}: {cause.why}"
            lost_record = ev.AttemptsLost(
                at=now, run_id=self.run_id, address=address, reason=reason, lost=wire
            )
            out.append(Record(lost_record))
        for attempt in unlisted:  # queued behind a running one, never started: withdrawn
            if attempt.key not in ran:
                out.append(self._unsealed_end(attempt, now))
        # A server nobody saw die (no exit code: unreachable, stopped) may still run it.
        unconfirmed = cause.kind != "closed" and cause.exit_code is cause.signal is None
        for attempt in lost:
            del self._attempts[attempt.key]
            if attempt.job.cancelled:  # being stopped: it ends here, never placed again
                self._stopped_with(attempt, f"{name or address} left ({cause.why})", now, out)
                continue
            self._release(attempt)
            out.append(Cancel(attempt.key))
            job, log = attempt.job, attempt_log(attempt.job.ticket.log_path, attempt.job.dispatches)
            title, where, started = job.ticket.title, name or address, attempt.key in ran
            failed = job.losses.charge(cause, where, log, self.budgets, title, started)
            charge = job.losses.describe_charge(cause, self.budgets, started)
            detail = f"{where} left ({cause.kind}: {cause.why}); {charge}"
            self._tell(job.ticket, "lost", detail, attempt=attempt.key, out=out)
            if failed is not None:
                self._report_error(job.ticket, failed, ev.JobOutcome.FAILED, out, key=attempt.key)
                continue
            job.attempt = None
            job.not_before = now + self.lease_wait if unconfirmed else 0.0
            wait = f"after its server's lease, {self.lease_wait:g} s" if unconfirmed else "at once"
            self._tell(job.ticket, "requeued", f"placed again {wait}", out=out)
            insort(self._queue, job, key=attrgetter("order"))

    def _ended_by_event(self, attempt: Attempt, where: str, out: list[Command]) -> None:
        """An attempt whose server said it ended ok (its JobFinished: outputs written
        and checked) and then left before its result was fetched: the job succeeded,
        and does not run again."""
        del self._attempts[attempt.key]
        self._release(attempt)
        out.append(Cancel(attempt.key))  # its future: held by a server that is gone
        ticket = attempt.job.ticket
        self._jobs.pop(ticket.key, None)
        detail = f"ok: {where} said so, then left before its result was fetched"
        self._tell(ticket, "ended", detail, attempt=attempt.key, out=out)
        out.append(ReportSuccess(ticket))
        out.append(self._reported(attempt.key, ticket, ev.JobOutcome.OK, None))

    def _stopped_with(self, attempt: Attempt, why: str, now: float, out: list[Command]) -> None:
        """A cancelled job's attempt whose server left while it was being stopped (a
        restart by the plugin, the run's cluster ending): the job ends cancelled."""
        if attempt.event_seen is None:
            out.append(self._unsealed_end(attempt, now))
        self._release(attempt)
        out.append(Cancel(attempt.key))
        ticket = attempt.job.ticket
        self._jobs.pop(ticket.key, None)
        self._tell(ticket, "ended", f"cancelled: {why}", attempt=attempt.key)
        message = f"{ticket.title}: cancelled ({why})."
        out.append(self._reported(attempt.key, ticket, ev.JobOutcome.CANCELLED, message))

    def _scheduler_lost(self, why: str, out: list[Command]) -> None:
        """The scheduler is gone: every job held fails (none can run any more), the
        attempts in flight are lost with their servers, and the servers leave."""
        if self.scheduler_lost is not None:
            return
        self.scheduler_lost = why
        out.append(Log("error", f"Context executor: the cluster's scheduler died: {why}."))
        reason = f"the cluster's scheduler died: {why}"
        for address, server in list(self.fleet.servers.items()):
            lost = [a for a in self._attempts.values() if a.address == address]
            wire = [
                ev.LostJob(key=a.key, run_id=self.run_id, started=server.started.get(a.key))
                for a in lost
            ]
            left = ev.ServerLeft(
                address=address, name=server.name, reason=reason, lost=[j.to_wire() for j in wire]
            )
            out.append(Record(left))
            self.fleet.remove_server(address)
        held = [*self._queue, *(a.job for a in self._attempts.values())]
        attempts = {id(a.job): a.key for a in self._attempts.values()}
        out.extend(Cancel(key) for key in self._attempts)  # their futures: Dask's cancellations
        self._attempts.clear()
        self._queue.clear()
        for job in held:
            message = f"{job.ticket.title}: not finished: the cluster's scheduler died."
            key = attempts.get(id(job))
            self._tell(job.ticket, "lost", reason, attempt=key)
            self._report_error(job.ticket, message, ev.JobOutcome.FAILED, out, key=key)

    def _polled(self, polled: ServersPolled, out: list[Command]) -> None:
        present = polled.workers
        known = set(self.fleet.servers)
        if self.hub:
            missing, extra = sorted(known - set(present)), sorted(set(present) - known)
            if missing or extra:
                text = f"membership differs from Dask's: {missing} not listed, {extra} new"
                out.append(Log("debug", text))
            return
        for address, worker in present.items():
            self.fleet.add_server(
                address, name=worker["name"], resources=worker["resources"], slots=worker["slots"]
            )
        for address in known - set(present):
            self._server_left(ev.ServerLeft(address=address), polled.now, out)
            self.fleet.remove_server(address)

    def _tick(self, now: float, out: list[Command]) -> None:
        for job in list(self._queue):
            if job.waiting_since is None or self._runnable(job):
                continue
            ticket, pool = job.ticket, self.pool
            refused = pool and pool.refusal(
                ticket.unplaced_label(), ticket.requirements, ticket.wanted
            )
            if refused:
                self._fail_unrunnable(job, now, out, refused)
                continue
            if self._fixed_fleet or now - job.waiting_since >= self.wait_for_server:
                self._fail_unrunnable(job, now, out)
        for attempt in list(self._attempts.values()):
            job = attempt.job
            if not self._runnable(job):
                if job.waiting_since is None:
                    job.waiting_since = now
                if now - job.waiting_since >= self.wait_for_server:
                    self._fail_unrunnable(job, now, out)
                continue
            job.waiting_since = None
            if attempt.event_seen is not None and now - attempt.event_seen >= FLEET_CHECK_SECONDS:
                out.append(Poll(attempt.key))

    def _stop_queued(
        self, why: str, out: list[Command], outcome: ev.JobOutcome = ev.JobOutcome.CANCELLED
    ) -> None:
        """No job starts any more (SIGTERM: Snakemake stops after its running jobs; the
        pool cannot submit pilots): the queued ones, which no server has started, end
        now (``outcome``), as does any job handed later; the attempts in flight finish."""
        self.stopping = why
        for job in self._queue:
            job.cancelled = True
            self._tell(job.ticket, "cancelled", why)
            message = f"{job.ticket.title}: not started: {why}."
            self._report_error(job.ticket, message, outcome, out)
        self._queue = []

    def _pool_failed(self, why: str, out: list[Command]) -> None:
        """The pool could not submit a pilot: the run ends, in one line, never waiting
        in silence for pilots that will not come."""
        if self.stopping is not None:
            return
        fix = "Fix: what the command says (the pool's queue, account, qos, directive...)"
        out.append(Log("error", f"Context executor: the pilots cannot be submitted: {why}. {fix}."))
        self._stop_queued(f"the pilots cannot be submitted: {why}", out, ev.JobOutcome.FAILED)

    def _stopped(self, stopped: Stopped, out: list[Command]) -> None:
        """Every attempt of a cancelled job that was stopped and whose end has not
        come back (its server killed with the run's cluster, say) ends now."""
        for key in stopped.keys:
            attempt = self._attempts.get(key)
            if attempt is not None and attempt.job.cancelled:
                del self._attempts[key]
                self._stopped_with(attempt, "stopped with the run", stopped.now, out)

    def _cancel_all(self, out: list[Command]) -> None:
        self.interrupted = True
        for job in [*self._queue, *(attempt.job for attempt in self._attempts.values())]:
            job.cancelled = True
            self._tell(job.ticket, "cancelled", "the run was cancelled", attempt=job.attempt)
        self._queue = []
        if self._attempts:
            out.append(StopRunning(tuple(self._attempts)))
