"""The Snakemake executor: Snakemake jobs in, Dask tasks out, outcomes back.

A context job (a non-group job whose rule names a context and has a ``.py`` script)
becomes a :class:`~.jobspec.ContextJobSpec` that a server runs in-process; every
other job becomes Snakemake's own job command, run as a subprocess on a server.
Outcomes are reported only from :meth:`Executor.check_active_jobs`; a Dask
done-callback merely wakes that loop (see :meth:`Executor.sleep`).

Late binding: jobs wait in the executor's own queue until placement
(:func:`~.placement.choose_server`, over the in-memory :class:`~.fleet.FleetView`)
picks a server with a free slot; only then are they submitted to Dask, pinned to
that server. A pinned task whose server vanishes would wait forever in Dask, so the
executor takes it back and queues it again under a new key: a vanished server never
strands a job. Every state change is sent to the catalog (:mod:`.catalog`).

Imports are cheap on purpose: Snakemake imports this module on every start, in every
job it spawns. Dask and the server code are imported when a run starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from .contexts import ContextDeclaration, declarations_from_config
from .errors import ContextDeclarationError, ContextExecutorError
from .jobbuild import (
    CONTEXT_DIR,
    SpecBuilder,
    job_wildcards,
    priority,
    rule_name,
    task_key,
    title,
)
from .placement import Requirements, explain_unrunnable, job_resources, requirements_from
from .rulecheck import check_context_rules, check_shared_fs, constant_resource
from .settings import ExecutorSettings

if TYPE_CHECKING:
    from .catalog.events import Event
    from .catalog.writer import EventSink
    from .cluster import Engine
    from .fleet import FleetView
    from .jobspec import JobResult
    from .placement import ServerView

__all__ = ["Executor"]

#: How often submitted jobs are checked against the fleet (servers may vanish).
FLEET_CHECK_SECONDS = 2.0
#: The embedded cluster's catalog, relative to the workflow directory.
DEFAULT_CATALOG = CONTEXT_DIR / "catalog.db"
#: Seconds the executor waits at its end for its servers' last events.
LAST_EVENTS_SECONDS = 3.0


@dataclass
class _Tracked:
    """The executor's record of one submitted Snakemake job."""

    key: str
    kind: str  # "context" or "plain"
    requirements: Requirements
    spec: Any
    resources: dict[str, float]
    priority: int
    context: str | None = None
    #: The context's identity (None for a plain job).
    identity: str | None = None
    future: Any = None
    submitted: float = field(default_factory=time.time)
    waiting_since: float | None = None
    error: str | None = None
    cancelled: bool = False
    #: The server placement pinned it to, and the policy's rule that chose it.
    server: str | None = None
    placed_by: str = ""
    seq: int = 0
    requeues: int = 0
    info: Any = None


class _Waker:
    """Wakes the status loop from any thread (Dask callbacks run on a client thread)."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        self._flag.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has ended
                pass

    async def wait(self, timeout: float) -> None:
        if self._event is None:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        if not self._flag.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                pass
        self._flag.clear()
        self._event.clear()


class AwaitedEvents:
    """The jobs whose JobFinished event the catalog still waits for.

    A server sends the event just before it returns the job's result, and the two
    reach the executor by different routes (the scheduler's event topic, the task's
    result), in either order: an event that comes first is remembered, so its job is
    not awaited when its result follows. Callers hold the fleet view's lock.
    """

    def __init__(self) -> None:
        self._expected: set[str] = set()
        self._early: set[str] = set()

    def expect(self, key: str) -> None:
        """The job's result arrived: await its event unless it came first."""
        if key in self._early:
            self._early.discard(key)
        else:
            self._expected.add(key)

    def arrived(self, key: str) -> None:
        """The job's JobFinished event arrived."""
        if key in self._expected:
            self._expected.discard(key)
        else:
            self._early.add(key)

    @property
    def pending(self) -> int:
        """How many results still wait for their event."""
        return len(self._expected)


