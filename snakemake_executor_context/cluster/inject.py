"""A preemption injector, for experiments and tests: ``snakemake-context inject``.

It kills servers of a local cluster (one this project started, on this machine), or
with ``--group`` only those of one survival group (:mod:`..fleet.survival`):
one every ``--every`` seconds (SIGKILL or SIGTERM; the target chosen by a seeded
random generator, or in turn with ``--alternate``), its restart held back
``--replace-after`` seconds; or, with ``--fraction``, that share of the fleet at once,
held back ``--hold`` seconds. Before each kill it announces it to the scheduler
(:class:`~..fleet.events.ServerKillInjected`), so the loss is classified as injected
and the catalog marks it so; a held restart is a file the server's nanny reads
(:mod:`.nannies`). Its own log (JSON lines: time, server, its group, pid, signal,
whether the server was running a job) is the reference a test compares the catalog with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from .. import paths
from ..errors import ClusterError
from ..fleet import events as ev
from ..server.server import survival_group_here
from ..strays.processgroups import GroupRecord, nanny_pid
from .credentials import FIX, private_dir, write_private
from .infofiles import ClusterFiles

__all__ = ["add_parser", "choose_targets", "inject", "servers_of_group"]


def add_parser(commands: Any) -> None:
    """Add the ``inject`` command to the command line's subparsers."""
    sub = commands.add_parser(
        "inject",
        help="(developers) kill servers of a local cluster at a rate, for preemption experiments",
    )
    sub.add_argument(
        "--scheduler-file",
        type=Path,
        required=True,
        help="the cluster's scheduler file, or a directory: the first scheduler file "
        "that appears there (an embedded cluster's, .snakemake/context/cluster)",
    )
    sub.add_argument("--every", type=float, default=60.0, help="seconds between kills")
    sub.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    sub.add_argument("--seed", type=int, default=0, help="seed of the target choice")
    sub.add_argument("--alternate", action="store_true", help="kill the servers in turn, by name")
    sub.add_argument(
        "--replace-after", type=float, default=0.0, help="seconds a killed server stays down"
    )
    sub.add_argument(
        "--fraction",
        type=float,
        default=0.0,
        help="kill this share of the fleet at once (0 < k <= 1), held down --hold seconds",
    )
    sub.add_argument("--hold", type=float, default=0.0, help="seconds down, with --fraction")
    sub.add_argument("--count", type=int, default=0, help="stop after this many kills")
    sub.add_argument("--duration", type=float, default=0.0, help="stop after this many s")
    sub.add_argument("--first-after", type=float, default=None, help="first kill (default: T)")
    sub.add_argument("--log", type=Path, default=None, help="JSON-lines log of the kills")
    sub.add_argument(
        "--group",
        default=None,
        help="kill only servers of this survival group (their --server-group label, or a "
        "pilot's queue/GPU type); injectors of different groups and --every kill each "
        "group at its own rate",
    )
    sub.set_defaults(func=inject)


def choose_targets(
    names: list[str], rng: random.Random, *, fraction: float, turn: int, alternate: bool
) -> list[str]:
    """The servers to kill now: a seeded choice of one (or in turn), or a share."""
    ordered = sorted(names)
    if not ordered:
        return []
    if fraction > 0:
        return sorted(rng.sample(ordered, max(1, math.ceil(fraction * len(ordered)))))
    if alternate:
        return [ordered[turn % len(ordered)]]
    return [rng.choice(ordered)]


def servers_of_group(
    groups: Mapping[str, str], group: str, *, seen: set[str], complete: bool
) -> list[str]:
    """The servers (names, of ``groups``: each server's group) of ``group``. ``seen``
    gathers the groups seen so far; a group never seen once the whole fleet answered
    (``complete``) is a ClusterError naming the groups there are (a group's servers
    all down at once, after one was seen, is no error: none is killed then)."""
    seen.update(groups.values())
    if group not in seen and complete:
        named = ", ".join(repr(found) for found in sorted(seen)) or "none"
        raise ClusterError(
            f"inject --group {group!r}: no server of that group; the servers' groups are "
            f"{named} ('': no label). Fix: a group of those (--server-group labels them)."
        )
    return sorted(name for name, found in groups.items() if found == group)


