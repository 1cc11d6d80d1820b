"""Every bad setting is one clear line at start: it names the setting, the value and
what is allowed, with no traceback from the plugin, no cluster started and no wait
(the connect timeout is set far beyond the command's own time limit: a run that
waited for it would be killed there and fail the test; no timing is asserted)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_context.cluster.credentials import Credentials
from snakemake_executor_context.cluster.process import LocalClusterProcess
from tests.conftest import BIN, snakemake

pytestmark = pytest.mark.slow

TRIVIAL = 'rule all:\n    output: "a.txt"\n    shell: "touch {output}"\n'
#: Seconds a run may take before it counts as hung (a guard, not a speed target).
HUNG = 120


@pytest.fixture(scope="module")
def trivial(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("trivial")
    (workdir / "Snakefile").write_text(TRIVIAL)
    return workdir


@pytest.fixture(scope="module")
def credentials(tmp_path_factory) -> Path:
    """Credentials of some cluster (not the one the address names)."""
    return Credentials.generate(tmp_path_factory.mktemp("creds") / "x.tls").directory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bad_run(workdir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    # Far beyond HUNG: a run that waited for its connection would be killed.
    wait = f"connect_timeout={10 * HUNG}"
    if "--context-tuning" in args:
        at = args.index("--context-tuning") + 1
        args = (*args[:at], wait, *args[at:])
    else:
        args = (*args, "--context-tuning", wait)
    run = snakemake(workdir, "--executor", "context", "--jobs", "1", *args, timeout=HUNG, env=env)
    assert run.returncode != 0, run.output
    assert "Traceback (most recent call last)" not in run.output, run.output
    assert not (workdir / "a.txt").exists()
    cluster = workdir / ".snakemake" / "context" / "cluster"
    assert not list(cluster.glob("*.json")), "a cluster was started before the refusal"
    return run.output


def _line(output: str, *parts: str) -> str:
    """The one line that holds every part."""
    lines = [
        line
        for line in output.splitlines()
        if all(part in line for part in parts) and not line.startswith("  Command:")
    ]
    assert len(lines) == 1, (parts, output)
    return lines[0]


#: Bad settings and the parts of the one line each gets, checked as Snakemake's own
#: argument parser and plugin registry build the settings (in-process).
BAD_SETTINGS = [
    (
        ["--context-contexts-memory", "abc"],
        ["--context-contexts-memory 'abc' is not allowed", "(0, 1]", "6GB"],
    ),
    (
        ["--context-contexts-memory", "1.5"],
        ["--context-contexts-memory '1.5' is not allowed", "(0, 1]"],
    ),
    (["--context-servers", "0"], ["--context-servers 0 is not allowed", "starts no servers"]),
    (["--context-servers", "-1"], ["--context-servers -1 is not allowed", "from 1 to 256"]),
    (
        ["--context-scheduler-address", "localhost"],
        ["--context-scheduler-address 'localhost' is not a scheduler address", "tls://"],
    ),
    (
        ["--context-scheduler-address", "tls://127.0.0.1:notaport"],
        ["--context-scheduler-address 'tls://127.0.0.1:notaport'", "allowed: tls://"],
    ),
    (
        ["--context-scheduler-address", "http://127.0.0.1:8786"],
        ["'http://127.0.0.1:8786' is not a scheduler address", "allowed: tls://"],
    ),
    (["--context-tuning", "connect_timeout=0"], ["--context-tuning connect_timeout 0", "above 0"]),
    # Snakemake would spin a core on this (its status checks without a pause).
    (
        ["--context-tuning", "status_interval=nan"],
        ["--context-tuning status_interval nan", "finite"],
    ),
    (
        ["--context-tuning", "batch_size=8"],
        ["--context-tuning 'batch_size=8' is not allowed: no tuning key 'batch_size'", "placement"],
    ),
    (["--context-slots", "100000"], ["--context-slots 100000", "from 1 to 256"]),
    (
        ["--context-pilots", "queue=gpu"],
        ["--context-pilots queue 'gpu' is not allowed without --context-pilots backend"],
    ),
    (
        ["--context-pilots", "backend=slurm", "walltime=99:99"],
        ["--context-pilots walltime '99:99'", "SLURM reads it as MM:SS, 01:41:00", "99 seconds"],
    ),
    # Was a traceback in the cluster's log, each server failing to make it.
    (
        ["--context-tuning", "own_caches=/proc/nope"],
        ["--context-tuning own_caches '/proc/nope' is not allowed: the directory /proc/nope"],
    ),
    (["--context-model-cache-size", "1e30"], ["--context-model-cache-size '1e30' is not allowed"]),
    # A pilot's job script expands it in double quotes: this ran on the node.
    (
        ["--context-model-cache", "/tmp/$(touch /tmp/x)"],
        ["--context-model-cache '/tmp/$(touch /tmp/x)' is not allowed", "only expansions are"],
    ),
    (["--context-tuning", "peer_mbps=1e-9"], ["--context-tuning peer_mbps 1e-09 is not allowed"]),
    # Was taken as the default catalog, silently.
    (["--context-catalog", ""], ["--context-catalog '' is not allowed"]),
    (
        ["--context-catalog", "nosuch://host/db"],
        ["--context-catalog 'nosuch://host/db'", "SQLAlchemy knows no database", "Fix:"],
    ),
    (["--context-catalog", "sqlite:////"], ["--context-catalog 'sqlite:////'", "a directory"]),
]


def _settings_error(args: list[str]) -> str:
    """The error building the executor's settings from ``args`` raises, as Snakemake
    builds them (its parser, its plugin registry)."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from snakemake_executor_context.errors import ContextExecutorError

    _, parsed = parse_args(["--executor", "context", "--jobs", "1", *args])
    with pytest.raises(ContextExecutorError) as caught:
        ExecutorPluginRegistry().get_plugin("context").get_settings(parsed)
    return str(caught.value)


