"""Where a cluster's processes listen: the address of a named interface (``up
--interface ib0``), and the address a node reaches its scheduler from (what a joined
node's servers listen on, :mod:`.join`)."""

from __future__ import annotations

import socket

from ..errors import ClusterError

__all__ = ["interface_address", "route_address"]


def interface_address(name: str) -> str:
    """The IPv4 address of the interface ``name``; ClusterError, one line naming the
    interfaces there are, if it has none or does not exist."""
    import psutil

    found = psutil.net_if_addrs()
    for entry in found.get(name, ()):
        if entry.family == socket.AF_INET:
            return str(entry.address)
    have = ", ".join(
        f"{each} ({address.address})"
        for each, addresses in sorted(found.items())
        for address in addresses
        if address.family == socket.AF_INET
    )
    problem = "has no IPv4 address" if name in found else "does not exist"
    raise ClusterError(
        f"--interface {name}: this node's interface {name} {problem}. Fix: name one of "
        f"its interfaces with an address: {have or 'none'}."
    )


def route_address(host: str, port: int) -> str:
    """This node's address on the route to ``host``:``port`` (a UDP socket's local
    address once connected: the kernel's routing choice; nothing is sent); ClusterError
    when no route leads there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
        except OSError as error:
            raise ClusterError(
                f"No route from this node to the scheduler at {host}:{port} "
                f"({error.strerror or error}). Fix: start the scheduler on an interface "
                "this node reaches (snakemake-context up --interface IF), or join from a "
                "node on its network."
            ) from None
        return str(probe.getsockname()[0])
