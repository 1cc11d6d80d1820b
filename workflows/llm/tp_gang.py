"""A local gang for the torch-only GPU check: k rank processes in one
torch.distributed group, driven from here.

The GPU check script (``workflows/bench/gpu_tensor_parallel.py``) runs where neither
Snakemake, Dask nor this project is installed (the lent GPU machine), so it cannot use
the project's gang runtime (:mod:`snakemake_executor_context.gang`), which every other
test, benchmark and server uses; this is the smallest stand-in for it. Each rank is
a spawned process that initialises the default process group (a ``FileStore`` in a
private temporary directory; gloo, or NCCL with one GPU per rank), calls the shard
loader as ``load(**kwargs, rank=RankInfo(...))``, then, for every call, runs
``getattr(shard, method)(*args, **kwargs)``, on all ranks at once.
:meth:`LocalGang.call` returns rank 0's value; calls are serialised (one lock), so
every rank issues its collectives in the same order. Arguments and results travel
pickled through one pipe per rank.

Torch and the standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RankInfo:
    """What a shard loader learns about its rank (the runtime's ``rank`` argument)."""

    rank: int
    world_size: int
    device: str
    backend: str
    local_rank: int


@dataclass
class Reply:
    """One rank's answer to a call: ``status`` "ok" (``value``: the return value),
    "error" (``value``: the exception in one line), "died" (``value``: the exit code)
    or "pending" (no answer yet); ``at``: ``time.perf_counter()`` on arrival."""

    rank: int
    status: str
    value: Any = None
    at: float = 0.0


class GangError(RuntimeError):
    """A rank failed a call, or died."""


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def _import_loader(target: str) -> Any:
    """``path/to/file.py:function`` (imported by path, its directory put on sys.path
    for its sibling imports) or ``module:function``."""
    where, _, function = target.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, function)


def _rank_main(
    conn: Connection,
    loader: str,
    kwargs: dict[str, Any],
    info: RankInfo,
    store: str,
    timeout: float,
    threads: int | None,
) -> None:
    """A rank process: join the group, load the shard, answer calls until told to stop."""
    try:
        if threads:
            torch.set_num_threads(threads)
        if info.device.startswith("cuda"):
            torch.cuda.set_device(info.device)
        dist.init_process_group(
            info.backend,
            store=dist.FileStore(store, info.world_size),
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=timeout),
        )
        shard = _import_loader(loader)(**kwargs, rank=info)
    except BaseException as error:
        conn.send_bytes(pickle.dumps(("error", _one_line(error))))
        return
    conn.send_bytes(pickle.dumps(("ok", None)))
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if not payload:
            break
        method, args, kw = pickle.loads(payload)
        try:
            answer: tuple[str, Any] = ("ok", getattr(shard, method)(*args, **kw))
        except BaseException as error:
            if os.environ.get("TP_GANG_TRACEBACKS"):
                traceback.print_exc()
            answer = ("error", _one_line(error))
        try:
            data = pickle.dumps(answer)
        except Exception as error:
            data = pickle.dumps(("error", f"rank {info.rank}: unpicklable result: {error}"))
        conn.send_bytes(data)
    dist.destroy_process_group()


class LocalGang:
    """``world_size`` rank processes, each holding the shard ``loader`` returns
    (``path/to/file.py:function`` or ``module:function``). ``devices``: one per rank
    (all "cpu" by default); ``timeout``: seconds a collective waits (gloo, NCCL);
    ``threads``: torch threads per rank (None: torch's default)."""

    def __init__(
        self,
        loader: str,
        world_size: int,
        kwargs: dict[str, Any] | None = None,
        *,
        backend: str = "gloo",
        devices: list[str] | None = None,
        timeout: float = 60.0,
        threads: int | None = 1,
        start_timeout: float = 600.0,
    ) -> None:
        self.world_size, self.backend = world_size, backend
        self.devices = list(devices or ["cpu"] * world_size)
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="tp-gang-")
        # The spawned ranks unpickle _rank_main by this module's name.
        if str(HERE) not in sys.path:
            sys.path.append(str(HERE))
        context = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self.processes: list[Any] = []
        for rank in range(world_size):
            mine, theirs = context.Pipe()
            info = RankInfo(rank, world_size, self.devices[rank], backend, rank)
            process = context.Process(
                target=_rank_main,
                args=(theirs, loader, kwargs or {}, info, f"{self._dir}/store", timeout, threads),
                daemon=True,
                name=f"tp-rank-{rank}",
            )
            process.start()
            theirs.close()
            self._conns.append(mine)
            self.processes.append(process)
        failed = [r for r in self.collect(start_timeout) if r.status != "ok"]
        if failed:
            self.close()
            raise GangError(_describe(failed[0]))

    @property
    def pids(self) -> list[int]:
        """The rank processes' ids, by rank."""
        return [p.pid for p in self.processes]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``shard.method(*args, **kwargs)`` on every rank; rank 0's return value.
        Raises :class:`GangError` (one line) if a rank raised or died."""
        with self._lock:
            self.submit(method, *args, **kwargs)
            replies = self.collect()
        failed = [r for r in replies if r.status != "ok"]
        if failed:
            raise GangError(_describe(failed[0]))
        return replies[0].value

    def submit(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Send a call to every rank without waiting (then :meth:`collect`)."""
        payload = pickle.dumps((method, args, kwargs))
        for conn in self._conns:
            try:
                conn.send_bytes(payload)
            except OSError:
                pass  # a dead rank: collect reports it

    def collect(self, timeout: float | None = None, ranks: list[int] | None = None) -> list[Reply]:
        """Every rank's reply to the last call, waiting at most ``timeout`` seconds
        (None: until all have answered or died) for those of ``ranks`` (None: all)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies = {rank: Reply(rank, "pending") for rank in range(self.world_size)}
        waiting = {
            conn: rank
            for rank, conn in enumerate(self._conns)
            if not conn.closed and (ranks is None or rank in ranks)
        }
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(waiting), left)
            if not ready:
                break
            for conn in ready:
                assert isinstance(conn, Connection)
                rank = waiting.pop(conn)
                try:
                    status, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self.processes[rank].join(5)
                    status, value = "died", self.processes[rank].exitcode
                replies[rank] = Reply(rank, status, value, time.perf_counter())
        return [replies[rank] for rank in range(self.world_size)]

    def close(self, wait_seconds: float = 10.0) -> None:
        """Stop every rank (asked, then killed after ``wait_seconds``)."""
        for conn in self._conns:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
        deadline = time.monotonic() + wait_seconds
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)
        for conn in self._conns:
            conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalGang:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _describe(reply: Reply) -> str:
    if reply.status == "died":
        return f"rank {reply.rank} died (exit code {reply.value})"
    if reply.status == "pending":
        return f"rank {reply.rank} did not answer"
    return f"rank {reply.rank}: {reply.value}"
