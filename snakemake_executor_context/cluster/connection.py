"""The executor's connection to a Dask cluster: a client, and the local cluster if the
run owns one (the embedded cluster)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError, VersionSkewError
from .process import LocalClusterProcess

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ClusterConnection"]

logger = logging.getLogger(__name__)


class ClusterConnection:
    """The executor's handle on Dask: a client, and the local cluster if it owns one
    (named for what it is: not SQLAlchemy's ``Engine``)."""

    def __init__(self, client: Client, local: LocalClusterProcess | None, description: str) -> None:
        self.client = client
        self.local = local
        self.description = description
        self.closed = False

    @property
    def embedded(self) -> bool:
        """Whether this run started the cluster (and stops it at the end)."""
        return self.local is not None

    def pool_kinds(self) -> list[dict[str, Any]]:
        """The kinds of pilot of the cluster's pool of a batch system ([] without one)."""
        if self.local is not None:
            from .pilots import PilotOptions

            pilots = (self.local.files.read_info() or {}).get("pilots")
            return PilotOptions.from_json(json.dumps(pilots)).kind_summaries() if pilots else []
        try:
            books = self.client.get_metadata(["snakemake-context", "pool"], default=None)
        except Exception as error:  # an older cluster: no pool
            logger.debug("no pool metadata: %r", error)
            return []
        return list((books or {}).get("kinds") or [])

    @classmethod
    def start_embedded(
        cls,
        scheduler_file: Path,
        *,
        servers: int | None,
        memory_budget: str,
        timeout: float,
        extra_args: Sequence[str] = (),
    ) -> ClusterConnection:
        """Start a cluster for this run (``extra_args``: a pool of pilots)."""
        local = LocalClusterProcess.start(
            scheduler_file,
            servers=servers,
            memory_budget=memory_budget,
            timeout=timeout,
            parent_pid=os.getpid(),
            extra_args=extra_args,
        )
        try:
            client = _connect(scheduler_file=local.files.scheduler_file, timeout=timeout)
        except BaseException:
            local.stop()
            raise
        return cls(client, local, f"embedded cluster ({local.files.log_file})")

    @classmethod
    def attach(
        cls, *, address: str | None, scheduler_file: Path | None, timeout: float
    ) -> ClusterConnection:
        """Attach to a running scheduler; it keeps running after the run."""
        client = _connect(address=address, scheduler_file=scheduler_file, timeout=timeout)
        connection = cls(client, None, f"cluster at {client.scheduler.address}")
        try:
            connection.check_versions()
        except BaseException:
            client.close()
            raise
        return connection

    def workers(self) -> dict[str, dict[str, Any]]:
        """The workers Dask lists now, by address: name, resources and threads (for
        checking the fleet state's membership, which comes from the hub's events)."""
        info = self.client.scheduler_info(n_workers=-1)
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
        from ..server.plugin import server_versions

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
        from ..server.plugin import server_inventory

        try:
            result = self.client.run(server_inventory, on_error="return")
        except Exception as error:
            logger.debug("no inventories from the servers: %r", error)
            return {}
        return {addr: inv for addr, inv in result.items() if isinstance(inv, dict)}

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
        try:
            self.client.close(timeout=5)
        except Exception as error:
            logger.debug("closing the client: %r", error)
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
