"""The Snakemake executor (``snakemake --executor context``), only its adapter: the dispatch
state machine (:mod:`..dispatch`) decides; this class feeds it stimuli, one thread at a time, and
carries out its commands in :meth:`Executor._execute`, the one place that submits or cancels tasks
(:mod:`.tasks`) and calls ``report_job_*``. Imports are cheap: Snakemake imports it in every job."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any, NamedTuple

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from ..dispatch import vocabulary as v
from ..fleet.keys import job_key_of, new_run_id
from ..jobspec import remove_outputs
from ..snakemake_internals import (
    cancel_scheduler_timers,
    finish_together,
    graceful_stop_off_the_main_thread,
    one_reevaluation_pending,
    thin_selections,
    told_not_finished,
)
from . import announce, results, startup
from .jobbuild import SpecBuilder, output_specs
from .loop import CacheProbes, FleetInbox, FleetPoll, Waker
from .pacing import HeldReports
from .recording import Recording
from .settings import ExecutorSettings
from .stopping import CtrlC, hand_sigterm_to_the_scheduler
from .summary import LoadTally, write_summary
from .tasks import Tasks

__all__ = ["Executor"]


class _Job(NamedTuple):
    info: SubmittedJobInfo
    spec: Any
    ticket: v.JobTicket


class Executor(RemoteExecutor):
    """Runs Snakemake jobs on context servers (``snakemake --executor context``)."""

    def __init__(self, workflow: Any, logger: Any) -> None:
        # RemoteExecutor starts the status thread before __post_init__: set its state first.
        self.settings: ExecutorSettings = workflow.executor_settings or ExecutorSettings()
        self._waker = Waker()
        self._inbox: queue.SimpleQueue[v.Stimulus | str] = queue.SimpleQueue()
        self._handling = threading.Lock()
        self._ready = False
        self._held: HeldReports[SubmittedJobInfo] = HeldReports()  # finished, not yet told
        self._submits: list[tuple[v.Submit, Any]] = []  # submitted by dispatch, not yet sent
        self._ctrl_c = CtrlC()
        #: What the start made, undone last to first at the shutdown (or a stopped start).
        self._closing = contextlib.ExitStack()
        self._closing.callback(self._ctrl_c.uninstall)  # SIGINT is Python's again, at last
        super().__init__(workflow, logger)

    def __post_init__(self) -> None:
        graceful_stop_off_the_main_thread()  # before the scheduler binds SIGTERM to it
        self._ctrl_c.install()
        try:
            self._start()
        except BaseException:  # a signal (KeyboardInterrupt, SystemExit) or an error
            self._ctrl_c.stopping()
            with self.lock:
                self.wait = False  # RemoteExecutor's status thread, started before us
            self._closing.close()
            raise
        hand_sigterm_to_the_scheduler()

    def _start(self) -> None:
        """Check, connect (or start the embedded cluster), record the run's start; each
        thing made is undone by :attr:`_closing`, at the shutdown or a stopped start."""
        workflow, closing = self.workflow, self._closing
        steps = startup.StartSteps(startup.process_started())
        self.declarations = startup.checked_declarations(workflow)
        steps.mark("checks")
        self.workdir = os.getcwd()
        self.run_id = new_run_id()
        self.started = time.time()
        self.specs = SpecBuilder(
            workflow, self.workdir, self.run_id, self.format_job_exec, self.envvars
        )
        self._jobs: dict[str, _Job] = {}
        self._summary: list[dict[str, Any]] = []
        self._loads = LoadTally()
        self._group_warnings = announce.GroupWarnings()
        startup.log_dask_to_file(self.workdir, self.run_id)
        settings, say, warn = self.settings, self.logger.info, self.logger.warning
        connecting = time.monotonic()
        self.connection = connection = startup.connect(settings, self.workdir, self.run_id, warn)
        closing.callback(connection.close)
        connected = time.monotonic() - connecting
        steps.marks(connection.start_steps())
        steps.mark("client")
        self.tasks = Tasks(connection)
        closing.callback(self.tasks.forget_rule_parts)  # before the connection closes
        self.local_jobs = startup.local_plain_jobs(settings, workflow, connection, say)
        closing.callback(self.local_jobs.close)
        self.dispatch = startup.make_dispatch(self.run_id, settings, workflow, connection, warn)
        self._fleet_poll = FleetPoll(connection, self.dispatch, self._inbox.put, self.logger.debug)
        closing.callback(self._fleet_poll.withdraw)  # before the connection closes
        steps.mark("plain jobs and dispatch")
        self.recording = Recording(
            connection, self.run_id, self.workdir, settings.catalog, self.logger, settings.report
        )
        planned = startup.planned_jobs(workflow, self.declarations)
        declared = list(self.declarations.values())
        total = None if planned is None else len(planned)
        seen = (self.recording.relay, self._loads.see)
        events = FleetInbox(seen, self._inbox.put, self._waker.set)
        closing.callback(self._record_the_end)
        self.dispatch.hub = self.recording.begin(
            self.dispatch.fleet, events, jobs_total=total, declarations=declared
        )
        self._probes = CacheProbes(lambda: self.recording.probe_caches(declared), self._push)
        self._probes.ask()
        steps.mark("catalog")
        if planned is not None:  # else the executor's queue is the demand
            self.dispatch.handle(v.DagPlanned(planned, time.time()))
        if not self.dispatch.hub:  # no hub, no events: Dask's list is the membership
            self.dispatch.handle(v.ServersPolled(self.connection.workers(), time.time()))
        servers = len(self.dispatch.fleet.servers)
        announce.announce_fleet(servers, workflow, connection, say, took=connected)
        announce.announce_walltime(settings, say)
        for note in settings.cache_notes:
            say(note)
        steps.mark("plan")
        self.logger.debug(steps.line())
        self._ready = True

    def _record_the_end(self) -> None:
        """The run's end into the catalog: as dispatch says it ended, or interrupted
        when its start did not finish."""
        if not self._ready:
            self.dispatch.handle(v.CancelAll(time.time()))
        self.recording.finished(self.dispatch.run_end())

    # -- stimuli in --------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        """Hand a Snakemake job to dispatch (placed and submitted by the status loop)."""
        self._ctrl_c.raise_if_swallowed()
        thin_selections(self.workflow)  # once: the scheduler exists once it runs jobs
        one_reevaluation_pending(self.workflow)
        made, spec, error = self.specs.build(job, self.declarations)
        if warning := self._group_warnings(job):
            self.logger.warning(warning)
        info = SubmittedJobInfo(job=job, external_jobid=made.key, aux={})
        self._jobs[made.key] = _Job(info, spec, made)
        self.report_job_submission(info)
        self._push(v.JobReady(made, time.time(), error))

    def _push(self, item: v.Stimulus | str) -> None:
        """Queue a stimulus, or the key of an attempt whose future is done (a Dask
        callback), from any thread, and wake the status loop."""
        self._inbox.put(item)
        self._waker.set()

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        """Feed dispatch what happened, carry out its commands, yield unreported jobs."""
        if self._ready:
            now = time.time()
            self._fleet_poll(now)
            first = startup.run_stimuli(self.dispatch, self.connection, self.workflow, now)
            self._handle_inbox(first)
        for info in active_jobs:
            if not info.aux.get("reported"):
                yield info

    def _handle_inbox(self, first: list[v.Stimulus] | None = None, telling: bool = True) -> None:
        with self._handling:
            for early in first or ():
                self._feed(early)
            self._submit()
            while batch := self._drain_inbox():
                self.tasks.fetch([item for item in batch if isinstance(item, str)])
                for stimulus in batch:
                    self._take(stimulus)
                self._submit()
            if telling:
                self._tell_held()

    def _drain_inbox(self) -> list[v.Stimulus | str]:
        """What the inbox holds now."""
        taken: list[v.Stimulus | str] = []
        while True:
            try:
                taken.append(self._inbox.get_nowait())
            except queue.Empty:
                return taken

    def _take(self, stimulus: v.Stimulus | str) -> None:
        """One stimulus, or the key of an attempt whose future is done (its end)."""
        if isinstance(stimulus, str):
            job = self._jobs.get(job_key_of(stimulus))
            ticket = job.ticket if job else None
            ended, entries = self.tasks.ended(stimulus, ticket, self._push)
            if ended is None:
                return  # cancelled by dispatch, or lost with its server
            stimulus = ended
            if entries is not None:
                self._summary.extend(entries)
            for lost in results.scheduler_lost_first(self.dispatch, self.connection, ended):
                self._feed(lost)
        self._feed(stimulus)

    def _feed(self, stimulus: v.Stimulus) -> None:
        """One stimulus into dispatch, its commands carried out. The scheduler's death
        takes its hub, the catalog's writer, along: this process writes the rest."""
        if isinstance(stimulus, v.SchedulerLost):
            self.recording.take_over(hub_alive=False)
        self._execute(self.dispatch.handle(stimulus))

    # -- commands out ------------------------------------------------------------------

    def _execute(self, commands: list[v.Command]) -> None:
        """Carry out dispatch's commands: the one place that submits or cancels tasks
        and reports to Snakemake."""
        for command in commands:
            if isinstance(command, v.Submit):
                self._submits.append((command, self._jobs[command.ticket.key].spec))
                continue
            if isinstance(command, (v.Cancel, v.Poll, v.StopRunning)):
                self._submit()  # what was submitted before, in order
            if isinstance(command, v.Cancel):
                self.tasks.cancel(command.key)
            elif isinstance(command, v.Poll):
                if self.tasks.done(command.key):
                    self._inbox.put(command.key)
            elif isinstance(command, v.StopRunning):
                if self.connection.embedded:  # killed to stop: its hub writes no more
                    self.recording.take_over(hub_alive=self.dispatch.scheduler_lost is None)
                self._inbox.put(self.tasks.stop(command.keys))  # the attempts' end
            elif isinstance(command, v.Record):
                self.recording.emit(command.event)
            elif isinstance(command, v.Log):
                getattr(self.logger, command.level)(command.message)
            elif isinstance(command, v.ProbeCaches):
                self._probes.ask()  # its answer comes back as a stimulus
            elif isinstance(command, v.ReportSuccess):
                self._held.add(self._reported(command.ticket), time.monotonic())
            elif isinstance(command, v.ReportError):
                self._tell_held(everything=True)
                info = self._reported(command.ticket)
                self.report_job_error(info, msg=command.message, aux_logs=list(command.aux_logs))
            else:
                raise TypeError(f"a command of dispatch that nothing carries out: {command!r}")

    def _submit(self) -> None:
        """Hand the attempts dispatch submitted to Dask, together (:meth:`.Tasks.submit`)."""
        batch, self._submits = self._submits, []
        if batch:
            for key, why in self.tasks.submit(batch, self._push):
                self._inbox.put(v.AttemptEnded(key, time.time(), message=why))

    def _tell_held(self, everything: bool = False) -> None:
        """Tell Snakemake the held successes together, when :mod:`.pacing` says so: one
        pass of its scheduler for them all (:func:`..snakemake_internals.finish_together`)."""
        handed, queued = len(self._jobs) + len(self._held), self.dispatch.queued
        due = self._held.due(time.monotonic(), handed=handed, queued=queued, everything=everything)
        if due:
            finish_together(self.workflow, [info.job for info in due])

    def _reported(self, ticket: v.JobTicket) -> SubmittedJobInfo:
        """The job's Snakemake record, taken out of the jobs in flight (reported once)."""
        info = self._jobs.pop(ticket.key).info
        info.aux["reported"] = True
        return info

    def report_job_error(
        self, job_info: SubmittedJobInfo, msg: str | None = None, **kwargs: Any
    ) -> None:
        """Report a failure, with our message only (no 'see the cluster log' suffix)."""
        if job_info.external_jobid is not None:
            kwargs["external_jobid"] = job_info.external_jobid
        if msg and job_info.job.is_group():  # Snakemake's GroupJob.log_error drops msg
            self.logger.error(msg)
        job_info.job.log_error(msg, **kwargs)
        self.workflow.scheduler.error_callback(job_info.job)

    async def sleep(self) -> None:
        """Sleep until a job finishes (woken by its Dask callback) or the pause ends."""
        await self._waker.wait(self._held.pause(self.settings.status_interval))

    # -- cancel and shutdown -------------------------------------------------------------

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Ctrl-C: drop queued jobs, stop running ones, and remove the outputs of
        every job Snakemake will not finish: those in flight, and those that ended
        on their servers but were not yet told (held) or not yet finished by
        Snakemake's scheduler, which stops here (their outputs stay marked
        incomplete: a plain rerun would refuse them)."""
        self._ctrl_c.handled()
        self._inbox.put(v.CancelAll(time.time()))
        self._handle_inbox(telling=False)
        with self._handling:  # not active_jobs: Snakemake empties it while checking them
            jobs = [job.info.job for job in self._jobs.values()]
            jobs += [info.job for info in self._held.take()]
        jobs += told_not_finished(self.workflow)
        self.local_jobs.stop()
        remove_outputs(spec for job in jobs for spec in output_specs(job))

    def shutdown(self) -> None:
        """Stop the status loop, summarise the servers, stop an embedded cluster."""
        self._ctrl_c.stopping()  # a press now would land inside the catalog's last writes
        with self.lock:
            self.wait = False
        self._waker.set()
        super().shutdown()
        cancel_scheduler_timers()  # the scheduler is done: its wake-ups only delay the exit
        with self._closing:  # last made to first, whatever raises
            run = (self.workdir, self.run_id, self.started, self.connection, self._summary)
            write_summary(*run, self.logger.info, self._loads.lost)
