"""The fleet's shape, LLSC's "triples": servers per node x slots per server x threads
per slot, and the batching defaults servers give ``batched()`` functions.

One set of options for the three ways servers start (the embedded cluster, `up`,
pilots): checked once (one line naming the setting), passed to the cluster process
as arguments, and to each server as its Dask threads (slots) and its ServerConfig.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import ClusterError

__all__ = ["Shape"]


@dataclass(frozen=True)
class Shape:
    """Slots per server, threads per slot, and the batching defaults."""

    slots: int = 1
    threads_per_slot: int = 0
    batch_max: int = 0
    batch_wait: float = 0.0

    def check(self, prefix: str = "--context-") -> Shape:
        """Refuse a bad value in one line naming the setting (``prefix`` + name)."""
        for name, value, least in (
            ("slots", self.slots, 1),
            ("threads-per-slot", self.threads_per_slot, 0),
            ("batch-max", self.batch_max, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ClusterError(
                    f"{prefix}{name} {value!r} is not allowed: a whole number, at least "
                    f"{least}" + (" (0: the default)." if least == 0 else ".")
                )
        if not isinstance(self.batch_wait, (int, float)) or not 0 <= self.batch_wait <= 1:
            raise ClusterError(
                f"{prefix}batch-wait {self.batch_wait!r} is not allowed: seconds from 0 "
                "to 1 (default 0: a lone call is not delayed)."
            )
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
        ]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Shape:
        """The shape of parsed arguments (see :meth:`add_arguments`)."""
        return cls(args.slots, args.threads_per_slot, args.batch_max, args.batch_wait)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, helps: bool = True) -> None:
        """--slots, --threads-per-slot, --batch-max, --batch-wait."""

        def text(message: str) -> str:
            return message if helps else argparse.SUPPRESS

        parser.add_argument(
            "--slots",
            type=int,
            default=1,
            help=text("jobs each server runs at once against one loaded context (default 1)"),
        )
        parser.add_argument(
            "--threads-per-slot",
            type=int,
            default=0,
            help=text("thread pools' size of each in-process job (0: the rule's threads)"),
        )
        parser.add_argument(
            "--batch-max",
            type=int,
            default=0,
            help=text("most items per merged batched() call (0: the context's max_batch)"),
        )
        parser.add_argument(
            "--batch-wait",
            type=float,
            default=0.0,
            help=text("seconds a batched() call waits for other jobs' items (default 0)"),
        )
