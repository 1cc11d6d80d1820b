"""Context jobs that behave like real scripts: multiprocessing works in them as under
``snakemake --cores``, and what a job changes for its whole process (umask, resource
limits) ends with the job, as it would with the job's own process."""

from __future__ import annotations

import stat
import textwrap
from pathlib import Path

import pytest

from tests.conftest import HEADER, TOY_LOADER, context_run, persistent_cluster, snakemake, toy_files

pytestmark = pytest.mark.slow

CHILDREN_SNAKEFILE = textwrap.dedent("""
    DEFAULT = ["pool", "process", "executor", "dataloader"]
    OTHERS = ["spawn-pool", "spawn-process", "forkserver-pool", "forkserver-process"]

    rule all:
        input: expand("out/{kind}.txt", kind=DEFAULT + config.get("others", OTHERS))

    rule children:
        output: "out/{kind}.txt"
        resources: context="toy", runtime=2
        script: "scripts/children.py"
""")
# Every child computes from the job's own `snakemake` object: a child that did not
# get it, or did not run, changes the output.
CHILDREN = """
import concurrent.futures
import multiprocessing
import signal


def square(x):
    return x * x + len(snakemake.wildcards.kind)


def write_child(path):
    # A script's handlers, not the server's (which drains it on SIGTERM).
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    fresh = handlers == (signal.SIG_DFL, signal.default_int_handler)
    with open(path, "w") as f:
        f.write(f"child of {snakemake.wildcards.kind}, fresh handlers: {fresh}")


if __name__ == "__main__":
    method, _, kind = snakemake.wildcards.kind.rpartition("-")
    mp = multiprocessing.get_context(method or None)
    if kind == "pool":
        with mp.Pool(2) as pool:
            result = pool.map(square, range(5))
    elif kind == "process":
        child = mp.Process(target=write_child, args=(snakemake.output[0] + ".part",))
        child.start()
        child.join()
        with open(snakemake.output[0] + ".part") as part:
            result = part.read()
    elif kind == "executor":
        with concurrent.futures.ProcessPoolExecutor(2) as executor:
            result = list(executor.map(square, range(5)))
    else:
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            def __len__(self):
                return 6

            def __getitem__(self, i):
                return torch.tensor(square(i))

        loader = DataLoader(Squares(), batch_size=2, num_workers=2)
        result = sorted(int(x) for batch in loader for x in batch)
    with open(snakemake.output[0], "w") as f:
        f.write(f"{method or 'default'} {result}")
"""


def _children_workflow(make_workflow, name: str) -> Path:
    return make_workflow(
        toy_files(CHILDREN_SNAKEFILE, {"scripts/children.py": CHILDREN}),
        name=name,
    )


def _outputs(workdir: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted((workdir / "out").glob("*.txt"))}


def test_multiprocessing_in_context_jobs_as_under_the_local_executor(make_workflow):
    # The local executor's children of spawn and forkserver re-run the bare script
    # (NameError: snakemake), so it runs the default start method's kinds only.
    local = _children_workflow(make_workflow, "local")
    snakemake(local, "--cores", "2", "--config", "others=[]").check()
    context = _children_workflow(make_workflow, "context")
    context_run(context).check()
    expected = _outputs(local)
    assert set(expected) == {"pool.txt", "process.txt", "executor.txt", "dataloader.txt"}
    outputs = _outputs(context)
    assert {name: outputs[name] for name in expected} == expected
    assert expected["pool.txt"] == f"default {[x * x + 4 for x in range(5)]}"
    assert expected["process.txt"] == "default child of process, fresh handlers: True"
    # spawn and forkserver: each child gets the job's snakemake object too.
    for method in ("spawn", "forkserver"):
        pool = [x * x + len(f"{method}-pool") for x in range(5)]
        assert outputs[f"{method}-pool.txt"] == f"{method} {pool}"
        assert (
            outputs[f"{method}-process.txt"]
            == f"{method} child of {method}-process, fresh handlers: True"
        )


