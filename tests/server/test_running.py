"""The cancellation of an in-process job lands inside its interruptible phase (or at
its end), never in the server's bookkeeping after it: real threads, real
asynchronous exceptions."""

from __future__ import annotations

import random
import threading
import time

from snakemake_executor_context.errors import JobCancelled
from snakemake_executor_context.server.running import RunningJob


def _job_thread(outcome: dict, ready: threading.Event) -> None:
    job = outcome["job"] = RunningJob(key="k", thread_id=threading.get_ident())
    ready.set()
    try:
        while True:
            try:
                with job.interruptible_phase():
                    sum(range(200))  # the script's work
            except JobCancelled:
                outcome["where"] = "phase"
                break
            try:
                # The server's bookkeeping between phases: nothing may land here.
                for _ in range(50):
                    outcome["bookkeeping"] = outcome.get("bookkeeping", 0) + 1
            except JobCancelled:
                outcome["where"] = "bookkeeping"
                break
        job.leave_phase()
        # After leave_phase, the job's end is safe: spin a little to give a late
        # exception a chance to land.
        for _ in range(20_000):
            pass
        outcome["ended"] = True
    except JobCancelled:
        outcome["where"] = "after the end"


def test_a_cancel_never_lands_in_bookkeeping():
    rng = random.Random(7)
    places = []
    for _ in range(150):
        outcome: dict = {}
        ready = threading.Event()
        thread = threading.Thread(target=_job_thread, args=(outcome, ready))
        thread.start()
        ready.wait()
        time.sleep(rng.random() * 0.002)
        outcome["job"].request_cancel()
        thread.join(10)
        assert not thread.is_alive()
        places.append(outcome.get("where"))
        assert outcome.get("ended"), outcome
        assert not outcome["job"].lock.locked()
    assert set(places) == {"phase"}, places


def test_a_cancel_before_the_phase_stops_it_at_its_start():
    job = RunningJob(key="k", thread_id=threading.get_ident())
    job.request_cancel()
    try:
        with job.interruptible_phase():
            raise AssertionError("the phase must not start")
    except JobCancelled:
        pass
    assert not job.interruptible
