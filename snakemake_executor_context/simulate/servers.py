"""A simulated context server: the real slot gate decides which of its jobs run,
the real eviction order makes room for a load, and the times come from the model.

A job arrives (Dask's pinned task), waits for the slot gate
(:func:`..server.slots.gate.may_start`), acquires its context (warm; loading for
another slot: wait; else load it: from the node-local cache, a peer, or the source,
converting the first time), runs for its time (shared with its slots' jobs by the
batching gain), and ends with the :class:`~..fleet.outcome.Outcome` a real server
seals. Everything it would tell the scheduler it emits as the fleet's events. It
keeps the intervals the ledger (:mod:`.ledger`) adds up.

A load moves the context's bytes, then makes the rest (software start, state
creation). From the source, the move is a read over the shared filesystem made in a
turn (:class:`~.hosting.Turns`, which covers the read alone); from a peer or the
local cache, it takes no turn.
"""

from __future__ import annotations

import math

from ..executor.vocabulary import JobTicket
from ..fleet import events as ev
from ..fleet.eviction import Held, to_evict
from ..fleet.losses import finishes_in_grace
from ..fleet.outcome import ServerIdentity
from ..server.slots.gate import Entry, fitting_slots, may_start
from .buckets import LoadKind
from .hosting import Host, Loaded, Task
from .model import ContextModel, ServerKind
from .shared import Shared

__all__ = ["SimServer"]


