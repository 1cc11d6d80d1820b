"""Starting a gang: one process per device, each loading its shard, on the devices a
process owns (:class:`GangOptions`).

The rank processes are started with ``subprocess`` (never forked: CUDA cannot be used
after a fork, and a server's threads hold locks), each given its end of a socket
pair, over which the driver also answers their rendezvous (:mod:`.rendezvous`). See
:mod:`.driver` for what the gang then is.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ..defaults import GANG_TIMEOUT_SECONDS
from ..errors import ContextLoadError
from ..loaders import LoaderRef
from ..strays.processes import OWN
from ..terminal import format_bytes
from .driver import POLL_SECONDS, Gang, RankLoss, RankProcess, receive
from .rank import Channel, Rank, RankStart
from .rendezvous import StoreBook

__all__ = ["GangOptions", "RemoteDevice", "spawn_rank", "start_gang"]

RANK_MODULE = "snakemake_executor_context.gang"


@dataclass(frozen=True)
class RemoteDevice:
    """A device of another server of the same (multi-node) server: where its rank is
    started, and on which node."""

    address: str
    device: str
    node: str


@dataclass(frozen=True)
class GangOptions:
    """How a process starts the gangs of the contexts it holds."""

    #: The devices it owns, in order ("cuda:0", ..., or "cpu" per stand-in).
    devices: tuple[str, ...]
    #: Seconds every collective and the rendezvous may take.
    timeout: float = GANG_TIMEOUT_SECONDS
    #: Told once when a rank dies (a server leaves: its jobs run again).
    on_broken: Callable[[RankLoss], None] | None = None
    #: Threads of each rank's torch pools (0: the cores of the process / ranks).
    threads: int = 0
    node: str = ""
    #: The devices of the other servers it leads (pilots started as a gang of nodes),
    #: after its own; ``spawn_remote(gang id, address, start)`` starts a rank there
    #: and returns the driver's end of it (:mod:`..server.gangsite`).
    remote: tuple[RemoteDevice, ...] = ()
    spawn_remote: Callable[[str, str, RankStart], Any] | None = None
    #: Bytes one rank's shard may take on its device (0: no limit): a server's memory
    #: budget shared out over its devices.
    shard_budget: int = 0

    @property
    def places(self) -> list[tuple[str, str, str]]:
        """(address, device, node) of every device, its own first ("" address)."""
        own = [("", device, self.node) for device in self.devices]
        return own + [(d.address, d.device, d.node) for d in self.remote]


def start_gang(ref: LoaderRef, ranks: int, options: GangOptions, *, cwd: str | None = None) -> Gang:
    """Start ``ranks`` processes on the first devices of ``options`` (its own first,
    then those of the servers it leads) and load the context's shard in each; a clear
    error if a rank cannot load."""
    places = options.places[:ranks]
    if len(places) < ranks:
        have = ", ".join(d for _, d, _ in options.places) or "none"
        raise ContextLoadError(
            f"Context '{ref.name}' spans {ranks} ranks, one per device, but this process "
            f"(pid {os.getpid()}) has {len(options.places)} device(s) ({have}). Fix: run "
            f"its rules on servers of {ranks} GPUs (--context-gpus-per-server {ranks}, "
            f"`up --gpus-per-server {ranks}`, --context-pilots gpus={ranks}, or pilots "
            f"that span nodes: --context-pilots nodes=N) and give them gpu={ranks}."
        )
    devices = [device for _, device, _ in places]
    backend = "nccl" if all(d.startswith("cuda") for d in devices) else "gloo"
    book = StoreBook()
    threads = options.threads or max(1, len(os.sched_getaffinity(0)) // ranks)
    one_node = len({node for _, _, node in places}) == 1
    gang_id = secrets.token_hex(8)
    started: list[Any] = []
    local_index = 0
    try:
        for index, (address, device, node) in enumerate(places):
            start = RankStart(
                rank=Rank(index, ranks, device, backend, local_index, node),
                name=ref.name,
                loader=ref.loader,
                loader_path=ref.loader_path,
                kwargs=dict(ref.kwargs),
                timeout=options.timeout,
                threads=threads,
                environment=_rank_environment(one_node),
            )
            if not address:
                process = spawn_rank(index, cwd)
                started.append(process)
                process.conn.send(start)
                local_index += 1
            elif options.spawn_remote is None:
                raise ContextLoadError(f"Context '{ref.name}': no way to reach {address}.")
            else:
                started.append(options.spawn_remote(gang_id, address, start))
        gang = Gang(ref.name, started, devices, backend, book, options.on_broken)
        gang.nodes = [node for _, _, node in places]
        gang.rank_bytes = _wait_loaded(ref.name, started, book)
        _admit(ref.name, gang, options.shard_budget)
    except BaseException:
        for process in started:
            process.kill()
            process.close_fds()
        raise
    gang._watcher.start()
    return gang


def _admit(name: str, gang: Gang, budget: int) -> None:
    """Every shard fits its device's share of the memory budget (admission per shard)."""
    over = [(rank, n) for rank, n in enumerate(gang.rank_bytes) if budget and n > budget]
    if over:
        rank, nbytes = over[0]
        raise ContextLoadError(
            f"Context '{name}': rank {rank}'s shard takes {format_bytes(nbytes)} on "
            f"{gang.devices[rank]}, more than the {format_bytes(budget)} its device may hold "
            f"(the server's memory budget over its {len(gang.devices)} device(s)). Fix: "
            "split it over more ranks, or raise --context-contexts-memory."
        )


