"""What keeps a cluster serving its owner while another user floods its ports.

Anyone on the host can open TCP connections to a cluster's ports; mutual TLS keeps
them from running anything, but Dask waits for each one's TLS handshake for ever and
Tornado, when the process runs out of descriptors, logs one traceback per refused
accept and tries again at once. Idle connections then exhaust the scheduler's (or a
server's) descriptors, stop it serving its owner and fill its log (issue 66). In
every process of a cluster (:func:`install_guard`, once per process: the cluster process,
which runs the scheduler and the nannies, and each server, :class:`GuardedWorker`):

- a peer that has not finished the TLS handshake within :data:`HANDSHAKE_SECONDS` is
  dropped;
- connections still in the handshake are bounded, per peer address
  (:data:`PENDING_PER_ADDRESS`) and per process (:data:`PENDING_TOTAL`, well below
  the descriptor limit): a new one drops the oldest, so one who holds connections
  open cannot keep the owner, on the same address, out;
- a failed accept (no descriptors left) pauses that port's accepts for
  :data:`ACCEPT_PAUSE` seconds and drops the oldest pending handshake;
- each kind of drop and accept error is logged once per :data:`LOG_INTERVAL` with
  its count, never one line (or traceback) per connection;
- Dask's HTTP server (plaintext, no credentials) listens nowhere.

Dask has no setting for any of this: :func:`install_guard` replaces Dask's TLS listener's
handshake step and the accept handler Tornado's servers use, after checking that the
installed versions have both.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from distributed import Worker

from ..errors import ClusterError

__all__ = [
    "ACCEPT_PAUSE",
    "HANDSHAKE_SECONDS",
    "LOG_INTERVAL",
    "PENDING_PER_ADDRESS",
    "PENDING_TOTAL",
    "GuardedWorker",
    "Tally",
    "install_guard",
]

logger = logging.getLogger(__name__)

#: Seconds a peer has to finish its TLS handshake (a member of the cluster takes
#: milliseconds; the scheduler's loop busy with many servers starting, well under 1 s).
HANDSHAKE_SECONDS = 5.0
#: Connections from one address that may be in the TLS handshake at once.
PENDING_PER_ADDRESS = 32
#: Connections of the whole process that may be in the TLS handshake at once (or a
#: quarter of the descriptor limit, if that is less).
PENDING_TOTAL = 256
#: Seconds a port stops accepting after an accept failed for want of descriptors.
ACCEPT_PAUSE = 0.2
#: Seconds between two log lines of one kind of drop.
LOG_INTERVAL = 10.0

#: An accept that failed for want of a resource, which the next one would too.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Tally:
    """Events of one kind, logged at most once per ``interval`` seconds as a count by
    reason, with the last one's detail. The first is logged at once; the rest of an
    interval when it ends (a timer in the loop that saw them)."""

    def __init__(self, what: str, interval: float = LOG_INTERVAL) -> None:
        self.what = what
        self.interval = interval
        self.reasons: Counter[str] = Counter()
        self.detail = ""
        self.last = -float("inf")
        self.timer: asyncio.TimerHandle | None = None
        self.lock = threading.Lock()

    def note(self, reason: str, detail: str) -> None:
        """Count one event; log now if the interval since the last line has passed."""
        with self.lock:
            self.reasons[reason] += 1
            self.detail = detail
            wait = self.last + self.interval - time.monotonic()
            if wait > 0:
                if self.timer is None:
                    try:
                        loop = asyncio.get_running_loop()
                    except RuntimeError:
                        return  # logged with the next event after the interval
                    self.timer = loop.call_later(wait, self.flush)
                return
        self.flush()

    def flush(self) -> None:
        """Log what was counted since the last line, if anything."""
        with self.lock:
            self.timer = None
            if not self.reasons:
                return
            counts = ", ".join(f"{n} {reason}" for reason, n in self.reasons.most_common())
            total = sum(self.reasons.values())
            self.reasons.clear()
            self.last = time.monotonic()
            detail = self.detail
        logger.warning(
            "%s %d connection(s) (%s; the last: %s); logged at most once every %g s",
            self.what,
            total,
            counts,
            detail,
            self.interval,
        )


#: Connections dropped before their TLS handshake finished.
DROPPED = Tally("dropped before their TLS handshake finished:")
#: Connections that could not be accepted.
REFUSED = Tally("could not accept")


class _Pending:
    """One connection in its TLS handshake."""

    __slots__ = ("dropped", "host", "stream")

    def __init__(self, stream: Any, host: str) -> None:
        self.stream = stream
        self.host = host
        self.dropped = False

    def drop(self) -> None:
        """Close it (from its own loop: Tornado's streams are not thread-safe)."""
        self.dropped = True
        loop = self.stream.io_loop
        from tornado.ioloop import IOLoop

        if IOLoop.current(instance=False) is loop:
            self.stream.close()
        else:
            loop.add_callback(self.stream.close)


class PendingHandshakes:
    """The process's connections in their TLS handshake, oldest first, bounded per
    peer address and in all: admitting one over a bound drops the oldest."""

    def __init__(self, per_address: int, total: int) -> None:
        self.per_address = per_address
        self.total = total
        self.lock = threading.Lock()
        self.all: dict[int, _Pending] = {}
        self.by_host: dict[str, dict[int, _Pending]] = {}

    def admit(self, stream: Any, host: str) -> _Pending:
        """Record ``stream`` (from ``host``), dropping the oldest over a bound."""
        pending = _Pending(stream, host)
        with self.lock:
            mine = self.by_host.setdefault(host, {})
            over = []
            while len(mine) >= self.per_address:
                over.append(self._forget(next(iter(mine.values()))))
            while len(self.all) >= self.total:
                over.append(self._forget(next(iter(self.all.values()))))
            self.all[id(pending)] = pending
            self.by_host.setdefault(host, {})[id(pending)] = pending
        for old in over:
            old.drop()
        return pending

    def release(self, pending: _Pending) -> None:
        """``pending`` finished its handshake, failed, or was dropped."""
        with self.lock:
            if id(pending) in self.all:
                self._forget(pending)

    def drop_oldest(self) -> bool:
        """Drop the oldest pending handshake (frees a descriptor); whether there was one."""
        with self.lock:
            if not self.all:
                return False
            oldest = self._forget(next(iter(self.all.values())))
        oldest.drop()
        return True

    def _forget(self, pending: _Pending) -> _Pending:
        del self.all[id(pending)]
        mine = self.by_host[pending.host]
        del mine[id(pending)]
        if not mine:
            del self.by_host[pending.host]
        return pending


def _total_bound() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(PENDING_PER_ADDRESS, min(PENDING_TOTAL, soft // 4))


PENDING = PendingHandshakes(PENDING_PER_ADDRESS, _total_bound())


def _peer_host(address: str) -> str:
    """The host of ``tls://HOST:PORT`` (``[::1]`` for IPv6)."""
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


async def _prepare_stream(self: Any, stream: Any, address: str) -> Any:
    """Dask's TLS listener's handshake step (``TLSListener._prepare_stream``), with a
    deadline and a bounded number pending; None: the connection was dropped."""
    pending = PENDING.admit(stream, _peer_host(address))
    try:
        await asyncio.wait_for(stream.wait_for_handshake(), HANDSHAKE_SECONDS)
    except OSError as error:  # TimeoutError, a closed stream, a refused certificate
        if pending.dropped:
            reason = "over the pending bound"
        elif isinstance(error, TimeoutError):
            reason = f"silent for {HANDSHAKE_SECONDS:g} s"
        else:
            reason = "failed"
        why = getattr(error, "real_error", None) or error
        DROPPED.note(
            reason, f"from {address} to {self.listen_address}: {str(why) or type(why).__name__}"
        )
        stream.close()
        return None
    finally:
        PENDING.release(pending)
    return stream


def _accept_handler(sock: socket.socket, callback: Callable[[socket.socket, Any], None]) -> Any:
    """Tornado's ``netutil.add_accept_handler``, which lets an accept's OSError escape
    to the loop (one traceback per try, at once again: the port stays readable); here
    an accept without descriptors pauses the port and is counted."""
    from tornado.ioloop import IOLoop
    from tornado.netutil import _DEFAULT_BACKLOG

    io_loop = IOLoop.current()
    state = {"removed": False, "paused": False}

    def accept(fd: Any, events: int) -> None:
        for _ in range(_DEFAULT_BACKLOG):
            if state["removed"] or state["paused"]:
                return
            try:
                connection, address = sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue
            except OSError as error:
                if error.errno not in _EXHAUSTED:
                    raise
                REFUSED.note(
                    f"{errno.errorcode.get(error.errno or 0, '?')} ({error.strerror})",
                    f"on {sock.getsockname()}; paused {ACCEPT_PAUSE:g} s each time",
                )
                PENDING.drop_oldest()
                state["paused"] = True
                io_loop.remove_handler(sock)
                io_loop.call_later(ACCEPT_PAUSE, resume)
                return
            callback(connection, address)

    def resume() -> None:
        state["paused"] = False
        if not state["removed"]:
            io_loop.add_handler(sock, accept, IOLoop.READ)

    def remove() -> None:
        if not state["paused"]:
            io_loop.remove_handler(sock)
        state["removed"] = True

    io_loop.add_handler(sock, accept, IOLoop.READ)
    return remove


class _QuietTLSErrors(logging.Filter):
    """Tornado logs a warning for each failed TLS handshake (a stranger's garbage):
    those are counted in :data:`DROPPED` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SSL Error on")


_installed = False
_install_lock = threading.Lock()


def install_guard() -> None:
    """Install the guard in this process (once; later calls do nothing). One line
    naming what is missing if the installed Dask or Tornado lacks what it replaces."""
    global _installed
    with _install_lock:
        if _installed:
            return
        import distributed
        import tornado
        import tornado.netutil
        import tornado.tcpserver
        from distributed.comm import tcp
        from distributed.node import ServerNode
        from tornado.iostream import SSLIOStream

        missing = [
            name
            for name, ok in (
                (
                    "distributed.comm.tcp.TLSListener._prepare_stream",
                    inspect.iscoroutinefunction(getattr(tcp.TLSListener, "_prepare_stream", None)),
                ),
                (
                    "tornado.tcpserver.add_accept_handler",
                    getattr(tornado.tcpserver, "add_accept_handler", None)
                    is getattr(tornado.netutil, "add_accept_handler", False),
                ),
                ("tornado.netutil._DEFAULT_BACKLOG", hasattr(tornado.netutil, "_DEFAULT_BACKLOG")),
                ("SSLIOStream.wait_for_handshake", hasattr(SSLIOStream, "wait_for_handshake")),
                (
                    "distributed.node.ServerNode.start_http_server",
                    hasattr(ServerNode, "start_http_server"),
                ),
            )
            if not ok
        ]
        if missing:
            raise ClusterError(
                f"distributed {distributed.__version__} with tornado {tornado.version} lacks "
                f"{', '.join(missing)}, which the cluster's guard against connection floods "
                "replaces. Fix: install the distributed and tornado versions this plugin "
                "requires (pip install snakemake-executor-plugin-context)."
            )
        tcp.TLSListener._prepare_stream = _prepare_stream  # type: ignore[method-assign]
        tornado.tcpserver.add_accept_handler = _accept_handler
        logging.getLogger("tornado.general").addFilter(_QuietTLSErrors())
        ServerNode.start_http_server = _no_http_listener  # type: ignore[method-assign]
        _installed = True


def _no_http_listener(
    self: Any, routes: Any, dashboard_address: Any, default_port: int = 0, ssl_options: Any = None
) -> None:
    """Dask's HTTP server of a scheduler or worker, made but never listening: its
    routes are none (the servers' config), yet Dask's HTTP port answered
    ``/sitemap.json`` to anyone, in plaintext, and could be flooded like any other."""
    from distributed.http.routing import RoutingApplication
    from tornado.httpserver import HTTPServer

    self.http_application = RoutingApplication(routes)
    self.http_server = HTTPServer(self.http_application)
    self.http_server.address, self.http_server.port = None, None


def dask_setup(nanny: Any) -> None:
    """A pilot's nanny (``--preload-nanny``): the guard in its process. It already
    listens, so its port keeps Tornado's accept handler, but every handshake from now
    on has its deadline and bounds."""
    install_guard()


class GuardedWorker(Worker):
    """Dask's worker, in a process with the guard installed before it listens (the
    class the cluster's nannies and pilots start: ``worker_class``), that notes when
    its scheduler last answered a heartbeat (:attr:`heard_at`)."""

    #: When the scheduler last answered one of its heartbeats (``time.monotonic``;
    #: None: not yet). A server's lease counts from it: cut off by a partition, its
    #: connection stays open, unanswered, until the TCP timeout, which a site may set
    #: beyond the lease (``distributed.comm.timeouts.tcp``).
    heard_at: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install_guard()
        super().__init__(*args, **kwargs)

    def _update_latency(self, latency: float) -> None:
        # Dask calls it once a heartbeat was answered, and only then.
        self.heard_at = time.monotonic()
        super()._update_latency(latency)