@pytest.mark.parametrize(("args", "parts"), BAD_SETTINGS)
def test_bad_setting_is_one_line(args, parts):
    message = _settings_error(args)
    assert "\n" not in message and all(part in message for part in parts), message


def test_directories_that_cannot_be_used_are_refused_making_nothing(tmp_path):
    """A cache directory below a file, and a local directory that does not exist: one
    line each, and nothing made above them (the plugin makes nothing above its
    private directory)."""
    (tmp_path / "Snakefile").write_text(TRIVIAL)
    below_a_file = f"own_caches={tmp_path}/Snakefile/caches"
    message = _settings_error(["--context-tuning", below_a_file])
    assert "/Snakefile/caches' is not allowed: the directory" in message, message
    message = _settings_error(["--context-local-dir", str(tmp_path / "missing" / "dir")])
    assert "/missing/dir' is not allowed: no such directory" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Snakefile"]


@pytest.mark.parametrize(
    "args", [["--context-servers", "0"], ["--context-tuning", "own_caches=/proc/nope"]]
)
def test_a_setting_refused_on_snakemakes_command_line_is_all_it_prints(trivial, args):
    """Snakemake prints an error raised while its command line builds the settings with
    the error's class and the plugin's frames around it (4 lines): the refusal is
    the one line the run prints, and its exit status 1."""
    run = snakemake(trivial, "--executor", "context", "--jobs", "1", *args, timeout=HUNG)
    assert run.returncode == 1, run.output
    assert run.output.count("\n") == 1 and " is not allowed: " in run.output, run.output


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        # Where the run would attach, read with the settings (no connection yet).
        (
            ["--context-scheduler-address", "tcp://127.0.0.1:8786"],
            ["is a plaintext scheduler", "--context-allow-plaintext"],
        ),
        (
            ["--context-scheduler-address", "tls://127.0.0.1:8786"],
            ["needs its cluster's credentials", "--context-credentials"],
        ),
    ],
)
def test_a_bad_setting_reaches_the_terminal_as_one_line_and_starts_nothing(trivial, args, parts):
    output = _bad_run(trivial, *args)
    assert output.count("\n") == 1, output  # with the settings: nothing else is printed
    _line(output, *parts)


