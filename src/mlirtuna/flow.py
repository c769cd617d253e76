"""`mlirtuna run`: the whole chain on one machine, for a newcomer or a CI job.

import the config lists → open (or resume) a session → load jobs for exactly those problems →
run local workers until done → export the tuning DB → the winners. Each step is the same API the
separate subcommands use; this module only strings them together.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlirtuna import catalog, keys, machine, sessions, tuners
from mlirtuna.db import Database
from mlirtuna.errors import UserError
from mlirtuna.history import export, reuse, winners
from mlirtuna.problems import ExpandOptions, Problem, configlist, op_of, problem_class
from mlirtuna.queue import jobs
from mlirtuna.sessions import Session, SessionSpec
from mlirtuna.worker import WorkerSettings, supervisor

RUNNER = Path("bin") / "tuningRunner.py"


@dataclass
class RunPlan:
    op: str | None
    files: Sequence[str]
    options: ExpandOptions = field(default_factory=ExpandOptions)
    tuner: str = "auto"
    tuning_space: str = sessions.DEFAULT_TUNING_SPACE
    gpus: str = "auto"
    gpu_identity: str | None = None  # --gpu-identity: the operator's names of the GPUs of gpus
    workers: int = 1
    output: str | None = None  # default mlir_tuning_<arch>.tsv
    session_id: int | None = None  # resume this session instead of opening a new one
    mlir_build_dir: str | None = None
    reason: str = ""
    settings: WorkerSettings = field(default_factory=lambda: WorkerSettings(session_id=0))
    session_flags: dict = field(default_factory=dict)  # --arch, --num-cu, … for a new session
    skip_tuned: bool = False  # leave out what an equivalent session tuned (reuse.py)
    reuse: bool = False  # and copy those results in (implies skip_tuned)

    def spec(self, tuner: str) -> dict[str, Any]:
        """What the session remembers of this run, for `run --session N` (see resumed)."""
        o = self.options
        return {
            "op": self.op,
            "files": [str(Path(f).resolve()) for f in self.files],
            "data_types": list(o.data_types) if o.data_types is not None else None,
            "directions": list(o.directions) if o.directions is not None else None,
            "layouts": list(o.layouts) if o.layouts is not None else None,
            "expand": o.expand,
            "tuner": tuner,
            "tuning_space": self.tuning_space,
            "output": str(Path(self.output).resolve()) if self.output else None,
            "mlir_build_dir": self.mlir_build_dir,
        }


RUN_NAME_FILES = 3  # input names a run's session name lists before "+N more"


def run_name(op: str, files: Sequence[str]) -> str:
    """A run's session name, from the op and the input: `gemm: gemm-small, tier1-gemm`."""
    names = [Path(f).name for f in files]
    shown = ", ".join(names[:RUN_NAME_FILES])
    more = f" +{len(names) - RUN_NAME_FILES} more" if len(names) > RUN_NAME_FILES else ""
    return f"{op}: {shown}{more}"[: sessions.NAME_MAX]


def resumed(plan: RunPlan, session: Session) -> RunPlan:
    """`run --session N` without files: exactly what that session's run was asked."""
    spec = session.run_spec
    if not spec:
        raise UserError(
            f"session {session.id} was not opened by `mlirtuna run`: give --op and the "
            "config lists to load into it"
        )
    if plan.op is not None and plan.op != spec["op"]:
        raise UserError(f"session {session.id} was run for op {spec['op']}, not {plan.op}")

    def opt(key: str) -> tuple[str, ...] | None:
        return tuple(spec[key]) if spec[key] is not None else None

    return replace(
        plan,
        op=spec["op"],
        files=spec["files"],
        options=ExpandOptions(opt("data_types"), opt("directions"), opt("layouts"), spec["expand"]),
        tuning_space=spec["tuning_space"],
        output=plan.output or spec["output"],
        mlir_build_dir=plan.mlir_build_dir or spec["mlir_build_dir"],
    )


@dataclass
class Prepared:
    session: Session
    tuner: str
    tuner_why: str
    imported: catalog.ImportReport
    loaded: jobs.LoadReport | reuse.ReuseReport
    tag: str
    plan: RunPlan  # as run: a resumed plan holds what the session remembered
    skipped: dict[str, list[str]] = field(default_factory=dict)  # why -> test vectors


