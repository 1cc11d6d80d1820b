"""A server's side of peer-to-peer transfer as the holder: it serves the files of the
context templates in its local cache to other servers of the cluster.

The requests arrive on the server's own Dask port, which accepts only the cluster's
certificate (mutual TLS): no listener of its own. A request names a context identity
and the declaration the requester was given (loader and arguments); the holder
recomputes the identity from the declaration, asks its own copy of the loader where
the template lies (:func:`...loaders.template_dir`), and serves only

- a template that is a usable cache entry of this user's (:func:`...modelcache.entry_problem`:
  no symlink anywhere in it, nothing others could write, or matching the digests
  recorded when it was written);
- the files its recorded manifest lists, by the manifest's own relative paths (a
  request for any other path, ``../`` included, is refused), each opened component
  by component from the entry's directory without following a symlink, and read only
  while it still has the manifest's size.

At most ``limit`` transfers run at once (:class:`TransferSessions`); a receiver that
went silent for :data:`IDLE_SECONDS` loses its session. Each session holds its entry
in the node's cache (no server removes it to make room meanwhile), and its receiver
keeps a call open that is answered only when the session ends (``watch``): if this
server dies, that connection closes, and the receiver knows at once. The answer to a
receiver that asks says the template's size and, while every session is taken, when
the first is expected to end (for the receiver's choice between a peer and the
source, :func:`...fleet.peerchoice.choose_origin`). A receiver that got a file whose
digest differs from the manifest says so as it ends its session: the holder then
checks its entry anew, every digest, and moves it aside if it is damaged
(:mod:`...modelcache.cachecheck`; an event, a catalog row).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ... import loaders, modelcache
from ...contexts import ContextDeclaration, make_declaration
from ...errors import ContextExecutorError, UnsafePathError
from ...modelcache import cachecheck
from ...modelcache.manifest import Manifest
from ..output import server_directory
from ..templates import damage_events
from .wire import CHUNK_OP, DONE_OP, TEMPLATE_OP, WATCH_OP, Chunk, TemplateOffer

__all__ = ["CHUNK_BYTES", "HANDLERS", "IDLE_SECONDS", "TemplateHolder", "TransferSessions"]

logger = logging.getLogger(__name__)

#: Bytes of one chunk: one message on the cluster's connections.
CHUNK_BYTES = 8 << 20
#: A session no chunk was asked for in this long is closed (its receiver died).
IDLE_SECONDS = 60.0
#: The Dask handler names a holder adds to its worker: op -> method.
HANDLERS = {
    TEMPLATE_OP: "template",
    CHUNK_OP: "chunk",
    DONE_OP: "done",
    WATCH_OP: "watch",
}


@dataclass
class _Session:
    identity: str
    entry: Path
    sizes: dict[str, int]
    last: float
    sent: int = 0
    #: When the session's share of ``rate`` is free again (chunks asked at once queue).
    paced_until: float = 0.0
    started: float = 0.0
    #: Ends its hold of the entry in the node's cache.
    release: Callable[[], None] = lambda: None
    #: Set when it ends (its receiver's watch is answered).
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def end(self) -> None:
        """The session is over: the entry is no longer the server's to keep."""
        server_directory(self.entry, using=False)
        self.release()
        self.ended.set()


@dataclass
class TransferSessions:
    """Who is being served, at most ``limit`` at once: a pure book (the caller passes
    the time)."""

    limit: int
    idle: float = IDLE_SECONDS
    open: dict[str, _Session] = field(default_factory=dict)

    def expire(self, now: float) -> list[_Session]:
        """Close the sessions idle for longer than ``idle``; the ones closed."""
        gone = [t for t, session in self.open.items() if now - session.last > self.idle]
        return [self.open.pop(token) for token in gone]

    def begin(self, identity: str, entry: Path, sizes: dict[str, int], now: float) -> str | None:
        """A new session's token, or None while ``limit`` are open (expire first)."""
        if len(self.open) >= self.limit:
            return None
        token = secrets.token_hex(16)
        self.open[token] = _Session(identity, entry, sizes, now, started=now)
        return token

    def wait(self, now: float, rate: float = 0.0) -> float | None:
        """Seconds until the first open session is expected to end: what is left of
        it at ``rate`` (bytes a second each session is paced at), else at the rate it
        has run at so far, once it has sent a chunk's worth; None when none is open or
        none has yet. (A template's first file may be a few bytes: 100 bytes of 50 MB
        sent in its first second had the holder say 500,000 s, and its receiver read
        the source instead.)"""
        ends = []
        for session in self.open.values():
            total = sum(session.sizes.values())
            left = max(0, total - session.sent)
            if rate > 0:
                ends.append(max(0.0, session.paced_until - now) + left / rate)
            elif session.sent >= min(CHUNK_BYTES, total) > 0 and now > session.started:
                ends.append(left * (now - session.started) / session.sent)
        return min(ends) if ends else None

    def get(self, token: str, now: float) -> _Session | None:
        """The open session of ``token`` (its clock restarted), or None."""
        session = self.open.get(token)
        if session is not None:
            session.last = now
        return session

    def end(self, token: str) -> _Session | None:
        """Close a session: the one closed (None if it was gone)."""
        return self.open.pop(token, None)


