"""A group's result on its server (:mod:`snakemake_executor_context.server.groupjob`):
how its members' ends make the group's, fault included. The members here end as the
server's member runner ends them; real groups run in :mod:`tests.e2e.test_group_attacks`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.jobspec import GroupJobSpec, JobResult, PlainJobSpec
from snakemake_executor_context.server.groupjob import run_group
from snakemake_executor_context.server.running import RunningJob

SERVER = ServerIdentity("cpu0", "host", 1, "tcp://127.0.0.1:1")
DISK = "a full or failing disk (OSError ENOSPC)"


@pytest.mark.parametrize(("fault", "expected"), [(DISK, DISK), ("", "")])
def test_a_groups_fault_is_its_failed_members(tmp_path: Path, fault: str, expected: str) -> None:
    """A member that fails by its server's fault makes the group's failure the
    server's (the black-hole rule counts the group's end, the one its server
    reports); a member's own error leaves the group's its own."""
    members = [
        PlainJobSpec(f"m{i}", f"rule m{i}", "true", str(tmp_path), f"m{i}.log") for i in range(2)
    ]
    spec = GroupJobSpec("g", "group g", str(tmp_path), "g.log", [members[:1], members[1:]])
    ran: list[str] = []

    def run_member(member: PlainJobSpec, group: RunningJob) -> JobResult:
        ran.append(member.key)
        now = time.time()
        ok = member.key == "m0"
        outcome = Outcome(member.key, SERVER, ok=ok, fault="" if ok else fault, started=now)
        return JobResult(outcome.but(finished=now), message=None if ok else f"{member.title}: x")

    running = RunningJob("g", threading.get_ident())
    result = run_group(spec, running, run_member, SERVER, width=1)  # type: ignore[arg-type]
    assert ran == ["m0", "m1"]
    assert not result.outcome.ok and not result.outcome.cancelled
    assert result.outcome.fault == expected
