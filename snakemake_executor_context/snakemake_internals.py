"""Every read of Snakemake that the executor-plugin interface does not cover, in one place.

The plugin reads Snakemake's DAG, jobs and rules beyond ``snakemake_interface_*``
(what the DAG will run, which rules can run locally, a rule's script), builds the
``snakemake`` object of a script the way Snakemake's preamble does, and runs scripts and
job command lines with Snakemake's own helpers. Those are the parts that change between
minor releases, so they are all here, named in :data:`INTERNALS`, and
:func:`check_snakemake` refuses, at the start of a run, a Snakemake that lacks one, in
one line naming it. What the interface's own classes read (``workflow.executor_settings``,
``workflow.scheduler.error_callback``, ``workflow.workdir_init``) and the script's
documented ``snakemake`` object (``.input``, ``.resources``, ``.config``) are not here.

One module for two processes: Snakemake's (the executor builds job specs) and a context
server's (it runs scripts in-process and forks Snakemake's command line for plain jobs).
Servers run the executor's Snakemake version (the version-skew check refuses others),
so the executor's check at start covers both. Imports of Snakemake are lazy: a server
imports Snakemake only when a job needs it.
"""

from __future__ import annotations

import heapq
import inspect
import io
import os
import pickle
import re
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache, wraps
from importlib import import_module
from pathlib import Path
from typing import Any, NamedTuple

from .errors import UnsupportedSnakemakeError

__all__ = [
    "CHECKED_AGAINST",
    "INTERNALS",
    "REEVALUATION_TIMER",
    "RuleResource",
    "RuleShared",
    "benchmark_extended",
    "benchmark_repeats",
    "benchmarked_here",
    "building_for_the_command_line",
    "cancel_scheduler_timers",
    "check_snakemake",
    "cleanup_scripts",
    "dag_dependencies",
    "dag_needrun_jobs",
    "dag_workflow",
    "finish_together",
    "graceful_shutdown_requested",
    "graceful_stop_off_the_main_thread",
    "group_temp_ends",
    "is_directory",
    "is_flagged",
    "is_local_rule",
    "is_run",
    "job_group",
    "job_is_norun",
    "job_priority",
    "latency_wait",
    "load_script_object",
    "mark_local",
    "needrun_jobs",
    "one_reevaluation_pending",
    "pickle_script_object",
    "pipe_grouped_rules",
    "places",
    "preemptible_retries",
    "preload_job_command",
    "restore_shell_defaults",
    "rule_action",
    "rule_group",
    "rule_has_pipe_or_service_output",
    "rule_resource",
    "rule_script",
    "rule_shared",
    "run_snakemake_main",
    "running_jobs",
    "runs_in_snakemake",
    "scheduler_being_built",
    "script_globals",
    "script_location",
    "script_object",
    "script_source",
    "set_shell_executable",
    "shadow_depth",
    "shell_defaults",
    "snakemake_logger",
    "snakemake_version",
    "software_directives",
    "thin_selections",
    "told_not_finished",
    "wildcard_resource",
    "wildcards_dict",
    "workflow_config",
    "workflow_rules",
    "write_benchmark",
    "written_resource",
]

#: The Snakemake versions every entry of :data:`INTERNALS` was checked against: the
#: lower bound in pyproject.toml (CI's oldest-versions step, .ci/oldest) and the newest
#: release at hand (the normal run). Extend it when a newer Snakemake passes.
CHECKED_AGAINST = ("9.18.1", "9.27.1")

