"""What an attempt's Dask future says, as the dispatch machine's
:class:`~..dispatch.vocabulary.AttemptEnded`: its result, or why there is none (the scheduler's
death, told first when that is why Dask cancelled it)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..dispatch.vocabulary import AttemptEnded, JobTicket, SchedulerLost, Stimulus
from ..jobspec import JobResult
from ..terminal import printable
from .summary import summary_entry

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection
    from ..dispatch.machine import Dispatch

__all__ = ["RESULT_TIMEOUT", "attempt_ended", "fetch_results", "scheduler_lost_first"]

logger = logging.getLogger(__name__)

#: Seconds a finished task's result may take to arrive (its server may die meanwhile).
RESULT_TIMEOUT = 30.0
#: Seconds a cancelled future waits for the embedded cluster's process to be seen
#: ended: Dask cancels the futures as the scheduler's connection closes, and the
#: killed process is reaped a moment later (under load, CI saw the cancellations
#: handled first).
SCHEDULER_GONE_PATIENCE = 2.0


def fetch_results(client: Any, futures: dict[str, Any]) -> dict[str, JobResult]:
    """The results of finished attempts' futures, fetched together: one request to the
    scheduler, which gathers them from their servers (one per server). Empty when any
    of them cannot be had (a server died holding one): each is then fetched alone,
    where a lost result is told apart. Never waits for a task to finish again."""
    if not futures:
        return {}

    async def gather() -> dict[str, JobResult]:
        response = await asyncio.wait_for(
            client.scheduler.gather(keys=list(futures)), RESULT_TIMEOUT
        )
        return dict(response["data"]) if response.get("status") == "OK" else {}

    try:
        fetched: dict[str, JobResult] = client.sync(gather)
    except Exception as error:  # the scheduler gone, a timeout: fetched one by one
        logger.debug("fetching %d results together: %r", len(futures), error)
        return {}
    return fetched


def attempt_ended(
    key: str, future: Any, placed_by: str, ticket: JobTicket, fetched: JobResult | None = None
) -> tuple[AttemptEnded | None, list[dict[str, Any]] | None]:
    """The end of attempt ``key`` from its done future, and its entries in the run
    summary (a group's: one per member that ran; None without a result). (None,
    None): the task had finished but its result died with its server before it
    could be fetched; the server's loss
    sends the job back to the queue. What the server warns about the job (threads or
    files it left behind) goes to the run's log. ``fetched``: its result, if
    :func:`fetch_results` had it."""
    ended, result = _ended(key, future, ticket.title, fetched)
    if ended is None or result is None:
        return ended, None
    if result.extra.get("warnings") or result.extra.get("notes"):
        from ..snakemake_internals import snakemake_logger

        logger = snakemake_logger()  # the run's log, as the executor's own
        for warning in result.extra.get("warnings", ()):
            logger.warning(printable(str(warning)))  # may quote the job's names
        for note in result.extra.get("notes", ()):
            logger.info(printable(str(note)))
    reported = time.time()
    entries = [
        summary_entry(
            one.outcome,
            one.extra,
            placed_by="group" if result.members else placed_by,
            submitted=ticket.submitted,
            reported=reported,
        )
        for one in result.members or [result]
    ]
    return ended, entries


def scheduler_lost_first(
    dispatch: Dispatch, connection: ClusterConnection, ended: AttemptEnded
) -> list[Stimulus]:
    """Before an attempt that Dask cancelled (dispatch cancels none that way): the
    scheduler's death, if that is why, so that the job fails as the scheduler's
    loss in one line rather than as a cancellation."""
    if dispatch.scheduler_lost is not None or not ended.dask_cancelled:
        return []
    why = connection.scheduler_gone_within(SCHEDULER_GONE_PATIENCE)
    if why is None:
        return []
    connection.abandon_client()
    return [SchedulerLost(why, ended.now)]


def _ended(
    key: str, future: Any, title: str, fetched: JobResult | None
) -> tuple[AttemptEnded | None, JobResult | None]:
    now = time.time()
    if future.status == "finished":
        try:
            result = fetched if fetched is not None else _fetch(future)
        except Exception as error:  # the result could not be fetched
            return AttemptEnded(key, now, message=f"{title}: {error}"), None
        if result is None:
            return None, None
        aux = (result.log_path,) if result.log_path and not result.ok else ()
        members = tuple((m.outcome, m.message) for m in result.members)
        ended = AttemptEnded(
            key, now, outcome=result.outcome, message=result.message, aux_logs=aux, members=members
        )
        return ended, result
    if future.status == "cancelled":
        return AttemptEnded(
            key, now, message=f"{title}: cancelled in Dask.", dask_cancelled=True
        ), None
    if future.status == "error":
        return AttemptEnded(key, now, message=explain_task_error(title, _exception(future))), None
    # 'lost' (or 'pending' again): the task had finished, and the server holding its
    # result died before the result was fetched (a job that crashed the server next,
    # for one). Not this job's failure: the server's loss requeues it.
    return None, None


def _exception(future: Any) -> BaseException | None:
    try:
        return future.exception(timeout=RESULT_TIMEOUT)
    except Exception as error:  # the exception could not be fetched either
        return error


def _fetch(future: Any) -> JobResult | None:
    """The finished task's result; None if it was lost meanwhile (its server died
    holding it: Dask no longer calls the task finished). Each try waits twice as long
    as the last (from 0.5 s): a try that times out starts its fetch again, and with 128
    servers on 2 cores one took longer than 0.5 s every time, until the job failed."""
    deadline = time.monotonic() + RESULT_TIMEOUT
    wait = 0.5
    while True:
        try:
            result: JobResult = future.result(timeout=wait)
            return result
        except TimeoutError:
            if future.status != "finished":
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"its result could not be fetched from its server in {RESULT_TIMEOUT:.0f} s"
                ) from None
            wait = min(2 * wait, 8.0)


def explain_task_error(title: str, error: BaseException | None) -> str:
    """Why a task failed in Dask (not in the job), with what to do."""
    name = type(error).__name__ if error is not None else "unknown error"
    if name == "KilledWorker":
        return (
            f"{title}: the servers that ran it died every time "
            "(distributed.scheduler.allowed-failures reached): "
            f"{error}. A job that makes its server crash (out of memory, a segfault in "
            "a native library) fails here. Fix: look at the cluster log, give the "
            "rule more memory, or raise allowed-failures for preemptible servers."
        )
    return f"{title}: the task failed in Dask: {name}: {error}"
