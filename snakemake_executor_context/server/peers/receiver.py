"""A server's side of peer-to-peer transfer as the receiver: before a load whose
context template is not in its local cache, it fetches the template from a server
that holds it (:mod:`.holder`), instead of reading the context's source.

1. The template: the loader names the local directory (``@loader(template=...)``,
   :func:`...loaders.template_dir`); nothing to do when the loader declares none or the
   directory is already a usable cache entry.
2. The holders, or the source (:mod:`.survey`): every other server is asked
   whether it holds the template; peer or source is chosen by measured rates
   (:func:`...fleet.peerchoice.choose_origin`: a source faster than a busy holder is
   read at once). Holders are tried least busy first.
3. The transfer (under the node's conversion lock of that entry, so two servers of one
   node fetch once: :func:`...modelcache.convert_once`): a session with one holder
   gives the manifest, refused in one line before anything is written when a path
   in it is not a plain relative one inside the directory, a path is listed twice or
   as another's directory, or its sizes do not add up to the bytes the holder
   announced (:meth:`...modelcache.manifest.Manifest.from_json`); room is made in the node's
   cache for it (:func:`...modelcache.make_room`); each file is fetched in chunks into
   a new private directory beside the entry, created directory by directory from a
   descriptor of it without following a symlink, its sha256 taken as it is written.
   A holder that fails (it died, refused, sent a wrong size or a file whose digest
   differs: it is told so, and checks its entry anew) is left: the receiver goes on
   from the next, keeping what it verified and, for the file it was fetching, the
   bytes so far (a file whose digest differs starts again). A holder that dies is
   known at once, by a watch whose connection closes with it
   (:meth:`.reach.DaskPeers.watch`), not after Dask's connect timeout. The manifest
   is recorded and the directory renamed into place only when every file matches
   it; a partial template is never renamed, and so never loaded.
4. When no holder can finish, the directory is removed and the load reads the
   source, with one line in the job's log saying why.

Each holder's part is one :class:`~...fleet.events.ContextTransferred` event.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import loaders, modelcache
from ...contexts import ContextDeclaration
from ...defaults import PEER_WAIT_SECONDS
from ...errors import ManifestError, TemplateTransferError, UnsafePathError
from ...fleet import events as ev
from ...modelcache.manifest import Manifest
from ...terminal import format_bytes
from ..output import server_directory
from .holder import CHUNK_BYTES
from .survey import HolderPick, PeerGone, Peers
from .survey import wire as _wire
from .wire import CHUNK_OP, DONE_OP, TEMPLATE_OP, WATCH_OP, Chunk, MalformedReply, TemplateOffer

__all__ = ["CHUNKS_IN_FLIGHT", "HOLDER_GONE", "PeerFetch", "Peers"]

#: Chunks asked for at once from one holder.
CHUNKS_IN_FLIGHT = 3
#: The outcome of a holder's part that ended as the holder died.
HOLDER_GONE = "holder gone (its connection closed)"

logger = logging.getLogger(__name__)


class _HolderFailed(Exception):
    """This holder's part ended early: the receiver goes on from another (``busy``:
    it refused, serving all the transfers it may)."""

    def __init__(self, why: str, *, busy: bool = False, gone: bool = False) -> None:
        super().__init__(why)
        self.busy = busy
        #: Unreachable (it died, or its connection broke): not asked again.
        self.gone = gone


class _AllBusy(TemplateTransferError):
    """Every holder tried refused (busy) before anything was fetched."""


@dataclass
class _File:
    fd: int
    digest: Any = field(default_factory=hashlib.sha256)
    written: int = 0
    verified: bool = False


@dataclass
class PeerFetch:
    """Fetches templates from peers for the server at ``address``: ``say`` writes a
    line to the running job's log, ``emit`` sends the fleet's events."""

    address: str
    peers: Peers
    emit: Callable[[ev.Event], None]
    say: Callable[[str], None] = print
    #: Seconds to wait for a busy holder before reading the source instead.
    wait: float = PEER_WAIT_SECONDS
    #: The server's GPU model, whose measured loads count first.
    model: str = ""

    def __call__(self, declaration: ContextDeclaration) -> float | None:
        """Fetch ``declaration``'s template if it is missing here and a peer holds it:
        the seconds it took, or None (nothing fetched: the load reads the source)."""
        try:
            entry = loaders.template_dir(declaration)
        except Exception as error:  # the load reports a loader that cannot be imported
            logger.debug("template of %s: %r", declaration.name, error)
            return None
        if entry is None or modelcache.is_cached(entry):
            return None
        started = time.perf_counter()
        deadline = time.monotonic() + self.wait
        pick = HolderPick(self.address, self.peers, self.say, self.wait, self.model)
        holders = pick.free(declaration, deadline)
        if not holders:
            return None
        checked: list[Manifest] = []

        def receive(staging: Path) -> None:
            checked.append(self._receive(declaration, staging, holders))

        def recorded(staging: Path) -> Manifest:
            checked[-1].verify(staging, digests=False)  # the digests were taken in _receive
            return checked[-1]

        while True:
            try:
                wrote = modelcache.convert_once(entry, receive, manifest=recorded)
                break
            except _AllBusy:
                holders = pick.free(declaration, deadline)
                if not holders:
                    return None
            except (TemplateTransferError, UnsafePathError) as error:
                self.say(f"Context '{declaration.name}': {error} Loading it from its source.")
                return None
        seconds = time.perf_counter() - started
        if wrote:
            nbytes = checked[-1].total_bytes
            self.say(
                f"Context '{declaration.name}': its template ({format_bytes(nbytes)}) came from "
                f"peers in {seconds:.1f} s."
            )
        return seconds if wrote else None

    def _receive(
        self, declaration: ContextDeclaration, staging: Path, holders: list[str]
    ) -> Manifest:
        """Fill ``staging`` from the holders (each tried at most twice: a digest that
        differs is fetched again); the manifest every file matched."""
        known: list[Manifest] = []
        files: dict[str, _File] = {}
        why: list[str] = []
        busy_only = True
        server_directory(staging, using=True)
        try:
            gone: set[str] = set()
            for holder in holders + holders:
                if holder in gone:
                    continue
                started, before = time.perf_counter(), sum(f.written for f in files.values())
                outcome = "ok"
                try:
                    self._from(declaration, holder, staging, known, files)
                except _HolderFailed as error:
                    if error.busy and not files:
                        continue  # refused before sending anything: no transfer to record
                    busy_only = False
                    if error.gone:
                        gone.add(holder)
                    outcome = str(error)
                    why.append(f"{holder}: {outcome}")
                got = sum(f.written for f in files.values()) - before
                self.emit(
                    ev.ContextTransferred(
                        address=self.address,
                        identity=declaration.identity,
                        peer=holder,
                        bytes=max(0, got),
                        seconds=time.perf_counter() - started,
                        outcome=outcome[:500],
                    )
                )
                if outcome == "ok":
                    return known[0]
        finally:
            for state in files.values():
                os.close(state.fd)
            server_directory(staging, using=False)
        if busy_only:
            raise _AllBusy("every holder is busy.")
        raise TemplateTransferError(
            f"no peer sent its template whole ({'; '.join(why[-3:]) or 'none answered'})."
        )

    def _from(
        self,
        declaration: ContextDeclaration,
        holder: str,
        staging: Path,
        known: list[Manifest],
        files: dict[str, _File],
    ) -> None:
        """Fetch what is missing from ``holder``; ``known``: the first manifest offered
        (every holder must offer the same)."""
        call = _Caller(self.peers, holder)
        reached, differs = True, ""
        reply = call(
            TEMPLATE_OP, identity=declaration.identity, declaration=_wire(declaration), begin=True
        )
        try:
            opened = TemplateOffer.from_wire(reply)
        except MalformedReply as error:
            raise _HolderFailed(str(error)) from None
        token = opened.token
        if not token:
            refused = opened.refused
            raise _HolderFailed(refused or opened.why or "refused", busy=bool(refused))
        call.unless = self.peers.watch(holder, WATCH_OP, token=token)
        try:
            offered = _offered(opened)
            if not known:
                _make_room(staging, offered)
                known.append(offered)
            elif offered != known[0]:
                raise _HolderFailed("its manifest differs from the first holder's")
            for entry in offered.files:
                state = files.get(entry.path) or files.setdefault(
                    entry.path, _File(_create(staging, entry.path))
                )
                while not state.verified:
                    self._chunks(call, token, entry.path, entry.size, state)
                    if state.digest.hexdigest() != entry.sha256:
                        os.ftruncate(state.fd, 0)
                        files[entry.path] = _File(state.fd)
                        differs = entry.path
                        raise _HolderFailed(f"{entry.path}: sha256 differs from the manifest")
                    state.verified = True
        except _HolderFailed as error:
            reached = not error.gone
            raise
        finally:
            if reached:  # the holder checks its entry anew when a file of it differs
                told = {"damaged": differs} if differs else {}
                with contextlib.suppress(_HolderFailed):
                    call(DONE_OP, token=token, **told)
            self.peers.unwatch(call.unless)

    @staticmethod
    def _chunks(call: _Caller, token: str, path: str, size: int, state: _File) -> None:
        """Fetch the rest of one file, :data:`CHUNKS_IN_FLIGHT` chunks at a time
        (the holder reads the next while this one is on its way), written in order."""
        while state.written < size:
            offsets = range(state.written, size, CHUNK_BYTES)[:CHUNKS_IN_FLIGHT]
            asked = [
                {"token": token, "path": path, "offset": offset, "length": CHUNK_BYTES}
                for offset in offsets
            ]
            replies = call.each(CHUNK_OP, asked)
            for offset, reply in zip(offsets, replies, strict=True):
                _write_chunk(path, size, offset, state, call.checked(reply))


def _write_chunk(path: str, size: int, offset: int, state: _File, reply: dict[str, Any]) -> None:
    """Write one chunk's reply at the file's end (offset and sizes checked, digest taken)."""
    try:
        chunk = Chunk.from_wire(reply)
    except MalformedReply as error:
        raise _HolderFailed(str(error)) from None
    if chunk.error:
        raise _HolderFailed(chunk.error)
    data = chunk.data
    expected = min(CHUNK_BYTES, size - offset)
    if offset != state.written or len(data) != expected:
        raise _HolderFailed(f"{path}: sent {len(data)} bytes at {offset}, not {expected}")
    try:
        os.pwrite(state.fd, data, state.written)
    except OSError as error:
        raise TemplateTransferError(f"writing {path} failed ({error.strerror}).") from None
    state.digest.update(data)
    state.written += len(data)


def _offered(opened: TemplateOffer) -> Manifest:
    """The manifest a holder offered, refused (one line) before anything is written
    when it is not a manifest of plain relative paths (:meth:`Manifest.from_json`), or
    its sizes do not add up to the bytes the holder announced."""
    try:
        offered = Manifest.from_json(opened.manifest)
    except ManifestError as error:
        raise _HolderFailed(str(error)) from None
    announced = opened.nbytes
    if announced != offered.total_bytes:
        raise _HolderFailed(
            f"manifest: its files add up to {offered.total_bytes} bytes, the holder "
            f"announced {announced!r}."
        )
    return offered


@dataclass
class _Caller:
    """One holder's calls: its failures are :class:`_HolderFailed`; ``unless``: the
    watch of its session, which ends every call at once when the holder dies."""

    peers: Peers
    holder: str
    unless: Any = None

    def __call__(self, op: str, **kwargs: Any) -> dict[str, Any]:
        """One call's reply."""
        replies = self.peers.call_all([self.holder], op, unless=self.unless, **kwargs)
        return self.checked(replies.get(self.holder))

    def each(self, op: str, calls: list[dict[str, Any]]) -> list[Any]:
        """Several calls at once: their replies, unchecked (see :meth:`checked`)."""
        return self.peers.call_each(self.holder, op, calls, unless=self.unless)

    def checked(self, reply: Any) -> dict[str, Any]:
        """A reply, or :class:`_HolderFailed` for an exception or no answer."""
        if isinstance(reply, PeerGone):
            raise _HolderFailed(HOLDER_GONE, gone=True)
        if isinstance(reply, BaseException):
            why = f"{type(reply).__name__}: {reply}".strip(": ")
            raise _HolderFailed(why, gone=isinstance(reply, OSError))
        if not isinstance(reply, dict):
            raise _HolderFailed("no answer")
        return reply


def _make_room(staging: Path, manifest: Manifest) -> None:
    """Make room in the node's cache, then check the disk has it."""
    try:
        modelcache.make_room(staging.parent, manifest.total_bytes)
    except (OSError, UnsafePathError) as error:
        logger.info("making room for a template in %s: %s", staging.parent, error)
    free = shutil.disk_usage(staging).free
    if free < manifest.total_bytes:
        raise TemplateTransferError(
            f"its template needs {format_bytes(manifest.total_bytes)} and {staging.parent} has "
            f"{format_bytes(free)} free."
        )


def _create(staging: Path, relative: str) -> int:
    """A new file ``relative`` (a manifest's checked path) inside ``staging``, made
    directory by directory from a descriptor of it, never through a symlink: 0700
    directories, the file 0600 and created exclusively."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise TemplateTransferError(f"{relative!r} is not a path inside the template.")
    directory = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(staging, directory)
        try:
            for part in parts[:-1]:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                inner = os.open(part, directory, dir_fd=fd)
                os.close(fd)
                fd = inner
            new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(parts[-1], new, 0o600, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as error:
        where = staging / relative
        raise TemplateTransferError(f"{where} cannot be created ({error.strerror}).") from None
