"""Batching across jobs: concurrent calls of one function merged into one call.

A context that scores items (claims, prompts, documents) does most of its work in
forward passes whose cost hardly grows with the batch on a GPU. When several jobs run
at once against one loaded context (slots), :func:`batched` merges the items they pass
into calls of up to ``max_batch`` items and hands each job back its own results, in
order::

    class Scorer:
        def __init__(self, model):
            self.model = model
            self.score = batched(self._score_many, max_batch=32)

        def _score_many(self, claims: list[str]) -> list[float]:
            ...  # one forward pass over all of them

    # in a job: scores = scorer.score(my_claims)

There is no background thread: the first caller to find no batch running leads, runs
the function on its own thread over everything queued (waiting at most ``max_wait``
seconds for more, 0 by default, so a lone call is not delayed), and wakes the others
with their results; calls that arrive meanwhile form the next batch. The one wait
without ``max_wait``: right after a call that merged several jobs' requests, the next
leader (often the last leader, back first with its next items) waits for as many
requests as that call merged or as threads called in the last second (jobs in the
other slots), at most a quarter of its duration and 100 ms, so that jobs calling in a
loop keep merging instead of alternating between batches of all and of one (measured:
4 jobs of one-item calls merged 2.1 items a call without it, 3.6 with it; 4 slots of
one-claim factcheck jobs, arriving in pairs, 2.0 without the threads, 3.8 with them);
a lone caller never waits. An exception of a
merged call is traced to its job by calling the function again on each job's items
alone: only the job whose items raise sees the error. A leader interrupted (its job
cancelled) hands its batch back: the other jobs' items run in the next batch.

Settings. ``max_batch`` and ``max_wait`` are what the context passed to :func:`batched`
(a workflow that runs on GPUs and CPUs alike reads them from its config: a GPU takes
64 claims a forward pass where a CPU is best at 8, the fact-check workflow's
``forward_batch``), else the library's defaults (32 items, 0 s: no latency added at low
load). No server setting overrides them.

Observers. :func:`observe` registers a callback called with the size of every call of a
wrapped function, on the thread that made it (the leader's): a context server counts
each forward batch once, in the job that led it, and shows the batch-size histogram
in the run summary.

A context that batches internally (a generation engine such as vLLM) simply does not
wrap its functions: concurrent jobs then call it directly. Importing this module loads
nothing beyond the standard library, and nothing of this package: a script may load it
by its file path.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Batcher", "batched", "observe"]

#: The library's defaults: calls of up to 32 items, no waiting for more.
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_WAIT = 0.0
#: After a call that merged several jobs' requests, the next leader waits for those
#: jobs to come back (they were busy taking their results) at most this fraction of
#: that call's duration, and at most ``REGATHER_CAP`` seconds.
REGATHER_FRACTION = 0.25
REGATHER_CAP = 0.1
#: Callers (threads: a server's slots) seen this recently are expected back.
RECENT_CALLERS = 1.0

T = TypeVar("T")
R = TypeVar("R")


_observers_lock = threading.Lock()
_observers: dict[object, Callable[[int], None]] = {}


def observe(callback: Callable[[int], None], *, name: str | None = None) -> Callable[[], None]:
    """Call ``callback(size)`` after every call of any wrapped function, on the thread
    that made the call (the leading job's), with the number of items it merged.

    A callback registered under a ``name`` replaces the one registered before under
    that name (a module imported twice registers once). Returns a function that
    unregisters the callback. A callback's exception is ignored: counting never fails
    a batch."""
    key: object = name if name is not None else object()
    with _observers_lock:
        _observers[key] = callback

    def unregister() -> None:
        with _observers_lock:
            if _observers.get(key) is callback:
                del _observers[key]

    return unregister


def _notify(size: int) -> None:
    with _observers_lock:
        callbacks = list(_observers.values())
    for callback in callbacks:
        try:
            callback(size)
        except Exception:  # an observer must never fail the batch
            continue


def _check(max_batch: int | None, max_wait: float | None) -> None:
    if max_batch is not None and (
        isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < 1
    ):
        raise ValueError(f"max_batch must be a whole number of at least 1, got {max_batch!r}")
    if max_wait is not None and not max_wait >= 0:
        raise ValueError(f"max_wait must be >= 0 seconds, got {max_wait!r}")


@dataclass
class _Request(Generic[T, R]):
    items: Sequence[T]
    done: threading.Event = field(default_factory=threading.Event)
    results: list[R] | None = None
    error: BaseException | None = None
    #: Set when its caller gave up (interrupted while waiting): its results are dropped.
    abandoned: bool = False


class Batcher(Generic[T, R]):
    """Merges the items of concurrent calls into calls of ``fn`` (see the module)."""

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int | None = None,
        max_wait: float | None = None,
    ) -> None:
        _check(max_batch, max_wait)
        self.fn = fn
        #: What the context asked for (None: the library's default).
        self.requested_max_batch = max_batch
        self.requested_max_wait = max_wait
        #: How many calls of ``fn`` merged how many items (the batch-size histogram).
        self.sizes: Counter[int] = Counter()
        self._cond = threading.Condition()
        self._queue: list[_Request[T, R]] = []
        self._leading = False
        #: Requests merged into the last call, and its seconds (see :meth:`_lead`).
        self._last_requests = 0
        self._last_seconds = 0.0
        #: When each calling thread last called (a server's slots call in turn).
        self._callers: dict[int, float] = {}

    def __call__(self, items: Sequence[T]) -> list[R]:
        """The results of ``fn`` for ``items``, in order, computed with others' items."""
        items = list(items)
        if not items:
            return []
        request: _Request[T, R] = _Request(items)
        with self._cond:
            self._queue.append(request)
            self._callers[threading.get_ident()] = time.monotonic()
        try:
            while True:
                with self._cond:
                    # Bounded waits: a job's cancellation (an asynchronous exception)
                    # is delivered only between bytecodes, never inside a lock wait.
                    while not request.done.is_set() and self._leading:
                        self._cond.wait(0.1)
                    if request.done.is_set():
                        break
                    self._leading = True
                self._lead()
        except BaseException:
            with self._cond:
                request.abandoned = True
                if request in self._queue:
                    self._queue.remove(request)
            raise
        if request.error is not None:
            raise request.error
        assert request.results is not None
        return request.results

    @property
    def max_batch(self) -> int:
        """The most items one call of the function gets (see the module: settings)."""
        value = self.requested_max_batch
        return int(value) if value is not None else DEFAULT_MAX_BATCH

    @property
    def max_wait(self) -> float:
        """Seconds a leader waits for more items before calling (see the module)."""
        value = self.requested_max_wait
        return float(value) if value is not None else DEFAULT_MAX_WAIT

    def histogram(self) -> dict[int, int]:
        """Calls of the function by the number of items merged into them."""
        with self._cond:
            return dict(sorted(self.sizes.items()))

    # -- the leader ----------------------------------------------------------------------

    def _lead(self) -> None:
        """Run one batch of what is queued, then let the next caller lead."""
        max_batch, max_wait = self.max_batch, self.max_wait  # one batch, one setting
        try:
            if max_wait > 0:
                self._gather(max_batch, max_wait, 0)
            elif self._last_requests > 1:
                # The leader of the last call got its result first and came straight
                # back: without a moment for the others to come back too, it would
                # run alone, and batches would alternate between all and one.
                regather = min(REGATHER_CAP, REGATHER_FRACTION * self._last_seconds)
                self._gather(max_batch, regather, max(self._last_requests, self._recent()))
            batch = self._next_batch(max_batch)
            if batch:
                self._run(batch, max_batch)
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()

    def _recent(self) -> int:
        """Threads that called within the last second: jobs in the other slots, which
        come back with their next items while this batch runs (two pairs of jobs in
        step would otherwise keep merging in pairs: measured on the factcheck
        workflow, 4 slots, one-claim jobs: 2.0 items a call, 3.8 with this)."""
        now = time.monotonic()
        with self._cond:
            for ident, seen in list(self._callers.items()):
                if now - seen > RECENT_CALLERS:
                    del self._callers[ident]
            return len(self._callers)

    def _gather(self, max_batch: int, max_wait: float, requests: int) -> None:
        """Wait up to ``max_wait`` until ``max_batch`` items, or more than ``requests``
        requests (when positive: as many as the last call merged), are queued."""
        deadline = time.monotonic() + max_wait
        while time.monotonic() < deadline:
            with self._cond:
                if sum(len(r.items) for r in self._queue) >= max_batch:
                    return
                if 1 < requests <= len(self._queue):
                    return
            time.sleep(min(0.0005, max(0.0, deadline - time.monotonic())))

    def _next_batch(self, max_batch: int) -> list[_Request[T, R]]:
        """Whole requests up to ``max_batch`` items (a larger first request alone)."""
        with self._cond:
            batch: list[_Request[T, R]] = []
            size = 0
            while self._queue:
                request = self._queue[0]
                if batch and size + len(request.items) > max_batch:
                    break
                batch.append(self._queue.pop(0))
                size += len(request.items)
            return batch

    def _run(self, batch: list[_Request[T, R]], max_batch: int) -> None:
        items = [item for request in batch for item in request.items]
        started = time.monotonic()
        try:
            results = self._call(items, max_batch)
            self._last_requests, self._last_seconds = len(batch), time.monotonic() - started
        except Exception:
            if len(batch) == 1:
                self._finish(batch[0], None, _current_error())
                return
            # Whose items raised? Each request alone: the error goes to its job only.
            for request in batch:
                try:
                    self._finish(request, list(self._call(list(request.items), max_batch)), None)
                except Exception as error:
                    self._finish(request, None, error)
            return
        except BaseException:
            # The leader was interrupted (its job cancelled): the others run next.
            with self._cond:
                self._queue[0:0] = [r for r in batch if not r.abandoned and not r.done.is_set()]
            raise
        start = 0
        for request in batch:
            end = start + len(request.items)
            self._finish(request, list(results[start:end]), None)
            start = end

    def _call(self, items: list[T], max_batch: int) -> Sequence[R]:
        chunks = [items[i : i + max_batch] for i in range(0, len(items), max_batch)]
        results: list[R] = []
        for chunk in chunks:
            out = self.fn(chunk)
            if len(out) != len(chunk):
                raise ValueError(
                    f"a batched function must return one result per item: "
                    f"{getattr(self.fn, '__name__', self.fn)!r} returned {len(out)} for "
                    f"{len(chunk)} items"
                )
            with self._cond:
                self.sizes[len(chunk)] += 1
            _notify(len(chunk))
            results.extend(out)
        return results

    @staticmethod
    def _finish(
        request: _Request[T, R], results: list[R] | None, error: BaseException | None
    ) -> None:
        request.results = results
        request.error = error
        request.done.set()


def _current_error() -> BaseException:
    import sys

    error = sys.exc_info()[1]
    assert error is not None
    return error


def batched(
    fn: Callable[[list[T]], Sequence[R]],
    *,
    max_batch: int | None = None,
    max_wait: float | None = None,
) -> Batcher[T, R]:
    """Wrap a function of a list of items so that concurrent calls share its calls.

    ``max_batch`` and ``max_wait`` are the context's own values; without them the
    library's defaults (32 items, 0 s) apply."""
    return Batcher(fn, max_batch=max_batch, max_wait=max_wait)
