"""Sessions: everything that can change a tuning result, and why the tuning was run."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from mlirtuna import keys, machine
from mlirtuna.db import Database, utcnow
from mlirtuna.db.models import (
    SPLIT_STAGES,
    Job,
    Problem,
    QuickList,
    Result,
    SessionNote,
    TuningSession,
)
from mlirtuna.defaults import (
    DEFAULT_BUNDLE_CAP_BYTES,
    DEFAULT_TOPK,
    DEFAULT_TUNER,
    DEFAULT_TUNING_SPACE,
    ENV_ROCMLIR_BUILD,
    TUNING_SPACES,
)
from mlirtuna.errors import NotFound, UserError

if TYPE_CHECKING:
    from mlirtuna.tuners import TunerKind

ENV_BUILD_DIR = ENV_ROCMLIR_BUILD
# The settings a session can hold for its tuner: SessionSpec field -> flag. Which of them a
# tuner takes is its kind's (tuners.TunerKind.settings).
TUNER_SETTINGS = {
    "rep_ms": "--rep",
    "warmup_ms": "--warmup",
    "gpu_run_timeout_s": "--gpu-run-timeout",
    "lfbo_effort": "--lfbo-effort",
}
#: A session tuning over a stored quick list (history/quick/store.py makes them) says `list:NAME`.
LIST_PREFIX = "list:"
_LIST_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,48}$")
# A session commit the worker can compare with a build's: a git hash, full or abbreviated as
# git abbreviates (7 digits at least).
_HASH_RE = re.compile(r"^[0-9a-f]{7,64}$")


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
    retired_at: str | None = None
    run_spec: dict[str, Any] | None = None  # what `mlirtuna run` was asked (flow.py)
    topk: int = DEFAULT_TOPK
    split: str | None = None  # "compile,benchmark": two-stage jobs (queue/bundles.py)
    artifact_store: str | None = None
    keep_artifacts: bool = False
    name: str = ""  # `session new --name`, or set by `run` from the op and the input
    # What the build's tuningRunner can do (eras.Era.describe), read at `session new` and stored
    # (kept out of as_dict when there is none: CPU, sleep and imported sessions).
    capabilities: str = ""
    bundle_cap_mib: int | None = None  # None: DEFAULT_BUNDLE_CAP_BYTES
    standin: bool = False  # tuned on the stand-in build: made-up numbers, never exported by arch
    # A strategy of mlirtuna.search choosing each job's candidates, and its budget (measurements
    # per job); None: the tuner's whole space (issue 45).
    search: str | None = None
    search_budget: int | None = None

    @property
    def bundle_cap_bytes(self) -> int:
        """The most one bundle of this session may unpack to (one file may be all of it)."""
        return self.bundle_cap_mib << 20 if self.bundle_cap_mib else DEFAULT_BUNDLE_CAP_BYTES

    @classmethod
    def from_row(cls, row: TuningSession) -> Session:
        values = {f.name: getattr(row, f.name) for f in fields(cls)}
        values["created_at"] = _iso(row.created_at)
        values["retired_at"] = _iso(row.retired_at) if row.retired_at else None
        values["run_spec"] = json.loads(row.run_spec) if row.run_spec else None
        return cls(**values)

    @property
    def tuner_name(self) -> str:
        return tuner_name(self.tuner)

    @property
    def two_stage(self) -> bool:
        return self.split == SPLIT_STAGES

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.capabilities:
            del out["capabilities"]
        return out

    def public_dict(self) -> dict[str, Any]:
        """as_dict for any reader (the dashboard and its API): the paths of the host that
        opened the session (run_spec's files, output and build dir; the artifact store) by
        their base names. The full paths stay with the CLI (`session show`) and `run`'s resume."""
        out = self.as_dict()
        out["artifact_store"] = base_name(self.artifact_store)
        if self.run_spec is not None:
            spec = dict(self.run_spec)
            for key in HOST_PATHS_OF_RUN:
                spec[key] = base_name(spec.get(key))
            spec["files"] = [base_name(f) for f in spec.get("files") or []]
            out["run_spec"] = spec
        return out


# run_spec's single paths on the host that ran `mlirtuna run` (its "files" are a list of them).
HOST_PATHS_OF_RUN = ("output", "mlir_build_dir")


def base_name(path: str | None) -> str | None:
    """The last part of a path (`/home/op/lists/gemm-configs` -> `gemm-configs`)."""
    return PurePath(path).name if path else path


@dataclass
class SessionSpec:
    """What `session new` is told; None means "detect it"."""

    tuner: str = DEFAULT_TUNER
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
    topk: int = DEFAULT_TOPK
    split: str | None = None  # --split compile,benchmark (E4 rocmlir builds only)
    artifact_store: str | None = None
    keep_artifacts: bool = False
    name: str = ""
    capabilities: str = ""  # what the build's tuningRunner can do (filled by detect)
    bundle_cap_mib: int | None = None  # --bundle-cap-mib (with --split)
    standin: bool = False  # the build is mlirtuna's stand-in (filled by detect, from the build)
    search: str | None = None  # --search NAME (with --budget N): see Session.search
    search_budget: int | None = None


def _iso(when: dt.datetime | None) -> str:
    """A stored time as text; "" where the row holds none a reader could read (db.stored_time)."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else ""


def tuner_name(spec: str) -> str:
    """What a tuner spec names: `sleep:0.2` is the sleep tuner (the seconds are a worker
    setting); a plugin `module.path:factory` is named by the whole spec."""
    name, _, _ = spec.partition(":")
    return spec if "." in name else name


def check_tuner(spec: str) -> TunerKind:
    """A session is opened for a registered tuner (tuners.names()) or a plugin that loads; a
    tuner that needs no build is made once here, so a bad argument or factory stops here."""
    from mlirtuna import tuners

    kind = tuners.kind(spec)
    if not kind.uses_build:
        tuners.make(spec)
    return kind


def detect(spec: SessionSpec) -> SessionSpec:
    """Fill what the flags left open from this machine; never guess what can't be read."""
    kind = check_tuner(spec.tuner)
    if spec.tuning_space.startswith(LIST_PREFIX):
        check_quick_list_name(spec.tuning_space.partition(":")[2])
    elif spec.tuning_space not in TUNING_SPACES:
        raise UserError(
            f"unknown tuning space {spec.tuning_space!r} "
            f"(known: {', '.join(TUNING_SPACES)}, or list:NAME for a stored quick list)"
        )
    if spec.topk < 1:
        raise UserError(f"--topk {spec.topk}: expected 1 or more")
    build_dir = build_dir_of(spec.mlir_build_dir)
    out = SessionSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)})
    out.rocm_v = spec.rocm_v if spec.rocm_v is not None else (machine.rocm_version() or "")
    out.docker = spec.docker if spec.docker is not None else (machine.docker_image() or "")
    out.standin = bool(kind.uses_build and build_dir and machine.is_standin_build(build_dir))
    _check_split(out, kind, build_dir)
    _check_settings(out, kind, build_dir)
    _check_search(out, build_dir)
    if spec.mlir_v is None:  # --mlir-v given always wins
        out.mlir_v = build_commit(build_dir) if kind.uses_build and build_dir else ""
    if out.split and not out.mlir_v:
        raise UserError("--split needs the rocMLIR commit: --mlir-v HASH")
    if not kind.gpu:  # cpu, sleep and CPU plugins describe this machine's CPU
        if kind.measures_cpu:
            _check_cpu_arch(out, kind)
        return _fill_cpu(out)
    return _fill_gpu(out)


