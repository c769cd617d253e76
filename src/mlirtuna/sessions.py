"""Sessions: everything that can change a tuning result, and why the tuning was run."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

import sqlalchemy as sa

from mlirtuna import keys, machine
from mlirtuna.db import Database, utcnow
from mlirtuna.errors import NotFound, UserError
from mlirtuna.models import TUNING_SPACES, TuningSession

log = logging.getLogger(__name__)
TUNERS = ("rocmlir", "cpu", "sleep")
ENV_BUILD_DIR = "MLIRTUNA_ROCMLIR_BUILD"
DEFAULT_TUNING_SPACE = "full"  # tuningRunner E3's default
CPU_SPACES = ("quick", "full", "greedy", "exhaustive")


@dataclass(frozen=True)
class Session:
    """A session row as the API hands it out."""

    id: int
    arch: str
    arch_full: str
    num_cu: int
    num_chiplets: int
    rocm_v: str
    mlir_v: str
    reason: str
    ticket: str
    docker: str
    tuning_space: str
    tuner: str
    host: str
    created_at: str
    key_form: str = keys.PLAIN
    rep_ms: int | None = None
    warmup_ms: int | None = None
    gpu_run_timeout_s: int | None = None
    lfbo_effort: str | None = None

    @classmethod
    def from_row(cls, row: TuningSession) -> Session:
        values = {f.name: getattr(row, f.name) for f in fields(cls)}
        values["created_at"] = row.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionSpec:
    """What `session new` is told; None means "detect it"."""

    tuner: str = "cpu"
    tuning_space: str = DEFAULT_TUNING_SPACE
    arch: str | None = None
    arch_full: str | None = None
    num_cu: int | None = None
    num_chiplets: int | None = None
    rocm_v: str | None = None
    mlir_v: str | None = None
    reason: str = ""
    ticket: str = ""
    docker: str | None = None
    mlir_build_dir: str | None = None
    # tuningRunner E4 settings (they change results, so they belong to the session).
    rep_ms: int | None = None
    warmup_ms: int | None = None
    gpu_run_timeout_s: int | None = None
    lfbo_effort: str | None = None
    key_form: str | None = None  # None: the build's form (plain without a build)


def detect(spec: SessionSpec) -> SessionSpec:
    """Fill what the flags left open from this machine; never guess what can't be read."""
    if spec.tuner not in TUNERS:
        raise UserError(f"unknown tuner {spec.tuner!r} (known: {', '.join(TUNERS)})")
    if spec.tuning_space not in TUNING_SPACES:
        raise UserError(
            f"unknown tuning space {spec.tuning_space!r} (known: {', '.join(TUNING_SPACES)})"
        )
    build_dir = spec.mlir_build_dir or os.environ.get(ENV_BUILD_DIR)
    out = SessionSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)})
    out.rocm_v = spec.rocm_v if spec.rocm_v is not None else (machine.rocm_version() or "")
    out.mlir_v = (
        spec.mlir_v
        if spec.mlir_v is not None
        else ((machine.git_hash(build_dir) if build_dir else None) or "")
    )
    out.docker = spec.docker if spec.docker is not None else (machine.docker_image() or "")
    _check_settings(out, build_dir)
    if spec.tuner in ("cpu", "sleep"):
        return _fill_cpu(out)
    return _fill_gpu(out)


def _check_settings(spec: SessionSpec, build_dir: str | None) -> None:
    """Settings and space against what the build's tuningRunner offers (read from its --help),
    and the key form its perfRunner expects; one clear error for anything it lacks."""
    if spec.key_form is not None and spec.key_form not in keys.KEY_FORMS:
        raise UserError(f"unknown key form {spec.key_form!r} (known: {', '.join(keys.KEY_FORMS)})")
    if spec.lfbo_effort is not None and spec.lfbo_effort not in ("quick", "full"):
        raise UserError(f"--lfbo-effort {spec.lfbo_effort!r}: expected quick or full")
    settings = [flag for flag, name in _SETTING_FLAGS if getattr(spec, name) is not None]
    for flag, name in _SETTING_FLAGS[:3]:
        value = getattr(spec, name)
        if value is not None and value <= 0:
            raise UserError(f"{flag} {value}: expected a positive number")
    if spec.tuner == "cpu" and spec.tuning_space not in CPU_SPACES:
        raise UserError(
            f"the cpu tuner has no tuning space {spec.tuning_space!r} "
            f"(it has: {', '.join(CPU_SPACES)})"
        )
    if spec.tuner != "rocmlir":
        if settings:
            raise UserError(f"{', '.join(settings)}: settings of the rocmlir tuner (E4) only")
        spec.key_form = spec.key_form or keys.PLAIN
        return
    if not build_dir:
        spec.key_form = spec.key_form or keys.PLAIN
        return
    from mlirtuna.errors import TunerError
    from mlirtuna.tuners.rocmlir import RocmlirTuner, build_key_form

    try:
        tuner = RocmlirTuner(build_dir)
        era = tuner.era
    except (UserError, TunerError) as exc:
        # No tuningRunner.py there, or it cannot run here (E3/E4 need a GPU even for --help):
        # the worker checks the same against the build it runs.
        log.warning("not checked against the build's tuningRunner.py: %s", exc)
        spec.key_form = spec.key_form or keys.PLAIN
        return
    if era.tuning_spaces and spec.tuning_space not in era.tuning_spaces:
        raise UserError(
            f"tuning space {spec.tuning_space!r} is not offered by {tuner.script} ({era.name}; "
            f"it has: {', '.join(era.tuning_spaces)})"
        )
    lacking = [flag for flag in settings if flag not in era.flags]
    if lacking:
        raise UserError(f"{tuner.script} ({era.name}) has no {', '.join(lacking)}")
    spec.key_form = spec.key_form or build_key_form(tuner.build_dir, era)


