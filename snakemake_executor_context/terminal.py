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

A job's failure is shown by :func:`error_text` (an exception's text, bounded, its class
where ``str()`` fails) and at the terminal by :func:`shortened`.

A byte count is shown to people one way, everywhere (messages, notes, the commands'
text, the monitor): :func:`format_bytes`.

Standard library only, and nothing of the project: every floor may use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MESSAGE_LIMIT",
    "error_text",
    "format_bytes",
    "printable",
    "shortened",
    "shown",
    "shown_values",
]

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


#: The characters of an exception's message a job's result carries (its log keeps all).
MESSAGE_LIMIT = 4000


def error_text(error: BaseException, typed: bool = True) -> str:
    """``Type: message`` of an exception (``typed=False``: the message), for a job's
    result: cut after :data:`MESSAGE_LIMIT` characters, the class name alone where
    ``str()`` fails (an exception's own ``__str__`` may raise)."""
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:
        return name
    if len(text) > MESSAGE_LIMIT:
        text = f"{text[:MESSAGE_LIMIT]}... ({len(text):,} characters)"
    return f"{name}: {text}" if typed else text


def shortened(text: str, log: str, limit: int = 1000) -> str:
    """A job's failure as the terminal shows it: whole up to ``limit`` characters;
    longer (an exception's message of megabytes), its first line cut to half of that,
    then where the whole is, the job's ``log``."""
    if len(text) <= limit:
        return text
    first = text[: limit // 2].split("\n", 1)[0]
    return f"{first} ... see the job's log {log}"


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
