"""The work still to come per context, which placement weighs against a load.

It is the run's, not the executor's: Snakemake hands a remote executor at most
``--jobs`` jobs at a time, so the jobs it holds say little about how much work a
context has left. At the start of a run the DAG's jobs that will reach the executor
are counted per context (:meth:`Demand.plan`); then a job is added when it becomes
ready (a retry, a job a checkpoint added) and removed when it ends. Jobs whose
context is not known before they run (a ``context`` resource given by a function
that needs more than the job's wildcards, such as its input files) count as
unknown: no load happens on their behalf, and a context that only such jobs
use is weighed as before this existed (the jobs the executor holds, and for a load
only the jobs queued ahead of the one placed). The same holds without a DAG (the
attribute is not part of Snakemake's plugin interface).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

__all__ = ["Demand"]


class Demand:
    """Jobs still to come, per context identity."""

    def __init__(self) -> None:
        self._remaining: dict[str, set[str]] = {}
        #: The identities the run's DAG named before any job ran.
        self._planned: set[str] = set()
        #: Jobs of the plan whose context is not known before they run.
        self.unknown = 0
        #: Whether a job became ready whose context the DAG did not name (the work to
        #: come for it is then counted from the jobs held, see :meth:`counts`).
        self.unplanned = False

    def plan(self, jobs: Mapping[str, str | None]) -> None:
        """Count the DAG's jobs (Snakemake job id -> context identity, or None)."""
        for jobid, identity in jobs.items():
            if identity is None:
                self.unknown += 1
            else:
                self._planned.add(identity)
                self._remaining.setdefault(identity, set()).add(jobid)

    def knows(self, identity: str) -> bool:
        """Whether the run's DAG named this context (its work to come is known)."""
        return identity in self._planned

    def ready(self, identity: str | None, jobid: str) -> None:
        """A job became ready (counted once, however often it is retried)."""
        if identity is not None:
            self._remaining.setdefault(identity, set()).add(jobid)
            self.unplanned = self.unplanned or identity not in self._planned

    def ended(self, identity: str | None, jobid: str) -> None:
        """A job ended (reported to Snakemake, either way)."""
        if identity is not None:
            self._remaining.get(identity, set()).discard(jobid)

    def counts(self, held: Iterable[str]) -> Counter[str]:
        """Jobs still to come per identity: the DAG's for the contexts it named, else
        ``held`` (the identities of the jobs the executor holds, one per job)."""
        out = Counter(identity for identity in held if identity not in self._planned)
        for identity in self._planned:
            out[identity] = len(self._remaining.get(identity, ()))
        return out
