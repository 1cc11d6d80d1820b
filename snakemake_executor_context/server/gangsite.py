"""A server's part in gangs that span nodes: pilots started as one server of n nodes
(``--context-pilots nodes=n``) assemble at the scheduler (:mod:`..cluster.roster`); the
leader runs the jobs and starts each gang's ranks on its own devices and, through the
members, on theirs.

Every message between a leader and a rank on another node travels over the cluster's
authenticated connections (the workers' mutual TLS): the leader's :class:`RemoteRank`
sends the driver's messages to the member (``send``), the member's :class:`HostedRank`
relays the rank's replies, and its rendezvous questions, back (``deliver``). For the
driver (:mod:`..gang.driver`) a remote rank is a socket pair and a descriptor that
becomes readable when the rank is gone, as a local one is. Leader and members ping
each other every :data:`PING_SECONDS`: one that is gone ends the group, and the others
leave too (their nannies start them again, and they join a new gang).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from ..defaults import GANG_ROSTER_HANDLER
from ..gang.driver import RankProcess
from ..gang.rank import Channel, RankStart
from ..gang.start import RemoteDevice, spawn_rank
from .config import ServerConfig
from .server import ContextServer

__all__ = ["PING_SECONDS", "GangSite", "HostedRank", "RemoteRank", "start_gang_site"]

logger = logging.getLogger(__name__)

#: Seconds between a leader's and a member's checks that the other is there.
PING_SECONDS = 2.0
#: Seconds one call to another server may take.
CALL_SECONDS = 30.0
PREFIX = "snakemake_context_gang_"


def start_gang_site(worker: Any, server: ContextServer, config: ServerConfig) -> GangSite:
    """A gang pilot's server: its handlers now; once it has registered, it waits for
    the rest of its gang (in a thread), then leads it or serves its leader."""
    site = GangSite(
        worker,
        node=server.identity.host,
        on_group_lost=lambda why: server.leave(
            f"its gang of nodes broke: {why}",
            handed_back=list(server.jobs.running()),
            keep_running=True,
        ),
    )
    site.install()

    def assemble() -> None:
        import time

        while worker.status.name not in ("running",):
            time.sleep(0.1)
        try:
            group = site.join(
                name=server.identity.name,
                devices=len(server.devices),
                size=config.gang_nodes,
                kind=config.gang_kind,
            )
        except Exception as error:
            logger.error("could not join a gang of %d nodes: %r", config.gang_nodes, error)
            return
        members, nodes, devices = group["members"], group["nodes"], group["devices"]
        me = worker.address
        if group["leader"] == me:
            # Pilots of one kind: a member's devices are as the leader's own are.
            cuda = server.devices[0].startswith("cuda")
            remote = [
                RemoteDevice(address, f"cuda:{i}" if cuda else "cpu", node)
                for address, node, count in zip(members, nodes, devices, strict=True)
                if address != me
                for i in range(count)
            ]
            server.lead(remote, site.spawn_remote)
        site.watch([a for a in members if a != me])

    threading.Thread(target=assemble, name="snakemake-context gang roster", daemon=True).start()
    return site


class GangSite:
    """The handlers a gang pilot's server answers on its TLS port, and its group."""

    def __init__(self, worker: Any, *, node: str, on_group_lost: Callable[[str], None]) -> None:
        self.worker = worker
        self.node = node
        self.on_group_lost = on_group_lost
        #: (gang id, rank) -> the rank processes this server hosts for its leader.
        self.hosted: dict[tuple[str, int], HostedRank] = {}
        #: (gang id, rank) -> the leader's view of its ranks on other servers.
        self.remote: dict[tuple[str, int], RemoteRank] = {}
        #: The group it belongs to (None until assembled).
        self.group: dict[str, Any] | None = None
        self._stop = threading.Event()

    def install(self) -> None:
        """Add the handlers to the worker's server (its TLS port)."""
        for name in ("spawn", "send", "deliver", "kill", "ping"):
            self.worker.handlers[PREFIX + name] = getattr(self, f"_{name}")

    # -- calls between servers ---------------------------------------------------------

    def call(self, address: str, op: str, timeout: float = CALL_SECONDS, **kwargs: Any) -> Any:
        """``op`` on another server's handler, from a thread (the worker's loop runs it)."""
        import asyncio

        from distributed.utils import sync

        async def one() -> Any:
            return await asyncio.wait_for(
                getattr(self.worker.rpc(address), PREFIX + op)(**kwargs), timeout
            )

        return sync(self.worker.loop, one)

    # -- the member's side -----------------------------------------------------------

    async def _spawn(self, comm: Any = None, *, gang: str, start: bytes, leader: str) -> int:
        opened: RankStart = pickle.loads(start)
        rank = opened.rank.rank
        hosted = HostedRank(self, gang, spawn_rank(rank, None), leader)
        hosted.process.conn.send(opened)
        self.hosted[(gang, rank)] = hosted
        hosted.start()
        return hosted.process.pid

    async def _send(self, comm: Any = None, *, gang: str, rank: int, message: bytes) -> bool:
        hosted = self.hosted.get((gang, rank))
        if hosted is None:
            return False
        try:
            hosted.process.conn.send(pickle.loads(message))
        except OSError:
            return False
        return True

    async def _kill(self, comm: Any = None, *, gang: str) -> int:
        import asyncio

        doomed = [self.hosted.pop(k) for k in list(self.hosted) if k[0] == gang]
        # Waiting for an exit blocks: not on the worker's loop.
        await asyncio.gather(*(asyncio.to_thread(hosted.kill) for hosted in doomed))
        return len(doomed)

    async def _ping(self, comm: Any = None) -> str:
        return self.node

    # -- the leader's side -----------------------------------------------------------

    async def _deliver(self, comm: Any = None, *, gang: str, rank: int, message: bytes) -> bool:
        remote = self.remote.get((gang, rank))
        if remote is None:
            return False
        remote.deliver(pickle.loads(message))
        return True

    def spawn_remote(self, gang: str, address: str, start: RankStart) -> RemoteRank:
        """Start rank ``start.rank`` on the member at ``address`` (from a load's thread)."""
        remote = RemoteRank(self, gang, start.rank.rank, address)
        self.remote[(gang, start.rank.rank)] = remote
        try:
            remote.pid = int(
                self.call(
                    address,
                    "spawn",
                    gang=gang,
                    start=pickle.dumps(start),
                    leader=self.worker.address,
                )
            )
        except Exception as error:
            remote.mark_dead(None, f"could not start on {address}: {error!r}")
            raise
        remote.start()
        return remote

    # -- the group ------------------------------------------------------------------

    def join(self, *, name: str, devices: int, size: int, kind: str) -> dict[str, Any]:
        """Wait at the scheduler's roster until the group of ``size`` is whole (from a
        thread, once the worker has registered); the group."""
        from distributed.utils import sync

        while not self._stop.is_set():
            answer = sync(
                self.worker.loop,
                getattr(self.worker.scheduler, GANG_ROSTER_HANDLER),
                address=self.worker.address,
                name=name,
                node=self.node,
                devices=devices,
                size=size,
                kind=kind,
            )
            if not answer.get("wait"):
                self.group = dict(answer)
                return self.group
            logger.info("gang of %d: %s others waiting", size, answer.get("waiting"))
        raise RuntimeError("stopped before its gang was whole")

    def watch(self, others: list[str]) -> None:
        """Ping the other servers of the group until one is gone: then the group is."""

        def loop() -> None:
            while not self._stop.wait(PING_SECONDS):
                for address in others:
                    try:
                        self.call(address, "ping", timeout=CALL_SECONDS)
                    except Exception as error:
                        self.on_group_lost(f"{address} of its gang is gone ({error!r})")
                        return

        threading.Thread(target=loop, name="snakemake-context gang watch", daemon=True).start()