class SimServer:
    """One context server (a Dask worker) of the simulated fleet."""

    def __init__(
        self, host: Host, address: str, name: str, kind: ServerKind, joined: float
    ) -> None:
        self.host, self.address, self.name, self.kind = host, address, name, kind
        self.gpu_model, self.slots = kind.gpu_model, max(1, kind.slots)
        self.identity = ServerIdentity(name, "sim", 0, address)
        self.joined = joined
        self.left: float | None = None
        self.alive = True
        self.draining: float | None = None
        self.queue: list[Task] = []
        self.running: dict[str, Task] = {}
        self.contexts: dict[str, Loaded] = {}
        #: Identities whose weights its local disk holds.
        self.disk: set[str] = set()
        #: Jobs of a context at once (1 until the slots know its working memory).
        self.limits: dict[str, int] = {}
        self.unshareable: set[str] = set()
        self.compute = Shared(host.clock, host.times.gain)
        self._durations: dict[str | None, tuple[int, float]] = {}
        #: For the ledger: (start, end, kind, attempt key) of each load; (start, end,
        #: outcome) of each attempt; (identity, ready, gone) of each context.
        self.loads: list[tuple[float, float, LoadKind, str]] = []
        self.attempts: dict[str, tuple[float, float, str]] = {}
        self.warm: list[tuple[str, float, float]] = []
        self.jobs_done = 0
        self._cancelled: set[str] = set()
        #: Attempts a drain handed back (they ran here).
        self._handed: list[str] = []

    # -- jobs arrive -------------------------------------------------------------------

    def arrive(self, ticket: JobTicket, key: str, items: int) -> None:
        """A pinned task reached the server (Dask runs it when the gate lets it)."""
        if not self.alive or key in self._cancelled:
            return
        context = ticket.identity
        group = ticket.rule if context is not None else None
        entry = Entry(key, group=group, identity=context, exclusive=not ticket.shareable)
        if not ticket.shareable and context is not None:
            self.unshareable.add(context)
        self.queue.append(Task(key, ticket, items, self.host.clock.now, entry))
        self._admit()

    def cancel(self, key: str) -> None:
        """The executor dropped the attempt: a queued one never starts."""
        self._cancelled.add(key)
        self.queue = [task for task in self.queue if task.key != key]

    def busy(self) -> bool:
        """Whether it has a job (running or waiting)."""
        return bool(self.running or self.queue)

    def _admit(self) -> None:
        if not self.alive or self.draining is not None:
            return
        started = True
        while started:
            started = False
            running = [task.entry for task in self.running.values()]
            for index, task in enumerate(self.queue):
                ahead = [t.entry for t in self.queue[:index]]
                limits = dict(self.limits)
                if task.entry.identity is not None:
                    limits.setdefault(task.entry.identity, 1)
                if may_start(task.entry, running, ahead, limits, self.unshareable, self.slots):
                    del self.queue[index]
                    self._start(task)
                    started = True
                    break

    def _start(self, task: Task) -> None:
        now = self.host.clock.now
        task.started = now
        self.running[task.key] = task
        self.host.emit(
            ev.JobStarted(
                at=now,
                run_id=self.host.run_id,
                key=task.key,
                address=self.address,
                context=task.ticket.identity,
            )
        )
        identity = task.ticket.identity
        if identity is None:
            self._work(task)
            return
        placed = self.contexts.get(identity)
        if placed is None:
            self._load(task, identity)
        elif placed.loading:
            placed.waiters.append(task)
        else:
            placed.pins += 1
            self._work(task)

    # -- loads -------------------------------------------------------------------------

    def load_kind(self, identity: str) -> LoadKind:
        """What a load of ``identity`` here would be."""
        model = self.host.context(identity)
        if self.host.mode == "agnostic":
            return LoadKind.CONVERSION if model.converts else LoadKind.SOURCE
        if identity in self.disk:
            return LoadKind.CACHE
        if self.host.storage.peer and self.host.peer_holds(identity, self.address):
            return LoadKind.PEER
        return LoadKind.CONVERSION if model.converts else LoadKind.SOURCE

    def _load(self, task: Task, identity: str) -> None:
        host, now = self.host, self.host.clock.now
        model = host.context(identity)
        evicted = self._make_room(model.nbytes)
        kind = self.load_kind(identity)
        placed = self.contexts[identity] = Loaded(identity, model.nbytes, since=now)
        placed.kind, placed.loader, placed.load_start, placed.pins = kind, task.key, now, 1
        task.evicted = evicted
        host.emit(
            ev.ContextLoading(
                at=now,
                address=self.address,
                identity=identity,
                name=model.name,
                from_cache=kind == LoadKind.CACHE,
            )
        )
        placed.start_move = lambda: self._move(task, placed, model)
        if placed.takes_turn:
            placed.phase = "turn"
            host.turns.take(identity, placed.start_move)
        else:
            self._move(task, placed, model)

    def _move(self, task: Task, placed: Loaded, model: ContextModel) -> None:
        """Move the bytes (from the source: the read, in its turn), then the rest."""
        storage, nbytes = self.host.storage, model.nbytes
        placed.phase = "move"
        then = lambda: self._rest(task, placed, model)  # noqa: E731
        rates = {LoadKind.PEER: storage.peer_bandwidth, LoadKind.CACHE: storage.local_bandwidth}
        if placed.takes_turn and storage.shared_bandwidth > 0 and nbytes:
            self.host.filesystem.add(self._transfer(task.key), nbytes, then)
        elif rates.get(placed.kind, 0.0) > 0:
            self.host.clock.after(nbytes / rates[placed.kind], then)
        else:
            then()

    def _transfer(self, key: str) -> str:
        return f"{self.address} {key}"

    def _rest(self, task: Task, placed: Loaded, model: ContextModel) -> None:
        """The bytes are here: a read from the source ends its turn (the turn covers
        the read alone, as the real server's covers staging the files on its node);
        software start and state creation follow outside it."""
        if placed.takes_turn:
            self.host.turns.release(placed.identity)
        if not self.alive or self.contexts.get(placed.identity) is not placed:
            return
        placed.phase = "rest"
        self.host.clock.after(model.fixed(placed.kind) or 0.0, self._loaded, task, placed)

    def _loaded(self, task: Task, placed: Loaded) -> None:
        if not self.alive or self.contexts.get(placed.identity) is not placed:
            return
        now = self.host.clock.now
        model = self.host.context(placed.identity)
        seconds = now - placed.load_start
        placed.loading, placed.since, placed.last_used, placed.phase = False, now, now, ""
        self.loads.append((placed.load_start, now, placed.kind, task.key))
        if model.caches:
            self.disk.add(placed.identity)
        task.loaded, task.load_seconds = True, seconds
        converted = placed.kind == LoadKind.CONVERSION
        if converted:
            task.conversions = 1
            task.reload_seconds = model.fixed(LoadKind.CACHE)
        self.host.emit(
            ev.ContextReady(
                at=now,
                address=self.address,
                identity=placed.identity,
                load_seconds=seconds,
                bytes=model.nbytes,
                gpu_model=self.gpu_model,
                conversions=int(converted),
                reload_seconds=task.reload_seconds,
            )
        )
        self._work(task)
        for waiter in placed.waiters:
            placed.pins += 1
            if waiter.key in self.running:
                self._work(waiter)
        placed.waiters = []

    def _make_room(self, incoming: int) -> tuple[str, ...]:
        budget = self.kind.budget
        if budget <= 0 or not incoming:
            return ()
        held = [
            Held(c.identity, c.last_used, c.nbytes, pinned=c.pins > 0 or c.loading)
            for c in self.contexts.values()
        ]
        gone = to_evict(held, incoming, budget)
        for identity in gone:
            self._evict(identity)
        return tuple(gone)

    def _evict(self, identity: str) -> None:
        placed = self.contexts.pop(identity, None)
        if placed is None:
            return
        now = self.host.clock.now
        if not placed.loading:
            self.warm.append((identity, placed.since, now))
        self.host.emit(ev.ContextEvicted(at=now, address=self.address, identity=identity))

    # -- work --------------------------------------------------------------------------

    def _work(self, task: Task) -> None:
        host = self.host
        rule, items = task.ticket.rule, task.items
        seconds = host.times.seconds(rule, self.gpu_model, items) or 0.0
        if host.times.cv > 0 and seconds > 0:
            sigma = math.sqrt(math.log(1 + host.times.cv**2))
            seconds *= host.rng.lognormvariate(-(sigma**2) / 2, sigma)
        self.compute.add(task.key, seconds, lambda: self._finished(task))

    def _finished(self, task: Task) -> None:
        now = self.host.clock.now
        self.running.pop(task.key, None)
        identity = task.ticket.identity
        placed = self.contexts.get(identity) if identity else None
        if placed is not None:
            placed.pins -= 1
            placed.last_used = now
        assert task.started is not None
        self.attempts[task.key] = (task.started, now, "ok")
        self.jobs_done += 1
        count, total = self._durations.get(identity, (0, 0.0))
        self._durations[identity] = (count + 1, total + now - task.started - task.load_seconds)
        outcome = task.outcome(self.identity, now, self.gpu_model)
        self.host.ended(task.key, outcome)
        self.host.emit(outcome.finished_event(self.host.run_id, at=now))
        if identity is not None and placed is not None:
            if self.host.mode != "full" and placed.pins <= 0:
                self._evict(identity)  # context-agnostic: the job's load goes with it
            elif self.slots > 1 and identity not in self.limits:
                self._share(identity)
        if self.draining is not None and not self.running:
            self.host.note("drained", self.name)
            self.leave(now, drained="SIGTERM", exit_code=0)
            return
        self._admit()

    def _share(self, identity: str) -> None:
        """Its first job measured: the slots say how many of its jobs fit at once."""
        model = self.host.context(identity)
        budget = self.kind.budget
        loaded = sum(c.nbytes for c in self.contexts.values())
        jobs = fitting_slots(self.slots, budget, loaded, model.job_bytes) if budget else self.slots
        self.limits[identity] = jobs
        self.host.emit(
            ev.ContextShared(
                at=self.host.clock.now, address=self.address, identity=identity, jobs=jobs
            )
        )

    # -- the end -----------------------------------------------------------------------

    def drain(self, grace: float) -> None:
        """SIGTERM: take no new job, finish those that fit the grace, hand back the
        rest (:func:`..fleet.losses.finishes_in_grace`), leave."""
        if not self.alive or self.draining is not None:
            return
        now = self.host.clock.now
        self.draining = now
        finishing, handed = [], []
        for task in list(self.running.values()):
            count, total = self._durations.get(task.ticket.identity, (0, 0.0))
            mean = total / count if count else None
            assert task.started is not None
            if finishes_in_grace(mean, now - task.started, grace):
                task.finishing = True
                finishing.append(task.key)
            else:
                handed.append(task.key)
                self._stop(task, now)
        self.host.emit(
            ev.ServerDraining(
                at=now,
                address=self.address,
                name=self.name,
                grace=grace,
                finishing=finishing,
                handed_back=handed,
            )
        )
        if not finishing:
            self.leave(now, drained="SIGTERM", exit_code=0)
        else:
            self.host.clock.after(grace, self._grace_over)

    def _stop(self, task: Task, now: float) -> None:
        """Stop a running attempt here (its work is lost; the server's record of what
        it ran keeps it, so its loss is charged when the server leaves)."""
        self.running.pop(task.key, None)
        self.compute.remove(task.key)
        assert task.started is not None
        self.attempts[task.key] = (task.started, now, "lost")
        self._handed.append(task.key)

    def _grace_over(self) -> None:
        if self.alive:
            self.leave(self.host.clock.now, drained="SIGTERM", exit_code=0)

    def leave(
        self,
        now: float,
        *,
        expected: bool = False,
        exit_code: int | None = None,
        injected: int | None = None,
        drained: str = "",
    ) -> list[str]:
        """The server is gone (killed, drained, retired): what it ran is lost."""
        if not self.alive:
            return []
        self.alive, self.left = False, now
        lost = sorted(self.running)
        ran = sorted({*lost, *self._handed})
        for key in lost:
            task = self.running[key]
            self.compute.remove(key)
            assert task.started is not None
            self.attempts[key] = (task.started, now, "lost")
        for identity, placed in list(self.contexts.items()):
            if not placed.loading:
                self.warm.append((identity, placed.since, now))
                continue
            self.loads.append((placed.load_start, now, placed.kind, placed.loader))
            if placed.phase == "turn" and placed.start_move is not None:
                self.host.turns.cancel(identity, placed.start_move)
            elif placed.phase == "move" and placed.takes_turn:
                self.host.filesystem.remove(self._transfer(placed.loader))
                self.host.turns.release(identity)
        self.contexts.clear()
        self.running.clear()
        self.queue.clear()
        self.host.emit(
            ev.ServerLeft(
                at=now,
                address=self.address,
                name=self.name,
                expected=expected,
                exit_code=exit_code,
                injected=injected,
                drained=drained,
                running=ran,
            )
        )
        return ran