@pytest.mark.parametrize("scheme", ["tls", "tcp"])
def test_refused_connection_is_one_line_at_once(trivial, credentials, scheme):
    port = _free_port()
    extra = (
        ["--context-credentials", str(credentials)]
        if scheme == "tls"
        else ["--context-allow-plaintext"]
    )
    output = _bad_run(
        trivial,
        "--context-scheduler-address",
        f"{scheme}://127.0.0.1:{port}",
        *extra,
    )
    _line(output, "nothing listens at", f"127.0.0.1:{port} (connection refused)")


def test_unreachable_scheduler_is_one_line_at_once(trivial, credentials):
    """A documentation address (RFC 5737): depending on the network, the connection
    hangs, is refused by a router, or is accepted by a proxy that never answers;
    or is taken by a proxy that answers TLS with its own certificate (as in the sandbox
    where this was written); each ends in one line within the probe's 1.5 s."""
    output = _bad_run(
        trivial,
        "--context-scheduler-address",
        "tls://203.0.113.9:8786",
        "--context-credentials",
        str(credentials),
    )
    line = _line(output, "--context-scheduler-address", "203.0.113.9:8786")
    assert any(
        words in line
        for words in (
            "could not be reached",
            "did not answer",
            "nothing listens",
            "does not speak TLS",
            "do not match the server",
        )
    ), line


def test_truncated_scheduler_file_is_one_line(trivial, tmp_path):
    scheduler_file = tmp_path / "cut.json"
    scheduler_file.write_text('{"type": "Scheduler", "address": "tls://127.0.')
    output = _bad_run(trivial, "--context-scheduler-file", str(scheduler_file))
    _line(output, f"--context-scheduler-file {scheduler_file} is not a Dask scheduler file")


def test_scheduler_file_of_a_stopped_cluster_is_one_line(trivial, tmp_path):
    """A cluster killed outright leaves its scheduler file and credentials behind."""
    local = LocalClusterProcess.start(
        tmp_path / "gone" / "scheduler.json", servers=1, memory_budget="0.8", timeout=90
    )
    os.killpg(local.pid, signal.SIGKILL)
    assert local.process is not None
    local.process.wait(timeout=10)
    scheduler_file = local.files.scheduler_file
    assert scheduler_file.exists() and local.files.credentials.key_file.exists()
    output = _bad_run(trivial, "--context-scheduler-file", str(scheduler_file))
    _line(output, "nothing listens at", f"The cluster that wrote {scheduler_file} has stopped")


def test_credentials_that_do_not_match_are_one_line(trivial, scheduler_file, credentials):
    address = json.loads(scheduler_file.read_text())["address"]
    output = _bad_run(
        trivial,
        "--context-scheduler-address",
        address,
        "--context-credentials",
        str(credentials),
    )
    _line(output, f"the credentials in {credentials} do not match the server at {address}")


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (["--servers", "257"], ["--servers 257 is not allowed", "from 1 to 256"]),
        (["--servers", "-1"], ["--servers -1 is not allowed", "from 1 to 256"]),
        (["--contexts-memory", "abc"], ["--contexts-memory 'abc' is not allowed", "6GB"]),
        (["--idle-timeout=-5"], ["--idle-timeout -5.0 is not allowed", "(0: never)"]),
        (["--timeout", "0"], ["--timeout 0.0 is not allowed", "above 0"]),
        (["--queue", "gpu"], ["--queue 'gpu' is not allowed without --backend"]),
        (["--interface", "nope0"], ["--interface nope0: this node's interface nope0 does not"]),
    ],
)
def test_up_with_a_bad_setting_is_one_line(tmp_path, args, parts):
    scheduler_file = tmp_path / "scheduler.json"
    done = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    _line(done.stderr, "snakemake-context: ", *parts)
    assert not scheduler_file.exists()


# -- every setting, walked ------------------------------------------------------------

