"""Build a catalog for tests and demos through the catalog's own recording code.

Test support, not shipped (``from tests.catalog_builder import CatalogBuilder``).
Every call makes the events servers, the scheduler plugin and executors send, and
:meth:`CatalogBuilder.commit` records them with the writer's :class:`~.record.Recorder`
(no SQL here); times come from a clock the builder advances, so catalogs are
reproducible (an example: docs/catalog.md, "Building a catalog in tests"). For big catalogs,
:meth:`CatalogBuilder.jobs` writes many finished jobs at once: the same rows, in bulk.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import insert, update

from snakemake_executor_context.catalog.models import Attempt, Job, Meta, Run
from snakemake_executor_context.catalog.store import CatalogStore, open_store
from snakemake_executor_context.catalog.writing.record import Recorder
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.gpus import normalize_gpu_model

__all__ = ["CatalogBuilder"]

#: The builder's clock starts here (2023-11-14), unless told otherwise.
EPOCH = 1_700_000_000.0


class CatalogBuilder:
    """Makes servers, contexts, runs, jobs and losses in a catalog (see the module)."""

    def __init__(self, spec: str | os.PathLike[str], *, start: float = EPOCH) -> None:
        self.store: CatalogStore = open_store(spec)
        self.recorder = Recorder()
        self.now = start
        self.pending: list[ev.Event] = []
        self._counter = itertools.count(1)
        self._servers: dict[str, dict[str, Any]] = {}
        self._contexts: dict[str, str] = {}
        self._running: dict[str, tuple[str, str, str | None, float]] = {}
        self._context_args: dict[str, tuple[str, dict[str, Any]]] = {}
        self._jobids: dict[str, tuple[int, str]] = {}

    # -- plumbing ------------------------------------------------------------------

    def __enter__(self) -> CatalogBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tick(self, seconds: float = 1.0) -> float:
        """Advance the clock; returns the new time."""
        self.now += seconds
        return self.now

    def emit(self, event: ev.Event) -> ev.Event:
        """Queue any event (stamped with the clock if it has no time of its own)."""
        self.pending.append(event)
        return event

    def commit(self) -> None:
        """Record the queued events in one transaction."""
        if not self.pending:
            return
        with self.store.session() as session, session.begin():
            self.recorder.apply(session, self.pending)
        self.pending = []

    def mark_schema_version(self, version: int) -> None:
        """Record another schema version in this catalog (for tests of readers that
        must refuse it with a clear message)."""
        self.commit()
        with self.store.session() as session, session.begin():
            meta = session.get(Meta, "schema_version")
            assert meta is not None
            meta.value = str(version)

    def close(self) -> None:
        """Commit and release the database."""
        try:
            self.commit()
        finally:
            self.store.close()

    # -- the fleet -----------------------------------------------------------------

    def server(
        self,
        name: str,
        *,
        gpu: str | None = "NVIDIA H200",
        gpu_memory_bytes: int = 141_000_000_000,
        compute_capability: str | None = "9.0",
        mig: bool = False,
        slots: int = 1,
        host: str = "node1",
        memory_bytes: int = 64_000_000_000,
        memory_budget: int | None = None,
        allocated_at: float | None = None,
        gpus: int = 1,
        group: str = "",
        partition: str = "",
        pool: str = "",
    ) -> str:
        """A server joins (with a GPU named as NVML names it, or ``gpu=None`` for a
        CPU server; ``allocated_at``: a pilot's batch job started then; ``group``,
        ``partition``, ``pool``: where its survival is counted). Returns its address."""
        index = next(self._counter)
        address = f"tcp://10.0.0.{index}:{40000 + index}"
        resources: dict[str, float] = {"gpu": gpus, "mem_mb": memory_bytes // 1_000_000}
        record = None
        if gpu is not None:
            model = normalize_gpu_model(gpu)
            resources[f"gpu_model:{model}"] = 1
            record = {
                "index": index - 1,
                "uuid": ("MIG-" if mig else "GPU-") + hashlib.sha1(name.encode()).hexdigest()[:12],
                "name": gpu,
                "memory_bytes": gpu_memory_bytes,
                "compute_capability": compute_capability,
                "is_mig": mig,
                "manufacturer": "nvidia",
            }
        budget = memory_budget or int(0.8 * (gpu_memory_bytes if gpu else memory_bytes))
        self.emit(
            ev.ServerJoined(
                at=self.now,
                address=address,
                name=name,
                host=host,
                slots=slots,
                memory_bytes=memory_bytes,
                resources=resources,
            )
        )
        self.emit(
            ev.ServerDescribed(
                at=self.now,
                address=address,
                name=name,
                host=host,
                pid=1000 + index,
                memory_bytes=memory_bytes,
                memory_budget=budget,
                gpu=record,
                allocated_at=allocated_at,
                group=group,
                partition=partition,
                pool=pool,
            )
        )
        self._servers[address] = {"name": name, "model": model if gpu else "cpu"}
        return address

    def leave(self, server: str, *, reason: str = "closed") -> None:
        """A server leaves cleanly (nothing was running on it)."""
        self.emit(ev.ServerLeft(at=self.now, address=server, reason=reason, expected=True))

    def drain(self, server: str, *, why: str = "SIGTERM", grace: float = 30.0) -> None:
        """A server starts to drain (a preemption notice)."""
        self.emit(ev.ServerDraining(at=self.now, address=server, why=why, grace=grace))

    def pilot(self, name: str, **record: Any) -> None:
        """A pool's record of a pilot (``submitted``, ``registered``, ``ended``,
        ``released``...: :class:`~snakemake_executor_context.fleet.events.PilotBooked`)."""
        self.emit(ev.PilotBooked(at=self.now, name=name, **record))

    def lose_server(self, server: str, *, reason: str = "lost (killed)") -> list[str]:
        """A server is lost; the jobs running on it (:meth:`start_job`) are lost with
        it. Returns their keys."""
        lost = [key for key, (_, address, _, _) in self._running.items() if address == server]
        self.emit(
            ev.ServerLeft(
                at=self.now,
                address=server,
                reason=reason,
                expected=False,
                lost=[
                    ev.LostJob(
                        key=key, run_id=self._running[key][0], started=self._running[key][3]
                    ).to_wire()
                    for key in lost
                ],
            )
        )
        for key in lost:
            del self._running[key]
        return lost

    def context(
        self,
        name: str,
        *,
        loader: str = "loaders.py:load",
        arguments: Mapping[str, Any] | None = None,
        identity: str | None = None,
    ) -> str:
        """A context (recorded when first loaded or used; ``identity``: a declaration's,
        else one made of the name). Returns its identity."""
        identity = (
            identity
            or hashlib.sha256(
                f"{name}:{loader}:{sorted((arguments or {}).items())}".encode()
            ).hexdigest()
        )
        self._contexts[identity] = name
        self._context_args[identity] = (loader, dict(arguments or {}))
        return identity

    def load(
        self,
        server: str,
        context: str,
        *,
        seconds: float = 5.0,
        nbytes: int = 500_000_000,
        from_cache: bool | None = None,
        conversions: int = 0,
        reload_seconds: float | None = None,
        peer_seconds: float | None = None,
    ) -> None:
        """A server loads a context (the clock advances by the load time; a load that
        converted took ``reload_seconds`` after its last conversion; one that fetched
        from peers spent ``peer_seconds`` doing so)."""
        loader, arguments = self._context_args[context]
        self.emit(
            ev.ContextLoading(
                at=self.now,
                address=server,
                identity=context,
                name=self._contexts[context],
                loader=loader,
                arguments=arguments,
                from_cache=from_cache,
            )
        )
        self.tick(seconds)
        self.emit(
            ev.ContextReady(
                at=self.now,
                address=server,
                identity=context,
                load_seconds=seconds,
                bytes=nbytes,
                gpu_model=self._servers[server]["model"],
                conversions=conversions,
                reload_seconds=reload_seconds,
                peer_seconds=peer_seconds,
            )
        )

    def transfer(
        self,
        server: str,
        context: str,
        peer: str,
        *,
        seconds: float = 2.0,
        nbytes: int = 500_000_000,
        outcome: str = "ok",
    ) -> None:
        """A server fetched (or tried to) a context's template from the peer at address
        ``peer`` ("": none could serve it); the clock advances by its seconds."""
        self.tick(seconds)
        self.emit(
            ev.ContextTransferred(
                at=self.now,
                address=server,
                identity=context,
                peer=peer,
                bytes=nbytes,
                seconds=seconds,
                outcome=outcome,
            )
        )

    def evict(self, server: str, context: str) -> None:
        """A server evicts a context."""
        self.emit(ev.ContextEvicted(at=self.now, address=server, identity=context))

    # -- runs and jobs -------------------------------------------------------------

    def run(
        self, run_id: str | None = None, *, workdir: str = "/work/wf", jobs_total: int | None = None
    ) -> str:
        """A run starts. Returns its id."""
        run_id = run_id or f"run-{next(self._counter)}"
        self.emit(
            ev.RunStarted(
                at=self.now,
                run_id=run_id,
                workdir=workdir,
                host="login1",
                pid=4242,
                cluster="builder",
                jobs_total=jobs_total,
            )
        )
        return run_id

    def finish_run(self, run_id: str, *, ok: bool = True) -> None:
        """A run ends."""
        self.emit(ev.RunFinished(at=self.now, run_id=run_id, ok=ok))

    def start_job(
        self,
        run_id: str,
        rule: str,
        *,
        server: str,
        context: str | None = None,
        wildcards: Mapping[str, str] | None = None,
        placed_by: str = "warm",
        outputs: Sequence[str] = (),
    ) -> str:
        """A job is dispatched to a server and starts there (``outputs``: its output
        files, as Snakemake names them). Returns its key."""
        jobid = next(self._counter)
        key = f"{rule}-{jobid}-a1-{jobid:08x}"
        self.emit(
            ev.JobDispatched(
                at=self.now,
                run_id=run_id,
                key=key,
                jobid=str(jobid),
                rule=rule,
                wildcards=dict(wildcards or {"i": str(jobid)}),
                job_kind="context" if context else "plain",
                context=context,
                context_name=self._contexts.get(context or ""),
                target=server,
                submitted=self.now,
                reason=placed_by,
                outputs=list(outputs),
            )
        )
        self.emit(
            ev.JobStarted(at=self.now, run_id=run_id, key=key, address=server, context=context)
        )
        self._running[key] = (run_id, server, context, self.now)
        self._jobids[key] = (jobid, rule)
        return key

    def finish_job(
        self,
        key: str,
        *,
        seconds: float = 1.0,
        items: int = 0,
        ok: bool = True,
        load_seconds: float = 0.0,
        batches: Mapping[int, int] | None = None,
    ) -> None:
        """A started job finishes after ``seconds`` and is reported (``batches``: the
        forward batches it led, size -> calls)."""
        run_id, server, context, started = self._running.pop(key)
        jobid, rule = self._jobids[key]
        self.tick(seconds)
        self.emit(
            ev.JobFinished(
                at=self.now,
                run_id=run_id,
                key=key,
                address=server,
                ok=ok,
                started=started,
                finished=self.now,
                items=items,
                load_seconds=load_seconds,
                loaded=[context] if load_seconds and context else [],
                context=context,
                gpu_model=self._servers[server]["model"],
                batches={str(size): calls for size, calls in (batches or {}).items()},
            )
        )
        self.emit(
            ev.JobReported(
                at=self.now,
                run_id=run_id,
                key=key,
                jobid=str(jobid),
                rule=rule,
                outcome="ok" if ok else "failed",
                message=None if ok else f"{rule} failed",
            )
        )

    def job(
        self,
        run_id: str,
        rule: str,
        *,
        server: str,
        context: str | None = None,
        seconds: float = 1.0,
        items: int = 0,
        ok: bool = True,
        wildcards: Mapping[str, str] | None = None,
        outputs: Sequence[str] = (),
    ) -> str:
        """A whole job: dispatched, started, finished and reported. Returns its key."""
        key = self.start_job(
            run_id, rule, server=server, context=context, wildcards=wildcards, outputs=outputs
        )
        self.finish_job(key, seconds=seconds, items=items, ok=ok)
        return key

    def jobs(
        self,
        run_id: str,
        rule: str,
        places: Sequence[tuple[str, str | None]],
        *,
        gap: float = 0.0,
        seconds: float = 1.0,
        items: int = 0,
    ) -> list[str]:
        """Many whole, successful jobs in bulk (the rows :meth:`job` would record; 100,000
        in seconds): ``places`` holds each one's (server address, context identity); the
        clock advances by ``gap`` before each and ``seconds`` while it runs. Their keys."""
        self.commit()
        with self.store.session() as session, session.begin():
            # Ids by the recorder's own lookups (a context is recorded when first used).
            run_pk = self.recorder._run(session, run_id, self.now)
            contexts: dict[str | None, int | None] = {None: None}
            jobs, attempts = [], []
            for server, context in places:
                self.now += gap
                jobid = next(self._counter)
                key = f"{rule}-{jobid}-a1-{jobid:08x}"
                if context is not None and context not in contexts:
                    name = self._contexts[context]
                    contexts[context] = self.recorder._context(session, context, self.now, name)
                started, self.now = self.now, self.now + seconds
                wildcards = json.dumps({"i": str(jobid)}, sort_keys=True)
                kind = "context" if context else "plain"
                job = (run_pk, str(jobid), rule, wildcards, kind, contexts[context], started)
                jobs.append(_row(_JOB_COLUMNS, *job, self.now, "ok", items))
                server_id = self.recorder._server(session, server, started)
                attempt = (key, 1, server_id, "warm", started, started, self.now)
                attempts.append(_row(_ATTEMPT_COLUMNS, *attempt, "ok", items, 0.0, False))
            if jobs:
                ids = insert(Job).returning(Job.id, sort_by_parameter_order=True)
                for attempt_row, job_id in zip(attempts, session.scalars(ids, jobs), strict=True):
                    attempt_row["job_id"] = job_id
                session.execute(insert(Attempt), attempts)
                run = update(Run).where(Run.id == run_pk).values(heartbeat=self.now)
                n = len(jobs)
                session.execute(run.values(jobs_ok=Run.jobs_ok + n, items=Run.items + items * n))
        return [row["key"] for row in attempts]


#: The columns :meth:`CatalogBuilder.jobs` fills, in the order it gives them.
_JOB_COLUMNS = "run_pk jobid rule wildcards kind context_id submitted finished outcome items"
_ATTEMPT_COLUMNS = "key attempt server_id placed_by dispatched started finished outcome items"
_ATTEMPT_COLUMNS += " load_seconds cold"


def _row(columns: str, *values: Any) -> dict[str, Any]:
    return dict(zip(columns.split(), values, strict=True))
