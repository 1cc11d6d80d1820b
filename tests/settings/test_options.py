"""Every server and pilot option declared once (:mod:`snakemake_executor_context.settings.table`):
the front ends made from the table say what it says (the executor's settings, which
Snakemake reads as a dataclass, `up`'s flags, the servers' shape, the pilots' options),
and the servers' settings reach a pilot's server as one typed record."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

import pytest

from snakemake_executor_context.executor.settings import ExecutorSettings, PilotRequest, Tuning
from snakemake_executor_context.pilots.arguments import pilot_settings_args
from snakemake_executor_context.pilots.request import PilotOptions
from snakemake_executor_context.server.config import PilotServerSettings
from snakemake_executor_context.settings.shape import Shape
from snakemake_executor_context.settings.table import (
    OPTIONS,
    SERVER,
    executor_flag,
    option,
    options_of,
    setting_default,
    up_flag,
)


def _up_parser() -> argparse.ArgumentParser:
    from snakemake_executor_context import cli

    commands = next(
        action
        for action in cli._parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return commands.choices["up"]


def test_the_executors_settings_are_the_tables_options() -> None:
    """ExecutorSettings stays a dataclass (Snakemake reads its fields and their types at
    run time): each option field has the table's name, default, help and checks (the
    executor adding only combinations with settings it alone has)."""
    classes = (ExecutorSettings, PilotRequest, Tuning)
    declared = {item.name: item for cls in classes for item in fields(cls)}
    expected = {name for name, found in OPTIONS.items() if found.executor}
    assert expected <= declared.keys()
    for name in expected:
        item, found = declared[name], option(name)
        assert item.default == found.default, name
        assert item.metadata["help"] == found.help_for(executor_flag), name
        allowed = item.metadata["allowed"]
        assert replace(allowed, conflicts=found.allowed.conflicts) == found.allowed, name
    assert not {name for name, found in OPTIONS.items() if not found.executor} & declared.keys()


def test_ups_flags_are_the_tables_options() -> None:
    """`up` has every option under its name, with the table's default and help (its
    flag: the name, or the shorter one the option declares), and the one help text
    names other options by `up`'s flags, never the executor's."""
    parser = _up_parser()
    actions = {action.dest: action for action in parser._actions}
    for name, found in OPTIONS.items():
        action = actions[name]
        assert action.option_strings == [up_flag(name)], name
        assert action.default == found.default, name
        assert action.help.startswith(found.help_for(up_flag)), name
        assert "--context-" not in action.help, name
    assert up_flag("pilot_queue") == "--queue" and up_flag("slots") == "--slots"
    assert executor_flag("pilot_queue") == "--context-pilots queue"
    gpus = option("gpus_per_server")
    assert "--pilot-gpus" in gpus.help_for(up_flag)
    assert "--context-pilots gpus" in gpus.help_for(executor_flag)


def test_each_default_is_said_once_by_the_table() -> None:
    """No help text types a default: the table adds it from the value (or what the
    option says its absence means), so that help and value cannot drift apart."""
    for found in OPTIONS.values():
        assert "default" not in found.help.lower(), found.name
    assert option("peer_transfers").help_for(up_flag).endswith(" Default: 2.")
    assert option("own_caches").help_for(up_flag).endswith("$SNAKEMAKE_CONTEXT_MODEL_CACHE.")
    assert option("backend").help_for(up_flag).endswith("Default: servers on this machine.")
    assert setting_default("pilot_walltime") == "01:00:00"
    with pytest.raises(LookupError):
        setting_default("no_such_option")


def test_the_shape_holds_the_tables_server_options() -> None:
    assert set(Shape.names()) <= {found.name for found in options_of(SERVER)}
    assert Shape() == Shape(**{name: setting_default(name) for name in Shape.names()})
    shape = Shape(slots=3, peer_mbps=0.5, own_caches="/tmp/caches")
    assert Shape.from_wire(shape.to_wire()) == shape
    parser = argparse.ArgumentParser()
    Shape.add_arguments(parser)
    assert Shape.from_args(parser.parse_args(shape.serve_args())) == shape


@pytest.mark.usefixtures("batch_commands")
def test_a_runs_default_pilot_settings_are_the_pilots_default_options() -> None:
    """The pilots' options a run with only --context-pilots backend=slurm asks for are
    those PilotOptions declares by default: the two take their defaults from one table."""
    serve = pilot_settings_args(ExecutorSettings(pilots=["backend=slurm"]))
    options = PilotOptions.from_json(serve[serve.index("--pilots") + 1])
    assert options == PilotOptions(backend="slurm")


def test_a_pilots_server_settings_are_one_record_on_the_wire() -> None:
    """Written by the cluster into the job script and read by the pilot's preload with
    the same class; the pilot's server is set up from it, its shape whole."""
    shape = Shape(slots=4, peer_transfers=0, model_cache_size="2GB", gang_timeout=30.0)
    options = PilotOptions(backend="slurm", gpus=2, gpu_types=("a100",), nodes=2, shape=shape)
    settings = options.server_settings()
    assert PilotServerSettings.from_wire(settings.to_wire()) == settings
    assert PilotOptions.from_json(options.to_json()) == options
    config = settings.server_config("pilot-a100-0", [], 8 * 2**30, allocated_at=12.0)
    assert config.shape == shape and config.shape.model_cache_bytes == 2_000_000_000
    assert (config.gang_nodes, config.gang_kind, config.allocated_at) == (2, "a100", 12.0)
    assert config.memory_budget == setting_default("contexts_memory")
    assert config.loads_per_source == setting_default("pilot_loads_per_source")
    assert config.retires_at is not None
    with pytest.raises(TypeError):
        PilotServerSettings.from_wire('{"shape": {}, "unknown": 1}')
