"""The executor's one settings class: every ``--context-*`` flag, with its help text,
the pilot request behind ``--context-pilots`` (:class:`PilotRequest`) and the tuning
keys behind ``--context-tuning`` (:class:`Tuning`).

Snakemake turns each field of :class:`ExecutorSettings` into a command-line flag
(``scheduler_address`` becomes ``--context-scheduler-address``) and a profile key
(``context-scheduler-address``). A pool of pilots is asked for in one flag,
``--context-pilots backend=slurm queue=gpu ...``; the research switches and tuning a
user rarely sets in another, ``--context-tuning KEY=VALUE ...``. Both are checked by
the same table as the flags, and the code reads their keys as settings
(``settings.pilot_queue``, ``settings.placement``). The servers' options
(``--context-slots``...) and the pilots' are the option table's
(:mod:`..settings.table`): their fields take its default, help and checks; the others
are the executor's own, declared here.
"""

# No `from __future__ import annotations`: Snakemake reads the field types at run time
# to build the argument parser, and only understands typing.Optional.
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from snakemake_interface_executor_plugins.settings import (
    CommonSettings,
    ExecutorSettingsBase,
)

from ..catalog import catalog_form
from ..defaults import LOCAL_DIR_METADATA, MEMORY_CAP_VARIABLE, RECYCLE_VARIABLE
from ..errors import SettingError
from ..settings.checks import (
    FLAG,
    NUMBER,
    SIZE,
    TEXT,
    WHOLE,
    WORDS,
    Allowed,
    Malformed,
    check,
    dataclass_settings,
    words_of,
)
from ..settings.checks import settings_field as _checked
from ..settings.shape import Shape
from ..settings.table import (
    EXECUTOR_PREFIX,
    PILOT_KEYS,
    PILOTS_FLAG,
    TUNING,
    TUNING_FLAG,
    check_environment,
    executor_flag,
    existing_dir,
    table_field,
)
from ..snakemake_internals import building_for_the_command_line
from .stopping import take_signals_before_the_run

__all__ = [
    "ATTACH_SETTINGS",
    "ExecutorSettings",
    "PilotRequest",
    "Tuning",
    "common_settings",
    "pilot_request",
    "settings_table",
    "tuning_values",
]

#: The settings that attach the run to a running cluster: pilots (and the embedded
#: cluster's own settings) are for a cluster the run starts, not with one of these.
ATTACH_SETTINGS = ("scheduler_address", "scheduler_file")


def _address(flag: str, value: str) -> str | None:
    from ..cluster.attach import parse_address

    parse_address(value, flag)  # raises its own one line
    return None