CPU_ARCH_PREFIX = "cpu-"  # a CPU session's arch: cpu-<ISA> (_fill_cpu)


def _check_cpu_arch(spec: SessionSpec, kind: TunerKind) -> None:
    """A tuner that measures this CPU names no GPU as its arch: one line, exit 2."""
    for flag, value in (("--arch", spec.arch), ("--arch-full", spec.arch_full)):
        if value and not value.startswith(CPU_ARCH_PREFIX):
            raise UserError(
                f"{flag} {value} with the {kind.name} tuner: it measures this machine's CPU, "
                f"and its results would be exported as {value}'s; leave {flag} out (the "
                f"session is {CPU_ARCH_PREFIX}{machine.platform_machine()}) or tune on the GPU "
                "with --tuner rocmlir"
            )


def build_commit(build_dir: str) -> str:
    """The rocMLIR commit a session on `build_dir` records (machine.build_commit: the source
    checkout its CMakeCache.txt names, or the stand-in's marker); one line naming --mlir-v
    where the build cannot be tied to a rocMLIR commit."""
    found = machine.build_commit(build_dir)
    if not found.commit:
        raise UserError(
            f"cannot tell which rocMLIR commit {build_dir} was built from ({found.why}): "
            "give --mlir-v HASH"
        )
    return found.commit


