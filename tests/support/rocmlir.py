"""The rocmlir tuner over the stand-in tuningRunner.py (the build: support/standin.py): its
problems and what it reports, sessions of it, and a worker running it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlirtuna import catalog, sessions
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.rocmlir import RocmlirTuner
from mlirtuna.worker import Worker, WorkerSettings
from support.results import mark_standin
from support.standin import STAND_IN, calls

ARCH_FULL = "gfx942:sramecc+:xnack-"
GEMM = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 768"
CONV = (
    "convfp16 -F 1 -f NCHW -I NCHW -O NCHW -n 64 -c 256 -H 28 -W 28 -k 256 -y 3 -x 3 "
    "-p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -m conv -g 4 -t 1"
)
ATTN = (
    "-t f16 -transQ false -transK true -transV false -transO false -g 12 -seq_len_q 384 "
    "-seq_len_k 384 -head_dim_qk 64 -head_dim_v 64"
)


def tuning_calls(build: Path) -> list[dict]:
    return [c for c in calls(build) if c["argv"] != ["--help"]]


def context(**changes: object) -> TuneContext:
    values = dict(
        arch="gfx942",
        arch_full=ARCH_FULL,
        num_cu=304,
        num_chiplets=8,
        tuning_space="full",
        gpu_id=3,
        timeout_s=60.0,
    )
    values.update(changes)
    return TuneContext(**values)  # type: ignore[arg-type]


def tuner(build: Path, era: str, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> RocmlirTuner:
    monkeypatch.setenv("FAKE_TUNINGRUNNER_ERA", era)
    return RocmlirTuner(str(build), **kwargs)  # type: ignore[arg-type]


def expected(op: str, config: str, space: str, era: str) -> dict[str, float | None]:
    """perf config -> the stand-in driver's ns (None: N/A), computed with its own generator."""
    _, flops = STAND_IN.describe(op, config, STAND_IN.Gpu(), era)
    return {
        pc: STAND_IN.candidate_time_ns(config, pc, flops)
        for pc in STAND_IN.perf_configs(op, space, era)
    }


def pid_alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie waiting for init is gone for our purpose


LINES = {"gemm": GEMM, "conv": CONV, "attention": ATTN}


def rocmlir_session(db, tmp_path, op: str, space: str = "quick", line: str = "") -> int:
    """A rocmlir session over one config of `op` (`line`, else the op's usual one)."""
    path = tmp_path / f"{op}-configs"
    path.write_text((line or LINES[op]) + "\n")
    catalog.import_files(db, op, [str(path)], ExpandOptions(expand=False), tag=op)
    sess = sessions.create(
        db,
        SessionSpec(
            tuner="rocmlir",
            arch_full=ARCH_FULL,
            num_cu=304,
            num_chiplets=8,
            tuning_space=space,
            rocm_v="6.4",
            mlir_v="abc",
        ),
    )
    jobs.load(db, sess.id, tag=op)
    return mark_standin(db, sess.id)


def worker_args(sid: int, *more: str) -> list[str]:
    """`mlirtuna worker`'s arguments for the rocmlir tuner on GPU 0 over session `sid`, then
    `more` (for run_cli and mlirtuna_argv)."""
    return ["worker", "--session", str(sid), "--tuner", "rocmlir", "--gpus", "0", *more]


def work(db, sid, build, role: str = "gpu", **changes) -> Worker:
    """Run one in-process worker of `role` over the session until it is empty."""
    worker = Worker(db, worker_settings(sid, build, role, **changes))
    worker.run()
    return worker


def worker_settings(sid, build, role: str = "gpu", **changes) -> WorkerSettings:
    """A rocmlir worker's settings for tests: the GPU 0 (a compile worker: none), one retry."""
    settings = WorkerSettings(
        session_id=sid,
        tuner="rocmlir",
        gpu_id=0 if role == "gpu" else -1,
        role=role,
        until_empty=True,
        mlir_build_dir=str(build),
        max_retries=1,
        backoff_s=0,
        job_timeout_s=60,
    )
    for key, value in changes.items():
        setattr(settings, key, value)
    return settings