def _keyed_flag(help_text: str) -> Any:
    """A flag whose words are ``KEY=VALUE`` settings, each checked as a flag of its own
    would be (:func:`_keyed_values`)."""
    metadata = {
        "help": f"{help_text} Each is checked as its own flag was. The docs' settings page "
        "lists every key.",
        "nargs": "+",
        "type": str,
        "metavar": "KEY=VALUE",
    }
    return _checked(None, Allowed(WORDS, optional=True), metadata)


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

    scheduler_address: Optional[str] = _checked(
        None,
        Allowed(TEXT, optional=True, form=_address),
        {
            "help": "Address of a running Dask scheduler to attach to "
            "(tcp://host:port), for example one started by `snakemake-context up`. "
            "Without it (and without --context-scheduler-file) the executor starts "
            "an embedded cluster for this run and stops it at the end.",
        },
    )
    scheduler_file: Optional[Path] = _checked(
        None,
        Allowed(TEXT, optional=True),
        {
            "help": "Scheduler file of a running cluster to attach to, as written "
            "by `snakemake-context up --scheduler-file` or `dask scheduler "
            "--scheduler-file`. An attached cluster keeps running after the run, "
            "so its contexts stay loaded for the next one.",
        },
    )
    servers: Optional[int] = table_field("servers")
    contexts_memory: str = table_field("contexts_memory")
    catalog: Optional[str] = _checked(
        None,
        Allowed(TEXT, optional=True, form=catalog_form),
        {
            "help": "Where this run records its servers, contexts and jobs: a path "
            "(a SQLite file; on a network filesystem the live file stays on local "
            "disk and a snapshot is published there every few seconds), an "
            "SQLAlchemy URL (postgresql+psycopg://user@host/db), or 'none'. "
            "Default: .snakemake/context/catalog.db in the workflow directory. A "
            "cluster started by `snakemake-context up` records into its own catalog "
            "instead. A catalog problem is a warning, never a failed run.",
        },
    )
    credentials: Optional[Path] = _checked(
        None,
        Allowed(TEXT, optional=True, needs=ATTACH_SETTINGS),
        {
            "help": "Directory of the TLS credentials (ca.pem, cert.pem, key.pem) of a "
            "cluster to attach to by --context-scheduler-address. Default: the "
            "directory X.tls beside the scheduler file X.json, where "
            "`snakemake-context up` writes them.",
        },
    )
    allow_plaintext: bool = _checked(
        False,
        Allowed(FLAG, needs=ATTACH_SETTINGS),
        {
            "help": "Attach to a scheduler without TLS (tcp://), such as a `dask "
            "scheduler` started by hand. Anyone who can reach its ports can run code "
            "as its owner; the run says so once. Clusters this plugin starts always "
            "use TLS.",
        },
    )
    crash_budget: int = _checked(
        2,
        Allowed(WHOLE, least=0, most=10_000, unit="crashes"),
        {
            "help": "How many times a job may crash the server running it (the "
            "process exits by itself, dies of SIGSEGV/SIGABRT, or of a SIGKILL nobody "
            "announced, such as the OOM killer's) and go back to the queue; one more "
            "crash fails it, naming the servers, their exit codes and each "
            "attempt's log. --retries then applies on top.",
        },
    )
    plain_jobs: Optional[str] = _checked(
        None,
        Allowed(TEXT, optional=True, choices=("local", "servers")),
        {
            "help": "Where plain jobs (no context, no GPU, not in a group) run. "
            "'local': in Snakemake's own process, as with --executor local (local "
            "rules: logs, benchmarks, retries and conda are local's; no per-job "
            "Snakemake start). 'servers': on the context servers, each as its own "
            "Snakemake job process. Default: 'local' with the embedded cluster (same "
            "machine), 'servers' when attached to a cluster.",
        },
    )
    server_memory: Optional[str] = _checked(
        None,
        Allowed(SIZE, least=2**26, optional=True, conflicts=ATTACH_SETTINGS),
        {
            "help": "Memory cap of each server of the embedded cluster, its child "
            "processes included ('8GB'; default: none). A watchdog samples it every "
            "0.5 s; above the cap it stops the running job, which fails naming the "
            "cap and the memory seen, and restarts the server if the job does not "
            "stop. Separate from --context-contexts-memory (contexts) and from Dask's "
            "memory thresholds (off). For `snakemake-context up`, export "
            f"{MEMORY_CAP_VARIABLE} before starting it.",
        },
    )
    local_dir: Optional[Path] = _checked(
        None, Allowed(TEXT, optional=True, form=existing_dir), dict(LOCAL_DIR_METADATA)
    )
    slots: int = table_field("slots")
    model_cache: Optional[str] = table_field("model_cache")
    model_cache_size: Optional[str] = table_field("model_cache_size")
    # The embedded cluster's: pilots own --context-pilots gpus.
    gpus_per_server: int = table_field("gpus_per_server", conflicts=("backend", *ATTACH_SETTINGS))
    pilots: Optional[list[str]] = _keyed_flag(
        "Run the servers as a pool of pilot jobs on a batch system, asked for as "
        "KEY=VALUE: backend=slurm (or sge, pbs, lsf, htcondor) and any of queue, account, "
        "qos, walltime, gpus, nodes, gpu_type, cores, memory, directive, prologue, min, max "
        "(a list's key once per item: gpu_type=a100 gpu_type=h100)."
    )
    tuning: Optional[list[str]] = _keyed_flag(
        "Research switches and tuning, as KEY=VALUE (a switch: KEY alone): placement=dask, "
        "agnostic, status_interval=0.5, peer_transfers=0..."
    )
    report: bool = _checked(
        False,
        Allowed(FLAG),
        {
            "help": "At the run's end, write its GPU ledger (where every GPU-second went) as "
            "one HTML file, .snakemake/context/reports/<run id>.html, as `snakemake-context "
            "report --run RUN` does. Without it the run's last line names that command.",
        },
    )

    def __post_init__(self) -> None:
        #: What others can do in the named caches the embedded cluster's servers use.
        self.cache_notes: list[str] = []
        if building_for_the_command_line():  # this process is the run, DAG to exit
            take_signals_before_the_run()
        try:
            self.tuned = tuning_values(self.tuning)
            self.requested = pilot_request(self.pilots)
            check({**vars(self), **vars(self.tuned), **vars(self.requested)}, settings_table())
            # The variables a user exports (the servers inherit them), before anything
            # is made or started.
            check_environment()
            if self.scheduler_file or self.scheduler_address:
                self._check_attach_target()
            if self.servers == 0 and not (
                self.backend or self.scheduler_file or self.scheduler_address
            ):
                raise SettingError(
                    f"{executor_flag('servers')} 0 is not allowed: it starts no servers, and "
                    "this run's own cluster has no pilots or nodes to run its jobs. Fix: ask "
                    "for servers "
                    f"({executor_flag('servers')} N), pilots ({executor_flag('backend')} "
                    "...), or attach to a cluster nodes join "
                    "(snakemake-context up --servers 0; --context-scheduler-file)."
                )
            if not (self.scheduler_file or self.scheduler_address or self.backend):
                # The embedded cluster's servers start on this node: their directories
                # are checked here (an attached cluster's and pilots' are theirs).
                shape = Shape(model_cache=self.model_cache, own_caches=self.own_caches)
                self.cache_notes = shape.check_cache_dirs(executor_flag)
        except SettingError as error:
            if building_for_the_command_line():
                # Snakemake would print the error's class and the plugin's frames
                # around it; a SystemExit is printed as it is, and nothing was made.
                raise SystemExit(str(error)) from None
            raise error.with_traceback(None) from None

    def _check_attach_target(self) -> None:
        """Where the run would attach, read as attaching reads it (the address, the
        scheduler file, the credentials), with no connection yet: a plaintext address
        without --context-allow-plaintext, a missing or truncated scheduler file and
        missing or foreign credentials are refused here, with the other settings."""
        from ..cluster.attach import resolve_target
        from ..errors import ClusterError

        try:
            resolve_target(
                address=self.scheduler_address,
                scheduler_file=Path(self.scheduler_file) if self.scheduler_file else None,
                credentials=Path(self.credentials) if self.credentials else None,
                allow_plaintext=bool(self.allow_plaintext),
            )
        except ClusterError as error:
            raise SettingError(str(error)) from None

    def __getattr__(self, name: str) -> Any:
        """A key of the pilot request or of the tuning read as a setting
        (``settings.pilot_queue``, ``settings.placement``): the value ``--context-pilots``
        or ``--context-tuning`` gave, else its default."""
        if name in _REQUEST_FIELDS:
            return getattr(self.__dict__.get("requested") or PilotRequest(), name)
        if name in TUNING:
            return getattr(self.__dict__.get("tuned") or Tuning(), name)
        raise AttributeError(name)


