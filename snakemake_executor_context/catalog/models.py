"""The catalog's tables (SQLAlchemy 2 typed models).

Times are Unix seconds (floats) throughout: they compare across hosts and sort
in SQL without time-zone surprises. JSON values (wildcards, loader arguments, event
details) are stored as text.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    column,
    event,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.schema import Table

__all__ = [
    "RUN_INTERRUPTED",
    "SCHEMA_VERSION",
    "Attempt",
    "Base",
    "Context",
    "DamagedEntry",
    "EventRecord",
    "ForwardBatch",
    "Job",
    "JobOutput",
    "JobStory",
    "Meta",
    "Pilot",
    "Placement",
    "Run",
    "Server",
    "ServerLoss",
    "Transfer",
]

#: The schema's version: the number of its newest migration (:mod:`.migrations`),
#: bumped with every change to the tables below. Releases before the migrations
#: read it from ``catalog_meta`` and refuse any other; releases since upgrade an
#: older catalog in place when they write to it.
SCHEMA_VERSION = 8


class Base(DeclarativeBase):
    """Declarative base of the catalog's tables."""


class Meta(Base):
    """Key/value facts about the catalog itself (``schema_version``, ``created``)."""

    __tablename__ = "catalog_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Run(Base):
    """One Snakemake run under ``--executor context``."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128), unique=True)
    workdir: Mapped[str] = mapped_column(Text, default="")
    host: Mapped[str] = mapped_column(String(256), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    cluster: Mapped[str] = mapped_column(Text, default="")
    #: Jobs Snakemake planned to run.
    jobs_total: Mapped[int | None] = mapped_column(Integer)
    # Indexed for the latest runs (the monitor asks every poll); catalogs made before
    # the index lack it and are merely slower to read.
    started: Mapped[float] = mapped_column(Float, index=True)
    finished: Mapped[float | None] = mapped_column(Float)
    #: Last sign of life from the run (its writer's heartbeat).
    heartbeat: Mapped[float | None] = mapped_column(Float)
    ok: Mapped[bool | None] = mapped_column(Boolean)
    jobs_ok: Mapped[int] = mapped_column(Integer, default=0)
    jobs_failed: Mapped[int] = mapped_column(Integer, default=0)
    items: Mapped[int] = mapped_column(BigInteger, default=0)
    loads: Mapped[int] = mapped_column(Integer, default=0)


class Server(Base):
    """One incarnation of a context server (a Dask worker at one address)."""

    __tablename__ = "servers"
    __table_args__ = (
        # One live row per address: two writers racing to add a server make one.
        Index(
            "ux_servers_live_address",
            "address",
            unique=True,
            sqlite_where=column("left").is_(None),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    address: Mapped[str] = mapped_column(String(256), index=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    host: Mapped[str] = mapped_column(String(256), default="")
    pid: Mapped[int | None] = mapped_column(Integer)
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    gpu_uuid: Mapped[str | None] = mapped_column(String(128))
    #: The GPU's name as NVML reports it ("NVIDIA H200").
    gpu_name: Mapped[str | None] = mapped_column(String(256))
    #: Normalised ("h200"); "cpu" for a server without a GPU.
    gpu_model: Mapped[str] = mapped_column(String(256), default="cpu")
    gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    is_mig: Mapped[bool] = mapped_column(Boolean, default=False)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_budget: Mapped[int | None] = mapped_column(BigInteger)
    joined: Mapped[float] = mapped_column(Float)
    left: Mapped[float | None] = mapped_column(Float)
    left_reason: Mapped[str | None] = mapped_column(Text)
    #: GPUs it serves (its ``gpu`` resource; a CPU server's stand-in counts as one).
    gpus: Mapped[int | None] = mapped_column(Integer)
    #: When it began to drain (a preemption notice, a recycle, a black hole).
    draining_at: Mapped[float | None] = mapped_column(Float)
    #: A pilot's: when its batch job started (the batch system charges from then).
    allocated_at: Mapped[float | None] = mapped_column(Float)
    #: Where its survival is counted (:func:`..fleet.survival.survival_group`): a
    #: pilot's partition (batch queue) and pool (kind of pilot), its cluster's label.
    partition: Mapped[str | None] = mapped_column(String(256))
    pool: Mapped[str | None] = mapped_column(String(256))
    group_label: Mapped[str | None] = mapped_column(String(256))
    #: What ended it (:class:`..fleet.losses.LossKind`: a preemption or crash is a
    #: death, a close censors its life); None while it lives, or recorded before v8.
    ended_by: Mapped[str | None] = mapped_column(String(16))


@event.listens_for(Server.__table__, "before_create")
def _live_index_on_postgresql(table: Table, connection: Connection, **_: object) -> None:
    """PostgreSQL's copy of the one-live-row index's condition, given only where the
    table is created there: naming ``postgresql_where`` in the model imported that
    dialect (0.13 CPU-s) into every run's process, SQLite's too."""
    if connection.dialect.name == "postgresql":
        (index,) = (i for i in table.indexes if i.name == "ux_servers_live_address")
        index.dialect_kwargs["postgresql_where"] = column("left").is_(None)


class Context(Base):
    """A context by identity (the hash of loader, arguments and loader code)."""

    __tablename__ = "contexts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    loader: Mapped[str] = mapped_column(Text, default="")
    #: The loader's keyword arguments as JSON.
    arguments: Mapped[str] = mapped_column(Text, default="{}")
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    first_seen: Mapped[float] = mapped_column(Float)


class Placement(Base):
    """A context on a server, from its load to its eviction (or the server's loss)."""

    __tablename__ = "placements"
    __table_args__ = (Index("ix_placements_server_context", "server_id", "context_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"))
    server_id: Mapped[int] = mapped_column(ForeignKey("servers.id"))
    #: loading, ready, evicted, lost (or failed: the load raised).
    state: Mapped[str] = mapped_column(String(16), index=True)
    loading_at: Mapped[float] = mapped_column(Float)
    ready_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    load_seconds: Mapped[float | None] = mapped_column(Float)
    #: Whether the loader's cache probe found the weights on local disk.
    from_cache: Mapped[bool | None] = mapped_column(Boolean)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: Conversions the load did (weights converted into a local cache), and the
    #: seconds it took after the last one (a load from that cache): its kinds
    #: (:func:`~..fleet.loads.load_parts`).
    conversions: Mapped[int | None] = mapped_column(Integer)
    reload_seconds: Mapped[float | None] = mapped_column(Float)
    #: Seconds of the load spent fetching the context's template from peers (None: it
    #: fetched nothing), before it read the local cache the transfer filled.
    peer_seconds: Mapped[float | None] = mapped_column(Float)
    #: A gang (a context spanning several processes): its ranks, and its members as
    #: JSON (backend; per rank: device, node, pid, shard bytes). None: one process.
    ranks: Mapped[int | None] = mapped_column(Integer)
    gang: Mapped[str | None] = mapped_column(Text)


class Transfer(Base):
    """One try of a server to fetch a context's template (its files) from a peer that
    holds it (peer-to-peer transfer): one row per holder tried."""

    __tablename__ = "transfers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), index=True)
    #: The receiver.
    server_id: Mapped[int] = mapped_column(ForeignKey("servers.id"))
    #: The holder's address ("" when none could serve it), and its server row when the
    #: catalog knows a live server at that address.
    peer: Mapped[str] = mapped_column(String(256), default="")
    peer_server_id: Mapped[int | None] = mapped_column(ForeignKey("servers.id"))
    #: When the try ended.
    at: Mapped[float] = mapped_column(Float)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    #: "ok", or one line: why this holder's transfer ended early.
    outcome: Mapped[str] = mapped_column(String(512), default="ok")


class DamagedEntry(Base):
    """A model-cache entry a server found damaged (its files differ from the manifest
    recorded when they were written) and moved aside before any load read it."""

    __tablename__ = "damaged_entries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    server_id: Mapped[int] = mapped_column(ForeignKey("servers.id"), index=True)
    #: The context whose load found it (None: a peer's report, on a holder).
    context_id: Mapped[int | None] = mapped_column(ForeignKey("contexts.id"))
    at: Mapped[float] = mapped_column(Float)
    entry: Mapped[str] = mapped_column(Text, default="")
    #: Where it went ("" when another process of the node had moved it).
    aside: Mapped[str] = mapped_column(Text, default="")
    problem: Mapped[str] = mapped_column(Text, default="")


class Job(Base):
    """One Snakemake job of a run (its attempts are in :class:`Attempt`)."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("run_pk", "jobid"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    #: Snakemake's job id (a number, or a UUID for a group job).
    jobid: Mapped[str] = mapped_column(String(64))
    rule: Mapped[str] = mapped_column(String(256), default="")
    #: JSON object.
    wildcards: Mapped[str] = mapped_column(Text, default="{}")
    #: context or plain.
    kind: Mapped[str] = mapped_column(String(16), default="context")
    context_id: Mapped[int | None] = mapped_column(ForeignKey("contexts.id"))
    submitted: Mapped[float | None] = mapped_column(Float)
    finished: Mapped[float | None] = mapped_column(Float)
    #: The outcome reported to Snakemake: ok, failed, cancelled, unrunnable, invalid.
    outcome: Mapped[str | None] = mapped_column(String(16))
    items: Mapped[int] = mapped_column(BigInteger, default=0)
    #: The stimulus of the executor's dispatch machine that reported it, and the
    #: report's message (a failure's; its first 4,000 characters).
    stimulus: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str | None] = mapped_column(Text)


class Attempt(Base):
    """One execution of a job's task on one server."""

    __tablename__ = "attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    #: The Dask task key (a new one per Snakemake retry and per requeue).
    key: Mapped[str] = mapped_column(String(256), index=True)
    #: Snakemake's attempt number.
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    server_id: Mapped[int | None] = mapped_column(ForeignKey("servers.id"), index=True)
    #: How placement chose the server (warm, cached, fastest, any, load, plain).
    placed_by: Mapped[str | None] = mapped_column(String(64))
    dispatched: Mapped[float | None] = mapped_column(Float)
    started: Mapped[float | None] = mapped_column(Float)
    finished: Mapped[float | None] = mapped_column(Float, index=True)
    #: ok, failed, cancelled, lost (its server left mid-job).
    outcome: Mapped[str | None] = mapped_column(String(16))
    items: Mapped[int] = mapped_column(BigInteger, default=0)
    load_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    #: Whether this attempt loaded its context (cold) rather than found it warm.
    cold: Mapped[bool] = mapped_column(Boolean, default=False)
    # Indexed for the losses' job lists; catalogs made before the index lack it and are
    # merely slower to read (an index is not part of the schema version).
    loss_id: Mapped[int | None] = mapped_column(ForeignKey("server_losses.id"), index=True)
    #: Its log, relative to the workflow directory, and the dispatch machine's
    #: stimulus that placed it.
    log: Mapped[str | None] = mapped_column(Text)
    stimulus: Mapped[str | None] = mapped_column(String(128))


class JobOutput(Base):
    """One output file of a job (a group job's: each of its jobs'), as Snakemake names
    it: relative to its run's ``workdir`` unless absolute (``snakemake-context story
    PATH`` finds the job by one)."""

    __tablename__ = "job_outputs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    path: Mapped[str] = mapped_column(Text, index=True)


class JobStory(Base):
    """A decision of an executor about a job that its attempts and its report do not
    record: a loss and the budget charged, a requeue, a cancellation (the story of a
    job, ``snakemake-context story``)."""

    __tablename__ = "job_story"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    #: The attempt it is about (None: the job, between attempts).
    attempt_key: Mapped[str | None] = mapped_column(String(256))
    at: Mapped[float] = mapped_column(Float)
    what: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text, default="")
    stimulus: Mapped[str] = mapped_column(String(128), default="")


