"""One rank of a gang: the record its shard loader gets, and the rank process itself.

``python -m snakemake_executor_context.gang FD`` (:mod:`.__main__`) runs in a process
the gang's driver (:mod:`.driver`) starts, one per device. ``FD`` is its end of a
socket pair that only the driver holds the other end of: every message arrives
there, nothing listens for it. The process reads its :class:`RankStart`, joins the
gang's ``torch.distributed`` group (its rendezvous, :mod:`.rendezvous`, answered by the
driver over that same socket pair: no listener, no file; gloo's and NCCL's own
connections are not authenticated, see the docs), calls the context's shard loader
with a :class:`Rank`, then runs the driver's calls until it is told to close, its
driver goes, or a collective fails.

Standard library only at import (the driver imports :class:`Rank` and
:class:`RankStart`); torch is imported in :func:`main`.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["CLOSE", "Channel", "Rank", "RankStart", "main"]

#: The driver's message that ends a rank.
CLOSE = ("close",)
#: Seconds between a rank's checks that its driver still lives.
PARENT_POLL_SECONDS = 0.5


class Channel(Connection):
    """One end of a socket pair between a driver and a rank, carrying plain pickles.

    ``multiprocessing``'s own pickler hands a torch tensor over as a shared-memory
    handle, fetched back through its resource sharer with its process's auth key: a
    rank process is not its child, so a tensor argument would fail there. A plain
    pickle copies it."""

    def send(self, obj: Any) -> None:
        """Send one object."""
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        """Receive one object."""
        return pickle.loads(self.recv_bytes())


@dataclass(frozen=True)
class Rank:
    """What a shard loader gets (``load_shard(**kwargs, rank=rank)``): its place in
    the gang and its device. The default ``torch.distributed`` process group is
    initialised when the loader is called, so collectives work."""

    rank: int
    world_size: int
    #: A torch device string: "cuda:<i>" (among the server's visible GPUs) or "cpu".
    device: str
    #: "nccl" on GPUs, "gloo" on CPUs.
    backend: str
    #: Its index among the ranks of its own node.
    local_rank: int = 0
    node: str = ""


@dataclass(frozen=True)
class RankStart:
    """The driver's first message to a rank process."""

    rank: Rank
    #: The context: what :func:`..loaders.import_loader` needs of its declaration.
    name: str
    loader: str
    loader_path: str | None
    kwargs: dict[str, Any]
    #: Seconds every collective (and the rendezvous) may take before it fails.
    timeout: float
    #: Threads of the rank's torch pools (0: torch's default).
    threads: int = 0
    environment: dict[str, str] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    """Run one rank until the driver closes it (its exit code: 0), or it goes."""
    args = sys.argv[1:] if argv is None else argv
    conn = Channel(int(args[0]))
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    try:
        start: RankStart = conn.recv()
    except EOFError:
        return 0
    os.environ.update(start.environment)
    shard = _join_and_load(conn, start)
    if shard is None:
        return 1
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the driver is gone
            return 0
        if message == CLOSE:
            _leave_group()
            return 0
        _, method, args_, kwargs = message
        try:
            value = getattr(shard, method)(*args_, **kwargs)
        except BaseException as error:
            conn.send(("error", _described(error)))
            continue
        conn.send(("ok", value if start.rank.rank == 0 else None))


def _join_and_load(conn: Any, start: RankStart) -> Any:
    """Join the group and call the shard loader; tell the driver how it went."""
    from .rendezvous import relay_store

    try:
        import datetime

        import torch
        import torch.distributed as dist

        if start.threads > 0:
            torch.set_num_threads(start.threads)
        rank = start.rank
        if rank.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(rank.device))
        dist.init_process_group(
            rank.backend,
            store=relay_store(conn, start.timeout),
            rank=rank.rank,
            world_size=rank.world_size,
            timeout=datetime.timedelta(seconds=start.timeout),
        )
        before = _memory_in_use(rank.device)
        shard = _shard_loader(start)(**start.kwargs, rank=rank)
        conn.send(("loaded", max(0, _memory_in_use(rank.device) - before)))
        return shard
    except BaseException as error:
        conn.send(("error", _described(error)))
        return None


def _shard_loader(start: RankStart) -> Any:
    from ..errors import ContextLoadError
    from ..loaders import import_loader

    shard = getattr(import_loader(start), "shard", None)
    if not callable(shard):
        raise ContextLoadError(
            f"Context '{start.name}' spans {start.rank.world_size} ranks, but its loader "
            f"'{start.loader}' names no shard loader. Fix: decorate it with "
            "@loader(shard=load_shard), a function called once per rank."
        )
    return shard


def _memory_in_use(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.memory_allocated())
    import psutil

    return int(psutil.Process().memory_info().rss)


def _leave_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # the process ends next; nothing else holds the group
        pass


def _described(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)).rstrip()


def _exit_with(parent: int) -> None:
    """A rank never outlives its driver, even inside a forward pass or a collective."""
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent:
            os._exit(0)