@dataclass
class PilotRequest:
    """A pool of pilots on a batch system, submitted for this run: given as
    ``--context-pilots KEY=VALUE ...`` (the keys: :data:`~..settings.table.PILOT_KEYS`),
    each field an option of the table, read as settings (``settings.pilot_queue``)."""

    backend: Optional[str] = table_field("backend", conflicts=ATTACH_SETTINGS)
    pilot_queue: Optional[str] = table_field("pilot_queue")
    pilot_account: Optional[str] = table_field("pilot_account")
    pilot_qos: Optional[str] = table_field("pilot_qos")
    pilot_walltime: str = table_field("pilot_walltime")
    pilot_gpus: int = table_field("pilot_gpus")
    pilot_nodes: int = table_field("pilot_nodes")
    pilot_gpu_types: Optional[list[str]] = table_field("pilot_gpu_types")
    pilot_cores: int = table_field("pilot_cores")
    pilot_memory: str = table_field("pilot_memory")
    pilot_directives: Optional[list[str]] = table_field("pilot_directives")
    pilot_prologue: Optional[list[str]] = table_field("pilot_prologue")
    min_pilots: int = table_field("min_pilots")
    max_pilots: int = table_field("max_pilots")


_REQUEST_FIELDS = frozenset(PILOT_KEYS.values())


