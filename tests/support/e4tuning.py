"""One E4 tuning recorded straight into the queue: what the dashboard shows of rocMLIR E4's
dropped ("Discarded") candidates and of perf-config fields that never vary."""

from __future__ import annotations

from pathlib import Path

from mlirtuna import catalog, queue, sessions
from mlirtuna.db import Database
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import Candidate, TuneOutcome

DROPPED = "Discarded by rocmlir-tuning-driver (E4: over its time budget)"  # tuners.rocmlir's


def e4_tuning(db: Database, tmp_path: Path) -> tuple[int, int, list[Candidate]]:
    """One E4 tuning recorded: 3 valid re-measured candidates (only the first field varies), 2
    the driver dropped ("Discarded"), 1 invalid; (session, problem, the dropped ones)."""
    path = tmp_path / "one"
    path.write_text("-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 8 -n 8 -k 8\n")
    catalog.import_files(db, "gemm", [str(path)], ExpandOptions(expand=False), tag="drop")
    spec = SessionSpec(
        tuner="rocmlir", arch_full="gfx942:sramecc+:xnack-", num_cu=304, num_chiplets=8
    )
    sid = sessions.create(db, spec).id
    jobs.load(db, sid, tag="drop")
    lease = queue.claim(db, sid, queue.Claimant("h", 0, 1), 60)
    assert lease is not None
    top = [Candidate(f"v4:{m},16,4,16,16,16,4,1,1,0,1,1,1,1", 1e3 / m, m / 100, remeasured=True)
           for m in (16, 32, 64)]  # fmt: skip
    dropped = [Candidate(f"v4:{m},32,4,16,16,16,4,1,1,0,1,1,1,1", error=DROPPED) for m in (16, 32)]
    invalid = [Candidate("v4:8,8,4,16,16,16,4,1,1,0,1,1,1,1", error="not applicable (N/A)")]
    assert queue.record(db, lease, TuneOutcome([*top, *dropped, *invalid], top[-1]))
    return sid, lease.problem_id, dropped