def _check_build_commit(session: Session, build_dir: str) -> None:
    """A worker's build against its session: refused (one line) when the commit it was built
    from, read as `session new` reads it, is not the session's. A build whose commit cannot be
    read, or a session commit that is no hash (`--mlir-v` is free text), is taken on the
    session's word: the tool's own commit checks (two-stage bundles) still apply."""
    wanted = session.mlir_v.lower()
    if not _HASH_RE.fullmatch(wanted):
        return
    found = machine.build_commit(build_dir).commit
    if found and not found.startswith(wanted):
        raise UserError(
            f"{build_dir} was built from rocMLIR {found[:12]}, not session {session.id}'s "
            f"{wanted[:12]}: give this worker a build of {wanted[:12]} (--mlir-build-dir), or "
            "open a session for this build"
        )


def build_dir_of(asked: str | None) -> str | None:
    """The rocMLIR build dir a command uses: --mlir-build-dir, else the environment's."""
    return asked or os.environ.get(ENV_BUILD_DIR) or None


#: Why a stand-in session is kept apart: said wherever one is shown or left out.
STANDIN_WHY = "tuned on mlirtuna's stand-in build: made-up numbers"


def check_build_for(session: Session, build_dir: str | None) -> None:
    """The build a worker (or `run --session`) would tune `session` with, refused with one line
    unless it is the session's kind of build (a stand-in session on the stand-in build only, a
    real session on a real build only: otherwise made-up numbers land in a real session, or the
    reverse) and of the session's rocMLIR commit."""
    if not build_dir:
        return  # the tuner says that it has none
    standin_build = machine.is_standin_build(build_dir)
    if standin_build == session.standin:
        _check_build_commit(session, build_dir)
        return
    if standin_build:
        raise UserError(
            f"{build_dir} is mlirtuna's stand-in build (made-up numbers) and session "
            f"{session.id} is a real one: give --mlir-build-dir a real rocMLIR build, or open a "
            "session on the stand-in build"
        )
    raise UserError(
        f"session {session.id} is a stand-in session ({STANDIN_WHY}) and {build_dir} is a real "
        "rocMLIR build: open a session of its own for the real build (`session new "
        "--mlir-build-dir DIR`)"
    )


def left_out_line(ids: list[int], how: str) -> str:
    """The one line said when stand-in sessions were not picked (`how`: how to pick them)."""
    listed = ", ".join(map(str, sorted(ids)))
    return f"left out stand-in session(s) {listed} ({STANDIN_WHY}): {how}"


def _check_settings(spec: SessionSpec, kind: TunerKind, build_dir: str | None) -> None:
    """Settings and space against what the build's tuningRunner offers (read from its --help),
    and the key form its perfRunner expects; one clear error for anything it lacks."""
    if spec.key_form is not None and spec.key_form not in keys.KEY_FORMS:
        raise UserError(f"unknown key form {spec.key_form!r} (known: {', '.join(keys.KEY_FORMS)})")
    if spec.lfbo_effort is not None and spec.lfbo_effort not in ("quick", "full"):
        raise UserError(f"--lfbo-effort {spec.lfbo_effort!r}: expected quick or full")
    settings = [flag for name, flag in TUNER_SETTINGS.items() if getattr(spec, name) is not None]
    for name, flag in TUNER_SETTINGS.items():
        value = getattr(spec, name)
        if isinstance(value, int) and value <= 0:
            raise UserError(f"{flag} {value}: expected a positive number")
    listed = spec.tuning_space.startswith(LIST_PREFIX)  # a stored quick list
    if kind.spaces is not None and spec.tuning_space not in kind.spaces and not listed:
        raise UserError(
            f"the {kind.name} tuner has no tuning space {spec.tuning_space!r} "
            f"(it has: {', '.join(kind.spaces)})"
        )
    foreign = [flag for flag in settings if flag not in dict(kind.settings)]
    if foreign:
        raise UserError(f"{', '.join(foreign)}: not a setting of the {kind.name} tuner")
    if kind.check_build is None or not build_dir:
        spec.key_form = spec.key_form or keys.PLAIN
        return
    key_form, spec.capabilities = kind.check_build(build_dir, spec.tuning_space, settings)
    spec.key_form = spec.key_form or key_form


