"""Placement's refusals, remembered for the rest of one pass over the queue.

In one pass of the dispatch machine over its queue (:mod:`.dispatch`), the fleet's
state changes only when a job is placed, and placement
(:func:`..fleet.placement.choose_server`) is a pure function of that state, of the
pass's demand and time, and of what the job asks: its wanted resources, its context
and the work still to come for it. A queued job that asks what an earlier one of the
pass was refused is refused the same, until a job is placed: then every refusal is
forgotten. Queued jobs of one context get one answer a pass instead of one each.

A refusal for want of a free slot or of a server with the resources is decided before
the work to come is weighed, so it holds for every job of that context and resources
(a context the run's DAG did not name weighs each of its jobs with a different count:
the jobs queued ahead of it).
"""

from __future__ import annotations

from ..fleet.placement import Decision, PlacementStep

__all__ = ["WHATEVER_REMAINS", "Refusals"]

#: The refusals placement gives whatever the work to come (see the module's docstring).
WHATEVER_REMAINS = frozenset({PlacementStep.BUSY, PlacementStep.UNRUNNABLE})

#: A job's wanted resources (hashable), its context, and the work to come (None: any).
_Key = tuple[frozenset[tuple[str, float]], str | None, int | None]


class Refusals:
    """The refusals of one pass over the queue since its last placement."""

    def __init__(self) -> None:
        self._known: dict[_Key, Decision] = {}

    def get(
        self, wanted: frozenset[tuple[str, float]], identity: str | None, remaining: int
    ) -> Decision | None:
        """The refusal a job asking this was given (None: none was)."""
        known = self._known
        return known.get((wanted, identity, remaining)) or known.get((wanted, identity, None))

    def refused(
        self,
        wanted: frozenset[tuple[str, float]],
        identity: str | None,
        remaining: int,
        decision: Decision,
    ) -> None:
        """Remember a refusal (a decision without a server)."""
        self._known[(wanted, identity, remaining)] = decision
        if decision.step in WHATEVER_REMAINS:
            self._known[(wanted, identity, None)] = decision

    def forget(self) -> None:
        """A job was placed: the fleet's state changed, every refusal may not hold."""
        self._known.clear()
