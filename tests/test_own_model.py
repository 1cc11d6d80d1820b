"""A user's own model in one line: the built-in loader
(``snakemake_executor_context.hf:causal_lm``) and the staging of its ``model``
(:mod:`snakemake_executor_context.staging`).

The model is a tiny random Llama with SmolLM2's tokenizer, saved in the test's
temporary directory (:mod:`tests.tinyllm`): a checkpoint directory, and the same files
laid out as a Hugging Face cache snapshot. Runs use the real command line on real
clusters; the staging's own cases (a source changed meanwhile, two stagers at once, a
full disk, the read-rate cap, the turn) run it in the test's processes.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from snakemake_executor_context.catalog.models import Transfer
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.contexts import make_declaration
from snakemake_executor_context.errors import ContextDeclarationError, ContextLoadError
from snakemake_executor_context.hf import load_kwargs
from snakemake_executor_context.modelcache import staging
from tests import tinyllm
from tests.conftest import context_run, persistent_cluster

HF = "snakemake_executor_context.hf:causal_lm"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's tokenizer read once from its GGUF (seconds): each model copies it."""
    directory = tmp_path_factory.mktemp("tokenizer")
    tinyllm.save_tokenizer(directory)
    return directory


@pytest.fixture
def model(tmp_path: Path, tokenizer_dir: Path) -> Path:
    """A checkpoint directory of the user's (seed 1)."""
    return tinyllm.make_model(tmp_path / "shared" / "my-model", 1, tokenizer_dir)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's node-local model cache (servers inherit the variable)."""
    directory = tmp_path / "node-cache"
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(directory))
    return directory


def _same_logits(output: Path, model_dir: Path, prompt_index: int) -> bool:
    import torch

    prompt = f"Claim {prompt_index}: the sky is green. True or false?"
    expected = torch.tensor(tinyllm.logits(model_dir, prompt))
    return bool(torch.allclose(torch.load(output), expected, atol=1e-5))


def _staged(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("staged-*"))


def _logs(workdir: Path) -> str:
    return "".join(p.read_text() for p in (workdir / ".snakemake/context/logs").rglob("*.log"))


# ----------------------------------------------------------------------------------
# The real command line.


@pytest.mark.slow
def test_a_directory_and_a_hub_snapshot_load_in_one_line_each_offline(
    workflow, model, cache, tmp_path
):
    """Both give the logits of plain from_pretrained; nothing is written into the
    source directory or the Hugging Face cache (HF_HUB_OFFLINE=1: a fetch would fail);
    a changed directory is staged anew by the next run, whose outputs follow it."""
    hub = tmp_path / "hf-hub"
    tinyllm.as_hub_snapshot(model, hub, "someone/tiny-llama")
    before = tinyllm.tree_state(model), tinyllm.tree_state(hub)
    workdir = workflow("ownmodel")
    config = ["--config", f"model={model}", "repo=someone/tiny-llama"]
    env = {"HF_HUB_CACHE": str(hub)}
    run = context_run(workdir, "--context-servers", "1", *config, env=env).check()
    for i in (0, 1):
        assert _same_logits(workdir / f"out/dir/{i}.pt", model, i), run.output
        assert _same_logits(workdir / f"out/hub/{i}.pt", model, i), run.output
    assert (tinyllm.tree_state(model), tinyllm.tree_state(hub)) == before
    staged = _staged(cache)
    assert len(staged) == 2 and any("someone--tiny-llama" in name for name in staged), staged
    assert _logs(workdir).count("was staged from its source") == 2

    # New weights in the same directory: a new context, a new entry, new outputs.
    tinyllm.save_weights(model, seed=2)
    shutil.rmtree(workdir / "out")
    run = context_run(workdir, "--context-servers", "1", *config, env=env).check()
    assert _same_logits(workdir / "out/dir/0.pt", model, 0), run.output
    assert len(_staged(cache)) == 3, _staged(cache)


