"""What each setting allows, declared once beside the setting.

A setting's :class:`Allowed` says what its value may be (a whole number in a range, a
finite number of seconds, a size, a walltime, one of some words) and how it combines
with the others (it needs another setting, conflicts with one, may not exceed one).
The executor's settings carry it in each field's metadata
(:class:`~..executor.settings.ExecutorSettings`); ``snakemake-context up`` adds its flags
with :func:`add_argument`; both check with :func:`check`, which refuses the first bad
value or combination in one line naming the setting, its value and what is allowed.
The options of the servers and pilots, which both front ends have, declare theirs once
in :mod:`.table`.

Values are parsed here too (:meth:`Allowed.parse`, which never raises): a malformed
value ("1.5" for a whole number) reaches :func:`check` as :class:`Malformed` and is
refused in the same one line, not by argparse's usage text.

An environment variable a user exports is a :class:`Variable` (the table is
:data:`.table.VARIABLES`): read by the same parse wherever it is read, and refused at
start by :func:`check_variables` in the same one line, naming the variable.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import SettingError

__all__ = [
    "Allowed",
    "Malformed",
    "Setting",
    "Variable",
    "add_argument",
    "check",
    "check_parsed",
    "check_value",
    "check_variables",
    "dataclass_settings",
    "filled",
    "settings_field",
    "words_of",
]

WHOLE, NUMBER, SIZE, BUDGET, WALLTIME, TEXT, WORDS, FLAG = (
    "whole",
    "number",
    "size",
    "budget",
    "walltime",
    "text",
    "words",
    "flag",
)


@dataclass(frozen=True)
class Malformed:
    """A value that could not be parsed as its setting's kind."""

    text: str

    def __repr__(self) -> str:
        return repr(self.text)