#: Settings that take any text: nothing about their value alone can be refused at
#: start, and each is checked where it is used (with its own one-line test).
FREE_TEXT = {
    "scheduler_file": "a path, read when attaching (test_truncated_scheduler_file_is_one_line)",
    "agnostic": "a switch with no combination to refuse",
    "interface": "an interface's name, looked up on the node where the scheduler starts "
    "(test_up_with_a_bad_setting_is_one_line)",
    "survival_placement": "a switch with no combination to refuse",
    "report": "a switch; a ledger that cannot be written is a warning, never a failed run",
    "tuning": "its words are the tuning keys, each walked here as a setting of its own",
    "pilots": "its words are the pilot request's keys, each walked here likewise",
    "interface_up": "likewise (test_up_with_a_bad_setting_is_one_line)",
}
#: A value that the further check (``form``) of a setting refuses; others: "localhost".
FORM_BAD = {
    "local_dir": "/nonexistent/dir",
    "own_caches": "/proc/nope",
    "model_cache": "",
    "catalog": "",
    "server_group": "short:0",
}


def _argv(case: list[str]) -> list[str]:
    """A case's arguments, its keys gathered behind one --context-pilots and one
    --context-tuning."""
    plain: list[str] = []
    keyed: dict[str, list[str]] = {"--context-pilots": [], "--context-tuning": []}
    for arg in case:
        flag, _, word = arg.partition(" ")
        if flag in keyed and word:
            keyed[flag].append(word)
        else:
            plain.append(arg)
    return plain + [arg for flag, words in keyed.items() if words for arg in (flag, *words)]


def _bad_values(setting, flag_of) -> list[list[str]]:
    """Command-line arguments that ``setting`` must refuse, from what it declares:
    out of range, non-finite and malformed values, and bad combinations."""
    from snakemake_executor_context.settings import checks as a

    spec, flag = setting.allowed, setting.flag
    backend = [f"{flag_of('backend')}=slurm"] if spec.needs == ("backend",) else []
    cases: list[list[str]] = []
    if spec.kind in (a.WHOLE, a.NUMBER):
        if spec.least is not None:
            # 0 is allowed whatever the bounds where it has a meaning (spec.zero).
            low = spec.least / 2 if spec.zero and spec.least == 1 else spec.least - 1
            cases.append([f"{flag}={low!r}"])
        if spec.above is not None:
            cases.append([f"{flag}={spec.above!r}"])
        if spec.most is not None:
            cases.append([f"{flag}={spec.most + 1!r}"])
        cases += [[f"{flag}=nan"], [f"{flag}=inf"], [f"{flag}=-inf"], [f"{flag}=many"]]
        if spec.kind == a.WHOLE:
            cases.append([f"{flag}=1.5"])
        cases = [[*backend, *case] for case in cases]
    elif spec.kind == a.SIZE:
        values = [
            "0",
            "-1GB",
            "lots",
            "nan",
            "1kB",
            *([f"{2 * spec.most:.0f}"] if spec.most else []),
        ]
        cases = [[*backend, f"{flag}={value}"] for value in values]
    elif spec.kind == a.BUDGET:
        cases = [[f"{flag}={value}"] for value in ("0", "1.5", "nan", "inf", "abc")]
    elif spec.kind == a.WALLTIME:
        cases = [[*backend, f"{flag}={value}"] for value in ("99:99", "2h", "0", "1-30:00")]
    elif spec.choices:
        cases = [[f"{flag}=nonsense"]]
    elif spec.form is not None:
        cases = [[f"{flag}={FORM_BAD.get(setting.name, 'localhost')}"]]
    if spec.kind == a.FLAG:
        given = [flag]
    elif spec.kind == a.WHOLE:
        given = [f"{flag}={int(setting.default or 0) + 1}"]
    else:
        given = [
            f"{flag}={ {a.WALLTIME: '02:00:00', a.SIZE: '2GB', a.NUMBER: '1'}.get(spec.kind, 'x') }"
        ]
    if spec.needs:
        cases.append(given)  # without what it needs
    if spec.conflicts:
        cases.append([*given, f"{flag_of(spec.conflicts[-1])}=/nowhere/scheduler.json"])
    if spec.at_most:
        cases.append([*backend, f"{flag}=5", f"{flag_of(spec.at_most)}=2"])
    if spec.below_walltime:
        cases.append([*backend, f"{flag}=600", f"{flag_of(spec.below_walltime)}=00:05:00"])
    return cases


