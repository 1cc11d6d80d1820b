"""The executor's periodic fleet check, every :data:`~.dispatch.FLEET_CHECK_SECONDS`:
the cluster's workers as a stimulus (Dask's list is the membership when no scheduler
plugin sends events), what the run still asks of a pool of pilots, and the clock.

The demand carries a sequence number that grows with each check: a pool reads a
demand whose number stopped growing as withdrawn (a Snakemake killed before its
shutdown), and the shutdown withdraws it at once (:meth:`FleetPoll.withdraw`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..defaults import DEMAND_KEY
from ..dispatch.machine import FLEET_CHECK_SECONDS, Dispatch
from ..dispatch.vocabulary import ServersPolled, Stimulus, Tick
from ..fleet.poolsizing import WITHDRAWN

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = ["FleetPoll"]


class FleetPoll:
    """Puts the fleet check's stimuli into the executor's inbox when one is due."""

    def __init__(
        self,
        connection: ClusterConnection,
        dispatch: Dispatch,
        put: Callable[[Stimulus], None],
        debug: Callable[[str], None],
    ) -> None:
        self._connection, self._dispatch, self._put, self._debug = connection, dispatch, put, debug
        self._last = 0.0
        self._sequence = 0

    def __call__(self, now: float) -> None:
        """Check the fleet if the last check is at least the interval old."""
        if now - self._last < FLEET_CHECK_SECONDS:
            return
        self._last = now
        try:
            self._put(ServersPolled(self._connection.workers(), now))
            # Tell the cluster's pool of pilots, if any, what the run still asks of it.
            self._sequence += 1
            demand = replace(self._dispatch.pool_demand(), sequence=self._sequence)
            self._connection.client.set_metadata(DEMAND_KEY, demand.to_wire())
        except Exception as error:
            self._debug(f"Cannot list the cluster's workers: {error}")
        self._put(Tick(now))

    def withdraw(self) -> None:
        """The run ends: it asks nothing more of a pool of pilots (an attached pool would
        otherwise keep, and replace, pilots for the run's last published demand)."""
        if self._dispatch.scheduler_lost is not None:
            return
        try:
            self._connection.client.set_metadata(DEMAND_KEY, dict(WITHDRAWN))
        except Exception as error:  # the scheduler closed first: nothing to withdraw from
            self._debug(f"Cannot withdraw the run's demand: {error}")