class Executor(RemoteExecutor):
    """Runs Snakemake jobs on context servers (``snakemake --executor context``)."""

    def __init__(self, workflow: Any, logger: Any) -> None:
        # RemoteExecutor starts the status thread before __post_init__: what it
        # touches must exist first.
        self.settings: ExecutorSettings = workflow.executor_settings or ExecutorSettings()
        self._waker = _Waker()
        self._ready = False
        self._last_fleet_check = 0.0
        super().__init__(workflow, logger)

    def __post_init__(self) -> None:
        check_shared_fs(self.workflow.storage_settings.shared_fs_usage)
        self.declarations = declarations_from_config(self.workflow.config)
        check_context_rules(self.workflow.rules, self.declarations, self._deployment())
        self.workdir = os.getcwd()
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.started = time.time()
        self.specs = SpecBuilder(
            self.workflow, self.workdir, self.run_id, self.format_job_exec, self.envvars
        )
        self._warned_groups: set[str] = set()
        self._fleet: tuple[float, list[ServerView]] = (0.0, [])
        self._results: list[JobResult] = []
        self._flight: dict[str, _Tracked] = {}
        self._queue: list[_Tracked] = []
        self._queue_lock = threading.RLock()
        self._seq = itertools.count()
        self._failures = 0
        self._awaiting = AwaitedEvents()
        self._quiet_dask()
        self.engine: Engine = self._start_engine()
        from .fleet import FleetView

        self.view: FleetView = FleetView()
        self._sink: EventSink | None = None
        self._writes = False
        self._catalog_warned = False
        self._start_catalog()
        self._announce_fleet()
        self._ready = True

    # -- start --------------------------------------------------------------------

    def _deployment(self) -> set[str]:
        methods = self.workflow.deployment_settings.deployment_method
        return {method.item_to_choice() for method in methods}

    def _start_engine(self) -> Engine:
        from .cluster import Engine

        settings = self.settings
        if settings.scheduler_address or settings.scheduler_file:
            return Engine.attach(
                address=settings.scheduler_address,
                scheduler_file=Path(settings.scheduler_file) if settings.scheduler_file else None,
                timeout=settings.connect_timeout,
            )
        scheduler_file = Path(self.workdir) / CONTEXT_DIR / "cluster" / f"{self.run_id}.json"
        return Engine.start_embedded(
            scheduler_file,
            servers=settings.servers,
            memory_budget=settings.memory_budget,
            timeout=max(settings.connect_timeout, 60.0),
        )

    def _quiet_dask(self) -> None:
        """Dask's client logs go to a file: Snakemake's output stays Snakemake's."""
        import logging

        log_dir = Path(self.workdir) / CONTEXT_DIR / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_dir / f"client-{self.run_id}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        for name in ("distributed", "tornado", "asyncio"):
            log = logging.getLogger(name)
            log.handlers = [handler]
            log.propagate = False

    # -- the catalog and the fleet view -------------------------------------------

    def _catalog_warning(self, message: str) -> None:
        """A catalog problem: said once, never fatal."""
        if not self._catalog_warned:
            self._catalog_warned = True
            self.logger.warning(message)

    def _start_catalog(self) -> None:
        """Find the catalog's writer, seed the fleet view, subscribe to the fleet's
        events. Nothing here can fail the run: a problem is a warning."""
        from .catalog import events as ev

        client = self.engine.client
        try:
            client.subscribe_topic(ev.TOPIC, self._on_events)
        except Exception as error:
            self._catalog_warning(f"Cannot follow the fleet's events: {error}")
        snapshot = self._fleet_snapshot()
        self._sink = self._open_sink(snapshot)
        self._emit(
            ev.RunStarted(
                run_id=self.run_id,
                workdir=self.workdir,
                host=socket.gethostname(),
                pid=os.getpid(),
                cluster=self.engine.description,
                jobs_total=self._jobs_total(),
                versions=_versions(),
            )
        )
        if self._writes:
            with self.view.lock:
                servers = list(self.view.servers.values())
            for server in servers:
                self._emit(
                    ev.ServerJoined(
                        address=server.address,
                        name=server.name,
                        slots=server.slots,
                        resources=server.resources,
                    )
                )
                if server.budget is not None or server.gpu is not None:
                    self._emit(
                        ev.ServerDescribed(
                            address=server.address,
                            name=server.name,
                            memory_budget=server.budget or 0,
                            gpu=server.gpu,
                        )
                    )
        self._probe_caches()

    def _fleet_snapshot(self) -> dict[str, Any] | None:
        """The scheduler plugin's view of the fleet; the plugin is registered first on
        a Dask scheduler this plugin did not start."""
        from .catalog.plugin import CatalogSchedulerPlugin, fleet_snapshot

        client = self.engine.client
        snapshot = None
        try:
            snapshot = client.run_on_scheduler(fleet_snapshot)
            if snapshot is None:
                client.register_plugin(CatalogSchedulerPlugin())
                snapshot = client.run_on_scheduler(fleet_snapshot)
        except Exception as error:
            self.logger.debug(f"No fleet snapshot from the scheduler: {error}")
        if snapshot:
            with self.view.lock:
                self.view.load_wire(snapshot.get("view") or {})
        self._servers(force=True)
        return snapshot

    def _open_sink(self, snapshot: dict[str, Any] | None) -> EventSink | None:
        """A relay to the cluster's writer, or this process's own writer."""
        from .catalog.writer import CatalogWriter, DaskRelay

        if snapshot and snapshot.get("writer"):
            where = (snapshot.get("catalog") or {}).get("requested")
            if self.settings.catalog:
                self.logger.info(
                    f"The cluster records into its own catalog ({where}); "
                    "--context-catalog is not used."
                )
            self.catalog_location = where
            return DaskRelay(
                self.engine.client, warn=self._catalog_warning, heartbeat_run=self.run_id
            )
        spec = self.settings.catalog or str(Path(self.workdir) / DEFAULT_CATALOG)
        if spec.strip().lower() in ("none", "off", "no", "false"):
            self.catalog_location = None
            return None
        try:
            from .catalog.queries import placement_measurements
            from .catalog.store import open_store

            store = open_store(spec)
            with store.session() as session:
                measured = placement_measurements(session)
            with self.view.lock:
                self.view.measure.merge_wire(measured)
        except Exception as error:
            self._catalog_warning(
                f"{error} The run goes on without recording into the catalog."
                if isinstance(error, ContextExecutorError)
                else f"Cannot open the context catalog {spec}: {error}. The run goes on "
                "without recording into it."
            )
            self.catalog_location = None
            return None
        self._writes = True
        self.catalog_location = store.location.describe()
        return CatalogWriter(store, warn=self._catalog_warning, heartbeat_run=self.run_id)

    def _probe_caches(self) -> None:
        """Ask every server which declared contexts its local cache holds."""
        from .server import probe_caches

        declarations = list(self.declarations.values())
        if not declarations:
            return
        try:
            found = self.engine.client.run(probe_caches, declarations, on_error="return")
        except Exception:
            return
        with self.view.lock:
            for address, identities in found.items():
                server = self.view.servers.get(address)
                if server is not None and isinstance(identities, list):
                    server.cached.update(identities)

    def _emit(self, event: Event) -> None:
        sink = self._sink
        if sink is not None:
            sink.submit(event)

    def _emit_lazily(self, make: Callable[[], Event]) -> None:
        """Build and send an event; a failure to build it costs the record, not the job."""
        if self._sink is None:
            return
        try:
            event = make()
        except Exception as error:
            self._catalog_warning(f"An event for the context catalog could not be made: {error!r}")
            return
        self._emit(event)

    def _on_events(self, event: tuple[float, Any]) -> None:
        """Dask delivers the fleet's events here (on the client's thread)."""
        from .catalog import events as ev

        try:
            decoded = list(ev.decode(event[1]))
        except Exception:
            return
        wake = False
        with self.view.lock:
            for item in decoded:
                mine = getattr(item, "run_id", None) == self.run_id
                if isinstance(item, ev.JobFinished) and mine and self._sink is not None:
                    self._awaiting.arrived(item.key)
                if mine and isinstance(
                    item, (ev.JobDispatched, ev.JobReported, ev.RunStarted, ev.RunFinished)
                ):
                    continue  # this executor's own, echoed by the scheduler
                self.view.apply(item, measure=not mine)
                wake = wake or isinstance(
                    item,
                    (ev.JobFinished, ev.ServerJoined, ev.ServerLeft, ev.ContextEvicted),
                )
        if self._writes and self._sink is not None:
            for item in decoded:
                self._sink.submit(item)
        if wake:
            self._waker.set()

    def _jobs_total(self) -> int | None:
        # Local rules run in Snakemake's own process and targets like `all` run
        # nothing: neither reaches the executor, so a run's progress counts the others.
        try:
            return sum(
                1 for job in self.workflow.dag.needrun_jobs() if not (job.is_local or job.is_norun)
            )
        except Exception:
            return None

    def _announce_fleet(self) -> None:
        servers = self._servers(force=True)
        wants_gpu = any(constant_resource(rule, "gpu") for rule in self.workflow.rules)
        stand_ins: list[str] = []
        if self.engine.local is not None:
            info = self.engine.local.files.read_info() or {}
            stand_ins = [s["name"] for s in info.get("servers", []) if s.get("gpu") is None]
        self.logger.info(
            f"Context executor: {len(servers)} server(s) on the {self.engine.description}."
        )
        if stand_ins and wants_gpu:
            self.logger.info(
                f"No GPU found on this machine: the CPU servers {', '.join(stand_ins)} stand "
                "in for gpu=1, so GPU rules run on the CPU."
            )

    # -- submission ---------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        """Turn a Snakemake job into a Dask task (or hold it until a server fits)."""
        key = task_key(job)
        context = None if job.is_group() else job.resources.get("context")
        tracked: _Tracked
        identity = None
        try:
            if job.is_group():
                self._warn_group(job)
                spec: Any = self.specs.plain(job, key)
                kind = "plain"
            elif context:
                declaration = self._declaration(job, str(context))
                spec = self.specs.context(job, key, declaration)
                identity = declaration.identity
                kind = "context"
            else:
                spec = self.specs.plain(job, key)
                kind = "plain"
            requirements = requirements_from(job.resources)
            tracked = _Tracked(
                key=key,
                kind=kind,
                requirements=requirements,
                spec=spec,
                resources=job_resources(requirements),
                priority=priority(job),
                context=str(context) if context else None,
                identity=identity,
                seq=next(self._seq),
            )
        except ContextExecutorError as error:
            tracked = _Tracked(
                key=key,
                kind="invalid",
                requirements=Requirements(),
                spec=None,
                resources={},
                priority=0,
                error=str(error),
            )
        info = SubmittedJobInfo(job=job, external_jobid=key, aux={"tracked": tracked})
        tracked.info = info
        self.report_job_submission(info)
        if tracked.error is None:
            with self._queue_lock:
                self._queue.append(tracked)
            self._dispatch()
        self._waker.set()

    def _declaration(self, job: JobExecutorInterface, name: str) -> ContextDeclaration:
        declaration = self.declarations.get(name)
        if declaration is None:
            known = ", ".join(sorted(self.declarations)) or "none"
            raise ContextDeclarationError(
                f"Rule '{job.rule.name}' uses context '{name}', which is not declared "
                f'(declared: {known}). Fix: add declare_context(config, "{name}", ...) '
                "to the Snakefile, or correct the rule's context resource."
            )
        return declaration

    def _runnable(self, tracked: _Tracked) -> bool:
        """Whether any server has the job's resources (the fleet asked again if not);
        a job no server can run starts waiting (see :meth:`_waited_too_long`)."""
        from .placement import runnable_on

        if not runnable_on(tracked.requirements, self._servers()) and not runnable_on(
            tracked.requirements, self._servers(force=True)
        ):
            if tracked.waiting_since is None:
                tracked.waiting_since = time.time()
            return False
        tracked.waiting_since = None
        return True

    def _dispatch(self) -> None:
        """Submit the queued jobs that placement finds a server for, in Snakemake's
        priority order; the others stay queued."""
        from .placement import choose_server

        with self._queue_lock:
            if not self._queue:
                return
            queued = sorted(self._queue, key=lambda t: (-t.priority, t.seq))
            runnable = [t for t in queued if not t.cancelled and self._runnable(t)]
            if self.settings.placement == "dask":
                for tracked in runnable:
                    self._submit(tracked, None, "dask")
            else:
                with self.view.lock:
                    demand = Counter(t.identity for t in queued if t.identity)
                    for tracked in self._in_flight():
                        if tracked.identity:
                            demand[tracked.identity] += 1
                    ahead: Counter[str] = Counter()
                    now = time.time()
                    for tracked in runnable:
                        decision = choose_server(
                            self.view,
                            tracked.resources,
                            tracked.identity,
                            queued_ahead=ahead[tracked.identity or ""],
                            demand=demand,
                            now=now,
                        )
                        if tracked.identity:
                            ahead[tracked.identity] += 1
                        if decision.address is not None:
                            self._submit(tracked, decision.address, decision.rule)
            self._queue = [t for t in self._queue if t.future is None and not t.cancelled]

    def _in_flight(self) -> list[_Tracked]:
        return [t for t in list(self._flight.values()) if t.future is not None]

    def _submit(self, tracked: _Tracked, address: str | None, rule: str) -> None:
        from .catalog.events import JobDispatched
        from .server import execute_job

        tracked.waiting_since = None
        pin: dict[str, Any] = {}
        if address is not None:
            # Pinned hard: work stealing leaves it where placement put it. A server
            # that vanishes takes the task with it into Dask's no-worker state;
            # check_active_jobs then queues the job again (see _requeue).
            pin = {"workers": [address], "allow_other_workers": False}
        future = self.engine.client.submit(
            execute_job,
            tracked.spec,
            key=tracked.key,
            pure=False,
            resources=tracked.resources or None,
            priority=tracked.priority,
            **pin,
        )
        future.add_done_callback(lambda _: self._waker.set())
        tracked.future = future
        tracked.server = address
        tracked.placed_by = rule
        self._flight[tracked.key] = tracked
        now = time.time()
        if address is not None:
            self.view.dispatched(tracked.key, address, tracked.identity, now)
        job = tracked.info.job if tracked.info is not None else None
        self._emit_lazily(
            lambda: JobDispatched(
                at=now,
                run_id=self.run_id,
                key=tracked.key,
                jobid=str(getattr(job, "jobid", "")),
                attempt=int(getattr(job, "attempt", 1) or 1),
                rule=rule_name(job),
                wildcards=job_wildcards(job),
                job_kind=tracked.kind,
                context=tracked.identity,
                context_name=tracked.context,
                target=address,
                submitted=tracked.submitted,
                reason=rule,
            )
        )

    def _requeue(self, tracked: _Tracked) -> None:
        """Take back a job whose pinned server vanished and queue it again."""
        try:
            tracked.future.cancel()
        except Exception:
            pass
        self._flight.pop(tracked.key, None)
        with self.view.lock:
            self.view.forget(tracked.key)
        tracked.requeues += 1
        tracked.key = f"{tracked.key.rsplit('-', 1)[0]}-{uuid.uuid4().hex[:8]}"
        tracked.spec = dataclasses.replace(tracked.spec, key=tracked.key)
        tracked.future = None
        tracked.server = None
        with self._queue_lock:
            self._queue.append(tracked)

    def _servers(self, force: bool = False) -> list[ServerView]:
        stamp, servers = self._fleet
        if force or time.monotonic() - stamp > FLEET_CHECK_SECONDS:
            polled = time.monotonic()
            servers = self.engine.servers()
            self._fleet = (time.monotonic(), servers)
            view = getattr(self, "view", None)
            if view is not None:
                with view.lock:
                    view.sync_servers(
                        ((s.address, s.name, s.resources, s.slots) for s in servers),
                        since=polled,
                    )
        return servers

    def _warn_group(self, job: Any) -> None:
        if job.groupid in self._warned_groups:
            return
        self._warned_groups.add(job.groupid)
        members = sorted({j.rule.name for j in job.jobs if j.resources.get("context")})
        if members:
            self.logger.warning(
                f"Group '{job.groupid}' runs as one subprocess: its context rule(s) "
                f"{', '.join(members)} load their context in that subprocess, not on a "
                "context server. Fix: take them out of the group to reuse loaded contexts."
            )

    # -- status -------------------------------------------------------------------

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        """Report finished jobs; submit or fail waiting ones; yield the rest."""
        if not self._ready:
            for info in active_jobs:
                yield info
            return
        now = time.time()
        check_fleet = time.monotonic() - self._last_fleet_check > FLEET_CHECK_SECONDS
        if check_fleet:
            self._last_fleet_check = time.monotonic()
            self._servers(force=True)
        for info in active_jobs:
            tracked: _Tracked = info.aux["tracked"]
            if tracked.cancelled:
                continue
            if tracked.error is not None:
                self._emit_reported(info, tracked, "invalid", tracked.error)
                self.report_job_error(info, msg=tracked.error)
                continue
            if tracked.future is None:
                if tracked.waiting_since is not None and self._waited_too_long(tracked, now):
                    with self._queue_lock:
                        tracked.cancelled = True
                        self._queue = [t for t in self._queue if t is not tracked]
                    self._fail_unrunnable(info, tracked, now)
                else:
                    yield info
                continue
            if tracked.future.done():
                self._report(info, tracked)
                continue
            if tracked.server is not None and self._server_gone(tracked.server):
                self._requeue(tracked)
                yield info
                continue
            if check_fleet and not self._still_runnable(tracked, now):
                self._fail_unrunnable(info, tracked, now)
                continue
            yield info
        self._dispatch()

    def _server_gone(self, address: str) -> bool:
        with self.view.lock:
            return address not in self.view.servers

    def _waited_too_long(self, tracked: _Tracked, now: float) -> bool:
        # The embedded cluster's fleet is fixed: nothing will join to run the job.
        if self.engine.embedded:
            return True
        since = tracked.waiting_since or now
        return now - since >= self.settings.wait_for_server

    def _still_runnable(self, tracked: _Tracked, now: float) -> bool:
        from .placement import runnable_on

        if runnable_on(tracked.requirements, self._servers()):
            tracked.waiting_since = None
            return True
        if tracked.waiting_since is None:
            tracked.waiting_since = now
        return now - tracked.waiting_since < self.settings.wait_for_server

    def _fail_unrunnable(self, info: SubmittedJobInfo, tracked: _Tracked, now: float) -> None:
        if tracked.future is not None:
            tracked.future.cancel()
        waited = now - (tracked.waiting_since or now)
        message = explain_unrunnable(
            info.job.rule.name,
            tracked.requirements,
            self._servers(force=True),
            waited=waited,
        )
        self._flight.pop(tracked.key, None)
        self._emit_reported(info, tracked, "unrunnable", message)
        self.report_job_error(info, msg=message)

    def _emit_reported(
        self, info: SubmittedJobInfo, tracked: _Tracked, outcome: str, message: str | None
    ) -> None:
        from .catalog.events import JobReported

        if outcome not in ("ok", "cancelled"):
            self._failures += 1
        self._emit_lazily(
            lambda: JobReported(
                run_id=self.run_id,
                key=tracked.key,
                jobid=str(getattr(info.job, "jobid", "")),
                rule=rule_name(info.job),
                outcome=outcome,
                message=(message or "")[:4000] or None,
            )
        )

    def _complete(self, tracked: _Tracked, result: JobResult | None) -> None:
        """A job's task ended: free its slot in the view, learn what its server holds."""
        with self._queue_lock:
            self._flight.pop(tracked.key, None)
        with self.view.lock:
            if result is None:
                self.view.forget(tracked.key)
                return
            self.view.finished(
                tracked.key,
                result.server.address or tracked.server,
                identity=tracked.identity,
                started=result.started,
                loaded=result.loaded,
                reused=result.reused,
                evicted=result.evicted,
                job_seconds=(
                    max(0.0, result.finished - result.started - result.load_seconds)
                    if result.ok
                    else None
                ),
                load_seconds=result.load_seconds,
            )
            if self._sink is not None:
                self._awaiting.expect(tracked.key)

    def _report(self, info: SubmittedJobInfo, tracked: _Tracked) -> None:
        future = tracked.future
        if future.status == "finished":
            try:
                result: JobResult = future.result()
            except Exception as error:  # the result could not be fetched
                self._complete(tracked, None)
                message = f"{title(info.job)}: {error}"
                self._emit_reported(info, tracked, "failed", message)
                self.report_job_error(info, msg=message)
                return
            self._complete(tracked, result)
            result.extra["reported"] = time.time()
            result.extra["submitted"] = tracked.submitted
            result.extra["placed_by"] = tracked.placed_by
            self._results.append(result)
            if result.ok:
                self._emit_reported(info, tracked, "ok", None)
                self.report_job_success(info)
            elif result.cancelled and tracked.cancelled:
                self._emit_reported(info, tracked, "cancelled", result.message)
            else:
                aux = [result.log_path] if result.log_path else []
                self._emit_reported(info, tracked, "failed", result.message)
                self.report_job_error(info, msg=result.message, aux_logs=aux)
            return
        self._complete(tracked, None)
        if future.status == "cancelled":
            if not tracked.cancelled:
                message = f"{title(info.job)}: cancelled in Dask."
                self._emit_reported(info, tracked, "failed", message)
                self.report_job_error(info, msg=message)
            return
        message = _explain_task_error(info.job, future.exception())
        self._emit_reported(info, tracked, "failed", message)
        self.report_job_error(info, msg=message)

    def report_job_error(
        self, job_info: SubmittedJobInfo, msg: str | None = None, **kwargs: Any
    ) -> None:
        """Report a failure, with our message only (no 'see the cluster log' suffix)."""
        if job_info.external_jobid is not None:
            kwargs["external_jobid"] = job_info.external_jobid
        job_info.job.log_error(msg, **kwargs)
        self.workflow.scheduler.error_callback(job_info.job)

    async def sleep(self) -> None:
        """Sleep until a job finishes (woken by its Dask callback) or the interval ends."""
        await self._waker.wait(self.settings.status_interval)

    # -- cancel and shutdown ------------------------------------------------------

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Stop running jobs, then remove their outputs (Ctrl-C).

        The embedded cluster is killed outright: every job in it stops at once. On an
        attached cluster each job is stopped where it runs (its process tree killed, or
        JobCancelled raised in its thread); a server whose job does not stop within
        10 s is restarted, so nothing keeps writing once the outputs are removed.
        """
        tracked = [info.aux["tracked"] for info in active_jobs]
        with self._queue_lock:
            for item in tracked:
                item.cancelled = True
            self._queue = []
        if self.engine.embedded:
            self.engine.kill()
        else:
            self._cancel_on_servers([t for t in tracked if t.future is not None])
        for info in active_jobs:
            _remove_outputs(info.job.output)

    def _cancel_on_servers(self, tracked: list[_Tracked]) -> None:
        from .server import cancel_jobs

        if not tracked:
            return
        client = self.engine.client
        try:
            outcome = client.run(cancel_jobs, [t.key for t in tracked], 10.0, on_error="return")
        except Exception:
            outcome = {}
        stuck = [
            address
            for address, per_job in outcome.items()
            if isinstance(per_job, dict) and "running" in per_job.values()
        ]
        try:
            if stuck:
                client.restart_workers(stuck, raise_for_error=False)
            client.cancel([t.future for t in tracked], force=True)
        except Exception:
            pass

    def shutdown(self) -> None:
        """Stop the status loop, summarise the servers, stop an embedded cluster."""
        with self.lock:
            self.wait = False
        self._waker.set()
        super().shutdown()
        try:
            self._write_summary()
        finally:
            try:
                self._close_catalog()
            finally:
                self.engine.close()

    def _close_catalog(self) -> None:
        """Wait briefly for the servers' last events, record the run's end, and write
        what is queued (a few seconds at most)."""
        from .catalog.events import TOPIC, RunFinished

        deadline = time.monotonic() + LAST_EVENTS_SECONDS
        while self._awaiting.pending and time.monotonic() < deadline and not self.engine.closed:
            time.sleep(0.05)
        self._emit(RunFinished(run_id=self.run_id, ok=self._failures == 0))
        try:
            self.engine.client.unsubscribe_topic(TOPIC)
        except Exception:
            pass
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.close(timeout=5.0)

    def _write_summary(self) -> None:
        inventories = self.engine.inventories()
        summary = {
            "run_id": self.run_id,
            "started": self.started,
            "finished": time.time(),
            "cluster": self.engine.description,
            "servers": inventories,
            "jobs": [
                {
                    "key": r.key,
                    "ok": r.ok,
                    "server": r.server.name,
                    "address": r.server.address,
                    "placed_by": r.extra.get("placed_by"),
                    "pid": r.server.pid,
                    "started": r.started,
                    "finished": r.finished,
                    "items": r.items,
                    "load_seconds": r.load_seconds,
                    "loaded": r.loaded,
                    "reused": r.reused,
                    "reported": r.extra.get("reported"),
                    "submitted": r.extra.get("submitted"),
                }
                for r in self._results
            ],
        }
        path = Path(self.workdir) / CONTEXT_DIR / "runs" / f"{self.run_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1, default=str))
        loads = sum(inv.get("loads", 0) for inv in inventories.values())
        context_jobs = sum(1 for r in self._results if r.loaded or r.reused)
        if context_jobs:
            self.logger.info(
                f"Context servers ran {context_jobs} context job(s) with {loads} context "
                f"load(s) in this cluster's lifetime; summary: {path}"
            )


# ----------------------------------------------------------------------------------
# Helpers.


def _versions() -> dict[str, str]:
    from ._version import __version__

    try:
        import snakemake

        return {"snakemake": snakemake.__version__, "plugin": __version__}
    except Exception:
        return {"plugin": __version__}


def _explain_task_error(job: Any, error: BaseException | None) -> str:
    name = type(error).__name__ if error is not None else "unknown error"
    if name == "KilledWorker":
        return (
            f"{title(job)}: the servers that ran it died every time "
            "(distributed.scheduler.allowed-failures reached): "
            f"{error}. A job that makes its server crash (out of memory, a segfault in "
            "a native library) fails here. Fix: look at the cluster log, give the "
            "rule more memory, or raise allowed-failures for preemptible servers."
        )
    return f"{title(job)}: the task failed in Dask: {name}: {error}"


def _remove_outputs(outputs: Iterable[Any]) -> None:
    import shutil

    for path in map(str, outputs):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        except OSError:
            pass