UNGUARDED_SNAKEFILE = textwrap.dedent("""
    rule unguarded:
        output: "unguarded.txt"
        resources: context="toy", runtime=2
        script: "unguarded.py"
""")
# Runs its work unguarded: each spawn child runs it again, and cannot start a child
# while it starts itself. The parent never sees why, only an exit code it ignores.
UNGUARDED = """
import multiprocessing

child = multiprocessing.get_context("spawn").Process(target=print, args=("child",))
child.start()
child.join()
open(snakemake.output[0], "w").write(f"the child exited {child.exitcode}")
"""


def test_a_child_that_cannot_start_fails_its_job_in_one_line(make_workflow):
    workdir = make_workflow(toy_files(UNGUARDED_SNAKEFILE, {"unguarded.py": UNGUARDED}))
    run = context_run(workdir)
    assert run.returncode != 0, run.output
    line = next(line for line in run.output.splitlines() if "could not start" in line)
    assert "Rule 'unguarded'" in line and "RuntimeError" in line, line
    assert "if __name__ == '__main__'" in line, line
    assert not (workdir / "unguarded.txt").exists()


PROCESS_WIDE_SNAKEFILE = textwrap.dedent("""
    rule all:
        input: "after.txt"

    rule change:
        output: "changed.txt"
        resources: context="toy"
        script: "change.py"

    rule after:
        input: "changed.txt"
        output: "after.txt"
        resources: context="toy"
        script: "after.py"
""")
# Lowers the soft limit on open files (the hard one too where asked: no unprivileged
# process can raise it again) and sets a umask that makes every new file world-writable.
CHANGE = """
import os
import resource

os.umask(0)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if snakemake.config.get("hard"):
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
else:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
open(snakemake.output[0], "w").write("changed")
"""
# Opens more files at once than the lowered limit allows.
AFTER = """
import os
import tempfile

with tempfile.TemporaryDirectory() as directory:
    files = [open(os.path.join(directory, str(i)), "w") for i in range(200)]
    for f in files:
        f.close()
open(snakemake.output[0], "w").write(f"opened {len(files)}")
"""
PLAIN_SNAKEFILE = textwrap.dedent("""
    rule all:
        input: "plain.txt", "context/1.txt"

    rule plain:
        output: "plain.txt"
        shell: "echo plain > {output}"

    include: "context.smk"
""")
CONTEXT_SMK = HEADER + textwrap.dedent("""
    rule context:
        output: "context/{i}.txt"
        resources: context="toy"
        script: "write.py"
""")
WRITE = """
with open(snakemake.output[0], "w") as f:
    f.write("written")
"""


def _world_writable(workdir: Path) -> list[str]:
    return [
        str(path.relative_to(workdir))
        for path in workdir.rglob("*")
        if not path.is_symlink() and path.stat().st_mode & stat.S_IWOTH
    ]


@pytest.mark.parametrize("hard", [False, True], ids=["soft-limit", "hard-limit"])
def test_a_jobs_umask_and_limits_end_with_it_on_a_persistent_cluster(
    make_workflow, tmp_path_factory, hard
):
    with persistent_cluster(tmp_path_factory.mktemp("cluster"), "--servers", "1") as path:
        attach = ("--context-scheduler-file", str(path))
        changer = make_workflow(
            toy_files(PROCESS_WIDE_SNAKEFILE, {"change.py": CHANGE, "after.py": AFTER}),
            name="changer",
        )
        run = context_run(changer, *attach, "--config", f"hard={int(hard)}").check()
        assert (changer / "after.txt").read_text() == "opened 200"
        if hard:  # the hard limit cannot be put back: the server restarts, and says why
            assert "RLIMIT_NOFILE was lowered to 64/64" in run.output, run.output
            assert "restarts" in run.output, run.output
        other = make_workflow(
            {
                "Snakefile": PLAIN_SNAKEFILE,
                "context.smk": CONTEXT_SMK,
                "loader.py": TOY_LOADER,
                "write.py": WRITE,
            },
            name="other",
        )
        context_run(other, *attach).check()
    assert (other / "context" / "1.txt").read_text() == "written"
    assert _world_writable(other) == []
