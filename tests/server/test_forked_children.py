"""A child a job forks from a server's thread is a script's child from its first
instruction: a signal that reaches it while it still starts ends it as it would a
script's, never runs the server's handler, and is never lost.

Each case runs in a process of its own: fork handlers cannot be unregistered."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

# A server's process (prepare_server_process, SIGTERM drains it), a child slow to
# start (a fork handler registered before the server's: under load a child may not
# run at all for a while) and a job thread that terminates the child at once, as a
# Pool's __exit__ does with a worker that has not run yet. Prints the child's exit
# code, or "alive" and whether the server's handler ran in it.
SLOW_CHILD = textwrap.dedent("""
    import multiprocessing
    import os
    import signal
    import sys
    import threading
    import time

    from snakemake_executor_context.server.processwide import prepare_server_process

    how = sys.argv[1]
    drained = sys.argv[2]

    def starting():
        if how == "signalled while starting":  # as early as a handler can be
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            time.sleep(0.5)

    os.register_at_fork(after_in_child=starting)
    prepare_server_process()
    signal.signal(signal.SIGTERM, lambda *_: open(drained, "w").write("drained"))

    def job():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        if how == "terminated while starting":
            child.terminate()
        child.join(10)
        if child.exitcode is None:
            print("alive, the server's handler ran:", os.path.exists(drained), flush=True)
            child.kill()
            child.join()
        else:
            print(child.exitcode, flush=True)

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
""")


def _child_ends(how: str, tmp_path) -> str:
    run = subprocess.run(
        [sys.executable, "-c", SLOW_CHILD, how, str(tmp_path / "drained")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_child_terminated_while_it_starts_dies_as_a_scripts_child(tmp_path):
    assert _child_ends("terminated while starting", tmp_path) == str(-signal.SIGTERM)
    assert not (tmp_path / "drained").exists()


def test_a_signal_a_child_gets_before_its_handlers_are_reset_waits_for_them(tmp_path):
    assert _child_ends("signalled while starting", tmp_path) == str(-signal.SIGTERM)
    assert not (tmp_path / "drained").exists()