def inject(args: argparse.Namespace) -> int:
    """Run the injector until ``--count`` kills, ``--duration`` seconds, or the
    cluster's end."""
    from distributed import Client

    from .attach import resolve_target

    files = ClusterFiles(_scheduler_file(args.scheduler_file, timeout=120.0))
    signum = getattr(signal, f"SIG{args.signal}")
    down = args.hold if args.fraction > 0 else args.replace_after
    rng = random.Random(args.seed)
    started = time.time()
    log = os.fdopen(paths.open_append(args.log, FIX), "a") if args.log else None
    # The cluster's own credentials (X.tls/ beside X.json): every port requires them.
    target = resolve_target(address=None, scheduler_file=files.scheduler_file)
    client = Client(target.address, security=target.security, timeout=30, set_as_default=False)
    info = files.read_info()
    planned = max(1, len(info.servers) if info else 0)
    seen: set[str] = set()
    kills = turn = 0
    try:
        next_kill = started + (args.first_after if args.first_after is not None else args.every)
        while not args.count or kills < args.count:
            if args.duration and time.time() - started >= args.duration:
                break
            time.sleep(max(0.0, min(0.2, next_kill - time.time())))
            if time.time() < next_kill:
                continue
            next_kill += args.every
            try:
                workers = client.scheduler_info(n_workers=-1)["workers"]
            except Exception:  # the cluster is gone: nothing left to kill
                break
            by_name = {str(w.get("name")): (addr, w) for addr, w in workers.items()}
            found = client.run(survival_group_here, on_error="return")
            groups = {
                name: found[address]
                for name, (address, _) in by_name.items()
                if isinstance(found.get(address), str)
            }
            candidates = list(by_name)
            if args.group is not None:
                complete = len(groups) >= planned
                candidates = servers_of_group(groups, args.group, seen=seen, complete=complete)
            names = choose_targets(
                candidates, rng, fraction=args.fraction, turn=turn, alternate=args.alternate
            )
            turn += 1
            pids = client.run(os.getpid, on_error="return")
            nannies = client.run(nanny_pid, on_error="return")
            for name in names:
                address = by_name[name][0]
                pid = pids.get(address)
                nanny = nannies.get(address)
                record = _kill(client, files, name, address, pid, nanny, signum, down)
                record["group"] = groups.get(name, "")
                kills += 1
                if log is not None:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                print(f"inject: {json.dumps(record)}", flush=True)
    finally:
        client.close()
        if log is not None:
            log.close()
    return 0


def _kill(
    client: Any,
    files: ClusterFiles,
    name: str,
    address: str,
    pid: Any,
    nanny: Any,
    signum: int,
    down: float,
) -> dict[str, Any]:
    """Hold the restart back, announce the kill, freeze the server, read which jobs
    it runs, kill it."""
    if not isinstance(pid, int) or not pid:
        raise ClusterError(f"server {name} ({address}) reports no pid ({pid!r}): cannot kill it")
    if down > 0:
        private_dir(files.hold_dir)  # the nanny holds a restart back on what it reads
        write_private(files.hold_file(name), str(time.time() + down))
    announce = ev.ServerKillInjected(address=address, name=name, pid=pid, signal=int(signum))
    client.log_event(ev.TOPIC, ev.encode([announce]))
    at = time.time()
    try:
        # Frozen, the server can neither start nor end a job: its own record of
        # what it runs is then exact (the log is the tests' reference).
        os.kill(pid, signal.SIGSTOP)
        owner = nanny if isinstance(nanny, int) else psutil.Process(pid).ppid()
        running = GroupRecord(owner, name).running()
        os.kill(pid, signum)
        if signum != signal.SIGKILL:
            os.kill(pid, signal.SIGCONT)
    except (ProcessLookupError, psutil.Error):
        running = []
    return {
        "at": at,
        "server": name,
        "address": address,
        "pid": pid,
        "signal": int(signum),
        "busy": bool(running),
        "running": running,
        "hold_until": at + down if down > 0 else None,
    }


def _scheduler_file(path: Path, timeout: float) -> Path:
    """``path``, or the first scheduler file to appear in the directory ``path``."""
    deadline = time.time() + timeout
    while True:
        if path.is_file():
            return path
        if path.is_dir():
            found = sorted(path.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if found and ClusterFiles(found[-1]).read_info() is not None:
                return found[-1]
        if time.time() > deadline:
            raise ClusterError(f"no scheduler file at {path} within {timeout:g} s")
        time.sleep(0.2)
