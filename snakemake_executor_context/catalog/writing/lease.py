"""One writer per SQLite catalog: a lease file beside it, and what a second run does.

The lease is ``<catalog>.writer``, created 0600 with ``O_EXCL`` (no fcntl locks: they
are unreliable on Lustre and some NFS set-ups) and holding the writer's host, pid and
a heartbeat its writer thread renews every :data:`LEASE_HEARTBEAT_SECONDS` (a lease
another user cannot read is judged by its modification time). For a
catalog on a network filesystem the lease lies beside the published snapshot, on
the shared path, so two nodes cannot overwrite each other's snapshot. A lease whose
heartbeat is older than :data:`LEASE_STALE_SECONDS` (or whose process on this host is
gone) is taken over, and the run says so.

A run that finds the lease held writes its own catalog beside the shared one
(``catalog.<run>.db``, see :func:`sibling_path`) and says so: nothing is merged and
nothing is lost; ``snakemake-context status --catalog`` and the monitor read it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ...errors import UnsafePathError
from ...strays.processes import pid_alive
from ..store import CatalogError, CatalogLocation, resolve_location

__all__ = [
    "LEASE_HEARTBEAT_SECONDS",
    "LEASE_STALE_SECONDS",
    "LeaseHeld",
    "LeaseHolder",
    "WriterLease",
    "is_stale",
    "lease_path",
    "let_go_of_dead",
    "sibling_path",
]

#: Seconds between two renewals of a writer's lease.
LEASE_HEARTBEAT_SECONDS = 3.0
#: A lease not renewed for this long may be taken over.
LEASE_STALE_SECONDS = 60.0


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a catalog's lease, as its file says."""

    host: str
    pid: int
    owner: str
    heartbeat: float
    token: str

    def describe(self, now: float | None = None) -> str:
        """'run X on host (pid 12), heartbeat 3 s ago'."""
        age = (time.time() if now is None else now) - self.heartbeat
        return f"{self.owner} on {self.host} (pid {self.pid}), heartbeat {age:.0f} s ago"


class LeaseHeld(CatalogError):
    """Another live writer holds the catalog's lease."""

    def __init__(self, path: Path, holder: LeaseHolder | None) -> None:
        who = holder.describe() if holder else "a writer whose lease is being written"
        super().__init__(f"The catalog's writer lease {path} is held by {who}.")
        self.holder = holder


def lease_path(location: CatalogLocation) -> Path | None:
    """The lease file of a SQLite catalog (beside the shared snapshot on a network
    filesystem); None for a database server, which takes many writers."""
    target = location.snapshot or location.path
    return None if target is None else target.with_name(target.name + ".writer")


def sibling_path(requested: str, run_id: str) -> str:
    """Where a run writes its own catalog when the shared one has another writer:
    ``catalog.db`` becomes ``catalog.<run_id>.db`` beside it."""
    path = Path(requested)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    return str(path.with_name(f"{path.stem}.{safe}{path.suffix or '.db'}"))


def is_stale(
    holder: LeaseHolder,
    now: float,
    host: str,
    alive: Callable[[int], bool] = pid_alive,
) -> bool:
    """Whether a lease may be taken over: no heartbeat for LEASE_STALE_SECONDS, or
    its process on this host is gone."""
    if now - holder.heartbeat > LEASE_STALE_SECONDS:
        return True
    return holder.host == host and not alive(holder.pid)


def _read(path: Path) -> LeaseHolder | None:
    # A shared catalog's lease may be another user's: its content is only a claim,
    # read without following a symlink.
    try:
        with os.fdopen(paths.open_nofollow(path), "rb") as handle:
            data = json.loads(handle.read())
        return LeaseHolder(
            host=str(data["host"]),
            pid=int(data["pid"]),
            owner=str(data.get("owner", "")),
            heartbeat=float(data["heartbeat"]),
            token=str(data["token"]),
        )
    except (OSError, ValueError, KeyError, TypeError, UnsafePathError):
        return None


class WriterLease:
    """This process's claim on a catalog's lease file."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.held = False

    def _content(self) -> str:
        return json.dumps(
            {
                "host": self.host,
                "pid": os.getpid(),
                "owner": self.owner,
                "heartbeat": time.time(),
                "token": self.token,
            }
        )

    def acquire(self) -> LeaseHolder | None:
        """Take the lease; return the stale holder it took over from, if any.
        Raises :class:`LeaseHeld` when a live writer holds it."""
        taken: LeaseHolder | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            if not paths.create_exclusive(self.path, self._content().encode()):
                holder = _read(self.path)
                if holder is None:
                    # Being written this instant, or garbage: judge by its age.
                    try:
                        age = time.time() - self.path.stat().st_mtime
                    except FileNotFoundError:
                        continue
                    if age <= LEASE_STALE_SECONDS:
                        raise LeaseHeld(self.path, None) from None
                elif not is_stale(holder, time.time(), self.host):
                    raise LeaseHeld(self.path, holder) from None
                if self._take_over(holder):
                    taken = holder
                continue
            self.held = True
            return taken
        raise LeaseHeld(self.path, _read(self.path))

    def _take_over(self, judged: LeaseHolder | None) -> bool:
        """Move the stale lease aside; put it back if it changed meanwhile (another
        run took it over first)."""
        aside = self.path.with_name(f"{self.path.name}.stale-{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        moved = _read(aside)
        if judged is not None and moved != judged:
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True

    def beat(self) -> bool:
        """Renew the heartbeat; False if the lease is no longer this process's."""
        if not self.held:
            return False
        current = _read(self.path)
        if current is None or current.token != self.token:
            self.held = False
            return False
        paths.write_private(self.path, self._content())
        return True

    def release(self) -> None:
        """Give the lease up (only if it is still this process's)."""
        if not self.held:
            return
        self.held = False
        current = _read(self.path)
        if current is not None and current.token == self.token:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def let_go_of_dead(spec: str, pid: int) -> bool:
    """Remove the lease of catalog ``spec`` when it names process ``pid`` of this host
    and that process is gone: a writer killed before it let go (``down`` of a cluster
    that did not end in time), whose lease would otherwise stay until the next writer
    takes it over. Another user's lease file is left. Whether one was removed."""
    path = lease_path(resolve_location(spec))
    holder = _read(path) if path is not None else None
    if path is None or holder is None:
        return False
    if holder.host != socket.gethostname() or holder.pid != pid or pid_alive(pid):
        return False
    return paths.remove_own(path)
