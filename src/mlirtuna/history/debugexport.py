"""`export --format debug`: every candidate of sessions as rocMLIR's `.debug` TSV.

rocMLIR's quick-tuning tools (`quickTuningGen.py`, `analysis/tuning_eval`) learn from the
`.debug` files tuningRunner writes with `--debug`: pandas TSV rows of perfRunner's
`table_entry()`, one per candidate (reference: rocmlir-newest §7). This writes the farm's whole
history in that layout, so those tools read every session instead of one run's file:

- columns: `Chip numCU` (the session's chip and CU count, so several archs share one file),
  then the op's problem columns as table_entry() names them, then `PerfConfig` and `TFlops`;
- one row per candidate; an invalid candidate (N/A, Discarded, failed) has TFlops `NaN`;
  sessions without candidates (imported .tsv files) give their winners, all there is;
- one op per file: the columns differ per op, so sessions holding several ops need `--op`;
- booleans as pandas writes them (`True`/`False`), no index column, tab-separated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mlirtuna import problems
from mlirtuna.db.models import Candidate, Problem, Result, TuningSession
from mlirtuna.errors import UserError

NAN = "NaN"

# perfRunner's table_entry() problem columns per op (reportUtils' *_TEST_PARAMETERS, newest).
COLUMNS: dict[str, list[str]] = {
    "conv": [
        "Direction",
        "DataType",
        "FilterLayout",
        "InputLayout",
        "OutputLayout",
        "N",
        "C",
        "H",
        "W",
        "K",
        "Y",
        "X",
        "DilationH",
        "DilationW",
        "StrideH",
        "StrideW",
        "PaddingH",
        "PaddingW",
    ],
    "gemm": ["DataType", "OutDataType", "TransA", "TransB", "TransO", "G", "M", "K", "N"],
    "attention": [
        "DataType",
        "TransQ",
        "TransK",
        "TransV",
        "TransO",
        "Causal",
        "ReturnLSE",
        "SplitKV",
        "WithAttnScale",
        "WithAttnBias",
        "G",
        "SeqLenQ",
        "SeqLenK",
        "NumHeadsQ",
        "NumHeadsKV",
        "HeadDimQK",
        "HeadDimV",
    ],
}
CHIP_COLUMNS = ("Chip", "numCU")
TAIL_COLUMNS = ("PerfConfig", "TFlops")


def header(op: str) -> tuple[str, ...]:
    return (*CHIP_COLUMNS, *COLUMNS[op], *TAIL_COLUMNS)


def render(s: Session, chosen: Sequence[TuningSession], op: str | None) -> tuple[str, int]:
    """The file's text and its number of candidate rows."""
    op = op or _single_op(s, chosen)
    columns = _problem_columns(op)
    lines = ["\t".join(header(op))]
    for x in sorted(chosen, key=lambda x: x.id):
        chip = (x.arch, str(x.num_cu))
        for test_vector, perf_config, tflops in _candidates(s, x, op):
            values = columns(test_vector)
            lines.append("\t".join((*chip, *values, perf_config, _tflops(tflops))))
    if len(lines) == 1:
        ids = ", ".join(str(x.id) for x in chosen)
        raise UserError(f"session(s) {ids} have no {op} candidates or results")
    return "\n".join(lines) + "\n", len(lines) - 1


def _single_op(s: Session, chosen: Sequence[TuningSession]) -> str:
    ids = [x.id for x in chosen]
    found = set(
        s.scalars(
            sa.select(Problem.op)
            .join(Result, Result.problem_id == Problem.id)
            .where(Result.session_id.in_(ids))
            .distinct()
        )
    ) | set(
        s.scalars(
            sa.select(Problem.op)
            .join(Candidate, Candidate.problem_id == Problem.id)
            .where(Candidate.session_id.in_(ids))
            .distinct()
        )
    )
    if len(found) == 1:
        return found.pop()
    if not found:
        raise UserError(f"session(s) {', '.join(map(str, ids))} have no candidates or results")
    raise UserError(
        f"the sessions hold ops {', '.join(sorted(found))}: a .debug file has one op's columns, "
        "give --op"
    )


