"""A manifest: what a directory of files holds, by relative path, size and sha256.

One format for every place the plugin must know that files are the ones it wrote or
was sent: a model cache's converted weights (recorded when written, kept in the
private root, :mod:`..modelcache`), and a context template's files when a server
fetches them from another (peer-to-peer transfer).

The format, JSON in UTF-8::

    {"format": "snakemake-context-manifest", "version": 1,
     "files": [{"path": "config.json", "size": 712, "sha256": "3f0a..."},
               {"path": "sub/model.safetensors", "size": 538090408, "sha256": "9c1e..."}]}

- ``path``: relative, ``/``-separated, no ``.`` or ``..`` parts, no leading ``/``,
  no control character, each part at most 255 bytes; files only (directories are
  implied by the paths, so no path is also another's directory); sorted, each once.
  An entry has these three fields and no other (a ``symlink`` or ``target`` field, say,
  is refused: a manifest lists regular files only).
- ``size``: bytes; ``sha256``: 64 lowercase hex digits of the content.
- A directory matches a manifest when it holds exactly these regular files, with
  these sizes and digests, and nothing else but directories: a symlink, a device,
  a missing or an extra file does not match.

API: :meth:`Manifest.build` (from a directory), :meth:`Manifest.to_json` /
:meth:`Manifest.from_json`, :meth:`Manifest.write` / :meth:`Manifest.read` (a file of
this user's, see :mod:`..paths`), :meth:`Manifest.verify` (a directory against it),
:func:`walk_files` (the files under a directory, no symlink followed).
Every failure is one :class:`~..errors.ManifestError` line naming the file and what
differs. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import ManifestError, UnsafePathError

__all__ = ["FORMAT", "VERSION", "Manifest", "ManifestEntry", "digest_file", "walk_files"]

#: The ``format`` field of every manifest.
FORMAT = "snakemake-context-manifest"
#: The version of the format this module writes and reads.
VERSION = 1

_HEX = re.compile(r"^[0-9a-f]{64}$")
_BLOCK = 1 << 20
#: Characters no manifest path holds: control characters (a path is shown in one line).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: The longest file name part most filesystems take (NAME_MAX), in bytes.
_NAME_MAX = 255
_FIELDS = {"path", "size", "sha256"}


@dataclass(frozen=True, order=True)
class ManifestEntry:
    """One file of a manifest."""

    path: str
    size: int
    sha256: str


def digest_file(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of the regular file ``path``, read through one descriptor
    opened without following a symlink (:class:`ManifestError` otherwise)."""
    try:
        fd = paths.open_nofollow(path)
    except (OSError, UnsafePathError) as error:
        raise ManifestError(f"{path}: cannot be read ({_reason(error)}).") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ManifestError(f"{path}: is not a regular file.")
        digest, size = hashlib.sha256(), 0
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _reason(error: BaseException) -> str:
    return (
        str(error)
        if isinstance(error, UnsafePathError)
        else (getattr(error, "strerror", None) or type(error).__name__)
    )


def walk_files(directory: Path) -> Iterator[str]:
    """The relative paths of the files under ``directory``, without following a
    symlink; anything but a regular file or a directory is a :class:`ManifestError`."""
    todo = [""]
    while todo:
        relative = todo.pop()
        try:
            entries = list(os.scandir(directory / relative if relative else directory))
        except OSError as error:
            raise ManifestError(f"{directory}: cannot be listed ({_reason(error)}).") from None
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink():
                raise ManifestError(f"{directory}: {name} is a symlink.")
            if entry.is_dir(follow_symlinks=False):
                todo.append(name)
            elif entry.is_file(follow_symlinks=False):
                yield name
            else:
                raise ManifestError(f"{directory}: {name} is not a regular file.")


