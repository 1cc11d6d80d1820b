"""Which modules a job forgets and a context keeps, on the server's own code (no
cluster): a real ContextCache loading real loader files from a temporary workflow."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from snakemake_executor_context.contexts import make_declaration
from snakemake_executor_context.server.cache import ContextCache
from snakemake_executor_context.server.inventory import ServerStats
from snakemake_executor_context.server.isolation import fresh_modules

LOADER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.dirname(__file__))
    import {module}
    from snakemake_executor_context import declare_size

    def load():
        declare_size(100)
        return {module}.Model()
""")


def _cache(budget: int) -> ContextCache:
    return ContextCache(
        address="tcp://test",
        budget=budget,
        stats=ServerStats(),
        emit=lambda *events: None,
        where="a test",
        gpu_model="cpu",
        memory_in_use=lambda: 0,
    )


def test_a_context_keeps_its_modules_until_evicted_and_a_job_forgets_its_own(tmp_path):
    for name in ("model_a", "model_b", "helper_x"):
        (tmp_path / f"{name}.py").write_text("class Model:\n    pass\n")
    for name in ("a", "b"):
        (tmp_path / f"loader_{name}.py").write_text(LOADER.format(module=f"model_{name}"))
    cache = _cache(budget=150)  # room for one context of 100 bytes
    first = make_declaration("a", "loader_a.py:load", {}, tmp_path)
    second = make_declaration("b", "loader_b.py:load", {}, tmp_path)
    saved_path = list(sys.path)
    try:
        with fresh_modules([str(tmp_path)], cache.owned_modules):
            obj, _, _ = cache.acquire(first)
            import helper_x  # noqa: F401  (imported by "the script": forgotten after the job)
        cache.release(first.identity)
        assert "helper_x" not in sys.modules
        assert isinstance(obj, sys.modules["model_a"].Model)  # kept with its context
        with fresh_modules([str(tmp_path)], cache.owned_modules):
            cache.acquire(second)  # evicts the first context, and its modules with it
        cache.release(second.identity)
        assert "model_a" not in sys.modules and "model_b" in sys.modules
        assert cache.owned_modules() == {"model_b"}
    finally:
        sys.path[:] = saved_path
        for name in ("model_a", "model_b", "helper_x"):
            sys.modules.pop(name, None)


OUTPUT = textwrap.dedent("""
    import os, sys, threading, time
    from snakemake_executor_context.server.output import context_loading, job_output

    log_path, kept = sys.argv[1], sys.argv[2]
    with open(log_path, "wb") as log:
        with job_output("the job", log.fileno()) as leaks:
            with context_loading():  # what a loader starts belongs to its context
                threading.Thread(target=time.sleep, args=(5,), name="model-pool").start()
                model_file = os.open(kept + ".model", os.O_WRONLY | os.O_CREAT)
            threading.Thread(target=time.sleep, args=(5,), name="script-thread").start()
            script_file = os.open(kept + ".script", os.O_WRONLY | os.O_CREAT)
            print("in the job's log")
    print(leaks.threads, [fd.split(" -> ")[1] for fd in leaks.fds])
    os._exit(0)
""")


