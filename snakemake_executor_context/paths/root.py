"""The private root: where it is, what makes it fit, and the directories in it.

See :mod:`snakemake_executor_context.paths` for the rule.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from pathlib import Path

from ..defaults import LOCAL_DIR_VARIABLE
from ..errors import UnsafePathError

#: The executor's setting that sets :data:`LOCAL_DIR_VARIABLE`.
LOCAL_DIR_SETTING = "--context-local-dir"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
#: Dask's scratch space inside the root; a name with ``dask-scratch-space`` in it,
#: which Dask then uses as it is (it appends that name to any other directory).
SCRATCH_NAME = "dask-scratch-space"

_MOVE = (
    f"set {LOCAL_DIR_VARIABLE} (or {LOCAL_DIR_SETTING}) to a directory of your own, "
    "e.g. ~/.cache/snakemake-context/local"
)
_PLANTED = "remove it (another user may have planted it)"


def _system_tmp() -> Path:
    """The temporary directory from the environment, as :mod:`tempfile` would pick
    it, but never ``tempfile.tempdir`` (the cluster process points that into the
    root, and a job running in a server points it at the job's own)."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return Path(value)
    return Path("/tmp")


def local_base() -> Path:
    """Where the private root is made: ``$SNAKEMAKE_CONTEXT_LOCAL_DIR``, else
    ``$XDG_RUNTIME_DIR`` (private to the user), else the temporary directory."""
    base = os.environ.get(LOCAL_DIR_VARIABLE) or ""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not base and runtime and os.path.isdir(runtime):
        base = runtime
    return Path(base).expanduser().absolute() if base else _system_tmp()


def root_path(base: Path | None = None) -> Path:
    """Where the private root is (in ``base``, default :func:`local_base`),
    unchecked: for naming what lies in it; every open checks it again."""
    return (base or local_base()) / f"snakemake-context-{os.getuid()}"


def private_root(base: Path | None = None) -> Path:
    """The private root (in ``base``, default :func:`local_base`; created 0700 when
    missing), checked: raises :class:`UnsafePathError`, one line naming the setting
    that moves it, when it is a symlink, another user's, open to others, or in a
    directory others may change."""
    base = base or local_base()
    root = root_path(base)
    # The base named, at most: never the directories above it (a mistyped
    # /nonexistent/dir made /nonexistent); a base that cannot be made is reported
    # below, as the root's problem.
    with contextlib.suppress(OSError):
        base.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
    problem = _ancestry_problem(base) or dir_problem(root, tighten=False)
    if problem:
        raise UnsafePathError(
            f"Refusing the private directory {root}: it {problem}.{sticky_note(root)} "
            f"Fix: {_MOVE}, or remove it."
        )
    return root


def private_path(*parts: str, base: Path | None = None) -> Path:
    """A directory inside the private root (in ``base``, default
    :func:`local_base`), each level created 0700 and checked."""
    path = private_root(base)
    for part in parts:
        path = private_dir(path / part, _MOVE)
    return path


def scratch_dir() -> Path:
    """Dask's local directory (``local_directory``) for every process the plugin
    starts on this node: inside the private root, so that what Dask finds there (and
    puts first on ``sys.path``) is this user's alone."""
    return private_path(SCRATCH_NAME)


def private_temporary_directory() -> Path:
    """Where a cluster process keeps its temporary files (``tempfile.tempdir``):
    dask-jobqueue writes each job script to a name it reserved and released first."""
    return private_path("tmp")


def _ancestry_problem(base: Path) -> str | None:
    """Why another user could move the root out from under its checks: some
    directory above it that they own, or may write to without a sticky bit."""
    try:
        real = Path(os.path.realpath(base))
        for directory in (real, *real.parents):
            info = os.stat(directory)
            where = f"lies in {directory}, which"
            if info.st_uid not in (os.getuid(), 0):
                return f"{where} belongs to uid {info.st_uid}"
            sticky = bool(info.st_mode & stat.S_ISVTX)
            if sticky:
                continue
            if info.st_mode & 0o002 or (info.st_mode & 0o020 and not _own_group(info.st_gid)):
                mode = stat.S_IMODE(info.st_mode)
                return f"{where} other users may change (mode {mode:04o}, no sticky bit)"
    except OSError as error:
        return f"cannot be checked ({error})"
    return None


def _own_group(gid: int) -> bool:
    """Whether group ``gid`` holds this user alone (a user-private group)."""
    try:
        group = grp.getgrgid(gid)
        name = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return False
    return set(group.gr_mem) <= {name} and gid == os.getgid()


def sticky_note(path: Path) -> str:
    """For a path another user owns in a sticky directory: only they (or root) can
    remove it, so the fix is to move, not to delete."""
    try:
        info, parent = os.lstat(path), os.stat(path.parent)
    except OSError:
        return ""
    if info.st_uid != os.getuid() and parent.st_mode & stat.S_ISVTX and os.getuid() != 0:
        return f" In the sticky directory {path.parent} only its owner or root can remove it."
    return ""


# -- directories ------------------------------------------------------------------------


def not_a_directory(path: Path, info: os.stat_result) -> str | None:
    """Why ``path``, of ``lstat`` result ``info``, is not a real directory (a symlink,
    saying where it points and whose it is; a file), or None."""
    if stat.S_ISLNK(info.st_mode):
        return f"is a symlink (to {os.readlink(path)}, owned by uid {info.st_uid})"
    if not stat.S_ISDIR(info.st_mode):
        return f"is not a directory (a file of uid {info.st_uid})"
    return None


def dir_problem(path: Path, *, tighten: bool, create: bool = True) -> str | None:
    """Create ``path`` 0700 (``create``; missing parents follow the umask) and say
    what, if anything, makes it unfit as a private directory: "is a symlink ...",
    "belongs to uid ...", "has mode ...". With ``tighten``, a directory of this user
    open to others is made 0700."""
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass  # checked below like any other
        except OSError as error:
            return f"cannot be created ({error})"
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"cannot be read ({error})"
    if problem := not_a_directory(path, info):
        return problem
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    if info.st_mode & 0o077:
        if not tighten:
            return f"has mode {stat.S_IMODE(info.st_mode):04o}, open to other users"
        os.chmod(path, PRIVATE_DIR_MODE)  # a directory, as lstat just showed
    return None


def named_dir_problem(path: Path, *, make: bool) -> str | None:
    """What makes ``path``, a directory the user names (a model cache, the per-server
    caches), unfit, or None. One that exists is used as it is, never chmod-ed (a lab's
    group-shared 2775 cache stays so; what is loaded from it is checked entry by entry):
    refused only when it is not a directory, another user's symlink, or one every
    user may change (writable by all, no sticky bit). A missing one is made 0700
    (``make``; missing parents follow the umask); without ``make`` the levels it lacks
    are made and removed again, so that what cannot be made is found while nothing
    stays on disk (``snakemake -n``)."""
    missing = []
    for level in (path, *path.parents):
        if os.path.lexists(level):
            break
        missing.append(level)
    try:
        for level in reversed(missing):
            level.mkdir(mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        pass  # made meanwhile: checked below like any other
    except OSError as error:
        return f"cannot be created ({error})"
    finally:
        if not make:
            for level in missing:
                with contextlib.suppress(OSError):
                    level.rmdir()
    if missing and not make:
        return None
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (os.getuid(), 0):
                return f"is a symlink of uid {info.st_uid} (to {os.readlink(path)})"
            info = os.stat(path)
    except OSError as error:
        return f"cannot be read ({error})"
    if not stat.S_ISDIR(info.st_mode):
        return f"is not a directory (a file of uid {info.st_uid})"
    if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        return f"has mode {mode:04o}: every user may change what it holds (no sticky bit)"
    return None


def shared_note(path: Path) -> str | None:
    """Who else can change what the existing directory ``path`` (a named cache, used
    as it is) holds, or None when nobody but this user (and root) can."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    who = []
    if info.st_uid not in (os.getuid(), 0):
        who.append(f"its owner uid {info.st_uid}")
    if mode & 0o020:
        try:
            group = grp.getgrgid(info.st_gid).gr_name
        except KeyError:
            group = str(info.st_gid)
        who.append(f"the members of group {group}")
    if mode & 0o002:
        who.append("every user (sticky: each may add, and remove only their own)")
    if not who:
        return None
    return (
        f"{path} (mode {mode:04o}) is shared: {' and '.join(who)} may add, replace and "
        "remove what it holds, so the models this user's servers load are checked entry "
        "by entry"
    )


def private_dir(path: Path, fix: str = _PLANTED, *, tighten: bool = True) -> Path:
    """``path``, checked by :func:`dir_problem`; else :class:`UnsafePathError`
    naming the directory, the problem and ``fix``."""
    problem = dir_problem(path, tighten=tighten)
    if problem:
        raise UnsafePathError(
            f"Refusing the directory {path}: it {problem}.{sticky_note(path)} Fix: {fix}."
        )
    return path