@dataclass
class RunSummary:
    session_id: int
    tuner: str
    counts: dict[str, int]
    output: str | None
    exported_rows: int
    interrupted: bool
    winners: list[winners.Winner]
    exported_what: str = ""  # which rows the tuning DB holds
    skipped: int = 0
    notes: list[str] = field(default_factory=list)  # export's (which of two equal keys)

    def as_dict(self) -> dict:
        return {
            "session": self.session_id,
            "tuner": self.tuner,
            "counts": self.counts,
            "output": self.output,
            "exported": self.exported_rows,
            "exported_what": self.exported_what,
            "skipped": self.skipped,
            "interrupted": self.interrupted,
            "winners": [w.as_dict() for w in self.winners],
            "notes": self.notes,
        }


def choose_tuner(tuner: str, build_dir: str | None) -> tuple[str, str]:
    """(tuner, why): `auto` means rocmlir when a build dir is given (flag or env var), cpu when
    none is. A build dir given without bin/tuningRunner.py is an error, never a quiet cpu run."""
    build_dir = build_dir or os.environ.get(sessions.ENV_BUILD_DIR)
    with_build, without_build = tuners.AUTO
    uses_build = tuners.kind(with_build if tuner == "auto" else tuner).uses_build
    if build_dir and uses_build and not (Path(build_dir) / RUNNER).is_file():
        raise UserError(
            f"rocMLIR build dir {build_dir} has no {RUNNER} (from --mlir-build-dir or "
            f"{sessions.ENV_BUILD_DIR}): point it at a rocMLIR build, or leave it out for the "
            "cpu tuner"
        )
    if tuner != "auto":
        return tuner, f"tuner {tuner} (asked for)"
    if build_dir:
        return with_build, f"tuner {with_build} ({Path(build_dir) / RUNNER})"
    return without_build, (
        f"tuner {without_build} (no rocMLIR build dir given; --mlir-build-dir or "
        f"{sessions.ENV_BUILD_DIR} selects {with_build})"
    )


def prepare(db: Database, plan: RunPlan) -> Prepared:
    """Everything up to the workers: files are read before anything is written."""
    existing = sessions.get(db, plan.session_id) if plan.session_id is not None else None
    if existing is not None and not plan.files:
        plan = resumed(plan, existing)
    if plan.op is None or not plan.files:
        raise UserError("give --op and config lists (or --session N alone to resume a run)")
    if existing is not None:
        if plan.tuner != "auto" and sessions.tuner_name(plan.tuner) != existing.tuner_name:
            raise UserError(
                f"session {existing.id} was opened for tuner {existing.tuner}, not {plan.tuner}"
            )
        _check_search(plan, existing)
        tuner, why = existing.tuner, f"tuner {existing.tuner} (session {existing.id})"
        if tuners.kind(tuner).uses_build:
            choose_tuner(tuner, plan.mlir_build_dir)
            sessions.check_build_for(existing, sessions.build_dir_of(plan.mlir_build_dir))
    else:
        tuner, why = choose_tuner(plan.tuner, plan.mlir_build_dir)
    if tuners.kind(tuner).uses_build:  # a missing build dir stops here, before anything is written
        tuners.make(tuner, mlir_build_dir=plan.mlir_build_dir)
    # Parse the lists first: a bad line must not leave an empty session behind.
    parsed = _parse(plan)
    space = existing.tuning_space if existing else plan.tuning_space
    skipped = tuners.cannot_run(tuner, space, parsed, plan.settings.cpu_mem_limit)
    if parsed and sum(map(len, skipped.values())) == len(parsed):
        raise UserError(f"the {tuner} tuner can run none of these problems: {next(iter(skipped))}")
    _check_gpus(plan, tuner, existing)  # a GPU it cannot tell: refused before anything is written
    if existing is None:  # read off the machine and the build now; written once all is checked
        spec = sessions.detect(
            SessionSpec(
                tuner=tuner,
                tuning_space=plan.tuning_space,
                reason=plan.reason or "mlirtuna run",
                mlir_build_dir=plan.mlir_build_dir,
                **{"name": run_name(",".join(files_by_op(plan.op, plan.files)), plan.files)}
                | plan.session_flags,
            )
        )
        _refuse_what_the_build_cannot_tune(tuner, spec, f"the {tuner} tuner's", parsed)
        session = sessions.create(db, spec, run_spec=plan.spec(tuner))
    else:
        _refuse_what_the_build_cannot_tune(tuner, existing, f"session {existing.id}'s", parsed)
        session = existing
    tag = f"session-{session.id}"
    imported = catalog.ImportReport()
    for op, paths in files_by_op(plan.op, plan.files).items():
        read = catalog.read_files(op, paths, plan.options, plan.mlir_build_dir)
        part = catalog.store(db, op, read, tag)
        for name in ("lines", "problems", "new", "existing"):
            setattr(imported, name, getattr(imported, name) + getattr(part, name))
        imported.warnings.extend(part.warnings)
    exclude = _problem_ids(db, one_op(plan), [v for vs in skipped.values() for v in vs])
    loaded: jobs.LoadReport | reuse.ReuseReport
    if plan.skip_tuned or plan.reuse:
        loaded = reuse.load(
            db, session.id, skip_tuned=True, reuse=plan.reuse, tag=tag, op=one_op(plan),
            exclude=exclude,
        )  # fmt: skip
    else:
        loaded = jobs.load(db, session.id, tag=tag, op=one_op(plan), exclude=exclude)
    return Prepared(session, tuner, why, imported, loaded, tag, plan, skipped)


