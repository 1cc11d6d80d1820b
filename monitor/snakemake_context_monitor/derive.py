"""What the views show, derived in memory from the catalog reader's mirror.

:class:`Derived` rebuilds a list only when what it depends on changed in the last read:
all of them when servers, placements, contexts or losses changed, else only the rows of
the servers and placements whose attempts changed. A read in which nothing changed keeps
every list, the same objects, and the views can tell by identity that nothing is to be
done. The
throughput series and the progress depend on the time and are cheap: bisections in
sorted finish times. Each live server's expected remaining life depends on the time
too: it is estimated as of the last multiple of
:data:`~snakemake_executor_context.catalog.reading.lives.REFRESH_SECONDS` (the same whenever
the monitor started), again after a change to the fleet and when the next multiple
comes (then only the rows whose estimate reads otherwise change).

When no run is live, the views show the last run (:meth:`Derived.last_run`), and when
no server is live either, the fleet view shows that run's servers, ended
(:meth:`Derived.ended`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from snakemake_executor_context.catalog.reading.lives import (
    REFRESH_SECONDS,
    LifeLeft,
    LiveServer,
    lives_left,
)
from snakemake_executor_context.catalog.reading.monitoring import (
    MonitorReader,
    ReadResult,
    ServerRecord,
)
from snakemake_executor_context.catalog.reading.status import (
    ContextRow,
    FleetRow,
    ThroughputRow,
    load_kind,
)

from .rows import EndedFleet, LossTotals, PlacementRow, Progress, Series, ServerRow, TimelineRow

__all__ = ["LIVE_STATES", "RATE_WINDOW", "Derived"]

#: How far back the progress view's recent rate looks (seconds).
RATE_WINDOW = 300.0
#: The states of a run that is live
#: (:func:`~snakemake_executor_context.catalog.reading.history.runs`).
LIVE_STATES = ("running", "stale")


class Derived:
    """The views' lists over one reader (see the module)."""

    def __init__(self, reader: MonitorReader, *, limit: int = 100) -> None:
        self.reader = reader
        self.limit = limit
        self.fleet: list[FleetRow] = []
        self.contexts: list[ContextRow] = []
        self.timeline: list[TimelineRow] = []
        self.loss_totals = LossTotals(0, 0, 0.0, 0, 0)
        self.servers: list[ServerRow] = []
        self.placements: list[PlacementRow] = []
        self.throughput: list[ThroughputRow] = []
        self._first = True
        self._held: dict[int, list[str]] = {}
        self._servers: dict[int, ServerRow] = {}
        self._placements: dict[tuple[int, int], PlacementRow] = {}
        #: Live servers' expected remaining lives by address, and when estimated.
        self._lives: dict[str, LifeLeft] = {}
        self._lives_at: float | None = None
        self._lives_from: tuple[object, frozenset[LiveServer]] | None = None
        #: The last run's ended fleet, and the span it was made for (None: made again).
        self._ended: tuple[tuple[float, float], EndedFleet | None] | None = None

    def update(self, result: ReadResult, now: float | None = None) -> None:
        """Rebuild what the last read changed: every list after a change to the fleet,
        else only the rows of the servers and placements whose attempts changed (and
        of those whose expected life reads otherwise, when it is due again at ``now``;
        None: no estimates)."""
        reader = self.reader
        as_of = None if now is None else now - now % REFRESH_SECONDS
        due = as_of is not None and as_of != self._lives_at
        if result.fleet_changed or self._first:
            live = sorted(
                (s for s in reader.servers.values() if s.left is None),
                key=lambda s: (s.gpu_model, s.name),
            )
            if as_of is not None:
                self._lives = self._estimate(live, as_of)
            self.fleet = _fleet(reader, live)
            self.contexts = _contexts(reader, live)
            self.timeline, self.loss_totals = _timeline(reader, self.limit)
            self._held = _held(reader)
            busy = _busy(reader)
            self._servers = {s.id: _server(reader, s, busy, self._held, self._lives) for s in live}
            self._placements = _placements(reader, live)
        elif result.jobs_changed or due:
            touched = self._servers.keys() & result.servers
            if due and as_of is not None:
                live = [reader.servers[server] for server in self._servers]
                lives = self._estimate(live, as_of)
                touched |= {
                    server
                    for server, row in self._servers.items()
                    if _life_text(lives.get(row.address)) != _life_text(row.life)
                }
                self._lives = lives
                if not touched and not result.jobs_changed:
                    return
            busy = _busy(reader)
            for server in touched:
                record = reader.servers[server]
                self._servers[server] = _server(reader, record, busy, self._held, self._lives)
            for pair in self._placements.keys() & result.pairs:
                row = self._placements[pair]
                self._placements[pair] = replace(row, jobs_warm=reader.warm.get(pair, 0))
        else:
            return
        self._ended = None
        self.servers = list(self._servers.values())
        self.placements = list(self._placements.values())
        self.throughput = _throughput(reader)
        self._first = False

    def _estimate(self, live: list[ServerRecord], as_of: float) -> dict[str, LifeLeft]:
        """The live servers' expected remaining lives as of ``as_of``, by address: made
        again only when the time, the ended lives or the live servers are others (a
        change to the fleet is most often a placement's)."""
        servers = frozenset(
            LiveServer.of(s.address, s.joined, s.group_label, s.partition, s.pool, s.gpu_model)
            for s in live
        )
        history = self.reader.survival
        if as_of == self._lives_at and self._lives_from == (history, servers):
            return self._lives
        self._lives_at, self._lives_from = as_of, (history, servers)
        return lives_left(self.reader.survival, servers, now=as_of)

    def last_run(self, now: float) -> tuple[float, float] | None:
        """The last run's span (started, finished) when no run is live: what the views
        show then. None: a run is live, or none has run."""
        latest = self.reader.runs
        if not latest or any(run.state in LIVE_STATES for run in latest):
            return None
        return latest[0].started, latest[0].finished or now

    def ended(self, span: tuple[float, float] | None) -> EndedFleet | None:
        """The servers of the last run (``span``, from :meth:`last_run`), all ended,
        when no server is live; None when one is, or a run is (``span`` None). The same
        object until the next change read, or another span."""
        if span is None or self._servers:
            return None
        if self._ended is None or self._ended[0] != span:
            self._ended = (span, _ended(self.reader, *span))
        return self._ended[1]

    def series(self, since: float, until: float, buckets: int) -> list[Series]:
        """Successful attempts finished in [since, until], bucketed, overall (``all``,
        first) and per GPU model."""
        width = max(1e-6, (until - since) / buckets)
        out = [Series("all", since, width, [0] * buckets, [0] * buckets)]
        for model, finishes in sorted(self.reader.by_model.items()):
            jobs, items = finishes.buckets(since, since + width * buckets, buckets)
            if not any(jobs):
                continue
            out.append(Series(model, since, width, jobs, items))
            for position in range(buckets):
                out[0].jobs[position] += jobs[position]
                out[0].items[position] += items[position]
        return out

    def since(self, window: float, now: float) -> float:
        """Where a throughput window starts: ``window`` seconds ago, or (0) at the
        first finished attempt."""
        if window:
            return now - window
        first = self.reader.first_finish
        return first if first is not None and first < now else now - 60.0

    def progress(self, now: float) -> Progress | None:
        """The current run (the newest running or stale one, else the newest): jobs
        done of planned, failures, the recent rate and the time left at that rate."""
        latest = self.reader.runs
        if not latest:
            return None
        current = next((r for r in latest if r.state in LIVE_STATES), latest[0])
        recent_from = max(current.started, (current.finished or now) - RATE_WINDOW)
        finishes = self.reader.by_run.get(self.reader.run_pks.get(current.run_id))
        recent = finishes.since(recent_from) if finishes else 0
        span = max(1e-6, (current.finished or now) - recent_from)
        rate = recent * 60.0 / span if recent else None
        total = current.jobs_total
        remaining = (total - current.jobs_ok - current.jobs_failed) if total is not None else None
        eta = None
        if current.state in ("finished", "failed", "interrupted"):
            eta = 0.0
        elif rate and remaining is not None:
            eta = max(0.0, remaining) / rate * 60.0
        return Progress(current, current.jobs_ok, current.jobs_failed, total, rate, eta)


