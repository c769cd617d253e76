"""The compare page's read model: history.compare's rows with what the page links and shows."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from mlirtuna.db import Database
from mlirtuna.web.explore.query import labels


def compare_rows(
    db: Database, groups: dict[str, list[Any]], entries_a: dict[str, Any], entries_b: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """The compare page's rows (history.compare.Regression) with what the page links and shows:
    the problem id on each side, its label, and the larger relative noise of the two sides."""
    ids: dict[str, int | None] = {}
    for rows in groups.values():
        for r in rows:
            a, b = entries_a.get(r.test_vector), entries_b.get(r.test_vector)
            ids[r.test_vector] = (b and b.problem_id) or (a and a.problem_id) or None
    named = labels(db, [i for i in ids.values() if i is not None])
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rows in groups.items():
        out[name] = []
        for r in rows:
            row = asdict(r)
            pid = ids[r.test_vector]
            row["problem_id"] = pid
            row["label"] = named.get(pid, r.test_vector) if pid is not None else r.test_vector
            sides = [
                e.rel_noise
                for e in (entries_a.get(r.test_vector), entries_b.get(r.test_vector))
                if e
            ]
            known = [n for n in (r.noise_a, r.noise_b, *sides) if n is not None]
            row["noise"] = max(known) if known else None
            out[name].append(row)
    return out


def missing_rows(
    db: Database, vectors: list[str], entries_a: dict[str, Any]
) -> list[dict[str, Any]]:
    """The problems of A that B lacks (verdict `missing`): A's winner, linked to the problem."""
    ids = {tv: entries_a[tv].problem_id for tv in vectors if tv in entries_a}
    named = labels(db, [i for i in ids.values() if i is not None])
    out = []
    for tv in vectors:
        entry, pid = entries_a.get(tv), ids.get(tv)
        out.append(
            {
                "test_vector": tv,
                "verdict": "missing",
                "problem_id": pid,
                "label": named.get(pid, tv) if pid is not None else tv,
                "perf_config_a": entry.perf_config if entry else None,
                "tflops_a": entry.tflops if entry else None,
            }
        )
    return out