def _refuse_what_the_build_cannot_tune(
    tuner: str, session: Session | SessionSpec, whose: str, parsed: list[Problem]
) -> None:
    """A problem the session's build can never tune (its kind's build_limit: rocmlir on an E3
    build, gemm -transO true) refuses the run, one line, before anything is written; `jobs
    load` refuses it the same way."""
    key_form = session.key_form or keys.PLAIN
    build = tuners.SessionBuild(key_form=key_form, capabilities=session.capabilities)
    limit = tuners.build_limit(tuner, build)
    hits = [p for p in parsed if limit is not None and limit.refuses(p)]
    if limit is None or not hits:
        return
    raise UserError(
        f"{whose} {limit.why}: {len(hits)} problem(s) of these lists have it, e.g. "
        f"{hits[0].canonical()}; leave them out of the lists or {limit.remedy}"
    )


def _check_search(plan: RunPlan, existing: Session) -> None:
    """`run --session N --search …/--budget …`: a session's search is its own (equivalence,
    reuse); another one asked for is refused, not applied to the jobs loaded now."""
    for flag, key in (("--search", "search"), ("--budget", "search_budget")):
        asked = plan.session_flags.get(key)
        if asked is not None and asked != getattr(existing, key):
            raise UserError(
                f"session {existing.id} was opened with search {existing.search} "
                f"(budget {existing.search_budget}), not {flag} {asked}"
            )


def _check_gpus(plan: RunPlan, tuner: str, existing: sessions.Session | None) -> None:
    """Every GPU worker `run` would start can tell its GPU from another container's, or is
    named (--gpu-identity): refused, one line, before the session is opened or a job loaded."""
    build = sessions.build_dir_of(plan.mlir_build_dir)
    standin = existing.standin if existing else bool(build and machine.is_standin_build(build))
    slots = supervisor.plan(plan.gpus, tuner)  # its GPUs: --workers is checked with them later
    settings = replace(plan.settings, tuner=tuner, role="gpu")
    supervisor.identify(settings, supervisor.name_gpus(slots, plan.gpu_identity), standin)


def one_op(plan: RunPlan) -> str | None:
    """The op of a run, None for `--op auto` (several)."""
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
    op = op_of(first)
    if op is None:
        raise UserError(f"{path}: cannot tell the op from its flags: give --op")
    return op


def files_by_op(op: str | None, files: Sequence[str]) -> dict[str, list[str]]:
    """{op: files}; `auto` decides per file. Missing files stop here."""
    for path in files:
        if Path(path).is_dir():
            if op not in ("fusion", "auto"):  # those read a directory's .mlir modules
                raise configlist.directory_error(path)
        elif not Path(path).exists():
            raise UserError(f"cannot read config list {path}: no such file")
        elif not Path(path).is_file():  # a FIFO would block the look at its first line
            raise UserError(f"cannot read config list {path}: not a regular file")
    if op != "auto":
        problem_class(op or "")  # an unknown op is a UserError
        return {op or "": list(files)}
    by_op: dict[str, list[str]] = {}
    for path in files:
        by_op.setdefault(detect_op(path), []).append(path)
    return by_op


def _parse(plan: RunPlan) -> list[Problem]:
    found: dict[str, Problem] = {}
    for op, paths in files_by_op(plan.op, plan.files).items():
        for problem in catalog.read_files(op, paths, plan.options).problems():
            found.setdefault(problem.canonical(), problem)
    return list(found.values())


def _problem_ids(db: Database, op: str | None, vectors: Sequence[str]) -> set[int]:
    with db.session() as s:
        return catalog.ids_of(s, op, vectors)