#: What the plugin reads (as users read it in an error), and where each part lives:
#: ``module:Object.attribute`` or ``module:function(leading,parameters)``; a part
#: starting with ``.`` is another attribute of the part before's object, one without a
#: module is in the part before's module. An attribute counts if the class has it,
#: declares it as a dataclass field or slot, or its module assigns ``self.<attribute>``.
INTERNALS: dict[str, str] = {
    # Snakemake's process: the workflow, its DAG, settings and scheduler.
    "workflow.rules, .config, .is_local(rule), ._localrules, .sourcecache, .dag": (
        "snakemake.workflow:Workflow.rules .config .is_local(rule) ._localrules .sourcecache .dag"
    ),
    "workflow.dag.needrun_jobs(), .jobs, ._group, .dependencies, .depending, .targetfiles, "
    ".workflow": (
        "snakemake.dag:DAG.needrun_jobs .jobs ._group .dependencies .depending .targetfiles "
        ".workflow"
    ),
    "a group job's .toposorted, .jobs, .dag": "snakemake.jobs:GroupJob.toposorted .jobs .dag",
    "workflow.execution_settings.latency_wait, .cleanup_scripts, "
    "workflow.output_settings.benchmark_extended, "
    "workflow.remote_execution_settings.preemptible_retries": (
        "snakemake.settings.types:ExecutionSettings.latency_wait .cleanup_scripts "
        "OutputSettings.benchmark_extended RemoteExecutionSettings.preemptible_retries"
    ),
    "workflow.scheduler.running, ._user_kill, ._schedule_reevalutation(delay), ._job_selector, "
    "._tofinish, .exit_gracefully, .finish_callback, ._proceed(job), ._lock, ._open_jobs, "
    ".dryrun": (
        "snakemake.scheduling.job_scheduler:JobScheduler.running ._user_kill "
        "._schedule_reevalutation(delay) ._job_selector ._tofinish .exit_gracefully "
        ".finish_callback ._proceed(job) ._lock ._open_jobs .dryrun"
    ),
    # Its jobs, their files, and rules.
    "job.is_norun, .group, .wildcards, .wildcards_dict, .params, .priority, "
    ".benchmark_repeats, ._resources, ._scheduler_resources": (
        "snakemake.jobs:Job.is_norun .group .wildcards .wildcards_dict .params .priority "
        ".benchmark_repeats ._resources ._scheduler_resources"
    ),
    "an output's .is_directory, snakemake.io.is_flagged(value, flag)": (
        "snakemake.io:_IOFile.is_directory is_flagged(value,flag)"
    ),
    "rule.resources[name].is_evaluable(), .evaluate(wildcards, attempt), .value": (
        "snakemake.rules:Rule.resources snakemake.resources:Resource.is_evaluable .evaluate .value"
    ),
    "rule.ruleinfo.resources (a resource as the Snakefile wrote it)": (
        "snakemake.rules:Rule.ruleinfo snakemake.ruleinfo:RuleInfo.resources"
    ),
    "rule.is_shell, .is_wrapper, .is_notebook, .is_cwl, .is_template_engine, .norun, "
    ".is_run, .script, .basedir, .shadow_depth, .group, .output, .conda_env, "
    ".container_img, .env_modules, .params": (
        "snakemake.rules:Rule.is_shell .is_wrapper .is_notebook .is_cwl .is_template_engine "
        ".norun .is_run .script .basedir .shadow_depth .group .output .conda_env "
        ".container_img .env_modules .params"
    ),
    # A context job's script: found, and given its `snakemake` object, in Snakemake's
    # process; run in a server's with Snakemake's helpers.
    "snakemake.script.get_source(path, sourcecache, basedir, wildcards, params)": (
        "snakemake.script:get_source(path,sourcecache,basedir,wildcards,params)"
    ),
    "snakemake.sourcecache.LocalSourceFile.get_path_or_uri(secret_free), .get_basedir(), "
    "snakemake.common.get_snakemake_searchpaths()": (
        "snakemake.sourcecache:LocalSourceFile.get_path_or_uri(secret_free) .get_basedir "
        "snakemake.common:get_snakemake_searchpaths"
    ),
    "snakemake.iocontainers.Snakemake(input_, output, params, wildcards, threads, "
    "resources, log, config, rulename, bench_iteration, scriptdir), Namedlist._names, "
    "snakemake.common.tbdstring.TBDString": (
        "snakemake.iocontainers:Snakemake(input_,output,params,wildcards,threads,resources,"
        "log,config,rulename,bench_iteration,scriptdir) Namedlist._names "
        "snakemake.common.tbdstring:TBDString"
    ),
    "snakemake.benchmark.BenchmarkRecord, .benchmarked(pid, benchmark_record), "
    ".write_benchmark_records(records, path, extended_fmt)": (
        "snakemake.benchmark:BenchmarkRecord benchmarked(pid,benchmark_record) "
        "write_benchmark_records(records,path,extended_fmt)"
    ),
    "snakemake.shell.shell._process_args, .executable(cmd), snakemake.logging.logger": (
        "snakemake.shell:shell._process_args .executable(cmd) snakemake.logging:logger"
    ),
    # A failing pipe group's late command, killed as it registers (server/pipegroups.py).
    "snakemake.shell.shell._lock, ._processes, .kill(jobid)": (
        "snakemake.shell:shell._lock ._processes .kill(jobid)"
    ),
    # The simulator's workload from a Snakefile: Snakemake's DAG, as a dry run builds it.
    "snakemake.api.SnakemakeApi(output_settings).workflow(...).dag(...), "
    "WorkflowApi._workflow, workflow._prepare_dag(...), ._build_dag()": (
        "snakemake.api:SnakemakeApi(output_settings) SnakemakeApi.workflow "
        "WorkflowApi.dag(dag_settings) WorkflowApi._workflow "
        "snakemake.workflow:Workflow._prepare_dag(forceall,ignore_incomplete,lock_warn_only,"
        "nolock) ._build_dag"
    ),
    # Snakemake's command line builds the executor's settings here, outside the API's
    # handler, and prints an error's class and frames around its message.
    "snakemake.cli.args_to_api(args, parser)": "snakemake.cli:args_to_api(args,parser)",
    # A server's plain jobs: Snakemake's command line, imported once in the zygote.
    "snakemake.cli.main(argv), .get_argument_parser(), snakemake.api, .dag, "
    ".executors.local, .scheduling.job_scheduler, .script": (
        "snakemake.cli:main(argv) get_argument_parser snakemake.api: snakemake.dag: "
        "snakemake.executors.local: snakemake.scheduling.job_scheduler: snakemake.script:"
    ),
}