def test_every_executor_setting_refuses_bad_values_in_one_line_naming_it(tmp_path):
    """Every field of ExecutorSettings, every key of the pilot request and of the
    tuning, through Snakemake's own
    argument parser and plugin registry: each bad value or combination is one line
    naming the setting."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from snakemake_executor_context.errors import ContextExecutorError
    from snakemake_executor_context.executor.settings import (
        ExecutorSettings,
        PilotRequest,
        Tuning,
        settings_table,
    )

    table = {setting.name: setting for setting in settings_table()}
    classes = (ExecutorSettings, PilotRequest, Tuning)
    fields = [item for cls in classes for item in dataclasses.fields(cls)]
    assert set(table) == {f.name for f in fields}
    plugin = ExecutorPluginRegistry().get_plugin("context")
    walked = 0
    for setting in table.values():
        cases = _bad_values(setting, lambda name: table[name].flag)
        if not cases:
            assert setting.name in FREE_TEXT, setting
            continue
        for case in cases:
            _, args = parse_args(["--executor", "context", "--jobs", "1", *_argv(case)])
            with pytest.raises(ContextExecutorError) as caught:
                plugin.get_settings(args)
            message = str(caught.value)
            assert "\n" not in message and message.startswith(setting.flag), (case, message)
            walked += 1
    assert walked > 150


def test_every_up_flag_refuses_bad_values_in_one_line_naming_it(tmp_path, capsys):
    from snakemake_executor_context import cli

    table = cli._parser().parse_args(["up"])._allowed_settings
    scheduler_file = tmp_path / "scheduler.json"
    walked = 0
    for setting in table.values():
        cases = _bad_values(setting, lambda name: table[name].flag)
        if not cases:
            assert f"{setting.name}_up" in FREE_TEXT, setting
            continue
        for case in cases:
            code = cli.main(["up", "--scheduler-file", str(scheduler_file), *case])
            out, err = capsys.readouterr()
            assert code == 1 and not out, (case, out, err)
            assert err.count("\n") == 1, (case, err)
            assert err.startswith(f"snakemake-context: {setting.flag} "), (case, err)
            assert not scheduler_file.exists()
            walked += 1
    assert walked > 100


def test_an_unusable_catalog_path_names_the_catalog_setting(tmp_path):
    """The fix offered for a catalog path that cannot be used names the setting that
    chose it (not --scheduler-file, as it did)."""
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(TRIVIAL)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    catalog = blocked / "sub" / "catalog.db"
    run = snakemake(
        workdir, "--executor", "context", "--jobs", "1", "--context-catalog", str(catalog)
    ).check()
    line = _line(run.output, "The run goes on without recording into the catalog")
    assert "--context-catalog" in line and "--scheduler-file" not in line, line
    done = subprocess.run(
        [
            str(BIN / "snakemake-context"),
            *("up", "--scheduler-file", str(tmp_path / "c" / "scheduler.json")),
            *("--catalog", str(catalog)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "choose another --catalog" in done.stderr and "--scheduler-file" not in done.stderr


#: Catalogs that can never be one (each was a run without a catalog, after a garbled
#: warning), and what the one line says.
NO_CATALOGS = [
    ("/", "is not allowed: it is a directory. Fix: name a file in it"),
    ("/proc/self/mem", "is not allowed: it is on proc, a filesystem of the kernel's"),
    ("postgresql+psycopg2://u:p@127.0.0.1:1/x", "its driver psycopg2 is not installed"),
]


@pytest.mark.parametrize(("catalog", "says"), NO_CATALOGS)
def test_a_catalog_that_can_never_be_one_is_refused_at_start(trivial, catalog, says):
    if "psycopg2" in catalog and importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed")
    output = _bad_run(trivial, "--context-catalog", catalog)
    line = _line(output, "--context-catalog '", says, "Fix:")
    assert "u:p@" not in output, line  # the URL's password is not repeated


def test_up_refuses_a_catalog_that_can_never_be_one_and_reading_a_new_one_makes_nothing(
    tmp_path, capsys
):
    """`up --catalog` refuses one in one line before anything is made; the executor's
    settings with a catalog not yet made (as ``snakemake -n`` reads them) make none."""
    from snakemake_executor_context import cli
    from snakemake_executor_context.executor.settings import ExecutorSettings

    scheduler_file = tmp_path / "c" / "scheduler.json"
    code = cli.main(["up", "--scheduler-file", str(scheduler_file), "--catalog", "/proc/self/mem"])
    out, err = capsys.readouterr()
    assert code == 1 and not out and err.count("\n") == 1, err
    assert err.startswith("snakemake-context: --catalog '/proc/self/mem' is not allowed"), err
    ExecutorSettings(catalog=str(tmp_path / "new" / "catalog.db"))
    assert list(tmp_path.iterdir()) == []


def test_cache_directories_are_checked_with_the_settings_and_made_by_none_of_them(tmp_path):
    """The embedded cluster's model cache and directory of per-server caches are
    checked while the settings are read (what cannot be made is refused there), but
    made only where the servers start: reading the settings (as ``snakemake -n``
    does) leaves nothing on disk. A pilot's are on its node, and an attached
    cluster's are its own: neither is checked on this host."""
    from snakemake_executor_context.errors import SettingError
    from snakemake_executor_context.executor.settings import ExecutorSettings

    node_local = tmp_path / "node-local" / "caches"
    own = [f"own_caches={node_local}"]
    ExecutorSettings(tuning=own, pilots=["backend=slurm"])
    ExecutorSettings(tuning=own, scheduler_address="tcp://127.0.0.1:1", allow_plaintext=True)
    ExecutorSettings(tuning=own)
    ExecutorSettings(model_cache=str(tmp_path / "node-local" / "models"))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SettingError, match="--context-tuning own_caches '/proc/nope' is not"):
        ExecutorSettings(tuning=["own_caches=/proc/nope"])
    with pytest.raises(SettingError, match="--context-model-cache '/proc/nope' is not allowed"):
        ExecutorSettings(model_cache="/proc/nope")
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(SettingError, match="mode 0777: every user may change what it holds"):
        ExecutorSettings(model_cache=str(open_to_all))
    assert open_to_all.stat().st_mode & 0o7777 == 0o777


