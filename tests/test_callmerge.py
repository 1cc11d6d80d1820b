"""Batching across jobs (``snakemake_executor_context.callmerge``), with real threads:
concurrent calls are merged, each caller gets its own results in order, an error
reaches only the caller whose items raised, and an interrupted leader loses nobody's
items."""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter

import pytest

from snakemake_executor_context import callmerge
from snakemake_executor_context.callmerge import batched
from snakemake_executor_context.errors import JobCancelled
from snakemake_executor_context.executor.summary import (
    batch_histogram,
    describe_batches,
    summary_entry,
)
from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.jobhooks import JobHooks, set_current_job
from snakemake_executor_context.jobspec import JobResult
from snakemake_executor_context.server.running import RunningJob


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


# ----------------------------------------------------------------------------------
# Settings, observers, and batching inside jobs.


def test_defaults_add_no_wait_and_a_contexts_own_settings_apply() -> None:
    model = Model(seconds=0)
    score = batched(model.score)
    explicit = batched(model.score, max_batch=3, max_wait=0.001)
    assert (score.max_batch, score.max_wait) == (callmerge.DEFAULT_MAX_BATCH, 0.0)
    assert callmerge.DEFAULT_MAX_WAIT == 0.0
    assert (explicit.max_batch, explicit.max_wait) == (3, 0.001)
    assert explicit([str(i) for i in range(7)]) == [str(i) for i in range(7)]
    assert [len(c) for c in model.calls] == [3, 3, 1]


def test_a_long_wait_gathers_concurrent_callers_into_one_call() -> None:
    model = Model(seconds=0)
    score = batched(model.score, max_batch=8, max_wait=0.5)
    inputs = [[f"j{j}-{i}" for i in range(2)] for j in range(4)]
    out = _concurrently(score, inputs)
    assert out == [[i.upper() for i in items] for items in inputs]
    # The leader waited until the 8 items were there (it stops early when full).
    assert score.histogram() == {8: 1}


def test_observers_see_every_call_on_the_leading_thread() -> None:
    seen: list[tuple[int, int]] = []
    unregister = callmerge.observe(lambda size: seen.append((size, threading.get_ident())))
    replaced = callmerge.observe(lambda size: seen.append((-1, 0)), name="test")
    callmerge.observe(lambda size: 1 / 0, name="test")  # replaces; its error is ignored
    try:
        score = batched(Model(seconds=0).score, max_batch=2)
        assert score(["a", "b", "c"]) == ["A", "B", "C"]
    finally:
        unregister()
        replaced()
        callmerge.observe(lambda size: None, name="test")()
    assert seen == [(2, threading.get_ident()), (1, threading.get_ident())]
    score(["d"])
    assert len(seen) == 2  # unregistered


def _result(**fields: object) -> JobResult:
    outcome = Outcome("k", ServerIdentity("s", "h", 1), ok=True, started=0.0, finished=1.0)
    return JobResult(outcome, **fields)  # type: ignore[arg-type]


def _jobs_concurrently(score, inputs: list[list[str]]) -> tuple[list[object], list[JobHooks]]:
    """Each input in its own thread with its own job hooks, as a server's slots run them."""
    hooks = [JobHooks() for _ in inputs]

    def job(index: int, items: list[str]) -> object:
        set_current_job(hooks[index])
        try:
            return score(items)
        finally:
            set_current_job(None)

    indexed = [[str(i), *items] for i, items in enumerate(inputs)]
    out = _concurrently(lambda items: job(int(items[0]), items[1:]), indexed)
    return out, hooks


@pytest.mark.parametrize("callers", [4, 8])
def test_batched_results_equal_unbatched_calls_per_job_and_each_batch_counts_once(
    callers: int,
) -> None:
    model = Model(seconds=0.02)
    score = batched(model.score, max_batch=8)
    inputs = [[f"j{j}-{i}" for i in range(1 + j % 3)] for j in range(callers)]
    out, hooks = _jobs_concurrently(score, inputs)
    direct = Model(seconds=0)
    assert out == [direct.score(items) for items in inputs]
    assert len(model.calls) < callers  # merged
    total: Counter[int] = Counter()
    for job in hooks:
        total.update(job.batches)
    assert dict(total) == score.histogram()  # each call counted once, in its leader
    assert sum(size * n for size, n in total.items()) == sum(len(i) for i in inputs)
    result = _result()
    leader = next(job for job in hooks if job.batches)
    leader.items = 3
    leader.report_into(result)
    assert result.outcome.items == 3 and result.extra["batches"] == dict(leader.batches)
    idle = _result()
    JobHooks().report_into(idle)
    assert "batches" not in idle.extra


def test_one_jobs_failing_items_fail_only_that_job_among_concurrent_jobs() -> None:
    model = Model(seconds=0.02)
    score = batched(model.score, max_batch=16)
    inputs = [["a", "b"], ["c", "bad", "d"], ["e"], ["f", "g"], ["h"], ["i"]]
    out, _ = _jobs_concurrently(score, inputs)
    assert isinstance(out[1], ValueError) and "bad item" in str(out[1])
    for index, items in enumerate(inputs):
        if index != 1:
            assert out[index] == [item.upper() for item in items]