@dataclass
class Tuning:
    """The settings a user rarely sets: research switches and tuning, given as
    ``--context-tuning KEY=VALUE ...`` (a switch: ``KEY`` alone) and checked by the
    same table as the flags. Read as settings: ``settings.placement``."""

    status_interval: float = _checked(
        1.0,
        Allowed(NUMBER, least=0.1, most=60, unit="seconds"),
        {
            "help": "Longest pause in seconds between two status checks. A job "
            "that finishes wakes the check at once, so this only bounds how "
            "often waiting jobs and lost servers are looked at.",
        },
    )
    wait_for_server: float = _checked(
        120.0,
        Allowed(NUMBER, least=0, most=30 * 86400, unit="seconds"),
        {
            "help": "Seconds a job may wait for a server that can run it (enough "
            "GPUs, the requested gpu_model, enough memory) before it fails with "
            "a message naming the servers seen. Servers of an attached cluster "
            "may join meanwhile; the embedded cluster's fleet is fixed, so there "
            "such a job fails at once.",
        },
    )
    connect_timeout: float = _checked(
        20.0,
        Allowed(NUMBER, above=0, most=3600, unit="seconds"),
        {
            "help": "Seconds to wait for an attached scheduler to answer, or for "
            "the embedded cluster to start, before the run fails.",
        },
    )
    placement: str = _checked(
        "affinity",
        Allowed(TEXT, choices=("affinity", "dask")),
        {
            "help": "How jobs find a server. 'affinity': the executor queues jobs "
            "and sends each to a server warm for its context with a free slot (then "
            "one whose disk caches the weights, then the fastest, then any), and "
            "loads a context elsewhere only when waiting for a warm slot would take "
            "longer than the load. 'dask': submit at once and let Dask choose (the "
            "baseline, for comparisons).",
        },
    )
    preemption_budget: Optional[int] = _checked(
        None,
        Allowed(WHOLE, least=0, most=10_000, optional=True, unit="preemptions"),
        {
            "help": "How many times a job may lose its server to a preemption (an "
            "outside SIGTERM, an injected kill, a lost node or heartbeat) and go back "
            "to the queue before it fails. Preemptions never consume --retries. "
            "Default: Snakemake's --preemptible-retries where set, else 10.",
        },
    )
    agnostic: bool = _checked(
        False,
        Allowed(FLAG),
        {
            "help": "Context-agnostic mode: each job loads its context and the server "
            "drops it at the job's end (no reuse), the baseline of the paper's "
            "experiments run on the same servers (for comparisons, such as the "
            "preemption benchmark).",
        },
    )
    recycle_after_leaks: int = _checked(
        3,
        Allowed(WHOLE, least=0, most=10_000, zero="never", conflicts=ATTACH_SETTINGS),
        {
            "help": "Restart a server of the embedded cluster once this many of its "
            "jobs left threads running (0: never). Leaked threads and open files are "
            "reported either way. For `snakemake-context up`, export "
            f"{RECYCLE_VARIABLE} before starting it.",
        },
    )
    survival_placement: bool = _checked(
        False,
        Allowed(FLAG),
        {
            "help": "Placement weighs each server's estimated survival (from the lives "
            "of its group's servers in the catalog and in this run, see "
            "--context-tuning server_group): a load goes to a server likely to live through "
            "the load and the jobs it would run, a job longer than a server's expected "
            "remaining life goes to a longer-lived one, and a pool of pilots prefers "
            "the kinds whose pilots live longer. Off: servers are told apart only by "
            "their walltime.",
        },
    )
    threads_per_slot: int = table_field("threads_per_slot")
    peer_transfers: int = table_field("peer_transfers")
    peer_mbps: float = table_field("peer_mbps")
    gang_timeout: float = table_field("gang_timeout")
    # An attached cluster's servers carry the labels it gave them.
    server_group: str = table_field("server_group", conflicts=ATTACH_SETTINGS)
    pilot_retire_margin: float = table_field("pilot_retire_margin")
    interface: Optional[str] = table_field("interface")
    pilot_idle_timeout: float = table_field("pilot_idle_timeout")
    pilot_loads_per_source: int = table_field("pilot_loads_per_source")
    own_caches: Optional[str] = table_field("own_caches")


