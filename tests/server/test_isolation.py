"""What one in-process job leaves for the next on a persistent cluster: workflow
modules are imported afresh, a context keeps the modules its load imported, and a
thread or file a job leaves behind is reported and reaches no other job's log."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import context_run, persistent_cluster, toy_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_server(tmp_path_factory) -> Iterator[Path]:
    """`snakemake-context up` with one server: every job lands in the same process."""
    with persistent_cluster(tmp_path_factory.mktemp("cluster"), "--servers", "1") as path:
        yield path


HELPER_SNAKEFILE = textwrap.dedent("""
    rule all:
        input: "helper.txt"

    rule use_helper:
        output: "helper.txt"
        resources: context="toy"
        script: "scripts/use_helper.py"
""")
USE_HELPER = """
import helper

with open(snakemake.output[0], "w") as f:
    f.write(helper.VALUE)
"""


def _helper_workflow(make_workflow, name: str, value: str) -> Path:
    return make_workflow(
        toy_files(
            HELPER_SNAKEFILE,
            {"scripts/use_helper.py": USE_HELPER, "scripts/helper.py": f"VALUE = {value!r}\n"},
        ),
        name=name,
    )


def test_each_workflow_imports_its_own_helper_and_an_edit_is_seen(make_workflow, one_server):
    attach = ("--context-scheduler-file", str(one_server))
    first = _helper_workflow(make_workflow, "first", "from the first workflow")
    second = _helper_workflow(make_workflow, "second", "from the second workflow")
    context_run(first, *attach).check()
    context_run(second, *attach).check()
    assert (first / "helper.txt").read_text() == "from the first workflow"
    assert (second / "helper.txt").read_text() == "from the second workflow"
    # A longer value: a same-size edit within the same second could reuse the .pyc.
    (first / "scripts" / "helper.py").write_text("VALUE = 'edited in the first workflow'\n")
    context_run(first, *attach, "--forcerun", "use_helper").check()
    assert (first / "helper.txt").read_text() == "edited in the first workflow"


MODEL_SNAKEFILE = textwrap.dedent("""
    from snakemake_executor_context import declare_context

    declare_context(config, "model", "modelloader.py:load")

    rule all:
        input: "checked/1.txt"

    rule check:
        input: lambda wc: [] if wc.i == "0" else "checked/0.txt"
        output: "checked/{i}.txt"
        resources: context="model"
        script: "scripts/check.py"
""")
MODEL_LOADER = """
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mymodel


def load():
    return mymodel.Model()
"""
CHECK = """
import mymodel
from snakemake_executor_context import load_context

model = load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write(str(isinstance(model, mymodel.Model)))
"""


def test_a_context_keeps_the_classes_its_loader_imported(make_workflow, one_server):
    workdir = make_workflow(
        {
            "Snakefile": MODEL_SNAKEFILE,
            "modelloader.py": MODEL_LOADER,
            "mymodel.py": "class Model:\n    pass\n",
            "scripts/check.py": CHECK,
            "scripts/mymodel.py": "raise ImportError('the loader imported mymodel already')\n",
        }
    )
    context_run(workdir, "--context-scheduler-file", str(one_server)).check()
    assert [(workdir / f"checked/{i}.txt").read_text() for i in (0, 1)] == ["True", "True"]


LEAKY_SNAKEFILE = textwrap.dedent("""
    rule all:
        input: "after.txt"

    rule leaky:
        output: "leaky.txt"
        resources: context="toy"
        script: "scripts/leaky.py"

    rule after:
        input: "leaky.txt"
        output: "after.txt"
        resources: context="toy"
        script: "scripts/after.py"
""")
LEAKY = """
import os
import threading
import time


def chatter():
    for _ in range(200):
        print("LEAKED-PRINT")
        os.write(1, b"LEAKED-FD\\n")
        time.sleep(0.05)


threading.Thread(target=chatter, name="chatterbox", daemon=True).start()
LEFT_OPEN = os.open(snakemake.output[0] + ".kept", os.O_WRONLY | os.O_CREAT)
with open(snakemake.output[0], "w") as f:
    f.write("done")
"""
AFTER = """
import os
import time

print("after's own print")
os.system("echo after-subprocess")
time.sleep(1.0)
with open(snakemake.output[0], "w") as f:
    f.write("done")
"""


def test_a_leaked_thread_writes_into_no_other_jobs_log(make_workflow, one_server):
    workdir = make_workflow(
        toy_files(LEAKY_SNAKEFILE, {"scripts/leaky.py": LEAKY, "scripts/after.py": AFTER})
    )
    run = context_run(workdir, "--context-scheduler-file", str(one_server)).check()
    assert "left 1 thread(s) still running (chatterbox" in run.output, run.output
    assert "file descriptor(s) still open" in run.output and "leaky.txt.kept" in run.output
    logs = workdir / ".snakemake" / "context" / "logs"
    (leaky_log,) = (logs / "leaky").glob("*.log")
    (after_log,) = (logs / "after").glob("*.log")
    after = after_log.read_text()
    assert "LEAKED" not in after, after
    assert "after's own print" in after
    # While the leaked thread lives, fd-level output goes to the cluster log (said so).
    assert "file-descriptor output" in after
    assert "left 1 thread(s) still running" in leaky_log.read_text()
    cluster_log = one_server.with_suffix(".log").read_text()
    assert "LEAKED-PRINT" in cluster_log and "LEAKED-FD" in cluster_log


PID_SCRIPT = """
import os
import threading
import time

if snakemake.rule == "leaky":
    threading.Thread(target=time.sleep, args=(30,), name="sleeper", daemon=True).start()
with open(snakemake.output[0], "w") as f:
    f.write(str(os.getpid()))
"""


def test_a_server_that_keeps_leaking_is_recycled(toy_workflow):
    workdir = toy_workflow(
        """
                rule all:
                    input: "leaky.txt", "after.txt"

                rule leaky:
                    output: "leaky.txt"
                    priority: 10
                    resources: context="toy"
                    script: "scripts/pid.py"

                rule after:
                    output: "after.txt"
                    resources: context="toy"
                    script: "scripts/pid.py"
            """,
        {
            "scripts/pid.py": PID_SCRIPT,
        },
    )
    run = context_run(
        workdir,
        "--context-servers",
        "1",
        "--context-tuning",
        "recycle_after_leaks=1",
        "--jobs",
        "1",
    ).check()
    assert (
        "restarts: 1 jobs left threads running (--context-tuning recycle_after_leaks)" in run.output
    )
    leaky, after = ((workdir / f"{name}.txt").read_text() for name in ("leaky", "after"))
    assert leaky != after  # the second job ran in a fresh server process