def places(spec: str) -> list[str]:
    """The full ``module:Object.attribute`` form of each part of an entry's places."""
    found: list[str] = []
    for part in spec.split():
        if ":" in part:
            found.append(part)
        elif part.startswith("."):
            found.append(found[-1].partition("(")[0].rpartition(".")[0] + part)
        else:
            found.append(found[-1].partition(":")[0] + ":" + part)
    return found


# --------------------------------------------------------------------------------------
# The check at start.


def check_snakemake(internals: Mapping[str, str] = INTERNALS) -> None:
    """Refuse, in one line naming the installed Snakemake, one that lacks an internal
    the plugin reads."""
    import snakemake.api  # noqa: F401  (imports the rest in Snakemake's own order)

    missing = [name for name, spec in internals.items() if not all(map(_exists, places(spec)))]
    if missing:
        raise UnsupportedSnakemakeError(
            f"This plugin reads {'; '.join(missing)}, which Snakemake "
            f"{snakemake_version()} does not have; supported: {_supported()}. Fix: "
            "install a supported Snakemake beside the plugin."
        )


def _supported() -> str:
    from importlib.metadata import PackageNotFoundError, requires

    checked = f"checked against {' and '.join(CHECKED_AGAINST)}"
    try:
        declared = requires("snakemake-executor-plugin-context") or []
    except PackageNotFoundError:
        declared = []
    spec = next((r for r in declared if re.match(r"snakemake\s*[<>=!~]", r)), None)
    return f"{spec.replace(' ', '')} ({checked})" if spec else checked


def _exists(place: str) -> bool:
    """Whether ``module:Object.attribute(parameters)`` exists in this Snakemake."""
    where, _, params = place.partition("(")
    module_name, _, path = where.partition(":")
    try:
        found: Any = import_module(module_name)
    except ImportError:
        return False
    names = path.split(".") if path else []
    for position, name in enumerate(names):
        owner, found = found, getattr(found, name, _MISSING)
        if found is _MISSING:
            last = position == len(names) - 1
            return last and not params and _declared(owner, name)
    if not params:
        return True
    wanted = params.rstrip(")").split(",")
    try:
        got = [p for p in inspect.signature(found).parameters if p != "self"]
    except (TypeError, ValueError):
        return False
    return got[: len(wanted)] == wanted


_MISSING = object()


def _declared(owner: Any, name: str) -> bool:
    """An instance attribute of class ``owner``: a dataclass field, or assigned to
    ``self`` in its module's code (or a base class's; a module, not a class, is read:
    ``inspect.getsource`` of Snakemake's DAG takes a third of a second)."""
    if not isinstance(owner, type):
        return False
    if name in getattr(owner, "__dataclass_fields__", {}):
        return True
    assigned = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]*)?=(?!=)")
    return any(assigned.search(_module_source(cls.__module__)) for cls in owner.__mro__)


@cache
def _module_source(name: str) -> str:
    path = getattr(sys.modules.get(name), "__file__", None)
    try:
        return Path(path).read_text() if path else ""
    except OSError:
        return ""


def snakemake_version() -> str:
    """The installed Snakemake's version."""
    import snakemake

    return str(snakemake.__version__)


# --------------------------------------------------------------------------------------
# Snakemake's process: the workflow, its DAG and its scheduler.


def workflow_rules(workflow: Any) -> Iterable[Any]:
    """The workflow's rules."""
    return workflow.rules


def workflow_config(workflow: Any) -> dict[str, Any]:
    """The workflow's ``config``."""
    return workflow.config


def is_local_rule(workflow: Any, rule: Any) -> bool:
    """Whether Snakemake runs the rule's jobs in its own process."""
    return bool(workflow.is_local(rule))


def needrun_jobs(workflow: Any) -> Iterable[Any]:
    """The jobs the DAG will run."""
    return dag_needrun_jobs(workflow.dag)


def dag_needrun_jobs(dag: Any) -> Iterable[Any]:
    """The jobs a DAG (:func:`workflow_dag`'s) will run."""
    return dag.needrun_jobs()


def dag_dependencies(dag: Any, job: Any) -> Iterable[Any]:
    """The jobs a job of the DAG depends on."""
    return dag.dependencies[job]


def dag_workflow(dag: Any) -> Any:
    """The workflow a DAG belongs to."""
    return dag.workflow


def runs_in_snakemake(workflow: Any, rule: Any) -> bool:
    """Whether a remote executor leaves the rule's jobs to Snakemake's own process
    (Snakemake's own test, without the "every job is local" of a run with no
    executor, as the simulator's dry-run workflow is): a local rule, a rule that
    runs nothing, a template engine; never a grouped rule."""
    return rule.group is None and (
        rule.name in workflow._localrules or rule.norun or rule.is_template_engine
    )


