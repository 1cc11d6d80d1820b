"""The fleet's shape, LLSC's "triples": servers per node x slots per server x threads
per slot, the GPUs each server owns (a context may span them: a gang), the batching
defaults servers give ``batched()`` functions, and how servers share context templates
(peer transfers, whether each has a cache of its own, and what a cache may hold).

One set of options for the three ways servers start (the embedded cluster, `up`,
pilots): checked once (one line naming the setting), passed to the cluster process
as arguments, and to each server as its Dask threads (slots) and its ServerConfig.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..allowed import NUMBER, SIZE, TEXT, WHOLE, Allowed, Setting, add_argument, check, filled
from ..defaults import GANG_TIMEOUT_SECONDS
from ..errors import SettingError

__all__ = [
    "BATCH_MAX",
    "BATCH_WAIT",
    "GANG_TIMEOUT",
    "GPUS_PER_SERVER",
    "MODEL_CACHE_SIZE",
    "OWN_CACHES",
    "PEER_MBPS",
    "PEER_TRANSFERS",
    "SLOTS",
    "THREADS_PER_SLOT",
    "Shape",
]

#: Jobs one server runs at once (its Dask threads).
SLOTS = Allowed(WHOLE, least=1, most=256, unit="jobs at once")
#: Threads of each in-process job's pools.
THREADS_PER_SLOT = Allowed(WHOLE, least=0, most=1024, zero="the rule's threads")
#: Most items one merged batched() call takes.
BATCH_MAX = Allowed(WHOLE, least=0, most=1_000_000, zero="each function's own max_batch")
#: Seconds a batched() call waits for other jobs' items.
BATCH_WAIT = Allowed(NUMBER, least=0, most=1, unit="seconds")
#: Transfers of its templates one server serves to peers at once.
PEER_TRANSFERS = Allowed(WHOLE, least=0, most=64, zero="no peer transfer")
#: MB a second each transfer a server serves may take (0: no limit). Below 1 MB/s a
#: template of a few GB takes hours from a peer, longer than any source: a typo.
PEER_MBPS = Allowed(NUMBER, least=1, most=1e6, zero="no limit", unit="MB/s")


#: A directory of per-server model caches: where the servers start, made and checked
#: there (:meth:`Shape.check_own_caches`; a pilot's on its node).
OWN_CACHES = Allowed(TEXT, form=filled)
#: What a node-local model cache may hold ("20GB"; None: no limit): at most 1 PiB, more
#: than any node's local disk (1e30 was taken as it was).
MODEL_CACHE_SIZE = Allowed(SIZE, optional=True, least=2**20, most=2**50)
#: GPUs each server owns (or, without GPUs, stands in for).
GPUS_PER_SERVER = Allowed(WHOLE, least=1, most=64, unit="GPUs")
#: Seconds a gang's collectives may take.
GANG_TIMEOUT = Allowed(NUMBER, least=1, most=86_400, unit="seconds")
_SHAPE = {
    "slots": SLOTS,
    "threads_per_slot": THREADS_PER_SLOT,
    "batch_max": BATCH_MAX,
    "batch_wait": BATCH_WAIT,
    "peer_transfers": PEER_TRANSFERS,
    "peer_mbps": PEER_MBPS,
    "own_caches": OWN_CACHES,
    "model_cache_size": MODEL_CACHE_SIZE,
    "gpus_per_server": GPUS_PER_SERVER,
    "gang_timeout": GANG_TIMEOUT,
}


@dataclass(frozen=True)
class Shape:
    """Slots per server, threads per slot, the batching defaults, template sharing, and
    the GPUs each server owns with the timeout of the gangs spanning them."""

    slots: int = 1
    threads_per_slot: int = 0
    batch_max: int = 0
    batch_wait: float = 0.0
    peer_transfers: int = 2
    peer_mbps: float = 0.0
    own_caches: str = ""
    gpus_per_server: int = 1
    gang_timeout: float = GANG_TIMEOUT_SECONDS
    model_cache_size: str | None = None

    @property
    def model_cache_bytes(self) -> int:
        """The model cache's size limit in bytes (0: no limit)."""
        from dask.utils import parse_bytes

        return int(parse_bytes(self.model_cache_size)) if self.model_cache_size else 0

    def check(self, prefix: str = "--context-") -> Shape:
        """Refuse a bad value in one line naming the setting (``prefix`` + name)."""
        defaults = Shape()
        settings = [
            Setting(name, prefix + name.replace("_", "-"), getattr(defaults, name), allowed)
            for name, allowed in _SHAPE.items()
        ]
        check({name: getattr(self, name) for name in _SHAPE}, settings)
        return self

    def serve_args(self) -> list[str]:
        """The cluster process's arguments for this shape."""
        return [
            "--slots",
            str(self.slots),
            "--threads-per-slot",
            str(self.threads_per_slot),
            "--batch-max",
            str(self.batch_max),
            "--batch-wait",
            repr(float(self.batch_wait)),
            "--peer-transfers",
            str(self.peer_transfers),
            "--peer-mbps",
            repr(float(self.peer_mbps)),
            *(["--own-caches", self.own_caches] if self.own_caches else []),
            "--gpus-per-server",
            str(self.gpus_per_server),
            "--gang-timeout",
            repr(float(self.gang_timeout)),
            *(["--model-cache-size", self.model_cache_size] if self.model_cache_size else []),
        ]

    def check_own_caches(self, flag: str) -> None:
        """Make and check the directory of per-server caches (0700) in this process,
        as each server of a local cluster would at its start: one that cannot be made
        (``/proc/nope``) or is not this user's is refused in one line naming ``flag``
        before any server starts, not in the cluster's log. Not for pilots: their
        directory is on their nodes, made by their job scripts."""
        if not self.own_caches:
            return
        from .. import paths

        path = Path(self.own_caches).expanduser().absolute()
        problem = paths.dir_problem(path, tighten=True)
        if problem:
            raise SettingError(
                f"{flag} {self.own_caches!r} is not allowed: the directory {path} {problem}; "
                "name one this user can create."
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Shape:
        """The shape of parsed arguments (see :meth:`add_arguments`)."""
        return cls(
            args.slots,
            args.threads_per_slot,
            args.batch_max,
            args.batch_wait,
            args.peer_transfers,
            args.peer_mbps,
            args.own_caches,
            args.gpus_per_server,
            args.gang_timeout,
            args.model_cache_size,
        )

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, helps: bool = True) -> None:
        """--slots, --threads-per-slot, --batch-max, --batch-wait, --peer-transfers,
        --peer-mbps, --own-caches, --gpus-per-server, --gang-timeout,
        --model-cache-size."""

        def text(message: str) -> str:
            return message if helps else argparse.SUPPRESS

        add_argument(
            parser,
            "--slots",
            SLOTS,
            default=1,
            help=text("jobs each server runs at once against one loaded context (default 1)"),
        )
        add_argument(
            parser,
            "--threads-per-slot",
            THREADS_PER_SLOT,
            default=0,
            help=text("thread pools' size of each in-process job (0: the rule's threads)"),
        )
        add_argument(
            parser,
            "--batch-max",
            BATCH_MAX,
            default=0,
            help=text("most items per merged batched() call (0: the context's max_batch)"),
        )
        add_argument(
            parser,
            "--batch-wait",
            BATCH_WAIT,
            default=0.0,
            help=text("seconds a batched() call waits for other jobs' items (default 0)"),
        )
        add_argument(
            parser,
            "--peer-transfers",
            PEER_TRANSFERS,
            default=2,
            help=text(
                "transfers of its context templates each server serves to peers at once "
                "(default 2; 0: none, every load reads its source)"
            ),
        )
        add_argument(
            parser,
            "--peer-mbps",
            PEER_MBPS,
            default=0.0,
            help=text("MB/s each transfer a server serves may take (default 0: no limit)"),
        )
        add_argument(
            parser,
            "--own-caches",
            OWN_CACHES,
            default="",
            help=text(
                "a directory of per-server model caches, DIR/<server name>, as servers on "
                "different nodes have (default: the servers share one)"
            ),
        )
        add_argument(
            parser,
            "--gpus-per-server",
            GPUS_PER_SERVER,
            default=1,
            help=text(
                "GPUs each server owns (default 1); without GPUs, the GPUs each CPU server "
                "stands in for. A loader sees them (server_devices()); a context declared "
                "with ranks=k puts one process on each of k of them"
            ),
        )
        add_argument(
            parser,
            "--gang-timeout",
            GANG_TIMEOUT,
            default=GANG_TIMEOUT_SECONDS,
            help=text(
                "seconds a collective of a context spanning several processes may take "
                f"before it fails (default {GANG_TIMEOUT_SECONDS:g})"
            ),
        )
        add_argument(
            parser,
            "--model-cache-size",
            MODEL_CACHE_SIZE,
            default=None,
            help=text(
                "what each node-local model cache may hold, such as 20GB: the least "
                "recently used templates no server of the node uses are removed to make "
                "room (default: no limit)"
            ),
        )
