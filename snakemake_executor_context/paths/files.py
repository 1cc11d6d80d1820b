"""Files a user names, or the plugin keeps: opened without following a symlink and
trusted only when ``fstat`` shows a regular file of this user's that others cannot
write; created exclusively and renamed into place.

See :mod:`snakemake_executor_context.paths` for the rule.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import UnsafePathError
from .root import _MOVE, _PLANTED, PRIVATE_FILE_MODE, private_path, sticky_note


def file_problem(info: os.stat_result) -> str | None:
    """What keeps a file from being trusted: not a regular file, another user's, or
    writable by others (None: it is this user's, and only theirs to change)."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    if info.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _open_problem(path: Path, error: OSError) -> str:
    """Why an open without following symlinks failed, for the message."""
    try:
        info = os.lstat(path)
    except OSError:
        return f"cannot be opened ({error.strerror or error})"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symlink (to {os.readlink(path)}, owned by uid {info.st_uid})"
    if info.st_uid != os.getuid():
        # Linux's protected_regular refuses even root an O_CREAT open of another
        # user's file in a sticky world-writable directory.
        return f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    return f"cannot be opened ({error.strerror or error})"


def _refusal(path: Path, problem: str, fix: str) -> UnsafePathError:
    return UnsafePathError(
        f"Refusing {path}: it {problem}.{sticky_note(path)} Nothing was read from it or "
        f"written to it. Fix: {fix}."
    )


def refuse_planted(path: Path, fix: str = _PLANTED) -> None:
    """Nothing, if ``path`` is missing or a regular file of this user's (its mode is
    tightened when it is next written); else :class:`UnsafePathError`: a symlink,
    another user's file, or not a file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        problem = f"is a symlink (to {os.readlink(path)}, owned by uid {info.st_uid})"
        raise _refusal(path, problem, fix)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise _refusal(path, file_problem(info) or "is not a regular file", fix)


def open_nofollow(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path`` opened without following a symlink at its last
    component (ELOOP: :class:`UnsafePathError`); its content is trusted only by a
    digest (:mod:`..modelcache.manifest`), never by where it lies."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _refusal(path, _open_problem(path, error), _PLANTED) from None
        raise


def open_directory(path: Path) -> int:
    """A descriptor of the directory ``path``, opened without following a symlink;
    what it holds is then checked through ``/proc/self/fd/N`` (the very directory,
    whatever is renamed meanwhile)."""
    return open_nofollow(path, os.O_DIRECTORY)


def open_trusted(path: Path, flags: int = os.O_RDONLY, fix: str = _PLANTED) -> int:
    """A descriptor of ``path``, opened without following a symlink, once ``fstat``
    shows a regular file of this user that others cannot write. Raises
    :class:`UnsafePathError` (nothing read or written), FileNotFoundError if missing."""
    return _checked(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, fix, own_loose=False)


def _checked(path: Path, flags: int, fix: str, *, own_loose: bool) -> int:
    """Open ``path`` with ``flags`` (never blocking on a planted FIFO), then keep the
    descriptor only if it is a regular file of this user's that others cannot write
    (``own_loose``: one of this user's that others can is made 0600)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, PRIVATE_FILE_MODE)
    except FileNotFoundError:
        raise
    except OSError as error:  # a symlink (ELOOP), a directory, another user's file
        raise _refusal(path, _open_problem(path, error), fix) from None
    info = os.fstat(fd)
    mine = stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()
    problem = None if own_loose and mine else file_problem(info)
    if problem or not mine:
        os.close(fd)
        raise _refusal(path, problem or "is not a regular file", fix)
    if own_loose and info.st_mode & 0o077:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # this user's own file, left open to others
    os.set_blocking(fd, True)
    return fd


def read_trusted(path: Path, fix: str = _PLANTED) -> bytes | None:
    """The content of a trusted file (:func:`open_trusted`), or None if it is missing."""
    try:
        fd = open_trusted(path, fix=fix)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def open_append(path: Path, fix: str = _PLANTED) -> int:
    """A descriptor appending to ``path``: created 0600 if missing, else only a file
    of this user (made 0600); another user's, or a symlink, is refused before
    anything is written (:class:`UnsafePathError`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return _checked(path, flags, fix, own_loose=True)


def create_exclusive(path: Path, data: bytes = b"") -> bool:
    """Create ``path`` 0600 holding ``data`` if nothing (not even a dangling symlink)
    is there; False if something is."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except BaseException:
        # A file that could not be filled (a full disk) must not stay: an empty lease
        # token, for one, would pass for a writer's being written this instant.
        path.unlink(missing_ok=True)
        raise
    return True


def new_private_file(directory: Path, prefix: str) -> Path:
    """A new empty file 0600 in ``directory`` under a name nobody held (``mkstemp``:
    exclusive, never through a symlink), to fill and then :func:`replace_private`."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    return Path(name)


def new_private_dir(directory: Path, prefix: str) -> Path:
    """A new directory 0700 in ``directory`` under a name nobody held (``mkdtemp``),
    to fill and then rename into place."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=directory))


def replace_private(temporary: Path, path: Path, fix: str = _PLANTED) -> None:
    """Rename ``temporary`` (made by this process) over ``path``, unless ``path`` is
    something this user must not replace (a symlink, another user's file): then
    :class:`UnsafePathError`, and ``temporary`` is removed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    problem = None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            problem = f"is a symlink (to {os.readlink(path)}, owned by uid {info.st_uid})"
        elif not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            problem = file_problem(info)
    if problem:
        temporary.unlink(missing_ok=True)
        raise _refusal(path, problem, fix)
    try:
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise _refusal(path, _open_problem(path, error), fix) from None


def write_private(path: Path, data: str | bytes, fix: str = _PLANTED) -> None:
    """Write ``path`` 0600 atomically: a new file created exclusively beside it, then
    renamed over it; refused (nothing written) when ``path`` is another user's file
    or a symlink."""
    raw = data.encode() if isinstance(data, str) else data
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(
        temporary,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        PRIVATE_FILE_MODE,
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    replace_private(temporary, path, fix)


def remove_own(path: Path) -> bool:
    """Remove ``path`` if it is this user's (a file or a symlink, never followed);
    another user's is left where it is. Whether something was removed."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # below a file: not there either
        return False
    if info.st_uid != os.getuid() or stat.S_ISDIR(info.st_mode):
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


#: The lock descriptors this process holds open (fd -> the path it points at): the
#: plugin's own, which a job's check of the files it left open leaves out.
_held_locks: dict[int, str] = {}


def lock_descriptor(name: str) -> int:
    """A descriptor of the lock file ``name`` in the private root (created 0600 when
    missing), for the caller to ``flock`` as it needs: shared while it uses what the
    lock names, exclusive to remove it. Close it with :func:`close_lock`."""
    path = private_path("locks") / name
    fd = open_append(path, _MOVE)
    _held_locks[fd] = os.path.realpath(path)  # as /proc/self/fd shows it
    return fd


def close_lock(fd: int) -> None:
    """Close a descriptor :func:`lock_descriptor` gave (its ``flock`` goes with it)."""
    _held_locks.pop(fd, None)
    os.close(fd)


def held_locks() -> dict[int, str]:
    """The lock descriptors this process holds open now, and the files they point at."""
    return dict(_held_locks)


def lock_path(name: str) -> Path:
    """Where the lock file ``name`` lies (unchecked, perhaps missing: for its time of
    last use, never to open)."""
    return private_path("locks") / name


@contextlib.contextmanager
def private_lock(name: str) -> Iterator[int]:
    """An exclusive lock (``flock``) named ``name``, held by this user's processes on
    this node only: its file lies in the private root."""
    import fcntl

    fd = lock_descriptor(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        close_lock(fd)
