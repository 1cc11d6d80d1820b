"""A loader's cache of converted weights, kept so that nothing another user planted
is loaded: for loaders (a context's "partial context", such as a GGUF file
dequantised once into safetensors) and their cache probes.

The cache is a directory of entries, ``$SNAKEMAKE_CONTEXT_MODEL_CACHE`` (default
``~/.cache/snakemake-context/models``; a pilot's ``--pilot-model-cache``), which may be
shared with others (a lab's directory, node-local scratch). An entry is used only
when

- it is a real directory (not a symlink) of this user's that others cannot write, as
  are all its files; or else
- its files match, size and sha256, the :class:`~.manifest.Manifest` this user recorded
  when they were written (:func:`convert_once`), which is kept in the private root
  (:mod:`..paths`), not in the cache: digests stored beside the files could be
  replaced along with them.

An entry of this user's with a recorded manifest is checked against it too
(:mod:`.cachecheck`): its sizes always, the digests of the files changed since it was
last verified before a load (:func:`convert_once`, :func:`open_entry`,
:func:`check_before_load`). One that differs is damaged: it is moved aside and made
again (from a peer or the source), never loaded. A cache probe (:func:`is_cached`)
checks ownership and sizes only (it runs on every server at start); a load
(:func:`open_entry`) checks the digests and loads through a descriptor of the
directory it checked, so the entry cannot be swapped in between, and once it is
loaded checks that nothing changed meanwhile.
A conversion (:func:`convert_once`) runs once per node and user (a lock in the private
root), writes into a new private directory, records its manifest, then renames it
into place, once it has made room for it under the cache's size limit
(:mod:`.cacheroom`: the least recently used entries no process of the node uses go,
with their recorded manifests; a load holds its entry, :func:`hold_entry`). A planted
entry is refused in one line naming the setting that moves the cache. Standard
library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import paths
from ..defaults import MODEL_CACHE_VARIABLE
from ..errors import ManifestError, UnsafePathError
from . import cachecheck, cacheroom
from .cachecheck import DIFFERS, Damage, conversion_lock, manifest_path, own_damage, set_aside
from .cacheroom import hold_entry
from .manifest import Manifest, digest_file

__all__ = [
    "DEFAULT_MODEL_CACHE",
    "MODEL_CACHE_VARIABLE",
    "Damage",
    "cache_root",
    "check_before_load",
    "convert_once",
    "entry_problem",
    "file_sha256",
    "hold_entry",
    "is_cached",
    "make_room",
    "manifest_path",
    "open_entry",
    "recorded_manifest",
]

#: The cache without that variable.
DEFAULT_MODEL_CACHE = "~/.cache/snakemake-context/models"

_MISSING = "is missing"
_FIX = (
    f"remove it (another user may have planted it), or set {MODEL_CACHE_VARIABLE} to a "
    "directory of your own"
)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$SNAKEMAKE_CONTEXT_MODEL_CACHE``,
    else ``~/.cache/snakemake-context/models``."""
    from ..settings.table import environment_value

    chosen = cache_dir or environment_value(MODEL_CACHE_VARIABLE) or DEFAULT_MODEL_CACHE
    return Path(chosen).expanduser().absolute()


def make_room(root: Path, incoming: int, *, keep: Path | None = None) -> list[Path]:
    """Remove entries of the cache ``root`` no process of this node uses, least
    recently used first, until ``incoming`` more bytes fit its size limit (see
    :mod:`.cacheroom`); the entries removed, each with what was recorded of it."""
    return cacheroom.make_room(root, incoming, keep=keep, recorded=cachecheck.recorded_files)


