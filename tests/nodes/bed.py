"""A test bed of nodes on one machine (root only): each node a network namespace with
its own address on a bridge the bed makes, its own hostname (a UTS namespace) and its
own ``/tmp`` and ``/dev/shm`` (tmpfs in a mount namespace: its node-local disk); the
rest of the filesystem (the workflow's directory, the shared ``$HOME`` of
:attr:`Bed.shared`) is one, as on a cluster.

No route leaves the bridge: a node has no default route, so it reaches only the
addresses the bed made (the host's end of the bridge, the other nodes). Faults: a
partition (the node's link down, its processes alive), a heal, a node lost whole
(every process in its namespace SIGKILLed at once), a link capped to a rate (``tbf``
both ways; this kernel has no ``netem``, so no delay or loss). Teardown always runs and
leaves no namespace, link, process or directory behind (:func:`leftovers` checks).

By hand: ``sudo python tests/nodes/bed.py --nodes 3`` opens a bed, prints how to enter
each node, and tears it down at Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Bed", "Node", "bed_available", "leftovers"]

#: Every bed's names start so: its bridge ``ctxbed<tag>``, namespaces ``ctxbed-<tag>-<i>``,
#: links ``cb<tag>h<i>`` (the host's end) and ``cb<tag>n<i>`` (the node's, ``eth0`` there).
PREFIX = "ctxbed"
#: The bed's subnet is 10.77.X.0/24: the host's end .1, the nodes .11 on.
SUBNET = "10.77"
FIRST_NODE = 11


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _kept_under_tmp() -> list[str]:
    """The host's directories under /tmp that every node must still see over its own
    /tmp, relative to /tmp: this checkout (a CI clone may lie in /tmp), the Python
    that runs the tests and the directory they run in."""
    import sys

    tmp = Path("/tmp").resolve()
    found: list[Path] = []
    for path in (Path(__file__).resolve().parents[2], Path(sys.prefix).resolve(), Path.cwd()):
        if path.is_relative_to(tmp) and path != tmp:
            found.append(path.relative_to(tmp))
    # The outermost of nested ones: a bind of the outer carries the inner.
    outer = [p for p in found if not any(p != q and p.is_relative_to(q) for q in found)]
    return sorted({shlex.quote(str(p)) for p in outer})


def bed_available() -> str | None:
    """Why no bed can be made here (None: it can): root, ``ip``, ``unshare``,
    ``nsenter`` and ``tc`` are needed."""
    if os.geteuid() != 0:
        return "the test bed of nodes needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "tc"):
        if shutil.which(tool) is None:
            return f"the test bed of nodes needs {tool}"
    return None


@dataclass
class Node:
    """One node of a bed."""

    index: int
    hostname: str
    namespace: str
    address: str
    host_link: str
    holder: subprocess.Popen[str] | None = None
    lost: bool = False
    partitioned: bool = False
    rate: str | None = None

    def command(self, args: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """``args`` as run on this node: in its network, mount and UTS namespaces."""
        assert self.holder is not None, "the node has not started"
        wd = f"--wd={cwd}" if cwd is not None else f"--wd={os.getcwd()}"
        return [
            "nsenter",
            f"--target={self.holder.pid}",
            "--mount",
            "--uts",
            "--net",
            wd,
            "--",
            *map(str, args),
        ]

    def popen(
        self, args: Sequence[str], cwd: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``args`` on this node (kwargs as :class:`subprocess.Popen` takes them)."""
        return subprocess.Popen(self.command(args, cwd), **kwargs)

    def run(
        self, args: Sequence[str], cwd: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``args`` on this node to its end."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(args, cwd), **kwargs)

    def pids(self) -> list[int]:
        """Every process in this node's network namespace."""
        found = _ip("netns", "pids", self.namespace, check=False)
        return [int(p) for p in found.stdout.split()]


@dataclass
class Bed:
    """N nodes on a bridge; a context manager that always tears down what it made."""

    count: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3)[:5])
    nodes: list[Node] = field(default_factory=list)
    #: The directory every node shares: the workflows' and $HOME's (``shared/home``).
    shared: Path = Path()
    octet: int = 0

    @property
    def bridge(self) -> str:
        """The bridge's name in the host's namespace."""
        return f"{PREFIX}{self.tag}"

    @property
    def host_address(self) -> str:
        """The host's address on the bridge: where a scheduler on the host listens."""
        return f"{SUBNET}.{self.octet}.1"

    @property
    def home(self) -> Path:
        """The shared $HOME."""
        return self.shared / "home"

    def environment(self, **extra: str) -> dict[str, str]:
        """The environment a process on a node gets: this one's, with $HOME shared and
        no runtime or temporary directory of the host's (so a node's private root lies
        in its own /tmp)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP", "SNAKEMAKE_CONTEXT_LOCAL_DIR")
        }
        env["HOME"] = str(self.home)
        env.update(extra)
        return env

    def __enter__(self) -> Bed:
        why = bed_available()
        if why:
            raise RuntimeError(why)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        taken = _ip("-o", "-4", "addr").stdout
        free = [x for x in range(1, 255) if f"{SUBNET}.{x}." not in taken]
        self.octet = free[secrets.randbelow(len(free))]
        # mkdtemp: a name nobody could have planted first, 0700.
        self.shared = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{self.tag}-", dir="/var/tmp"))
        self.home.mkdir(mode=0o700)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index in range(self.count):
            node = Node(
                index=index,
                hostname=f"node{index}",
                namespace=f"{PREFIX}-{self.tag}-{index}",
                address=f"{SUBNET}.{self.octet}.{FIRST_NODE + index}",
                host_link=f"cb{self.tag}h{index}",
            )
            self.nodes.append(node)
            inner = f"cb{self.tag}n{index}"
            _ip("netns", "add", node.namespace)
            _ip("link", "add", node.host_link, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", node.namespace)
            _ip("link", "set", node.host_link, "master", self.bridge)
            _ip("link", "set", node.host_link, "up")
            inside = ("netns", "exec", node.namespace, "ip")
            _ip(*inside, "link", "set", inner, "name", "eth0")
            _ip(*inside, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")
            node.holder = subprocess.Popen(
                [
                    "ip", "netns", "exec", node.namespace,
                    "unshare", "--mount", "--uts", "--propagation", "private", "--",
                    "sh", "-c",
                    f"hostname {node.hostname} && exec 3</tmp && "
                    "mount -t tmpfs -o mode=1777 tmpfs /tmp && "
                    "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
                    # mount(8) would resolve the fd's path to the new /tmp: not canonicalized.
                    + "".join(
                        f"mkdir -p /tmp/{rel} && mount --no-canonicalize --bind "
                        f"/proc/self/fd/3/{rel} /tmp/{rel} && "
                        for rel in _kept_under_tmp()
                    )
                    + "exec 3<&- && echo ready && exec sleep infinity",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )  # fmt: skip
            assert node.holder.stdout is not None
            if node.holder.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{node.hostname} did not start: {node.holder.stderr.read()}")

    def partition(self, node: Node) -> None:
        """Take ``node``'s link down: its processes live on, unreachable."""
        _ip("link", "set", node.host_link, "down")
        node.partitioned = True

    def heal(self, node: Node) -> None:
        """Bring ``node``'s link up again."""
        _ip("link", "set", node.host_link, "up")
        node.partitioned = False

    def lose(self, node: Node) -> list[int]:
        """Lose ``node`` whole: every process in its namespace SIGKILLed at once (its
        holder too, so nothing of it can be entered again). Returns the pids killed."""
        killed: list[int] = []
        deadline = time.monotonic() + 10
        # Again until none is left: a process forked while the first were killed.
        while (pids := node.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed += [pid for pid in pids if pid not in killed]
            time.sleep(0.05)
        if node.holder is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.holder.wait(timeout=10)
        node.lost = True
        return killed

    def cap(self, node: Node, rate: str | None) -> None:
        """Cap ``node``'s link to ``rate`` (``200mbit``) both ways; None lifts the cap."""
        inside = ("netns", "exec", node.namespace, "tc")
        if rate is None:
            subprocess.run(["tc", "qdisc", "del", "dev", node.host_link, "root"], check=False)
            _ip(*inside, "qdisc", "del", "dev", "eth0", "root", check=False)
        else:
            tbf = ("root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")
            subprocess.run(
                ["tc", "qdisc", "replace", "dev", node.host_link, *tbf],
                check=True,
                capture_output=True,
            )
            _ip(*inside, "qdisc", "replace", "dev", "eth0", *tbf)
        node.rate = rate

    def close(self) -> None:
        """Tear down every process, namespace and link of the bed, and its directory."""
        for node in self.nodes:
            if not node.lost:
                self.lose(node)
        deadline = time.monotonic() + 10
        for node in self.nodes:
            while node.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            _ip("netns", "del", node.namespace, check=False)
            _ip("link", "del", node.host_link, check=False)
        _ip("link", "del", self.bridge, check=False)
        if self.shared != Path() and self.shared.is_dir():
            shutil.rmtree(self.shared, ignore_errors=True)


def leftovers(tag: str = "") -> list[str]:
    """What is left of beds (of ``tag``, or any): namespaces, links, directories."""
    name = f"{PREFIX}{tag}"
    found = [
        f"namespace {n.split()[0]}"
        for n in _ip("netns", "list").stdout.splitlines()
        if n.startswith(f"{PREFIX}-{tag}")
    ]
    for line in _ip("-o", "link").stdout.splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link.startswith(name) or (tag and link.startswith(f"cb{tag}")):
            found.append(f"link {link}")
    found += [f"directory {p}" for p in Path("/var/tmp").glob(f"{PREFIX}-{tag}*")]
    return found


def main() -> int:
    """Open a bed by hand and hold it until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    count = parser.parse_args().nodes
    with Bed(count) as bed:
        print(f"bed {bed.tag}: bridge {bed.bridge} at {bed.host_address}, shared {bed.shared}")
        for node in bed.nodes:
            print(f"  {node.hostname} {node.address}: sudo {' '.join(node.command(['bash']))}")
        print("Ctrl-C tears it down.")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    print("torn down:", leftovers(bed.tag) or "nothing left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
