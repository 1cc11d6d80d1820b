"""Where a client attaches, with which credentials, and whether anything answers there.

Everything is checked before Dask's client tries (and retries until its timeout): a
malformed address, a truncated scheduler file, a plaintext scheduler without
``--context-allow-plaintext``, missing or foreign credentials, a refused or silent
port. Each ends in one line naming the setting, the value and what is allowed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError, UnsafePathError
from .credentials import Credentials

if TYPE_CHECKING:
    from distributed import Security

__all__ = ["PROBE_SECONDS", "AttachTarget", "parse_address", "probe", "resolve_target"]

#: Seconds a scheduler has to accept a connection and send its first bytes (a TLS
#: handshake included) before it counts as unreachable: refused or silent ports fail
#: at once instead of after --context-tuning connect_timeout.
PROBE_SECONDS = 1.5

_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[a-z]+)://)?(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s]+):(?P<port>\d+)/?$"
)
_ALLOWED = "tls://HOST:PORT (or tcp://HOST:PORT with --context-allow-plaintext)"


@dataclass(frozen=True)
class AttachTarget:
    """A scheduler to attach to: its address, how to secure the connection (None:
    plaintext), and the setting it came from (for messages)."""

    address: str
    security: Security | None
    setting: str
    credentials: Credentials | None = None
    scheduler_file: Path | None = None
    #: The warning to show once, for a plaintext scheduler (None for TLS).
    warning: str | None = None

    @property
    def host_port(self) -> tuple[str, int]:
        """The address's host and port."""
        _, host, port = parse_address(self.address, self.setting)
        return host, port


def parse_address(address: str, setting: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a scheduler address; one line naming ``setting``
    if it is not one."""
    match = _ADDRESS.match(address.strip())
    scheme = (match.group("scheme") or "tcp") if match else ""
    port = int(match.group("port")) if match else 0
    if match is None or scheme not in ("tls", "tcp") or not 0 < port < 65536:
        raise ClusterError(
            f"{setting} {address!r} is not a scheduler address; allowed: {_ALLOWED}."
        )
    return scheme, match.group("host").strip("[]"), port


def resolve_target(
    *,
    address: str | None,
    scheduler_file: Path | None,
    credentials: Path | None = None,
    allow_plaintext: bool = False,
) -> AttachTarget:
    """The scheduler named by an address or a scheduler file, with the credentials
    that secure it (a directory setting, else ``X.tls/`` beside ``X.json``)."""
    if address is not None:
        setting = "--context-scheduler-address"
        scheme, host, port = parse_address(address, setting)
    else:
        assert scheduler_file is not None
        setting = f"--context-scheduler-file {scheduler_file}"
        found_address = _address_in(Path(scheduler_file), trusted=not allow_plaintext)
        scheme, host, port = parse_address(found_address, f"{setting}: the address")
    address = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    if scheme == "tcp":
        if not allow_plaintext:
            raise ClusterError(
                f"{setting}: {address} is a plaintext scheduler; anyone who can reach its "
                "port can run code as its owner. Fix: attach to a cluster started by "
                "`snakemake-context up` (TLS), or pass --context-allow-plaintext to accept."
            )
        warning = (
            f"Attaching to the plaintext scheduler {address} (--context-allow-plaintext): "
            "anyone who can reach its ports can run code as its owner and read task specs."
        )
        return AttachTarget(address, None, setting, scheduler_file=scheduler_file, warning=warning)
    if credentials is not None:
        found = Credentials(Path(credentials)).check("--context-credentials")
    elif scheduler_file is not None:
        found = Credentials.beside(Path(scheduler_file)).check(setting)
    else:
        raise ClusterError(
            f"{setting} {address} is a TLS scheduler: it needs its cluster's credentials. "
            "Fix: attach with --context-scheduler-file (the credentials lie beside it), or "
            "name their directory with --context-credentials DIR."
        )
    return AttachTarget(
        address, found.security(), setting, credentials=found, scheduler_file=scheduler_file
    )


def _address_in(scheduler_file: Path, *, trusted: bool) -> str:
    """The address in a scheduler file. ``trusted``: only from a file of this user's
    that others cannot write (a forged one could point the client at another user's
    scheduler); a plaintext scheduler someone else started is the exception the user
    accepts with --context-allow-plaintext."""
    from .. import paths
    from .credentials import FIX

    setting = "--context-scheduler-file"
    if not scheduler_file.exists():
        raise ClusterError(
            f"{setting} {scheduler_file} does not exist. Fix: start a cluster with "
            f"`snakemake-context up --scheduler-file {scheduler_file}`, or drop "
            f"{setting} to use an embedded cluster."
        )
    try:
        if trusted:
            raw = paths.read_trusted(scheduler_file, FIX) or b""
        else:
            with os.fdopen(paths.open_nofollow(scheduler_file), "rb") as handle:
                raw = handle.read()
        info: Any = json.loads(raw)
        address = info["address"]
        if not isinstance(address, str):
            raise TypeError("address is not a string")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ClusterError(
            f"{setting} {scheduler_file} is not a Dask scheduler file (truncated, or no "
            f"address in it: {type(error).__name__}: {error}). Fix: restart the cluster "
            f"(snakemake-context up --scheduler-file {scheduler_file})."
        ) from None
    return address


def probe(target: AttachTarget, timeout: float) -> None:
    """Connect to the scheduler and read its first bytes (through TLS with the
    target's credentials), or one line on why not (refused, silent, unreachable,
    credentials that do not match). A port that does not answer within
    ``min(timeout, PROBE_SECONDS)`` fails then, unless its cluster's process runs (its
    pid file says so): a busy or flooded scheduler is tried again, a fresh connection
    each time, until ``timeout``."""
    started = time.monotonic()
    limit = min(timeout, PROBE_SECONDS)
    while True:
        silent = _probe_once(target, limit)
        if silent is None:
            return
        left = started + timeout - time.monotonic()
        if left < 0.1 or _running_pid(target) is None:
            what, reason = silent
            waited = max(limit, round(time.monotonic() - started))
            raise ClusterError(
                f"{target.setting}: {target.address} {what} within {waited:g} s ({reason})."
                f"{_why_silent(target)}"
            )
        limit = min(left, PROBE_SECONDS)


def _probe_once(target: AttachTarget, limit: float) -> tuple[str, str] | None:
    """One try of :func:`probe`: None if the scheduler answered, what it did and why
    if it was silent (timed out, or closed before its handshake finished, as
    a flooded scheduler drops connections); raises at once where trying again
    cannot help (refused, credentials that do not match)."""
    host, port = target.host_port
    deadline = time.monotonic() + limit
    try:
        raw = socket.create_connection((host, port), timeout=limit)
    except ConnectionRefusedError:
        raise ClusterError(
            f"{target.setting}: nothing listens at {target.address} (connection refused)."
            f"{_why_silent(target)}"
        ) from None
    except (TimeoutError, OSError) as error:
        return "could not be reached", _reason(error)
    try:
        raw.settimeout(max(0.05, deadline - time.monotonic()))
        sock: socket.socket = raw
        if target.security is not None:
            context = target.security.get_connection_args("client")["ssl_context"]
            sock = context.wrap_socket(raw)  # the handshake: both certificates checked
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        if not sock.recv(1):
            raise ConnectionResetError("closed without a word")
    except OSError as error:  # an SSLError is one; a drop mid-handshake is an EOF
        if isinstance(error, ssl.SSLError) and not isinstance(
            error, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            raise ClusterError(_tls_refusal(target, error)) from None
        return "accepted a connection but did not answer as a Dask scheduler", _reason(error)
    finally:
        raw.close()
    return None


def _running_pid(target: AttachTarget) -> int | None:
    """The pid of the cluster that wrote the target's scheduler file, while it runs."""
    from .infofiles import ClusterFiles

    if target.scheduler_file is None:
        return None
    try:
        return ClusterFiles(Path(target.scheduler_file)).running_pid()
    except (OSError, ValueError, ClusterError, UnsafePathError):
        return None  # a pid file that is not this user's names nothing


