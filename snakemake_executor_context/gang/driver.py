"""The driver of a gang: the rank processes of one context, and the one way to call them.

A context that spans k ranks (``declare_context(..., ranks=k)``, a loader with a shard
loader) is k processes, one per device (:mod:`.rank`), started by the process that
holds the context: a context server, or a job's own process under another executor.
:func:`.start.start_gang` starts them and waits until each has loaded its shard;
:meth:`Gang.call` runs one method on every shard at once and returns rank 0's value.
Calls are serialised here: collectives must be issued in the same order on every rank,
so this driver is the only one that issues them (several slots share a gang through
the front's batcher, whose leader calls).

A gang is whole or lost. A rank that dies (killed, crashed, out of memory) loses the
context: the other ranks are killed at once, every caller gets :class:`~..errors.
GangBroken`, and ``on_broken`` is told (a server leaves, so its jobs run again). A rank
that raises while the others finish keeps the gang (the caller gets the error); one
that raises while the others wait in a collective desynchronises it: the gang is torn
down, the caller gets the error, and the next user loads it again.

Standard library only: torch lives in the rank processes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ..errors import GangBroken, RankError
from .rank import CLOSE
from .rendezvous import STORE, StoreBook

__all__ = ["Gang", "RankLoss", "RankProcess", "receive"]

logger = logging.getLogger(__name__)

#: Seconds the other ranks may take to answer once one has raised; after that they
#: wait in a collective the raising rank never joins, and the gang is torn down.
SETTLE_SECONDS = 5.0
#: Seconds a closing rank may take to leave its group before it is killed.
CLOSE_SECONDS = 5.0
#: Seconds a caller that saw a rank die waits for the loss to be told first.
TELL_SECONDS = 10.0
#: How often a waiting driver looks up from its select (a cancelled job's thread
#: gets its exception between two looks).
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class RankLoss:
    """A rank that died: which, its process, how it ended, and when."""

    context: str
    rank: int
    world_size: int
    pid: int
    #: Its exit code as ``subprocess`` reports it (negative: the signal); None: unknown.
    exit_code: int | None
    #: "a call", "idle" or "the load".
    during: str

    def describe(self) -> str:
        """'rank 1 of 3 of context 'x' (pid 42) killed by SIGKILL during a call'."""
        if self.exit_code is None:
            how = "gone"
        elif self.exit_code < 0:
            how = f"killed by {_signal_name(-self.exit_code)}"
        else:
            how = f"exited with code {self.exit_code}"
        return (
            f"rank {self.rank} of {self.world_size} of context '{self.context}' "
            f"(pid {self.pid}) {how} during {self.during}"
        )


class RankProcess:
    """One rank's process, its end of the socket pair, and ``death``: a descriptor
    that becomes readable when the process has ended (its pidfd)."""

    def __init__(self, rank: int, popen: subprocess.Popen[bytes], conn: Connection) -> None:
        self.rank = rank
        self.popen = popen
        self.conn = conn
        self.death = os.pidfd_open(popen.pid)

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.popen.pid

    def exit_code(self, timeout: float = 1.0) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.exit_code(timeout=5.0)

    def close_fds(self) -> None:
        self.conn.close()
        try:
            os.close(self.death)
        except OSError:
            pass


class Gang:
    """The ranks of one loaded context (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        ranks: Sequence[Any],
        devices: Sequence[str],
        backend: str,
        book: StoreBook,
        on_broken: Callable[[RankLoss], None] | None,
    ) -> None:
        self.name = name
        self._ranks = list(ranks)
        self.devices = list(devices)
        self.backend = backend
        #: The rendezvous it answers (ranks may ask again when they make groups).
        self.book = book
        self._on_broken = on_broken
        self._call_lock = threading.Lock()
        self._state_lock = threading.Lock()
        #: Why the gang is no longer usable (None: it is).
        self.broken: str | None = None
        self.loss: RankLoss | None = None
        self._closing = False
        #: Set once ``on_broken`` has been told of a loss.
        self._told = threading.Event()
        #: Each rank's node, in rank order.
        self.nodes: list[str] = [""] * len(ranks)
        #: Bytes each rank's shard took (its RSS growth, or CUDA memory on a GPU).
        self.rank_bytes: list[int] = []
        self._stop_r, self._stop_w = os.pipe()
        self._watcher = threading.Thread(
            target=self._watch, name=f"snakemake-context gang {name}", daemon=True
        )

    @property
    def world_size(self) -> int:
        """How many ranks it has."""
        return len(self._ranks)

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids, by rank."""
        return [r.pid for r in self._ranks]

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """Run ``shard.method(*args, **kwargs)`` on every rank; rank 0's value."""
        with self._call_lock:
            if self.broken is not None:
                raise GangBroken(self._broken_message())
            message = ("call", method, args, kwargs)
            try:
                for rank in self._ranks:
                    rank.conn.send(message)
                return self._gather(method)
            except (GangBroken, RankError):
                raise
            except (BrokenPipeError, ConnectionResetError, EOFError) as error:
                self._lose_first_dead("a call")
                raise GangBroken(self._broken_message()) from error
            except BaseException:
                # Interrupted mid-call (a cancelled job): the ranks' state is unknown.
                self._tear_down(f"a call of {method}() was interrupted")
                raise

    def _gather(self, method: str) -> Any:
        pending = {r.conn: r for r in self._ranks}
        values: dict[int, Any] = {}
        errors: dict[int, Any] = {}
        settle_by: float | None = None
        deaths = {r.death: r for r in self._ranks}
        while pending:
            for item in wait([*pending, *deaths], timeout=POLL_SECONDS):
                if isinstance(item, int):
                    self._lose(deaths[item], "a call")
                    raise GangBroken(self._broken_message())
                conn = cast(Connection, item)
                rank = pending[conn]
                try:
                    reply = receive(conn, self.book)
                except (EOFError, OSError):
                    self._lose(rank, "a call")
                    raise GangBroken(self._broken_message()) from None
                if reply is None:  # a store operation, answered
                    continue
                del pending[conn]
                kind, value = reply
                (values if kind == "ok" else errors)[rank.rank] = value
            if errors and settle_by is None:
                settle_by = time.monotonic() + SETTLE_SECONDS
            if pending and settle_by is not None and time.monotonic() > settle_by:
                first = min(errors)
                self._tear_down(f"rank {first} raised in {method}() while others waited")
                raise RankError(self._rank_error(first, method, errors[first], torn=True))
        if errors:
            first = min(errors)
            raise RankError(self._rank_error(first, method, errors[first], torn=False))
        return values.get(0)

    def _rank_error(self, rank: int, method: str, text: str, *, torn: bool) -> str:
        after = (
            " The other ranks were left waiting in a collective, so the gang was torn "
            "down: the next job loads it again."
            if torn
            else ""
        )
        return (
            f"Context '{self.name}': rank {rank} of {self.world_size} raised in "
            f"{method}().{after}\n{text}"
        )

    def close(self) -> None:
        """End every rank (they leave their group), and the watcher."""
        with self._state_lock:
            if self._closing:
                return
            self._closing = True
        os.write(self._stop_w, b"x")
        with self._call_lock:
            for rank in self._ranks:
                if rank.popen.poll() is None:
                    try:
                        rank.conn.send(CLOSE)
                    except OSError:
                        pass
            deadline = time.monotonic() + CLOSE_SECONDS
            for rank in self._ranks:
                if rank.exit_code(max(0.0, deadline - time.monotonic())) is None:
                    rank.kill()
                rank.close_fds()
        self.broken = self.broken or "closed"
        if self._watcher.is_alive():
            self._watcher.join(timeout=2.0)
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- losing it -------------------------------------------------------------------

    def _watch(self) -> None:
        """Wait for a rank to die while nobody calls (a call sees it itself)."""
        deaths = {r.death: r for r in self._ranks}
        ready = wait([*deaths, self._stop_r])
        for item in ready:
            if isinstance(item, int) and item in deaths:
                self._lose(deaths[item], "idle")
                return

    def _lose_first_dead(self, during: str) -> None:
        for rank in self._ranks:
            if rank.exit_code(timeout=0.5) is not None:
                self._lose(rank, during)
                return
        self._lose(self._ranks[0], during)

    def _lose(self, rank: RankProcess, during: str) -> None:
        """A rank died: kill the others, say so once; return once it is said (a
        caller's GangBroken must not overtake the server's hand-back of its job)."""
        with self._state_lock:
            if self._closing:
                return
            if self.broken is not None:
                told = self._told
            else:
                told = None
                loss = RankLoss(self.name, rank.rank, self.world_size, rank.pid, None, during)
                self.loss = loss
                self.broken = loss.describe()
        if told is not None:
            told.wait(TELL_SECONDS)
            return
        loss = RankLoss(self.name, rank.rank, self.world_size, rank.pid, rank.exit_code(), during)
        self.loss = loss
        self.broken = loss.describe()
        logger.error("gang lost: %s", self.broken)
        for other in self._ranks:
            other.kill()
        try:
            if self._on_broken is not None:
                self._on_broken(loss)
        except Exception:
            logger.exception("telling of a lost gang")
        finally:
            self._told.set()

    def _tear_down(self, why: str) -> None:
        """End a gang whose ranks disagree (not a loss: its server stays)."""
        with self._state_lock:
            if self.broken is not None:
                return
            self.broken = f"torn down: {why}"
            self._closing = True
        os.write(self._stop_w, b"x")
        for rank in self._ranks:
            rank.kill()

    def _broken_message(self) -> str:
        return (
            f"Context '{self.name}' is lost: {self.broken}. A context that spans several "
            "processes is whole or lost; its jobs run again on a new gang."
        )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def receive(conn: Connection, book: StoreBook) -> tuple[str, Any] | None:
    """A rank's next message: its reply (kind, value), or None when it was a store
    operation of its rendezvous, which ``book`` answered."""
    message = conn.recv()
    if message[0] == STORE:
        _, op, args = message
        try:
            answer = book.answer(op, args)
        except Exception as error:  # a rank's mistake: it fails to join, nobody else
            answer = RuntimeError(f"rendezvous: {error}")
        conn.send(answer)
        return None
    return message[0], message[1]
