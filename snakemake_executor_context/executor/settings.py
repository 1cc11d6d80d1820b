"""Every ``--context-*`` flag of the executor, with its help text.

Snakemake turns each field into a command-line flag (``scheduler_address`` becomes
``--context-scheduler-address``) and a profile key (``context-scheduler-address``).
"""

# No `from __future__ import annotations`: Snakemake reads the field types at run time
# to build the argument parser, and only understands typing.Optional.
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from snakemake_interface_executor_plugins.settings import (
    CommonSettings,
    ExecutorSettingsBase,
)

from ..defaults import DEFAULT_MEMORY_BUDGET

__all__ = ["ExecutorSettings", "common_settings"]


common_settings = CommonSettings(
    # Jobs run in server processes, not in Snakemake's own process.
    non_local_exec=True,
    # Servers read and write the workflow directory directly: they need a shared
    # filesystem (checked at start against --shared-fs-usage).
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    # Nothing to deploy: servers share the client's filesystem and environment.
    auto_deploy_default_storage_provider=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    init_seconds_before_status_checks=0,
)


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    """Settings of ``snakemake --executor context``."""

    scheduler_address: Optional[str] = field(
        default=None,
        metadata={
            "help": "Address of a running Dask scheduler to attach to "
            "(tcp://host:port), for example one started by `snakemake-context up`. "
            "Without it (and without --context-scheduler-file) the executor starts "
            "an embedded cluster for this run and stops it at the end.",
            "env_var": False,
            "required": False,
        },
    )
    scheduler_file: Optional[Path] = field(
        default=None,
        metadata={
            "help": "Scheduler file of a running cluster to attach to, as written "
            "by `snakemake-context up --scheduler-file` or `dask scheduler "
            "--scheduler-file`. An attached cluster keeps running after the run, "
            "so its contexts stay loaded for the next one.",
            "env_var": False,
            "required": False,
        },
    )
    servers: Optional[int] = field(
        default=None,
        metadata={
            "help": "Number of context servers the embedded cluster starts when "
            "the machine has no GPU (each runs --context-slots jobs at a time and "
            "stands in for gpu=1). Default: the number of CPU cores, at most 4. With GPUs "
            "the embedded cluster starts one server per GPU instead.",
            "env_var": False,
            "required": False,
        },
    )
    memory_budget: str = field(
        default=DEFAULT_MEMORY_BUDGET,
        metadata={
            "help": "Memory each server of the embedded cluster may fill with "
            "loaded contexts before it evicts the least recently used one: a "
            "fraction of the server's memory (GPU memory on a GPU server, its "
            "share of RAM otherwise), or a size such as '6GB'.",
            "env_var": False,
            "required": False,
        },
    )
    status_interval: float = field(
        default=1.0,
        metadata={
            "help": "Longest pause in seconds between two status checks. A job "
            "that finishes wakes the check at once, so this only bounds how "
            "often waiting jobs and lost servers are looked at.",
            "env_var": False,
            "required": False,
        },
    )
    wait_for_server: float = field(
        default=120.0,
        metadata={
            "help": "Seconds a job may wait for a server that can run it (enough "
            "GPUs, the requested gpu_model, enough memory) before it fails with "
            "a message naming the servers seen. Servers of an attached cluster "
            "may join meanwhile; the embedded cluster's fleet is fixed, so there "
            "such a job fails at once.",
            "env_var": False,
            "required": False,
        },
    )
    connect_timeout: float = field(
        default=20.0,
        metadata={
            "help": "Seconds to wait for an attached scheduler to answer, or for "
            "the embedded cluster to start, before the run fails.",
            "env_var": False,
            "required": False,
        },
    )
    catalog: Optional[str] = field(
        default=None,
        metadata={
            "help": "Where this run records its servers, contexts and jobs: a path "
            "(a SQLite file; on a network filesystem the live file stays on local "
            "disk and a snapshot is published there every few seconds), an "
            "SQLAlchemy URL (postgresql+psycopg://user@host/db), or 'none'. "
            "Default: .snakemake/context/catalog.db in the workflow directory. A "
            "cluster started by `snakemake-context up` records into its own catalog "
            "instead. A catalog problem is a warning, never a failed run.",
            "env_var": False,
            "required": False,
        },
    )
    placement: str = field(
        default="affinity",
        metadata={
            "help": "How jobs find a server. 'affinity': the executor queues jobs "
            "and sends each to a server warm for its context with a free slot (then "
            "one whose disk caches the weights, then the fastest, then any), and "
            "loads a context elsewhere only when waiting for a warm slot would take "
            "longer than the load. 'dask': submit at once and let Dask choose (the "
            "baseline, for comparisons).",
            "env_var": False,
            "required": False,
            "choices": ["affinity", "dask"],
        },
    )
    credentials: Optional[Path] = field(
        default=None,
        metadata={
            "help": "Directory of the TLS credentials (ca.pem, cert.pem, key.pem) of a "
            "cluster to attach to by --context-scheduler-address. Default: the "
            "directory X.tls beside the scheduler file X.json, where "
            "`snakemake-context up` writes them.",
            "env_var": False,
            "required": False,
        },
    )
    allow_plaintext: bool = field(
        default=False,
        metadata={
            "help": "Attach to a scheduler without TLS (tcp://), such as a `dask "
            "scheduler` started by hand. Anyone who can reach its ports can run code "
            "as its owner; the run says so once. Clusters this plugin starts always "
            "use TLS.",
            "env_var": False,
            "required": False,
        },
    )
    preemption_budget: Optional[int] = field(
        default=None,
        metadata={
            "help": "How many times a job may lose its server to a preemption (an "
            "outside SIGTERM, an injected kill, a lost node or heartbeat) and go back "
            "to the queue before it fails. Preemptions never consume --retries. "
            "Default: Snakemake's --preemptible-retries where set, else 10.",
            "env_var": False,
            "required": False,
        },
    )
    crash_budget: int = field(
        default=2,
        metadata={
            "help": "How many times a job may crash the server running it (the "
            "process exits by itself, dies of SIGSEGV/SIGABRT, or of a SIGKILL nobody "
            "announced, such as the OOM killer's) and go back to the queue; one more "
            "crash fails it, naming the servers, their exit codes and each "
            "attempt's log. --retries then applies on top.",
            "env_var": False,
            "required": False,
        },
    )
    agnostic: bool = field(
        default=False,
        metadata={
            "help": "Context-agnostic mode: each job loads its context and the server "
            "drops it at the job's end (no reuse), the baseline of the paper's "
            "experiments run on the same servers (for comparisons, such as the "
            "preemption benchmark).",
            "env_var": False,
            "required": False,
        },
    )
    backend: Optional[str] = field(
        default=None,
        metadata={
            "help": "Run the servers as pilot jobs of this batch system, submitted for "
            "this run and sized by its demand (slurm, htcondor, pbs, sge, lsf; through "
            "dask-jobqueue). The scheduler runs in Snakemake's machine; pilots must "
            "reach it (--context-interface) and share the workflow directory. Default: "
            "servers on this machine. A pool kept across runs: `snakemake-context up "
            "--backend ...`.",
            "env_var": False,
            "required": False,
            "choices": ["slurm", "htcondor", "pbs", "sge", "lsf"],
        },
    )
    pilot_queue: Optional[str] = field(
        default=None,
        metadata={"help": "Partition (SLURM) or queue of the pilots.", "env_var": False},
    )
    pilot_account: Optional[str] = field(
        default=None,
        metadata={"help": "Account (project) the pilots are charged to.", "env_var": False},
    )
    pilot_qos: Optional[str] = field(
        default=None,
        metadata={"help": "SLURM quality of service of the pilots.", "env_var": False},
    )
    pilot_walltime: str = field(
        default="01:00:00",
        metadata={
            "help": "Walltime of one pilot (HH:MM:SS or D-HH:MM:SS). A pilot retires "
            "--context-pilot-retire-margin seconds before it; its running jobs go back "
            "to the queue and the pool submits a replacement while work remains.",
            "env_var": False,
        },
    )
    pilot_retire_margin: float = field(
        default=300.0,
        metadata={
            "help": "Seconds before its walltime at which a pilot retires.",
            "env_var": False,
        },
    )
    pilot_gpus: int = field(
        default=1, metadata={"help": "GPUs per pilot (one server each pilot).", "env_var": False}
    )
    pilot_gpu_types: Optional[list[str]] = field(
        default=None,
        metadata={
            "help": "GPU types of the pilots (SLURM GRES type, LSF gmodel), one kind of "
            "pilot each: new pilots go to the kind the ready jobs' gpu_model needs. Also "
            "the model a pilot advertises where NVML sees no GPU.",
            "env_var": False,
            "nargs": "+",
            "type": str,
        },
    )
    pilot_cores: int = field(default=1, metadata={"help": "CPU cores per pilot.", "env_var": False})
    pilot_memory: str = field(
        default="16GB", metadata={"help": "Memory per pilot.", "env_var": False}
    )
    pilot_directives: Optional[list[str]] = field(
        default=None,
        metadata={
            "help": "Extra job-script directives, as the batch system spells them (e.g. "
            "--constraint=a100 for SLURM).",
            "env_var": False,
            "nargs": "+",
            "type": str,
        },
    )
    pilot_prologue: Optional[list[str]] = field(
        default=None,
        metadata={
            "help": "Shell lines a pilot runs before its server starts, e.g. 'source "
            "/shared/venv/bin/activate', or copying weights to node-local disk.",
            "env_var": False,
            "nargs": "+",
            "type": str,
        },
    )
    interface: Optional[str] = field(
        default=None,
        metadata={
            "help": "Network interface the scheduler listens on and pilots reach it "
            "through (compute nodes often reach only one interface of a login node, "
            "e.g. ib0). Default: 127.0.0.1 without pilots, the default route with them.",
            "env_var": False,
        },
    )
    min_pilots: int = field(
        default=0, metadata={"help": "Pilots the pool keeps even when idle.", "env_var": False}
    )
    max_pilots: int = field(default=4, metadata={"help": "Most pilots at once.", "env_var": False})
    pilot_idle_timeout: float = field(
        default=120.0,
        metadata={"help": "Seconds an idle pilot is kept before it is released.", "env_var": False},
    )
    plain_jobs: Optional[str] = field(
        default=None,
        metadata={
            "help": "Where plain jobs (no context, no GPU, not in a group) run. "
            "'local': in Snakemake's own process, as with --executor local (local "
            "rules: logs, benchmarks, retries and conda are local's; no per-job "
            "Snakemake start). 'servers': on the context servers, each as its own "
            "Snakemake job process. Default: 'local' with the embedded cluster (same "
            "machine), 'servers' when attached to a cluster.",
            "env_var": False,
            "required": False,
            "choices": ["local", "servers"],
        },
    )
    memory_cap: Optional[str] = field(
        default=None,
        metadata={
            "help": "Memory cap of each server of the embedded cluster, its child "
            "processes included ('8GB'; default: none). A watchdog samples it every "
            "0.5 s; above the cap it stops the running job, which fails naming the "
            "cap and the memory seen, and restarts the server if the job does not "
            "stop. Separate from --context-memory-budget (contexts) and from Dask's "
            "memory thresholds (off). For `snakemake-context up`, export "
            "SNAKEMAKE_CONTEXT_MEMORY_CAP before starting it.",
            "env_var": False,
            "required": False,
        },
    )
    recycle_after_leaks: int = field(
        default=3,
        metadata={
            "help": "Restart a server of the embedded cluster once this many of its "
            "jobs left threads running (0: never). Leaked threads and open files are "
            "reported either way. For `snakemake-context up`, export "
            "SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS before starting it.",
            "env_var": False,
            "required": False,
        },
    )
    pilot_model_cache: Optional[str] = field(
        default=None,
        metadata={
            "help": "Node-local directory where loaders keep model weights on a pilot "
            "(exported as SNAKEMAKE_CONTEXT_MODEL_CACHE and created; "
            "--context-pilot-prologue lines may stage weights into it, e.g. 'rsync -a "
            "/shared/models/ $SNAKEMAKE_CONTEXT_MODEL_CACHE/').",
            "env_var": False,
            "required": False,
        },
    )
    pilot_loads_per_source: int = field(
        default=2,
        metadata={
            "help": "At most this many pilots load one context from its shared source "
            "at once (a semaphore on the scheduler; 0: no limit). Loads from the "
            "node-local model cache take no turn.",
            "env_var": False,
            "required": False,
        },
    )
    slots: int = field(
        default=1,
        metadata={
            "help": "Jobs each server of the embedded cluster or of --context-backend "
            "runs at once, as threads sharing one loaded copy of the context (and its "
            "batched() calls). Only jobs of one workflow directory, script, threads, "
            "environment and search paths overlap; a shareable=False context gets a "
            "whole server; a context runs one job at a time until its per-job memory "
            "is declared or measured, then what fits. `up --slots N` likewise.",
            "env_var": False,
            "required": False,
        },
    )
    threads_per_slot: int = field(
        default=0,
        metadata={
            "help": "Threads of each in-process job's pools (torch, BLAS, OpenMP, "
            "OMP_NUM_THREADS...); 0: the rule's threads. The fleet's shape: servers per "
            "node (--context-servers) x slots per server x threads per slot.",
            "env_var": False,
            "required": False,
        },
    )
    batch_max: int = field(
        default=0,
        metadata={
            "help": "Most items a batched() call merges into one call of its function "
            "across the jobs of a server (0: each function's own max_batch).",
            "env_var": False,
            "required": False,
        },
    )
    batch_wait: float = field(
        default=0.0,
        metadata={
            "help": "Seconds a batched() call waits for other jobs' items (default 0: "
            "a lone call is not delayed; items arriving meanwhile form the next batch).",
            "env_var": False,
            "required": False,
        },
    )