def _why_silent(target: AttachTarget) -> str:
    """Why a scheduler does not answer, and the fix: its cluster's process, which its
    pid file names, has stopped, or it runs and is too busy to answer (a flood of
    connections from someone else), where starting it again is not the fix."""
    scheduler_file = target.scheduler_file
    if scheduler_file is None:
        return " Fix: check the address, or start a cluster with `snakemake-context up`."
    pid = _running_pid(target)
    if pid is None:
        return (
            f" The cluster that wrote {scheduler_file} has stopped. Fix: start it again "
            f"(snakemake-context up --scheduler-file {scheduler_file})."
        )
    return (
        f" Its cluster's process runs (pid {pid}): it is busy or flooded with connections "
        "(another user on its host may be holding many open to its port). Fix: try again "
        "in a while; if it never answers, restart it (snakemake-context down "
        f"--scheduler-file {scheduler_file}, then up)."
    )


def _tls_refusal(target: AttachTarget, error: ssl.SSLError) -> str:
    text = f"{getattr(error, 'reason', None) or error}"
    if "WRONG_VERSION_NUMBER" in text or "record layer" in text.lower():
        return (
            f"{target.setting}: {target.address} does not speak TLS ({text}): a plaintext "
            "scheduler. Fix: name it tcp://... and pass --context-allow-plaintext."
        )
    where = target.credentials.directory if target.credentials else "(none)"
    return (
        f"{target.setting}: the credentials in {where} do not match the server at "
        f"{target.address} ({text}): another cluster's, or not a cluster of this plugin. "
        "Fix: use the credentials beside that cluster's scheduler file "
        "(--context-credentials DIR)."
    )


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "timed out"
    return f"{type(error).__name__}: {error}"
