"""Sessions the results tests share: tuned through the real queue (claim + fenced record) or
filled with result rows, over canonical gemm vectors."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import sqlalchemy as sa

from mlirtuna import catalog, queue, sessions
from mlirtuna.db.models import Result, TuningSession
from mlirtuna.problems import ExpandOptions, parse
from mlirtuna.queue import Claimant, jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.stats import Spread
from mlirtuna.tuners.base import Candidate as Cand
from mlirtuna.tuners.base import TuneOutcome

FULL = "gfx942:sramecc+:xnack-"


def gemm(m: int, n: int = 64, k: int = 32, t: str = "f32") -> str:
    """A canonical gemm test vector."""
    return parse(
        "gemm", f"-t {t} -transA false -transB false -g 1 -m {m} -n {n} -k {k}"
    ).canonical()


def new_session(
    db,
    *,
    arch: str = "gfx942",
    arch_full: str = FULL,
    num_cu: int = 304,
    num_chiplets: int = 8,
    space: str = "full",
    mlir_v: str = "abc123",
) -> int:
    spec = SessionSpec(
        tuner="sleep",
        arch=arch,
        arch_full=arch_full,
        num_cu=num_cu,
        num_chiplets=num_chiplets,
        tuning_space=space,
        mlir_v=mlir_v,
        rocm_v="6.4",
        docker="",
    )
    return sessions.create(db, spec).id


def mark_standin(db, sid: int) -> int:
    """Mark a session opened from flags alone (no build dir) as tuned on the stand-in, which is
    what its workers run: a worker refuses the stand-in build for a real session."""
    with db.session() as s:
        s.execute(sa.update(TuningSession).where(TuningSession.id == sid).values(standin=True))
    return sid


def tune(
    db,
    tmp_path,
    session_id: int,
    vectors: Iterable[str],
    perf: Callable[[str], str] = lambda tv: "v4:best",
    ns: Callable[[str], float] = lambda tv: 1e5,
) -> None:
    """The real path: import, load jobs, claim each, record a winner plus one invalid candidate."""
    vectors = list(vectors)
    path = tmp_path / f"configs-{session_id}"
    path.write_text("".join(v + "\n" for v in vectors))
    tag = f"s{session_id}"
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag=tag)
    jobs.load(db, session_id, tag=tag)
    by_vector = {parse("gemm", v).canonical(): parse("gemm", v) for v in vectors}
    while (lease := queue.claim(db, session_id, Claimant("test", 0), 60)) is not None:
        with db.session() as s:
            tv = catalog.load_problem(s, lease.problem_id).canonical()
        time = ns(tv)
        winner = Cand(perf(tv), time, by_vector[tv].flops() / time / 1e3)
        invalid = Cand("v4:bad", error="not applicable (rocmlir-tuning-driver: N/A)")
        assert queue.record(db, lease, TuneOutcome([winner, invalid], winner))


def put_results(db, session_id: int, winners: dict[str, tuple[str, float | None]]) -> None:
    """Result rows without a job (as import-tsv makes them): {vector: (perf_config, tflops)}."""
    with db.session() as s:
        ids, _ = catalog.ensure_problems(s, "gemm", [parse("gemm", v) for v in winners])
        s.execute(
            sa.insert(Result.__table__),
            [
                {"session_id": session_id, "problem_id": ids[v], "perf_config": pc, "tflops": tf}
                for v, (pc, tf) in winners.items()
            ],
        )


def m_of(tv: str) -> str:
    """A perf config that differs per problem: pc<M>."""
    return "pc" + tv.split(" -m ")[1].split()[0]


def record(
    db, tmp_path, sid: int, cands: dict[str, list[Cand]], winners: dict[str, str], op="gemm"
):
    """Tune `sid` through the real queue with the given candidates per vector."""
    path = tmp_path / f"configs-{sid}-{op}"
    path.write_text("".join(v + "\n" for v in cands))
    catalog.import_files(db, op, [str(path)], ExpandOptions(expand=False), tag=f"t{sid}{op}")
    jobs.load(db, sid, tag=f"t{sid}{op}")
    while (lease := queue.claim(db, sid, Claimant("test", 0), 60)) is not None:
        with db.session() as s:
            tv = catalog.load_problem(s, lease.problem_id).canonical()
        winner = next(c for c in cands[tv] if c.perf_config == winners[tv])
        assert queue.record(db, lease, TuneOutcome(cands[tv], winner))


def cand(tv: str, pc: str, ns: float, rel_iqr: float = 0.02, n: int = 25, op: str = "gemm") -> Cand:
    """A candidate of `ns` median with a spread (IQR `rel_iqr` of the median, n samples)."""
    spread = Spread(ns, ns * 0.97, ns * rel_iqr, n)
    return Cand(pc, ns, parse(op, tv).flops() / ns / 1e3, spread=spread)
