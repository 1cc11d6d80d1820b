"""Each word sent once: the routes of the fleet's events through a real Dask scheduler.

A run's own records go to the hub on a topic no run follows (they used to come back
to every run, the sender's own included, to be dropped on arrival); a server's events
of one tick travel as one message, and a job's end leaves ahead of its result.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from snakemake_executor_context.catalog.writing.sinks import DaskRelay
from snakemake_executor_context.cluster.hub import FleetHub
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.server.outbox import TICK_SECONDS, Outbox

distributed = pytest.importorskip("distributed")

#: The outbox of the in-process worker, for the task below (tasks of an in-process
#: cluster run in this process).
OUTBOXES: dict[str, Outbox] = {}


@pytest.fixture
def cluster():
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as local,
        distributed.Client(local) as client,
    ):
        hub = FleetHub()
        local.scheduler.add_plugin(hub)
        local.sync(hub.start, local.scheduler)
        yield local, client


def _scheduler_events(topic: str, dask_scheduler: Any = None) -> list[Any]:
    return [message for _, message in dask_scheduler.get_events(topic)]


def _hub_view_keys(dask_scheduler: Any) -> list[str]:
    (hub,) = [p for p in dask_scheduler.plugins.values() if isinstance(p, FleetHub)]
    return sorted(hub.view.servers["tcp://s"].started)


def test_a_runs_own_records_reach_the_hub_and_never_come_back(cluster):
    _, client = cluster
    heard: list[Any] = []
    client.subscribe_topic(ev.TOPIC, lambda event: heard.append(event[1]))
    relay = DaskRelay(client, warn=pytest.fail, heartbeat_run="r")
    relay.submit(ev.RunStarted(run_id="r"))
    relay.submit(ev.JobDispatched(run_id="r", key="a-1-x", jobid="1", rule="a", target=""))
    relay.flush(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sent = client.run_on_scheduler(_scheduler_events, ev.RECORD_TOPIC)
        if sent:
            break
        time.sleep(0.05)
    assert [item["kind"] for message in sent for item in message] == [
        "run-started",
        "job-dispatched",
    ]
    time.sleep(0.5)  # what came back would have come by now
    assert heard == []
    relay.close()


def _a_job_that_emits(name: str) -> str:
    outbox = OUTBOXES[name]
    outbox.put([ev.JobStarted(run_id="r", key=f"j-{i}-x", address="tcp://s") for i in range(3)])
    time.sleep(TICK_SECONDS / 5)  # well within the tick
    outbox.put([ev.JobFinished(run_id="r", key="j-0-x", address="tcp://s", ok=True)], now=True)
    return "result"


def test_a_servers_events_of_one_tick_are_one_message_ahead_of_the_result(cluster):
    local, client = cluster
    (worker,) = local.workers.values()
    OUTBOXES["w"] = Outbox(worker)
    order: list[Any] = []
    arrived = threading.Event()
    client.subscribe_topic(ev.TOPIC, lambda event: order.append(event[1]))
    hub_joined = [ev.ServerJoined(address="tcp://s", name="s", slots=4)]
    client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.log_event(ev.TOPIC, ev.encode(hub_joined))
    )
    future = client.submit(_a_job_that_emits, "w", pure=False)
    future.add_done_callback(lambda _: (order.append("result"), arrived.set()))
    assert arrived.wait(30)
    assert future.result() == "result"
    messages = [m for m in order if m == "result" or m[0]["kind"] != "server-joined"]
    # One message with the three starts and the end, and only then the result.
    assert len(messages) == 2 and messages[1] == "result", messages
    assert [item["kind"] for item in messages[0]] == ["job-started"] * 3 + ["job-finished"]
    # The hub took the message's events one by one (the end freed j-0's slot).
    assert client.run_on_scheduler(_hub_view_keys) == ["j-1-x", "j-2-x"]


def _messages_after(client: Any, task: Any) -> list[Any]:
    """The fleet's messages that a task on the worker made its outbox send (those of a
    few ticks after the first)."""
    heard: list[Any] = []
    client.subscribe_topic(ev.TOPIC, lambda event: heard.append(event[1]))
    client.submit(task, "w", pure=False).result()
    deadline = time.monotonic() + 10
    while not heard and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(4 * TICK_SECONDS)
    return heard


def _events_in_a_tick(name: str) -> None:
    OUTBOXES[name].put([ev.ContextLoading(address="tcp://s", identity="c")])
    OUTBOXES[name].put([ev.ContextReady(address="tcp://s", identity="c", load_seconds=1.0)])


def test_events_without_a_jobs_end_leave_within_a_tick_together(cluster):
    local, client = cluster
    (worker,) = local.workers.values()
    OUTBOXES["w"] = Outbox(worker)
    heard = _messages_after(client, _events_in_a_tick)
    assert [[item["kind"] for item in message] for message in heard] == [
        ["context-loading", "context-ready"]
    ]


def _events_one_unsendable(name: str) -> None:
    outcome = Outcome("k-1-x", ServerIdentity("s", "h", 1, "tcp://s"))
    OUTBOXES[name].put([outcome.but(items=2**64).finished_event("r")], now=True)
    OUTBOXES[name].put([outcome.but(items=2**64).finished_event("r")])
    OUTBOXES[name].put([outcome.finished_event("r")], now=True)


def test_an_event_that_cannot_be_sent_is_dropped_and_the_others_go(cluster):
    """An event msgpack cannot carry (an integer past 64 bits) would close the worker's
    connection: it is dropped, alone or from the message it shares with others."""
    local, client = cluster
    (worker,) = local.workers.values()
    OUTBOXES["w"] = Outbox(worker)
    heard = _messages_after(client, _events_one_unsendable)
    assert [[item["items"] for item in message] for message in heard] == [[0]]
    assert worker.status.name == "running"
