"""The executor's connection to a Dask cluster: a client, and the local cluster if the
run owns one (the embedded cluster)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError, VersionSkewError
from ..fleet.losses import signal_name
from .attach import AttachTarget, probe, resolve_target
from .process import LocalClusterProcess

if TYPE_CHECKING:
    from distributed import Client

    from ..server.inventory import ServerInventory

__all__ = ["CALL_TIMEOUT", "ClusterConnection"]

#: Seconds a call to the scheduler or the servers may take before it is given up
#: (a server that dies mid-call must not block the executor's status loop).
CALL_TIMEOUT = 30.0

logger = logging.getLogger(__name__)


class ClusterConnection:
    """The executor's handle on Dask: a client, and the local cluster if it owns one
    (named for what it is: not SQLAlchemy's ``Engine``)."""

    def __init__(
        self,
        client: Client,
        local: LocalClusterProcess | None,
        description: str,
        warning: str | None = None,
    ) -> None:
        self.client = client
        self.local = local
        self.description = description
        #: What to say once about this connection (a plaintext scheduler), or None.
        self.warning = warning
        self.closed = False
        self._client_closed = False

    @property
    def embedded(self) -> bool:
        """Whether this run started the cluster (and stops it at the end)."""
        return self.local is not None

    def start_steps(self) -> dict[str, float]:
        """When each step of the embedded cluster's start ended ("cluster imports",
        "cluster certificates", ...), as its process recorded them; {} when attached."""
        if self.local is None:
            return {}
        info = self.local.files.read_info()
        recorded = info.steps if info else {}
        return {f"cluster {name}": float(at) for name, at in recorded.items()}

    def pool_kinds(self) -> list[dict[str, Any]]:
        """The kinds of pilot of the cluster's pool of a batch system ([] without one)."""
        if self.local is not None:
            from ..pilots.request import PilotOptions

            info = self.local.files.read_info()
            pilots = info.pilots if info else None
            return PilotOptions.from_json(json.dumps(pilots)).kind_summaries() if pilots else []
        try:
            books = self.client.get_metadata(["snakemake-context", "pool"], default=None)
        except Exception as error:  # an older cluster: no pool
            logger.debug("no pool metadata: %r", error)
            return []
        from ..fleet.pilotbook import PoolBooks

        found = PoolBooks.from_wire(books)
        return [dict(kind) for kind in found.kinds] if found is not None else []

    @classmethod
    def start_embedded(
        cls,
        scheduler_file: Path,
        *,
        servers: int | None,
        memory_budget: str,
        timeout: float,
        tls: bool = True,
        catalog: str | None = None,
        extra_args: Sequence[str] = (),
        meanwhile: Callable[[], object] | None = None,
    ) -> ClusterConnection:
        """Start a cluster for this run (TLS unless ``tls=False``, for benchmarks;
        ``catalog``: the run's catalog, which the cluster's hub writes; ``extra_args``:
        a pool of pilots; ``meanwhile``: this process's work while the cluster starts,
        as :meth:`LocalClusterProcess.start` runs it)."""
        local = LocalClusterProcess.start(
            scheduler_file,
            servers=servers,
            memory_budget=memory_budget,
            timeout=timeout,
            parent_pid=os.getpid(),
            catalog=catalog,
            extra_args=extra_args,
            own_directory=True,
            tls=tls,
            meanwhile=meanwhile,
        )
        try:
            target = resolve_target(
                address=None, scheduler_file=local.files.scheduler_file, allow_plaintext=not tls
            )
            client = _connect(target, timeout=timeout)
        except BaseException:
            local.stop()
            raise
        return cls(client, local, f"embedded cluster ({local.files.log_file})")

    @classmethod
    def attach(
        cls,
        *,
        address: str | None,
        scheduler_file: Path | None,
        timeout: float,
        credentials: Path | None = None,
        allow_plaintext: bool = False,
    ) -> ClusterConnection:
        """Attach to a running scheduler; it keeps running after the run. A plaintext
        one only with ``allow_plaintext`` (the connection's ``warning`` says so)."""
        target = resolve_target(
            address=address,
            scheduler_file=scheduler_file,
            credentials=credentials,
            allow_plaintext=allow_plaintext,
        )
        probe(target, timeout)
        client = _connect(target, timeout=timeout)
        connection = cls(
            client, None, f"cluster at {client.scheduler.address}", warning=target.warning
        )
        try:
            connection.check_versions()
        except BaseException:
            client.close()
            raise
        return connection

    def scheduler_gone(self) -> str | None:
        """Why the cluster's scheduler is gone, if it is: the embedded cluster's
        process ended (it holds the scheduler), or the client gave up reconnecting to
        an attached one. None while it runs. Cheap: called at every status check."""
        if self.closed:
            return None
        process = self.local.process if self.local is not None else None
        if process is not None and process.poll() is not None:
            code = process.returncode
            how = f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
            log = self.local.files.log_file if self.local is not None else "?"
            return f"the embedded cluster's process (pid {process.pid}) was {how}; its log: {log}"
        if self.client.status in ("closed", "closing", "failed") and not self._client_closed:
            return f"the client lost its connection to {self.description} and gave up"
        return None

    def scheduler_gone_within(self, patience: float) -> str | None:
        """:meth:`scheduler_gone`, waiting up to ``patience`` seconds for the embedded
        cluster's process to be seen ended while the client has lost its connection.
        Dask cancels every future as the scheduler's connection closes, a moment
        before the killed process can be reaped: a cancelled future is then the
        scheduler's death, not the job's. No wait for an attached cluster (its
        client reconnects) or while the client is connected."""
        deadline = time.monotonic() + patience
        while True:
            why = self.scheduler_gone()
            connected = self.client.status == "running"
            # Closed: this run stopped the cluster itself (Ctrl-C); nothing died.
            if why is not None or self.closed or self.local is None or connected:
                return why
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def abandon_client(self) -> None:
        """Close the client at once, without waiting for a scheduler that is gone (no
        reconnection attempts, none of their tracebacks)."""
        self._client_closed = True
        try:
            self.client.close(timeout=1)
        except Exception as error:
            logger.debug("closing the client of a lost scheduler: %r", error)

    def workers(self) -> dict[str, dict[str, Any]]:
        """The workers Dask lists now, by address: name, resources and threads (for
        checking the fleet state's membership, which comes from the hub's events)."""
        client = self.client
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=CALL_TIMEOUT)
        return {
            address: {
                "name": str(w.get("name", address)),
                "resources": dict(w.get("resources") or {}),
                "slots": int(w.get("nthreads") or 1),
            }
            for address, w in info.get("workers", {}).items()
        }

    def check_versions(self) -> None:
        """Refuse servers whose Python, snakemake, plugin or distributed differ."""
        from ..server.calls import server_versions

        mine = server_versions()
        try:
            theirs = self.run(server_versions)
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

    def inventories(self, timeout: float = 10.0) -> dict[str, ServerInventory]:
        """Every server's inventory, by address (servers that fail, or answer with
        something else, are left out)."""
        from ..server.calls import server_inventory
        from ..server.inventory import ServerInventory

        try:
            result = self.run(server_inventory, timeout=timeout)
        except Exception as error:
            logger.debug("no inventories from the servers: %r", error)
            return {}
        found = {}
        for address, wire in result.items():
            try:
                found[address] = ServerInventory.from_wire(wire)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                logger.debug("%s: no inventory (%r)", address, error)
        return found

    def run(self, function: Any, *args: Any, timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
        """``Client.run`` on every server (errors returned, not raised), given up after
        ``timeout`` seconds (TimeoutError)."""
        client = self.client
        return dict(
            client.sync(client._run, function, *args, on_error="return", callback_timeout=timeout)
        )

    def kill(self) -> None:
        """Disconnect and kill the embedded cluster with everything it runs."""
        self.closed = True
        try:
            self.client.close(timeout=2)
        except Exception as error:
            logger.debug("closing the client: %r", error)
        if self.local is not None:
            self.local.kill()

    def close(self) -> None:
        """Disconnect; stop the embedded cluster too."""
        if self.closed:
            return
        self.closed = True
        if not self._client_closed:
            try:
                self.client.close(timeout=5)
            except Exception as error:
                logger.debug("closing the client: %r", error)
        if self.local is not None:
            self.local.stop()


def _connect(target: AttachTarget, *, timeout: float) -> Client:
    from distributed import Client
    from distributed.comm.core import FatalCommClosedError

    try:
        return Client(
            target.address, security=target.security, timeout=timeout, set_as_default=False
        )
    except FatalCommClosedError as error:
        where = target.credentials.directory if target.credentials else "(none)"
        raise ClusterError(
            f"{target.setting}: the credentials in {where} do not match the server at "
            f"{target.address} ({error}). Fix: use the credentials beside that cluster's "
            "scheduler file (--context-credentials DIR)."
        ) from None
    except (OSError, TimeoutError) as error:
        raise ClusterError(
            f"{target.setting}: could not reach the Dask scheduler at {target.address} within "
            f"{timeout:g} s ({type(error).__name__}: {error}). Fix: check the address, start "
            "a cluster with `snakemake-context up`, or drop --context-scheduler-address/-file "
            "to use an embedded cluster."
        ) from None


def _format_versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in versions.items())
