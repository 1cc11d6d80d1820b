"""The simulator: the real dispatch machine, driven through simulated time.

:class:`Simulation` plays the executor's adapter (:mod:`..executor.adapter`): it
hands the real :class:`~..dispatch.machine.Dispatch` the stimuli a run would
(Snakemake's jobs, the fleet's events, the attempts' results, a tick every fleet
check) and carries out its commands (a submission reaches the simulated server a
Dask round trip later; a report reaches Snakemake's side, :mod:`.release`). Placement,
the demand it weighs, the pool's sizing, loss classification and budgets are the
real code, imported; the servers (:mod:`.simservers`), the pool (:mod:`.simpool`) and the
preemptions (:mod:`.preempt`) are simulated. The CPU time the dispatch machine spends
is measured as it runs.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import Counter

from ..dispatch import vocabulary as v
from ..dispatch.machine import FLEET_CHECK_SECONDS, Dispatch
from ..fleet import events as ev
from ..fleet.gpus import GpuInfo
from ..fleet.keys import job_key
from ..fleet.outcome import Outcome
from ..fleet.peerchoice import Rates
from ..fleet.poolsizing import PoolDemand
from ..fleet.resources import job_resources, server_resources
from ..fleet.servers import CPU_MODEL
from .clock import Clock
from .hosting import Serving, Turns
from .model import ContextModel, Fleet, JobTimes, Options, Preemption, ServerKind, Storage
from .preempt import Preempter
from .release import Release
from .result import Counts, SimResult, summarise
from .shared import Shared
from .simdefaults import WAIT_FOR_SERVER
from .simledger import ledger
from .simpool import SimPool
from .simservers import SimServer
from .workload import SimJob, Workload

__all__ = ["Simulation"]

#: Seconds from a killed server to its loss reaching the scheduler (the nanny's exit
#: code; measured here: SIGKILL to requeue p50 0.085 s).
DETECT_SECONDS = 0.075
#: Memory a simulated server advertises (MB), beyond any rule's ask.
SERVER_MEM_MB = 1_000_000


class Simulation:
    """One simulated run of a workload on a fleet."""

    def __init__(
        self,
        workload: Workload,
        fleet: Fleet,
        times: JobTimes,
        *,
        storage: Storage | None = None,
        preemption: Preemption | None = None,
        options: Options | None = None,
    ) -> None:
        self.workload, self.fleet, self.times = workload, fleet, times
        self.storage = storage or Storage()
        self.preemption = preemption or Preemption()
        self.options = options = options or Options()
        self.mode = options.mode
        self.clock = Clock()
        self.rng = random.Random(options.seed)
        self.run_id = f"sim-{options.seed}"
        bandwidth = self.storage.shared_bandwidth
        self.filesystem = Shared(self.clock, lambda n: bandwidth)
        self.turns = Turns(fleet.pool.loads_per_source if fleet.pool else 0)
        self._contexts = {c.identity: c for c in workload.contexts.values()}
        slots = sum(kind.count * kind.slots for kind in fleet.kinds)
        if fleet.pool:
            slots = fleet.pool.maximum * max(kind.slots for kind in fleet.kinds)
        self.dispatch = Dispatch(
            self.run_id,
            embedded=fleet.pool is None,
            # A pool's jobs wait as long as its queue takes (the executor's startup).
            wait_for_server=math.inf if fleet.pool else WAIT_FOR_SERVER,
            budgets=options.budgets,
            planned=0 if fleet.pool else fleet.size,
            survival_placement=options.survival,
        )
        self.release = Release(
            self,
            workload,
            jobs=options.jobs or 2 * max(1, slots),
            job_seconds=options.snakemake_job_seconds,
            per_second=options.jobs_per_second,
            local_cores=options.local_cores,
            local_seconds=lambda job: times.local.get(job.rule, 0.0),
            locally=lambda job: job.kind != "context",
        )
        self.servers: dict[str, SimServer] = {}
        self.every: list[SimServer] = []
        self._incarnations: Counter[str] = Counter()
        self._host_disk: set[str] = set()
        self.pool = SimPool(self, fleet.pool, fleet.kinds) if fleet.pool else None
        self.preempter = Preempter(self, self.preemption, seed=options.seed)
        self.published = PoolDemand()
        self.events: list[tuple[float, str, str]] = []
        self.cpu = 0.0
        self.stimuli = 0
        self.placed: Counter[str] = Counter()
        self.handed = 0
        #: Items of each attempt handed to a server (by attempt key).
        self.items_of: dict[str, int] = {}
        self._done = False

    # -- the host of servers, pool and preemptions ------------------------------------

    def context(self, identity: str) -> ContextModel:
        """The model of a context, by identity."""
        return self._contexts[identity]

    def active(self) -> bool:
        """Whether the run goes on."""
        return not self._done

    def live_servers(self) -> list[SimServer]:
        """The servers running now."""
        return list(self.servers.values())

    def holders(self, identity: str, address: str) -> list[Serving]:
        """The other running servers whose local disk holds the context's template."""
        servers = self.servers.values()
        return [s.serving for s in servers if s.address != address and identity in s.disk]

    def rates(self, identity: str, gpu_model: str) -> Rates:
        """What the fleet measured of the context's loads and transfers: the hub's view
        is the executor's (both follow the fleet's events)."""
        return self.dispatch.fleet.measure.rates(identity, gpu_model)

    def note(self, what: str, detail: str) -> None:
        """One line of the event log."""
        if self.options.log:
            self.events.append((round(self.clock.now, 6), what, detail))

    def add_server(self, kind: ServerKind, name: str, retires_at: float | None) -> SimServer:
        """A server joins (a fixed fleet's, a restarted one, or a pilot's)."""
        self._incarnations[name] += 1
        address = f"sim://{name}/{self._incarnations[name]}"
        now = self.clock.now
        server = SimServer(self, address, name, kind, now)
        if self.fleet.one_host and self.pool is None:
            server.disk = self._host_disk
        server.disk.update(self.fleet.cached)
        self.servers[address] = server
        self.every.append(server)
        if kind.gpu_model == CPU_MODEL:
            resources = server_resources(SERVER_MEM_MB * 1_000_000, stand_in_gpus=1)
        else:
            gpu = GpuInfo(index=0, uuid=f"{name}-gpu", name=kind.gpu_model, memory_bytes=0)
            resources = server_resources(SERVER_MEM_MB * 1_000_000, [gpu])
        self.note("joined", f"{name} ({kind.gpu_model})")
        self.emit(
            ev.ServerJoined(
                at=now, address=address, name=name, slots=kind.slots, resources=resources
            )
        )
        self.emit(
            ev.ServerDescribed(
                at=now,
                address=address,
                name=name,
                memory_budget=kind.budget,
                retires_at=retires_at,
                group=kind.where,
            )
        )
        self.preempter.joined(server)
        return server

    def emit(self, event: ev.Event) -> None:
        """A server's event, through the scheduler's hub to the executor."""
        delay = self.options.event_latency
        if isinstance(event, ev.ServerLeft):
            self._server_left(event)
            if not event.expected:
                delay += DETECT_SECONDS
        elif isinstance(event, ev.ContextReady):
            self.note("loaded", f"{event.address} {event.load_seconds:.3f}")
        self.clock.after(delay, self._deliver, event)

    def ended(self, key: str, outcome: Outcome) -> None:
        """An attempt's result, back through Dask."""
        self.note("ended", key)
        self.clock.after(self.options.dask_latency, self._result, key, outcome)

    # -- Snakemake's side -------------------------------------------------------------

    def hand_over(self, job: SimJob) -> None:
        """Snakemake hands the executor a job (``run_job``)."""
        self.handed += 1
        self.note("ready", job.jobid)
        self._feed(v.JobReady(self._ticket(job), self.clock.now))

    def _ticket(self, job: SimJob) -> v.JobTicket:
        context = self.workload.contexts.get(job.context) if job.context else None
        nonce = hashlib.sha256(f"{self.options.seed} {job.jobid}".encode()).hexdigest()[:8]
        return v.JobTicket(
            key=job_key(job.rule, job.jobid, 1, nonce),
            label=f"rule '{job.rule}'",
            title=f"Rule '{job.rule}' ({job.jobid})",
            rule=job.rule,
            jobid=job.jobid,
            kind="context" if context else "plain",
            requirements=job.requirements,
            wanted=job_resources(job.requirements),
            identity=context.identity if context else None,
            context=context.name if context else None,
            shareable=context.shareable if context else True,
            priority=job.priority,
            submitted=self.clock.now,
            log_path=f"logs/{job.rule}/{job.jobid}.log",
        )

    # -- the adapter: stimuli in, commands out ----------------------------------------

    def _feed(self, stimulus: v.Stimulus) -> None:
        begin = time.process_time()
        commands = self.dispatch.handle(stimulus)
        self.cpu += time.process_time() - begin
        self.stimuli += 1
        for command in commands:
            self._carry(command)

    def _carry(self, command: v.Command) -> None:
        if isinstance(command, v.Submit):
            self.placed[str(command.step)] += 1
            server = self.servers.get(command.address or "")
            self.note("placed", f"{command.key} {command.step} {server.name if server else '-'}")
            if server is not None:
                items = self.release.jobs[command.ticket.jobid].items
                self.items_of[command.key] = items
                self.clock.after(
                    self.options.dask_latency, server.arrive, command.ticket, command.key, items
                )
        elif isinstance(command, v.Cancel):
            for server in self.servers.values():
                server.cancel(command.key)
        elif isinstance(command, v.ReportSuccess):
            self.release.ended(command.ticket.jobid, True)
        elif isinstance(command, v.ReportError):
            self.note("failed", f"{command.ticket.jobid} {command.message[:200]}")
            self.release.ended(command.ticket.jobid, False)
        elif isinstance(command, v.Log):
            self.note(command.level, command.message)
        elif isinstance(command, v.ProbeCaches):
            found = {a: tuple(sorted(s.disk)) for a, s in self.servers.items()}
            self.clock.after(self.options.event_latency, self._feed_probe, found)
        elif isinstance(command, (v.Record, v.Poll)):
            # No catalog here; and an attempt's result always comes back (a Dask round
            # trip after its end), so a future is never looked at.
            pass
        else:
            raise TypeError(
                f"a command of dispatch that the simulator does not carry out: {command!r}"
            )

    def _feed_probe(self, found: dict[str, tuple[str, ...]]) -> None:
        self._feed(v.CachesProbed(found, self.clock.now))

    def _deliver(self, event: ev.Event) -> None:
        if not self._done:
            self._feed(v.FleetEvent(event, self.clock.now))

    def _result(self, key: str, outcome: Outcome) -> None:
        if not self._done:
            self._feed(v.AttemptEnded(key, self.clock.now, outcome=outcome))

    def _tick(self) -> None:
        if self._done:
            return
        self.published = self.dispatch.pool_demand()
        self._feed(v.Tick(self.clock.now))
        self.clock.after(FLEET_CHECK_SECONDS, self._tick)

    def _server_left(self, event: ev.ServerLeft) -> None:
        server = self.servers.pop(event.address, None)
        if server is None:
            return
        self.note("left", f"{server.name} {event.cause().kind}")
        if self.pool is not None:
            if not event.expected:
                self.pool.lost(server.name)
        elif not event.expected and self.fleet.restart is not None and not self._done:
            self.clock.after(self.fleet.restart, self._restart, server.kind, server.name)

    def _restart(self, kind: ServerKind, name: str) -> None:
        if not self._done:
            self.add_server(kind, name, None)

    # -- the run ----------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate the run to its end; what it took."""
        began = time.perf_counter()
        options = self.options
        # What the executor learns from the DAG: the jobs that reach it (context
        # jobs; local rules and plain jobs run in Snakemake's process here).
        contexts = self.workload.contexts
        planned: dict[str, str | None] = {
            job.jobid: contexts[job.context].identity
            for job in self.workload.jobs
            if job.kind == "context" and job.context
        }
        self._feed(v.DagPlanned(planned, 0.0))
        if self.pool is not None:
            self.pool.start()
        elif self.fleet.schedule:
            for at, kind, name in self.fleet.schedule:
                self.clock.at(at, self.add_server, kind, name, None)
        else:
            for kind in self.fleet.kinds:
                for n in range(kind.count):
                    name = f"{kind.where}-{n}" if kind.gpu_model != CPU_MODEL else f"cpu{n}"
                    self.clock.at(self.fleet.join_at, self.add_server, kind, name, None)
        # A fixed fleet is up before Snakemake's first job (the executor starts or
        # attaches to its cluster first); a pool grows while jobs wait.
        fixed = self.pool is None and not self.fleet.schedule
        begin = max(options.start_seconds, self.fleet.join_at) if fixed else options.start_seconds
        self.clock.at(begin, self.release.start)
        self.clock.after(FLEET_CHECK_SECONDS, self._tick)
        if self.preemption.any:
            self.preempter.start()
        self.clock.run(lambda: self._finished(), limit=options.limit)
        ended = self._finished()
        self._done = True
        end = self.release.last_end + options.end_seconds
        books = self.pool.close(end) if self.pool else None
        for server in list(self.servers.values()):
            server.leave(end, expected=True, exit_code=0)
        counts = Counts(
            done=self.release.done,
            failed=self.release.failed,
            preemptions=self.preempter.count,
            placed=self.placed,
            dispatch_cpu=self.cpu,
            stimuli=self.stimuli,
            handed=self.handed,
            items_of=self.items_of,
            events=self.events,
            ended=ended,
        )
        wall = time.perf_counter() - began
        return summarise(self.every, counts, end, ledger(self.every, end, self.pool), books, wall)

    def _finished(self) -> bool:
        return self.release.finished and self.clock.now >= self.options.start_seconds