def spawn_rank(rank: int, cwd: str | None) -> RankProcess:
    """Start one rank process (it waits for its :class:`~.rank.RankStart`)."""
    ours, theirs = socket.socketpair()
    try:
        with OWN.starting():
            popen = subprocess.Popen(
                [sys.executable, "-m", RANK_MODULE, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                cwd=cwd,
            )
            OWN.add(popen.pid, "gang")  # the server's own: never a job's leftover
    finally:
        theirs.close()
    return RankProcess(rank, popen, Channel(ours.detach()))


def _wait_loaded(name: str, ranks: list[RankProcess], book: StoreBook) -> list[int]:
    """Each rank's shard bytes once all have loaded (answering their rendezvous
    meanwhile); the first failure as one error."""
    pending = {r.conn: r for r in ranks}
    deaths = {r.death: r for r in ranks}
    loaded: dict[int, int] = {}
    while pending:
        for item in wait([*pending, *deaths], timeout=POLL_SECONDS):
            if isinstance(item, int):
                raise ContextLoadError(
                    f"Context '{name}': {_died(deaths[item], len(ranks))} while the gang "
                    "loaded. Fix: see its output in the server's log (a crash, or out of "
                    "memory)."
                )
            conn = cast(Connection, item)
            rank = pending[conn]
            try:
                reply = receive(conn, book)
            except (EOFError, OSError):
                raise ContextLoadError(
                    f"Context '{name}': {_died(rank, len(ranks))} while the gang loaded."
                ) from None
            if reply is None:
                continue
            del pending[conn]
            kind, value = reply
            if kind != "loaded":
                raise ContextLoadError(
                    f"Context '{name}': rank {rank.rank} of {len(ranks)} could not load its "
                    f"shard. Fix: see the traceback below.\n{value}"
                )
            loaded[rank.rank] = int(value)
    return [loaded[r.rank] for r in ranks]


def _died(rank: RankProcess, world: int) -> str:
    loss = RankLoss("", rank.rank, world, rank.pid, rank.exit_code(), "the load")
    return loss.describe().replace(" of context ''", "")


def _rank_environment(one_node: bool) -> dict[str, str]:
    """What a rank's process sets before it joins: the collectives of a gang on one
    node stay on loopback unless the user chose an interface (across nodes they take
    the user's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, else the host name's)."""
    environment: dict[str, str] = {}
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if one_node and not os.environ.get(variable):
            environment[variable] = "lo"
    return environment