@pytest.mark.slow
def test_a_second_server_warms_from_the_first_and_the_source_is_read_once(
    workflow, model, tmp_path
):
    """Servers with caches of their own (as on two nodes): the second gets the staged
    model from the first (a transfer in the catalog), not from the source."""
    workdir = workflow("ownmodel")
    caches = tmp_path / "caches"
    common = ["--context-tuning", f"own_caches={caches}", "--config", f"model={model}"]
    context_run(workdir, "--context-servers", "1", *common, "count=1").check()
    shutil.rmtree(workdir / "out")
    before = tinyllm.tree_state(model)
    run = context_run(workdir, "--context-servers", "2", *common, "count=8", "sleep=1.5").check()
    assert tinyllm.tree_state(model) == before
    logs = _logs(workdir)
    assert logs.count("was staged from its source") == 1, logs  # the first run's only
    assert logs.count("came from peers") == 1, run.output + logs
    catalog = workdir / ".snakemake/context/catalog.db"
    with open_reader(catalog).session() as session:
        transfers = session.scalars(select(Transfer)).all()
    assert [t.outcome for t in transfers] == ["ok"], transfers
    entries = sorted(caches.glob("*/staged-*"))
    assert len(entries) == 2, entries
    assert all(_same_logits(p, model, int(p.stem)) for p in (workdir / "out/dir").glob("*.pt"))


@pytest.mark.slow
def test_a_persistent_cluster_serves_the_new_weights_after_the_directory_changed(
    workflow, model, cache, tmp_path
):
    """`snakemake-context up` keeps contexts loaded between runs: a changed source is
    a new context, so the second run's outputs follow the new weights."""
    workdir = workflow("ownmodel")
    with persistent_cluster(tmp_path / "elsewhere", "--servers", "1") as scheduler:
        attach = ["--context-scheduler-file", str(scheduler), "--config", f"model={model}"]
        context_run(workdir, *attach, "count=1").check()
        first = workdir / "out/dir/0.pt"
        assert _same_logits(first, model, 0)
        old = tmp_path / "old.pt"
        shutil.copy(first, old)
        tinyllm.save_weights(model, seed=2)
        shutil.rmtree(workdir / "out")
        run = context_run(workdir, *attach, "count=1").check()
    assert _same_logits(first, model, 0), run.output
    import torch

    assert not torch.allclose(torch.load(first), torch.load(old)), "the old model served"
    assert len(_staged(cache)) == 2


# ----------------------------------------------------------------------------------
# The staging in this process.


def _declare(value: object, **kwargs: object):
    return make_declaration("llm", HF, {"model": value, **kwargs}, Path("."))


def test_the_source_is_part_of_the_identity_and_names_the_entry(model, cache):
    first = _declare(str(model))
    assert set(first.stage) == {"model"} and first.kwargs["model"] == str(model)
    os.utime(model / "config.json", ns=(1, 1))  # same bytes, another time: changed
    second = _declare(str(model))
    assert second.identity != first.identity
    assert staging.template_entry(second) != staging.template_entry(first)
    assert staging.template_entry(second).name.startswith("staged-my-model-")


def test_a_repository_id_resolves_in_the_local_cache_at_its_revision(model, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = tinyllm.as_hub_snapshot(model, hub, "org/m", commit="b" * 40)
    found = staging.resolve("llm", "model", "org/m")
    assert found.path == snapshot and found.repo == "org/m"
    assert staging.resolve("llm", "model", "org/m", revision="b" * 40).path == snapshot
    with pytest.raises(ContextDeclarationError) as error:
        _declare("org/m", revision="v2")
    message = str(error.value)
    assert "Context 'llm'" in message and "revision v2" in message and "hf download" in message
    with pytest.raises(ContextDeclarationError, match="does not exist"):
        _declare(str(tmp_path / "nowhere"))
    with pytest.raises(ContextDeclarationError, match="not one of its arguments"):
        make_declaration("llm", HF, {"model": str(model)}, Path("."), stage=["weights"])


def test_the_turn_covers_the_copy_only_and_a_cached_entry_takes_none(model, cache):
    declaration = _declare(str(model))
    events: list[str] = []

    def turn():
        events.append("take")
        return lambda: events.append("release")

    with staging.staged_arguments(declaration, turn) as kwargs:
        events.append("loader")
        local = Path(kwargs["model"])
        assert (local / "model.safetensors").is_file() and local != model
    assert events == ["take", "release", "loader"]
    events.clear()
    with staging.staged_arguments(declaration, turn):
        events.append("loader")
    assert events == ["loader"]


def test_a_source_changed_during_the_copy_is_not_kept(model, cache, monkeypatch):
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "20")  # 16 MB: about 0.8 s
    declaration = _declare(str(model))

    def writer():
        time.sleep(0.3)
        with open(model / "notes.txt", "w") as file:
            file.write("a user edits the directory meanwhile")

    thread = threading.Thread(target=writer)
    thread.start()
    with (
        pytest.raises(ContextLoadError, match="changed while it was staged"),
        staging.staged_arguments(declaration),
    ):
        pass
    thread.join()
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())
    with (
        pytest.raises(ContextLoadError, match="changed after the workflow declared it"),
        staging.staged_arguments(declaration),
    ):
        pass


