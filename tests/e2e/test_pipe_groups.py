"""A failing pipe group ends the run, whatever the order its jobs start in.

Snakemake's local executor kills a failed pipe group's other shell commands, but only
those already started; the reader of a pipe that starts its command after the writer
failed blocks opening the FIFO forever, and the group's job process with it (the hang
of Snakemake's own ``test_pipes_fail``, one run in 10-20 here). The workflow below makes
that order certain: the reader's command is formatted slowly (3 s), so it starts after
the writer's syntax error has been handled."""

from __future__ import annotations

import textwrap

import psutil
import pytest

from tests.conftest import context_run

pytestmark = pytest.mark.slow

LATE_READER = textwrap.dedent(
    """
    import sys
    import threading
    import time

    import psutil


    class LateStart:
        \"\"\"In the group's job process (--mode remote), the reader's command starts
        after its group failed and before the FIFO is removed: formatted inside
        Snakemake's shell(), it waits for the failure's report; formatted by that
        report, it waits for the reader to block on the FIFO (at most 5 s).\"\"\"

        reader = threading.Event()
        failed = threading.Event()

        def __str__(self):
            job_process = "remote" in sys.argv
            if not job_process or threading.current_thread() is threading.main_thread():
                return "late"
            frame = sys._getframe(1)
            while frame is not None:
                code = frame.f_code
                if code.co_name == "__new__" and code.co_filename.endswith("shell.py"):
                    LateStart.reader.set()
                    LateStart.failed.wait(60)
                    return "late"
                frame = frame.f_back
            if LateStart.reader.wait(30) and not LateStart.failed.is_set():
                LateStart.failed.set()
                for _ in range(50):
                    children = psutil.Process().children(recursive=True)
                    if any(_blocked(child.pid) for child in children):
                        break
                    time.sleep(0.1)
            return "late"


    def _blocked(pid):
        try:
            with open(f"/proc/{pid}/wchan") as wchan:
                return wchan.read() == "wait_for_partner"
        except OSError:
            return False


    rule all:
        input:
            expand("test.{i}.out", i=range(2)),


    rule a:
        output:
            pipe("test.{i}.txt"),
        shell:
            "for i in {{0..2}}; ddo echo {wildcards.i} >> {output}; done"


    rule b:
        input:
            "test.{i}.txt",
        output:
            "test.{i}.out",
        params:
            late=LateStart(),
        shell:
            ": {params.late}; grep {wildcards.i} < {input} > {output}"
    """
)


def _left_in(workdir) -> list[str]:
    left = []
    for process in psutil.process_iter(["cwd", "cmdline"]):
        if process.info["cwd"] and process.info["cwd"].startswith(str(workdir)):
            left.append(" ".join(process.info["cmdline"] or []))
    return left


def test_a_failing_pipe_group_whose_reader_starts_late_ends(make_workflow):
    workdir = make_workflow({"Snakefile": LATE_READER})
    # Before the fix this run never ended (the helper's timeout fails the test).
    run = context_run(workdir, "--jobs", "2", "--context-servers", "2", timeout=120)
    assert run.returncode != 0, run.output
    assert run.output.count("Error in group") == 2, run.output
    assert "ddo" in run.output
    assert "Traceback" not in run.output, run.output
    assert not _left_in(workdir)
