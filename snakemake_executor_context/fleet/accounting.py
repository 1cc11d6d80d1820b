"""The ledger's accounting: one server's life cut into segments, one bucket each.

Pure functions of what a server did (:class:`ServerLife`: its attempts, its loads, the
contexts it held, its drain, a pilot's batch allocation), so that the catalog's ledger
(:mod:`..catalog.reading.ledger`) and a simulator account alike. Each bucket
(:class:`~.buckets.Bucket`) is computed from its own intervals, in this order of
precedence where they meet:

- ``lost``: attempts that ended lost (their server was preempted or crashed), and
  loads cut short by the loss, whatever else ran then;
- ``loading_<kind>``: loads (a load runs inside the attempt that asked for it);
- ``running``: attempts that ended ok (or are still running), outside their loads;
- ``failed``: attempts that failed or were cancelled, while nothing useful ran;
- ``draining``: from the drain's start to the server's end, while nothing ran;
- ``starting``: from registration to its first load or job;
- ``idle_warm`` / ``idle_cold``: the gaps between all of the above, split by whether a
  context was loaded (its placements' ready spans);
- ``allocated_before`` / ``allocated_after``: a pilot's batch job before its server
  registered and after it left.

Several attempts of one bucket at once (a server with slots) share each second
equally, so that a server's seconds are counted once: the buckets of a server sum to
its life in the window. A segment's ``seconds`` are its share; GPU-seconds are seconds
times the server's GPUs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

from .buckets import Bucket
from .intervals import Span, clip, gaps, intersect, merge, subtract
from .loads import LoadKind, load_parts

__all__ = [
    "Load",
    "RunSpan",
    "Segment",
    "ServerLife",
    "Warm",
    "Work",
    "account",
    "bucket_seconds",
    "life_seconds",
    "load_stretches",
]

#: Outcomes of attempts by bucket (None: still running, counted as running).
_OUTCOMES: dict[Bucket, set[str | None]] = {
    Bucket.LOST: {"lost"},
    Bucket.RUNNING: {"ok", None},
    Bucket.FAILED: {"failed", "cancelled"},
}
#: Loads by precedence when two meet (they do not, on one server, but a catalog may say so).
_LOAD_ORDER = (LoadKind.CONVERSION, LoadKind.SOURCE, LoadKind.PEER, LoadKind.CACHE)


class Work(NamedTuple):
    """An attempt on the server: ``end`` None while it runs, ``outcome`` ok, failed,
    cancelled, lost or None (still running)."""

    start: float
    end: float | None
    outcome: str | None
    rule: str = ""
    context: str = ""
    run: str = ""


class Load(NamedTuple):
    """A stretch of one load, of one kind (``end`` None while it loads); ``lost``: the
    server was lost before it finished."""

    start: float
    end: float | None
    kind: LoadKind
    context: str = ""
    lost: bool = False


class Warm(NamedTuple):
    """A context held ready on the server (``end`` None while it is)."""

    start: float
    end: float | None
    context: str = ""


class RunSpan(NamedTuple):
    """A run's window (``end`` None while it runs): idle time in it is the run's."""

    run: str
    start: float
    end: float | None


@dataclass
class ServerLife:
    """What one server did, as the ledger needs it."""

    name: str
    joined: float
    left: float | None = None
    gpus: int = 1
    gpu_model: str = "cpu"
    draining: float | None = None
    #: A pilot's batch job: when it started, and when it ended (None: not a pilot, or
    #: not known).
    allocated: float | None = None
    released: float | None = None
    #: When it first loaded or ran something, if known from before the window (an
    #: account of a later stretch: it is no longer starting).
    active_since: float | None = None
    work: list[Work] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    warm: list[Warm] = field(default_factory=list)


class Segment(NamedTuple):
    """A stretch of a server's life in one bucket; ``seconds`` is its share of it
    (less than ``end - start`` where several attempts shared it)."""

    bucket: Bucket
    start: float
    end: float
    seconds: float
    rule: str = ""
    context: str = ""
    run: str = ""


def load_stretches(
    start: float,
    ready: float,
    context: str = "",
    *,
    from_cache: bool | None,
    conversions: int | None = 0,
    reload_seconds: float | None = None,
    peer_seconds: float | None = None,
) -> list[Load]:
    """A load that ended ready at ``ready``, one stretch per kind in the order they
    happened (:func:`~.loads.load_parts`: a conversion then its reload from the cache, a
    fetch from peers then the load from the cache it filled, or one kind)."""
    out: list[Load] = []
    cursor = start
    for kind, part in load_parts(
        ready - start,
        from_cache=from_cache,
        conversions=conversions,
        reload_seconds=reload_seconds,
        peer_seconds=peer_seconds,
    ):
        out.append(Load(cursor, min(ready, cursor + part), kind, context))
        cursor += part
    return out


def life_seconds(server: ServerLife, start: float, end: float) -> float:
    """The seconds of the server's life (its batch allocation included) in a window."""
    low = max(start, min(server.joined, server.allocated or server.joined))
    high = min(end, max(server.left or end, server.released or 0.0))
    return max(0.0, high - low)