def _check_search(spec: SessionSpec, build_dir: str | None) -> None:
    """--search NAME --budget N: a registered strategy, a positive budget (required with a
    search, refused without one), and a tuner that can list and measure chosen candidates
    (tuners.base.SearchableTuner)."""
    from mlirtuna import search, tuners
    from mlirtuna.tuners.base import SearchableTuner

    if spec.search is None:
        if spec.search_budget is not None:
            raise UserError(f"--budget {spec.search_budget} goes with --search NAME")
        return
    search.get(spec.search)  # one line naming the known strategies otherwise
    if spec.search_budget is None:
        raise UserError(f"--search {spec.search} needs --budget N (measurements per job)")
    if spec.search_budget < 1:
        raise UserError(f"--budget {spec.search_budget}: expected 1 or more")
    if spec.split is not None:
        raise UserError("--search does not go with --split (a search measures in rounds)")
    tuner = tuners.make(spec.tuner, mlir_build_dir=build_dir)
    if not isinstance(tuner, SearchableTuner):
        raise UserError(
            f"--search {spec.search}: the {tuners.kind(spec.tuner).name} tuner cannot measure "
            "chosen candidates (it is not a SearchableTuner: docs/adding-a-tuner.md)"
        )


def _check_split(spec: SessionSpec, kind: TunerKind, build_dir: str | None) -> None:
    """--split compile,benchmark: only for a tuner that can split (rocmlir) on a build that can
    (a tuningRunner with --compile-only, E4); detect then asks for a known rocMLIR commit
    (bundles of another one are refused)."""
    if spec.split is None:
        if spec.artifact_store is not None or spec.keep_artifacts or spec.bundle_cap_mib:
            raise UserError(
                "--artifact-store, --keep-artifacts and --bundle-cap-mib go with --split"
            )
        return
    if spec.bundle_cap_mib is not None and not 1 <= spec.bundle_cap_mib <= BUNDLE_CAP_MAX_MIB:
        raise UserError(f"--bundle-cap-mib {spec.bundle_cap_mib}: 1 to {BUNDLE_CAP_MAX_MIB}")
    words = [w.strip() for w in spec.split.split(",")]
    if ",".join(words) != SPLIT_STAGES:
        raise UserError(f"--split {spec.split!r}: the one split is {SPLIT_STAGES}")
    spec.split = SPLIT_STAGES
    if kind.check_split_build is None:
        raise UserError(
            "--split needs --tuner rocmlir (a two-stage build) or another tuner that compiles "
            f"and benchmarks apart, not {spec.tuner}"
        )
    if not build_dir:
        raise UserError(
            "--split needs the build: --mlir-build-dir DIR (a two-stage tuningRunner.py)"
        )
    kind.check_split_build(build_dir)
    if spec.artifact_store is not None:
        store = os.path.abspath(spec.artifact_store)
        if not os.path.isdir(store):
            raise UserError(f"--artifact-store {spec.artifact_store}: no such directory")
        spec.artifact_store = store


def _fill_cpu(spec: SessionSpec) -> SessionSpec:
    # A CPU session describes the CPU; `arch` is the ISA so that exports stay distinct from GPUs.
    spec.arch = spec.arch or f"{CPU_ARCH_PREFIX}{machine.platform_machine()}"
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


def create(db: Database, spec: SessionSpec, run_spec: dict[str, Any] | None = None) -> Session:
    """Open a session; `run_spec` is what `mlirtuna run` was asked (kept for its resume)."""
    spec = detect(spec)
    _check_list(db, spec)
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
        run_spec=json.dumps(run_spec, sort_keys=True) if run_spec is not None else None,
        topk=spec.topk,
        split=spec.split,
        artifact_store=spec.artifact_store,
        keep_artifacts=spec.keep_artifacts,
        name=_check_name(spec.name),
        bundle_cap_mib=spec.bundle_cap_mib,
        capabilities=spec.capabilities[:500],
        standin=spec.standin,
        search=spec.search,
        search_budget=spec.search_budget,
    )
    with db.session() as s:
        s.add(row)
        s.flush()
        return Session.from_row(row)


NAME_MAX = 200  # characters of session.name
BUNDLE_CAP_MAX_MIB = 1 << 20  # 1 TiB: past any disk a worker unpacks to


def _check_name(name: str) -> str:
    name = " ".join(name.split())
    if len(name) > NAME_MAX:
        raise UserError(f"--name: {len(name)} characters, at most {NAME_MAX}")
    return name


