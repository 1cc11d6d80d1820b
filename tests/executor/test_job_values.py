"""What a job hands the plugin, and how it fails: each bad value or odd error fails its
job (or the run at start) in one line naming the call, the job or the rule, the run ends
promptly and no server is lost (issue 51)."""

from __future__ import annotations

import re
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from snakemake_executor_context import declare_job_memory, declare_size, loader, report_items
from snakemake_executor_context.errors import ContextExecutorError, JobValueError
from snakemake_executor_context.executor.rulecheck import check_resources
from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.jobspec import JobResult, PlainJobSpec
from snakemake_executor_context.server.jobs import ServerJobs
from snakemake_executor_context.terminal import error_text, shortened
from tests.conftest import context_run, toy_files

BIG = 64 * 2**20

JOBS = textwrap.dedent("""
    declare_context(config, "sized", "sizedloader.py:load")

    rule all:
        input: "items.txt", "sized.txt", "badstr.txt", "big.txt", "after.txt"

    rule items:
        output: "items.txt"
        resources: context="toy"
        script: "scripts/items.py"

    rule sized:
        output: "sized.txt"
        resources: context="sized"
        script: "scripts/use.py"

    rule badstr:
        output: "badstr.txt"
        resources: context="toy", runtime=5
        script: "scripts/badstr.py"

    rule big:
        output: "big.txt"
        resources: context="toy"
        script: "scripts/big.py"

    rule after:
        input: "items.txt"
        output: "after.txt"
        resources: context="toy"
        script: "scripts/use.py"
""")

SCRIPTS = {
    "scripts/use.py": (
        "from snakemake_executor_context import load_context\n"
        "load_context(snakemake)\n"
        "open(snakemake.output[0], 'w').close()\n"
    ),
    "scripts/items.py": (
        "from snakemake_executor_context import report_items\nreport_items(2**64)\n"
    ),
    "scripts/badstr.py": (
        "class Odd(Exception):\n"
        "    def __str__(self):\n"
        "        raise RuntimeError('no text')\n"
        "raise Odd()\n"
    ),
    "scripts/big.py": f"raise ValueError('x' * {BIG})\n",
    "sizedloader.py": (
        "from snakemake_executor_context import declare_size\n"
        "def load():\n"
        "    declare_size(-1)\n"
        "    return 1\n"
    ),
}


@pytest.mark.slow
def test_bad_values_and_odd_errors_fail_their_jobs_in_one_line(make_workflow):
    workdir = make_workflow(toy_files(JOBS, SCRIPTS))
    started = time.monotonic()
    run = context_run(workdir, "--keep-going", "--context-servers", "2", timeout=180)
    seconds = time.monotonic() - started
    output = run.output
    assert run.returncode != 0
    assert seconds < 60, f"{seconds:.0f} s:\n{output[-3000:]}"
    assert len(output) < 100_000, output[:3000]
    assert "report_items(18446744073709551616): the count must be a whole number" in output
    assert "declare_size(-1): the size must be a whole number from 0 to 2**63-1" in output
    assert re.search(
        r"Rule .badstr. \(context .toy.\) failed on .*: Odd\. The traceback", output
    ), output
    assert "IndexError" not in output and "the task failed in Dask" not in output
    assert "see the job's log" in output
    (summary,) = run.summaries()
    assert len(summary["servers"]) == 2 and summary["loads_on_lost_servers"] == 0
    assert sorted(job["key"].split("-")[0] for job in summary["jobs"]) == [
        "badstr",
        "big",
        "items",
        "sized",
    ]
    assert not any(job["ok"] for job in summary["jobs"])
    assert (workdir / "after.txt").exists() is False  # its input failed
    logs = list((workdir / ".snakemake" / "context" / "logs" / "big").glob("*.log"))
    assert logs and logs[0].stat().st_size > BIG  # the log keeps the message whole


# ---- start: the rules' resources ----


@pytest.mark.slow
@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ("gpu=-1", "Rule 'use' asks for gpu=-1: GPUs are counted whole"),
        ("gpu=0.5", "Rule 'use' asks for gpu=0.5: GPUs are counted whole"),
        ("runtime=-5", "Rule 'use' has runtime=-5: a time limit cannot be negative"),
    ],
)
def test_a_bad_gpu_or_runtime_is_refused_at_start(make_workflow, resources, says):
    rules = f"""
    rule use:
        output: "out.txt"
        resources: {resources}
        shell: "touch {{output}}"
    """
    workdir = make_workflow({"Snakefile": textwrap.dedent(rules)})
    run = context_run(workdir, timeout=60)
    assert run.returncode != 0
    assert says in run.output, run.output
    assert "Traceback" not in run.output
    assert not (workdir / "out.txt").exists()
    assert not (workdir / ".snakemake" / "context" / "cluster").exists()


