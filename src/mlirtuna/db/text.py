"""Tool text made fit to store: valid UTF-8, no NUL, and at most a byte budget long.

A tool's output is data we do not control. PostgreSQL refuses NUL in text; MariaDB refuses
invalid UTF-8 ("Incorrect string value") and a TEXT column holds 65,535 *bytes*, not characters
("Data too long"). Every tool text stored (job.result, attempt.message, candidate.error) passes
through `cut_text`, so a poisonous stderr costs its tail, never the job.
"""

from __future__ import annotations

import re

# TEXT on MariaDB/MySQL holds 65,535 bytes; this leaves room for the "attempt n/m failed: "
# prefix added around a message, so every stored text fits the smallest column on any backend.
MAX_TEXT_BYTES = 60_000
MAX_CANDIDATE_ERROR_BYTES = 4_000  # one line per failed perf config; thousands of them per job
_CUT_MARK = "…"  # a cut text starts with this: the tail is the useful part of a tool's output
# NUL (PostgreSQL refuses it in text) and lone surrogates (not encodable as UTF-8 at all).
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Invalid UTF-8 (lone surrogates, e.g. from `surrogateescape`) becomes U+FFFD; NUL too."""
    return _BAD_CHARS.sub("\ufffd", text)


def cut_text(text: str | None, max_bytes: int = MAX_TEXT_BYTES) -> str | None:
    """`text`, cleaned, and cut from the front to at most `max_bytes` of UTF-8."""
    if text is None:
        return None
    text = clean_text(text)
    if len(text) * 4 <= max_bytes:  # cannot be too long, whatever the characters
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    keep = max_bytes - len(_CUT_MARK.encode("utf-8"))
    # Cutting at a byte offset may split a character: "ignore" drops its stray continuation bytes.
    return _CUT_MARK + data[-keep:].decode("utf-8", "ignore")