def account(
    server: ServerLife, start: float, end: float, runs: Sequence[RunSpan] = ()
) -> list[Segment]:
    """The server's life in ``[start, end]`` as segments, in time order within each
    bucket (see the module for the order of precedence)."""
    life_end = min(end, server.left if server.left is not None else end)
    life = clip([(server.joined, life_end)], start, end)
    segments: list[Segment] = []
    taken: list[Span] = []

    def claim(bucket: Bucket, spans: list[Span]) -> list[Span]:
        nonlocal taken
        mine = subtract(intersect(merge(spans), life), taken)
        taken = merge([*taken, *mine])
        return mine

    work = [w for w in server.work if w.end is None or w.end > w.start]
    lost_loads = [load for load in server.loads if load.lost]
    lost = claim(Bucket.LOST, _work_spans(work, Bucket.LOST, end) + _load_spans(lost_loads, end))
    segments += _shared(
        Bucket.LOST, lost, [(w, _span(w, end)) for w in work if w.outcome == "lost"]
    )
    for kind in _LOAD_ORDER:
        loads = [load for load in server.loads if load.kind == kind and not load.lost]
        if loads:
            bucket = Bucket.loading(kind)
            segments += _loads(
                bucket, claim(bucket, _load_spans(loads, end)), loads, work, runs, end
            )
    segments += _loads(Bucket.LOST, lost, lost_loads, work, runs, end, only_uncovered=True)
    for bucket in (Bucket.RUNNING, Bucket.FAILED):
        mine = claim(bucket, _work_spans(work, bucket, end))
        items = [(w, _span(w, end)) for w in work if w.outcome in _OUTCOMES[bucket]]
        segments += _shared(bucket, mine, items)
    if server.draining is not None:
        drain = claim(Bucket.DRAINING, [(server.draining, life_end)])
        segments += _by_run(Bucket.DRAINING, drain, runs, end)
    first = min(
        [w.start for w in work]
        + [load.start for load in server.loads]
        + [life_end, server.active_since if server.active_since is not None else life_end]
    )
    segments += _by_run(
        Bucket.STARTING, claim(Bucket.STARTING, [(server.joined, first)]), runs, end
    )
    idle = [g for low, high in life for g in gaps(clip(taken, low, high), low, high)]
    warm = merge((w.start, w.end if w.end is not None else end) for w in server.warm)
    segments += _warm(intersect(idle, warm), server.warm, runs, end)
    segments += _by_run(Bucket.IDLE_COLD, subtract(idle, warm), runs, end)
    if server.allocated is not None and server.allocated < server.joined:
        before = clip([(server.allocated, server.joined)], start, end)
        segments += _by_run(Bucket.ALLOCATED_BEFORE, before, runs, end)
    if server.released is not None and server.left is not None and server.released > server.left:
        after = clip([(server.left, server.released)], start, end)
        segments += _by_run(Bucket.ALLOCATED_AFTER, after, runs, end)
    return segments


def _span(item: Work | Load | Warm, end: float) -> Span:
    return (item.start, item.end if item.end is not None else max(item.start, end))


def _work_spans(work: list[Work], bucket: Bucket, end: float) -> list[Span]:
    return [_span(w, end) for w in work if w.outcome in _OUTCOMES[bucket]]


def _load_spans(loads: list[Load], end: float) -> list[Span]:
    return [_span(load, end) for load in loads]


