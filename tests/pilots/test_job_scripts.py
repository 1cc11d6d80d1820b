"""What a pilot's job script holds, for every batch system, made from the settings as a
run gives them (``--context-pilots``) and as ``snakemake-context up`` takes them: the
lines the plugin writes and the user's values inside them, and no line of a value's own
(a newline in ``queue=gpu\\ntouch /tmp/x`` wrote ``touch /tmp/x`` after ``#SBATCH -p gpu``:
sbatch reads no directive after the first command, so the pilot's memory, walltime and
GPUs were silently dropped; security issue 66)."""

from __future__ import annotations

import re
import subprocess

import dask_jobqueue
import pytest

from snakemake_executor_context.errors import SettingError
from snakemake_executor_context.executor.settings import ExecutorSettings
from snakemake_executor_context.pilots.arguments import pilot_settings_args
from snakemake_executor_context.pilots.batch.registry import BACKENDS
from snakemake_executor_context.pilots.request import PilotOptions, jobqueue_arguments
from snakemake_executor_context.settings.table import PILOT_KEYS, up_flag
from tests.conftest import BIN

#: Each shell script's directive prefix (HTCondor's is a submit description instead).
DIRECTIVE = {"slurm": "#SBATCH ", "sge": "#$ ", "pbs": "#PBS ", "lsf": "#BSUB "}
#: A directive each system reads (Grid Engine's parallel environment: its cores).
DIRECTIVES = {
    "slurm": "--constraint=ib",
    "sge": "-pe smp 4",
    "pbs": "-l place=scatter",
    "lsf": '-R "select[mem>8000]"',
    "htcondor": "priority = 5",
}
#: A value of every key that lands in the job script, but the prologue's shell lines.
BENIGN = [
    "queue=gpu", "account=proj7", "qos=high", "walltime=02:00:00", "gpus=2",
    "gpu_type=a100", "cores=4", "memory=8GB", "nodes=1", "min=0", "max=2",
    "prologue=module load cuda",
]  # fmt: skip
#: Lines a hostile value would add to the script.
HOSTILE = "x\ntouch /tmp/injected"
#: Every key of --context-pilots whose value must be one line (the prologue is shell lines).
ONE_LINE_KEYS = sorted(key for key in PILOT_KEYS if key != "prologue")


def _script(backend: str, words: list[str]) -> tuple[str, list[str]]:
    """The job script a run with ``--context-pilots backend=BACKEND WORDS...`` submits
    (through the settings' checks and the cluster process's arguments), and the shell
    lines the plugin puts after the directives (its prologue)."""
    settings = ExecutorSettings(
        pilots=[f"backend={backend}", *words, f"directive={DIRECTIVES[backend]}"]
    )
    serve = pilot_settings_args(settings)
    options = PilotOptions.from_json(serve[serve.index("--pilots") + 1])
    name, kwargs = jobqueue_arguments(options, python="/shared/venv/bin/python")
    # The credentials and the interface are the cluster's (tested in test_pilots.py).
    kwargs = {k: v for k, v in kwargs.items() if k not in ("security", "interface")}
    job = getattr(dask_jobqueue, name).job_cls(scheduler="tls://127.0.0.1:1", name="p", **kwargs)
    return job.job_script(), kwargs["job_script_prologue"]


def _check_lines(backend: str, script: str, prologue: list[str]) -> None:
    """Every line is the plugin's: a shell script's directives all before its first
    command, then the prologue and the worker's command, nothing else; a submit
    description's lines each ``key = value`` (or ``Queue``)."""
    lines = [line for line in script.splitlines()[1:] if line.strip()]
    assert not any(line.startswith("touch") for line in lines), script
    if backend == "htcondor":
        for line in lines:
            assert line == "Queue" or re.match(r"[A-Za-z_+.-][\w.+-]*\s*=", line), (line, script)
        return
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert all(line.startswith(DIRECTIVE[backend]) for line in lines[:first]), script
    # The last line: the worker's command.
    assert lines[first:-1] == "\n".join(prologue).splitlines(), script
    assert lines[-1].startswith("/shared/venv/bin/python -P -m distributed.cli.dask_worker")


@pytest.mark.usefixtures("batch_commands")
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_no_pilot_value_adds_a_line_to_the_job_script(backend: str) -> None:
    script, prologue = _script(backend, BENIGN)
    _check_lines(backend, script, prologue)
    assert "module load cuda" in prologue
    for key in ONE_LINE_KEYS:
        flag = f"--context-pilots {key}"
        try:
            script, prologue = _script(backend, [*BENIGN, f"{key}={HOSTILE}"])
        except SettingError as error:  # refused before any script is made
            message = str(error)
            assert "\n" not in message and message.startswith(flag), message
            assert "one line without control characters" in message or key in (
                "backend", "gpus", "cores", "nodes", "min", "max",
            ), message  # fmt: skip
            continue
        _check_lines(backend, script, prologue)
        pytest.fail(f"{flag} {HOSTILE!r} was taken: {script}")


@pytest.mark.usefixtures("batch_commands")
def test_a_prologue_may_be_shell_lines() -> None:
    script, prologue = _script("slurm", [*BENIGN, "prologue=module load cuda\nmodule list"])
    assert "module load cuda\nmodule list" in prologue
    _check_lines("slurm", script, prologue)


@pytest.mark.parametrize("name", ["pilot_queue", "pilot_directives", "pilot_gpu_types"])
def test_up_refuses_a_pilot_flag_of_several_lines_in_one_line(tmp_path, name: str) -> None:
    scheduler_file = tmp_path / "scheduler.json"
    flag = up_flag(name)
    done = subprocess.run(
        [
            str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler_file),
            "--backend", "slurm", flag, "gpu\ntouch /tmp/injected",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{flag} " in done.stderr and "one line without control characters" in done.stderr
    assert not scheduler_file.exists()