def _stage_in_a_process(declaration, queue, cache: str | None = None) -> None:
    from snakemake_executor_context.modelcache import staging as in_child

    if cache:
        os.environ["SNAKEMAKE_CONTEXT_MODEL_CACHE"] = cache
    (source, identity) = in_child._sources(declaration)[0]
    entry = in_child.entry_for(source, identity)
    queue.put(in_child._stage("llm", source, identity, entry, None))


def test_two_processes_of_a_node_staging_at_once_copy_once(model, cache, monkeypatch):
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "40")
    declaration = _declare(str(model))
    forked = multiprocessing.get_context("fork")
    queue = forked.Queue()
    children = [forked.Process(target=_stage_in_a_process, args=(declaration, queue)) for _ in "ab"]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert sorted(queue.get(timeout=5) for _ in children) == [False, True]
    assert len(_staged(cache)) == 1


def test_the_read_rate_cap_is_shared_by_a_nodes_readers_of_a_source(model, tmp_path, monkeypatch):
    """Two servers with caches of their own copy the same source at once: together
    they read at most the cap (a lower bound on the time: nothing makes it faster)."""
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "40")
    declaration = _declare(str(model))
    size = sum(p.stat().st_size for p in model.iterdir())
    forked = multiprocessing.get_context("fork")
    queue = forked.Queue()
    children = [
        forked.Process(target=_stage_in_a_process, args=(declaration, queue, str(tmp_path / name)))
        for name in ("a", "b")
    ]
    started = time.monotonic()
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    elapsed = time.monotonic() - started
    assert [queue.get(timeout=5) for _ in children] == [True, True]
    assert elapsed >= 0.9 * 2 * size / 40e6, (elapsed, size)


def test_a_full_disk_reads_the_source_in_one_line(model, tmp_path, monkeypatch, capfd):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(small)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("a small filesystem needs mount (root): " + mounted.stderr.decode()[:200])
    try:
        monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(small / "cache"))
        declaration = _declare(str(model))
        turns: list[str] = []
        with staging.staged_arguments(
            declaration, lambda: turns.append("take") or (lambda: turns.append("end"))
        ) as kwargs:
            assert kwargs["model"] == str(model)
            assert turns == ["take", "end", "take"]  # the loader reads inside a turn
        assert turns[-1] == "end"
        assert not list((small / "cache").glob("*staged-*")), "a partial copy was left"
        err = capfd.readouterr().err
        assert os.strerror(errno.ENOSPC) in err and "the loader reads the source" in err
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_the_dtype_keyword_follows_the_transformers_version():
    assert load_kwargs("4.46.3", "x") == {"torch_dtype": "x"}
    assert load_kwargs("4.56.0", "x") == {"dtype": "x"}
    assert load_kwargs("5.25.0", "x") == {"dtype": "x"}


def test_a_sharded_checkpoint_loads_through_the_staged_copy_with_the_same_logits(
    tmp_path, tokenizer_dir, cache
):
    """Shards and their index are staged, and the loader's model from the staged copy
    gives from_pretrained's logits."""
    from snakemake_executor_context import jobhooks

    sharded = tmp_path / "sharded"
    tinyllm.make_model(sharded, 3, tokenizer_dir)
    (sharded / "model.safetensors").unlink()
    tinyllm.save_weights(sharded, 3, shard="4MB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (sharded / "model.safetensors.index.json").is_file()

    import torch

    llm = jobhooks.call_loader(_declare(str(sharded), dtype="float32"), jobhooks.LoadRecord())
    prompt = "Claim 0: the sky is green. True or false?"
    with torch.inference_mode():
        got = llm.model(**llm.tokenizer(prompt, return_tensors="pt")).logits[0, -1]
    assert torch.allclose(got, torch.tensor(tinyllm.logits(sharded, prompt)), atol=1e-5)
    entry = staging.template_entry(_declare(str(sharded)))
    assert sorted(p.name for p in entry.iterdir()) == sorted(p.name for p in sharded.iterdir())