def test_named_directories_are_used_as_they_are_by_a_dry_run_and_a_run(toy_workflow, tmp_path):
    """A lab's group-shared model cache (2775) and a readable directory of per-server
    caches (0755) keep their modes and setgid bit through ``snakemake -n`` and a real
    run; the run says once what the group can do in the cache."""
    workdir = toy_workflow(
        """
        rule all:
            input: "out.txt"

        rule use:
            output: "out.txt"
            resources: context="toy"
            script: "scripts/use.py"
        """
    )
    lab = tmp_path / "lab"
    models, own = lab / "models", lab / "own"
    for directory, mode in ((models, 0o2775), (own, 0o755)):
        directory.mkdir(parents=True)
        directory.chmod(mode)
    flags = ["--context-model-cache", str(models), "--context-tuning", f"own_caches={own}"]
    dry = snakemake(workdir, "-n", "--executor", "context", "--jobs", "1", *flags, timeout=HUNG)
    assert dry.returncode == 0, dry.output
    assert (models.stat().st_mode & 0o7777, own.stat().st_mode & 0o7777) == (0o2775, 0o755)
    assert list(own.iterdir()) == [] and list(models.iterdir()) == []
    run = snakemake(workdir, "--executor", "context", "--jobs", "1", *flags, timeout=HUNG)
    assert run.returncode == 0, run.output
    assert (models.stat().st_mode & 0o7777, own.stat().st_mode & 0o7777) == (0o2775, 0o755)
    line = _line(run.output, "--context-model-cache:", "(mode 2775) is shared")
    assert "the members of group" in line and "may add, replace and remove" in line, line
    assert not [line for line in run.output.splitlines() if "own_caches:" in line]


