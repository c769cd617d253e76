"""What every op module shares: expansion options and the parsing of `-flag value` tokens."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from operator import attrgetter, lt
from typing import Any

from mlirtuna.errors import InputError, UserError
from mlirtuna.textinput import INT32_MAX, ascii_int, clip, is_ascii_int, quote


@dataclass(frozen=True)
class ExpandOptions:
    """What perfRunner's expansion may fill in where a config line leaves it out.

    Only what a line leaves out is filled in: its own prefix/-t/-F/layouts always win. None means
    perfRunner's default set for that op (see each op module). Data types take rocMLIR names
    (f32 f16 bf16 i8 fp8 …; conv also takes its MIOpen prefixes), directions fwd/bwd/wrw or
    1/2/4. `expand=False` takes every line as written (a conv line without a data-type prefix is
    then f32 `conv`).
    """

    data_types: tuple[str, ...] | None = None
    directions: tuple[str, ...] | None = None
    layouts: tuple[str, ...] | None = None
    expand: bool = True

    def __post_init__(self) -> None:
        # Kept hashable (the op modules cache resolved options) whatever sequence a caller gives.
        for name in ("data_types", "directions", "layouts"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))


# --- Token helpers shared by the op modules.

_BOOLS = {"1": True, "true": True, "0": False, "false": False}


def flag_values(tokens: Sequence[str], op: str, known: frozenset[str]) -> dict[str, str]:
    """Pairs `-flag value` tokens; rejects unknown, repeated and value-less flags."""
    values = dict(zip(tokens[::2], tokens[1::2], strict=False))
    # The checks run in C; only a bad line walks the tokens to say what is wrong.
    if (
        len(tokens) % 2
        or 2 * len(values) != len(tokens)
        or not known.issuperset(values)
        or not known.isdisjoint(values.values())
    ):
        _flag_error(tokens, op, known)
    return values


def _flag_error(tokens: Sequence[str], op: str, known: frozenset[str]) -> None:
    seen = set()
    for i in range(0, len(tokens), 2):
        flag = tokens[i]
        if flag not in known:
            if flag.startswith("-"):
                raise InputError(f"unknown flag {clip(flag)} for {op}")
            raise InputError(f"expected a flag, got {quote(flag)}")
        if i + 1 == len(tokens) or tokens[i + 1] in known:
            raise InputError(f"{flag}: missing value")
        if flag in seen:
            raise InputError(f"{flag}: given twice")
        seen.add(flag)


def int_value(flag: str, text: str) -> int:
    """A decimal integer in ASCII digits that fits a database INTEGER, or an InputError that
    names the flag."""
    return ascii_int(flag, text, -INT32_MAX)


def bool_value(flag: str, text: str) -> bool:
    """1/0/true/false in any case, as rocMLIR's scripts write them (newer files say `False`)."""
    value = _BOOLS.get(text.lower())
    if value is None:
        raise InputError(f"{flag}: expected true, false, 1 or 0, got {quote(text)}")
    return value


def check_minimum(flag: str, value: object, minimum: int) -> None:
    """Sizes come from files and from database rows alike: both are checked the same way."""
    if type(value) is not int or value < minimum:
        shown = quote(value) if isinstance(value, str) else repr(value)
        raise InputError(f"{flag}: expected an integer >= {minimum}, got {shown}")
    if value > INT32_MAX:  # what every backend's INTEGER column holds
        raise InputError(f"{flag}: {value} is out of range (at most {INT32_MAX})")


class SizeFlags:
    """The integer flags of an op: rows of (flag, field, minimum, default or None = required).

    Parsing and checking run over whole rows in C where they can: a config list can hold 100,000
    lines, and only a bad one takes the slow path that names the culprit.
    """

    def __init__(self, *rows: tuple[str, str, int, int | None]) -> None:
        self.rows = rows
        self.flags = tuple(row[0] for row in rows)
        self.names = tuple(row[1] for row in rows)
        self._values = attrgetter(*self.names)
        self._minimums = tuple(row[2] for row in rows)

    def parse(self, flags: Mapping[str, str]) -> dict[str, int]:
        """Field -> value for every row, the default where the flag is absent."""
        with contextlib.suppress(KeyError):  # a flag absent: the slow path gives its default
            texts = list(map(flags.__getitem__, self.flags))
            if all(map(is_ascii_int, texts)):
                return dict(zip(self.names, map(int, texts), strict=True))
        # A flag absent or not plain ASCII digits: the slow path names the culprit.
        return {
            name: int_value(flag, flags[flag]) if flag in flags else _default(flag, default)
            for flag, name, _, default in self.rows
        }

    def check(self, problem: object) -> None:
        """Every field an int at least its minimum (from a line or a database row alike)."""
        values = self._values(problem)
        if (
            set(map(type, values)) != {int}
            or any(map(lt, values, self._minimums))
            or max(values, default=0) > INT32_MAX
        ):
            for (flag, _, minimum, _), value in zip(self.rows, values, strict=True):
                check_minimum(flag, value, minimum)


def _default(flag: str, default: int | None) -> int:
    if default is None:
        raise InputError(f"missing required flag {flag}")
    return default


def known_name(flag: str, text: str, names: Mapping[str, str]) -> str:
    """Looks a data-type name up case-insensitively; `names` maps lowercase -> canonical."""
    name = names.get(text.lower())
    if name is None:
        known = ", ".join(dict.fromkeys(names.values()))
        raise InputError(f"{flag}: unknown data type {quote(text)} (known: {known})")
    return name


def check_name(flag: str, value: object, known: Sequence[str]) -> None:
    """A data-type field (from a parsed line or a database row) must be one the op knows."""
    if value not in known:
        raise InputError(f"{flag}: unknown data type {value!r} (known: {', '.join(known)})")


def option_values(
    what: str, given: Iterable[str] | None, names: Mapping[str, Any], default: Sequence[Any]
) -> tuple[Any, ...]:
    """Resolves one ExpandOptions field against the names an op knows (None: the default)."""
    if given is None:
        return tuple(default)
    values = []
    for name in given:
        if name not in names:
            raise UserError(f"unknown {what} {name!r} (known: {', '.join(names)})")
        values.append(names[name])
    return tuple(dict.fromkeys(values))


class Columns:
    """columns() and from_columns() for a problem whose fields are its table's columns."""

    @classmethod
    @cache
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    def columns(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> Any:
        """The problem a config-table row describes (extra keys such as `id` are ignored)."""
        return cls(**{name: columns[name] for name in cls.field_names() if name in columns})


def bool_text(value: bool) -> str:
    """A boolean as rocMLIR's canonical strings spell it."""
    return "true" if value else "false"