def _cancellable_jobs(score, inputs):
    """Jobs as a server runs them: each in its thread, inside a RunningJob's
    interruptible phase, so that ``RunningJob.request_cancel`` (the server's own
    cancellation: an asynchronous JobCancelled in the job's thread) can stop it."""
    results: dict[str, object] = {}
    running: dict[str, RunningJob] = {}
    ready = threading.Barrier(len(inputs) + 1)

    def job(name: str, items: list[str]) -> None:
        handle = RunningJob(key=name, thread_id=threading.get_ident())
        running[name] = handle
        ready.wait(5)
        try:
            with handle.interruptible_phase():
                results[name] = score(items)
        except BaseException as error:
            results[name] = error
        finally:
            handle.leave_phase()
            handle.done.set()

    threads = {name: threading.Thread(target=job, args=(name, items)) for name, items in inputs}
    for thread in threads.values():
        thread.start()
    ready.wait(5)
    return threads, running, results


def test_a_job_cancelled_while_leading_a_batch_leaves_the_others_their_results() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def forward(items: list[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            started.set()
            while not release.wait(0.01):  # a long forward pass, interruptible
                pass
        return [item.upper() for item in items]

    score = batched(forward, max_batch=8)
    # The leader goes first, alone; four more queue behind its running call.
    threads, running, results = _cancellable_jobs(score, [("lead", ["x"])])
    assert started.wait(5)
    others = [(f"j{i}", [f"y{i}", f"z{i}"]) for i in range(4)]
    more, _, more_results = _cancellable_jobs(score, others)
    time.sleep(0.1)  # they queue behind the running call
    running["lead"].request_cancel()
    threads["lead"].join(5)
    assert not threads["lead"].is_alive()
    release.set()
    for thread in more.values():
        thread.join(5)
        assert not thread.is_alive()
    assert isinstance(results["lead"], JobCancelled)
    for name, items in others:
        assert more_results[name] == [item.upper() for item in items]
    # The cancelled job's item was never handed to anyone else's call.
    assert all("x" not in call for call in calls[1:])


def test_a_job_cancelled_while_waiting_for_a_batch_leaves_the_others_their_results() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def forward(items: list[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            started.set()
            while not release.wait(0.01):
                pass
        return [item.upper() for item in items]

    score = batched(forward, max_batch=8)
    lead, _, lead_results = _cancellable_jobs(score, [("lead", ["x"])])
    assert started.wait(5)
    waiting = [(f"j{i}", [f"y{i}"]) for i in range(4)]
    threads, running, results = _cancellable_jobs(score, waiting)
    time.sleep(0.1)
    running["j2"].request_cancel()
    threads["j2"].join(5)
    assert not threads["j2"].is_alive()  # a waiting job stops within its bounded wait
    release.set()
    for thread in [*lead.values(), *threads.values()]:
        thread.join(5)
        assert not thread.is_alive()
    assert lead_results["lead"] == ["X"]
    assert isinstance(results["j2"], JobCancelled)
    for name, items in waiting:
        if name != "j2":
            assert results[name] == [item.upper() for item in items]
    assert all("y2" not in call for call in calls)  # its items were dropped, not run


def test_the_run_summary_shows_the_batch_size_histogram() -> None:
    jobs = [
        {"server": "a", "batches": {1: 12}},
        {"server": "a", "batches": {4: 20}},
        {"server": "b", "batches": {4: 10}},
        {"server": "b"},
    ]
    histogram = batch_histogram(jobs)
    assert histogram == {"all": {1: 12, 4: 30}, "by_server": {"a": {1: 12, 4: 20}, "b": {4: 10}}}
    assert describe_batches(histogram["all"]) == (
        "forward batches: 1 x 12, 4 x 30 (mean 3.1 items per call)"
    )
    result = _result(extra={"batches": {2: 3}})
    entry = summary_entry(result.outcome, result.extra, placed_by="p", submitted=0.0, reported=1.0)
    assert entry["batches"] == {2: 3}


def test_jobs_calling_in_a_loop_keep_merging_their_calls() -> None:
    """Four jobs hand one item at a time, 8 times each, to a call that takes 80 ms
    (a CPU forward pass): without the short regather after a merged call, the last
    leader, back first, would run alone every other time (2.1 items a call measured)."""
    score = batched(Model(seconds=0.08).score, max_batch=8)

    def job(items: list[str]) -> list[str]:
        return [result for item in items for result in score([item])]

    inputs = [[f"j{j}-{i}" for i in range(8)] for j in range(4)]
    out = _concurrently(job, inputs)
    assert out == [[item.upper() for item in items] for items in inputs]
    histogram = score.histogram()
    mean = sum(size * n for size, n in histogram.items()) / sum(histogram.values())
    assert mean >= 3, histogram
