"""The context API: declarations, identity, and the in-process fallback."""

from __future__ import annotations

import types

import pytest

from snakemake_executor_context import (
    CONFIG_KEY,
    ContextDeclarationError,
    ContextLoadError,
    declare_context,
    load_context,
)
from snakemake_executor_context.contexts import (
    declarations_from_config,
    make_declaration,
    resolve_declaration,
)
from snakemake_executor_context.loaders import cache_probe

LOADER = "def load(size, name='x'):\n    return {'size': size, 'name': name}\n"


@pytest.fixture
def loader_file(tmp_path):
    path = tmp_path / "loader.py"
    path.write_text(LOADER)
    return path


def test_equal_declarations_under_two_names_share_one_identity(loader_file):
    config: dict = {}
    a = declare_context(config, "a", f"{loader_file}:load", size=3)
    b = declare_context(config, "b", f"{loader_file}:load", size=3)
    assert a.identity == b.identity
    assert set(config[CONFIG_KEY]) == {"a", "b"}


def test_identity_changes_with_arguments_and_loader_code(loader_file):
    first = make_declaration("m", f"{loader_file}:load", {"size": 3}, loader_file.parent)
    assert (
        make_declaration("m", f"{loader_file}:load", {"size": 4}, loader_file.parent).identity
        != first.identity
    )
    # Argument order does not matter: canonical JSON.
    assert (
        make_declaration(
            "m", f"{loader_file}:load", {"name": "x", "size": 3}, loader_file.parent
        ).identity
        == make_declaration(
            "m", f"{loader_file}:load", {"size": 3, "name": "x"}, loader_file.parent
        ).identity
    )
    loader_file.write_text(LOADER + "# edited\n")
    assert (
        make_declaration("m", f"{loader_file}:load", {"size": 3}, loader_file.parent).identity
        != first.identity
    )


def test_relative_file_loaders_resolve_against_the_basedir(loader_file):
    declaration = make_declaration("m", "loader.py:load", {"size": 1}, loader_file.parent)
    assert declaration.loader_path == str(loader_file)


def test_module_loader_of_an_installed_distribution_uses_its_version():
    declaration = make_declaration("m", "json:loads", {}, ".")
    assert declaration.loader_path is None
    # json is in the standard library: fingerprinted by content; an installed package
    # (threadpoolctl) by its distribution's version.
    other = make_declaration("m", "threadpoolctl:threadpool_info", {}, ".")
    assert other.identity != declaration.identity


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        ("no_colon", "is not of the form"),
        ("loader.py:", "must end in ':function_name'"),
        ("missing.py:load", "does not exist"),
        ("not_a_module_anywhere:load", "cannot be imported here"),
        ("has space:load", "is not a module path"),
    ],
)
def test_bad_loader_specs(tmp_path, loader, message):
    with pytest.raises(ContextDeclarationError, match=message):
        make_declaration("m", loader, {}, tmp_path)


def test_arguments_must_be_json(loader_file):
    with pytest.raises(ContextDeclarationError, match="must be JSON values"):
        make_declaration("m", f"{loader_file}:load", {"size": object()}, loader_file.parent)
    # Paths are fine: turned into strings.
    declaration = make_declaration("m", f"{loader_file}:load", {"size": loader_file}, ".")
    assert declaration.kwargs == {"size": str(loader_file)}


def test_conflicting_redeclaration(loader_file):
    config: dict = {}
    declare_context(config, "a", f"{loader_file}:load", size=3)
    declare_context(config, "a", f"{loader_file}:load", size=3)  # same: fine
    with pytest.raises(ContextDeclarationError, match="declared twice"):
        declare_context(config, "a", f"{loader_file}:load", size=4)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a:b"])
def test_bad_names(loader_file, name):
    with pytest.raises(ContextDeclarationError, match="is invalid"):
        declare_context({}, name, f"{loader_file}:load", size=1)


def _snakemake(config, context=None, rule="score"):
    resources = {"context": context} if context else {}
    return types.SimpleNamespace(config=config, resources=resources, rule=rule)


def test_load_context_falls_back_to_loading_in_this_process(loader_file):
    config: dict = {}
    declare_context(config, "m", f"{loader_file}:load", size=7)
    first = load_context(_snakemake(config, "m"))
    assert first == {"size": 7, "name": "x"}
    assert load_context(_snakemake(config), "m") is first  # loaded once per process


def test_load_context_errors_name_rule_and_fix(loader_file):
    config: dict = {}
    declare_context(config, "m", f"{loader_file}:load", size=7)
    with pytest.raises(ContextDeclarationError, match="Rule 'score' asked for its context, but"):
        load_context(_snakemake(config))
    with pytest.raises(ContextDeclarationError, match=r"uses context 'z'.*declared: m"):
        resolve_declaration(config, "z", rule="score")


def test_loader_function_must_exist(loader_file):
    config: dict = {}
    declare_context(config, "m", f"{loader_file}:nope", size=1)
    with pytest.raises(ContextLoadError, match="names 'nope', which"):
        load_context(_snakemake(config, "m"))


def test_declarations_round_trip_through_config(loader_file):
    config: dict = {}
    declared = declare_context(config, "m", f"{loader_file}:load", size=2)
    assert declarations_from_config(config) == {"m": declared}


def test_cache_probe(tmp_path):
    path = tmp_path / "probed.py"
    path.write_text(
        "from snakemake_executor_context import loader\n"
        "def cached(size):\n    return size > 1\n"
        "@loader(cache_probe=cached)\n"
        "def load(size):\n    return size\n"
        "def plain(size):\n    return size\n"
    )
    assert cache_probe(make_declaration("m", f"{path}:load", {"size": 2}, ".")) is True
    assert cache_probe(make_declaration("m", f"{path}:load", {"size": 1}, ".")) is False
    assert cache_probe(make_declaration("m", f"{path}:plain", {"size": 1}, ".")) is None


def test_a_loader_file_imported_from_two_threads_at_once_is_whole_in_both(tmp_path):
    """A server's cache probe and a job's load may import one loader file at once: the
    second must not take the first's half-executed module (a slow import, torch's,
    made it say "does not define load as a function" once)."""
    import threading

    from snakemake_executor_context.loaders import import_loader

    (tmp_path / "slow.py").write_text("import time\ntime.sleep(0.5)\n\ndef load():\n    return 1\n")
    declaration = make_declaration("slow", "slow.py:load", {}, tmp_path)
    found: list[object] = []

    def imported() -> None:
        try:
            found.append(import_loader(declaration))
        except Exception as error:
            found.append(error)

    threads = [threading.Thread(target=imported) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(callable(f) for f in found) and len(found) == 2, found
