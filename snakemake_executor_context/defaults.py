"""Where the plugin keeps its files, and what its settings default to: each fact once.

Standard library only: the discovery shim's settings, the CLI, the cluster process
and the servers all read it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "BATCH_STARTED_VARIABLE",
    "CATALOG_OFF",
    "CONTEXT_DIR",
    "DEFAULT_CATALOG",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_SCHEDULER_FILE",
    "DEMAND_KEY",
    "DEMAND_STALE_SECONDS",
    "DEVICES_VARIABLE",
    "DRAIN_GRACE_SECONDS",
    "GANG_ROSTER_HANDLER",
    "GANG_TIMEOUT_SECONDS",
    "HUB_PLUGIN_NAME",
    "JOB_MARK_VARIABLE",
    "KEEP_VARIABLE",
    "LEASE_GRACE_SECONDS",
    "LEFTOVER_GRACE_SECONDS",
    "LOCAL_DIR_METADATA",
    "LOCAL_DIR_VARIABLE",
    "MEMORY_CAP_VARIABLE",
    "MODEL_CACHE_SIZE_VARIABLE",
    "MODEL_CACHE_VARIABLE",
    "NODE_VARIABLE",
    "NO_TLS_VARIABLE",
    "PEER_RATES_HANDLER",
    "PEER_WAIT_SECONDS",
    "PILOT_VARIABLE",
    "POOL_FAILURE_KEY",
    "RECYCLE_VARIABLE",
    "SERVER_LEASE_SECONDS",
    "SERVER_MARK_VARIABLE",
    "SOURCE_MBPS_VARIABLE",
    "TIME_SCALE_VARIABLE",
    "catalog_disabled",
]

#: Where the executor keeps its files in the workflow directory (logs, runs, cluster).
CONTEXT_DIR = Path(".snakemake") / "context"
#: A run's catalog, relative to the workflow directory, unless told otherwise.
DEFAULT_CATALOG = CONTEXT_DIR / "catalog.db"
#: What a server may fill with contexts: a fraction of its memory, or a size ("6GB").
DEFAULT_MEMORY_BUDGET = "0.8"
#: The scheduler file of `snakemake-context up` (its log, pid file and catalog beside it).
DEFAULT_SCHEDULER_FILE = Path(
    os.environ.get("SNAKEMAKE_CONTEXT_SCHEDULER_FILE", "~/.snakemake-context/scheduler.json")
).expanduser()
#: Seconds a server may be without its scheduler before it stops its jobs (0: never).
SERVER_LEASE_SECONDS = 30.0
#: Seconds beyond a server's lease before the jobs lost with it run elsewhere.
LEASE_GRACE_SECONDS = 5.0
#: Seconds between a server's SIGTERM and its exit: SLURM's default KillWait.
DRAIN_GRACE_SECONDS = 30.0
#: Seconds a gang's collectives may take before they fail (a rank that died or hangs
#: never leaves the others blocked longer than this): gloo's and NCCL's own timeout.
GANG_TIMEOUT_SECONDS = 300.0
#: The scheduler's handler at which pilots started as a gang of nodes wait for the
#: rest of their gang (:mod:`.cluster.roster`).
GANG_ROSTER_HANDLER = "snakemake_context_gang_join"
#: The name of the fleet's hub among the scheduler's plugins (:mod:`.cluster.hub`), by
#: which a pool of pilots in the same process finds it.
HUB_PLUGIN_NAME = "snakemake-context-hub"
#: The scheduler's handler that tells a server the measured rates of a context's loads
#: and transfers (:mod:`.cluster.hub`), for its choice between a peer and the source.
PEER_RATES_HANDLER = "snakemake_context_rates"
#: Where a run publishes, in the scheduler's metadata, what it asks of a pool of pilots.
DEMAND_KEY = ["snakemake-context", "demand"]
#: Seconds after which a pool reads a run's demand whose sequence number stopped growing
#: as withdrawn (a run publishes every 2 s while its status loop runs; a Snakemake
#: killed before its shutdown never withdraws it).
DEMAND_STALE_SECONDS = 60.0
#: Where a pool of pilots publishes, in the scheduler's metadata, its last failed
#: submission (``{"line": ..., "at": ...}``): a run it serves ends on it.
POOL_FAILURE_KEY = ["snakemake-context", "pool-failure"]

# Environment variables: each name once, wherever it is set or read.
#: The servers' memory cap ("8GB"; unset, "0" or "none": no cap); the executor's
#: --context-server-memory sets it for its embedded cluster; export it for `up`.
MEMORY_CAP_VARIABLE = "SNAKEMAKE_CONTEXT_MEMORY_CAP"
#: Restart a server after this many jobs left threads running (default 3; 0: never).
RECYCLE_VARIABLE = "SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS"
#: Test-only: a factor on every runtime limit (0.01 makes a minute 0.6 s).
TIME_SCALE_VARIABLE = "SNAKEMAKE_CONTEXT_TIME_SCALE"
#: A pilot's server settings (JSON), exported by its job script.
PILOT_VARIABLE = "SNAKEMAKE_CONTEXT_PILOT"
#: When a pilot's batch job started (Unix seconds), exported first by its job script.
BATCH_STARTED_VARIABLE = "SNAKEMAKE_CONTEXT_BATCH_STARTED"
#: A benchmark's only: set to its own pid for a snakemake it starts, that run's embedded
#: cluster runs without TLS; any other value (an inherited "1") is refused at start.
NO_TLS_VARIABLE = "SNAKEMAKE_CONTEXT_BENCH_NO_TLS"
#: Moves the private root, the directory in which the plugin keeps its node-local
#: files (see :mod:`.paths`); the executor's --context-local-dir sets it.
LOCAL_DIR_VARIABLE = "SNAKEMAKE_CONTEXT_LOCAL_DIR"
#: The devices a server owns ("cuda:0,cuda:1", or "cpu,cpu" for CPU stand-ins), set
#: in its process when it starts; a loader reads it with ``server_devices()``.
DEVICES_VARIABLE = "SNAKEMAKE_CONTEXT_DEVICES"
#: The node a server says it is on (default: its host name). Pilots of one machine
#: that stand for different nodes (tests, benchmarks) set it in their prologue.
NODE_VARIABLE = "SNAKEMAKE_CONTEXT_NODE"
#: Marks in the environment of what a server starts (see :mod:`.strays.processes`): the
#: plain job a process belongs to, and the server below which it started.
JOB_MARK_VARIABLE = "SNAKEMAKE_CONTEXT_JOB"
SERVER_MARK_VARIABLE = "SNAKEMAKE_CONTEXT_SERVER"
#: "1" in a process's environment: a job leaves it running on purpose (a service);
#: it is named in the job's log and lives until its server ends.
KEEP_VARIABLE = "SNAKEMAKE_CONTEXT_KEEP"
#: Seconds between the SIGTERM and the SIGKILL of what a job left running.
LEFTOVER_GRACE_SECONDS = 2.0
#: Where loaders keep converted weights (see :mod:`.modelcache`); a pilot's job
#: script exports it (--pilot-model-cache).
MODEL_CACHE_VARIABLE = "SNAKEMAKE_CONTEXT_MODEL_CACHE"
#: Bytes this user's entries of that cache may take (unset: no limit); a server sets
#: it from its --context-model-cache-size (see :func:`.modelcache.make_room`).
MODEL_CACHE_SIZE_VARIABLE = "SNAKEMAKE_CONTEXT_MODEL_CACHE_SIZE"
#: Megabytes a second this user's processes of a node may read from one staged source
#: together (see :mod:`.modelcache.staging`); unset or 0: no cap. Servers inherit it from the
#: process that starts them (Snakemake, ``snakemake-context up``, a pilot's job script).
SOURCE_MBPS_VARIABLE = "SNAKEMAKE_CONTEXT_SOURCE_MBPS"
#: The help of the executor's ``--context-local-dir``, which sets LOCAL_DIR_VARIABLE.
LOCAL_DIR_METADATA = {
    "help": "An existing directory in which the plugin makes this user's private directory for its "
    "node-local files (snakemake-context-<uid>, mode 0700: Dask's scratch space, the "
    "servers' process-group records, live copies of network catalogs, the digests of "
    f"model caches). Exported as {LOCAL_DIR_VARIABLE} (which `snakemake-context up` "
    f"reads). Default: ${LOCAL_DIR_VARIABLE}, else $XDG_RUNTIME_DIR, else $TMPDIR. A run "
    "refuses a private directory that is a symlink, another user's or open to others: "
    "set this to move it.",
    "env_var": False,
    "required": False,
}

#: The words that turn the catalog off (``--context-catalog none``).
CATALOG_OFF = ("none", "off", "no", "false")


def catalog_disabled(spec: str | None) -> bool:
    """Whether a catalog setting turns recording off."""
    return spec is not None and spec.strip().lower() in CATALOG_OFF


#: Seconds a server waits for a busy peer to send it a context's template before it
#: reads the context's source instead (holders serve a few transfers at once; every
#: receiver that finishes becomes a holder, so the wait is a few transfers long).
PEER_WAIT_SECONDS = 120.0