def pipe_grouped_rules(workflow: Any) -> set[str]:
    """Rules with a job in a group the DAG formed (``--groups``, pipe groups)."""
    dag = getattr(workflow, "dag", None)
    return {job.rule.name for job in getattr(dag, "_group", {}) or {}}


def mark_local(workflow: Any, names: Iterable[str]) -> None:
    """Make the rules local, as a ``localrules:`` directive would have (the jobs
    already built forget resources evaluated as remote, like ``tmpdir``)."""
    names = set(names)
    workflow._localrules.update(names)
    for job in getattr(workflow.dag, "jobs", ()):
        if job.rule.name in names:
            job._resources = None
            job._scheduler_resources = None


def running_jobs(workflow: Any) -> list[Any]:
    """The jobs Snakemake's scheduler has running."""
    scheduler = getattr(workflow, "scheduler", None)
    return list(getattr(scheduler, "running", ()))


def building_for_the_command_line() -> bool:
    """Whether Snakemake's command line (``snakemake.cli.args_to_api``) is what builds
    the executor's settings in this thread, where a refusal ends the process in one
    line, not as an error Snakemake prints with its class and the plugin's frames."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "args_to_api" and frame.f_globals.get("__name__") == "snakemake.cli":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def scheduler_being_built() -> Any:
    """The ``JobScheduler`` whose ``__init__`` is building the executor in this thread
    (None: none is). Snakemake assigns ``workflow.scheduler`` only after it returns."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and isinstance(candidate, JobScheduler):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def graceful_shutdown_requested(workflow: Any) -> bool:
    """Whether Snakemake's SIGTERM handler asked its scheduler to wind down."""
    scheduler = getattr(workflow, "scheduler", None)
    return getattr(scheduler, "_user_kill", None) == "graceful"


