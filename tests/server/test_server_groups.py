"""Survival groups of servers (issue 39): the ``server_group`` option labels the servers
a cluster starts (one label, or LABEL:N counted out in the order they are planned), a
pilot's group is its queue and kind, each server says its group in ServerDescribed,
and ``snakemake-context inject --group`` kills only one group's servers."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_context.cluster.inject import servers_of_group
from snakemake_executor_context.cluster.process import LocalClusterProcess
from snakemake_executor_context.errors import ClusterError, SettingError
from snakemake_executor_context.executor.settings import ExecutorSettings
from snakemake_executor_context.pilots.arguments import pilot_settings_args
from snakemake_executor_context.pilots.request import PilotOptions
from snakemake_executor_context.server.config import PilotServerSettings
from snakemake_executor_context.settings.table import server_group_labels
from tests.conftest import BIN


def test_labels_are_counted_out_to_the_planned_servers_in_order() -> None:
    assert server_group_labels("a:1,b:2", 3) == ["a", "b", "b"]
    assert server_group_labels("short", 2) == ["short", "short"]
    assert server_group_labels("", 2) == ["", ""]
    with pytest.raises(SettingError) as raised:
        server_group_labels("a:1,b:1", 3)
    message = str(raised.value)
    for part in ("--server-group", "--context-tuning server_group", "'a:1,b:1'", "add up to 2"):
        assert part in message
    assert "plans 3" in message and "Fix: counts that add up to 3" in message


@pytest.mark.parametrize(
    ("spec", "part"),
    [
        ("a b", "'a b' is not a label"),
        ("a:1,b", "several labels need a count each"),
        ("a:0", "'a:0' is not LABEL:N"),
        ("a:x", "'a:x' is not LABEL:N"),
        ("gpu/short", "'gpu/short' is not a label"),
    ],
)
def test_a_bad_server_group_is_one_line_naming_the_setting(spec: str, part: str) -> None:
    with pytest.raises(SettingError) as raised:
        ExecutorSettings(tuning=[f"server_group={spec}"])
    assert str(raised.value).startswith(f"--context-tuning server_group {spec!r} is not allowed:")
    assert part in str(raised.value)


def test_up_refuses_a_bad_label_before_starting(tmp_path: Path) -> None:
    scheduler_file = tmp_path / "c.json"
    cli = str(BIN / "snakemake-context")
    done = subprocess.run(
        [cli, "up", "--scheduler-file", str(scheduler_file), "--server-group", "a,b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--server-group 'a,b' is not allowed: several labels need a count" in done.stderr
    assert not scheduler_file.exists()


@pytest.mark.usefixtures("batch_commands")
def test_a_pilots_group_is_its_label_else_its_queue_and_kind() -> None:
    options = PilotOptions(backend="slurm", queue="short", gpu_types=("a100", "v100"))
    kinds = [kind.server_settings() for kind in options.kinds()]
    assert [(s.group, s.partition, s.pool) for s in kinds] == [
        ("", "short", "a100"),
        ("", "short", "v100"),
    ]
    assert PilotServerSettings.from_wire(kinds[0].to_wire()) == kinds[0]
    config = kinds[0].server_config("pilot-a100-0", [], 2**30, allocated_at=None)
    assert (config.group, config.partition, config.pool) == ("", "short", "a100")
    untyped = PilotOptions(backend="slurm", group="long").server_settings()
    assert (untyped.group, untyped.partition, untyped.pool) == ("long", "", "pilot")
    serve = pilot_settings_args(
        ExecutorSettings(pilots=["backend=slurm"], tuning=["server_group=long"])
    )
    assert PilotOptions.from_json(serve[serve.index("--pilots") + 1]).group == "long"


def test_pilots_refuse_counted_labels() -> None:
    with pytest.raises(SettingError) as raised:
        pilot_settings_args(
            ExecutorSettings(pilots=["backend=slurm"], tuning=["server_group=a:1,b:1"])
        )
    assert "not allowed with a pool of pilots" in str(raised.value)
    assert "--context-tuning server_group" in str(raised.value)


def test_the_injector_picks_a_groups_servers_and_names_the_groups_there_are() -> None:
    seen: set[str] = set()
    groups = {"s0": "a", "s1": "b", "s2": "a"}
    assert servers_of_group(groups, "a", seen=seen, complete=True) == ["s0", "s2"]
    # Its servers all down for now: nothing to kill, no error.
    assert servers_of_group({"s1": "b"}, "a", seen=seen, complete=True) == []
    # Not every server answered yet: wait for the rest.
    assert servers_of_group({"s1": "b"}, "c", seen=set(), complete=False) == []
    with pytest.raises(ClusterError) as raised:
        servers_of_group({"s1": "b", "s0": ""}, "c", seen=set(), complete=True)
    assert "no server of that group" in str(raised.value)
    assert "'', 'b'" in str(raised.value)


# -- a real cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterProcess]:
    """A local cluster of two CPU servers labelled 'a' and 'b', as a run's embedded
    cluster is started (no catalog)."""
    scheduler_file = tmp_path_factory.mktemp("groups") / "cluster.json"
    local = LocalClusterProcess.start(
        scheduler_file,
        servers=2,
        memory_budget="0.8",
        timeout=90,
        extra_args=["--server-group", "a:1,b:1"],
    )
    try:
        yield local
    finally:
        local.stop()


def _client(local: LocalClusterProcess) -> Any:
    from distributed import Client

    from snakemake_executor_context.cluster.attach import resolve_target

    target = resolve_target(address=None, scheduler_file=local.files.scheduler_file)
    return Client(target.address, security=target.security, timeout=30, set_as_default=False)


@pytest.mark.slow
def test_each_planned_server_gets_its_label_and_the_hub_sees_it(
    labelled: LocalClusterProcess,
) -> None:
    from snakemake_executor_context.cluster.hub import fleet_snapshot
    from snakemake_executor_context.server.server import survival_group_here

    info = labelled.files.read_info()
    assert info is not None
    first, second = (server.name for server in info.servers)
    client = _client(labelled)
    try:
        names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
        groups = {names[a]: g for a, g in client.run(survival_group_here).items()}
        assert groups == {first: "a", second: "b"}
        # The hub's fleet counts each server's life in its group (ServerDescribed).
        deadline, alive = time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            snapshot = client.run_on_scheduler(fleet_snapshot)
            alive = snapshot["view"]["survival"]["alive"]
            if sorted(item[1] for item in alive.values()) == ["a", "b"]:
                break
            time.sleep(0.2)
        assert {names[a]: item[1] for a, item in alive.items()} == {first: "a", second: "b"}
    finally:
        client.close()


@pytest.mark.slow
def test_inject_with_a_group_kills_only_that_groups_servers(
    labelled: LocalClusterProcess, tmp_path: Path
) -> None:
    info = labelled.files.read_info()
    assert info is not None
    a_server = info.servers[0].name
    log = tmp_path / "kills.jsonl"
    inject = [
        str(BIN / "snakemake-context"),
        "inject",
        "--scheduler-file",
        str(labelled.files.scheduler_file),
        "--every",
        "0.2",
        "--count",
        "2",
        "--replace-after",
        "2",
    ]
    subprocess.run([*inject, "--group", "a", "--log", str(log)], check=True, timeout=60)
    kills = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(kill["server"], kill["group"]) for kill in kills] == [(a_server, "a")] * 2
    nobody = subprocess.run([*inject, "--group", "c"], capture_output=True, text=True, timeout=60)
    assert nobody.returncode == 1
    assert "no server of that group; the servers' groups are 'a', 'b'" in nobody.stderr


@pytest.mark.slow
def test_counts_that_do_not_add_up_stop_the_cluster_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ClusterError) as raised:
        LocalClusterProcess.start(
            tmp_path / "c.json",
            servers=2,
            memory_budget="0.8",
            timeout=60,
            extra_args=["--server-group", "a:1,b:2"],
        )
    assert "--server-group (--context-tuning server_group) 'a:1,b:2' is not allowed" in str(
        raised.value
    )
    assert "add up to 3 servers, but this cluster plans 2" in str(raised.value)