def _held(reader: MonitorReader, *, when_left: bool = False) -> dict[int, list[str]]:
    """server id -> the names of the contexts ready there (``when_left``: ready when
    it left; its leaving closed them), in order."""
    names = {i: c.name for i, c in reader.contexts.items()}
    held: dict[int, list[str]] = {}
    for p in sorted(reader.placements.values(), key=lambda p: names.get(p.context_id, "")):
        if when_left:
            ready = p.state in ("closed", "lost") and p.load_seconds is not None
        else:
            ready = p.state == "ready"
        if ready:
            held.setdefault(p.server_id, []).append(names.get(p.context_id, ""))
    return held


def _busy(reader: MonitorReader) -> dict[int | None, int]:
    """server id -> attempts running there."""
    busy: dict[int | None, int] = {}
    for server, started in reader.pending.values():
        if started is not None:
            busy[server] = busy.get(server, 0) + 1
    return busy


def _life_text(life: LifeLeft | None) -> str | None:
    """An estimate as the views show it (two that read alike need no new row)."""
    return None if life is None else life.text()


def _server(
    reader: MonitorReader,
    s: ServerRecord,
    busy: dict[int | None, int],
    held: dict[int, list[str]],
    lives: dict[str, LifeLeft],
) -> ServerRow:
    ok, failed, items = reader.done.get(s.id, (0, 0, 0))
    return ServerRow(
        address=s.address,
        name=s.name or s.address,
        host=s.host,
        gpu_model=s.gpu_model,
        gpu_name=s.gpu_name,
        gpu_memory_bytes=s.gpu_memory_bytes,
        compute_capability=s.compute_capability,
        slots=s.slots,
        busy=busy.get(s.id, 0),
        contexts=held.get(s.id, []),
        jobs_ok=ok,
        jobs_failed=failed,
        items=items,
        joined=s.joined,
        busy_seconds=reader.busy_seconds.get(s.id, 0.0),
        last_end=reader.last_end.get(s.id),
        life=lives.get(s.address),
        left=s.left,
    )