def graceful_stop_off_the_main_thread() -> bool:
    """Make Snakemake's SIGTERM handler safe at any moment of a run; returns whether
    it was changed (once per process).

    Snakemake's graceful stop (``JobScheduler.exit_gracefully``, which the scheduler
    installs as SIGTERM's handler once it has built the executor) takes the
    scheduler's ``threading.Lock``. Python runs a signal handler in the main thread,
    between two bytecodes, and the main thread holds that same lock while it selects
    jobs and while it finishes the reported ones: a SIGTERM landing then waits for
    ever on a lock its own thread holds (measured with Snakemake 9.27.1 at 2,000
    ready context jobs: 5 of 6 SIGTERMs; the local executor, whose selections are
    rarer, 0 of 2). The handler's work moves to a thread of its own, which takes the
    lock as soon as the main thread lets it go: the stop is Snakemake's own, a moment
    later. Done on the class from the executor's start, inside the scheduler's
    ``__init__``, before it binds the handler."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = JobScheduler.exit_gracefully
    if getattr(original, "off_the_main_thread", False):
        return False

    @wraps(original)
    def exit_gracefully(self: Any, *args: Any) -> None:
        stopping = threading.Thread(
            target=original, args=(self, *args), name="snakemake-graceful-stop", daemon=True
        )
        stopping.start()

    exit_gracefully.off_the_main_thread = True  # type: ignore[attr-defined]
    JobScheduler.exit_gracefully = exit_gracefully
    return True


def finish_together(workflow: Any, jobs: list[Any]) -> None:
    """Tell Snakemake's scheduler that ``jobs`` finished, waking its loop once.

    Its ``finish_callback`` (``JobScheduler._proceed``) queues one job for finishing and
    releases the loop's semaphore once per job, so ``k`` jobs told together cost ``k``
    passes over the ready jobs. The first pass finishes all ``k``; the others find
    nothing new, yet each still lists the remaining jobs, sizes every ready job's input,
    resets their resources and starts a one-second timer thread: at 2,000 ready jobs
    about a sixth of Snakemake's samples (2026-12-06). Here the jobs are queued under
    the scheduler's lock, as ``_proceed`` queues them, and the semaphore is released
    once. Any other callback (a dry run, ``--immediate-submit``) is called per job."""
    scheduler = workflow.scheduler
    if len(jobs) < 2 or scheduler.dryrun or scheduler.finish_callback != scheduler._proceed:
        for job in jobs:
            scheduler.finish_callback(job)
        return
    with scheduler._lock:
        scheduler._tofinish.extend(jobs)
    scheduler._open_jobs.release()


def told_not_finished(workflow: Any) -> list[Any]:
    """Jobs told to Snakemake as finished that its scheduler has not yet finished
    (checked their outputs, cleared their "incomplete" marks): after Ctrl-C it never
    will, and their outputs would stay marked incomplete."""
    scheduler = getattr(workflow, "scheduler", None)
    return list(getattr(scheduler, "_tofinish", ()))


#: A selection among more ready jobs than this, and more than :data:`CANDIDATES_PER_SLOT`
#: per free job slot, chooses among the ready jobs of highest priority only.
CANDIDATES = 200
#: Candidates per free job slot (a selection fills every free slot it can).
CANDIDATES_PER_SLOT = 4


def thin_selections(workflow: Any) -> bool:
    """Make each pass of Snakemake's scheduler cost what a few hundred ready jobs
    cost, not what all of them do; returns whether it was done (once per scheduler).

    Snakemake's scheduler makes a pass over the ready jobs for every finished job
    (each report releases its semaphore once) and for every timer of its job rate
    limit. For a remote executor its cores are unlimited and the free job slots
    (``_nodes``, from ``--jobs``) are never looked at before the job selector runs.
    The default selector builds an integer program over every ready job and runs the
    CBC solver on it (measured here: 22 ms at 166 ready jobs, 0.65 s at 8,000, about
    3 jobs selected per pass, so 5 jobs/s); the greedy one costs ready jobs x free
    slots. Snakemake itself never meets this: ``--touch`` and dry runs use the
    greedy selector and finish their jobs a pass at a time.

    So, for this executor: a pass without a free slot selects nothing without asking
    the selector (every job takes a slot), and a pass over more than
    ``max(CANDIDATES, CANDIDATES_PER_SLOT x free slots)`` ready jobs hands the
    selector that many, those of highest priority (what ``--scheduler-subsample``
    does at random). Every ready job is still chosen in priority order; what is lost
    is the integer program's view of temporary files across all ready jobs. Where no
    candidate has a temp input, the selector is not handed the jobs still to come,
    which it reads for those files only."""
    scheduler = getattr(workflow, "scheduler", None)
    selector = getattr(scheduler, "_job_selector", None)
    if selector is None or getattr(selector, "thinned", False):
        return False

    def select(jobs: Any, remaining: Any, resources: Mapping[str, Any], sizes: Any) -> Any:
        free = min(resources.get("_nodes", sys.maxsize), resources.get("_job_count", sys.maxsize))
        if free <= 0:
            return []
        among = max(CANDIDATES, CANDIDATES_PER_SLOT * free)
        if len(jobs) > among:
            jobs = heapq.nlargest(among, jobs, key=_priority)
        if not any(_has_temp_input(job) for job in jobs):
            # The integer program reads the jobs still to come only for the temp files
            # among the candidates' inputs (milp.py's job_temp_files, a set a job):
            # without any, they change nothing, and cost one pass over the DAG each.
            remaining = ()
        return selector(jobs, remaining, resources, sizes)

    select.thinned = True  # type: ignore[attr-defined]
    scheduler._job_selector = select  # type: ignore[union-attr]
    return True


def _priority(job: Any) -> float:
    return float(job.priority)


def _has_temp_input(job: Any) -> bool:
    return any(path.is_flagged("temp") for path in job.input)


#: The name of the wake-up timer :func:`one_reevaluation_pending` starts.
REEVALUATION_TIMER = "snakemake-context-reevaluation"


def one_reevaluation_pending(workflow: Any) -> bool:
    """Keep one of Snakemake's rate-limit wake-ups pending at a time, not one per pass;
    returns whether it was done (once per scheduler).

    With a job rate limit (``--max-jobs-per-timespan``, 100/1s by default, off only under
    ``--touch`` and dry runs) every pass of the scheduler's loop over a non-empty set
    of ready jobs ends by starting a ``threading.Timer`` of the limit's timespan that
    releases the loop's semaphore (``JobScheduler._schedule_reevalutation``): a pass
    more, which starts a timer more. Every pass so begins a chain of one pass a second
    that lasts as long as jobs are ready, and after a minute of a run with a few passes
    a second the loop runs pass after pass: measured at 2,000 ready jobs (Snakemake
    9.27.1), the passes and their timer threads held Snakemake's main thread busy for
    the whole run. One pending wake-up is all a limit needs: any pass re-evaluates
    everything. The flag is cleared before the release, so a pass that follows the
    last wake-up always starts the next. The timers are daemons named
    :data:`REEVALUATION_TIMER`: none keeps the process alive after its last job."""
    scheduler = getattr(workflow, "scheduler", None)
    if scheduler is None or getattr(scheduler, "_reevaluation_pending", None) is not None:
        return False
    pending = threading.Event()
    scheduler._reevaluation_pending = pending

    def wake() -> None:
        pending.clear()
        scheduler._open_jobs.release()

    def schedule(delay: float) -> None:
        if pending.is_set():
            return
        pending.set()
        timer = threading.Timer(delay, wake)
        timer.name, timer.daemon = REEVALUATION_TIMER, True
        timer.start()

    scheduler._schedule_reevalutation = schedule
    return True


def cancel_scheduler_timers() -> int:
    """Cancel the job scheduler's pending re-evaluation timers; returns how many.

    Snakemake's own (``JobScheduler._schedule_reevalutation``, before
    :func:`one_reevaluation_pending` took over) are non-daemon timers of the rate limit's
    timespan: once the run's jobs are done, the last one kept the process alive up to
    a second after its last job (measured: 1.4 s of a 1.6 s exit)."""
    cancelled = 0
    for thread in threading.enumerate():
        code = getattr(getattr(thread, "function", None), "__code__", None)
        where = Path(code.co_filename).parts[-2:] if code is not None else ()
        ours = thread.name == REEVALUATION_TIMER
        if isinstance(thread, threading.Timer) and (
            ours or where == ("scheduling", "job_scheduler.py")
        ):
            thread.cancel()
            cancelled += 1
    return cancelled


def preemptible_retries(workflow: Any) -> int | None:
    """``--preemptible-retries``, if set."""
    remote = getattr(workflow, "remote_execution_settings", None)
    return getattr(remote, "preemptible_retries", None)


def latency_wait(workflow: Any) -> float:
    """``--latency-wait`` in seconds."""
    return float(workflow.execution_settings.latency_wait)


def cleanup_scripts(workflow: Any) -> bool:
    """Whether script copies are removed (not ``--skip-script-cleanup``)."""
    return bool(workflow.execution_settings.cleanup_scripts)


def benchmark_extended(workflow: Any) -> bool:
    """``--benchmark-extended``."""
    return bool(getattr(workflow.output_settings, "benchmark_extended", False))


# --------------------------------------------------------------------------------------
# Jobs, their files, and rules.


def job_is_norun(job: Any) -> bool:
    """A job that runs nothing (a target rule like ``all``)."""
    return bool(job.is_norun)


def job_group(job: Any) -> Any:
    """The job's group id (None outside a group)."""
    return job.group