def run_workers(
    db: Database,
    plan: RunPlan,
    prepared: Prepared,
    tick: Callable[[], None] | None = None,
    quiet: bool = False,
) -> bool:
    """Local workers until the session is drained; True when interrupted by a signal."""
    plan = prepared.plan
    settings = plan.settings
    settings.session_id = prepared.session.id
    settings.tuner = prepared.tuner
    settings.until_empty = True
    settings.mlir_build_dir = sessions.build_dir_of(plan.mlir_build_dir)
    # --workers counts CPU workers (a two-stage session's: its compile workers); a GPU has one.
    gpu_workers = 1 if prepared.session.two_stage else plan.workers
    slots = supervisor.plan(plan.gpus, prepared.tuner, gpu_workers)
    slots = supervisor.name_gpus(slots, plan.gpu_identity)
    locks: supervisor.Locks = {}
    if plan.gpus == "auto":  # the GPUs free now, their locks kept and handed to their workers
        slots, locks = supervisor.free(db, settings, slots, logging.getLogger(__name__).warning)
    url = db.url.render_as_string(hide_password=False)
    children = supervisor.start(url, settings, slots, quiet=quiet, locks=locks)
    if prepared.session.two_stage:  # its compile jobs need compile workers (no GPU) too
        compilers = replace(settings, role="compile")
        cpus = supervisor.cpu_slots(plan.workers, compile=True)
        children += supervisor.start(url, compilers, cpus, quiet=quiet)
    ended = supervisor.supervise(children, tick)
    if ended.lost:  # the session's counts say what was not tuned; this says why
        logging.getLogger(__name__).warning("%s", ended.summary())
    return ended.signals > 0


def _refresh_plain_db(
    db: Database, query: export.ExportQuery, plain: str, written: str
) -> list[str]:
    """`export --arch` holds the fusion winners too: an earlier run's mlir_tuning_<arch>.tsv in
    the working directory is written again after a fusion run, so that the file is the same
    whatever order the runs came in. None there (or the run's own -o): nothing to refresh."""
    if not Path(plain).is_file() or Path(plain).resolve() == Path(written).resolve():
        return []
    again = export.export(db, replace(query, op=None), "v3", plain)
    return [f"{plain} written again with the fusion winners: {again.rows} rows, as `mlirtuna "
            f"export --arch {query.arch}` writes them"]  # fmt: skip


def finish(db: Database, plan: RunPlan, prepared: Prepared, interrupted: bool) -> RunSummary:
    """Counts, winners, and the tuning DB: what `export --arch` writes for the session's
    context (the newest winners of every op), so an earlier run's rows are never dropped."""
    plan, sess = prepared.plan, prepared.session
    sid = sess.id
    counts = jobs.counts(db, sid)[sid]
    best = winners.winners(db, sid, one_op(plan))
    output, rows, what, notes = None, 0, "", []
    if counts["completed"] and not interrupted:
        # rocMLIR's weekly job writes its fusion tuning DB to a file of its own.
        fused = plan.op == "fusion"
        name = "tuning_fusion" if fused else "mlir_tuning"
        output = plan.output or f"{name}_{sess.arch}.tsv"
        query = export.ExportQuery(
            arch=sess.arch_full,
            num_cu=sess.num_cu,
            num_chiplets=sess.num_chiplets,
            tuning_space=sess.tuning_space,
            op="fusion" if fused else None,
            standin=sess.standin,  # a stand-in run exports the stand-in's context only
        )
        done = export.export(db, query, "v3", output)
        rows, notes = done.rows, [*done.notes]
        # Which of two rows with one key was written concerns fusion modules only: said where
        # this run tuned some, never on a plain run (an older fusion session's modules).
        if fused or any(w.op == "fusion" for w in best):
            notes += done.key_notes
        if fused:
            notes += _refresh_plain_db(db, query, f"mlir_tuning_{sess.arch}.tsv", output)
        what = (
            f"the newest {'fusion ' if fused else ''}winners of every "
            f"{'module' if fused else 'op'} for {sess.arch_full}, {sess.num_cu} CUs, "
            f"{sess.num_chiplets} chiplet(s), {sess.tuning_space}, from session(s) "
            f"{', '.join(map(str, done.sessions))}, "
            + (
                f"stand-in sessions only ({sessions.STANDIN_WHY}; `export --arch` leaves them "
                "out, `export --session` names them)"
                if sess.standin
                else f"as `mlirtuna export --arch {sess.arch_full}"
                f"{' --op fusion' if fused else ''}` writes them"
            )
        )
    skipped = sum(len(v) for v in prepared.skipped.values())
    return RunSummary(
        sid, prepared.tuner, counts, output, rows, interrupted, best, what, skipped, notes
    )
