"""Which processes a job left running (pure decisions over process facts), and ending
them for real in a subreaper: what a job detached is found by its mark, ended, and
reaped by its pid, never another child's exit status taken."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from snakemake_executor_context.strays.decisions import (
    ProcessFacts,
    job_leftovers,
    server_orphans,
    span_leftovers,
    subtree,
)

SERVER = 100
SERVER_CMD = "python -c from multiprocessing.spawn import spawn_main; spawn_main(7)"


def _p(pid, ppid, started=50, **facts) -> ProcessFacts:
    return ProcessFacts(pid=pid, ppid=ppid, started=started, **facts)


def _pids(processes) -> list[int]:
    return sorted(p.pid for p in processes)


def test_a_subtree_is_its_roots_and_everything_below():
    facts = [_p(2, 1), _p(3, 2), _p(4, 3), _p(5, 1)]
    assert subtree(facts, {2}) == {2, 3, 4}
    assert subtree(facts, {9}) == set()


def test_a_plain_jobs_leftovers_are_what_carries_its_mark_wherever_it_went():
    facts = [
        _p(10, SERVER, job="s:job-a"),  # adopted by the server (setsid, double fork)
        _p(11, 1, job="s:job-a"),  # escaped to init (no subreaper)
        _p(12, 10, job="s:job-b"),  # another job's, below one of job-a's
        _p(13, SERVER, job="s:job-a", keep=True),  # a service it keeps
        _p(14, 13, job="s:job-a"),  # below the service: kept with it
        _p(15, SERVER),  # not a plain job's
    ]
    found = job_leftovers(facts, "s:job-a")
    assert _pids(found.end) == [10, 11]
    assert _pids(found.kept) == [13, 14]
    assert not job_leftovers(facts, "s:job-c")


def test_an_in_process_span_leaves_what_started_in_it_and_no_one_elses():
    since = 50
    facts = [
        _p(20, SERVER, started=40),  # older than the span
        _p(21, SERVER, started=50),  # the span's: a double-forked daemon
        _p(22, 21, started=60),  # below it
        _p(23, SERVER, started=45),  # the zygote (owned), older
        _p(24, 23, started=70),  # a plain job forked by the zygote
        _p(25, SERVER, started=70, job="s:plain"),  # a plain job's, adopted by the server
        _p(26, 25, started=71),  # below it, its mark cleared
        _p(27, SERVER, started=72),  # a gang rank started during the span (owned)
        _p(28, SERVER, started=73, keep=True),  # a service the span's job keeps
        _p(29, SERVER, started=74, zombie=True),  # an orphan that ended by itself
        _p(30, SERVER, started=30, zombie=True),  # a kept one that ended since
        _p(31, 20, started=30, zombie=True),  # not the server's to reap
        _p(32, SERVER, started=75, zombie=True),  # a plain job's launcher (owned)
        _p(33, SERVER, started=76),  # multiprocessing's forkserver (spared)
        _p(34, 33, started=77),  # a pool's worker it forked: the job's
    ]
    owned = {(23, 45), (27, 72), (32, 75)}
    found = span_leftovers(facts, since, owned, server=SERVER, spared={(33, 76)})
    assert _pids(found.end) == [21, 22, 29, 30, 34]
    assert _pids(found.kept) == [28]
    # An owned identity names a process only with its start: a reused pid is not it.
    assert 27 in _pids(span_leftovers(facts, since, owned={(27, 1)}, server=SERVER).end)


def test_what_a_dead_server_left_is_told_from_the_other_servers():
    server = _p(SERVER, 1, started=30, command=SERVER_CMD)
    cluster = 1
    facts = [
        _p(40, cluster, started=10, command="python -m resource_tracker"),  # the cluster's
        _p(41, cluster, started=35, command=SERVER_CMD),  # another server (its own)
        _p(42, cluster, started=36, server="c:cpu0"),  # the dead server's zygote
        _p(43, 42, started=37, server="c:cpu0"),  # a plain job's daemon below it
        _p(44, cluster, started=38, command=SERVER_CMD),  # a fork of it without exec
        _p(45, cluster, started=39, server="c:cpu1"),  # another server's orphan
        _p(46, cluster, started=40, server="c:cpu0", keep=True),  # kept: goes too
        _p(47, cluster, started=41, zombie=True),  # its orphan that ended by itself
        _p(48, cluster, started=20, command=SERVER_CMD),  # older than it: not its
        _p(49, 41, started=42, server="c:cpu1"),  # below another server
    ]
    found = server_orphans(facts, cluster, "c:cpu0", server, own={41})
    assert _pids(found.end) == [42, 43, 44, 46, 47]
    assert not found.kept
    # Without its process's facts, only what carries its mark.
    assert _pids(server_orphans(facts, cluster, "c:cpu0", None, own={41}).end) == [42, 43, 46]


# --------------------------------------------------------------------------------------
# For real, in a subreaper of its own (never this test process: every orphan of the
# session would come to it).

SUBREAPER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from snakemake_executor_context.defaults import JOB_MARK_VARIABLE, KEEP_VARIABLE
    from snakemake_executor_context.strays.decisions import job_leftovers
    from snakemake_executor_context.strays.processes import (
        become_subreaper, end_leftovers, is_subreaper, pid_alive, read_processes,
    )

    assert become_subreaper() and is_subreaper()
    mark = {JOB_MARK_VARIABLE: "test:job-1"}
    # The job's status, which a reaper waiting on any child would take.
    failing = subprocess.Popen(["sh", "-c", "exit 3"])
    # Detached: a shell whose child sleeps (they end in turn: the sleep is reparented
    # here as a zombie), and a sleep.
    job = subprocess.Popen(
        ["sh", "-c", "setsid sh -c 'sleep 61; true' >/dev/null 2>&1 & sleep 62 >/dev/null &"],
        env={**os.environ, **mark},
    )
    job.wait()
    kept = subprocess.Popen(
        ["setsid", "-f", "sleep", "63"], env={**os.environ, **mark, KEEP_VARIABLE: "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    kept.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = job_leftovers(read_processes(os.getpid()), "test:job-1")
        # Once every fork has exec'd its command.
        commands = sorted(p.command for p in found.end)
        if commands == ["sh -c sleep 61; true", "sleep 61", "sleep 62"] and found.kept:
            break
        time.sleep(0.02)
    ended = end_leftovers(found.end, grace=2.0)
    print(json.dumps({
        "me": os.getpid(),
        "ended": [[p.pid, p.ppid, p.command] for p in ended],
        "kept": [[p.pid, p.command] for p in found.kept],
        "alive": [pid_alive(p.pid) for p in ended],
        "zombies": [p.pid for p in read_processes(os.getpid()) if p.zombie],
        "failing_pid": failing.pid,
        "failing": failing.wait(),
    }))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's")
def test_what_a_job_detached_comes_back_to_a_subreaper_and_is_ended_there():
    done = subprocess.run(
        [sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    kept = result["kept"]
    try:
        ended = {cmd: ppid for _, ppid, cmd in result["ended"]}
        assert sorted(ended) == ["sh -c sleep 61; true", "sleep 61", "sleep 62"]
        # Reparented to the subreaper when their shell ended, not to init.
        assert ended["sleep 62"] == ended["sh -c sleep 61; true"] == result["me"]
        assert result["alive"] == [False, False, False]
        # Each reaped, the sleep too (reparented to it as its shell ended): the only
        # zombie left is the job's own child, whose status is still to be read.
        assert result["zombies"] == [result["failing_pid"]]
        assert len(kept) == 1 and "sleep 63" in kept[0][1]
        # Reaped by its pid only: the job's own child still tells its status.
        assert result["failing"] == 3
    finally:
        for pid, _ in kept:
            subprocess.run(["kill", str(pid)], check=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_the_kernels_lists_of_children_and_a_scan_of_proc_agree(monkeypatch):
    """The processes below one are read from the kernel's per-thread lists of children
    where it keeps them, else from a scan of every process: the same answer."""
    from snakemake_executor_context.strays import processes

    tree = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 31 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(processes.read_processes(tree.pid)) < 2:
            assert time.monotonic() < deadline, processes.read_processes(tree.pid)
            time.sleep(0.02)
        listed = processes.read_processes(os.getpid())
        monkeypatch.setattr(processes, "_below", lambda root, pruned: None)
        scanned = processes.read_processes(os.getpid())
        assert [p.identity for p in scanned] == [p.identity for p in listed]
        assert {p.command for p in scanned} >= {"sleep 30", "sleep 31"}
    finally:
        processes.stop_tree(tree.pid, grace=0)
        tree.wait()


def test_a_process_group_is_killed_whole_and_a_gone_one_is_no_error():
    from snakemake_executor_context.strays.processes import kill_process_group

    group = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 31 & wait"], process_group=0)
    try:
        deadline = time.monotonic() + 10
        while len(_group_members(group.pid)) < 3:
            assert time.monotonic() < deadline, _group_members(group.pid)
            time.sleep(0.02)
        assert kill_process_group(group.pid) is True
        assert group.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while _group_members(group.pid):  # the sleeps too, not only their shell
            assert time.monotonic() < deadline, _group_members(group.pid)
            time.sleep(0.02)
    finally:
        if group.poll() is None:
            group.kill()
            group.wait()
    # A group whose last process is gone and reaped (ESRCH): told, not raised.
    assert kill_process_group(_reaped_group()) is False
    if os.getuid() != 0:
        # Another user's group (init's; EPERM): told, not raised; signal 0 sends nothing.
        assert kill_process_group(1, 0) is False


def _reaped_group() -> int:
    """The pid of a process group that existed and is gone, its leader reaped."""
    leader = subprocess.Popen(["true"], process_group=0)
    leader.wait()
    return leader.pid


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    import psutil

    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (OSError, psutil.Error):
            pass
    return members


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_leftover_caught_between_fork_and_exec_is_named_by_what_it_execs():
    """A job's double fork, swept while its grandchild was still a copy of the server
    (forked, not yet exec'd), was named as the server in CI: it is named by what it
    becomes, as the job's log should say."""
    from snakemake_executor_context.strays.processes import end_leftovers, facts_of

    child = os.fork()
    if child == 0:  # pragma: no cover - the child only sleeps, then execs
        try:
            time.sleep(0.05)
            os.execvp("sleep", ["sleep", "300"])
        finally:
            os._exit(1)
    try:
        caught = facts_of(child)
        assert caught is not None
        own = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").strip()
        assert caught.command == own.decode(errors="replace"), "not caught before the exec"
        (ended,) = end_leftovers([caught], grace=5.0)
        assert ended.command == "sleep 300", ended.describe()
        assert ended.identity == caught.identity
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_what_is_below_a_pruned_process_is_not_read_and_the_rest_is():
    """A server's sweep prunes its own processes (its zygote and what it forked): what
    a job left beside them is still found, however deep."""
    from snakemake_executor_context.strays import processes

    own = subprocess.Popen(["sh", "-c", "sleep 32 & wait"])
    job = subprocess.Popen(["sh", "-c", "sh -c 'sleep 33 & wait' & wait"])
    try:
        deadline = time.monotonic() + 10
        wanted = {"sleep 32", "sleep 33", "sh -c sleep 33 & wait"}
        while wanted - {p.command for p in processes.read_processes(os.getpid())}:
            assert time.monotonic() < deadline, processes.read_processes(os.getpid())
            time.sleep(0.02)
        everything = processes.read_processes(os.getpid())
        own_identity = next(p.identity for p in everything if p.pid == own.pid)
        pruned = processes.read_processes(os.getpid(), {own_identity})
        commands = {p.command for p in pruned}
        assert "sleep 32" not in commands and own.pid not in {p.pid for p in pruned}
        assert wanted - {"sleep 32"} <= commands
        below_own = subtree(everything, {own.pid})
        assert [p for p in everything if p.pid not in below_own] == pruned
    finally:
        for tree in (own, job):
            processes.stop_tree(tree.pid, grace=0)
            tree.wait()


SPANS = textwrap.dedent("""
    import json, os, signal, subprocess, sys, threading, time
    from types import SimpleNamespace
    from snakemake_executor_context.strays.jobsweep import JobSpans
    from snakemake_executor_context.strays.processes import become_subreaper

    assert become_subreaper()
    spans = JobSpans("a test", lambda *events: None)
    job = SimpleNamespace(key="job")
    # Started before any span (a clock tick before), no one's own: swept only once
    # it has ended.
    before = subprocess.Popen(["sleep", "60"])
    time.sleep(0.05)

    def span(work):
        spans.enter(job)
        work()
        sweep = spans.leave(job)
        return sorted(p.command for p in sweep.found.end) if sweep else []

    def daemon():  # a double fork: the sleep comes back to this subreaper
        detach = "import subprocess; subprocess.Popen(['sleep', '61'], start_new_session=True)"
        subprocess.run([sys.executable, "-c", detach], check=True)  # once it has exec'd

    def a_thread():  # a task too, but no process: nothing left
        threading.Thread(target=time.sleep, args=(0.01,)).start()

    def end_the_earlier_child():
        os.kill(before.pid, signal.SIGKILL)
        while open(f"/proc/{before.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)

    found = [span(lambda: None), span(daemon), span(a_thread), span(end_the_earlier_child)]
    reaped = not os.path.exists(f"/proc/{before.pid}")
    print(json.dumps([*found, span(lambda: None), reaped]))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's")
def test_a_span_is_swept_of_what_it_started_and_of_a_child_that_ended_in_it():
    done = subprocess.run([sys.executable, "-c", SPANS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[], ["sleep 61"], [], ["[sleep]"], [], True]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_watch_sees_every_task_started_and_says_none_only_when_it_can_prove_it():
    import threading

    from snakemake_executor_context.strays.processes import TaskWatch

    def started(start) -> bool:
        watch = TaskWatch()
        start()
        try:
            return not watch.none_since()
        finally:
            watch.close()

    stop = threading.Event()
    assert started(lambda: threading.Thread(target=stop.wait).start())
    assert started(lambda: subprocess.run(["true"], check=True))
    # Nothing started: proved at least once (another user's process may start between).
    proved = False
    for _ in range(100):
        threading.Thread(target=stop.wait).start()  # the last pid's task, alive
        if not started(lambda: None):
            proved = True
            break
    stop.set()
    assert proved or not hasattr(os, "pidfd_open")