def wildcards_dict(job: Any) -> Mapping[str, Any]:
    """The job's wildcards by name."""
    return job.wildcards_dict


def job_priority(job: Any) -> Any:
    """Snakemake's priority of the job."""
    return getattr(job, "priority", 0) or 0


def group_temp_ends(group: Any) -> list[list[str]]:
    """Per layer of a group's topological order: the ``temp()`` outputs of its
    members that only members need (no job outside the group, no target), whose last
    consumer is in that layer. Snakemake's own run of a group removes each once
    that consumer is done; a server running the group does the same."""
    dag = group.dag
    layer_of = {job: i for i, layer in enumerate(group.toposorted) for job in layer}
    ends: list[list[str]] = [[] for _ in group.toposorted]
    for job in layer_of:
        for file in job.output:
            if not is_flagged(file, "temp") or file in dag.targetfiles:
                continue
            consumers = [j for j, files in dag.depending[job].items() if file in files]
            if consumers and all(j in layer_of for j in consumers):
                ends[max(layer_of[j] for j in consumers)].append(str(file))
    return ends


def is_flagged(file: Any, flag: str) -> bool:
    """Whether an input or output is marked ``flag`` (``pipe``, ``update``, ...)."""
    from snakemake.io import is_flagged as flagged

    return bool(flagged(file, flag))


def is_directory(file: Any) -> bool:
    """Whether an output is a ``directory()``."""
    return bool(file.is_directory)


class RuleResource(NamedTuple):
    """A resource a rule sets: a function of the job (``evaluable``), or a constant."""

    evaluable: bool
    value: Any


def rule_resource(rule: Any, name: str) -> RuleResource | None:
    """The rule's resource ``name``; None if the rule does not set it."""
    resources = getattr(rule, "resources", None)
    if resources is None or name not in resources:
        return None
    resource = resources[name]
    if resource.is_evaluable():
        return RuleResource(True, None)
    return RuleResource(False, resource.value)


def written_resource(rule: Any, name: str) -> Any:
    """The rule's resource ``name`` as its Snakefile wrote it (Snakemake rounds a float
    to an int before anything else sees it); None where it wrote none."""
    written = getattr(getattr(rule, "ruleinfo", None), "resources", None)
    return written[1].get(name) if written else None


#: A rule's action, by the flag that says it, in the order Snakemake's own checks use.
_ACTIONS = ("is_shell", "is_wrapper", "is_notebook", "is_cwl", "is_template_engine", "norun")


def wildcard_resource(job: Any, name: str) -> Any:
    """A job's resource ``name`` when the rule gives it as a function of the job's
    wildcards (and attempt) alone, evaluated as Snakemake would for the job's first
    attempt; None when it needs more (its input, its threads) or raises. Snakemake's
    own cached resources of the job are left alone: they may depend on input files
    that do not exist yet when a run starts."""
    resources = getattr(job.rule, "resources", None)
    if resources is None or name not in resources or not resources[name].is_evaluable():
        return None
    try:
        return resources[name].evaluate(job.wildcards, attempt=1, rulename=job.rule.name).value
    except Exception:  # input= or threads= missing, or the user's function failed
        return None


def rule_action(rule: Any) -> str:
    """What the rule runs: shell, wrapper, notebook, cwl, template_engine, norun (no
    action), run (a ``run:`` block) or script."""
    for flag in _ACTIONS:
        if getattr(rule, flag):
            return flag.removeprefix("is_")
    return "run" if rule.is_run else "script"


def is_run(rule: Any) -> bool:
    """The rule runs a ``run:`` block."""
    return bool(rule.is_run)


def rule_script(rule: Any) -> str:
    """The rule's ``script:`` path, as written."""
    return str(rule.script)


