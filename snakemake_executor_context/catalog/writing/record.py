"""How events become rows: one :class:`Recorder` per writer.

The events of a job's life (dispatched, started, finished, reported, its story),
most of what a run sends, are applied together where a batch has them one after
another (:class:`_JobBatch`): a few statements a batch, not a dozen a job. Every
other event kind has one handler. Both tolerate any order between events that come
from different processes (a server's ``JobStarted`` may reach the writer before the
executor's ``JobDispatched``) and duplicates (a run that attaches replays the fleet's
state); run totals count a job once.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Float, Select, Table, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from ...fleet import events as ev
from ...fleet.keys import is_attempt_key
from ...fleet.state import model_of
from ...strays.processes import pid_alive
from ...terminal import format_bytes
from ..models import (
    RUN_INTERRUPTED,
    Attempt,
    Base,
    Context,
    DamagedEntry,
    EventRecord,
    Job,
    JobOutput,
    Pilot,
    Placement,
    Run,
    Server,
    ServerLoss,
    Transfer,
)

__all__ = ["Recorder", "mark_abandoned"]

K = TypeVar("K")
OPEN_STATES = ("loading", "ready")
CACHE_SIZE = 50_000
#: The events of a job's life: consecutive ones in a batch are applied together.
JOB_EVENTS = (ev.JobDispatched, ev.JobStarted, ev.JobFinished, ev.JobReported, ev.JobStory)
#: Per-job events applied together at most (it bounds the lists a select names).
BULK_SIZE = 2_000


class _Lru(OrderedDict[K, int]):
    def put(self, key: K, value: int) -> int:
        self[key] = value
        self.move_to_end(key)
        if len(self) > CACHE_SIZE:
            self.popitem(last=False)
        return value


def _found_or_made(
    session: Session, cache: _Lru[K], key: K, query: Any, make: Callable[[], Any]
) -> int:
    """The id of the row ``key`` names: from ``cache``, else from ``query``, else of the
    row ``make`` returns, added and flushed (and ``cache`` remembers it)."""
    found = cache.get(key)
    if found is None:
        found = session.scalar(query)
        if found is None:
            row = make()
            session.add(row)
            session.flush()
            found = row.id
        cache.put(key, found)
    return found


def mark_abandoned(
    session: Session,
    now: float,
    host: str,
    alive: Callable[[int], bool] | None = None,
    stale_seconds: float = 60.0,
) -> list[str]:
    """End the runs whose writer stopped without ending them: no heartbeat for
    ``stale_seconds``, or their process on this host is gone. An abandoned run has
    ``finished`` set and ``ok`` left NULL (a run that ended itself always sets ``ok``),
    and a ``run-abandoned`` note. Returns their run ids."""
    if alive is None:
        alive = pid_alive
    marked = []
    for row in session.scalars(select(Run).where(Run.finished.is_(None))):
        beat = row.heartbeat if row.heartbeat is not None else row.started
        dead = row.host == host and bool(row.pid) and not alive(row.pid)
        if now - beat <= stale_seconds and not dead:
            continue
        row.finished = beat
        row.ok = None
        session.add(
            EventRecord(
                at=now,
                kind="run-abandoned",
                text=f"run {row.run_id} abandoned: its writer stopped without ending it",
                run_pk=row.id,
            )
        )
        marked.append(row.run_id)
    return marked


class Recorder:
    """Applies events to a session; caches the ids of rows it has seen."""

    def __init__(self) -> None:
        self._runs: _Lru[str] = _Lru()
        self._servers: _Lru[str] = _Lru()
        self._contexts: _Lru[str] = _Lru()
        self._attempts: _Lru[str] = _Lru()
        #: Jobs whose outputs are recorded (by job id).
        self._outputs: _Lru[int] = _Lru()
        self._handlers: dict[type[ev.Event], Callable[[Session, Any], None]] = {
            ev.RunStarted: self._run_started,
            ev.RunHeartbeat: self._run_heartbeat,
            ev.RunFinished: self._run_finished,
            ev.ServerJoined: self._server_joined,
            ev.ServerDescribed: self._server_described,
            ev.ServerLeft: self._server_left,
            ev.AttemptsLost: self._attempts_lost,
            ev.ServerKillInjected: self._kill_injected,
            ev.ServerDraining: self._draining,
            ev.ContextLoading: self._context_loading,
            ev.ContextReady: self._context_ready,
            ev.ContextEvicted: self._context_ended,
            ev.ContextLoadFailed: self._context_ended,
            ev.ContextTransferred: self._context_transferred,
            ev.CacheEntryDamaged: self._cache_entry_damaged,
            ev.GangFormed: self._gang_formed,
            ev.GangAssembled: self._gang_assembled,
            ev.PilotBooked: self._pilot_booked,
        }

    def reset(self) -> None:
        """Forget cached ids (after a rolled-back transaction)."""
        for cache in (self._runs, self._servers, self._contexts, self._attempts, self._outputs):
            cache.clear()

    def apply(self, session: Session, events: Iterable[ev.Event]) -> None:
        """Apply events in order, inside the caller's transaction: each run of
        consecutive per-job events together, every other event by its handler."""
        jobs: list[ev.Event] = []
        for event in events:
            if isinstance(event, JOB_EVENTS):
                jobs.append(event)
                continue
            if jobs:
                self._apply_jobs(session, jobs)
                jobs = []
            handler = self._handlers.get(type(event))
            if handler is not None:
                handler(session, event)
        if jobs:
            self._apply_jobs(session, jobs)

    # -- lookups -------------------------------------------------------------------

    def _run(self, session: Session, run_id: str, at: float) -> int:
        query = select(Run.id).where(Run.run_id == run_id)
        return _found_or_made(
            session, self._runs, run_id, query, lambda: Run(run_id=run_id, started=at, heartbeat=at)
        )

    def _server(self, session: Session, address: str, at: float) -> int:
        found = self._known_server(session, address)
        if found is None:
            row = Server(address=address, joined=at)
            session.add(row)
            session.flush()
            found = self._servers.put(address, row.id)
        return found

    def _known_server(self, session: Session, address: str) -> int | None:
        """The live server at ``address``, if the catalog has one (none is made)."""
        found = self._servers.get(address)
        if found is None:
            found = session.scalar(
                select(Server.id)
                .where(Server.address == address, Server.left.is_(None))
                .order_by(Server.id.desc())
                .limit(1)
            )
            if found is not None:
                self._servers.put(address, found)
        return found

    def _context(self, session: Session, identity: str, at: float, name: str = "") -> int:
        query = select(Context.id).where(Context.identity == identity)
        return _found_or_made(
            session,
            self._contexts,
            identity,
            query,
            lambda: Context(identity=identity, name=name, first_seen=at),
        )

    def _attempt(self, session: Session, key: str) -> int | None:
        found = self._attempts.get(key)
        if found is None:
            found = session.scalar(
                select(Attempt.id).where(Attempt.key == key).order_by(Attempt.id.desc()).limit(1)
            )
            if found is not None:
                self._attempts.put(key, found)
        return found

    def _new_attempt(self, session: Session, key: str, **values: Any) -> int:
        row = Attempt(key=key, **values)
        session.add(row)
        session.flush()
        return self._attempts.put(key, row.id)

    def _note(
        self,
        session: Session,
        kind: str,
        at: float,
        text: str,
        *,
        run_pk: int | None = None,
        server_id: int | None = None,
    ) -> None:
        session.add(EventRecord(at=at, kind=kind, text=text, run_pk=run_pk, server_id=server_id))

    # -- runs ----------------------------------------------------------------------

    def _run_started(self, session: Session, event: ev.RunStarted) -> None:
        run_pk = self._run(session, event.run_id, event.at)
        session.execute(
            update(Run)
            .where(Run.id == run_pk)
            .values(
                workdir=event.workdir,
                host=event.host,
                pid=event.pid,
                cluster=event.cluster,
                jobs_total=event.jobs_total,
                started=event.at,
                heartbeat=event.at,
            )
        )
        jobs = f", {event.jobs_total} job(s) planned" if event.jobs_total is not None else ""
        text = f"run {event.run_id} started in {event.workdir}{jobs}"
        self._note(session, "run-started", event.at, text, run_pk=run_pk)

    def _run_heartbeat(self, session: Session, event: ev.RunHeartbeat) -> None:
        run_pk = self._run(session, event.run_id, event.at)
        session.execute(update(Run).where(Run.id == run_pk).values(heartbeat=event.at))

    def _run_finished(self, session: Session, event: ev.RunFinished) -> None:
        run_pk = self._run(session, event.run_id, event.at)
        session.execute(
            update(Run)
            .where(Run.id == run_pk)
            .values(finished=event.at, heartbeat=event.at, ok=event.ok)
        )
        # Every attempt has an outcome once its run ends: one no word ended (moved
        # off a server that left before any record of it) was given up, so cancelled.
        session.execute(
            update(Attempt)
            .where(
                Attempt.job_id.in_(select(Job.id).where(Job.run_pk == run_pk)),
                Attempt.outcome.is_(None),
            )
            .values(outcome="cancelled", finished=func.coalesce(Attempt.finished, event.at))
        )
        if event.interrupted:
            text = f"run {event.run_id} interrupted: cancelled before its jobs were done"
            self._note(session, RUN_INTERRUPTED, event.at, text, run_pk=run_pk)
            return
        self._note(session, "run-finished", event.at, f"run {event.run_id} ended", run_pk=run_pk)

    # -- servers -------------------------------------------------------------------

    def _server_joined(self, session: Session, event: ev.ServerJoined) -> None:
        known = self._servers.get(event.address) is not None
        server_id = self._server(session, event.address, event.at)
        values: dict[str, Any] = {"slots": event.slots, "memory_bytes": event.memory_bytes or None}
        # A CPU server's stand-in GPU counts as one; so does a pilot without GPUs.
        values["gpus"] = max(1, round(event.resources.get("gpu", 1) or 1))
        if event.name:
            values["name"] = event.name
        if event.host:
            values["host"] = event.host
        row = session.get(Server, server_id)
        if row is not None and row.gpu_name is None:
            values["gpu_model"] = model_of(event.resources)
        session.execute(update(Server).where(Server.id == server_id).values(**values))
        if not known:
            text = f"{event.name or event.address} joined ({event.address})"
            self._note(session, "server-joined", event.at, text, server_id=server_id)

    def _server_described(self, session: Session, event: ev.ServerDescribed) -> None:
        server_id = self._server(session, event.address, event.at)
        gpu = event.gpu or {}
        values: dict[str, Any] = {
            "pid": event.pid or None,
            "memory_budget": event.memory_budget or None,
            "gpu_model": model_of({}, gpu) if gpu else "cpu",
        }
        if event.name:
            values["name"] = event.name
        if event.host:
            values["host"] = event.host
        if event.memory_bytes:
            values["memory_bytes"] = event.memory_bytes
        if event.allocated_at:
            values["allocated_at"] = event.allocated_at
        for column, value in (
            ("partition", event.partition),
            ("pool", event.pool),
            ("group_label", event.group),
        ):
            if value:
                values[column] = value
        if gpu:
            values.update(
                gpu_index=gpu.get("index"),
                gpu_uuid=gpu.get("uuid"),
                gpu_name=gpu.get("name"),
                gpu_memory_bytes=gpu.get("memory_bytes"),
                compute_capability=gpu.get("compute_capability"),
                is_mig=bool(gpu.get("is_mig")),
            )
        session.execute(update(Server).where(Server.id == server_id).values(**values))

    def _kill_injected(self, session: Session, event: ev.ServerKillInjected) -> None:
        server_id = self._server(session, event.address, event.at)
        name = event.name or event.address
        text = f"{name}: injected signal {event.signal} (pid {event.pid})"
        self._note(session, "kill-injected", event.at, text, server_id=server_id)

    def _draining(self, session: Session, event: ev.ServerDraining) -> None:
        server_id = self._server(session, event.address, event.at)
        session.execute(
            update(Server)
            .where(Server.id == server_id, Server.draining_at.is_(None))
            .values(draining_at=event.at)
        )
        text = (
            f"{event.name or event.address}: {event.why}, draining within {event.grace:.0f} s; "
            f"finishing {len(event.finishing)} job(s), handing back {len(event.handed_back)}"
        )
        self._note(session, "server-draining", event.at, text, server_id=server_id)

    def _server_left(self, session: Session, event: ev.ServerLeft) -> None:
        server_id = self._server(session, event.address, event.at)
        session.execute(
            update(Server)
            .where(Server.id == server_id)
            .values(left=event.at, left_reason=event.reason, ended_by=str(event.cause().kind))
        )
        session.execute(
            update(Placement)
            .where(Placement.server_id == server_id, Placement.state.in_(OPEN_STATES))
            .values(state="closed" if event.expected else "lost", ended_at=event.at)
        )
        self._servers.pop(event.address, None)
        name = session.scalar(select(Server.name).where(Server.id == server_id)) or event.address
        lost = event.lost_jobs()
        if event.restarted:  # the plugin's own restart: its jobs were being stopped
            for job in lost:
                session.execute(
                    update(Attempt)
                    .where(Attempt.key == job.key, Attempt.outcome.is_(None))
                    .values(outcome="cancelled", finished=event.at, server_id=server_id)
                )
            text = f"{name} restarted by the plugin ({event.restarted})"
            self._note(session, "server-restarted", event.at, text, server_id=server_id)
            return
        if not lost:
            self._note(
                session,
                "server-left",
                event.at,
                f"{name} left ({event.reason})",
                server_id=server_id,
            )
            return
        loss = ServerLoss(server_id=server_id, at=event.at, reason=event.reason)
        session.add(loss)
        session.flush()
        self._lose(session, loss, lost, event.at)
        self._note(
            session,
            "server-lost",
            event.at,
            f"{name} lost with {len(lost)} job(s) running, {loss.seconds_lost:.1f} s of work "
            f"({event.reason})",
            server_id=server_id,
        )

    def _attempts_lost(self, session: Session, event: ev.AttemptsLost) -> None:
        """A run's attempts its server's loss record missed: added to that loss (made
        if the server's leaving recorded none)."""
        server_id = session.scalar(
            select(Server.id).where(Server.address == event.address).order_by(Server.id.desc())
        )
        if server_id is None:
            server_id = self._server(session, event.address, event.at)
        loss = session.scalars(
            select(ServerLoss).where(ServerLoss.server_id == server_id).order_by(ServerLoss.id)
        ).first()
        if loss is None:
            loss = ServerLoss(server_id=server_id, at=event.at, reason=event.reason)
            session.add(loss)
            session.flush()
        lost = event.lost_jobs()
        self._lose(session, loss, lost, loss.at)
        text = f"{len(lost)} more job(s) lost with it, as run {event.run_id} placed them"
        self._note(session, "server-lost", event.at, text, server_id=server_id)

    def _lose(self, session: Session, loss: ServerLoss, lost: list[ev.LostJob], at: float) -> None:
        """Mark ``lost``'s attempts lost with ``loss`` (at ``at``) and count them in it."""
        seconds = 0.0
        for job in lost:
            attempt_id = self._attempt(session, job.key)
            started = job.started
            if attempt_id is None:
                attempt_id = self._new_attempt(
                    session, job.key, server_id=loss.server_id, started=started
                )
            elif started is None:
                started = session.scalar(select(Attempt.started).where(Attempt.id == attempt_id))
            seconds += max(0.0, at - started) if started else 0.0
            session.execute(
                update(Attempt)
                .where(Attempt.id == attempt_id)
                .values(outcome="lost", finished=at, loss_id=loss.id, server_id=loss.server_id)
            )
        loss.jobs_lost = (loss.jobs_lost or 0) + len(lost)
        loss.seconds_lost = (loss.seconds_lost or 0.0) + seconds

    # -- contexts ------------------------------------------------------------------

    def _open_placement(self, session: Session, server_id: int, context_id: int) -> int | None:
        return session.scalar(
            select(Placement.id)
            .where(
                Placement.server_id == server_id,
                Placement.context_id == context_id,
                Placement.state.in_(OPEN_STATES),
            )
            .order_by(Placement.id.desc())
            .limit(1)
        )

    def _context_loading(self, session: Session, event: ev.ContextLoading) -> None:
        context_id = self._context(session, event.identity, event.at, event.name)
        session.execute(
            update(Context)
            .where(Context.id == context_id)
            .values(
                name=event.name,
                loader=event.loader,
                arguments=json.dumps(event.arguments, sort_keys=True, default=str),
            )
        )
        server_id = self._server(session, event.address, event.at)
        placement_id = self._open_placement(session, server_id, context_id)
        if placement_id is None:
            self._set_placement(
                session,
                None,
                context_id,
                server_id,
                state="loading",
                loading_at=event.at,
                from_cache=event.from_cache,
            )

    def _set_placement(
        self,
        session: Session,
        placement_id: int | None,
        context_id: int,
        server_id: int,
        **values: Any,
    ) -> None:
        """Set ``values`` on placement ``placement_id``; without one, add a placement of
        the context on the server with them."""
        if placement_id is None:
            session.add(Placement(context_id=context_id, server_id=server_id, **values))
        else:
            session.execute(update(Placement).where(Placement.id == placement_id).values(**values))

    def _context_ready(self, session: Session, event: ev.ContextReady) -> None:
        context_id = self._context(session, event.identity, event.at)
        server_id = self._server(session, event.address, event.at)
        placement_id = self._open_placement(session, server_id, context_id)
        values = {
            "state": "ready",
            "ready_at": event.at,
            "load_seconds": event.load_seconds,
            "bytes": event.bytes or None,
            "conversions": event.conversions,
            "reload_seconds": event.reload_seconds,
            "peer_seconds": event.peer_seconds,
        }
        if placement_id is None:
            values["loading_at"] = event.at - event.load_seconds
        self._set_placement(session, placement_id, context_id, server_id, **values)
        if event.bytes:
            session.execute(
                update(Context).where(Context.id == context_id).values(bytes=event.bytes)
            )
        context_name = session.scalar(select(Context.name).where(Context.id == context_id))
        server_name = session.scalar(select(Server.name).where(Server.id == server_id))
        self._note(
            session,
            "context-ready",
            event.at,
            f"{context_name or event.identity[:10]} loaded on {server_name or event.address} in "
            f"{event.load_seconds:.1f} s",
            server_id=server_id,
        )

    def _context_ended(
        self, session: Session, event: ev.ContextEvicted | ev.ContextLoadFailed
    ) -> None:
        context_id = self._context(session, event.identity, event.at)
        server_id = self._server(session, event.address, event.at)
        placement_id = self._open_placement(session, server_id, context_id)
        failed = isinstance(event, ev.ContextLoadFailed)
        if placement_id is not None:
            session.execute(
                update(Placement)
                .where(Placement.id == placement_id)
                .values(state="failed" if failed else "evicted", ended_at=event.at)
            )
        name = session.scalar(select(Context.name).where(Context.id == context_id))
        text = (
            f"load of {name} failed: {event.error}"
            if isinstance(event, ev.ContextLoadFailed)
            else f"{name} evicted"
        )
        self._note(
            session,
            "context-failed" if failed else "context-evicted",
            event.at,
            text[:2000],
            server_id=server_id,
        )

    def _gang_assembled(self, session: Session, event: ev.GangAssembled) -> None:
        """Pilots on several nodes became one server: a note on its leader."""
        leader_id = self._server(session, event.leader, event.at)
        ids = [self._server(session, a, event.at) for a in (event.leader, *event.members)]
        names = [
            session.scalar(select(Server.name).where(Server.id == server_id)) or address
            for server_id, address in zip(ids, (event.leader, *event.members), strict=True)
        ]
        text = (
            f"{names[0]} leads {', '.join(names[1:])}: one server of {len(names)} nodes "
            f"({', '.join(event.nodes)}), {sum(event.devices)} GPU(s)"
        )
        self._note(session, "gang-assembled", event.at, text, server_id=leader_id)

    def _gang_formed(self, session: Session, event: ev.GangFormed) -> None:
        """A gang's members, on the placement of its context (open since its load)."""
        context_id = self._context(session, event.identity, event.at, event.name)
        server_id = self._server(session, event.address, event.at)
        placement_id = self._open_placement(session, server_id, context_id)
        members = [
            {"rank": rank, "device": device, "node": node, "pid": pid, "bytes": nbytes}
            for rank, (device, node, pid, nbytes) in enumerate(
                zip(event.devices, event.nodes, event.pids, event.rank_bytes, strict=False)
            )
        ]
        gang = json.dumps({"backend": event.backend, "members": members}, sort_keys=True)
        ranks = len(event.devices)
        values: dict[str, Any] = {"ranks": ranks, "gang": gang}
        if placement_id is None:
            values.update(state="loading", loading_at=event.at)
        self._set_placement(session, placement_id, context_id, server_id, **values)
        server = session.scalar(select(Server.name).where(Server.id == server_id))
        nodes = sorted(set(event.nodes))
        text = (
            f"{event.name or event.identity[:10]}: a gang of {ranks} ranks on "
            f"{server or event.address} ({', '.join(event.devices)}; {event.backend}; "
            f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes) or '?'})"
        )
        self._note(session, "gang-formed", event.at, text, server_id=server_id)

    def _context_transferred(self, session: Session, event: ev.ContextTransferred) -> None:
        context_id = self._context(session, event.identity, event.at)
        server_id = self._server(session, event.address, event.at)
        # The holder's row when a live server is there (never made up: an address
        # that is not a server of the catalog stays an address).
        peer_id = self._known_server(session, event.peer) if event.peer else None
        outcome = (event.outcome or "ok")[:512]
        session.add(
            Transfer(
                context_id=context_id,
                server_id=server_id,
                peer=event.peer[:256],
                peer_server_id=peer_id,
                at=event.at,
                bytes=event.bytes,
                seconds=event.seconds,
                outcome=outcome,
            )
        )
        context = session.scalar(select(Context.name).where(Context.id == context_id))
        receiver = session.scalar(select(Server.name).where(Server.id == server_id))
        holder = session.scalar(select(Server.name).where(Server.id == peer_id)) if peer_id else ""
        name, to = context or event.identity[:10], receiver or event.address
        got = f"{format_bytes(event.bytes)} in {event.seconds:.1f} s"
        if outcome == "ok":
            text = f"{name} fetched from {holder or event.peer} by {to}: {got}"
        elif event.peer:
            text = f"{name} from {holder or event.peer} to {to} ended early ({got}): "
            text += outcome
        else:
            text = f"{name}: no peer could serve {to}: {outcome}"
        self._note(session, "context-transferred", event.at, text[:2000], server_id=server_id)

    def _cache_entry_damaged(self, session: Session, event: ev.CacheEntryDamaged) -> None:
        server_id = self._server(session, event.address, event.at)
        context_id = self._context(session, event.identity, event.at) if event.identity else None
        session.add(
            DamagedEntry(
                server_id=server_id,
                context_id=context_id,
                at=event.at,
                entry=event.entry,
                aside=event.aside,
                problem=event.problem[:2000],
            )
        )
        server = session.scalar(select(Server.name).where(Server.id == server_id))
        where = f"moved aside to {event.aside}" if event.aside else "moved aside"
        text = f"{server or event.address}: the cache entry {event.entry} is damaged "
        text += f"({event.problem}), {where}"
        self._note(session, "cache-entry-damaged", event.at, text[:2000], server_id=server_id)

    # -- jobs ----------------------------------------------------------------------

    def _apply_jobs(self, session: Session, events: list[ev.Event]) -> None:
        """Apply consecutive per-job events together (see :class:`_JobBatch`)."""
        session.flush()  # the rows earlier handlers added take their ids first, in order
        for start in range(0, len(events), BULK_SIZE):
            _JobBatch(self, session, events[start : start + BULK_SIZE]).apply()

    # -- pools ---------------------------------------------------------------------

    def _pilot_booked(self, session: Session, event: ev.PilotBooked) -> None:
        values = {
            "kind": event.pilot_kind,
            "job_id": event.job_id,
            "registered": event.registered,
            "first_task": event.first_task,
            "ended": event.ended,
            "batch_state": event.batch_state,
            "busy_seconds": event.busy_seconds,
            "released": event.released,
        }
        found = session.scalar(
            select(Pilot.id).where(Pilot.name == event.name, Pilot.submitted == event.submitted)
        )
        if found is None:
            session.add(Pilot(name=event.name, submitted=event.submitted, **values))
        else:
            session.execute(update(Pilot).where(Pilot.id == found).values(**values))


