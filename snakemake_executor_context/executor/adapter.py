"""The Snakemake executor (``snakemake --executor context``), only its adapter: the
dispatch state machine (:mod:`.dispatch`) decides; this class feeds it stimuli, one
thread at a time, and carries out its commands in :meth:`Executor._execute`, the one
place that submits or cancels tasks (:mod:`.tasks`) and calls ``report_job_*``.
Imports are cheap: Snakemake imports this module on every start, in every job.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any, NamedTuple

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from ..fleet import events as ev
from ..fleet.keys import job_key_of
from ..jobspec import remove_outputs
from . import startup
from . import vocabulary as v
from .dispatch import FLEET_CHECK_SECONDS
from .jobbuild import SpecBuilder, output_specs
from .recording import Recording
from .results import attempt_ended
from .settings import ExecutorSettings
from .summary import LoadTally, write_summary
from .tasks import Tasks
from .wake import Waker

__all__ = ["Executor"]

#: Events after which placement may find a free slot or a warm server.
WAKING_EVENTS = (ev.JobFinished, ev.ServerJoined, ev.ServerLeft, ev.ContextEvicted)


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
        super().__init__(workflow, logger)

    def __post_init__(self) -> None:
        workflow = self.workflow
        self.declarations = startup.checked_declarations(workflow)
        self.workdir = os.getcwd()
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.started = time.time()
        self.specs = SpecBuilder(
            workflow, self.workdir, self.run_id, self.format_job_exec, self.envvars
        )
        self._jobs: dict[str, _Job] = {}
        self._summary: list[dict[str, Any]] = []
        self._loads = LoadTally()
        self._group_warnings = startup.GroupWarnings()
        self._last_check = 0.0
        startup.log_dask_to_file(self.workdir, self.run_id)
        self.connection = startup.connect(
            self.settings, self.workdir, self.run_id, self.logger.warning
        )
        self.tasks = Tasks(self.connection)
        self.local_jobs = startup.local_plain_jobs(self)
        self.dispatch = startup.make_dispatch(self)
        self.recording = Recording(
            self.connection, self.run_id, self.workdir, self.settings.catalog, self.logger
        )
        fleet = self.dispatch.fleet
        planned = startup.planned_jobs(workflow, self.declarations)
        self.dispatch.hub = self.recording.begin(
            fleet,
            self._on_events,
            jobs_total=len(planned) if planned is not None else None,
            declarations=list(self.declarations.values()),
        )
        if planned is not None:  # else the executor's queue is the demand
            self.dispatch.handle(v.DagPlanned(planned, time.time()))
        if not self.dispatch.hub:  # no hub, no events: Dask's list is the membership
            self.dispatch.handle(v.ServersPolled(self.connection.workers(), time.time()))
        startup.announce_fleet(self)
        self._ready = True

    # -- stimuli in --------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        """Hand a Snakemake job to dispatch (placed and submitted by the status loop)."""
        made, spec, error = self.specs.build(job, self.declarations)
        if warning := self._group_warnings(job):
            self.logger.warning(warning)
        info = SubmittedJobInfo(job=job, external_jobid=made.key, aux={})
        self._jobs[made.key] = _Job(info, spec, made)
        self.report_job_submission(info)
        self._inbox.put(v.JobReady(made, time.time(), error))
        self._waker.set()

    def _on_events(self, event: tuple[float, Any]) -> None:
        """Dask delivers the fleet's events here, on the client's thread."""
        try:
            decoded = list(ev.decode(event[1]))
        except Exception as error:
            logging.getLogger(__name__).debug("undecodable fleet event: %r", error)
            return
        if self.recording.writes:
            for item in decoded:
                self.recording.emit(item)
        now = time.time()
        self._loads.see(decoded)
        for item in decoded:
            self._inbox.put(v.FleetEvent(item, now))
        if any(isinstance(item, WAKING_EVENTS) for item in decoded):
            self._waker.set()

    def _attempt_done(self, key: str) -> None:
        """An attempt's future is done (a Dask callback, on the client's thread)."""
        self._inbox.put(key)
        self._waker.set()

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        """Feed dispatch what happened, carry out its commands, yield unreported jobs."""
        if self._ready:
            now = time.time()
            if now - self._last_check >= FLEET_CHECK_SECONDS:
                self._last_check = now
                try:
                    self._inbox.put(v.ServersPolled(self.connection.workers(), now))
                    startup.publish_demand(self.connection, self.dispatch)
                except Exception as error:
                    self.logger.debug(f"Cannot list the cluster's workers: {error}")
                self._inbox.put(v.Tick(now))
            self._handle_inbox()
        for info in active_jobs:
            if not info.aux.get("reported"):
                yield info

    def _handle_inbox(self) -> None:
        with self._handling:
            while True:
                try:
                    stimulus = self._inbox.get_nowait()
                except queue.Empty:
                    return
                if isinstance(stimulus, str):
                    found = self.tasks.pop(stimulus)
                    if found is None:
                        continue  # cancelled by dispatch: fenced off already
                    ticket = self._jobs[job_key_of(stimulus)].ticket
                    ended, entry = attempt_ended(stimulus, *found, ticket)
                    if ended is None:
                        continue  # lost with its server: the server's loss requeues it
                    stimulus = ended
                    if entry is not None:
                        self._summary.append(entry)
                self._execute(self.dispatch.handle(stimulus))

    # -- commands out ------------------------------------------------------------------

    def _execute(self, commands: list[v.Command]) -> None:
        """Carry out dispatch's commands: the one place that submits or cancels tasks
        and reports to Snakemake."""
        for command in commands:
            if isinstance(command, v.Submit):
                spec = self._jobs[command.ticket.key].spec
                refused = self.tasks.submit(command, spec, self._attempt_done)
                if refused is not None:
                    self._inbox.put(
                        v.AttemptEnded(command.key, time.time(), ok=False, message=refused)
                    )
            elif isinstance(command, v.Cancel):
                self.tasks.cancel(command.key)
            elif isinstance(command, v.Poll):
                if self.tasks.done(command.key):
                    self._inbox.put(command.key)
            elif isinstance(command, v.StopRunning):
                self.tasks.stop(command.keys)
            elif isinstance(command, v.Record):
                self.recording.emit(command.event)
            elif isinstance(command, v.Log):
                getattr(self.logger, command.level)(command.message)
            elif isinstance(command, v.ProbeCaches):
                found = self.recording.probe_caches(list(self.declarations.values()))
                self._inbox.put(v.CachesProbed(found, time.time()))
            else:
                info = self._jobs.pop(command.ticket.key).info
                info.aux["reported"] = True
                if isinstance(command, v.ReportSuccess):
                    self.report_job_success(info)
                else:
                    self.report_job_error(
                        info, msg=command.message, aux_logs=list(command.aux_logs)
                    )

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
        """Sleep until a job finishes (woken by its Dask callback) or the interval ends."""
        await self._waker.wait(self.settings.status_interval)

    # -- cancel and shutdown -------------------------------------------------------------

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Ctrl-C: drop queued jobs, stop running ones, remove the outputs named before."""
        outputs = [output_specs(info.job) for info in active_jobs]
        self._inbox.put(v.CancelAll(time.time()))
        self._handle_inbox()
        self.local_jobs.stop()
        for specs in outputs:
            remove_outputs(specs)

    def shutdown(self) -> None:
        """Stop the status loop, summarise the servers, stop an embedded cluster."""
        with self.lock:
            self.wait = False
        self._waker.set()
        super().shutdown()
        try:
            run = (self.workdir, self.run_id, self.started, self.connection, self._summary)
            write_summary(*run, self.logger.info, self._loads.lost)
        finally:
            try:
                self.recording.finished(ok=self.dispatch.failures == 0)
            finally:
                self.connection.close()
                self.local_jobs.close()
