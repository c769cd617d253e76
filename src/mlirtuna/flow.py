"""`mlirtuna run`: the whole chain on one machine, for a newcomer or a CI job.

import the config lists → open (or resume) a session → load jobs for exactly those problems →
run local workers until done → export the tuning DB → the winners. Each step is the same API the
separate subcommands use; this module only strings them together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlirtuna import configs, export, fusion, jobs, manager, results, sessions, tuners
from mlirtuna.db import Database
from mlirtuna.errors import UserError
from mlirtuna.problems import ExpandOptions, problem_class
from mlirtuna.sessions import Session, SessionSpec
from mlirtuna.worker import WorkerSettings

RUNNER = Path("bin") / "tuningRunner.py"


@dataclass
class RunPlan:
    op: str
    files: Sequence[str]
    options: ExpandOptions = field(default_factory=ExpandOptions)
    tuner: str = "auto"
    tuning_space: str = sessions.DEFAULT_TUNING_SPACE
    gpus: str = "auto"
    workers: int = 1
    output: str | None = None  # default mlir_tuning_<arch>.tsv
    session_id: int | None = None  # resume this session instead of opening a new one
    mlir_build_dir: str | None = None
    reason: str = ""
    settings: WorkerSettings = field(default_factory=lambda: WorkerSettings(session_id=0))
    session_flags: dict = field(default_factory=dict)  # --arch, --num-cu, … for a new session


@dataclass
class Prepared:
    session: Session
    tuner: str
    tuner_why: str
    imported: configs.ImportReport
    loaded: jobs.LoadReport
    tag: str


@dataclass
class RunSummary:
    session_id: int
    tuner: str
    counts: dict[str, int]
    output: str | None
    exported_rows: int
    interrupted: bool
    winners: list[results.Winner]
    notes: list[str] = field(default_factory=list)  # export's (which of two equal keys)

    def as_dict(self) -> dict:
        return {
            "session": self.session_id,
            "tuner": self.tuner,
            "counts": self.counts,
            "output": self.output,
            "exported": self.exported_rows,
            "interrupted": self.interrupted,
            "winners": [w.as_dict() for w in self.winners],
            "notes": self.notes,
        }


def choose_tuner(tuner: str, build_dir: str | None) -> tuple[str, str]:
    """(tuner, why): `auto` means rocmlir when a build dir with bin/tuningRunner.py is known."""
    build_dir = build_dir or os.environ.get(sessions.ENV_BUILD_DIR)
    if tuner != "auto":
        return tuner, f"tuner {tuner} (asked for)"
    if build_dir and (Path(build_dir) / RUNNER).is_file():
        return "rocmlir", f"tuner rocmlir ({Path(build_dir) / RUNNER})"
    where = f"no {RUNNER} in {build_dir}" if build_dir else "no rocMLIR build dir given"
    return "cpu", f"tuner cpu ({where}; --mlir-build-dir or MLIRTUNA_ROCMLIR_BUILD selects rocmlir)"


def _one_op(plan: RunPlan) -> str | None:
    return None if plan.op == "auto" else plan.op


def detect_op(path: str) -> str:
    """What `--op auto` takes a file for: a directory or .mlir file is fusion; a config list
    is recognised by the flags of its first config line."""
    if Path(path).is_dir() or path.endswith(".mlir"):
        return "fusion"
    try:
        with open(path, encoding="utf-8") as lines:
            first = next(
                (x.split() for x in lines if x.strip() and not x.strip().startswith("#")), []
            )
    except (OSError, UnicodeDecodeError):
        raise UserError(f"cannot read config list {path}") from None
    flags = set(first)
    if "-gemmO" in flags:
        return "conv_gemm" if "-c" in flags else "gemm_gemm"
    if "-seq_len_q" in flags or "-seq_len" in flags:
        return "attention"
    if (first and first[0].startswith("conv")) or "-c" in flags:
        return "conv"
    if "-m" in flags:
        return "gemm"
    raise UserError(f"{path}: cannot tell the op from its flags: give --op")


def files_by_op(op: str, files: Sequence[str]) -> dict[str, list[str]]:
    """{op: files}; `auto` decides per file. Missing files stop here."""
    for path in files:
        if not Path(path).is_file() and not (Path(path).is_dir() and op in ("fusion", "auto")):
            raise UserError(f"cannot read config list {path}: no such file")
    if op != "auto":
        problem_class(op)  # an unknown op is a UserError
        return {op: list(files)}
    by_op: dict[str, list[str]] = {}
    for path in files:
        by_op.setdefault(detect_op(path), []).append(path)
    return by_op


def prepare(db: Database, plan: RunPlan) -> Prepared:
    """Everything up to the workers: files are read before anything is written."""
    tuner, why = choose_tuner(plan.tuner, plan.mlir_build_dir)
    if tuner == "rocmlir":  # a missing build dir stops here, before anything is written
        tuners.make("rocmlir", mlir_build_dir=plan.mlir_build_dir)
    by_op = files_by_op(plan.op, plan.files)
    if plan.session_id is not None:
        session = sessions.get(db, plan.session_id)
        if session.tuner != tuner and plan.tuner != "auto":
            raise UserError(
                f"session {session.id} was opened for tuner {session.tuner}, not {tuner}"
            )
        tuner, why = session.tuner, f"tuner {session.tuner} (session {session.id})"
    else:
        # Parse the lists first: a bad line must not leave an empty session behind.
        from mlirtuna.problems.configlist import read_config_list

        for op, paths in by_op.items():
            for path in paths:
                if op == "fusion":
                    for module in fusion.module_files([path]):
                        fusion.read_problem(module)
                else:
                    read_config_list(path, op, plan.options)
        session = sessions.create(
            db,
            SessionSpec(
                tuner=tuner.partition(":")[0],  # the name; sleep:SECONDS is a worker setting
                tuning_space=plan.tuning_space,
                reason=plan.reason or "mlirtuna run",
                mlir_build_dir=plan.mlir_build_dir,
                **plan.session_flags,
            ),
        )
    tag = f"session-{session.id}"
    imported = configs.ImportReport()
    for op, paths in by_op.items():
        if op == "fusion":
            part = fusion.import_modules(db, paths, tag, plan.mlir_build_dir)
        else:
            part = configs.import_files(db, op, paths, plan.options, tag)
        for name in ("lines", "problems", "new", "existing"):
            setattr(imported, name, getattr(imported, name) + getattr(part, name))
        imported.warnings.extend(part.warnings)
    loaded = jobs.load(db, session.id, tag=tag, op=_one_op(plan))
    return Prepared(session, tuner, why, imported, loaded, tag)


def run_workers(
    db: Database,
    plan: RunPlan,
    prepared: Prepared,
    tick: Callable[[], None] | None = None,
    quiet: bool = False,
) -> bool:
    """Local workers until the session is drained; True when interrupted by a signal."""
    settings = plan.settings
    settings.session_id = prepared.session.id
    settings.tuner = prepared.tuner
    settings.until_empty = True
    settings.mlir_build_dir = plan.mlir_build_dir or os.environ.get(sessions.ENV_BUILD_DIR)
    slots = manager.plan(plan.gpus, prepared.tuner, plan.workers)
    procs = manager.start(
        db.url.render_as_string(hide_password=False), settings, slots, quiet=quiet
    )
    return manager.supervise(procs, tick) > 0


def finish(db: Database, plan: RunPlan, prepared: Prepared, interrupted: bool) -> RunSummary:
    sid = prepared.session.id
    counts = jobs.counts(db, sid)[sid]
    output, rows, notes = None, 0, []
    if counts["completed"] and not interrupted:
        # rocMLIR's weekly job writes its fusion tuning DB to a file of its own.
        name = "tuning_fusion" if plan.op == "fusion" else "mlir_tuning"
        output = plan.output or f"{name}_{prepared.session.arch}.tsv"
        done = export.export(
            db, export.ExportQuery(sessions=(sid,), op=_one_op(plan)), "v3", output
        )
        rows, notes = done.rows, done.notes
    winners = results.winners(db, sid, _one_op(plan))
    return RunSummary(sid, prepared.tuner, counts, output, rows, interrupted, winners, notes)
