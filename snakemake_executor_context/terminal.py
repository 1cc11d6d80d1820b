"""Values from a workflow or a catalog, made safe to show on a terminal.

A wildcard value, a rule, context or server name, a loss reason or a path read from a
catalog another user wrote can hold control characters: an ESC sequence that recolours,
moves the cursor, retitles the window or hides text, a carriage return that overwrites
the line, a newline that forges one. Every place the plugin prints such a value (the
``snakemake-context`` commands, the executor's errors, the monitor) shows it through
:func:`shown` (one value: every control character escaped, newlines too) or
:func:`printable` (a text made of lines: newlines and tabs kept, every other control
character escaped). Escaped means visible: ESC is shown as ``\\x1b``, a newline inside a
value as ``\\n``, a right-to-left override as ``\\u202e``.

A byte count is shown to people one way, everywhere (messages, notes, the commands'
text, the monitor): :func:`format_bytes`.

Standard library only, and nothing of the project: every floor may use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["format_bytes", "printable", "shown", "shown_values"]

#: C0 controls, DEL, C1 controls, and the format characters that reorder or break
#: lines (bidirectional overrides and isolates, the line and paragraph separators).
_FORMAT = "\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ANY_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT}]")
_BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_FORMAT}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: Decimal units, as a user writes a size ("8GB" is 8e9 bytes to the settings).
_BYTE_UNITS = ("kB", "MB", "GB", "TB", "PB")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object) -> str:
    """``str(value)`` with every control character escaped visibly (newlines and
    tabs too): one value inside a line."""
    text = value if isinstance(value, str) else str(value)
    return _ANY_CONTROL.sub(_escape, text)


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab escaped visibly: a
    whole message or a block of lines whose line breaks are its own."""
    return _BUT_LINES.sub(_escape, text)


def shown_values(data: Any) -> Any:
    """``data`` (dicts, lists, tuples of values, as a query returns them) with every
    string in it, keys included, passed through :func:`shown`; other values as they
    are."""
    if isinstance(data, str):
        return shown(data)
    if isinstance(data, Mapping):
        return {shown_values(key): shown_values(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple
        return type(data)(*(shown_values(item) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(shown_values(item) for item in data)
    return data


def format_bytes(nbytes: float) -> str:
    """A byte count for people, in decimal units to three significant digits:
    ``'512 B'``, ``'1.23 GB'``, ``'12.0 MB'``, ``'141 GB'`` (petabytes at most; a
    negative count keeps its sign)."""
    value = float(nbytes)
    if abs(value) < 999.5:
        return f"{value:.0f} B"
    for unit in _BYTE_UNITS:
        value /= 1000
        if abs(value) < 999.5 or unit == _BYTE_UNITS[-1]:
            break
    digits = 2 if abs(value) < 9.995 else 1 if abs(value) < 99.95 else 0
    return f"{value:.{digits}f} {unit}"