def _fill_cpu(spec: SessionSpec) -> SessionSpec:
    # A CPU session describes the CPU; `arch` is the ISA so that exports stay distinct from GPUs.
    spec.arch = spec.arch or f"cpu-{machine.platform_machine()}"
    spec.arch_full = spec.arch_full or spec.arch
    spec.num_cu = spec.num_cu if spec.num_cu is not None else (os.cpu_count() or 1)
    spec.num_chiplets = spec.num_chiplets if spec.num_chiplets is not None else 1
    return spec


def _fill_gpu(spec: SessionSpec) -> SessionSpec:
    found = machine.gpus()
    gpu = found[0] if found else None
    if gpu is not None and spec.arch and spec.arch != gpu.arch:
        gpu = None  # the flags describe another GPU than the one here: take nothing from it
    if gpu is not None:
        spec.arch = spec.arch or gpu.arch
        spec.arch_full = spec.arch_full or gpu.arch_full
        spec.num_cu = spec.num_cu if spec.num_cu is not None else gpu.num_cu
        if spec.num_chiplets is None:
            spec.num_chiplets = machine.num_chiplets(gpu.arch)
    if spec.arch_full and not spec.arch:
        spec.arch = spec.arch_full.split(":")[0]
    spec.arch_full = spec.arch_full or spec.arch
    missing = [
        flag
        for flag, value in (
            ("--arch", spec.arch),
            ("--num-cu", spec.num_cu),
            ("--num-chiplets", spec.num_chiplets),
        )
        if value is None
    ]
    if missing:
        raise UserError(
            f"cannot detect {', '.join(missing)} "
            f"({'no GPU found by rocminfo' if not found else 'not exposed by the ROCm tools'}): "
            "give them as flags for a rocmlir session"
        )
    return spec


_SETTING_FLAGS = (
    ("--rep", "rep_ms"),
    ("--warmup", "warmup_ms"),
    ("--gpu-run-timeout", "gpu_run_timeout_s"),
    ("--lfbo-effort", "lfbo_effort"),
)


def create(db: Database, spec: SessionSpec) -> Session:
    spec = detect(spec)
    row = TuningSession(
        arch=spec.arch,
        arch_full=spec.arch_full,
        num_cu=spec.num_cu,
        num_chiplets=spec.num_chiplets,
        rocm_v=spec.rocm_v or "",
        mlir_v=spec.mlir_v or "",
        reason=spec.reason,
        ticket=spec.ticket,
        docker=spec.docker or "",
        tuning_space=spec.tuning_space,
        tuner=spec.tuner,
        host=_host(spec.tuner),
        created_at=utcnow(),
        key_form=spec.key_form or keys.PLAIN,
        rep_ms=spec.rep_ms,
        warmup_ms=spec.warmup_ms,
        gpu_run_timeout_s=spec.gpu_run_timeout_s,
        lfbo_effort=spec.lfbo_effort,
    )
    with db.session() as s:
        s.add(row)
        s.flush()
        return Session.from_row(row)


def _host(tuner: str) -> str:
    name = machine.machine_name()
    return f"{name} ({machine.cpu_description()})" if tuner in ("cpu", "sleep") else name


def get(db: Database, session_id: int) -> Session:
    with db.session() as s:
        row = s.get(TuningSession, session_id)
        if row is None:
            raise NotFound(f"no session {session_id}: `mlirtuna session list` shows them")
        return Session.from_row(row)


def list_all(db: Database) -> list[Session]:
    with db.session() as s:
        rows = s.scalars(sa.select(TuningSession).order_by(TuningSession.id))
        return [Session.from_row(r) for r in rows]