def tuning_values(words: Any) -> Tuning:
    """The tuning ``--context-tuning`` gives (``KEY=VALUE`` words; a switch's ``KEY``
    alone), each value parsed as its setting allows (checked later, with the rest):
    an unknown key is one line naming the keys there are."""
    keys = {name: name for name in TUNING}
    return Tuning(**_keyed_values(words, TUNING_FLAG, "tuning key", keys, Tuning))


def pilot_request(words: Any) -> PilotRequest:
    """The pilot request ``--context-pilots`` gives (``KEY=VALUE`` words, a list's key
    once per item), parsed as :func:`tuning_values` parses the tuning."""
    return PilotRequest(**_keyed_values(words, PILOTS_FLAG, "pilot key", PILOT_KEYS, PilotRequest))


def _keyed_values(
    words: Any, flag: str, noun: str, keys: dict[str, str], cls: type
) -> dict[str, Any]:
    """The fields (by name) that ``KEY=VALUE`` words give, ``keys`` naming the field of
    each key: a switch's ``KEY`` alone is true; a list's key adds one item each time."""
    given: dict[str, Any] = {}
    table = {setting.name: setting for setting in dataclass_settings(cls, "")}
    for word in words_of(words):
        key, sep, text = word.partition("=")
        key = key.strip().replace("-", "_")
        setting = table.get(keys.get(key, ""))
        if setting is None:
            raise SettingError(
                f"{flag} {word!r} is not allowed: no {noun} {key!r}; the keys are "
                f"{', '.join(sorted(keys))} (see the docs' settings page)."
            )
        if setting.allowed.kind == FLAG:
            answer = text.strip().lower() if sep else "true"
            if answer not in _SWITCH:
                raise SettingError(
                    f"{flag} {word!r} is not allowed: {key} is a switch "
                    "(KEY, KEY=true or KEY=false)."
                )
            given[setting.name] = _SWITCH[answer]
        elif setting.allowed.kind == WORDS:
            given[setting.name] = [*given.get(setting.name, ()), text] if sep else Malformed(word)
        else:
            given[setting.name] = setting.allowed.parse(text) if sep else Malformed(word)
    return given


_SWITCH = {"true": True, "yes": True, "1": True, "on": True}
_SWITCH |= {"false": False, "no": False, "0": False, "off": False}


def _keyed_table(cls: type) -> list[Any]:
    return [
        dataclasses.replace(setting, flag=executor_flag(setting.name))
        for setting in dataclass_settings(cls, "")
    ]


def settings_table() -> list[Any]:
    """Every setting of the executor, with its flag and what it allows (a key's flag:
    ``--context-pilots queue``, ``--context-tuning placement``)."""
    return (
        dataclass_settings(ExecutorSettings, EXECUTOR_PREFIX)
        + _keyed_table(PilotRequest)
        + _keyed_table(Tuning)
    )
