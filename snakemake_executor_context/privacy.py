"""Directories only their owner may use, for files that must not be read or redirected
by another user of the node (credentials, process records, live catalogs).

One check for every such directory: created 0700, or, when it exists, a real
directory (not a symlink) owned by this user and closed to others. Another local user
who plants the path first (a symlink to a place of their choosing, a directory of
their own) is refused with the fix, never followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "private_dir", "private_dir_problem"]

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir_problem(path: Path, *, tighten: bool) -> str | None:
    """Create ``path`` 0700 (missing parents follow the umask) and say what, if
    anything, makes it unfit: "is a symlink ...", "belongs to uid ...", "has mode
    ...". With ``tighten``, a directory of this user open to others is made 0700."""
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
    if stat.S_ISLNK(info.st_mode):
        return f"is a symlink (to {os.readlink(path)})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    if info.st_mode & 0o077:
        if not tighten:
            return f"has mode {stat.S_IMODE(info.st_mode):04o}, open to other users"
        os.chmod(path, PRIVATE_DIR_MODE)
    return None


def private_dir(path: Path, error: type[Exception], fix: str, *, tighten: bool = True) -> Path:
    """``path``, checked by :func:`private_dir_problem`; else ``error`` naming the
    directory, the problem and ``fix``."""
    problem = private_dir_problem(path, tighten=tighten)
    if problem:
        raise error(f"Refusing the directory {path}: it {problem}. Fix: {fix}")
    return path
