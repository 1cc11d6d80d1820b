"""Batching across jobs (``snakemake_executor_context.batching``), with real threads:
concurrent calls are merged, each caller gets its own results in order, an error
reaches only the caller whose items raised, and an interrupted leader loses nobody's
items."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from snakemake_executor_context.batching import batched


class Model:
    """A stand-in for a forward pass: a fixed cost per call, whatever the batch."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.calls: list[list[str]] = []

    def score(self, items: list[str]) -> list[str]:
        self.calls.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        time.sleep(self.seconds)
        return [item.upper() for item in items]


def _concurrently(fn, inputs: list[list[str]]) -> list[object]:
    out: list[object] = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def run(index: int) -> None:
        barrier.wait()
        try:
            out[index] = fn(inputs[index])
        except Exception as error:
            out[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return out


def test_a_lone_call_runs_at_once_on_its_own_items() -> None:
    model = Model(seconds=0)
    score = batched(model.score)
    assert score(["a", "b"]) == ["A", "B"]
    assert score([]) == []
    assert model.calls == [["a", "b"]]
    assert score.histogram() == {2: 1}


def test_concurrent_calls_share_calls_and_get_their_own_results_in_order() -> None:
    model = Model(seconds=0.05)
    score = batched(model.score, max_batch=32)
    inputs = [[f"j{j}-{i}" for i in range(3)] for j in range(8)]
    out = _concurrently(score, inputs)
    for items, results in zip(inputs, out, strict=True):
        assert results == [item.upper() for item in items]
    # Eight callers, far fewer calls: the ones that arrived during a call went together.
    assert len(model.calls) < 8, model.calls
    assert sum(len(c) for c in model.calls) == 24
    assert max(score.histogram()) >= 6


def test_an_error_reaches_only_the_caller_whose_items_raised() -> None:
    model = Model(seconds=0.05)
    score = batched(model.score)
    inputs = [["a"], ["b", "bad"], ["c"], ["d"]]
    out = _concurrently(score, inputs)
    assert isinstance(out[1], ValueError)
    assert out[0] == ["A"] and out[2] == ["C"] and out[3] == ["D"]


def test_large_requests_are_split_into_calls_of_at_most_max_batch() -> None:
    model = Model(seconds=0)
    score = batched(model.score, max_batch=32)
    items = [str(i) for i in range(70)]
    assert score(items) == items
    assert [len(c) for c in model.calls] == [32, 32, 6]


def test_a_wrong_number_of_results_is_a_clear_error() -> None:
    score = batched(lambda items: items[:-1])
    with pytest.raises(ValueError, match="one result per item"):
        score(["a", "b"])


def _interrupt(thread: threading.Thread, exception: type[BaseException]) -> None:
    """What a job's cancellation does: an asynchronous exception in its thread."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident or 0), ctypes.py_object(exception)
    )


class Cancelled(BaseException):
    pass


def test_a_cancelled_leader_loses_nobody_elses_items() -> None:
    started = threading.Event()
    release = threading.Event()
    calls: list[list[str]] = []

    def slow(items: list[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            started.set()
            while not release.is_set():  # interruptible: Python bytecode in a loop
                time.sleep(0.01)
        return [item.upper() for item in items]

    score = batched(slow)
    results: dict[str, object] = {}

    def call(name: str, items: list[str]) -> None:
        try:
            results[name] = score(items)
        except BaseException as error:
            results[name] = error

    leader = threading.Thread(target=call, args=("leader", ["x"]))
    leader.start()
    assert started.wait(5)
    follower = threading.Thread(target=call, args=("follower", ["y", "z"]))
    follower.start()
    time.sleep(0.1)  # the follower is queued behind the running call
    _interrupt(leader, Cancelled)
    leader.join(5)
    release.set()
    follower.join(5)
    assert isinstance(results["leader"], Cancelled)
    assert results["follower"] == ["Y", "Z"]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        batched(lambda items: items, max_batch=0)
    with pytest.raises(ValueError, match="max_wait"):
        batched(lambda items: items, max_wait=-1)