# -- the environment variables a user exports ----------------------------------------

#: A name that is not UTF-8 (as os.environb sets it; Python reads it with surrogates).
NOT_UTF8 = b"/tmp/snakemake-context-\xff-dir"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "nan"),
        ("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "-1"),
        ("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "1e309"),
        ("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "abc"),
        ("SNAKEMAKE_CONTEXT_MEMORY_CAP", "1e400"),
        ("SNAKEMAKE_CONTEXT_MEMORY_CAP", "1B"),
        ("SNAKEMAKE_CONTEXT_MEMORY_CAP", "nan"),
        ("SNAKEMAKE_CONTEXT_LOCAL_DIR", NOT_UTF8),
        ("SNAKEMAKE_CONTEXT_LOCAL_DIR", "/nonexistent/snakemake-context-dir"),
        ("SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS", "-1"),
        ("SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS", "abc"),
        ("SNAKEMAKE_CONTEXT_MODEL_CACHE_SIZE", "abc"),
        ("SNAKEMAKE_CONTEXT_MODEL_CACHE", NOT_UTF8),
        # Inherited: a benchmark sets it to its own pid for the one run it starts.
        ("SNAKEMAKE_CONTEXT_BENCH_NO_TLS", "1"),
    ],
)
def test_a_bad_variable_is_refused_with_the_settings(monkeypatch, name, value):
    """Each variable is checked while Snakemake reads the executor's settings (before
    anything is made): one line naming it, its value, what is allowed and the fix."""
    from snakemake_executor_context.errors import SettingError
    from snakemake_executor_context.executor.settings import ExecutorSettings

    if isinstance(value, bytes):
        monkeypatch.setitem(os.environb, name.encode(), value)
    else:
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as caught:
        ExecutorSettings()
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(f"{name}={value!r} is not allowed: "), message
    assert "Fix: export " in message and "or unset it" in message, message


def test_good_variables_mean_what_they_meant(monkeypatch, tmp_path):
    """What the start check allows, every reader takes the same way."""
    from snakemake_executor_context import paths
    from snakemake_executor_context.executor.settings import ExecutorSettings
    from snakemake_executor_context.modelcache import cacheroom, entries, staging
    from snakemake_executor_context.server.policy import ServerLimits

    def limits(**env: str) -> ServerLimits:
        return ServerLimits.from_environment(
            {f"SNAKEMAKE_CONTEXT_{key}": value for key, value in env.items()}
        )

    assert limits() == ServerLimits(None, 3)
    assert limits(MEMORY_CAP="8GB").memory_cap == 8_000_000_000
    assert limits(MEMORY_CAP="2GiB").memory_cap == 2**31
    for none in ("none", "0", "", "off"):
        assert limits(MEMORY_CAP=none).memory_cap is None
    assert limits(RECYCLE_AFTER_LEAKS="0").recycle_after == 0
    assert limits(RECYCLE_AFTER_LEAKS="7").recycle_after == 7
    for value, rate in (("0", 0.0), ("50", 50e6), ("0.5", 5e5), ("", 0.0)):
        monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", value)
        assert staging._rate() == rate
    monkeypatch.delenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS")
    assert staging._rate() == 0.0
    for value, size in (("20GB", 20_000_000_000), (str(10 * 2**20), 10 * 2**20), ("0", None)):
        monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE_SIZE", value)
        assert cacheroom.cache_limit() == size
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(tmp_path / "models"))
    assert entries.cache_root() == tmp_path / "models"
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path))
    assert paths.local_base() == tmp_path
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MEMORY_CAP", "8GB")
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS", "0")
    ExecutorSettings()  # every value above is allowed at start too