def _ended(reader: MonitorReader, since: float, until: float) -> EndedFleet | None:
    """The ended servers whose lives overlap [since, until] (a run's span: its servers,
    as the ledger counts them): each one's row (lost: a loss names it), and the rows by
    GPU model. None: there are none."""
    ended = sorted(
        (
            s
            for s in reader.servers.values()
            if s.left is not None and s.joined <= until and s.left >= since
        ),
        key=lambda s: (s.gpu_model, s.name),
    )
    if not ended:
        return None
    lost = {loss.server_id for loss in reader.losses.values()}
    held = _held(reader, when_left=True)
    rows = [replace(_server(reader, s, {}, held, {}), lost=s.id in lost) for s in ended]
    return EndedFleet(_fleet(reader, ended), rows)


def _placements(
    reader: MonitorReader, live: list[ServerRecord]
) -> dict[tuple[int, int], PlacementRow]:
    """Per context and live server: the latest placement, loads and evictions there,
    and the jobs that found it warm."""
    servers = {s.id: s for s in live}
    latest: dict[tuple[int, int], Any] = {}
    loads: dict[tuple[int, int], tuple[int, int]] = {}
    for p in reader.placements.values():
        pair = (p.server_id, p.context_id)
        count, evicted = loads.get(pair, (0, 0))
        loads[pair] = (count + 1, evicted + (p.state == "evicted"))
        if p.server_id in servers and (pair not in latest or p.id > latest[pair].id):
            latest[pair] = p
    rows = []
    for pair, p in latest.items():
        server, context = servers[pair[0]], reader.contexts[pair[1]]
        row = PlacementRow(
            context=context.name,
            identity=context.identity,
            server=server.name or server.address,
            address=server.address,
            gpu_model=server.gpu_model,
            state=p.state,
            load_seconds=p.load_seconds,
            from_cache=p.from_cache,
            kind=(
                load_kind(p.from_cache, p.conversions, p.peer_seconds).value
                if p.load_seconds is not None
                else ""
            ),
            loads=loads[pair][0],
            evictions=loads[pair][1],
            jobs_warm=reader.warm.get(pair, 0),
            ranks=p.ranks or 1,
        )
        rows.append(((context.name, server.name), pair, row))
    rows.sort(key=lambda entry: entry[0])
    return {pair: row for _, pair, row in rows}


def _fleet(reader: MonitorReader, live: list[ServerRecord]) -> list[FleetRow]:
    """Live servers by GPU model, and how many of each model left or were lost."""
    lost_servers = {loss.server_id for loss in reader.losses.values()}
    present: dict[str, list[ServerRecord]] = {}
    for s in live:
        present.setdefault(s.gpu_model, []).append(s)
    gone: dict[str, tuple[int, int]] = {}
    for s in reader.servers.values():
        if s.left is not None:
            left, lost = gone.get(s.gpu_model, (0, 0))
            gone[s.gpu_model] = (left + 1, lost + (s.id in lost_servers))
    rows = [
        FleetRow(
            gpu_model=model,
            gpu_name=_most(s.gpu_name for s in members),
            servers=len(members),
            slots=sum(s.slots or 0 for s in members),
            gpu_memory_bytes=_most(s.gpu_memory_bytes for s in members),
            compute_capability=_most(s.compute_capability for s in members),
            names=sorted(s.name for s in members),
            left=gone.get(model, (0, 0))[0],
            lost=gone.get(model, (0, 0))[1],
        )
        for model, members in present.items()
    ]
    for model, (left, lost) in gone.items():
        if model not in present:
            rows.append(FleetRow(model, None, 0, 0, None, None, [], left, lost))
    return sorted(rows, key=lambda row: (-row.servers, row.gpu_model))