class TemplateHolder:
    """Serves this server's templates; ``rate``: bytes a second each transfer gets
    (0: as fast as the disk and the connection go); ``address`` and ``emit``: the
    server's, for the events of the entries it finds damaged."""

    def __init__(
        self,
        limit: int,
        rate: float = 0.0,
        *,
        address: str = "",
        emit: Callable[..., None] = lambda *events: None,
    ) -> None:
        self.sessions = TransferSessions(max(0, int(limit)))
        self.rate = max(0.0, float(rate))
        self.address = address
        self.emit = emit
        self._checks: set[asyncio.Future[None]] = set()

    def install(self, worker: Any) -> None:
        """Add the handlers to the worker's server (its TLS port)."""
        for op, method in HANDLERS.items():
            worker.handlers[op] = getattr(self, method)

    async def template(
        self, identity: str, declaration: dict[str, Any], begin: bool = False
    ) -> dict[str, Any]:
        """Whether this server holds ``identity``'s template, how many more transfers
        it would serve, and with ``begin`` a session's token and the manifest (or why
        it ``refused``)."""
        try:
            entry, manifest = await asyncio.to_thread(self._held, identity, declaration)
        except (ContextExecutorError, OSError, ValueError, TypeError, KeyError) as error:
            return TemplateOffer(held=False, why=str(error)[:300]).to_wire()
        if entry is None or manifest is None:
            return TemplateOffer(held=False, why="not in this server's cache").to_wire()
        now = time.monotonic()
        for gone in self.sessions.expire(now):
            gone.end()
        spare = self.sessions.limit - len(self.sessions.open)
        offer = TemplateOffer(
            held=True,
            spare=spare,
            nbytes=manifest.total_bytes,
            wait=self.sessions.wait(now, self.rate) if spare <= 0 else None,
        )
        if begin:
            sizes = {e.path: e.size for e in manifest.files}
            token = self.sessions.begin(identity, entry, sizes, now)
            if token is None:
                refused = f"serving {self.sessions.limit} transfers already"
                offer = replace(offer, refused=refused)
            else:
                server_directory(entry, using=True)
                self.sessions.open[token].release = await asyncio.to_thread(
                    modelcache.hold_entry, entry
                )
                offer = replace(offer, token=token, manifest=manifest.to_json())
        return offer.to_wire()

    async def chunk(self, token: str, path: str, offset: int, length: int) -> dict[str, Any]:
        """Up to ``length`` bytes of the manifest's file ``path`` from ``offset``."""
        session = self.sessions.get(token, time.monotonic())
        if session is None:
            return Chunk(error="no such transfer (it ended, or was idle too long)").to_wire()
        size = session.sizes.get(path)
        if size is None:
            return Chunk(error=f"{path!r} is not a file of the template's manifest").to_wire()
        if not 0 <= int(offset) <= size:
            return Chunk(error=f"{path}: offset {offset} is outside its {size} bytes").to_wire()
        length = max(0, min(int(length), CHUNK_BYTES, size - int(offset)))
        try:
            data = await asyncio.to_thread(_read, session.entry, path, size, int(offset), length)
        except (OSError, UnsafePathError) as error:
            return Chunk(error=f"{path}: {error}").to_wire()
        session.sent += len(data)
        if self.rate:
            now = time.monotonic()
            session.paced_until = max(now, session.paced_until) + len(data) / self.rate
            await asyncio.sleep(session.paced_until - now)
        return Chunk(data=data).to_wire()

    async def done(self, token: str, damaged: str = "") -> dict[str, Any]:
        """The receiver is finished with its session; ``damaged``: a file it got
        whose digest differs from the manifest (the entry is checked anew)."""
        session = self.sessions.end(token)
        if session is not None:
            session.end()
            if damaged in session.sizes:
                logger.warning(
                    "a peer got %s of %s with a digest that differs from its manifest: "
                    "checking it anew",
                    damaged,
                    session.entry,
                )
                check = asyncio.ensure_future(asyncio.to_thread(self._recheck, session))
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)
        return {}

    async def watch(self, token: str) -> dict[str, Any]:
        """Answered when the session ``token`` ends (done, or idle too long): until
        then the receiver's call stays open, and its connection closes if this
        server dies."""
        session = self.sessions.open.get(token)
        while session is not None and self.sessions.open.get(token) is session:
            try:
                await asyncio.wait_for(session.ended.wait(), self.sessions.idle)
            except TimeoutError:
                for gone in self.sessions.expire(time.monotonic()):
                    gone.end()
        return {"ended": True}

    def _recheck(self, session: _Session) -> None:
        """Check a served entry anew, every digest (a damaged one goes aside)."""
        cachecheck.forget(session.entry)
        with cachecheck.watching() as found:
            modelcache.check_before_load(session.entry)
        if found:
            self.emit(*damage_events(found, self.address, session.identity))

    def _held(self, identity: str, declared: dict[str, Any]) -> tuple[Path | None, Manifest | None]:
        declaration = _declaration(identity, declared)
        entry = loaders.template_dir(declaration)
        if entry is None or not modelcache.is_cached(entry):
            return None, None
        return entry, modelcache.recorded_manifest(entry)


def _declaration(identity: str, declared: dict[str, Any]) -> ContextDeclaration:
    """The requester's declaration, only if it is the context ``identity`` names."""
    name, loader = str(declared["name"]), str(declared["loader"])
    basedir = Path(declared["loader_path"]).parent if declared.get("loader_path") else Path.cwd()
    declaration = make_declaration(
        name, loader, dict(declared["kwargs"]), basedir, ranks=int(declared.get("ranks", 1))
    )
    if declaration.identity != identity:
        raise ValueError(f"the declaration of {name!r} is not the context {identity[:12]}")
    return declaration


def _read(entry: Path, relative: str, size: int, offset: int, length: int) -> bytes:
    """Read from the file ``relative`` of ``entry``, opening each directory and the
    file without following a symlink; only a regular file of the manifest's size."""
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"{relative!r} is not a path inside the template")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(entry, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        inner = os.open(parts[-1], flags, dir_fd=fd)
        os.close(fd)
        fd = inner
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            raise UnsafePathError(f"{relative} is not the manifest's file of {size} bytes")
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)
