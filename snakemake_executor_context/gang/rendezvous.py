"""A gang's rendezvous, kept by its driver: the key-value store ``torch.distributed``
needs to join a group, reached over each rank's own connection to its driver.

No listener, no file: a rank's :func:`relay_store` sends each store operation over
the socket pair only its driver holds (and, for a rank on another node, through its
server's authenticated connection to the driver's server), and the driver answers it
from its :class:`StoreBook`. (torch's own ``TCPStore`` listens on a port that anyone
on the network may use.)

Standard library only here; :func:`relay_store` imports torch in the rank process.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["STORE", "StoreBook", "relay_store"]

#: The first item of a rank's message that is a store operation.
STORE = "store"
#: Seconds between a rank's polls for a key another rank has not set yet.
POLL_SECONDS = 0.01


class StoreBook:
    """The keys of one gang's rendezvous (the driver's side): every operation is
    answered at once; a missing key is ``None``, and the rank polls again."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def answer(self, op: str, args: tuple[Any, ...]) -> Any:
        """The result of one store operation."""
        with self._lock:
            keys = self._keys
            if op == "set":
                keys[args[0]] = _bytes(args[1])
                return None
            if op == "get":
                return keys.get(args[0])
            if op == "add":
                value = int(keys.get(args[0], b"0")) + int(args[1])
                keys[args[0]] = str(value).encode()
                return value
            if op == "compare_set":
                key, expected, desired = args[0], _bytes(args[1]), _bytes(args[2])
                current = keys.get(key)
                if (current is None and not expected) or current == expected:
                    keys[key] = desired
                    return desired
                return current if current is not None else expected
            if op == "check":
                return all(key in keys for key in args[0])
            if op == "delete_key":
                return keys.pop(args[0], None) is not None
            if op == "num_keys":
                return len(keys)
        raise ValueError(f"unknown store operation {op!r}")


def relay_store(conn: Any, timeout: float) -> Any:
    """A ``torch.distributed.Store`` whose operations its driver answers (rank side)."""
    import torch.distributed as dist

    class RelayStore(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self._timeout = timeout

        def _ask(self, op: str, *args: Any) -> Any:
            conn.send((STORE, op, args))
            answer = conn.recv()
            if isinstance(answer, Exception):
                raise answer
            return answer

        def set(self, key: str, value: Any) -> None:
            self._ask("set", key, _bytes(value))

        def get(self, key: str) -> bytes:
            deadline = time.monotonic() + self._timeout
            while True:
                value = self._ask("get", key)
                if value is not None:
                    return bytes(value)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rendezvous: key {key!r} not set in {self._timeout:g} s")
                time.sleep(POLL_SECONDS)

        def add(self, key: str, amount: int) -> int:
            return int(self._ask("add", key, int(amount)))

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return bytes(self._ask("compare_set", key, _bytes(expected), _bytes(desired)))

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            deadline = time.monotonic() + self._timeout
            while not self._ask("check", list(keys)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rendezvous: keys {keys} not set in {self._timeout:g} s")
                time.sleep(POLL_SECONDS)

        def check(self, keys: list[str]) -> bool:
            return bool(self._ask("check", list(keys)))

        def delete_key(self, key: str) -> bool:
            return bool(self._ask("delete_key", key))

        def num_keys(self) -> int:
            return int(self._ask("num_keys"))

        def set_timeout(self, timeout: Any) -> None:
            seconds = getattr(timeout, "total_seconds", None)
            self._timeout = float(seconds()) if callable(seconds) else float(timeout)

    return RelayStore()


def _bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)
