"""Run as a second local user by tests/cluster/test_flood.py: open ``count`` idle TCP
connections to each of the cluster's own loopback ports (no TLS handshake, nothing
sent), print how many connected as one JSON line, then hold them for ``hold`` seconds.

Only the standard library: it runs on a copy of nothing.
"""

import json
import os
import resource
import select
import socket
import sys
import time

spec = json.loads(sys.argv[1])
host = spec["host"]
assert host == "127.0.0.1", host  # only the cluster's own loopback ports
# The descriptors it may hold: up to its hard limit (the test raised that as root).
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held: list[socket.socket] = []
waiting: dict[int, tuple[int, socket.socket]] = {}
poller = select.poll()
for port in spec["ports"]:
    for _ in range(spec["count"]):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex((host, port))
        held.append(sock)
        waiting[sock.fileno()] = (port, sock)
        poller.register(sock.fileno(), select.POLLOUT)
connected = {str(port): 0 for port in spec["ports"]}
deadline = time.monotonic() + spec["connect_seconds"]
while waiting and time.monotonic() < deadline:
    for fd, _ in poller.poll(100):
        port, sock = waiting.pop(fd)
        poller.unregister(fd)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            connected[str(port)] += 1
print(json.dumps({"uid": os.getuid(), "limit": hard, "connected": connected}), flush=True)
time.sleep(spec["hold"])