def shadow_depth(rule: Any) -> Any:
    """The rule's ``shadow:`` (None without one)."""
    return rule.shadow_depth


def rule_group(rule: Any) -> Any:
    """The rule's ``group:`` (None without one)."""
    return rule.group


def rule_has_pipe_or_service_output(rule: Any) -> bool:
    """Whether an output of the rule is a ``pipe()`` or ``service()``."""
    return any(is_flagged(f, "pipe") or is_flagged(f, "service") for f in rule.output)


def software_directives(rule: Any) -> dict[str, bool]:
    """Which software directives the rule has, by deployment method."""
    return {
        "conda": bool(rule.conda_env),
        "apptainer": bool(rule.container_img),
        "env-modules": bool(rule.env_modules),
    }


# --------------------------------------------------------------------------------------
# A context job's script: its source and `snakemake` object (Snakemake's process).


def script_source(job: Any, workflow: Any) -> tuple[Any, ...]:
    """``snakemake.script.get_source`` for the job's script: (source file, source,
    language, is local, cache path)."""
    from snakemake.script import get_source

    rule = job.rule
    return get_source(rule.script, workflow.sourcecache, rule.basedir, job.wildcards, job.params)


def script_location(
    source_file: Any, is_local: bool, cache_path: Any
) -> tuple[str, str, list[str]]:
    """The script's path, its directory, and the preamble's ``sys.path`` additions."""
    from snakemake.common import get_snakemake_searchpaths
    from snakemake.sourcecache import LocalSourceFile

    if isinstance(source_file, LocalSourceFile):
        script_path = os.path.realpath(source_file.get_path_or_uri(secret_free=True))
    else:
        script_path = source_file.get_path_or_uri(secret_free=True)
    scriptdir = source_file.get_basedir().get_path_or_uri(secret_free=True)
    search_paths = get_snakemake_searchpaths()
    if cache_path:
        search_paths.append(os.path.dirname(cache_path))
    if is_local:
        search_paths.append(scriptdir)
    return script_path, scriptdir, search_paths


def script_object(job: Any, config: Any, scriptdir: str) -> Any:
    """The script's ``snakemake`` object, as the preamble builds it."""
    from snakemake.iocontainers import Snakemake

    return Snakemake(
        job.input,
        job.output,
        job.params,
        job.wildcards,
        job.threads,
        job.resources,
        job.log,
        config,
        job.rule.name,
        None,
        scriptdir,
    )


class RuleShared(NamedTuple):
    """What the ``snakemake`` objects of one rule's jobs share, pickled once: the
    workflow's config and the rule's params that are the same object in every job,
    each container inside them too (a job's param may be one of the config's)."""

    #: The shared objects, the config first; held, so that their ids stay theirs.
    objects: list[Any]
    #: id() of each shared object -> its place in :attr:`objects`.
    places: dict[int, int]
    #: :attr:`objects`, pickled with protocol 4.
    pickled: bytes


_CONTAINERS = (dict, list, tuple, set, frozenset)


def rule_shared(rule: Any, config: Any) -> RuleShared:
    """The shared part of ``rule``'s jobs' ``snakemake`` objects. A param that is not a
    callable is the rule's own object in every job (Snakemake formats only strings and
    lists of them per job, into new objects that are not found here)."""
    roots = [config, *(value for value in rule.params if not callable(value))]
    objects: list[Any] = []
    index: dict[int, int] = {}
    pending = list(reversed(roots))
    while pending:
        obj = pending.pop()
        if id(obj) in index:
            continue
        index[id(obj)] = len(objects)
        objects.append(obj)
        inside = (
            obj.values() if isinstance(obj, dict) else obj if isinstance(obj, _CONTAINERS) else ()
        )
        pending.extend(item for item in inside if isinstance(item, _CONTAINERS))
    return RuleShared(objects, index, pickle.dumps(objects, protocol=4))


