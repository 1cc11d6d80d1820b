"""JSON-lines files: FEVER's format, and the claims the workflow writes.

Its own module so that the claim generator and the workflow's steps share it without
importing each other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["read_jsonl", "write_jsonl"]


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file (blank lines skipped)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON lines (stable key order, byte-identical for equal input)."""
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
