"""Reading input files that may be hostile: what every config list and tuning DB goes through.

Regular files only (not /dev/zero, a FIFO, a directory); UTF-8 with an optional BOM; lines of
bounded length (a 1 GB single line is refused after MAX_LINE_CHARS, not read whole); no NUL or
other control characters. Each refusal is one InputError at FILE:LINE. Integers follow one
explicit rule: ASCII digits with an optional minus, bounded length, within the column's range.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from typing import BinaryIO

from mlirtuna.errors import InputError, UserError

MAX_LINE_CHARS = 64 << 10  # a rocMLIR config line is ~200 characters, a tuning-DB row ~600
INT32_MAX = 2**31 - 1  # the INTEGER columns of every backend
QUOTE_CHARS = 80
_BOM = "\ufeff"
_BLOCK = 1 << 20
# C0 controls but tab, CR and LF, DEL, and the C1 controls.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_ASCII_INT = re.compile(r"-?[0-9]{1,18}\Z")
# A float as C's strtod writes one, ASCII only: `float()` alone also takes `12_5`, fullwidth and
# Arabic-Indic digits and surrounding spaces. inf and nan as Python and pandas write them.
_ASCII_FLOAT = re.compile(
    r"[+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,4})?\Z"
    r"|[+-]?(?:inf|infinity|nan)\Z",
    re.IGNORECASE,
)


# What a terminal would act on or hide: C0/C1 controls (newline and tab included, so that an
# error stays one line), DEL, the line and paragraph separators and the bidi overrides.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character escaped (`\\x1b`, `\\n`, `\\u202e`): a file name
    holding `ESC[2J` or a newline is shown, never acted on by the terminal."""

    def escape(match: re.Match[str]) -> str:
        c = match.group()
        return ascii(c)[1:-1] if ord(c) < 0x100 else f"\\u{ord(c):04x}"

    return _UNPRINTABLE.sub(escape, text)


def quote(text: str) -> str:
    """A token as an error message shows it: repr, at most QUOTE_CHARS characters of it."""
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return repr(text[:QUOTE_CHARS]) + f"… ({len(text)} characters)"


def clip(text: str) -> str:
    """A token as written, cut to QUOTE_CHARS characters (for names shown without quotes)."""
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def is_ascii_int(text: str) -> bool:
    return _ASCII_INT.match(text) is not None


def ascii_int(what: str, text: str, minimum: int | None = None, maximum: int = INT32_MAX) -> int:
    """An integer written as ASCII digits (an optional leading minus), within [minimum, maximum].

    `int()` alone takes `+64`, `6_4`, Arabic-Indic or fullwidth digits, and 4,300 digits; a
    value past 2**31 would be a PostgreSQL traceback or a silent SQLite store."""
    if not is_ascii_int(text):
        raise InputError(f"{what}: expected an integer, got {quote(text)}")
    value = int(text)
    if value > maximum or (minimum is not None and value < minimum):
        low = "" if minimum is None else f"{minimum} to "
        raise InputError(f"{what}: {value} is out of range ({low}{maximum})")
    return value


def is_ascii_float(text: str) -> bool:
    return _ASCII_FLOAT.match(text) is not None


def ascii_float(what: str, text: str) -> float:
    """A float written in ASCII (digits, one point, an exponent; inf and nan); InputError
    otherwise."""
    if not is_ascii_float(text):
        raise InputError(f"{what} {quote(text)} is not a number")
    return float(text)


def check_line(line: str) -> None:
    """No NUL or other control character in a line (tabs separate fields; CR/LF end lines)."""
    bad = _CONTROL.search(line)
    if bad is not None:
        raise InputError(f"control character U+{ord(bad.group()):04X} at column {bad.start() + 1}")


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of `path` if it is a regular file, opened without blocking on a FIFO and
    then set blocking; UserError naming the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as error:
        raise UserError(f"{path}: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UserError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd, info


def read_text_capped(path: str, max_bytes: int) -> str:
    """A regular UTF-8 text file of at most `max_bytes` (its size is checked before reading, and
    no more than the cap is read even if it grows); no NUL or other control character (tabs,
    CR and LF allowed). One UserError, at FILE:LINE where there is a line, for anything else."""
    fd, info = _open_regular(path)
    with open(fd, "rb") as f:
        if info.st_size > max_bytes:
            raise UserError(f"{path}: {info.st_size} bytes, over the cap of {max_bytes} bytes")
        try:
            data = f.read(max_bytes + 1)
        except OSError as error:
            raise UserError(f"{path}: {error.strerror or error}") from None
    if len(data) > max_bytes:
        raise UserError(f"{path}: over the cap of {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise InputError(f"not UTF-8 (byte 0x{data[error.start]:02x})", path, line) from None
    if text.startswith(_BOM):
        text = text[1:]
    bad = _CONTROL.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        raise InputError(f"control character U+{ord(bad.group()):04X}", path, line)
    return text


def read_lines(path: str) -> Iterator[str]:
    """The lines of a regular UTF-8 text file, each checked, ends of line kept; errors name
    FILE:LINE (or FILE for the file itself)."""
    fd, _ = _open_regular(path)
    with open(fd, "rb") as f:
        yield from _checked_lines(f, path)


def _checked_lines(f: BinaryIO, path: str) -> Iterator[str]:
    # Read in blocks and check each block at once (decode, control characters) in C; a line
    # without an end within MAX_LINE_CHARS is refused before more of it is read.
    lineno, rest = 0, b""
    while True:
        chunk = f.read(_BLOCK)
        data = rest + chunk
        end = data.rfind(b"\n") + 1 if chunk else len(data)
        if not end and len(data) > MAX_LINE_CHARS:
            raise InputError(f"line longer than {MAX_LINE_CHARS} bytes", path, lineno + 1)
        block, rest = data[:end], data[end:]
        if block:
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as error:
                at = lineno + block.count(b"\n", 0, error.start) + 1
                bad = block[error.start]
                raise InputError(f"not UTF-8 (byte 0x{bad:02x})", path, at) from None
            if lineno == 0 and text.startswith(_BOM):
                text = text[1:]
            lines = text.split("\n")
            last = lines.pop()  # "" after a final end of line; else a last line without one
            if last:
                lines.append(last)
            long = len(text) > MAX_LINE_CHARS and max(map(len, lines)) >= MAX_LINE_CHARS
            if long or _CONTROL.search(text) is not None:
                _line_error(lines, lineno, path)
            for line in lines:
                lineno += 1
                yield line + "\n"
            if last:  # only at the end of the file: the line had no end of line
                return
        if not chunk:
            return


def _line_error(lines: list[str], lineno: int, path: str) -> None:
    """The first line of a block that is too long or holds a control character, at FILE:LINE."""
    for i, line in enumerate(lines, lineno + 1):
        if len(line) >= MAX_LINE_CHARS:
            raise InputError(f"line longer than {MAX_LINE_CHARS} bytes", path, i)
        try:
            check_line(line)
        except InputError as error:
            raise error.at(path, i) from None