def pickle_script_object(snakemake: Any, shared: RuleShared) -> bytes:
    """The job's own part of its ``snakemake`` object: each object of ``shared`` in it
    pickled as a reference into ``shared``, so that, loaded, the object is the one the
    preamble unpickles (one config, a param that is the config's the same object)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    places = shared.places
    pickler.persistent_id = lambda obj: places.get(id(obj))  # type: ignore[method-assign]
    pickler.dump(snakemake)
    return buffer.getvalue()


def benchmark_repeats(job: Any) -> Any:
    """How many times a benchmarked job runs (``repeat()``; None without a benchmark)."""
    return job.benchmark_repeats


# --------------------------------------------------------------------------------------
# Running it in a server's process, and a plain job's command line.


def load_script_object(data: bytes, shared: bytes) -> Any:
    """The job's ``snakemake`` object from its own part (:func:`pickle_script_object`)
    and its rule's shared part (:attr:`RuleShared.pickled`), each load its own objects,
    with the remote ``tmpdir`` placeholder (``<TBD>`` in Snakemake's process) made this
    server's temporary directory."""
    from snakemake.common.tbdstring import TBDString

    unpickler = pickle.Unpickler(io.BytesIO(data))
    unpickler.persistent_load = pickle.loads(shared).__getitem__  # type: ignore[method-assign]
    snakemake = unpickler.load()
    resources = snakemake.resources
    tmpdir = resources.get("tmpdir") if hasattr(resources, "get") else None
    if isinstance(tmpdir, TBDString) or tmpdir == "<TBD>":
        _set_named(resources, "tmpdir", tempfile.gettempdir())
    return snakemake


def _set_named(namedlist: Any, name: str, value: Any) -> None:
    start, end = namedlist._names[name]
    if end is None or end == start + 1:
        namedlist[start] = value
    setattr(namedlist, name, value)


def script_globals(script_path: str, real_file: str, snakemake: Any) -> dict[str, Any]:
    """What the preamble leaves in a script's globals in a fresh interpreter:
    ``__file__`` (the script's path), ``__real_file__`` (its copy), ``sys``,
    ``pickle``, ``snakemake``, ``logger`` and ``Snakemake``."""
    from snakemake.iocontainers import Snakemake
    from snakemake.logging import logger

    return {
        "__file__": script_path,
        "__real_file__": real_file,
        "sys": sys,
        "pickle": pickle,
        "snakemake": snakemake,
        "logger": logger,
        "Snakemake": Snakemake,
    }


def snakemake_logger() -> Any:
    """Snakemake's logger (the run's log, in Snakemake's process)."""
    from snakemake.logging import logger

    return logger


def set_shell_executable(path: str) -> None:
    """``shell.executable(path)``, as the preamble does for ``shell_exec``."""
    from snakemake.shell import shell

    shell.executable(path)


def shell_defaults() -> dict[str, Any]:
    """A copy of ``shell()``'s process-wide defaults (its executable)."""
    from snakemake.shell import shell

    return dict(shell._process_args)


def restore_shell_defaults(saved: Mapping[str, Any]) -> None:
    """Put back what :func:`shell_defaults` saved."""
    from snakemake.shell import shell

    shell._process_args.clear()
    shell._process_args.update(saved)


@contextmanager
def benchmarked_here() -> Iterator[Any]:
    """Measure this process while the block runs; yields the benchmark record."""
    from snakemake.benchmark import BenchmarkRecord, benchmarked

    record = BenchmarkRecord()
    with benchmarked(os.getpid(), record):
        yield record


def write_benchmark(
    records: Iterable[tuple[Any, Any]], path: str, extended: bool, jobid: Any, rule: str
) -> None:
    """Write the benchmark file of (record, ``snakemake`` object) pairs, one a repeat."""
    from snakemake.benchmark import write_benchmark_records

    bench_records = []
    for record, snakemake in records:
        record.jobid = jobid
        record.rule_name = rule
        record.wildcards = snakemake.wildcards
        record.params = snakemake.params
        record.resources = snakemake.resources
        record.input = list(snakemake.input)
        record.threads = snakemake.threads
        bench_records.append(record)
    write_benchmark_records(bench_records, path, extended)


def preload_job_command() -> None:
    """Import what Snakemake's job command line needs, and discover every installed
    plugin, once (a zygote's children then skip it)."""
    import snakemake.api
    import snakemake.dag
    import snakemake.executors.local
    import snakemake.scheduling.job_scheduler
    import snakemake.script  # noqa: F401
    from snakemake.cli import get_argument_parser

    get_argument_parser()


def run_snakemake_main(argv: list[str]) -> None:
    """Snakemake's command line with ``argv`` (raises SystemExit as it does)."""
    from snakemake.cli import main

    main(argv)


def shell_registry() -> Any:
    """Snakemake's ``shell`` class, whose registry of running commands
    (``_processes`` under ``_lock``) and ``kill(jobid)`` a job process patches
    (:mod:`.server.pipegroups`)."""
    from snakemake.shell import shell

    return shell


def workflow_dag(
    snakefile: Path,
    workdir: Path | None,
    config: Mapping[str, Any],
    configfiles: Sequence[Path],
    targets: Sequence[str],
    needed_only: bool,
) -> tuple[Any, dict[str, Any]]:
    """Snakemake's DAG of a workflow and its config, as a dry run builds them (the
    simulator's workload; nothing runs)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
    )

    output = OutputSettings(quiet={Quietness.ALL, Quietness.RULES, Quietness.PROGRESS})
    with SnakemakeApi(output) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(config=dict(config), configfiles=list(configfiles)),
            snakefile=snakefile,
            workdir=workdir,
        )
        workflow_api.dag(DAGSettings(targets=frozenset(targets), forceall=not needed_only))
        # The DAG object itself is not part of the API's surface (a dry run prints it).
        workflow = workflow_api._workflow
        workflow._prepare_dag(
            forceall=not needed_only, ignore_incomplete=True, lock_warn_only=True, nolock=True
        )
        workflow._build_dag()
        return workflow.dag, dict(workflow.config)
