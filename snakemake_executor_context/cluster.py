"""The Dask cluster: the embedded one of a run, a persistent one (`up`/`down`), attaching.

A local cluster always runs in a process of its own (``python -m
snakemake_executor_context.cluster serve``), in a new session: a terminal's Ctrl-C
reaches only the Snakemake process, which then stops the jobs and the cluster in
order; Dask's nannies never touch Snakemake's own environment; and one kill of the
process group removes everything the cluster started. The cluster writes three files
side by side: the scheduler file ``X.json`` (Dask's), ``X.pid`` (what it runs) and
``X.log`` (its log, and its servers').
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ClusterError, VersionSkewError
from .gpus import GpuInfo, discover_gpus
from .placement import ServerView, server_resources

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "ClusterFiles",
    "Engine",
    "LocalClusterProcess",
    "ServerPlan",
    "plan_servers",
]

SERVE_MODULE = "snakemake_executor_context.cluster"

#: Dask settings of every context server. A loaded model must not make Dask pause
#: (80% of memory) or kill (95%) its server, nor spill it: all four thresholds off.
SERVER_DASK_CONFIG: dict[str, Any] = {
    "distributed.worker.memory.target": False,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
    # Servers run user code that may use multiprocessing: not daemonic.
    "distributed.worker.daemon": False,
    "distributed.worker.profile.enabled": False,
    # Dask's default pins OMP/MKL/OpenBLAS to 1 thread in workers (jobs set their own)
    # and sets MALLOC_TRIM_THRESHOLD_=65536, which made SmolLM2 scoring 20-25% slower
    # here (50 -> 60 ms per claim): a model's forward passes allocate and free a lot.
    "distributed.nanny.pre-spawn-environ": {},
}


@dataclass(frozen=True)
class ServerPlan:
    """One server a local cluster starts."""

    name: str
    memory_bytes: int
    gpu: GpuInfo | None = None
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def plan_servers(
    gpus: Sequence[GpuInfo], cpu_servers: int | None, total_memory: int, cpu_count: int
) -> list[ServerPlan]:
    """One server per GPU (pinned by UUID), or ``cpu_servers`` CPU servers that stand
    in for ``gpu=1`` when the machine has no GPU. Memory is shared out evenly."""
    if gpus:
        share = total_memory // len(gpus)
        return [
            ServerPlan(
                name=gpu.server_name,
                memory_bytes=share,
                gpu=gpu,
                resources=server_resources(share, [gpu]),
                env={"CUDA_VISIBLE_DEVICES": gpu.uuid},
            )
            for gpu in gpus
        ]
    count = cpu_servers if cpu_servers else max(1, min(4, cpu_count))
    if count < 1:
        raise ClusterError(f"--context-servers must be at least 1, got {count}.")
    share = total_memory // count
    return [
        ServerPlan(
            name=f"cpu{index}",
            memory_bytes=share,
            resources=server_resources(share, stand_in_gpus=1),
            env={"CUDA_VISIBLE_DEVICES": ""},
        )
        for index in range(count)
    ]


@dataclass(frozen=True)
class ClusterFiles:
    """The scheduler file of a local cluster and its siblings."""

    scheduler_file: Path

    @property
    def pid_file(self) -> Path:
        """What the cluster process writes once its servers are up."""
        return self.scheduler_file.with_suffix(".pid")

    @property
    def log_file(self) -> Path:
        """The log of the cluster process and its servers."""
        return self.scheduler_file.with_suffix(".log")

    @property
    def catalog_file(self) -> Path:
        """The default catalog of a persistent cluster (``X.db``)."""
        return self.scheduler_file.with_suffix(".db")

    def read_info(self) -> dict[str, Any] | None:
        """The cluster process's record, or None if it is not (yet) written."""
        try:
            return dict(json.loads(self.pid_file.read_text()))
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the scheduler and pid files (the log stays)."""
        for path in (self.scheduler_file, self.pid_file):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


# ------------------------------------------------------------------------------------
# The cluster process.


def serve(argv: Sequence[str] | None = None) -> int:
    """Run a local cluster until it is shut down, idle too long, or orphaned."""
    parser = argparse.ArgumentParser(prog=f"python -m {SERVE_MODULE} serve")
    parser.add_argument("--scheduler-file", type=Path, required=True)
    parser.add_argument("--servers", type=int, default=None)
    parser.add_argument("--memory-budget", default="0.8")
    parser.add_argument("--idle-timeout", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--catalog", default=None)
    args = parser.parse_args(argv)

    import dask
    import psutil
    from distributed import Nanny, Scheduler, SpecCluster

    from .catalog.plugin import CatalogSchedulerPlugin
    from .server import ContextServerPlugin, ServerConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    dask.config.set(SERVER_DASK_CONFIG)
    files = ClusterFiles(args.scheduler_file.resolve())
    files.remove()
    plans = plan_servers(
        discover_gpus(), args.servers, psutil.virtual_memory().total, os.cpu_count() or 1
    )
    scheduler_options: dict[str, Any] = {
        # Dask always serves HTTP (metrics); a random loopback port avoids clashes.
        "host": args.host,
        "port": 0,
        "dashboard": False,
        "dashboard_address": f"{args.host}:0",
        "scheduler_file": str(files.scheduler_file),
        # The fleet's event hub; with --catalog, the catalog's one writer.
        "plugins": [CatalogSchedulerPlugin(catalog=args.catalog)],
    }
    if args.idle_timeout > 0:
        scheduler_options["idle_timeout"] = args.idle_timeout
    workers = {
        plan.name: {
            "cls": Nanny,
            "options": {
                "name": plan.name,
                "host": args.host,
                "nthreads": 1,
                "memory_limit": plan.memory_bytes,
                "resources": plan.resources,
                "env": plan.env,
                "silence_logs": logging.WARNING,
                "plugins": (
                    ContextServerPlugin(
                        ServerConfig(
                            name=plan.name,
                            memory_budget=args.memory_budget,
                            gpu=asdict(plan.gpu) if plan.gpu else None,
                            memory_bytes=plan.memory_bytes,
                        )
                    ),
                ),
            },
        }
        for plan in plans
    }
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    cluster = SpecCluster(
        workers=workers,
        scheduler={"cls": Scheduler, "options": scheduler_options},
        silence_logs=False,
        name="snakemake-context",
    )
    info = {
        "pid": os.getpid(),
        "address": cluster.scheduler_address,
        "servers": [
            {
                "name": plan.name,
                "gpu": asdict(plan.gpu) if plan.gpu else None,
                "resources": plan.resources,
            }
            for plan in plans
        ],
        "started": time.time(),
        "catalog": args.catalog,
    }
    files.pid_file.write_text(json.dumps(info, indent=1))
    logging.info("context cluster up at %s with %d servers", info["address"], len(plans))
    try:
        while not stop.wait(0.5):
            if cluster.scheduler is None or cluster.scheduler.status.name in ("closing", "closed"):
                logging.info("scheduler closed: stopping")
                break
            if args.parent_pid and os.getppid() != args.parent_pid:
                logging.info("the Snakemake process %d is gone: stopping", args.parent_pid)
                break
    finally:
        try:
            cluster.close(timeout=10)
        except Exception as error:  # the scheduler closed first (idle timeout)
            logging.info("closing the cluster: %s", error)
        _kill_children()
        files.remove()
    return 0


# ------------------------------------------------------------------------------------
# Client side.


class LocalClusterProcess:
    """A local cluster in a process (and session) of its own."""

    def __init__(
        self, files: ClusterFiles, process: subprocess.Popen[bytes] | None, pid: int
    ) -> None:
        self.files = files
        self.process = process
        self.pid = pid

    @classmethod
    def start(
        cls,
        scheduler_file: Path,
        *,
        servers: int | None,
        memory_budget: str,
        timeout: float,
        idle_timeout: float = 0.0,
        parent_pid: int = 0,
        host: str = "127.0.0.1",
        catalog: str | None = None,
    ) -> LocalClusterProcess:
        """Start the cluster process and wait until its servers are up."""
        files = ClusterFiles(scheduler_file.resolve())
        files.scheduler_file.parent.mkdir(parents=True, exist_ok=True)
        files.remove()
        command = [
            sys.executable,
            "-m",
            SERVE_MODULE,
            "serve",
            "--scheduler-file",
            str(files.scheduler_file),
            "--memory-budget",
            str(memory_budget),
            "--idle-timeout",
            str(idle_timeout),
            "--parent-pid",
            str(parent_pid),
            "--host",
            host,
        ]
        if servers:
            command += ["--servers", str(servers)]
        if catalog:
            command += ["--catalog", catalog]
        with open(files.log_file, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while files.read_info() is None:
            if process.poll() is not None:
                raise ClusterError(
                    f"The local context cluster exited with status {process.returncode} "
                    f"while starting. Its log {files.log_file} ends:\n{_tail(files.log_file)}"
                )
            if time.monotonic() > deadline:
                _kill_group(process.pid)
                raise ClusterError(
                    f"The local context cluster did not start within {timeout:g} s "
                    f"(--context-connect-timeout). Its log {files.log_file} ends:\n"
                    f"{_tail(files.log_file)}"
                )
            time.sleep(0.05)
        return cls(files, process, process.pid)

    @classmethod
    def find(cls, scheduler_file: Path) -> LocalClusterProcess | None:
        """The cluster process behind a scheduler file, if it runs."""
        files = ClusterFiles(scheduler_file.resolve())
        info = files.read_info()
        if info is None or not _alive(int(info["pid"])):
            return None
        return cls(files, None, int(info["pid"]))

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the cluster down: SIGTERM (it closes its servers), then kill its group."""
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
        if not self._wait(timeout):
            _kill_group(self.pid)
            self._wait(5)
        self.files.remove()

    def kill(self) -> None:
        """Kill the cluster's whole process group at once (Ctrl-C of its run)."""
        _kill_group(self.pid)
        self._wait(10)
        self.files.remove()

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None:
                if self.process.poll() is not None:
                    return True
            elif not _alive(self.pid):
                return True
            time.sleep(0.05)
        return False