class ServerLoss(Base):
    """A server that left while running jobs (preempted, killed, crashed)."""

    __tablename__ = "server_losses"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    server_id: Mapped[int] = mapped_column(ForeignKey("servers.id"))
    at: Mapped[float] = mapped_column(Float, index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    jobs_lost: Mapped[int] = mapped_column(Integer, default=0)
    #: Seconds of work the lost jobs had done there.
    seconds_lost: Mapped[float] = mapped_column(Float, default=0.0)


class ForwardBatch(Base):
    """Calls of batched functions (forward batches) of one size that an attempt led
    (the forward-batch histogram)."""

    __tablename__ = "forward_batches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    size: Mapped[int] = mapped_column(Integer)
    calls: Mapped[int] = mapped_column(Integer)


class Pilot(Base):
    """A pilot of a pool on a batch system, as the pool's books hold it
    (:class:`~..fleet.pilotbook.PilotRecord`); its server is the one of its name that
    joined after it was submitted."""

    __tablename__ = "pilots"
    __table_args__ = (UniqueConstraint("name", "submitted"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256), index=True)
    kind: Mapped[str] = mapped_column(String(256), default="")
    job_id: Mapped[str] = mapped_column(String(128), default="")
    submitted: Mapped[float] = mapped_column(Float)
    registered: Mapped[float | None] = mapped_column(Float)
    first_task: Mapped[float | None] = mapped_column(Float)
    ended: Mapped[float | None] = mapped_column(Float)
    batch_state: Mapped[str | None] = mapped_column(String(64))
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    released: Mapped[bool] = mapped_column(Boolean, default=False)


#: The note of a run that ended interrupted (cancelled, or told to stop), in place of
#: "run-finished": the run's state reads it (:func:`.reading.history.runs`).
RUN_INTERRUPTED = "run-interrupted"


class EventRecord(Base):
    """Fleet-level events worth a line in a log: servers joining and leaving,
    loads, evictions, losses, failed jobs, runs starting and ending."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    run_pk: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    server_id: Mapped[int | None] = mapped_column(ForeignKey("servers.id"))
    #: A one-line human description.
    text: Mapped[str] = mapped_column(Text, default="")