def _check_list(db: Database, spec: SessionSpec) -> None:
    name = quick_list_name(spec.tuning_space)
    if name is not None and not load_quick_list(db, name, spec.arch or ""):
        raise UserError(
            f"no quick list {name!r} for {spec.arch}: make one with "
            f"`mlirtuna quick-list --session … --name {name}`"
        )


# -- the list:NAME tuning space: what a session and its workers read of a stored quick list ----
# (history/quick/ builds and stores the lists; it sits above this module and imports it.)


def check_quick_list_name(name: str) -> str:
    if not _LIST_NAME_RE.match(name):
        raise UserError(f"bad quick list name {name!r}: letters, digits, _ . - (at most 48)")
    return name


def quick_list_name(tuning_space: str) -> str | None:
    """NAME of a `list:NAME` tuning space, else None."""
    return tuning_space[len(LIST_PREFIX) :] if tuning_space.startswith(LIST_PREFIX) else None


def load_quick_list(db: Database, name: str, arch: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """{(op, data type): perf configs} of the stored quick list NAME for this arch."""
    with db.session() as s:
        rows = s.scalars(sa.select(QuickList).where(QuickList.name == name, QuickList.arch == arch))
        return {
            (r.op, r.data_type): tuple(pc for pc in r.perf_configs.splitlines() if pc) for r in rows
        }


def _host(tuner: str) -> str:
    from mlirtuna import tuners

    name = machine.machine_name()
    return name if tuners.kind(tuner).gpu else f"{name} ({machine.cpu_description()})"


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


def ops(db: Database, session_ids: list[int]) -> dict[int, list[str]]:
    """The ops each session tunes (sorted; [] for an empty session): `run`'s op where the
    session remembers it, else the distinct ops of its jobs' and results' problems (an
    imported session has results only)."""
    out: dict[int, list[str]] = {sid: [] for sid in session_ids}
    if not session_ids:
        return out
    with db.session() as s:
        specs = s.execute(
            sa.select(TuningSession.id, TuningSession.run_spec).where(
                TuningSession.id.in_(session_ids)
            )
        ).all()
        ask = []
        for sid, spec in specs:
            op = json.loads(spec).get("op") if spec else None
            if op and op != "auto":
                out[sid] = [op]
            else:
                ask.append(sid)
        for table in (Job, Result):
            if not ask:
                break
            stmt = (
                sa.select(table.session_id, Problem.op)
                .join(Problem, Problem.id == table.problem_id)
                .where(table.session_id.in_(ask))
                .distinct()
            )
            for sid, op in s.execute(stmt):
                out[sid].append(op)
            ask = [sid for sid in ask if not out[sid]]  # results: only where no job says
    return {sid: sorted(v) for sid, v in out.items()}


def retire(db: Database, session_id: int) -> Session:
    """Keep a session for history but never pick it again (export --arch, run's export)."""
    with db.session() as s:
        row = _row(s, session_id)
        if row.retired_at is None:
            row.retired_at = utcnow()
        s.flush()
        return Session.from_row(row)


NOTE_MAX_CHARS = 2000  # a note is a line or a paragraph, not a log file


@dataclass(frozen=True)
class Note:
    """A line an operator added to a session, with when (UTC, ISO)."""

    created_at: str
    text: str


def add_note(db: Database, session_id: int, text: str) -> Note:
    """Append a note to the session (`mlirtuna session note`); notes are never edited."""
    text = text.strip()
    if not text:
        raise UserError('an empty note: give its text, e.g. `session note 3 "node b lost"`')
    if len(text) > NOTE_MAX_CHARS:
        raise UserError(
            f"a note of {len(text)} characters: at most {NOTE_MAX_CHARS} (put a log elsewhere "
            "and note where)"
        )
    with db.session() as s:
        _row(s, session_id)
        row = SessionNote(session_id=session_id, created_at=utcnow(), text=text)
        s.add(row)
        s.flush()
        return Note(_iso(row.created_at), row.text)


def notes(db: Database, session_id: int) -> list[Note]:
    """The session's notes, oldest first."""
    stmt = (
        sa.select(SessionNote.created_at, SessionNote.text)
        .where(SessionNote.session_id == session_id)
        .order_by(SessionNote.id)
    )
    with db.session() as s:
        return [Note(_iso(when), text) for when, text in s.execute(stmt)]


def _row(s, session_id: int) -> TuningSession:
    row = s.get(TuningSession, session_id)
    if row is None:
        raise NotFound(f"no session {session_id}: `mlirtuna session list` shows them")
    return row