def _defaults(table: Table) -> dict[str, Any]:
    """A new row of ``table`` as the ORM would insert it when given no values."""
    return {
        column.name: column.default.arg
        if isinstance(column.default, ScalarElementColumnDefault)
        else None
        for column in table.columns
        if not column.primary_key
    }


@dataclass(eq=False)
class _Row:
    """A row as a batch leaves it. ``values``: its columns (of a row the catalog had,
    those the batch reads or sets); ``changed``: those the batch set on such a row
    (None: a row the batch adds). ``id``: 0 until an added row is inserted."""

    id: int
    values: dict[str, Any]
    changed: set[str] | None

    @property
    def ref(self) -> int | _Row:
        """What another row holds of it: its id, or itself until it is inserted."""
        return self.id or self

    def set(self, **values: Any) -> None:
        """Change columns of the row."""
        self.values.update(values)
        if self.changed is not None:
            self.changed.update(values)


def _id(value: Any) -> Any:
    """A column's value: a row's id (the row inserted by then) for the row."""
    return value.id if isinstance(value, _Row) else value


def _resolved(values: dict[str, Any]) -> dict[str, Any]:
    return {name: _id(value) for name, value in values.items()}


class _JobBatch:
    """Consecutive per-job events of a batch, applied together: the rows they name
    are looked up with one select a table, their changes folded in memory in event
    order (as one event after another would make them), then written in a few
    statements: one insert a table, one update for each set of columns changed, one
    update of the runs' totals.

    Events come in any order between processes (a server's ``JobStarted`` may come
    before the executor's ``JobDispatched``), and twice (a run that attaches replays
    the fleet's state): nothing is counted twice.
    """

    def __init__(self, recorder: Recorder, session: Session, events: list[ev.Event]) -> None:
        self.recorder = recorder
        self.session = session
        self.events = events
        self.runs: dict[str, int | _Row] = {}
        self.contexts: dict[str, int | _Row] = {}
        self.servers: dict[str, int | _Row] = {}
        self.jobs: dict[tuple[int | _Row, str], _Row] = {}
        #: Each key's attempts, oldest first; and all of them.
        self.attempts: dict[str, list[_Row]] = {}
        self.all_attempts: list[_Row] = []
        #: Jobs whose outputs are recorded.
        self.with_outputs: set[int | _Row] = set()
        #: The rows to add, by table, in the order they were made.
        self.added: dict[Table, list[_Row]] = {}
        #: What each run's totals gain: jobs ok and failed, items, loads, heartbeat.
        self.totals: dict[int | _Row, list[Any]] = {}

    def apply(self) -> None:
        """Look the batch's rows up, fold its events, write the result."""
        self._look_up()
        for event in self.events:
            if isinstance(event, ev.JobDispatched):
                self._dispatched(event)
            elif isinstance(event, ev.JobStarted):
                self._started(event)
            elif isinstance(event, ev.JobFinished):
                self._finished(event)
            elif isinstance(event, ev.JobReported):
                self._reported(event)
            elif isinstance(event, ev.JobStory):
                self._story(event)
        self._write()
        self._remember()

    # -- looking up ------------------------------------------------------------------

    def _look_up(self) -> None:
        """The rows the catalog has of the runs, contexts, servers, jobs and attempts
        the events name (cached ids first)."""
        recorder, session = self.recorder, self.session
        run_ids: set[str] = set()
        identities: set[str] = set()
        addresses: set[str] = set()
        keys: set[str] = set()
        job_ids: set[tuple[str, str]] = set()
        for event in self.events:
            if isinstance(event, ev.JobDispatched | ev.JobReported | ev.JobStory):
                run_ids.add(event.run_id)
                job_ids.add((event.run_id, str(event.jobid)))
            if isinstance(event, ev.JobDispatched):
                identities.add(event.context or "")
                addresses.add(event.target or "")
            elif isinstance(event, ev.JobStarted | ev.JobFinished):
                addresses.add(event.address)
            if isinstance(event, ev.JobFinished) and event.loaded and event.run_id:
                run_ids.add(event.run_id)
            if isinstance(
                event, ev.JobDispatched | ev.JobStarted | ev.JobFinished | ev.JobReported
            ):
                keys.add(event.key)
        self.runs = _known(session, recorder._runs, run_ids, Run.run_id, select(Run.run_id, Run.id))
        self.contexts = _known(
            session,
            recorder._contexts,
            identities - {""},
            Context.identity,
            select(Context.identity, Context.id),
        )
        self.servers = _known(
            session,
            recorder._servers,
            addresses - {""},
            Server.address,
            # The live server at each address (its latest row, read last).
            select(Server.address, Server.id).where(Server.left.is_(None)).order_by(Server.id),
        )
        by_run: dict[int, list[str]] = {}
        for run_id, jobid in job_ids:
            run_pk = self.runs.get(run_id)
            if isinstance(run_pk, int):
                by_run.setdefault(run_pk, []).append(jobid)
        if by_run:
            rows = session.execute(
                select(Job.id, Job.run_pk, Job.jobid, Job.outcome)
                .where(
                    or_(*(and_(Job.run_pk == pk, Job.jobid.in_(ids)) for pk, ids in by_run.items()))
                )
                .with_for_update()
            )
            for job_id, run_pk, jobid, outcome in rows:
                self.jobs[run_pk, jobid] = _Row(job_id, {"outcome": outcome}, set())
        known_jobs = [job.id for job in self.jobs.values()]
        # All of a job's attempts: a report sums the items of those that ended ok.
        wanted: ColumnElement[bool] = Attempt.key.in_(keys)
        if known_jobs:
            wanted = or_(wanted, Attempt.job_id.in_(known_jobs))
        rows = session.execute(
            select(Attempt.id, Attempt.key, *(getattr(Attempt, c) for c in ATTEMPT_READ))
            .where(wanted)
            .order_by(Attempt.id)
            .with_for_update()
        )
        for attempt_id, key, *values in rows:
            row = _Row(attempt_id, dict(zip(ATTEMPT_READ, values, strict=True)), set())
            self.attempts.setdefault(key, []).append(row)
            self.all_attempts.append(row)
        unsure = {job_id for job_id in known_jobs if recorder._outputs.get(job_id) is None}
        self.with_outputs = {job_id for job_id in known_jobs if job_id not in unsure}
        if unsure:
            self.with_outputs.update(
                session.scalars(
                    select(JobOutput.job_id).where(JobOutput.job_id.in_(unsure)).distinct()
                )
            )

    def _add(self, table: Table, **values: Any) -> _Row:
        row = _Row(0, {**DEFAULTS[table], **values}, None)
        self.added.setdefault(table, []).append(row)
        return row

    def _run(self, run_id: str, at: float) -> int | _Row:
        found = self.runs.get(run_id)
        if found is None:
            found = self.runs[run_id] = self._add(RUNS, run_id=run_id, started=at, heartbeat=at)
        return found

    def _context(self, identity: str, at: float, name: str) -> int | _Row:
        found = self.contexts.get(identity)
        if found is None:
            found = self._add(CONTEXTS, identity=identity, name=name, first_seen=at)
            self.contexts[identity] = found
        return found

    def _server(self, address: str, at: float) -> int | _Row:
        found = self.servers.get(address)
        if found is None:
            found = self.servers[address] = self._add(SERVERS, address=address, joined=at)
        return found

    def _job(self, run_pk: int | _Row, jobid: str, **values: Any) -> _Row:
        found = self.jobs.get((run_pk, jobid))
        if found is None:
            found = self._add(JOBS, run_pk=run_pk, jobid=jobid, **values)
            self.jobs[run_pk, jobid] = found
        return found

    def _latest(self, key: str) -> _Row | None:
        found = self.attempts.get(key)
        return found[-1] if found else None

    def _new_attempt(self, key: str, **values: Any) -> _Row:
        row = self._add(ATTEMPTS, key=key, **values)
        self.attempts.setdefault(key, []).append(row)
        self.all_attempts.append(row)
        return row

    def _outputs(self, job: _Row, outputs: Iterable[str]) -> None:
        """Record a job's outputs once (each attempt's event carries them again)."""
        paths = sorted(set(outputs))
        if paths and job.ref not in self.with_outputs:
            self.with_outputs.add(job.ref)
            for path in paths:
                self._add(OUTPUTS, job_id=job.ref, path=path)

    def _totals(self, run_pk: int | _Row) -> list[Any]:
        return self.totals.setdefault(run_pk, [0, 0, 0, 0, None])

    # -- folding ---------------------------------------------------------------------

    def _dispatched(self, event: ev.JobDispatched) -> None:
        run_pk = self._run(event.run_id, event.at)
        context_id = (
            self._context(event.context, event.at, event.context_name or "")
            if event.context
            else None
        )
        job = self._job(
            run_pk,
            str(event.jobid),
            rule=event.rule,
            wildcards=json.dumps(event.wildcards, sort_keys=True),
            kind=event.job_kind,
            context_id=context_id,
            submitted=event.submitted or event.at,
        )
        self._outputs(job, event.outputs)
        target = self._server(event.target, event.at) if event.target else None
        values: dict[str, Any] = {
            "job_id": job.ref,
            "attempt": event.attempt,
            "placed_by": event.reason or None,
            "dispatched": event.at,
            "log": event.log or None,
            "stimulus": event.stimulus or None,
        }
        attempt = self._latest(event.key)
        if attempt is None:
            self._new_attempt(event.key, server_id=target, **values)
        else:
            attempt.set(**values)

    def _started(self, event: ev.JobStarted) -> None:
        server_id = self._server(event.address, event.at)
        attempt = self._latest(event.key)
        if attempt is None:
            self._new_attempt(event.key, server_id=server_id, started=event.at)
        elif attempt.values["started"] is not None and attempt.values["server_id"] != server_id:
            # Dask ran the same task again elsewhere (its first server was lost).
            self._new_attempt(
                event.key,
                job_id=attempt.values["job_id"],
                attempt=attempt.values["attempt"],
                server_id=server_id,
                started=event.at,
            )
        else:
            attempt.set(started=event.at, server_id=server_id)

    def _finished(self, event: ev.JobFinished) -> None:
        outcome = "ok" if event.ok else ("cancelled" if event.cancelled else "failed")
        values: dict[str, Any] = {
            "finished": event.finished or event.at,
            "outcome": outcome,
            "items": event.items,
            "load_seconds": event.load_seconds,
            "cold": bool(event.loaded),
        }
        # An end the executor recorded without its server's word (a task cancelled in
        # Dask, the run's cluster killed) may not know where or since when it ran:
        # what the attempt's own rows say is kept then.
        if event.address:
            values["server_id"] = self._server(event.address, event.at)
        if event.started:
            values["started"] = event.started
        attempt = self._latest(event.key)
        if attempt is None:
            attempt = self._new_attempt(event.key, **values)
        elif attempt.values["finished"] is None:
            attempt.set(**values)
        else:
            # The executor records an attempt's end from its result when the server's
            # own event has not come yet: a second copy counts nothing twice. A
            # given-up attempt (its server was lost) stays lost: a late end from it is
            # fenced off, never counted ok.
            if attempt.values["outcome"] != "lost":
                attempt.set(**values)
            return
        for size, calls in event.batches.items():
            self._add(BATCHES, attempt_id=attempt.ref, size=int(size), calls=int(calls))
        if event.loaded and event.run_id:
            self._totals(self._run(event.run_id, event.at))[3] += len(event.loaded)

    def _reported(self, event: ev.JobReported) -> None:
        run_pk = self._run(event.run_id, event.at)
        job = self._job(run_pk, str(event.jobid), rule=event.rule, submitted=event.at)
        self._outputs(job, event.outputs)
        previous = job.values["outcome"]
        for attempt in self.attempts.get(event.key, ()):
            if attempt.values["job_id"] is None:
                attempt.set(job_id=job.ref)
        items = sum(
            row.values["items"] or 0
            for row in self.all_attempts
            if row.values["job_id"] == job.ref and row.values["outcome"] == "ok"
        )
        job.set(
            outcome=event.outcome,
            finished=event.at,
            items=items,
            stimulus=event.stimulus or None,
            message=(event.message or "")[:4000] or None,
        )
        if previous is not None:
            return  # counted already (a duplicate)
        ok = event.outcome == "ok"
        failed = event.outcome not in ("ok", "cancelled")  # stopped on request: no failure
        # A group counts its jobs, and its members' reports count none (nor their items).
        totals = self._totals(run_pk)
        totals[0] += event.jobs if ok else 0
        totals[1] += event.jobs if failed else 0
        totals[2] += items if ok and event.jobs else 0
        totals[4] = event.at
        if failed:
            message = (event.message or "").strip().splitlines()
            text = f"{event.rule} ({event.key}) {event.outcome}: {message[0] if message else ''}"
            self._add(NOTES, at=event.at, kind="job-failed", text=text[:2000], run_pk=run_pk)

    def _story(self, event: ev.JobStory) -> None:
        run_pk = self._run(event.run_id, event.at)
        job = self._job(run_pk, str(event.jobid), rule=event.rule, submitted=event.at)
        self._add(
            STORIES,
            job_id=job.ref,
            attempt_key=event.key if is_attempt_key(event.key) else None,
            at=event.at,
            what=event.what[:32],
            detail=event.detail,
            stimulus=event.stimulus,
        )

    # -- writing ---------------------------------------------------------------------

    def _write(self) -> None:
        """Insert the rows made (a table after those it refers to), update the rows
        changed (one statement for each set of columns), add to the runs' totals."""
        session = self.session
        for table in Base.metadata.sorted_tables:
            rows = self.added.get(table)
            if not rows:
                continue
            values = [_resolved(row.values) for row in rows]
            if table not in REFERRED:
                session.execute(insert(table), values)
                continue
            # The ids are given in the rows' order (SQLite's next rowid, PostgreSQL's
            # serial, row after row) and RETURNING's order is not promised: sorted.
            # Asking SQLAlchemy to keep the order inserts row by row on SQLite.
            made = session.execute(insert(table).returning(table.c.id), values).scalars()
            for row, row_id in zip(rows, sorted(made), strict=True):
                row.id = row_id
        for table, changed in ((ATTEMPTS, self.all_attempts), (JOBS, self.jobs.values())):
            by_columns: dict[frozenset[str], list[dict[str, Any]]] = {}
            for row in changed:
                if row.changed:
                    changes = {f"b_{name}": row.values[name] for name in row.changed}
                    by_columns.setdefault(frozenset(row.changed), []).append(
                        _resolved({"b_id": row.id, **changes})
                    )
            for columns, params in by_columns.items():
                statement = (
                    update(table)
                    .where(table.c.id == bindparam("b_id"))
                    .values({name: bindparam(f"b_{name}") for name in columns})
                )
                session.execute(statement, params)
        if self.totals:
            totals = [
                dict(zip(TOTALS, (run_pk, *gains), strict=True))
                for run_pk, gains in self.totals.items()
            ]
            session.execute(RUN_TOTALS, [_resolved(row) for row in totals])

    def _remember(self) -> None:
        """Cache the ids the batch looked up or made, for the batches after it."""
        recorder = self.recorder
        for cache, found in (
            (recorder._runs, self.runs),
            (recorder._contexts, self.contexts),
            (recorder._servers, self.servers),
        ):
            for name, ref in found.items():
                cache.put(name, _id(ref))
        for key, attempts in self.attempts.items():
            recorder._attempts.put(key, attempts[-1].id)
        for job in self.with_outputs:
            recorder._outputs.put(_id(job), _id(job))


