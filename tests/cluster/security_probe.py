"""An attacker's probe of a cluster's ports: can it run code there, can it read files?

Run as a script (by the test's own user, or by a second local user with a copy of the
environment), with one JSON argument::

    {"host": "127.0.0.1", "ports": [...], "scheduler_port": N,
     "modes": ["plain", "tls-no-cert", "foreign"], "foreign": {"ca": ..., "cert": ...,
     "key": ...} or null, "own": {...} or null, "markers": DIR, "read": [PATHS]}

For every port and mode it sends Dask's ``run`` (workers, nannies) and
``run_function`` (scheduler) with a function that writes a marker file, and for the
scheduler port also tries ``Client.run`` and ``Client.run_on_scheduler``. It prints one
JSON object: what each attempt answered, and what each read of ``read`` gave. The
marker files are the proof: a function that ran left one. Mode ``own`` (the cluster's
own credentials) is the positive control that shows the probe can succeed.

Imports only the standard library and distributed (and, for the modes with
certificates, what distributed's TLS needs).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import sys
import urllib.request


def mark(path: str) -> str:
    """The code an attacker wants to run: it leaves a file."""
    with open(path, "w") as handle:
        handle.write(str(os.getuid()))
    return "ran"


def _connection_args(mode: str, spec: dict) -> tuple[str, dict]:
    if mode == "plain":
        return "tcp", {}
    if mode == "tls-no-cert":
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # accepts any server, presents no certificate
        return "tls", {"ssl_context": context, "require_encryption": True}
    return "tls", _security(spec[mode]).get_connection_args("client")


def _security(files: dict):
    from distributed import Security

    return Security(
        require_encryption=True,
        tls_ca_file=files["ca"],
        tls_client_cert=files["cert"],
        tls_client_key=files["key"],
    )


async def _rpc_attempt(address: str, args: dict, marker: str) -> str:
    from distributed.core import rpc
    from distributed.protocol.pickle import dumps

    answers = []
    remote = rpc(address, connection_args=args, timeout=2)
    try:
        for op in ("run", "run_function"):
            try:
                response = await asyncio.wait_for(
                    getattr(remote, op)(
                        function=dumps(mark), args=dumps((marker,)), kwargs=dumps({}), wait=True
                    ),
                    6,
                )
                answers.append(f"{op}: {str(response)[:120]}")
            except Exception as error:
                answers.append(f"{op}: refused ({type(error).__name__}: {str(error)[:160]})")
                if isinstance(error, OSError):
                    break  # no connection: the other operation would not get one either
    finally:
        await remote.close_rpc()
    return "; ".join(answers)


def _client_attempt(address: str, mode: str, spec: dict, markers: str) -> str:
    from distributed import Client

    security = None if mode == "plain" else _security(spec[mode])
    try:
        with Client(address, security=security, timeout=2, set_as_default=False) as client:
            client.run(mark, os.path.join(markers, f"client-run-{mode}"))
            client.run_on_scheduler(mark, os.path.join(markers, f"client-sched-{mode}"))
            return "ran"
    except Exception as error:
        return f"refused ({type(error).__name__}: {str(error)[:160]})"


def _http(host: str, port: int) -> str:
    for scheme in ("http", "https"):
        context = ssl._create_unverified_context() if scheme == "https" else None
        try:
            with urllib.request.urlopen(
                f"{scheme}://{host}:{port}/", timeout=3, context=context
            ) as response:
                return f"{scheme} {response.status}: {response.read(200)!r}"
        except urllib.error.HTTPError as error:
            return f"{scheme} {error.code}: {error.read(200)!r}"
        except Exception as error:
            last = f"{scheme}: {type(error).__name__}"
    return last


async def _probe(spec: dict) -> dict:
    host, markers = spec["host"], spec["markers"]
    attempts = {}
    for port in spec["ports"]:
        for mode in spec["modes"]:
            scheme, args = _connection_args(mode, spec)
            marker = os.path.join(markers, f"rpc-{port}-{mode}")
            attempts[f"{port} {mode}"] = _rpc_attempt(f"{scheme}://{host}:{port}", args, marker)
    results = dict(zip(attempts, await asyncio.gather(*attempts.values()), strict=True))
    return results


def main() -> None:
    spec = json.loads(sys.argv[1])
    out: dict = {"uid": os.getuid(), "rpc": asyncio.run(_probe(spec)), "client": {}, "read": {}}
    for mode in spec["modes"]:
        if mode == "tls-no-cert":
            continue  # Dask's Client takes certificates only; the rpc attempt covers it
        scheme = "tcp" if mode == "plain" else "tls"
        address = f"{scheme}://{spec['host']}:{spec['scheduler_port']}"
        out["client"][mode] = _client_attempt(address, mode, spec, spec["markers"])
    out["http"] = {str(port): _http(spec["host"], port) for port in spec.get("http", [])}
    for path in spec.get("read", []):
        try:
            if os.path.isdir(path):
                out["read"][path] = f"listed {os.listdir(path)}"
            else:
                with open(path, "rb") as handle:
                    out["read"][path] = f"read {len(handle.read())} bytes"
        except OSError as error:
            out["read"][path] = f"denied ({type(error).__name__})"
    out["connect"] = {}
    for path in spec.get("connect", []):  # a forkserver forks for whoever connects
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
            try:
                unix.connect(path)
                out["connect"][path] = "connected"
            except OSError as error:
                out["connect"][path] = f"denied ({type(error).__name__})"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
