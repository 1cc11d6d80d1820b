"""The test bed itself: nodes with their own addresses, hostnames and /tmp, a shared
$HOME, no route out, and the faults it injects (partition, heal, loss, a capped link)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

from tests.nodes.bed import leftovers

#: A TCP probe run on a node (no ping here): connect to HOST:PORT within 2 s.
PROBE = textwrap.dedent(
    """
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
        print("reached")
    except OSError as error:
        print(type(error).__name__, error.errno)
    """
)


def _reaches(node, host: str, port: int, tries: int = 1) -> bool:
    """Whether ``node`` reaches ``host``:``port`` within ``tries`` probes 0.1 s apart."""
    for attempt in range(tries):
        if node.run([sys.executable, "-c", PROBE, host, str(port)]).stdout.strip() == "reached":
            return True
        if attempt + 1 < tries:
            time.sleep(0.1)
    return False


def _listener(host: str) -> tuple[socket.socket, int]:
    server = socket.socket()
    server.settimeout(30)  # a sender that never came fails the test, not its timeout
    server.bind((host, 0))
    server.listen()
    return server, server.getsockname()[1]


def test_nodes_have_their_own_hostname_address_and_tmp_and_share_home(bed) -> None:
    nodes = bed(2)
    a, b = nodes.nodes
    for node in (a, b):
        assert node.run(["hostname"]).stdout.strip() == node.hostname
        assert node.address in node.run(["ip", "-o", "-4", "addr"]).stdout
    mine = f"/tmp/bed-{uuid.uuid4().hex}"  # a name nothing else on the host has
    a.run(["sh", "-c", f"echo a > {mine}"], check=True)
    assert b.run(["cat", mine]).returncode != 0  # node-local /tmp
    assert not os.path.exists(mine)
    a.run(["sh", "-c", f"echo shared > {nodes.home}/note"], check=True)
    assert b.run(["cat", f"{nodes.home}/note"]).stdout.strip() == "shared"
    env = nodes.environment()
    assert env["HOME"] == str(nodes.home) and "XDG_RUNTIME_DIR" not in env


def test_a_node_reaches_the_bed_and_nothing_else(bed) -> None:
    nodes = bed(2)
    a, b = nodes.nodes
    on_bridge, port = _listener(nodes.host_address)
    outside, outside_port = _listener("127.0.0.1")
    with on_bridge, outside:
        probe = [sys.executable, "-c", PROBE]
        assert _reaches(a, nodes.host_address, port)
        # The host's loopback is the node's own (nothing listens there).
        assert not _reaches(a, "127.0.0.1", outside_port)
        # An address outside the bed: no route.
        assert "OSError 101" in a.run([*probe, "192.0.2.1", "80"]).stdout
        assert "default" not in a.run(["ip", "route"]).stdout
        peer = b.popen(
            [
                sys.executable,
                "-c",
                "import socket,time;s=socket.socket();"
                f"s.bind(('{b.address}',7777));s.listen();time.sleep(30)",
            ]
        )
        try:
            assert _reaches(a, b.address, 7777, tries=50), "node0 did not reach node1"
        finally:
            peer.kill()
            peer.wait()


def test_a_partition_keeps_processes_alive_and_a_heal_brings_them_back(bed) -> None:
    nodes = bed(1)
    (a,) = nodes.nodes
    server, port = _listener(nodes.host_address)
    with server:
        sleeper = a.popen(["sleep", "60"])
        nodes.partition(a)
        assert not _reaches(a, nodes.host_address, port)
        assert sleeper.poll() is None
        nodes.heal(a)
        assert _reaches(a, nodes.host_address, port, tries=50), "the healed node did not reach"
        sleeper.kill()
        sleeper.wait()


def test_a_lost_node_has_every_process_killed_at_once(bed) -> None:
    nodes = bed(2)
    a, b = nodes.nodes
    sleepers = [a.popen(["sleep", "60"]) for _ in range(3)]
    other = b.popen(["sleep", "60"])
    killed = nodes.lose(a)
    assert len(killed) >= 4  # the holder and the three
    assert all(s.wait(timeout=5) == -9 for s in sleepers)
    assert a.pids() == [] and other.poll() is None
    other.kill()
    other.wait()


def test_a_capped_link_carries_at_its_rate(bed) -> None:
    nodes = bed(1)
    (a,) = nodes.nodes
    server, port = _listener(nodes.host_address)
    size = 4_000_000
    with server:
        nodes.cap(a, "20mbit")
        sender = a.popen(
            [
                sys.executable,
                "-c",
                f"import socket;s=socket.create_connection(('{nodes.host_address}',{port}));"
                f"s.sendall(b'x'*{size});s.close()",
            ]
        )
        conn, _ = server.accept()
        started = time.monotonic()
        got = 0
        with conn:
            while chunk := conn.recv(1 << 16):
                got += len(chunk)
        seconds = time.monotonic() - started
        sender.wait()
    assert got == size
    # 32 Mbit at 20 Mbit/s: at least 1.3 s whatever the machine's load (uncapped: ~0.01 s).
    assert seconds > 1.0, seconds


def test_teardown_leaves_nothing_even_after_a_loss_and_a_partition() -> None:
    from tests.nodes.bed import Bed
    from tests.nodes.conftest import need_bed

    need_bed()
    with Bed(2) as made:
        made.partition(made.nodes[0])
        made.lose(made.nodes[1])
        made.nodes[0].popen(["sleep", "60"])
        tag, shared = made.tag, made.shared
    assert leftovers(tag) == []
    assert not shared.exists()
    assert subprocess.run(["pgrep", "-f", f"ctxbed-{tag}"], capture_output=True).stdout == b""