def file_sha256(path: Path) -> str:
    """The sha256 of a source file (a GGUF, say), remembered by path, size and
    modification time in the private root (never beside the file: another user could
    plant the memo there)."""
    info = os.stat(path)
    key = hashlib.sha256(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()
    memo = paths.private_path("digests") / key
    with contextlib.suppress(OSError, UnsafePathError):
        remembered = (paths.read_trusted(memo) or b"").decode().strip()
        if len(remembered) == 64:
            return remembered
    _, digest = digest_file(path)
    with contextlib.suppress(OSError, UnsafePathError):
        paths.write_private(memo, digest)
    return digest


def _sealed(directory: Path) -> bool:
    """Whether ``directory`` is this user's and nobody else may even enter it: then
    what lies under it is out of others' reach, whatever its own modes."""
    info = os.stat(directory)
    return info.st_uid == os.getuid() and not info.st_mode & 0o011


def _owned_and_closed(directory: Path, *, modes: bool) -> bool:
    """Whether ``directory`` and everything under it are this user's, real files and
    directories (no symlink anywhere) that others cannot write (``modes``: checked
    on each; without, the caller knows nobody else can reach them)."""
    uid = os.getuid()
    for top, dirs, files in os.walk(directory, followlinks=False):
        # The top itself: stat, since it may be a descriptor's /proc/self/fd/N.
        infos = [os.stat(top) if top == str(directory) else os.lstat(top)]
        infos += [os.lstat(os.path.join(top, name)) for name in dirs + files]
        for info in infos:
            kind = stat.S_IFMT(info.st_mode)
            if kind not in (stat.S_IFDIR, stat.S_IFREG) or info.st_uid != uid:
                return False
            if modes and info.st_mode & 0o022:
                return False
    return True


def _tighten(directory: Path) -> None:
    """Take group and others' write permission from this user's own files and
    directories under ``directory`` (before they are checked: then nobody else can
    change them after the check)."""
    uid = os.getuid()
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in (top, *(os.path.join(top, n) for n in dirs + files)):
            info = os.lstat(name)
            if info.st_uid == uid and not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
                os.chmod(name, stat.S_IMODE(info.st_mode) & ~0o022)  # not a symlink: lstat


def entry_problem(
    entry: Path,
    *,
    digests: bool = True,
    checked: Path | None = None,
    by_digests: bool = False,
) -> str | None:
    """Why ``entry`` may not be used ("is missing", "is a symlink ...", "belongs to
    uid ... and you recorded no digests of it", a file that differs from the
    recorded manifest: a :class:`Damage` when the entry is this user's), or None.
    ``checked``: the path to read it through (a descriptor's ``/proc/self/fd/N``);
    ``digests``: compare sha256, not only sizes (of an entry of this user's that
    nobody else could write, only the files changed since it was last verified);
    ``by_digests``: trust it by the recorded manifest only (it was open to others)."""
    try:
        info = os.lstat(entry)
    except FileNotFoundError:
        return _MISSING
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if problem := paths.not_a_directory(entry, info):
        return problem
    where = checked or entry
    try:
        # In a cache directory (or an entry) of this user's that nobody else may
        # enter, such as a pilot's node-local one made 0700 and filled by `rsync -a`
        # from a group-writable source, the files' own modes do not matter.
        sealed = _sealed(entry.parent) or _sealed(where)
        if not by_digests and _owned_and_closed(where, modes=not sealed):
            return own_damage(entry, where, digests=digests)
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    whose = (
        f"belongs to uid {info.st_uid}"
        if info.st_uid != os.getuid()
        else "holds files others may write or that are not yours"
    )
    try:
        manifest = Manifest.read(manifest_path(entry))
    except (ManifestError, UnsafePathError) as error:
        return f"{whose}, and its recorded digests cannot be read ({error})"
    if manifest is None:
        return f"{whose}, and you recorded no digests of it"
    if info.st_uid == os.getuid():  # closed first (:func:`_opened`): checked as its own
        problem = cachecheck.check(entry, where, manifest, digests=digests)
        return None if problem is None else Damage(f"{whose}, and {DIFFERS} ({problem})")
    try:
        manifest.verify(where, digests=digests)
    except ManifestError as error:
        return f"{whose}, and does not match the digests you recorded ({error})"
    return None


def check_before_load(entry: Path) -> str | None:
    """Check an entry of this user's as a load would (sizes; the digests of what
    changed since its last verification), and move it aside when it is damaged: what
    was wrong, or None (also when it is missing or not this user's: a load refuses
    those)."""
    try:
        fd = paths.open_directory(entry)
    except (OSError, UnsafePathError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        through = Path(f"/proc/self/fd/{fd}")
        problem = entry_problem(entry, checked=through if through.is_dir() else entry)
        if isinstance(problem, Damage):
            set_aside(entry, problem, (info.st_dev, info.st_ino), locked=False)
            return problem
        return None
    finally:
        os.close(fd)


def _refusal(entry: Path, problem: str) -> UnsafePathError:
    return UnsafePathError(
        f"Refusing the cached model {entry}: it {problem}. Nothing was loaded from it. Fix: {_FIX}."
    )


def is_cached(entry: Path) -> bool:
    """Cache probe: is ``entry`` there and usable (sizes checked, not digests)?"""
    try:
        return entry_problem(entry, digests=False) is None
    except (OSError, UnsafePathError):
        return False


@contextlib.contextmanager
def open_entry(entry: Path) -> Iterator[str]:
    """The path to load ``entry`` from, once it is checked (digests included): a
    descriptor's ``/proc/self/fd/N`` on Linux (so what was checked is what is read),
    valid inside the ``with`` block, which holds the entry (:func:`hold_entry`).
    Raises :class:`UnsafePathError` (one line): before the block, for an entry that
    may not be used (a damaged one of this user's is moved aside); after it, for an
    entry of this user's whose files changed while the block read them."""
    with cacheroom.entry_in_use(entry), _opened(entry) as path:
        yield path


@contextlib.contextmanager
def _opened(entry: Path) -> Iterator[str]:
    loose = False
    with contextlib.suppress(OSError):
        info = os.lstat(entry)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            # An entry of this user's that others could write: closed first, then
            # trusted only by the digests recorded when it was written (what others
            # may have changed before is caught; nothing can change after).
            sealed = _sealed(entry.parent) or _sealed(entry)
            loose = not sealed and not _owned_and_closed(entry, modes=True)
            if loose:
                _tighten(entry)
    try:
        fd = paths.open_directory(entry)
    except (OSError, UnsafePathError):
        raise _refusal(entry, entry_problem(entry) or "cannot be opened") from None
    try:
        info = os.fstat(fd)
        found = (info.st_dev, info.st_ino)
        through = Path(f"/proc/self/fd/{fd}")
        checked = through if through.is_dir() else entry
        problem = entry_problem(entry, checked=checked, by_digests=loose)
        if isinstance(problem, Damage):
            set_aside(entry, problem, found, locked=False)
        if problem:
            raise _refusal(entry, problem)
        yield str(checked)
        # What the block read is what was checked, unless a file changed meanwhile.
        late = own_damage(entry, checked, digests=True) if info.st_uid == os.getuid() else None
        if late:
            set_aside(entry, late, found, locked=False)
            raise _refusal(entry, f"changed while it was loaded: it {late}")
    finally:
        os.close(fd)


def recorded_manifest(entry: Path) -> Manifest:
    """The manifest of a usable ``entry`` (:func:`entry_problem` finds none): the one
    recorded when it was written, else (an entry of this user's written by other means)
    built from its files now and recorded. :class:`UnsafePathError` otherwise."""
    problem = entry_problem(entry, digests=False)
    if problem:
        raise _refusal(entry, problem)
    try:
        manifest = Manifest.read(manifest_path(entry))
    except ManifestError as error:
        raise _refusal(entry, f"has unreadable recorded digests ({error})") from None
    if manifest is None:
        manifest = Manifest.build(entry)
        manifest.write(manifest_path(entry))
    return manifest


def convert_once(
    entry: Path,
    write: Callable[[Path], None],
    *,
    manifest: Callable[[Path], Manifest] = Manifest.build,
) -> bool:
    """Make ``entry`` by calling ``write(directory)`` into a new private directory
    beside it, unless a usable entry is already there; True if this call wrote it.
    One conversion at a time per entry on a node (a lock in the private root). The
    new files' manifest (``manifest(directory)``: read from the files, or the one a
    transfer checked them against) is recorded in the private root before the rename;
    an entry someone else planted is refused (:class:`UnsafePathError`), never
    overwritten. Before the rename it makes room in the cache (:func:`make_room`)."""
    root = entry.parent
    try:
        root_info = os.lstat(root)
    except FileNotFoundError:
        paths.private_dir(root, _FIX)
    else:
        if stat.S_ISLNK(root_info.st_mode) and root_info.st_uid not in (os.getuid(), 0):
            raise UnsafePathError(
                f"Refusing the model cache {root}: it is a symlink of uid "
                f"{root_info.st_uid} (to {os.readlink(root)}). Fix: {_FIX}."
            )
    with paths.private_lock(conversion_lock(entry)):
        # An entry of this user's: checked as a load would check it (foreign ones:
        # sizes here, digests as the load opens them).
        own = _owned(entry)
        problem = entry_problem(entry, digests=own)
        if isinstance(problem, Damage):
            set_aside(entry, problem, None, locked=True)
            problem = _MISSING
        if problem is None:
            return False  # converted by another server while this one waited
        if problem != _MISSING:
            raise _refusal(entry, problem)
        staging = paths.new_private_dir(root, f".{entry.name}.")
        try:
            write(staging)
            seen = cachecheck.file_stats(staging)  # before the digests are taken
            written = manifest(staging)
            with contextlib.suppress(OSError, UnsafePathError):
                make_room(root, written.total_bytes, keep=entry)
            written.write(manifest_path(entry))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            os.rename(staging, entry)
        except OSError as error:  # something appeared there meanwhile
            shutil.rmtree(staging, ignore_errors=True)
            raise _refusal(entry, entry_problem(entry) or str(error)) from None
        with contextlib.suppress(OSError, ManifestError):
            if cachecheck.file_stats(entry) == seen:
                cachecheck.record(entry, seen)  # verified as written: no second read
    return True


def _owned(entry: Path) -> bool:
    try:
        return os.lstat(entry).st_uid == os.getuid()
    except OSError:
        return False