def _contexts(reader: MonitorReader, live: list[ServerRecord]) -> list[ContextRow]:
    """Every context, the live servers it is warm (or loading) on, and its loads."""
    servers = {s.id: s for s in live}
    where: dict[int, tuple[list[ServerRecord], list[ServerRecord]]] = {}
    stats: dict[int, tuple[int, float, int]] = {}
    kinds: dict[int, dict[str, int]] = {}
    for p in reader.placements.values():
        if p.state in ("loading", "ready") and p.server_id in servers:
            warm, loading = where.setdefault(p.context_id, ([], []))
            (warm if p.state == "ready" else loading).append(servers[p.server_id])
        loads, seconds, cached = stats.get(p.context_id, (0, 0.0, 0))
        if p.load_seconds is not None:
            loads, seconds = loads + 1, seconds + p.load_seconds
            kind = load_kind(p.from_cache, p.conversions, p.peer_seconds).value
            into = kinds.setdefault(p.context_id, {})
            into[kind] = into.get(kind, 0) + 1
        stats[p.context_id] = (loads, seconds, cached + (p.from_cache is True))
    rows = []
    for c in sorted(reader.contexts.values(), key=lambda c: c.name):
        warm, loading = where.get(c.id, ([], []))
        loads, seconds, cached = stats.get(c.id, (0, 0.0, 0))
        mean = seconds / loads if loads else None
        got = kinds.get(c.id, {})
        rows.append(ContextRow.of(c, _names(warm), _names(loading), loads, mean, cached, got))
    return rows


def _timeline(reader: MonitorReader, limit: int) -> tuple[list[TimelineRow], LossTotals]:
    """The latest joins, departures and losses, newest first, and the running totals."""
    servers = reader.servers
    joins = sorted(servers.values(), key=lambda s: s.joined, reverse=True)[:limit]
    rows = [
        TimelineRow(s.joined, "joined", s.name or s.address, s.address, s.gpu_model) for s in joins
    ]
    lost_at = set()
    for loss in sorted(reader.losses.values(), key=lambda x: (x.at, x.id), reverse=True)[:limit]:
        s = servers[loss.server_id]
        name = s.name or s.address
        rows.append(
            TimelineRow(
                loss.at,
                "lost",
                name,
                s.address,
                s.gpu_model,
                loss.reason,
                loss.jobs_lost,
                loss.seconds_lost,
                list(loss.jobs),
            )
        )
        lost_at.add((s.address, round(loss.at, 3)))
    gone = [s for s in servers.values() if s.left is not None]
    for s in sorted(gone, key=lambda s: s.left or 0.0, reverse=True)[:limit]:
        if s.left is not None and (s.address, round(s.left, 3)) not in lost_at:
            name = s.name or s.address
            rows.append(
                TimelineRow(s.left, "left", name, s.address, s.gpu_model, s.left_reason or "")
            )
    rows.sort(key=lambda row: row.at, reverse=True)
    losses = reader.losses.values()
    totals = LossTotals(
        servers_lost=len(losses),
        jobs_sent_back=sum(loss.jobs_lost for loss in losses),
        seconds_lost=float(sum(loss.seconds_lost for loss in losses)),
        servers_joined=len(servers),
        servers_left=len(gone),
    )
    return rows[:limit], totals


def _throughput(reader: MonitorReader) -> list[ThroughputRow]:
    """Jobs, mean job seconds and items per second by context and GPU model."""
    grouped: dict[tuple[str, str], tuple[int, float, int]] = {}
    for (context_id, server_id), (jobs, seconds, items) in reader.totals.items():
        if context_id is None or server_id is None:
            continue
        context, server = reader.contexts.get(context_id), reader.servers.get(server_id)
        key = (context.name if context else "?", server.gpu_model if server else "cpu")
        before = grouped.get(key, (0, 0.0, 0))
        grouped[key] = (before[0] + jobs, before[1] + seconds, before[2] + items)
    return [
        ThroughputRow(
            context=context,
            gpu_model=model,
            jobs=jobs,
            mean_job_seconds=seconds / jobs if jobs else 0.0,
            items=items,
            items_per_second=(items / seconds) if items and seconds else None,
        )
        for (context, model), (jobs, seconds, items) in sorted(grouped.items())
    ]


def _most(values: Iterable[Any]) -> Any:
    """The largest value that is not None (SQL's ``max``)."""
    return max((v for v in values if v is not None), default=None)


def _names(servers: list[ServerRecord]) -> list[str]:
    return [s.name or s.address for s in sorted(servers, key=lambda s: s.name)]