@dataclass(frozen=True)
class Allowed:
    """What one setting's value may be, and how it combines with the others.

    ``kind``: whole (int), number (finite float), size ('16GB'), budget (a fraction
    in (0, 1] or a size), walltime (read as ``backend``'s batch system reads it),
    text, words (a list of texts), flag (a boolean). Bounds: ``least`` (inclusive),
    ``above`` (exclusive), ``most`` (inclusive; of a size too). ``optional``: None
    (the default) is allowed. ``choices``: the words a text may be. ``zero``: what 0
    means; 0 is then allowed whatever the bounds (a number or a size: "0: no limit,
    else at least 1"). Combinations, by the other settings' names: ``needs`` (one of
    them must be set when this one differs from its default), ``conflicts`` (none of
    them may be set then; ``clash`` says why), ``at_most`` (this one may not exceed
    that one), ``below_walltime`` (seconds that must be below the walltime setting of
    that name). ``form``: a further check of a text or a path (of each, in a list),
    returning the problem (or raising SettingError). ``one_line``: a text (each, in a
    list) must be one line without control characters, as a value written into a file
    read line by line (a pilot's batch script) must be."""

    kind: str = NUMBER
    least: float | None = None
    above: float | None = None
    most: float | None = None
    optional: bool = False
    unit: str = ""
    zero: str = ""
    choices: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    clash: str = "it applies to a cluster this run starts, not to one it attaches to"
    at_most: str = ""
    backend: str = ""
    below_walltime: str = ""
    form: Callable[[str, str], str | None] | None = None
    off: tuple[str, ...] = ()
    one_line: bool = False

    def parse(self, value: Any) -> Any:
        """The value as its kind (a text from the command line or a profile);
        :class:`Malformed` when it is not one. Never raises."""
        if value is None or not isinstance(value, str):
            return value
        text = value.strip()
        if self.zero and text.lower() in self.off:
            return 0 if self.kind in (WHOLE, NUMBER) else "0"
        if self.kind == WHOLE:
            try:
                return int(text)
            except ValueError:
                return Malformed(value)
        if self.kind == NUMBER:
            try:
                return float(text)
            except ValueError:
                return Malformed(value)
        return value

    def describe(self) -> str:
        """What is allowed, as the message's end ('a whole number from 1 to 256')."""
        if self.kind in (WHOLE, NUMBER):
            noun = "a whole number" if self.kind == WHOLE else "a finite number"
            if self.unit:
                noun += f" of {self.unit}"
            bounds = []
            if self.above is not None:
                bounds.append(f"above {_number(self.above)}")
            if self.least is not None and self.most is not None:
                bounds.append(f"from {_number(self.least)} to {_number(self.most)}")
            elif self.least is not None:
                bounds.append(f"at least {_number(self.least)}")
            if self.most is not None and self.least is None:
                bounds.append(f"at most {_number(self.most)}")
            text = noun + (", " + " and ".join(bounds) if bounds else "")
        elif self.kind == SIZE:
            text = "a size such as 16GB" + _size_bounds(self.least, self.most, self.zero)
        elif self.kind == BUDGET:
            text = "a fraction of a server's memory in (0, 1] (e.g. 0.8) or a size (e.g. 6GB)"
        elif self.kind == WALLTIME:
            text = "a walltime the batch system reads"
        elif self.choices:
            text = "one of " + ", ".join(self.choices)
        else:
            text = "a text"
        if self.zero:
            text += f" (0{' or ' + self.off[0] if self.off else ''}: {self.zero})"
        if self.optional:
            text += "; or leave it out for the default"
        return text

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of this setting alone (None: nothing)."""
        if value is None:
            return None if self.optional else self.describe()
        if isinstance(value, Malformed):
            return self.describe()
        if self.one_line and not _one_line(value):
            return (
                "one line without control characters (a newline, a tab, an escape): "
                "in a pilot's batch script a newline would start lines of its own"
            )
        if self.kind in (WHOLE, NUMBER):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return self.describe()
            if not math.isfinite(value):
                return self.describe()
            if self.kind == WHOLE and not float(value).is_integer():
                return self.describe()
            if self.zero and value == 0:
                return None
            if self.least is not None and value < self.least:
                return self.describe()
            if self.above is not None and value <= self.above:
                return self.describe()
            if self.most is not None and value > self.most:
                return self.describe()
            return None
        if self.kind in (SIZE, BUDGET):
            fits = _size_ok(value, self.kind == BUDGET, self.least, self.most, bool(self.zero))
            return None if fits else self.describe()
        if self.kind in (TEXT, WALLTIME) and not isinstance(value, (str, os.PathLike)):
            return self.describe()
        if self.kind == TEXT and not _utf8(os.fspath(value)):
            return "a text (or path) in UTF-8, which this is not"
        if self.choices and value not in self.choices:
            return self.describe()
        return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _one_line(value: Any) -> bool:
    """Whether a text (each, in a list) holds no control character."""
    from ..terminal import shown

    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, (str, os.PathLike)):
            text = os.fsdecode(os.fspath(item))
            if shown(text) != text:
                return False
    return True


def _utf8(text: str | bytes) -> bool:
    """Whether a text is valid UTF-8 (a name of bytes that are not reaches Python with
    surrogates in it: :func:`os.fsdecode`)."""
    try:
        (text if isinstance(text, bytes) else text.encode()).decode()
    except UnicodeError:
        return False
    return True


def _size_bytes(value: Any) -> int:
    """The bytes of a size :meth:`Allowed.problem` allowed."""
    from dask.utils import parse_bytes

    return int(parse_bytes(str(value).strip()))


def _size_text(nbytes: float) -> str:
    from ..terminal import format_bytes

    return format_bytes(int(nbytes))


def _size_bounds(least: float | None, most: float | None, zero: str) -> str:
    if least and most:
        return f", from {_size_text(least)} to {_size_text(most)}"
    if least:
        return f", at least {_size_text(least)}"
    bound = f", at most {_size_text(most)}" if most else ""
    return bound if zero else ", above 0" + bound


def _size_ok(
    value: Any, fraction: bool, least: float | None, most: float | None = None, zero: bool = False
) -> bool:
    from dask.utils import parse_bytes

    text = str(value).strip()
    if fraction:
        try:
            share = float(text)
        except ValueError:
            pass
        else:
            return 0 < share <= 1
    try:
        nbytes = parse_bytes(text) if text else -1
    except (ValueError, TypeError, KeyError, OverflowError):
        return False
    if zero and nbytes == 0:
        return True
    return bool(
        nbytes > 0 and (least is None or nbytes >= least) and (most is None or nbytes <= most)
    )


def filled(flag: str, value: str) -> str | None:
    """A ``form`` that refuses an empty text (given as ``--flag ''``): it would
    otherwise be taken silently as the default."""
    return None if value.strip() else "an empty value; leave the flag out for the default"


@dataclass(frozen=True)
class Setting:
    """One setting as the user spells it: its name (the dataclass field or argparse
    destination), its flag, its default and what it allows."""

    name: str
    flag: str
    default: Any
    allowed: Allowed


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(repr(item) for item in value)
    if isinstance(value, os.PathLike):
        return repr(os.fspath(value))
    return repr(value)


def _differs(value: Any, default: Any) -> bool:
    if value in (None, False) or value == default:
        return False
    return not (isinstance(value, (list, tuple)) and not value)


def check(values: Mapping[str, Any], settings: Sequence[Setting]) -> None:
    """Refuse the first bad value, then the first bad combination, of ``values`` (by
    setting name), in one line (SettingError) naming the setting and what it allows."""
    by_name = {setting.name: setting for setting in settings}
    for setting in settings:
        value = values.get(setting.name)
        problem = setting.allowed.problem(value)
        if problem is not None:
            raise SettingError(f"{setting.flag} {_shown(value)} is not allowed: {problem}.")
    for setting in settings:
        _check_combination(setting, values, by_name)


def check_value(flag: str, value: Any, allowed: Allowed, shown: str = "") -> Any:
    """One value of a flag that holds several (``RULE=S``, ``MODEL:COUNT``), parsed
    by ``allowed``; else the one line of :func:`check`, naming the flag and the part
    the user typed (``shown``: "infer=inf"; default the value); the parsed value."""
    parsed = allowed.parse(value)
    problem = allowed.problem(parsed)
    if problem is not None:
        raise SettingError(f"{flag} {shown or value!r} is not allowed: {problem}.")
    return parsed


@dataclass(frozen=True)
class Variable:
    """An environment variable a user sets (exports): its name, what it allows, what it
    means, an example value (for the fix) and what it means unset (or blank).

    Read it with :meth:`read` wherever it is read, so that it means the same
    everywhere; :func:`check_variables` refuses a bad value at start, as :func:`check`
    refuses a flag's."""

    name: str
    allowed: Allowed
    means: str
    example: str
    unset: str

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """Its value in ``environ`` (default :data:`os.environ`): None when unset or
        blank; else as ``allowed`` parses it (a size in bytes, 0 for 0 and the words
        meaning it; a number; a whole number; a text). A value ``allowed`` refuses
        raises the one line of :func:`check_variables` (SettingError); its ``form`` is
        checked only there, at start."""
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or not raw.strip():
            return None
        parsed = self.allowed.parse(raw)
        problem = self.allowed.problem(parsed)
        if problem is not None:
            raise self.refused(raw, problem)
        return _size_bytes(parsed) if self.allowed.kind == SIZE else parsed

    def refused(self, raw: str, problem: str) -> SettingError:
        """The one line refusing ``raw``: the variable, its value, what is allowed and
        the fix."""
        shown = repr(raw) if _utf8(raw) else repr(os.fsencode(raw))
        return SettingError(
            f"{self.name}={shown} is not allowed: {problem}. "
            f"Fix: export {self.example}, or unset it ({self.unset})."
        )


