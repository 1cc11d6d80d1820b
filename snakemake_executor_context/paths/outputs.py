"""Output files: what a command writes where the user asked (``report -o``, ``--csv``,
``--json``), and what the plugin writes under names it chose in directories it made
(a run's report and summary in ``.snakemake/context/``).

Each is written whole, never in place: a private temporary file is created
exclusively in the target's directory (``mkstemp``: ``O_EXCL``, never through a
symlink), filled, given the mode a new file gets from the umask (or the mode of the
file of yours it replaces), and renamed over the target. What was at the target is
checked first and refused in one line, nothing written: a directory, a file that is
not yours (or not a regular file), a symlink that is not yours. A symlink of yours is
followed once, to where it points, and what is there is checked the same way. The
directory of a path the user named must exist (nothing is created for it); a
directory the plugin names is created, and must then be a real directory of yours.

See :mod:`snakemake_executor_context.paths` for the rule.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ..errors import ContextExecutorError, UnsafePathError
from .root import not_a_directory

__all__ = ["current_umask", "output_directory", "output_problem", "write_output"]


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it: a race
    with any thread that creates a file meanwhile)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _target(path: Path) -> tuple[Path, os.stat_result | None, str | None]:
    """Where ``path`` writes (a symlink of yours followed once), what is there now,
    and what, if anything, refuses it."""
    try:
        info: os.stat_result | None = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # the directory is checked later
        info = None
    except OSError as error:
        return path, None, f"cannot be checked ({error.strerror or error})"
    if info is not None and stat.S_ISLNK(info.st_mode):
        if info.st_uid != os.getuid():
            return path, info, f"is a symlink (to {os.readlink(path)}) of uid {info.st_uid}"
        path = Path(os.path.realpath(path))
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        except OSError as error:
            return path, None, f"cannot be checked ({error.strerror or error})"
    if info is None:
        return path, None, None
    if stat.S_ISDIR(info.st_mode):
        return path, info, "is a directory"
    if not stat.S_ISREG(info.st_mode):
        return path, info, "is not a regular file"
    if info.st_uid != os.getuid():
        return path, info, f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    return path, info, None


def output_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written as an output file (a sentence about it, with its
    fix), or None. It checks what :func:`write_output` checks before it writes (making
    and removing an empty private file to learn that the directory takes new ones), so
    that a command checks all its outputs before it does its work."""
    return _problem(path, *_target(path), probe=True)


def _problem(
    path: Path, target: Path, info: os.stat_result | None, problem: str | None, *, probe: bool
) -> str | None:
    """:func:`output_problem` of what :func:`_target` found; ``probe``: also make and
    remove an empty file in the directory (a writer skips it: its own file is the probe)."""
    if problem == "is a directory":
        return f"it is a directory. Fix: name a file (e.g. {path / 'NAME'})"
    if problem:
        return (
            f"it {problem}, and is not replaced. Fix: remove it if it is yours to remove "
            "(another user may have planted it), or name another file"
        )
    directory = target.parent
    try:
        parent = os.stat(directory)
    except FileNotFoundError:
        return (
            f"the directory {directory} does not exist (nothing is created for a path you "
            "name). Fix: create it, or name a file in a directory that exists"
        )
    except OSError as error:
        return f"the directory {directory} cannot be used ({error.strerror or error})"
    if not stat.S_ISDIR(parent.st_mode):
        return f"{directory} is not a directory. Fix: name a file in a directory"
    if not probe:
        return None
    try:  # whether a new file can be made there (root may lack it too: a read-only mount)
        fd, empty = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as error:
        return (
            f"no new file can be made in the directory {directory} ({error.strerror or error}). "
            "Fix: name a file in a directory you can write"
        )
    os.close(fd)
    os.unlink(empty)
    return None


def write_output(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` as described in the module: refused in one line
    (:class:`..errors.ContextExecutorError`; :class:`..errors.UnsafePathError` for
    another user's file or symlink), nothing written, when :func:`output_problem` finds
    a problem or the directory refuses the new file. Returns the path written (a
    symlink's target)."""
    target, info, planted = _target(path)
    problem = _problem(path, target, info, planted, probe=False)
    if problem:
        kind = UnsafePathError if planted and planted != "is a directory" else ContextExecutorError
        raise kind(f"Cannot write {path}: {problem}.")
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as error:
        raise ContextExecutorError(
            f"Cannot write {path}: no new file can be made in the directory {target.parent} "
            f"({error.strerror or error}). Fix: name a file in a directory you can write."
        ) from None
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            mode = stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~current_umask()
            os.fchmod(handle.fileno(), mode)
        # Checked again just before the rename, which never follows a symlink: what
        # appeared at the target meanwhile is refused, not replaced.
        _, _, planted = _target(target)
        if planted:
            raise UnsafePathError(f"Cannot write {target}: it {planted}; it is not replaced.")
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def output_directory(path: Path) -> Path:
    """A directory the plugin names for its own output files (a run's reports): made
    when missing (its parents too, by the umask), then checked to be a real directory
    of this user's, never a symlink (:class:`..errors.UnsafePathError`)."""
    with contextlib.suppress(OSError):  # what is there instead is checked below
        path.mkdir(parents=True)
    try:
        info = os.lstat(path)
    except OSError as error:
        raise ContextExecutorError(
            f"Cannot make the directory {path} ({error.strerror or error})."
        ) from None
    problem = not_a_directory(path, info)
    if problem is None and info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    if problem:
        raise UnsafePathError(
            f"Refusing the directory {path}: it {problem}. Nothing was written in it. "
            "Fix: remove it (another user may have planted it), or name the file (-o FILE)."
        )
    return path