def test_a_bad_variable_in_a_reader_is_one_line(monkeypatch):
    """A server started by other means reads the variables the same way: a value the
    start check refuses fails there in the same one line, never as no cap."""
    from snakemake_executor_context.errors import ContextLoadError, SettingError
    from snakemake_executor_context.modelcache import staging
    from snakemake_executor_context.server.policy import ServerLimits

    for bad in ("1e400", "nan", "1B", "-5GB"):
        with pytest.raises(SettingError, match=f"SNAKEMAKE_CONTEXT_MEMORY_CAP='{bad}'"):
            ServerLimits.from_environment({"SNAKEMAKE_CONTEXT_MEMORY_CAP": bad})
    for bad in ("nan", "-1", "1e309", "inf"):
        monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", bad)
        with pytest.raises(ContextLoadError, match=f"SNAKEMAKE_CONTEXT_SOURCE_MBPS='{bad}'"):
            staging._rate()


def test_memory_cap_kill_message_names_the_variable_too():
    from snakemake_executor_context.server.policy import memory_message

    message = memory_message(2**30, 2**31)
    assert "(--context-server-memory, or SNAKEMAKE_CONTEXT_MEMORY_CAP)" in message, message


def test_a_bad_variable_stops_snakemake_in_one_line_creating_nothing(tmp_path):
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(TRIVIAL)
    local = tmp_path / "local"
    local.mkdir()
    run = snakemake(
        workdir,
        "--executor",
        "context",
        "--jobs",
        "1",
        timeout=HUNG,
        env={"SNAKEMAKE_CONTEXT_MEMORY_CAP": "1B", "SNAKEMAKE_CONTEXT_LOCAL_DIR": str(local)},
    )
    assert run.returncode == 1, run.output
    assert "Traceback (most recent call last)" not in run.output, run.output
    line = _line(run.output, "SNAKEMAKE_CONTEXT_MEMORY_CAP='1B' is not allowed")
    assert "at least" in line and "Fix: export a size such as 8GB, or unset it" in line
    assert not (workdir / ".snakemake" / "context").exists()
    assert not (workdir / "a.txt").exists()
    assert not list(local.iterdir()), "a private directory was made"


def test_an_inherited_switch_never_turns_tls_off_and_a_benchmarks_does_for_its_run(trivial):
    """``SNAKEMAKE_CONTEXT_BENCH_NO_TLS=1`` inherited from a profile, a module file or a
    shell's export stops the run in one line before any cluster starts (it turned off
    every credential check of the run's cluster); set to the pid of the process that
    starts snakemake, as the benchmark does, that one run goes without TLS, saying so."""
    output = _bad_run(trivial, env={"SNAKEMAKE_CONTEXT_BENCH_NO_TLS": "1"})
    line = _line(output, "SNAKEMAKE_CONTEXT_BENCH_NO_TLS='1' is not allowed")
    assert "honoured only as the pid of the process that started this one" in line, line
    plain = snakemake(
        trivial,
        *("--executor", "context", "--jobs", "1", "--forcerun", "all"),
        timeout=HUNG,
        env={"SNAKEMAKE_CONTEXT_BENCH_NO_TLS": str(os.getpid())},
    )
    assert plain.returncode == 0, plain.output
    _line(plain.output, "embedded cluster runs WITHOUT TLS")
    (trivial / "a.txt").unlink()


def test_a_bad_variable_stops_up_in_one_line_creating_nothing(tmp_path):
    import psutil

    scheduler_file = tmp_path / "cluster" / "scheduler.json"
    local = tmp_path / "local"
    local.mkdir()
    done = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "SNAKEMAKE_CONTEXT_SOURCE_MBPS": "nan",
            "SNAKEMAKE_CONTEXT_LOCAL_DIR": str(local),
        },
    )
    assert done.returncode == 1, done
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    _line(done.stderr, "snakemake-context: SNAKEMAKE_CONTEXT_SOURCE_MBPS='nan' is not allowed")
    assert not scheduler_file.parent.exists()
    assert not list(local.iterdir()), "a private directory was made"
    left = [
        process.pid
        for process in psutil.process_iter(["cmdline"])
        if str(scheduler_file) in " ".join(process.info["cmdline"] or [])
    ]
    assert not left, left
