"""A simulated context server: the real slot gate decides which of its jobs run,
the real eviction order makes room for a load, and the times come from the model.

A job arrives (Dask's pinned task), waits for the slot gate
(:func:`..server.slots.gate.may_start`), acquires its context (warm; loading for
another slot: wait; else load it: from the node-local cache, a peer, or the source,
converting the first time), runs for its time (shared with its slots' jobs by the
batching gain), and ends with the :class:`~..fleet.outcome.Outcome` a real server
seals. Everything it would tell the scheduler it emits as the fleet's events. It
keeps the intervals the ledger (:mod:`.simledger`) adds up.

A load moves the context's bytes, then makes the rest (software start, state
creation). From the source, the move is a read over the shared filesystem made in a
turn (:class:`~.hosting.Turns`, which covers the read alone); from a peer or the
local cache, it takes no turn. A server whose local disk lacks the context asks the
servers whose disks hold it, as a real one does (:mod:`..server.peers.survey`): each says
the transfers it has to spare (the plugin's ``--context-tuning peer_transfers``) and when its
first ends, the fleet says the measured rates, and the real choice
(:func:`..fleet.peerchoice.choose_origin`) says peer or source. While every holder
is busy and a peer is still the faster way, it asks again when the first busy
holder's transfer ends, up to the real receiver's wait; a holder that leaves
mid-transfer does not cut it short here.
"""

from __future__ import annotations

import math