def _check_path(path: object) -> str:
    if not isinstance(path, str):
        raise ManifestError(f"manifest: the path {path!r} is not a string.")
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"manifest: {path!r} is not a relative path inside the directory.")
    if _CONTROL.search(path) or any(len(p.encode(errors="replace")) > _NAME_MAX for p in parts):
        raise ManifestError(f"manifest: {path!r} holds a control character or too long a name.")
    return path


def _check_tree(entries: list[ManifestEntry]) -> None:
    """Each path once, and none also the directory of another (``a`` and ``a/b``)."""
    listed = {e.path for e in entries}
    if len(listed) != len(entries):
        raise ManifestError("manifest: a path is listed twice.")
    for entry in entries:
        parts = entry.path.split("/")
        for end in range(1, len(parts)):
            if (directory := "/".join(parts[:end])) in listed:
                raise ManifestError(
                    f"manifest: {directory!r} is listed as a file and as the directory of "
                    f"{entry.path!r}."
                )


@dataclass(frozen=True)
class Manifest:
    """The files of a directory: sorted entries, each path once."""

    files: tuple[ManifestEntry, ...]

    @property
    def total_bytes(self) -> int:
        """The size of all the files together."""
        return sum(entry.size for entry in self.files)

    @classmethod
    def build(cls, directory: Path) -> Manifest:
        """The manifest of what ``directory`` holds now (every file read once)."""
        entries = []
        for name in sorted(walk_files(directory)):
            size, sha256 = digest_file(directory / name)
            entries.append(ManifestEntry(name, size, sha256))
        return cls(tuple(entries))

    def to_json(self) -> str:
        """The manifest in its JSON format (see the module's docstring)."""
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.files],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """A manifest from its JSON form, checked field by field."""
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT or data.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} of version {VERSION}")
            entries = []
            for item in data["files"]:
                if set(item) != _FIELDS:
                    fields = sorted(item)
                    raise ValueError(f"an entry has the fields {fields}, not {sorted(_FIELDS)}")
                path, size, sha256 = item["path"], item["size"], item["sha256"]
                if type(size) is not int or size < 0 or not _HEX.match(str(sha256)):
                    raise ValueError(f"bad size or sha256 for {path!r}")
                entries.append(ManifestEntry(_check_path(path), size, str(sha256)))
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ManifestError(f"manifest: unreadable ({error}).") from None
        _check_tree(entries)
        return cls(tuple(sorted(entries)))

    def write(self, path: Path) -> None:
        """Write the manifest to ``path`` (0600, created exclusively and renamed into
        place; never over another user's file)."""
        paths.write_private(path, self.to_json())

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest at ``path``, if there is one; only a file of this user's that
        others cannot write (:class:`ManifestError` otherwise)."""
        try:
            data = paths.read_trusted(path)
        except UnsafePathError as error:
            raise ManifestError(f"manifest {path}: {error}") from None
        return None if data is None else cls.from_json(data)

    def verify(self, directory: Path, *, digests: bool = True) -> None:
        """Nothing if ``directory`` holds exactly these files (sizes and, with
        ``digests``, sha256 digests); else :class:`ManifestError`, one line naming
        the first file that differs and how."""
        found = set(walk_files(directory))
        for entry in self.files:
            where = directory / entry.path
            if entry.path not in found:
                raise ManifestError(f"{where}: missing (the manifest lists it).")
            if not digests:
                try:
                    info = os.lstat(where)
                except OSError as error:
                    raise ManifestError(f"{where}: cannot be read ({_reason(error)}).") from None
                size, sha256 = info.st_size, entry.sha256
            else:
                size, sha256 = digest_file(where)
            if size != entry.size:
                raise ManifestError(f"{where}: {size} bytes, the manifest says {entry.size}.")
            if sha256 != entry.sha256:
                raise ManifestError(
                    f"{where}: sha256 {sha256[:16]}..., the manifest says {entry.sha256[:16]}..."
                )
        extra = sorted(found - {entry.path for entry in self.files})
        if extra:
            raise ManifestError(f"{directory / extra[0]}: not in the manifest.")