class Engine:
    """The executor's handle on Dask: a client, and the local cluster if it owns one."""

    def __init__(self, client: Client, local: LocalClusterProcess | None, description: str) -> None:
        self.client = client
        self.local = local
        self.description = description
        self.closed = False

    @property
    def embedded(self) -> bool:
        """Whether this run started the cluster (and stops it at the end)."""
        return self.local is not None

    @classmethod
    def start_embedded(
        cls, scheduler_file: Path, *, servers: int | None, memory_budget: str, timeout: float
    ) -> Engine:
        """Start a cluster for this run."""
        local = LocalClusterProcess.start(
            scheduler_file,
            servers=servers,
            memory_budget=memory_budget,
            timeout=timeout,
            parent_pid=os.getpid(),
        )
        try:
            client = _connect(scheduler_file=local.files.scheduler_file, timeout=timeout)
        except BaseException:
            local.stop()
            raise
        return cls(client, local, f"embedded cluster ({local.files.log_file})")

    @classmethod
    def attach(cls, *, address: str | None, scheduler_file: Path | None, timeout: float) -> Engine:
        """Attach to a running scheduler; it keeps running after the run."""
        client = _connect(address=address, scheduler_file=scheduler_file, timeout=timeout)
        engine = cls(client, None, f"cluster at {client.scheduler.address}")
        try:
            engine.check_versions()
        except BaseException:
            client.close()
            raise
        return engine

    def servers(self) -> list[ServerView]:
        """The servers connected now, with the resources they advertise."""
        info = self.client.scheduler_info(n_workers=-1)
        return [
            ServerView(
                name=str(w.get("name", address)),
                address=address,
                resources=dict(w.get("resources") or {}),
                slots=int(w.get("nthreads") or 1),
            )
            for address, w in info.get("workers", {}).items()
        ]

    def check_versions(self) -> None:
        """Refuse servers whose Python, snakemake, plugin or distributed differ."""
        from .server import server_versions

        mine = server_versions()
        try:
            theirs = self.client.run(server_versions, on_error="return")
        except Exception as error:
            raise ClusterError(f"Could not ask the servers for their versions: {error}") from error
        skewed = {}
        for address, versions in theirs.items():
            if isinstance(versions, BaseException):
                raise VersionSkewError(
                    f"Server {address} cannot run this plugin's code "
                    f"({type(versions).__name__}: {versions}). Fix: install "
                    "snakemake-executor-plugin-context in the servers' Python environment "
                    f"(client versions: {_format_versions(mine)})."
                )
            if versions != mine:
                skewed[address] = versions
        if skewed:
            lines = "\n".join(f"  {addr}: {_format_versions(v)}" for addr, v in skewed.items())
            raise VersionSkewError(
                "The attached servers run other versions than this client:\n"
                f"  client: {_format_versions(mine)}\n{lines}\n"
                "Fix: install the same versions of Python, snakemake, "
                "snakemake-executor-plugin-context and distributed on both sides, then "
                "restart the servers (snakemake-context down; snakemake-context up)."
            )

    def inventories(self, timeout: float = 10.0) -> dict[str, Any]:
        """Every server's inventory, by address (servers that fail are left out)."""
        from .server import server_inventory

        try:
            result = self.client.run(server_inventory, on_error="return")
        except Exception:
            return {}
        return {addr: inv for addr, inv in result.items() if isinstance(inv, dict)}

    def kill(self) -> None:
        """Disconnect and kill the embedded cluster with everything it runs."""
        self.closed = True
        try:
            self.client.close(timeout=2)
        except Exception:
            pass
        if self.local is not None:
            self.local.kill()

    def close(self) -> None:
        """Disconnect; stop the embedded cluster too."""
        if self.closed:
            return
        self.closed = True
        try:
            self.client.close(timeout=5)
        except Exception:
            pass
        if self.local is not None:
            self.local.stop()


def _connect(
    *, address: str | None = None, scheduler_file: Path | None = None, timeout: float
) -> Client:
    from distributed import Client

    target = address or str(scheduler_file)
    if scheduler_file is not None and address is None and not Path(scheduler_file).exists():
        raise ClusterError(
            f"Scheduler file {scheduler_file} does not exist. Fix: start a cluster with "
            f"`snakemake-context up --scheduler-file {scheduler_file}`, or drop "
            "--context-scheduler-file to use an embedded cluster."
        )
    try:
        if address is not None:
            return Client(address, timeout=timeout, set_as_default=False)
        return Client(scheduler_file=str(scheduler_file), timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise ClusterError(
            f"Could not reach the Dask scheduler at {target} within {timeout:g} s "
            f"({type(error).__name__}: {error}). Fix: check the address, start a cluster "
            "with `snakemake-context up`, or drop --context-scheduler-address/-file to use "
            "an embedded cluster."
        ) from error


def _format_versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in versions.items())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _kill_children() -> None:
    """Kill what is left of this process's descendants (servers, their jobs)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=5)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2:]))
    print(f"usage: python -m {SERVE_MODULE} serve --scheduler-file FILE ...", file=sys.stderr)
    sys.exit(2)