def _shared(bucket: Bucket, spans: list[Span], items: list[tuple[Work, Span]]) -> list[Segment]:
    """The bucket's spans, each second shared equally by the attempts running then."""
    if not spans:
        return []
    points: list[tuple[float, int, int]] = []
    ends = [high for _, high in spans]
    items = sorted(items, key=lambda item: item[1])
    alone = all(items[k][1][0] >= items[k - 1][1][1] for k in range(1, len(items)))
    out: list[Segment] = []
    for index, (w, (a, b)) in enumerate(items):
        i = bisect_right(ends, a)  # the first span that ends after the item starts
        while i < len(spans) and spans[i][0] < b:
            low, high = max(a, spans[i][0]), min(b, spans[i][1])
            if high > low:
                if alone:  # one attempt at a time (one slot): nothing to share
                    out.append(Segment(bucket, low, high, high - low, w.rule, w.context, w.run))
                else:
                    points += [(low, 1, index), (high, -1, index)]
            i += 1
    if alone:
        return out
    points.sort()
    active: dict[int, None] = {}
    cursor = 0.0
    for at, step, index in points:
        if active and at > cursor:
            share = (at - cursor) / len(active)
            for i in active:
                w = items[i][0]
                out.append(Segment(bucket, cursor, at, share, w.rule, w.context, w.run))
        if step > 0:
            active[index] = None
        else:
            active.pop(index, None)
        cursor = at
    return out


def _covering(work: list[Work], at: float, context: str) -> Work | None:
    """The attempt running at ``at`` on the server for ``context`` (a load's asker)."""
    for w in work:
        if (
            w.start <= at
            and (w.end is None or at < w.end)
            and (w.context == context or not context)
        ):
            return w
    return None


def _loads(
    bucket: Bucket,
    spans: list[Span],
    loads: list[Load],
    work: list[Work],
    runs: Sequence[RunSpan],
    end: float,
    *,
    only_uncovered: bool = False,
) -> list[Segment]:
    """A bucket's load spans, each named by its load's context and its asker's rule and
    run (``only_uncovered``: lost loads outside lost attempts, which those name)."""
    out: list[Segment] = []
    losing = merge(_span(w, end) for w in work if w.outcome == "lost")
    for load in loads:
        mine = intersect([_span(load, end)], spans)
        if only_uncovered:
            mine = subtract(mine, losing)
        if not mine:
            continue
        asker = _covering(work, load.start, load.context)
        if asker is not None:
            out += [
                Segment(bucket, a, b, b - a, asker.rule, load.context, asker.run) for a, b in mine
            ]
        else:
            out += _by_run(bucket, mine, runs, end, context=load.context)
    return out


def _warm(
    spans: list[Span], held: list[Warm], runs: Sequence[RunSpan], end: float
) -> list[Segment]:
    """Idle warm spans, each named by the context loaded most recently among those held."""
    out: list[Segment] = []
    if len(held) == 1:
        return _by_run(Bucket.IDLE_WARM, spans, runs, end, context=held[0].context)
    order = sorted(held, key=lambda w: w.start, reverse=True)
    for low, high in spans:
        cursor = low
        while cursor < high:
            ready = [w for w in order if w.start <= cursor and (w.end is None or w.end > cursor)]
            context = ready[0].context if ready else ""
            stop = min([high] + [w.end for w in ready if w.end is not None])
            stop = min([stop] + [w.start for w in order if cursor < w.start < stop])
            out += _by_run(Bucket.IDLE_WARM, [(cursor, stop)], runs, end, context=context)
            cursor = stop
    return out


def _by_run(
    bucket: Bucket, spans: list[Span], runs: Sequence[RunSpan], end: float, context: str = ""
) -> list[Segment]:
    """Spans cut at the runs' starts and ends, each named by the newest run covering it."""
    if not runs:
        return [Segment(bucket, a, b, b - a, context=context) for a, b in spans]
    out: list[Segment] = []
    cuts = sorted({t for r in runs for t in (r.start, r.end if r.end is not None else end)})
    if spans and not any(spans[0][0] < t < spans[-1][1] for t in cuts):
        # No run starts or ends among these spans: one run (or none) for them all.
        low, high = spans[0][0], spans[-1][1]
        covering = [r for r in runs if r.start <= low and (r.end is None or r.end >= high)]
        run = max(covering, key=lambda r: r.start).run if covering else ""
        return [Segment(bucket, a, b, b - a, "", context, run) for a, b in spans]
    for low, high in spans:
        first = bisect_right(cuts, low)
        points = [low]
        while first < len(cuts) and cuts[first] < high:
            points.append(cuts[first])
            first += 1
        points.append(high)
        for a, b in pairwise(points):
            covering = [r for r in runs if r.start <= a and (r.end is None or r.end >= b)]
            run = max(covering, key=lambda r: r.start).run if covering else ""
            out.append(Segment(bucket, a, b, b - a, context=context, run=run))
    return out


def bucket_seconds(segments: Iterable[Segment]) -> dict[Bucket, float]:
    """Seconds per bucket."""
    out: dict[Bucket, float] = {}
    for s in segments:
        out[s.bucket] = out.get(s.bucket, 0.0) + s.seconds
    return out