def _candidates(s: Session, x: TuningSession, op: str) -> list[tuple[str, str, float | None]]:
    """(test vector, perf config, TFlops or None when invalid), candidates in the order tried;
    a session without candidates gives its winners."""
    stmt = (
        sa.select(Problem.test_vector, Candidate.perf_config, Candidate.tflops, Candidate.error)
        .join(Problem, Problem.id == Candidate.problem_id)
        .where(Candidate.session_id == x.id, Problem.op == op)
        .order_by(Candidate.id)
    )
    rows = [(tv, pc, None if err else tf) for tv, pc, tf, err in s.execute(stmt)]
    if rows:
        return rows
    winners = (
        sa.select(Problem.test_vector, Result.perf_config, Result.tflops)
        .join(Problem, Problem.id == Result.problem_id)
        .where(Result.session_id == x.id, Problem.op == op)
        .order_by(Result.id)
    )
    return [(tv, pc, tf) for tv, pc, tf in s.execute(winners)]


def _tflops(value: float | None) -> str:
    if value is None or not math.isfinite(value) or value <= 0:
        return NAN
    return repr(float(value))


def _problem_columns(op: str) -> Callable[[str], tuple[str, ...]]:
    """test vector -> the op's column values as table_entry() prints them; cached per vector
    (a problem has tens to thousands of candidates)."""
    make = {"conv": _conv, "gemm": _gemm, "attention": _attention}.get(op)
    if make is None:
        raise UserError(f"no .debug layout for op {op!r} (known: {', '.join(COLUMNS)})")
    cache: dict[str, tuple[str, ...]] = {}

    def columns(test_vector: str) -> tuple[str, ...]:
        known = cache.get(test_vector)
        if known is None:
            values = make(problems.parse(op, test_vector))
            known = cache[test_vector] = tuple(_cell(v) for v in values)
        return known

    return columns


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return str(value)  # bool -> True/False, as pandas writes it


def _gen_layout(layout: str, n: str, c: str) -> str:
    """perfRunner's conv layouts as rocmlir-gen spells them (filter N->k, C->c; input N->n,
    C->c; output N->n, C->k; H->0, W->1, G->g), which table_entry prints."""
    table = {"N": n, "C": c, "H": "0", "W": "1", "G": "g"}
    return "".join(table.get(ch, ch) for ch in layout).lower()


def _conv(p: Any) -> list[Any]:
    return [
        p.direction,
        p.data_type,
        _gen_layout(p.fil_layout, "k", "c"),
        _gen_layout(p.in_layout, "n", "c"),
        _gen_layout(p.out_layout, "n", "k"),
        p.batchsize,
        p.in_channels,
        p.in_h,
        p.in_w,
        p.out_channels,
        p.fil_h,
        p.fil_w,
        p.dilation_h,
        p.dilation_w,
        p.conv_stride_h,
        p.conv_stride_w,
        p.pad_h,
        p.pad_w,
    ]


def _gemm(p: Any) -> list[Any]:
    return [
        p.data_type,
        p.out_data_type,
        p.trans_a,
        p.trans_b,
        p.trans_o,
        p.group_size,
        p.m,
        p.k,
        p.n,
    ]


def _attention(p: Any) -> list[Any]:
    return [
        p.data_type,
        p.trans_q,
        p.trans_k,
        p.trans_v,
        p.trans_o,
        p.causal,
        p.return_lse,
        p.split_kv,
        p.with_attn_scale,
        p.with_attn_bias,
        p.group_size,
        p.seq_len_q,
        p.seq_len_k,
        p.num_heads_q,
        p.num_heads_kv,
        p.head_dim_qk,
        p.head_dim_v,
    ]