def check_variables(
    variables: Iterable[Variable], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse the first bad value of ``variables`` in ``environ`` (default
    :data:`os.environ`), each read and further checked (its ``form``), in one line
    (SettingError) naming the variable, its value, what is allowed and the fix."""
    environ = os.environ if environ is None else environ
    for variable in variables:
        value = variable.read(environ)
        form = variable.allowed.form
        if value is not None and form is not None:
            raw = environ[variable.name]
            found = form(variable.name, raw)
            if found:
                raise variable.refused(raw, found)


def _check_combination(setting: Setting, values: Mapping[str, Any], by_name: dict) -> None:
    allowed, value = setting.allowed, values.get(setting.name)
    given = _differs(value, setting.default)
    if given and allowed.needs and not any(values.get(n) for n in allowed.needs):
        others = " or ".join(by_name[n].flag for n in allowed.needs)
        raise SettingError(
            f"{setting.flag} {_shown(value)} is not allowed without {others}: it has no "
            f"effect there. Fix: add {others}, or drop {setting.flag}."
        )
    if given and allowed.conflicts:
        clash = [n for n in allowed.conflicts if values.get(n)]
        if clash:
            other = by_name[clash[0]].flag
            raise SettingError(
                f"{setting.flag} {_shown(value)} is not allowed with {other}: "
                f"{allowed.clash}. Fix: drop one."
            )
    if allowed.at_most and value is not None:
        limit = values.get(allowed.at_most)
        if isinstance(limit, (int, float)) and value > limit:
            other = by_name[allowed.at_most].flag
            raise SettingError(
                f"{setting.flag} {_shown(value)} is not allowed above {other} {limit}. "
                f"Fix: raise {other} or lower {setting.flag}."
            )
    if allowed.kind == WALLTIME and isinstance(value, str):
        _check_walltime(setting, value, values, by_name)
    if allowed.below_walltime and value is not None:
        _check_margin(setting, value, values, by_name)
    if allowed.form is not None and given:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (str, os.PathLike)):
                found = allowed.form(setting.flag, os.fspath(item))
                if found:
                    raise SettingError(f"{setting.flag} {_shown(item)} is not allowed: {found}.")


def _check_walltime(setting: Setting, value: str, values: Mapping[str, Any], by_name: dict) -> None:
    from ..pilots.batch.walltime import WalltimeError, read_walltime

    backend = values.get(setting.allowed.backend)
    if not backend:
        return  # without a backend, the walltime is unused (and `needs` says so)
    try:
        read_walltime(str(backend), value)
    except WalltimeError as error:
        raise SettingError(f"{setting.flag} {value!r} is not allowed: {error}.") from None


def _check_margin(setting: Setting, value: Any, values: Mapping[str, Any], by_name: dict) -> None:
    from ..pilots.batch.walltime import WalltimeError, read_walltime

    walltime = by_name[setting.allowed.below_walltime]
    backend = values.get(walltime.allowed.backend)
    if not backend:
        return
    try:
        reading = read_walltime(str(backend), str(values.get(walltime.name)))
    except WalltimeError:
        return  # refused under the walltime's own name
    if value >= reading.seconds:
        raise SettingError(
            f"{setting.flag} {value:g} is not allowed with {walltime.flag} "
            f"{reading.text!r} ({reading.describe()}): a pilot would retire before it "
            f"starts. Fix: a margin below {reading.seconds} s, or a longer walltime."
        )


# -- the two front ends ---------------------------------------------------------------


def settings_field(default: Any, allowed: Allowed, metadata: dict[str, Any]) -> Any:
    """A dataclass field of Snakemake plugin settings whose value ``allowed`` declares
    (``metadata``: its help text and Snakemake's other keys; env_var and required
    default to False): a number is parsed by ``allowed`` (Snakemake's ``parse_func``),
    so that a malformed one is refused in one line by :func:`check`."""
    metadata.setdefault("env_var", False)
    metadata.setdefault("required", False)
    metadata["allowed"] = allowed
    if allowed.kind in (WHOLE, NUMBER):
        metadata["parse_func"] = allowed.parse
        metadata["unparse_func"] = str
    return field(default=default, metadata=metadata)


def dataclass_settings(cls: type, prefix: str) -> list[Setting]:
    """The settings of a dataclass whose fields carry ``allowed`` in their metadata
    (the flag: ``prefix`` + the field's name with dashes)."""
    found = []
    for item in fields(cls):
        allowed = item.metadata.get("allowed")
        if allowed is not None:
            flag = prefix + item.name.replace("_", "-")
            found.append(Setting(item.name, flag, item.default, allowed))
    return found


_TABLE = "_allowed_settings"


def add_argument(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    allowed: Allowed,
    *,
    short: str = "",
    **kwargs: Any,
) -> argparse.Action:
    """``parser.add_argument(flag, ...)`` (and its ``short`` form, "-s"), parsed and
    later checked by ``allowed`` (:func:`check_parsed`); a parser's argument group
    works too."""
    if allowed.kind in (WHOLE, NUMBER):
        kwargs.setdefault("type", allowed.parse)
    action = parser.add_argument(*([short] if short else []), flag, **kwargs)
    table = parser.get_default(_TABLE)
    if table is None:
        table = {}
        parser.set_defaults(**{_TABLE: table})
    table[action.dest] = Setting(action.dest, flag, action.default, allowed)
    return action


def check_parsed(args: argparse.Namespace) -> None:
    """:func:`check` the arguments of a parser built with :func:`add_argument`."""
    settings = list((getattr(args, _TABLE, None) or {}).values())
    check(vars(args), settings)


def words_of(value: Any) -> tuple[str, ...]:
    """A list setting's values: Snakemake may hand a list, or its text ("['a', 'b']")."""
    if not value:
        return ()
    if isinstance(value, str):
        import ast

        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        value = parsed if isinstance(parsed, (list, tuple)) else [value]
    return tuple(str(item) for item in value)
