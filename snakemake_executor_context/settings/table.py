"""Every option of the servers and of their pilots, declared once: its name, what it
allows (:class:`~.checks.Allowed`), its default and its help.

The front ends are made from this table, never typed again:

- the executor's settings (:class:`~..executor.settings.ExecutorSettings`, whose
  fields Snakemake turns into ``--context-NAME`` flags) take each field's default,
  help and checks with :func:`table_field`;
- ``snakemake-context up`` and the cluster process add theirs with :func:`add_option`
  (``--NAME``, or the shorter flag an option declares: ``--queue`` for
  ``pilot_queue``), under the same names in their parsed arguments;
- :class:`~.shape.Shape` and the pilots' options take their defaults from it.

A help text names another option as ``{name}``, shown as that option's flag in the
front end showing it, and never types a default: :meth:`Option.help_for` adds it.

The environment variables a user sets are declared here too (:data:`VARIABLES`): both
front ends refuse a bad one at start (:func:`check_environment`), and every reader
takes its value from :func:`environment_value`, so each means one thing everywhere.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..defaults import (
    DEFAULT_MEMORY_BUDGET,
    GANG_TIMEOUT_SECONDS,
    LOCAL_DIR_VARIABLE,
    MEMORY_CAP_VARIABLE,
    MODEL_CACHE_SIZE_VARIABLE,
    MODEL_CACHE_VARIABLE,
    NO_TLS_VARIABLE,
    RECYCLE_VARIABLE,
    SOURCE_MBPS_VARIABLE,
)
from ..errors import SettingError
from ..pilots.batch.registry import BACKENDS
from .checks import (
    BUDGET,
    NUMBER,
    SIZE,
    TEXT,
    WALLTIME,
    WHOLE,
    WORDS,
    Allowed,
    Variable,
    add_argument,
    check_variables,
    filled,
    settings_field,
)

__all__ = [
    "EXECUTOR_PREFIX",
    "OPTIONS",
    "PILOT",
    "PILOTS_FLAG",
    "PILOT_KEYS",
    "SERVER",
    "TUNING",
    "TUNING_FLAG",
    "VARIABLES",
    "Option",
    "add_option",
    "add_options",
    "check_environment",
    "environment_value",
    "executor_flag",
    "existing_dir",
    "option",
    "options_of",
    "plaintext_benchmark",
    "server_group_counted",
    "server_group_labels",
    "setting_default",
    "table_field",
    "up_flag",
]

#: The flag of an option among the executor's settings: this and its name with dashes.
EXECUTOR_PREFIX = "--context-"
#: The groups of options: how each server runs, and the pilots of a batch system.
SERVER, PILOT = "server", "pilot"


@dataclass(frozen=True)
class Option:
    """One option: its name (the executor's setting, ``up``'s destination), what it
    allows, its default and its help text (``{other}``: another option's flag).
    ``default_text`` says what the default means where its value would not (None:
    "the number of CPU cores"); ``up`` is ``up``'s flag where it is not the name
    (``queue``); ``executor``: whether the executor's settings have it. ``shell``: its
    value is shell lines of a pilot's job script (the prologue); every other option's
    value is one line (:attr:`~.checks.Allowed.one_line`)."""

    name: str
    allowed: Allowed
    default: Any
    help: str
    group: str = SERVER
    default_text: str = ""
    up: str = ""
    executor: bool = True
    shell: bool = False

    def __post_init__(self) -> None:
        # Each value lands in a pilot's batch script or the cluster process's command
        # line: a newline there is a line of its own (after it, sbatch reads no more
        # #SBATCH directives: the pilot's memory, walltime and GPUs silently dropped).
        object.__setattr__(self, "allowed", replace(self.allowed, one_line=not self.shell))

    def help_for(self, flag_of: Callable[[str], str]) -> str:
        """The help text as a front end shows it, naming options by ``flag_of``."""
        text = self.help.format_map({name: flag_of(name) for name in OPTIONS})
        shown = self.default_text or _shown_default(self.default)
        return f"{text} Default: {shown}." if shown else text


def _shown_default(value: Any) -> str:
    if value is None or value is False or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# -- the server group's value -------------------------------------------------------

_LABEL = re.compile(r"[A-Za-z0-9_.-]+")
_GROUP_FORM = (
    "one label (short) or LABEL:N,LABEL:N,... with labels of letters, digits, '_', '.' "
    "and '-', and N a whole number of servers, at least 1"
)


def _group_parts(spec: str) -> list[tuple[str, int | None]] | str:
    """The labels of a ``server_group`` value and their counts (None: no count), or
    what is wrong with it."""
    parts: list[tuple[str, int | None]] = []
    for part in spec.split(","):
        label, colon, count = part.strip().partition(":")
        if not _LABEL.fullmatch(label):
            return f"{label!r} is not a label: {_GROUP_FORM}"
        if not colon:
            parts.append((label, None))
        elif re.fullmatch("[0-9]+", count.strip()) and int(count) >= 1:
            parts.append((label, int(count)))
        else:
            return f"{part.strip()!r} is not LABEL:N: {_GROUP_FORM}"
    if len(parts) > 1 and any(count is None for _, count in parts):
        return f"several labels need a count each: {_GROUP_FORM}"
    return parts


def _group_form(flag: str, spec: str) -> str | None:
    """The ``form`` of ``server_group``: what is wrong with a value (None: nothing)."""
    found = _group_parts(spec)
    return found if isinstance(found, str) else None


_POOL = ("backend",)

_DECLARED = (
    Option(
        "servers",
        Allowed(
            WHOLE, least=1, most=256, optional=True, unit="servers", zero="no servers of its own"
        ),
        None,
        "Context servers started when the machine has no GPU, each running {slots} jobs "
        "at a time and standing in for gpu=1; with GPUs, one server per GPU instead. 0: "
        "none of its own, a scheduler for pilots and for nodes that join it "
        "(`snakemake-context join`).",
        default_text="the number of CPU cores, at most 4",
    ),
    Option(
        "contexts_memory",
        Allowed(BUDGET),
        DEFAULT_MEMORY_BUDGET,
        "Memory each server may fill with loaded contexts before it evicts the least "
        "recently used one: a fraction of the server's memory (GPU memory on a GPU "
        "server, its share of RAM otherwise), or a size such as '6GB'.",
    ),
    Option(
        "slots",
        Allowed(WHOLE, least=1, most=256, unit="jobs at once"),
        1,
        "Jobs each server runs at once, as threads sharing one loaded copy of the "
        "context (and its batched() calls). Only jobs of one workflow directory, script, "
        "threads, environment and search paths overlap; a shareable=False context gets a "
        "whole server; a context runs one job at a time until its per-job memory is "
        "declared or measured, then what fits.",
    ),
    Option(
        "threads_per_slot",
        Allowed(WHOLE, least=0, most=1024, zero="the rule's threads"),
        0,
        "Threads of each in-process job's pools (torch, BLAS, OpenMP, OMP_NUM_THREADS...); "
        "0: the rule's threads. The fleet's shape: servers per node ({servers}) x slots "
        "per server x threads per slot.",
    ),
    Option(
        "peer_transfers",
        Allowed(WHOLE, least=0, most=64, zero="no peer transfer"),
        2,
        "Transfers of its context templates (a loader's template=, such as converted "
        "weights) each server serves to other servers at once: a server that lacks a "
        "template fetches it from a peer instead of its source, and then serves it too "
        "(0: no peer transfer, every load reads its source).",
    ),
    Option(
        "peer_mbps",
        # Below 1 MB/s a template of a few GB takes hours from a peer, longer than any
        # source: a typo.
        Allowed(NUMBER, least=1, most=1e6, zero="no limit", unit="MB/s"),
        0.0,
        "MB/s each transfer a server serves may take (0: no limit).",
    ),
    Option(
        "model_cache",
        Allowed(TEXT, optional=True, form=lambda flag, value: node_path(flag, value)),
        None,
        "Where each node's model cache lives (loaders' converted weights, templates "
        f"fetched from peers; the servers of a node share it), exported to the servers as "
        f"{MODEL_CACHE_VARIABLE}. A pilot makes it on its node before its prologue, whose "
        f"lines may stage weights into it ('rsync -a /shared/models/ ${MODEL_CACHE_VARIABLE}/'); "
        "$USER and $TMPDIR expand there.",
        default_text=f"${MODEL_CACHE_VARIABLE}, else ~/.cache/snakemake-context/models",
    ),
    Option(
        "own_caches",
        # Checked at start (Shape.check_cache_dirs), made where the servers start (a
        # pilot's on its node).
        Allowed(TEXT, optional=True, form=filled),
        None,
        "A directory of per-server model caches: each server keeps its loaders' cache in "
        "DIR/<server name>, as servers on different nodes do (tests, benchmarks, pilots "
        "sharing a node).",
        default_text=f"the servers of a node share ${MODEL_CACHE_VARIABLE}",
    ),
    Option(
        "model_cache_size",
        # At most 1 PiB, more than any node's local disk (1e30 was taken as it was).
        Allowed(SIZE, optional=True, least=2**20, most=2**50),
        None,
        "What each node-local model cache (converted weights, templates fetched from "
        "peers) may hold, such as 20GB: before a template enters it, the least recently "
        "used ones that no server of the node holds loaded or reads are removed to make "
        "room, with their recorded digests.",
        default_text="no limit",
    ),
    Option(
        "gpus_per_server",
        Allowed(WHOLE, least=1, most=64, unit="GPUs"),
        1,
        "GPUs each server owns (its CUDA_VISIBLE_DEVICES lists them); on a machine "
        "without GPUs, the GPUs each CPU server stands in for. A loader gets them from "
        "server_devices() (one process, layers split with device_map='auto'); a context "
        "declared with ranks=k runs one process per device on k of them (tensor "
        "parallel), and its rules ask for gpu=k. Pilots own {pilot_gpus}.",
    ),
    Option(
        "gang_timeout",
        Allowed(NUMBER, least=1, most=86_400, unit="seconds"),
        GANG_TIMEOUT_SECONDS,
        "Seconds a collective of a context that spans several processes (ranks=k) may "
        "take before it fails: a rank that died or hangs never leaves the others blocked "
        "longer.",
    ),
    Option(
        "server_group",
        Allowed(TEXT, form=_group_form),
        "",
        "A label for the servers this cluster starts, the group their survival is "
        "estimated in: servers of one group are expected to live alike (one partition, "
        "one kind of node), and a server's estimate comes from its group's lives seen "
        "(`snakemake-context inject --group LABEL` kills only that group's servers). One "
        "label for every server ('short'), or for the servers a cluster on this machine "
        "plans, LABEL:N,LABEL:N,... (the first N servers the first label, the next the "
        "second...; the counts add up to the servers). Letters, digits, '_', '.' and '-'. "
        "Pilots without it are grouped by their queue and GPU type.",
    ),
    Option(
        "backend",
        Allowed(TEXT, choices=tuple(sorted(BACKENDS)), optional=True),
        None,
        "Submit the servers as pilot jobs to this batch system ("
        + ", ".join(sorted(BACKENDS))
        + "; through dask-jobqueue), as many as the waiting jobs need, instead of "
        "starting them on this machine. The scheduler runs on this machine: pilots must "
        "reach it ({interface}) and share the workflow directory.",
        group=PILOT,
        default_text="servers on this machine",
    ),
    Option(
        "pilot_queue",
        Allowed(TEXT, optional=True, needs=_POOL),
        None,
        "Partition (SLURM) or queue of the pilots.",
        group=PILOT,
        up="queue",
    ),
    Option(
        "pilot_account",
        Allowed(TEXT, optional=True, needs=_POOL),
        None,
        "Account (project) the pilots are charged to.",
        group=PILOT,
        up="account",
    ),
    Option(
        "pilot_qos",
        Allowed(TEXT, optional=True, needs=_POOL),
        None,
        "SLURM quality of service of the pilots.",
        group=PILOT,
        up="qos",
    ),
    Option(
        "pilot_walltime",
        Allowed(WALLTIME, backend="backend", needs=_POOL),
        "01:00:00",
        "Walltime of one pilot, read as {backend} reads it (SLURM: MM, MM:SS, HH:MM:SS, "
        "D-HH, D-HH:MM, D-HH:MM:SS, so 04:00 is 4 minutes; PBS: [[HH:]MM:]SS; SGE: H:M:S "
        "or seconds; LSF: [HH:]MM or HH:MM:SS; HTCondor: HH:MM:SS or D-HH:MM:SS); that "
        "reading is printed, and a field beyond its range refused. A pilot retires "
        "{pilot_retire_margin} seconds before it; its running jobs go back to the queue "
        "and the pool submits a replacement while work remains.",
        group=PILOT,
        up="walltime",
    ),
    Option(
        "pilot_retire_margin",
        Allowed(NUMBER, least=0, unit="seconds", needs=_POOL, below_walltime="pilot_walltime"),
        300.0,
        "Seconds before its walltime at which a pilot retires.",
        group=PILOT,
        up="retire_margin",
    ),
    Option(
        "pilot_gpus",
        Allowed(WHOLE, least=0, most=64, unit="GPUs", needs=_POOL),
        1,
        "GPUs per pilot (one server each pilot).",
        group=PILOT,
    ),
    Option(
        "pilot_nodes",
        Allowed(WHOLE, least=1, most=64, unit="nodes", needs=_POOL),
        1,
        "Pilots that form one server spanning that many nodes (one batch job each, "
        "assembled once they have started): its jobs run on the first, and a context "
        "declared with ranks=k puts one rank on each GPU of them all (tensor parallel "
        "across nodes). Needs a fixed pool: {min_pilots} equal to {max_pilots}, a "
        "multiple of it.",
        group=PILOT,
    ),
    Option(
        "pilot_gpu_types",
        Allowed(WORDS, optional=True, needs=_POOL),
        None,
        "GPU types of the pilots (SLURM GRES type, LSF gmodel), one kind of pilot each: "
        "new pilots go to the kind the ready jobs' gpu_model needs. Also the model a "
        "pilot advertises where NVML sees no GPU.",
        group=PILOT,
        up="gpu_type",
    ),
    Option(
        "pilot_cores",
        Allowed(WHOLE, least=1, most=4096, unit="cores", needs=_POOL),
        1,
        "CPU cores per pilot.",
        group=PILOT,
    ),
    Option(
        "pilot_memory",
        Allowed(SIZE, least=2**26, needs=_POOL),
        "16GB",
        "Memory per pilot.",
        group=PILOT,
    ),
    Option(
        "pilot_directives",
        Allowed(WORDS, optional=True, needs=_POOL),
        None,
        "Extra job-script directives, as the batch system spells them (e.g. "
        "--constraint=a100 for SLURM).",
        group=PILOT,
        up="directive",
    ),
    Option(
        "pilot_prologue",
        Allowed(WORDS, optional=True, needs=_POOL),
        None,
        "Shell lines a pilot runs before its server starts, e.g. 'source "
        "/shared/venv/bin/activate', or copying weights to node-local disk.",
        group=PILOT,
        up="prologue",
        shell=True,
    ),
    Option(
        "interface",
        Allowed(TEXT, optional=True),
        None,
        "Network interface the scheduler (and the servers it starts) listen on, and pilots "
        "and nodes that join reach it through (compute nodes often reach only one "
        "interface of a login node, e.g. ib0).",
        group=PILOT,
        default_text="the loopback (127.0.0.1) with no pilots, else the default route's",
    ),
    Option(
        "min_pilots",
        Allowed(WHOLE, least=0, most=10_000, needs=_POOL, at_most="max_pilots"),
        0,
        "Pilots the pool keeps even when idle.",
        group=PILOT,
    ),
    Option(
        "max_pilots",
        Allowed(WHOLE, least=1, most=10_000, needs=_POOL),
        4,
        "Most pilots at once.",
        group=PILOT,
    ),
    Option(
        "pilot_idle_timeout",
        Allowed(NUMBER, least=0, unit="seconds", zero="never released", needs=_POOL),
        120.0,
        "Seconds an idle pilot is kept before it is released.",
        group=PILOT,
    ),
    Option(
        "pilot_loads_per_source",
        Allowed(WHOLE, least=0, most=10_000, zero="no limit", needs=_POOL),
        2,
        "At most this many pilots load one context from its shared source at once (a "
        "semaphore on the scheduler; 0: no limit). Loads from the node-local model cache "
        "take no turn.",
        group=PILOT,
        up="loads_per_source",
    ),
    Option(
        "pilot_log_dir",
        Allowed(TEXT, optional=True, needs=_POOL),
        None,
        "Where pilots write their batch logs.",
        group=PILOT,
        default_text="the batch system's default",
        # A run's pilots write theirs beside its other files.
        executor=False,
    ),
    Option(
        "pilot_lifetime_stagger",
        Allowed(NUMBER, least=0, unit="seconds", needs=_POOL),
        60.0,
        "Up to this many seconds earlier, at random, so that pilots started together do "
        "not retire together.",
        group=PILOT,
        up="lifetime_stagger",
        executor=False,
    ),
)
#: Every option, by name.
OPTIONS: dict[str, Option] = {declared.name: declared for declared in _DECLARED}


def node_path(flag: str, value: str) -> str | None:
    """The ``form`` of the model cache: a pilot's job script expands it in double quotes
    on its node, so variables ($USER, ${TMPDIR}) may expand there and nothing else."""
    if empty := filled(flag, value):
        return empty
    if re.search(r'[`"\\]|\$\(', value):
        return (
            "a path whose only expansions are variables such as $USER or ${TMPDIR} (a "
            "pilot's job script expands it on its node): no `...`, $(...), quote or backslash"
        )
    return None


def existing_dir(flag: str, value: str) -> str | None:
    """The ``form`` of a directory in which the plugin makes its private directory
    (``--context-local-dir``, :data:`~..defaults.LOCAL_DIR_VARIABLE`): it must exist;
    the plugin makes only its private directory inside it, never the path to it."""
    if Path(value).expanduser().is_dir():
        return None
    return (
        "no such directory; name one that exists (the plugin makes its private "
        "directory snakemake-context-<uid> inside it)"
    )


_DECLARED_VARIABLES = (
    Variable(
        SOURCE_MBPS_VARIABLE,
        Allowed(NUMBER, above=0, most=1e6, zero="no cap", unit="MB/s"),
        "MB/s this user's processes of a node may read from one staged source together",
        "a number of MB/s such as 50",
        "no cap",
    ),
    Variable(
        MEMORY_CAP_VARIABLE,
        Allowed(SIZE, least=2**26, zero="no cap", off=("none", "off", "no")),
        "the memory cap of each server, its child processes included (the executor's "
        "--context-server-memory sets it for its embedded cluster)",
        "a size such as 8GB",
        "no cap",
    ),
    Variable(
        RECYCLE_VARIABLE,
        Allowed(WHOLE, least=0, most=10_000, zero="never"),
        "restart a server once this many of its jobs left threads running (the "
        "executor's --context-tuning recycle_after_leaks sets it for its embedded cluster)",
        "a whole number such as 3",
        "default 3",
    ),
    Variable(
        LOCAL_DIR_VARIABLE,
        Allowed(TEXT, form=existing_dir),
        "the directory in which the plugin makes this user's private directory (the "
        "executor's --context-local-dir sets it)",
        "an existing directory",
        "$XDG_RUNTIME_DIR, else $TMPDIR",
    ),
    Variable(
        MODEL_CACHE_VARIABLE,
        Allowed(TEXT),
        "where loaders keep converted weights (a pilot's job script exports it)",
        "a directory of your own",
        "~/.cache/snakemake-context/models",
    ),
    Variable(
        MODEL_CACHE_SIZE_VARIABLE,
        replace(OPTIONS["model_cache_size"].allowed, optional=False, zero="no limit"),
        "what this user's entries of a model cache may take (a server sets it from its "
        "--context-model-cache-size)",
        "a size such as 20GB",
        "no limit",
    ),
    Variable(
        NO_TLS_VARIABLE,
        Allowed(TEXT, form=lambda name, value: _benchmark_parent(value)),
        "a benchmark's switch that starts one run's embedded cluster without TLS",
        "it for one run only, as its pid, from the process that starts that snakemake "
        "(workflows/bench/core.py does)",
        "mutual TLS on every port",
    ),
)
#: The environment variables a user sets, by name: what each allows and means.
VARIABLES: dict[str, Variable] = {declared.name: declared for declared in _DECLARED_VARIABLES}


def _benchmark_parent(value: str) -> str | None:
    """Why ``value`` of :data:`~..defaults.NO_TLS_VARIABLE` is refused: it is honoured
    only as the pid of the process that started this one, which a benchmark sets for
    each run it starts and a profile, a module file or a shell's export cannot carry."""
    if value.strip() == str(os.getppid()):
        return None
    return (
        "it would start this run's cluster without TLS or credentials, so it is honoured "
        f"only as the pid of the process that started this one ({os.getppid()}), never "
        "inherited"
    )


def plaintext_benchmark(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a benchmark asked for this one run's embedded cluster without TLS
    (:data:`~..defaults.NO_TLS_VARIABLE`, as :func:`_benchmark_parent` allows it)."""
    value = VARIABLES[NO_TLS_VARIABLE].read(environ)
    return value is not None and _benchmark_parent(value) is None


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse the first bad value of :data:`VARIABLES` in ``environ`` (default
    :data:`os.environ`) in one line (SettingError): at start, before anything is
    made or started, as a bad flag is."""
    check_variables(VARIABLES.values(), environ)


def environment_value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the variable ``name`` of :data:`VARIABLES` in ``environ`` (default
    :data:`os.environ`), as the start check reads it (:meth:`~.checks.Variable.read`:
    None when unset; SettingError, one line, when refused)."""
    return VARIABLES[name].read(environ)


def server_group_counted(spec: str) -> bool:
    """Whether a (checked) ``server_group`` value gives labels by counts of servers."""
    found = _group_parts(spec) if spec else []
    return isinstance(found, list) and any(count is not None for _, count in found)


def server_group_labels(spec: str, planned: int) -> list[str]:
    """The label of each of the ``planned`` servers a cluster starts, in order, from a
    ``server_group`` value ('' for each without one); SettingError (naming the option)
    for a malformed value, or counts that do not add up to ``planned``."""
    flags = f"{up_flag('server_group')} ({executor_flag('server_group')})"
    if not spec:
        return [""] * planned
    found = _group_parts(spec)
    if isinstance(found, str):
        raise SettingError(f"{flags} {spec!r} is not allowed: {found}.")
    if not server_group_counted(spec):
        return [found[0][0]] * planned
    total = sum(count or 0 for _, count in found)
    if total != planned:
        raise SettingError(
            f"{flags} {spec!r} is not allowed: its counts add up to {total} servers, but "
            f"this cluster plans {planned} (one per GPU; without GPUs, {up_flag('servers')}, "
            f"{executor_flag('servers')}). "
            f"Fix: counts that add up to {planned}, or one label for every server."
        )
    return [label for label, count in found for _ in range(count or 0)]


def option(name: str) -> Option:
    """The option called ``name`` (LookupError: there is none)."""
    try:
        return OPTIONS[name]
    except KeyError:
        raise LookupError(f"no option is called {name!r}") from None


def options_of(group: str) -> list[Option]:
    """The options of a group (:data:`SERVER`, :data:`PILOT`), in their order."""
    return [declared for declared in _DECLARED if declared.group == group]


def setting_default(name: str) -> Any:
    """The declared default of the option ``name``."""
    return option(name).default


#: The executor's settings a user rarely sets (research switches, tuning): one flag,
#: ``--context-tuning KEY=VALUE ...``, checked by the same table as the others.
TUNING_FLAG = EXECUTOR_PREFIX + "tuning"
TUNING = frozenset(
    {
        "status_interval", "wait_for_server", "connect_timeout", "placement",
        "preemption_budget", "agnostic", "recycle_after_leaks", "threads_per_slot",
        "peer_transfers", "peer_mbps", "gang_timeout",
        "server_group", "survival_placement", "interface", "pilot_retire_margin",
        "pilot_idle_timeout", "pilot_loads_per_source", "own_caches",
    }
)  # fmt: skip


#: The pilot request, one flag: ``--context-pilots KEY=VALUE ...``, each key an option
#: of the table (a list's key given once per item: ``gpu_type=a100 gpu_type=h100``).
PILOTS_FLAG = EXECUTOR_PREFIX + "pilots"
PILOT_KEYS = {
    "backend": "backend", "queue": "pilot_queue", "account": "pilot_account",
    "qos": "pilot_qos", "walltime": "pilot_walltime", "gpus": "pilot_gpus",
    "nodes": "pilot_nodes", "gpu_type": "pilot_gpu_types", "cores": "pilot_cores",
    "memory": "pilot_memory", "directive": "pilot_directives", "prologue": "pilot_prologue",
    "min": "min_pilots", "max": "max_pilots",
}  # fmt: skip
_PILOT_KEY_OF = {name: key for key, name in PILOT_KEYS.items()}


def executor_flag(name: str) -> str:
    """The executor's flag of an option: ``--context-slots``, for a key of the pilot
    request ``--context-pilots queue``, for a tuning key ``--context-tuning placement``."""
    if name in TUNING:
        return f"{TUNING_FLAG} {name}"
    if name in _PILOT_KEY_OF:
        return f"{PILOTS_FLAG} {_PILOT_KEY_OF[name]}"
    return EXECUTOR_PREFIX + name.replace("_", "-")


def up_flag(name: str) -> str:
    """``up``'s (and the cluster process's) flag of an option: ``--queue``."""
    return "--" + (option(name).up or name).replace("_", "-")


def table_field(name: str, **changes: Any) -> Any:
    """A field of the executor's settings (a dataclass Snakemake reads): the option's
    default, help and checks (``changes``: combinations only the executor has, such
    as conflicting with a cluster it attaches to)."""
    declared = option(name)
    metadata: dict[str, Any] = {"help": declared.help_for(executor_flag)}
    if declared.allowed.kind == WORDS:
        metadata.update(nargs="+", type=str)
    return settings_field(declared.default, replace(declared.allowed, **changes), metadata)


def add_option(
    parser: argparse.ArgumentParser | Any, name: str, *, helps: bool = True
) -> argparse.Action:
    """Add an option to ``up``'s (or the cluster process's) parser, or one of its
    groups: its flag, default, help and checks, under its name in the arguments; a
    list is given by repeating the flag."""
    declared = option(name)
    text = declared.help_for(up_flag) if helps else argparse.SUPPRESS
    words = declared.allowed.kind == WORDS
    if words and helps:
        text += " Repeatable."
    return add_argument(
        parser,
        up_flag(name),
        declared.allowed,
        dest=name,
        metavar=(declared.up or name).upper(),
        default=declared.default,
        help=text,
        **({"action": "append"} if words else {}),
    )


def add_options(parser: argparse.ArgumentParser | Any, names: Iterable[str]) -> None:
    """:func:`add_option` for each of ``names``."""
    for name in names:
        add_option(parser, name)