from ..defaults import PEER_WAIT_SECONDS
from ..dispatch.vocabulary import JobTicket
from ..fleet import events as ev
from ..fleet.accounting import Warm, Work
from ..fleet.eviction import Held, to_evict
from ..fleet.loads import LoadKind
from ..fleet.losses import finishes_in_grace
from ..fleet.outcome import ServerIdentity
from ..fleet.peerchoice import choose_origin
from ..server.slots.gate import Entry, fitting_slots, may_start
from .hosting import Host, Loaded, LoadMade, Serving, Task
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
        #: What the ledger accounts (:mod:`.simledger`): each attempt by key (the last
        #: word on it), each load, each context's span held ready.
        self.attempts: dict[str, Work] = {}
        self.loads: list[LoadMade] = []
        self.warm: list[Warm] = []
        #: The transfers of templates it serves its peers.
        self.serving = Serving(address)
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

    def _load(self, task: Task, identity: str) -> None:
        host, now = self.host, self.host.clock.now
        model = host.context(identity)
        evicted = self._make_room(model.nbytes)
        placed = self.contexts[identity] = Loaded(identity, model.nbytes, since=now)
        placed.loader, placed.load_start, placed.pins = task.key, now, 1
        cached = host.mode != "agnostic" and identity in self.disk
        placed.kind = LoadKind.CACHE if cached else self._from_source(model)
        task.evicted = evicted
        host.emit(
            ev.ContextLoading(
                at=now, address=self.address, identity=identity, name=model.name,
                from_cache=cached,
            )
        )  # fmt: skip
        placed.start_move = lambda: self._move(task, placed, model)
        storage = host.storage
        if cached or host.mode == "agnostic" or not (storage.peer and storage.peer_transfers > 0):
            self._read(placed)
        else:
            self._ask_peers(task, placed, model, now + PEER_WAIT_SECONDS)

    @staticmethod
    def _from_source(model: ContextModel) -> LoadKind:
        return LoadKind.CONVERSION if model.converts else LoadKind.SOURCE

    def _read(self, placed: Loaded) -> None:
        """Read the context where its kind says: from the source in a turn, else now."""
        assert placed.start_move is not None
        if placed.takes_turn:
            placed.phase = "turn"
            self.host.turns.take(placed.identity, placed.start_move)
        else:
            placed.start_move()

    def _ask_peers(self, task: Task, placed: Loaded, model: ContextModel, deadline: float) -> None:
        """Peer or source (:func:`..fleet.peerchoice.choose_origin`), as the real
        receiver asks (:class:`..server.peers.survey.HolderPick`)."""
        if not self.alive or self.contexts.get(placed.identity) is not placed:
            return
        now = self.host.clock.now
        limit = self.host.storage.peer_transfers
        holders = {s.address: s for s in self.host.holders(placed.identity, self.address)}
        held = [holder.holder(limit, now) for holder in holders.values()]
        if held:
            rates = self.host.rates(placed.identity, self.gpu_model)
            choice = choose_origin(rates, model.nbytes, held)
            if choice.origin is LoadKind.PEER and choice.free:
                self._fetch(task, placed, model, holders[choice.free[0]])
                return
            if choice.wait and now < deadline:
                placed.phase = "wait"
                soonest = min(h.wait for h in held if h.wait is not None)
                ask = min(deadline, now + max(0.0, soonest))
                self.host.clock.at(ask, self._ask_peers, task, placed, model, deadline)
                return
        self._read(placed)

    def _fetch(self, task: Task, placed: Loaded, model: ContextModel, holder: Serving) -> None:
        """The template from ``holder`` over the network, in one of its transfers."""
        clock, bandwidth = self.host.clock, self.host.storage.peer_bandwidth
        placed.kind, placed.phase = LoadKind.PEER, "fetch"
        session, began = self._transfer(task.key), clock.now
        seconds = model.nbytes / bandwidth if bandwidth > 0 else 0.0
        holder.sessions[session] = began + seconds

        def stop() -> None:
            holder.sessions.pop(session, None)

        placed.stop_fetch = stop

        def fetched() -> None:
            stop()
            if not self.alive or self.contexts.get(placed.identity) is not placed:
                return
            placed.peer_seconds = clock.now - placed.load_start
            self.host.emit(
                ev.ContextTransferred(
                    at=clock.now, address=self.address, identity=placed.identity,
                    peer=holder.address, bytes=model.nbytes, seconds=clock.now - began,
                )
            )  # fmt: skip
            self._rest(task, placed, model)

        clock.after(seconds, fetched)

    def _move(self, task: Task, placed: Loaded, model: ContextModel) -> None:
        """Move the bytes (from the source: the read, in its turn), then the rest."""
        storage, nbytes = self.host.storage, model.nbytes
        placed.phase = "move"
        then = lambda: self._rest(task, placed, model)  # noqa: E731
        if placed.takes_turn and storage.shared_bandwidth > 0 and nbytes:
            self.host.filesystem.add(self._transfer(task.key), nbytes, then)
        elif placed.kind == LoadKind.CACHE and storage.local_bandwidth > 0:
            self.host.clock.after(nbytes / storage.local_bandwidth, then)
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
        if model.caches:
            self.disk.add(placed.identity)
        task.loaded, task.load_seconds = True, seconds
        converted = placed.kind == LoadKind.CONVERSION
        if converted:
            task.conversions = 1
            task.reload_seconds = model.fixed(LoadKind.CACHE)
        self.loads.append(
            LoadMade(
                placed.load_start, now, placed.kind, task.key, model.name,
                reload_seconds=task.reload_seconds, peer_seconds=placed.peer_seconds,
            )
        )  # fmt: skip
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
                peer_seconds=placed.peer_seconds,
                from_cache=placed.kind == LoadKind.CACHE,
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
            self.warm.append(Warm(placed.since, now, self.host.context(identity).name))
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
        started = self._record(task, now, "ok")
        self.jobs_done += 1
        count, total = self._durations.get(identity, (0, 0.0))
        self._durations[identity] = (count + 1, total + now - started - task.load_seconds)
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

    def _record(self, task: Task, now: float, outcome: str) -> float:
        """The attempt ended here with ``outcome`` (for the ledger); its start."""
        assert task.started is not None
        context = task.ticket.context or ""
        self.attempts[task.key] = Work(task.started, now, outcome, task.ticket.rule, context)
        return task.started

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
        self._record(task, now, "lost")
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
            self.compute.remove(key)
            self._record(self.running[key], now, "lost")
        for identity, placed in list(self.contexts.items()):
            name = self.host.context(identity).name
            if not placed.loading:
                self.warm.append(Warm(placed.since, now, name))
                continue
            self.loads.append(
                LoadMade(placed.load_start, now, placed.kind, placed.loader, name, lost=True)
            )
            if placed.phase == "turn" and placed.start_move is not None:
                self.host.turns.cancel(identity, placed.start_move)
            elif placed.phase == "move" and placed.takes_turn:
                self.host.filesystem.remove(self._transfer(placed.loader))
                self.host.turns.release(identity)
            elif placed.phase == "fetch" and placed.stop_fetch is not None:
                placed.stop_fetch()
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
