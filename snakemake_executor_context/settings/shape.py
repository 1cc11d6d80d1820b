"""The fleet's shape, LLSC's "triples": servers per node x slots per server x threads
per slot, the GPUs each server owns (a context may span them: a gang), where the
model cache lives, and how servers share context templates (peer transfers, whether
each has a cache of its own, and what a cache may hold).

One typed record, :class:`Shape`, for the three ways servers start (the embedded
cluster, `up`, pilots): its fields are options of :mod:`.table` (their defaults and
checks are the table's), checked once (one line naming the setting), passed to the
cluster process as arguments, to pilots inside their options, and to each server in
its :class:`~..server.config.ServerConfig`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import SettingError
from .checks import NUMBER, Setting, check
from .table import add_option, option, setting_default, up_flag

__all__ = ["Shape"]


@dataclass(frozen=True)
class Shape:
    """Slots per server, threads per slot, the model caches, template sharing, and
    the GPUs each server owns with the timeout of the gangs spanning them. Each field
    is the option of its name (:data:`~.table.OPTIONS`)."""

    slots: int = setting_default("slots")
    threads_per_slot: int = setting_default("threads_per_slot")
    peer_transfers: int = setting_default("peer_transfers")
    peer_mbps: float = setting_default("peer_mbps")
    model_cache: str | None = setting_default("model_cache")
    own_caches: str | None = setting_default("own_caches")
    gpus_per_server: int = setting_default("gpus_per_server")
    gang_timeout: float = setting_default("gang_timeout")
    model_cache_size: str | None = setting_default("model_cache_size")

    @property
    def model_cache_bytes(self) -> int:
        """The model cache's size limit in bytes (0: no limit)."""
        from dask.utils import parse_bytes

        return int(parse_bytes(self.model_cache_size)) if self.model_cache_size else 0

    @property
    def peer_rate(self) -> float:
        """Bytes a second each transfer a server serves may take (0: no limit)."""
        return self.peer_mbps * 1e6

    @classmethod
    def names(cls) -> list[str]:
        """Its fields' names: the options it holds."""
        return [item.name for item in fields(cls)]

    def check(self, prefix: str = "--context-") -> Shape:
        """Refuse a bad value in one line naming the setting (``prefix`` + name)."""
        declared = [option(name) for name in self.names()]
        settings = [
            Setting(found.name, prefix + found.name.replace("_", "-"), found.default, found.allowed)
            for found in declared
        ]
        check(asdict(self), settings)
        return self

    def serve_args(self) -> list[str]:
        """The cluster process's arguments for this shape (what is unset left out)."""
        found = []
        for name, value in asdict(self).items():
            if value is None:
                continue
            number = option(name).allowed.kind == NUMBER
            found += [up_flag(name), repr(float(value)) if number else str(value)]
        return found

    def check_cache_dirs(self, flag_of: Callable[[str], str]) -> list[str]:
        """Check the model cache and the directory of per-server caches in this
        process, as each server of a local cluster would use them at its start: one
        that cannot be made (``/proc/nope``), is not a directory or that every user may
        change is refused in one line naming its flag (``flag_of(name)``) before any
        server starts, not in the cluster's log. Nothing is made or changed here (the
        servers make what is missing, 0700; one that exists is used as it is). Returns
        a line for each existing one that others may change, saying who.
        Not for pilots: their directories are on their nodes, made by their job
        scripts."""
        from .. import paths

        notes = []
        for name in ("model_cache", "own_caches"):
            given = getattr(self, name)
            if not given:
                continue
            path = Path(os.path.expandvars(given)).expanduser().absolute()
            problem = paths.named_dir_problem(path, make=False)
            if problem:
                raise SettingError(
                    f"{flag_of(name)} {given!r} is not allowed: the directory {path} "
                    f"{problem}. Fix: name a directory that not every user may change, or "
                    "one this user can create."
                )
            note = paths.shared_note(path)
            if note:
                notes.append(f"{flag_of(name)}: {note}.")
        return notes

    @classmethod
    def from_args(cls, args: argparse.Namespace | Any) -> Shape:
        """The shape of parsed arguments (see :meth:`add_arguments`) or of the
        executor's settings: both name each value as its option."""
        return cls(**{name: getattr(args, name) for name in cls.names()})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, helps: bool = True) -> None:
        """Its options' flags (``--slots``...), as :func:`~.table.add_option` adds them."""
        for name in cls.names():
            add_option(parser, name, helps=helps)

    def to_wire(self) -> dict[str, Any]:
        """This shape as JSON holds it (inside a pilot's options and settings)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Shape:
        """A shape from :meth:`to_wire` (TypeError: a field this version lacks)."""
        return cls(**wire)
