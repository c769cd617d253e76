"""Tuning-DB key forms and perf-config formats: what newer rocMLIR adds to the strings it writes.

Pure functions, no database (reference: rocmlir-newest §3, §4).

Key forms. A tuning-DB key is perfRunner's canonical test vector, and newer tools append to it:
- `-supportsSplitK true|false` (newest perfRunner; `false` makes rocmlir-gen tune with
  `-disable-split-k-for-tuning`, so it is a different tuning of the same problem);
- `-inputFusions=a,b -outputFusions=c` (fusion tuning keys), before `-supportsSplitK`; perfRunner
  strips them, so a fused kernel's key is the standalone problem's key.
A key without the flag (every older DB) matches `-supportsSplitK true` for gemm-like ops and
`false` for attention (PLAIN_SPLIT_K). mlirtuna stores the problem by its plain canonical key and
the suffix the row had, so that `export --key-format` can write either form and `compare` can
match an old-format DB against a new-format one.

The E4 form (rocmlirTriton's perfRunner at eb003bed): a gemm key always spells `-transO
false|true` after -transB (GemmConfiguration.to_command_line), no -supportsSplitK; e4-split-k
(another rocmlirTriton line, the one with lfbo): both, -transO in the vector and the flag
after. mlirtuna's stored gemm vector spells -transO only when it is true (problems/gemm.py),
so `e4_vector` and `stored_vector` turn one into the other: the one place that knows where the
flag goes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlirtuna.errors import InputError

PLAIN, SPLIT_K, E4, E4_SPLIT_K = "plain", "split-k", "e4", "e4-split-k"
KEY_FORMS = (PLAIN, SPLIT_K, E4, E4_SPLIT_K)
TRANS_O_FLAG = "-transO"
SPLIT_K_FLAG = "-supportsSplitK"
_FUSION_RE = re.compile(r"^-(input|output)Fusions=\S*$")


@dataclass(frozen=True, slots=True)
class Key:
    """A key as written, split into the plain test vector and what newer tools appended."""

    plain: str  # the test vector without the suffix words
    split_k: bool | None  # the -supportsSplitK value; None when the key has no flag
    fusions: str  # "-inputFusions=… -outputFusions=…" as written, or ""

    @property
    def suffix(self) -> str:
        """The appended words, normalised (fusion words first, then the flag)."""
        words = [self.fusions] if self.fusions else []
        if self.split_k is not None:
            words.append(f"{SPLIT_K_FLAG} {'true' if self.split_k else 'false'}")
        return " ".join(words)

    @property
    def form(self) -> str:
        """Which form the row had: fusion, split-k or plain."""
        if self.fusions:
            return "fusion"
        return SPLIT_K if self.split_k is not None else PLAIN


def split_key(text: str) -> Key:
    """Separate a written key into the plain vector, its split-K flag and its fusion words.

    The flag and the fusion words may sit anywhere after the vector (rocMLIR appends them);
    a flag without a value or with another value than true/false is an InputError, as in
    perfRunner's extract_tuning_key_metadata.
    """
    if SPLIT_K_FLAG not in text and "Fusions=" not in text:  # every older key: no split
        return Key(text.strip(), None, "")
    words = text.split()
    kept: list[str] = []
    fusions: list[str] = []
    split_k: bool | None = None
    i = 0
    while i < len(words):
        word = words[i]
        if word == SPLIT_K_FLAG:
            if i + 1 >= len(words):
                raise InputError(f"{SPLIT_K_FLAG} without a value")
            value = words[i + 1].lower()
            if value not in ("true", "false"):
                raise InputError(f"{SPLIT_K_FLAG} {words[i + 1]!r}: expected true or false")
            split_k = value == "true"
            i += 2
            continue
        if _FUSION_RE.match(word):
            fusions.append(word)
        else:
            kept.append(word)
        i += 1
    return Key(" ".join(kept), split_k, " ".join(fusions))


def plain_split_k(op: str) -> bool:
    """What a key without the flag means to perfRunner: true, except for attention (whose
    kernels never split K)."""
    return op != "attention"


def effective_split_k(op: str, split_k: bool | None) -> bool:
    return plain_split_k(op) if split_k is None else split_k


def with_form(op: str, canonical: str, suffix: str, form: str) -> str:
    """The key to write for a stored (canonical, suffix) in the requested form.

    plain: the canonical vector alone (what perfRunner before split-K looks up; a stored
    `false` row is then found as the gemm's only tuning, which is what such a perfRunner runs).
    split-k: the vector plus `-supportsSplitK X`, X the row's own value or the plain default.
    e4: the vector with gemm's -transO always spelled (e4_vector), no split-K flag; e4-split-k:
    that vector and the split-K flag.
    Fusion words are never written: perfRunner strips them before the lookup.
    """
    if form == PLAIN:
        return canonical
    if form in (E4, E4_SPLIT_K):
        canonical = e4_vector(op, canonical)
        if form == E4:
            return canonical
    elif form != SPLIT_K:
        raise ValueError(f"unknown key form {form!r}")
    value = effective_split_k(op, split_k_of(suffix))
    return f"{canonical} {SPLIT_K_FLAG} {'true' if value else 'false'}"


def spells_trans_o(form: str) -> bool:
    """Whether keys of this form spell gemm's -transO (the E4 forms)."""
    return form in (E4, E4_SPLIT_K)


def e4_vector(op: str, vector: str) -> str:
    """A stored test vector as E4's perfRunner spells it: a gemm vector without -transO gets
    `-transO false` after -transB's value (where GemmConfiguration.to_command_line prints it);
    every other vector is already in that form."""
    words = vector.split()
    if op != "gemm" or TRANS_O_FLAG in words or "-transB" not in words:
        return vector
    at = words.index("-transB") + 2
    return " ".join([*words[:at], TRANS_O_FLAG, "false", *words[at:]])


def stored_vector(written: str, op: str | None) -> str:
    """The stored form of a key as a tool wrote it: the plain vector (split_key), and for a gemm
    vector `-transO false` dropped, the default that mlirtuna's vector leaves out. How a tool's
    row, `.state` key or index.json testVector is matched back to a job. `op`: the vector's
    (problems.op_of_vector where only the text is known)."""
    plain = split_key(written).plain
    words = plain.split()
    if op != "gemm" or TRANS_O_FLAG not in words:
        return plain
    at = words.index(TRANS_O_FLAG)
    if at + 1 < len(words) and words[at + 1].lower() in ("false", "0"):
        return " ".join(words[:at] + words[at + 2 :])
    return plain


def split_k_of(suffix: str) -> bool | None:
    return split_key(suffix).split_k if suffix else None


def match_key(op: str | None, written: str, canonical_of=None) -> str:
    """The key two DBs are matched on. A key means what perfRunner makes of it: the plain
    canonical vector when its split-K value is what a plain key stands for (so an old-format row
    meets the new-format row perfRunner would take for it), else the vector with the flag.
    `op`: the key's (problems.op_of_vector where only the text is known; None: not attention)."""
    key = split_key(written)
    stored = stored_vector(written, op)  # gemm's `-transO false` (E4 keys) is the plain vector's
    plain = canonical_of(stored) if canonical_of else stored
    if key.split_k is None or key.split_k == plain_split_k(op or ""):
        return plain
    return f"{plain} {SPLIT_K_FLAG} {'true' if key.split_k else 'false'}"


# --- perf-config formats (a row's `perf_family` column) -----------------------------------

_NAMED_RE = re.compile(r"^(gemm|attn):[A-Za-z]\w*=")
_VERSIONED_RE = re.compile(r"^(?:(gemm|attn):)?v(\d+):")
_CPU_RE = re.compile(r"^cpu:")


def perf_config_format(perf_config: str) -> str:
    """The format a perf config string is written in (stored as the row's `perf_family`), from
    its prefix (the string itself is never changed):

    v1 (positional, no prefix), v2 … v4, attn:v1 … attn:v3 (rocMLIR); gemm:v1 … gemm:v5 and
    attn:v1 … attn:v6 positional, gemm:named / attn:named (rocmlirTriton's key=value form);
    cpu (mlirtuna's CPU tuner); "" for what is none of these (E2's "None", an empty string).
    """
    text = perf_config.strip()
    if not text or text == "None":
        return ""
    if _CPU_RE.match(text):
        return "cpu"
    named = _NAMED_RE.match(text)
    if named:
        return f"{named.group(1)}:named"
    versioned = _VERSIONED_RE.match(text)
    if versioned:
        prefix, version = versioned.group(1), versioned.group(2)
        return f"{prefix}:v{version}" if prefix else f"v{version}"
    if re.fullmatch(r"-?\d+(,-?\d+)+", text):
        return "v1"
    return "other"