class HostedRank:
    """A rank this (member) server hosts for a leader on another node: its replies
    and rendezvous questions go to the leader, and so does its end."""

    def __init__(self, site: GangSite, gang: str, process: RankProcess, leader: str) -> None:
        self.site, self.gang, self.process, self.leader = site, gang, process, leader

    def start(self) -> None:
        """Relay what the rank says until it is gone."""
        threading.Thread(target=self._relay, name=f"gang {self.gang} relay", daemon=True).start()

    def _relay(self) -> None:
        process = self.process
        while True:
            ready = wait([process.conn, process.death])
            if process.conn in ready:
                try:
                    message = process.conn.recv()
                except (EOFError, OSError):
                    break
                self._tell(message)
                continue
            break
        self._tell(("died", process.exit_code()))

    def _tell(self, message: Any) -> None:
        try:
            self.site.call(
                self.leader,
                "deliver",
                gang=self.gang,
                rank=self.process.rank,
                message=pickle.dumps(message),
            )
        except Exception as error:  # the leader is gone: so is this rank's use
            logger.warning("gang %s: the leader is gone (%r): killing its rank", self.gang, error)
            self.kill()

    def kill(self) -> None:
        """End the rank process."""
        self.process.kill()


class RemoteRank:
    """The leader's end of a rank on another node, as the driver sees a rank: ``conn``
    (a socket pair whose far end this object relays) and ``death``."""

    def __init__(self, site: GangSite, gang: str, rank: int, address: str) -> None:
        self.site, self.gang, self.rank, self.address = site, gang, rank, address
        ours, theirs = socket.socketpair()
        self.conn = Channel(ours.detach())
        self._far = Channel(theirs.detach())
        self._death_r, self._death_w = os.pipe()
        self.death = self._death_r
        self.pid = 0
        self._exit: int | None = None
        self.why = ""
        self._dead = threading.Event()

    def start(self) -> None:
        """Relay what the driver sends, and watch the member."""
        threading.Thread(target=self._pump, name=f"gang {self.gang} pump", daemon=True).start()

    def _pump(self) -> None:
        while not self._dead.is_set():
            try:
                message = self._far.recv()
            except (EOFError, OSError):
                return
            try:
                sent = self.site.call(
                    self.address,
                    "send",
                    gang=self.gang,
                    rank=self.rank,
                    message=pickle.dumps(message),
                )
            except Exception as error:
                self.mark_dead(None, f"{self.address} unreachable ({error!r})")
                return
            if not sent:
                self.mark_dead(None, f"{self.address} no longer hosts it")
                return

    def deliver(self, message: Any) -> None:
        """What the member relayed: a reply, a rendezvous question, or its end."""
        if isinstance(message, tuple) and message and message[0] == "died":
            self.mark_dead(message[1], "it ended on its node")
            return
        try:
            self._far.send(message)
        except OSError:
            self.mark_dead(None, "its relay closed")

    def mark_dead(self, exit_code: int | None, why: str) -> None:
        """The rank is gone: the driver's ``death`` becomes readable, its ``conn`` ends."""
        if self._dead.is_set():
            return
        self._exit, self.why = exit_code, why
        self._dead.set()
        os.write(self._death_w, b"x")
        self._far.close()

    def exit_code(self, timeout: float = 1.0) -> int | None:
        """Its exit code as its node saw it (None: not known)."""
        self._dead.wait(timeout)
        return self._exit

    def kill(self) -> None:
        """End it on its node (best effort: the member may be gone already)."""
        if not self._dead.is_set():
            try:
                self.site.call(self.address, "kill", timeout=5.0, gang=self.gang)
            except Exception as error:
                logger.debug("killing gang %s on %s: %r", self.gang, self.address, error)
            self.mark_dead(-9, "killed")
        self.site.remote.pop((self.gang, self.rank), None)

    def close_fds(self) -> None:
        """Close its descriptors."""
        self.conn.close()
        for fd in (self._death_r, self._death_w):
            try:
                os.close(fd)
            except OSError:
                pass