def _known(
    session: Session, cache: _Lru[str], names: set[str], column: Any, query: Select[Any]
) -> dict[str, int | _Row]:
    """The ids of the rows ``names`` name: cached, else read with ``query`` (pairs of a
    name and an id, where ``column`` is one of ``names``)."""
    found: dict[str, int | _Row] = {}
    missing = []
    for name in names:
        cached = cache.get(name)
        if cached is None:
            missing.append(name)
        else:
            found[name] = cached
    if missing:
        found.update(
            (name, row_id) for name, row_id in session.execute(query.where(column.in_(missing)))
        )
    return found


TABLES = Base.metadata.tables
RUNS, CONTEXTS, SERVERS = TABLES["runs"], TABLES["contexts"], TABLES["servers"]
JOBS, ATTEMPTS, OUTPUTS = TABLES["jobs"], TABLES["attempts"], TABLES["job_outputs"]
BATCHES, STORIES, NOTES = TABLES["forward_batches"], TABLES["job_story"], TABLES["events"]
#: The tables whose new rows other rows refer to (their ids are read back).
REFERRED = frozenset((RUNS, CONTEXTS, SERVERS, JOBS, ATTEMPTS))
DEFAULTS = {table: _defaults(table) for table in TABLES.values()}
#: The columns of an attempt the catalog has that a batch's events read.
ATTEMPT_READ = ("job_id", "attempt", "server_id", "started", "finished", "outcome", "items")
#: What a batch's reports and loads add to a run (its heartbeat: the last report's).
TOTALS = ("b_id", "b_ok", "b_failed", "b_items", "b_loads", "b_heartbeat")
RUN_TOTALS = (
    update(RUNS)
    .where(RUNS.c.id == bindparam("b_id"))
    .values(
        jobs_ok=RUNS.c.jobs_ok + bindparam("b_ok"),
        jobs_failed=RUNS.c.jobs_failed + bindparam("b_failed"),
        items=RUNS.c["items"] + bindparam("b_items"),
        loads=RUNS.c.loads + bindparam("b_loads"),
        heartbeat=func.coalesce(bindparam("b_heartbeat", type_=Float()), RUNS.c.heartbeat),
    )
)
