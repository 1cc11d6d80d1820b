"""The ledger's buckets: where a GPU-second of the fleet went, one name each.

Every second of a server's life (times its GPUs: a CPU server counts as its one
stand-in GPU) lands in exactly one bucket. The ledger (:mod:`.accounting`, over the
catalog's records) and the simulator print these names, so that their numbers
compare line by line. The order below is the order reports list them in.
"""

from __future__ import annotations

from enum import StrEnum

from .loads import LoadKind

__all__ = ["BUCKET_HELP", "USEFUL", "Bucket"]


class Bucket(StrEnum):
    """Where a server-second went (stored, exported and printed as is)."""

    #: A pilot's batch job was running (and charged) before its server registered.
    ALLOCATED_BEFORE = "allocated_before"
    #: Registered, nothing loaded and no job run yet.
    STARTING = "starting"
    #: Loading a context, by kind (:class:`~.loads.LoadKind`).
    LOADING_CONVERSION = "loading_conversion"
    LOADING_CACHE = "loading_cache"
    LOADING_SOURCE = "loading_source"
    LOADING_PEER = "loading_peer"
    #: Running jobs whose attempt ended ok (useful work; attempts still running too).
    RUNNING = "running"
    #: Running attempts that failed or were cancelled.
    FAILED = "failed"
    #: No job and no load, a context loaded (warm).
    IDLE_WARM = "idle_warm"
    #: No job and no load, nothing loaded (cold), after the first load or job.
    IDLE_COLD = "idle_cold"
    #: Draining (a preemption notice, a recycle, a black hole) with nothing running.
    DRAINING = "draining"
    #: Attempts thrown away by a preemption or a crash, their loads included.
    LOST = "lost"
    #: A pilot's batch job was still running (and charged) after its server left.
    ALLOCATED_AFTER = "allocated_after"

    @classmethod
    def loading(cls, kind: LoadKind) -> Bucket:
        """The loading bucket of a kind of load."""
        return cls(f"loading_{kind.value}")

    @property
    def is_loading(self) -> bool:
        """Whether this is one of the loading buckets."""
        return self.value.startswith("loading_")


#: The buckets of useful work.
USEFUL = frozenset({Bucket.RUNNING})

#: One line on each bucket, for the report, the export's documentation and ``--help``.
BUCKET_HELP: dict[Bucket, str] = {
    Bucket.ALLOCATED_BEFORE: "pilot allocated by the batch system, its server not yet registered",
    Bucket.STARTING: "registered, nothing loaded and no job run yet",
    Bucket.LOADING_CONVERSION: "loading a context: converting its weights into a local cache",
    Bucket.LOADING_CACHE: "loading a context from the server's local cache",
    Bucket.LOADING_SOURCE: "loading a context from its source",
    Bucket.LOADING_PEER: "loading a context from another server (peer transfer)",
    Bucket.RUNNING: "running jobs that ended ok (useful work), or are still running",
    Bucket.FAILED: "running jobs that failed or were cancelled",
    Bucket.IDLE_WARM: "idle with a context loaded",
    Bucket.IDLE_COLD: "idle with nothing loaded",
    Bucket.DRAINING: "draining (preemption notice, recycling) with nothing running",
    Bucket.LOST: "work thrown away by a preemption or a crash, its loads included",
    Bucket.ALLOCATED_AFTER: "pilot still allocated by the batch system after its server left",
}