def test_a_loaders_threads_and_files_are_the_contexts_not_the_jobs_leaks(tmp_path):
    import subprocess

    found = subprocess.run(
        [sys.executable, "-c", OUTPUT, str(tmp_path / "job.log"), str(tmp_path / "kept")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == f"['script-thread'] ['{tmp_path / 'kept.script'}']"
    assert (tmp_path / "job.log").read_text() == "in the job's log\n"


SERVER_FILE = textwrap.dedent("""
    import os, sys, threading
    import snakemake_executor_context.server.output as output

    log_path, bundle, kept = sys.argv[1:4]
    opened, go = {}, threading.Event()
    # A server thread (not the job's) holds the CA bundle open at the instant the job
    # ends, as a TLS context being made does, and has closed it when the end looks again.
    def serve():
        go.wait()
        opened["fd"] = os.open(bundle, 0)
        done.set()

    done = threading.Event()
    threading.Thread(target=serve).start()

    class Clock:
        @staticmethod
        def sleep(seconds):
            os.close(opened["fd"])

    output.time = Clock
    with open(log_path, "wb") as log:
        with output.job_output("the job", log.fileno()) as leaks:
            go.set()
            done.wait()
            script_file = os.open(kept, os.O_WRONLY | os.O_CREAT)
    print([fd.split(" -> ")[1] for fd in leaks.fds])
    os._exit(0)
""")


def test_a_file_a_server_thread_holds_for_an_instant_is_not_the_jobs_leak(tmp_path):
    import subprocess

    bundle = tmp_path / "ca-certificates.crt"
    bundle.write_text("not a certificate")
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVER_FILE,
            str(tmp_path / "job.log"),
            str(bundle),
            str(tmp_path / "kept"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == f"['{tmp_path / 'kept'}']"


TEMPLATE_LOADER = textwrap.dedent("""
    from pathlib import Path
    from snakemake_executor_context import loader, modelcache

    def template():
        return modelcache.cache_root() / "tiny"

    @loader(template=template)
    def load():
        entry = template()
        modelcache.convert_once(entry, lambda into: (into / "w.bin").write_bytes(b"w" * 1000))
        with modelcache.open_entry(entry) as path:
            return (Path(path) / "w.bin").read_bytes()
""")

TEMPLATE_JOB = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from snakemake_executor_context.contexts import make_declaration
    from snakemake_executor_context.server.cache import ContextCache
    from snakemake_executor_context.server.inventory import ServerStats
    from snakemake_executor_context.server.output import job_output

    workdir, log_path, kept = sys.argv[1:4]
    cache = ContextCache(
        address="tcp://test", budget=1 << 30, stats=ServerStats(), emit=lambda *e: None,
        where="a test", gpu_model="cpu", memory_in_use=lambda: 0,
    )
    declaration = make_declaration("tiny", "loader.py:load", {}, Path(workdir))
    with open(log_path, "wb") as log:
        with job_output("the job", log.fileno()) as leaks:
            # The job's first load: the server holds the template in the node's cache
            # from here until the context is evicted (a lock file's descriptor).
            assert cache.acquire(declaration)[0] == b"w" * 1000
            script_file = os.open(kept, os.O_WRONLY | os.O_CREAT)
    print([fd.split(" -> ")[1] for fd in leaks.fds])
    os._exit(0)
""")


def test_the_plugins_hold_of_a_template_is_not_the_jobs_leak(tmp_path):
    """A loader that declares a template: the server's lock of it in the node's cache,
    taken in the job's thread, is the plugin's own descriptor, not the job's leak; a
    file the script keeps open still is."""
    import os
    import subprocess

    (tmp_path / "loader.py").write_text(TEMPLATE_LOADER)
    environment = {
        **os.environ,
        "SNAKEMAKE_CONTEXT_LOCAL_DIR": str(tmp_path / "local"),
        "SNAKEMAKE_CONTEXT_MODEL_CACHE": str(tmp_path / "models"),
    }
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            TEMPLATE_JOB,
            str(tmp_path),
            str(tmp_path / "job.log"),
            str(tmp_path / "kept"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == f"['{tmp_path / 'kept'}']"


def test_a_job_limits_the_thread_pools_a_job_before_it_loaded():
    # The controller of thread pools is found once and kept while no module is
    # imported; a library loaded since (numpy's OpenBLAS, here imported after the first
    # job) must still be limited. A fresh interpreter, so that numpy is not loaded yet.
    code = textwrap.dedent("""
        import sys, threadpoolctl
        from snakemake_executor_context.server.isolation import thread_limits
        assert "numpy" not in sys.modules
        with thread_limits(1, None):
            pass
        import numpy
        with thread_limits(1, None):
            print(sorted(p["num_threads"] for p in threadpoolctl.threadpool_info()))
    """)
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[1]"