def _rule(name: str, **resources: object) -> SimpleNamespace:
    class Resource:
        def __init__(self, value: object) -> None:
            self.value = value

        def is_evaluable(self) -> bool:
            return False

    # Snakemake rounds a float resource; the rule's info keeps it as written.
    rounded = {k: round(v) if isinstance(v, float) else v for k, v in resources.items()}
    return SimpleNamespace(
        name=name,
        resources={k: Resource(v) for k, v in rounded.items()},
        ruleinfo=SimpleNamespace(resources=((), resources)),
    )


def test_check_resources_refuses_what_no_job_can_have():
    check_resources([_rule("a", gpu=0, runtime=0), _rule("b", gpu=2.0, runtime="1h")])
    for rule in (_rule("a", gpu=-1), _rule("a", gpu=0.5), _rule("a", runtime=-5)):
        with pytest.raises(ContextExecutorError, match=r"^Rule 'a' "):
            check_resources([rule])
    overridden = _rule("a", gpu=0.5)
    overridden.resources["gpu"].value = 1  # --set-resources a:gpu=1
    check_resources([overridden])


# ---- fast: the values, the error's text, the terminal's cut ----


@pytest.mark.parametrize("call", [report_items, declare_size, declare_job_memory])
@pytest.mark.parametrize("value", [2**64, 2**63, -1, True, 1.5, "3", None])
def test_a_count_or_size_that_is_not_a_whole_int64_is_refused_naming_the_call(call, value):
    with pytest.raises(JobValueError, match=rf"^{call.__name__}\(.*\): the .* 2\*\*63-1"):
        call(value)


def test_a_loaders_job_memory_is_refused_where_it_is_declared():
    with pytest.raises(JobValueError, match=r"^@loader\(job_memory=-5\): the size"):
        loader(job_memory=-5)
    assert loader(job_memory=2**30)(lambda: None).job_memory == 2**30


def test_whole_numbers_and_int_likes_are_taken():
    numpy = pytest.importorskip("numpy")
    for call in (report_items, declare_size, declare_job_memory):
        call(0)
        call(2**63 - 1)
        call(numpy.int64(3))


def test_an_exception_whose_str_raises_is_named_by_its_class():
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert error_text(Odd()) == "Odd"
    assert error_text(ValueError("bad")) == "ValueError: bad"
    assert len(error_text(ValueError("x" * BIG))) < 5000


def test_a_long_failure_is_cut_for_the_terminal():
    assert shortened("short", "/log") == "short"
    cut = shortened("first " + "x" * 5000 + "\nsecond", "/log")
    assert len(cut) < 600 and cut.endswith("... see the job's log /log")
    assert "second" not in shortened("a\n" + "y" * 2000, "/log")


def test_an_error_in_a_jobs_thread_is_that_jobs_failure(tmp_path: Path):
    jobs = _jobs()

    def run(spec: object) -> None:
        raise OSError("Too many open files")

    jobs.run = run  # type: ignore[method-assign]
    spec = PlainJobSpec("k", "rule x", "true", str(tmp_path), "x.log", runtime_minutes=1)
    result = jobs.run_bounded(spec)
    assert not result.ok
    assert result.message == (
        f"rule x: failed on server-0 on host (pid 1): OSError: Too many open files "
        f"(log: {tmp_path / 'x.log'})."
    )


def _jobs() -> ServerJobs:
    jobs = ServerJobs.__new__(ServerJobs)
    jobs.identity = ServerIdentity("server-0", "host", 1)
    jobs.limits = SimpleNamespace(memory_cap=None)
    jobs._lock, jobs._running = threading.RLock(), {}
    return jobs


def test_a_result_dask_could_not_send_fails_its_job(tmp_path: Path):
    jobs = _jobs()
    spec = PlainJobSpec("k", "rule x", "true", str(tmp_path), "x.log")
    fine = JobResult(Outcome("k", jobs.identity, ok=True, items=3), extra={"notes": ["n"]})
    assert jobs._sendable(spec, fine) is fine
    odd = JobResult(Outcome("k", jobs.identity, ok=True), extra={"x": threading.Lock()})
    huge = JobResult(Outcome("k", jobs.identity, ok=True, items=2**64))
    for result in (odd, huge):
        failed = jobs._sendable(spec, result)
        assert not failed.ok and failed.extra == {}
        assert failed.message.startswith("rule x: failed on server-0 on host (pid 1): its result")
