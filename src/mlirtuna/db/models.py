"""The schema, and nothing else: every table of mlirtuna in one place (queries live elsewhere).

Conventions:
- timestamps are naive UTC `DateTime` (microseconds on MySQL/MariaDB); the database clock is
  used for leases (see db.db_now);
- `problem` is the supertable of every op; conv_config / gemm_config / attention_config share its
  id (joined tables), so one job table and one result table serve every op with real foreign keys;
- the config tables' column names are exactly the fields of the problem dataclasses
  (mlirtuna.problems), which tests check.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from mlirtuna.keys import perf_config_format

# Constraint names are fixed so that migrations name them the same on every backend.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

UtcDateTime = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere candidate ids need 64 bits.
BigId = BigInteger().with_variant(Integer(), "sqlite")

# Job states (design.md, "The job life cycle").
NEW, RUNNING, COMPLETED, ERROR, CANCELLED = "new", "running", "completed", "error", "cancelled"
# A benchmark job of a two-stage session waits for its compile job's bundle; it becomes `new`
# in the transaction that completes the compile job (docs/architecture.md, "Two-stage jobs").
WAITING = "waiting"
JOB_STATES = (NEW, WAITING, RUNNING, COMPLETED, ERROR, CANCELLED)
# Job stages: one-stage jobs tune; a two-stage session has a compile and a benchmark job per
# problem, in the same table and claimed by the same query (with a stage filter).
TUNE, COMPILE, BENCHMARK = "tune", "compile", "benchmark"
STAGES = (TUNE, COMPILE, BENCHMARK)
SPLIT_STAGES = f"{COMPILE},{BENCHMARK}"  # the one split a session can have today
# PostgreSQL only: triggers on `job` (migration 0012) notify this channel, with the session id as
# payload, when a job becomes claimable (inserted as new, or its state changed to new); idle
# workers LISTEN on it instead of only polling (wakeup.py).
JOB_CLAIMABLE_CHANNEL = "mlirtuna_job_claimable"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    if TYPE_CHECKING:
        # Every model here maps a Table (DeclarativeBase says only FromClause): Core statements
        # on `Model.__table__` (the queue's) then type-check without a cast each.
        __table__: ClassVar[Table]


class Problem(Base):
    """One canonical problem of any op; `test_vector` is perfRunner's to_command_line() string."""

    __tablename__ = "problem"
    __table_args__ = (UniqueConstraint("op", "test_vector"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String(16))
    test_vector: Mapped[str] = mapped_column(String(700))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class ProblemTag(Base):
    """A label put on problems at import (`--tag`), so jobs can be loaded for exactly that set."""

    __tablename__ = "problem_tag"

    problem_id: Mapped[int] = mapped_column(ForeignKey("problem.id"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(100), primary_key=True)
    # `-perf_priority N` from newer config lists; becomes the job priority (lower runs first).
    priority: Mapped[int] = mapped_column(Integer, default=0)


def _problem_id() -> Mapped[int]:
    return mapped_column(ForeignKey("problem.id", ondelete="CASCADE"), primary_key=True)


def _int(default: int = 0) -> Mapped[int]:
    return mapped_column(Integer, default=default, server_default=str(default))


def _str(length: int = 16) -> Mapped[str]:
    return mapped_column(String(length), default="", server_default="")


def _bool() -> Mapped[bool]:
    return mapped_column(Boolean, default=False, server_default="0")


class ConvConfig(Base):
    __tablename__ = "conv_config"

    id: Mapped[int] = _problem_id()
    data_type: Mapped[str] = _str()
    in_data_type: Mapped[str] = _str()
    fil_data_type: Mapped[str] = _str()
    out_data_type: Mapped[str] = _str()
    direction: Mapped[str] = _str(8)
    fil_layout: Mapped[str] = _str()
    in_layout: Mapped[str] = _str()
    out_layout: Mapped[str] = _str()
    spatial_dim: Mapped[int] = _int(2)
    in_channels: Mapped[int] = _int()
    in_h: Mapped[int] = _int()
    in_w: Mapped[int] = _int()
    fil_h: Mapped[int] = _int()
    fil_w: Mapped[int] = _int()
    out_channels: Mapped[int] = _int()
    batchsize: Mapped[int] = _int()
    pad_h: Mapped[int] = _int()
    pad_w: Mapped[int] = _int()
    conv_stride_h: Mapped[int] = _int()
    conv_stride_w: Mapped[int] = _int()
    dilation_h: Mapped[int] = _int()
    dilation_w: Mapped[int] = _int()
    group_size: Mapped[int] = _int()
    kernel_repeats: Mapped[int] = _int()


class GemmConfig(Base):
    __tablename__ = "gemm_config"

    id: Mapped[int] = _problem_id()
    data_type: Mapped[str] = _str()
    out_data_type: Mapped[str] = _str()
    trans_a: Mapped[bool] = _bool()
    trans_b: Mapped[bool] = _bool()
    # -transO (migration 0018: every gemm has one; rows from before it are false).
    trans_o: Mapped[bool] = _bool()
    group_size: Mapped[int] = _int()
    m: Mapped[int] = _int()
    n: Mapped[int] = _int()
    k: Mapped[int] = _int()
    kernel_repeats: Mapped[int] = _int()


class AttentionConfig(Base):
    __tablename__ = "attention_config"

    id: Mapped[int] = _problem_id()
    data_type: Mapped[str] = _str()
    trans_q: Mapped[bool] = _bool()
    trans_k: Mapped[bool] = _bool()
    trans_v: Mapped[bool] = _bool()
    trans_o: Mapped[bool] = _bool()
    causal: Mapped[bool] = _bool()
    return_lse: Mapped[bool] = _bool()
    split_kv: Mapped[int] = _int()
    group_size: Mapped[int] = _int()
    seq_len_q: Mapped[int] = _int()
    seq_len_k: Mapped[int] = _int()
    num_heads_q: Mapped[int] = _int()
    num_heads_kv: Mapped[int] = _int()
    head_dim_qk: Mapped[int] = _int()
    head_dim_v: Mapped[int] = _int()
    with_attn_scale: Mapped[bool] = _bool()
    with_attn_bias: Mapped[bool] = _bool()
    trans_bias: Mapped[bool] = _bool()
    kernel_repeats: Mapped[int] = _int()


class GemmGemmConfig(Base):
    __tablename__ = "gemm_gemm_config"

    id: Mapped[int] = _problem_id()
    data_type: Mapped[str] = _str()
    trans_a: Mapped[bool] = _bool()
    trans_b: Mapped[bool] = _bool()
    trans_c: Mapped[bool] = _bool()
    trans_o: Mapped[bool] = _bool()
    group_size: Mapped[int] = _int()
    m: Mapped[int] = _int()
    k: Mapped[int] = _int()
    n: Mapped[int] = _int()
    gemm_o: Mapped[int] = _int()


class ConvGemmConfig(Base):
    __tablename__ = "conv_gemm_config"

    id: Mapped[int] = _problem_id()
    data_type: Mapped[str] = _str()
    fil_layout: Mapped[str] = _str()
    in_layout: Mapped[str] = _str()
    trans_c: Mapped[bool] = _bool()
    trans_o: Mapped[bool] = _bool()
    batchsize: Mapped[int] = _int()
    in_channels: Mapped[int] = _int()
    in_h: Mapped[int] = _int()
    in_w: Mapped[int] = _int()
    out_channels: Mapped[int] = _int()
    fil_h: Mapped[int] = _int()
    fil_w: Mapped[int] = _int()
    pad_h: Mapped[int] = _int()
    pad_w: Mapped[int] = _int()
    conv_stride_h: Mapped[int] = _int()
    conv_stride_w: Mapped[int] = _int()
    dilation_h: Mapped[int] = _int()
    dilation_w: Mapped[int] = _int()
    group_size: Mapped[int] = _int()
    gemm_o: Mapped[int] = _int()


# A fusion module can be large (MIGraphX dumps): MEDIUMTEXT on MySQL/MariaDB (TEXT is 64 KiB).
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


class FusionConfig(Base):
    """A fusion module (`--op fusion`): its text travels in the database, so a worker on another
    machine needs no shared file system. problem.test_vector is `sha256:<hex>` of the text."""

    __tablename__ = "fusion_config"

    id: Mapped[int] = _problem_id()
    file_name: Mapped[str] = _str(255)
    function: Mapped[str] = _str(255)
    sha256: Mapped[str] = _str(64)
    # The conv or gemm canonical string rocMLIR's tuning DB stores the module's winner under.
    tuning_key: Mapped[str] = _str(700)
    key_op: Mapped[str] = _str()  # conv | gemm
    key_source: Mapped[str] = _str()  # rocmlir-gen | migraphx (derived by mlirtuna)
    module_text: Mapped[str] = mapped_column(LongText)


CONFIG_TABLES = {
    "conv": ConvConfig,
    "gemm": GemmConfig,
    "attention": AttentionConfig,
    "gemm_gemm": GemmGemmConfig,
    "conv_gemm": ConvGemmConfig,
    "fusion": FusionConfig,
}


class TuningSession(Base):
    """Everything that can change a tuning result, and why the tuning was run."""

    __tablename__ = "session"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    arch: Mapped[str] = mapped_column(String(32))  # bare chip name: gfx942
    arch_full: Mapped[str] = mapped_column(String(128))  # gcnArchName: gfx942:sramecc+:xnack-
    num_cu: Mapped[int] = mapped_column(Integer)
    num_chiplets: Mapped[int] = mapped_column(Integer, default=1)
    rocm_v: Mapped[str] = _str(64)
    mlir_v: Mapped[str] = _str(64)  # git hash of the rocMLIR source
    reason: Mapped[str] = _str(200)
    ticket: Mapped[str] = _str(64)
    docker: Mapped[str] = _str(200)
    # quick | full | greedy | exhaustive | list:NAME (a stored quick list, see QuickList)
    tuning_space: Mapped[str] = mapped_column(String(64))
    # rocmlir | cpu | sleep[:SECONDS] | imported | a plugin's module.path:factory
    tuner: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = _str(200)  # where it was opened (for cpu sessions: the CPU model)
    # How many of the search's fastest candidates are measured again to pick the winner.
    topk: Mapped[int] = _int(3)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    # import-tsv: SHA-256 of the file's bytes, so that importing it again is noticed.
    source_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # The key form the session's perfRunner reads (keys.KEY_FORMS): export's default.
    key_form: Mapped[str] = mapped_column(String(16), default="plain", server_default="plain")
    # tuningRunner E4 settings that change results (None: the tool's default, flag not passed).
    rep_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    warmup_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_run_timeout_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lfbo_effort: Mapped[str | None] = mapped_column(String(8), nullable=True)
    # Set by `session retire`: kept for history, never picked by export --arch or run.
    retired_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # What `mlirtuna run` was asked (op, files, expansion, tuner, space), as JSON: for resume.
    run_spec: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Two-stage jobs (SPLIT_STAGES) or None: one `tune` job per problem.
    split: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # Where bundles go: a directory every compile and GPU host sees, or None (the database).
    artifact_store: Mapped[str | None] = mapped_column(String(500), nullable=True)
    keep_artifacts: Mapped[bool] = _bool()  # keep bundles after their benchmark completed
    # The most a bundle may unpack to, in MiB (`--bundle-cap-mib`); None: the default
    # (defaults.DEFAULT_BUNDLE_CAP_BYTES). The extractor refuses a bigger one before writing.
    bundle_cap_mib: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What to call it: `session new --name`, or set by `run` from the op and the input.
    name: Mapped[str] = _str(200)
    # What the build's tuningRunner.py could do when the session was opened (eras.Era.describe):
    # "" for sessions without a rocMLIR build.
    capabilities: Mapped[str] = _str(500)
    # Tuned on mlirtuna's stand-in rocMLIR build (made-up numbers), as the build said when the
    # session was opened: never exported or reused unless named (migration 0020).
    standin: Mapped[bool] = _bool()
    # How a job's candidates are chosen (issue 45, migration 0023): a strategy of
    # mlirtuna.search and its budget (measurements per job); NULL: the tuner's whole space.
    search: Mapped[str | None] = mapped_column(String(32), nullable=True)
    search_budget: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SessionNote(Base):
    """A line an operator added to a session (`mlirtuna session note`): why it was stopped, what
    was odd about the node. Appended, never edited; the dashboard shows them (migration 0022)."""

    __tablename__ = "session_note"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("session.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    text: Mapped[str] = mapped_column(Text)


class Job(Base):
    """One problem to tune in one session; the queue is this table (design.md)."""

    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("session_id", "problem_id", "stage"),
        # Serves the claim: WHERE session_id=? AND state='new' AND stage=? ORDER BY priority, id.
        Index("ix_job_claim", "session_id", "state", "stage", "priority", "id"),
        # Serves the sweep of expired leases.
        Index("ix_job_lease", "state", "lease_expires_at"),
        # Serves `jobs list`: a session's jobs in id order, a page at a time.
        Index("ix_job_session_list", "session_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("session.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problem.id"), index=True)
    reason: Mapped[str] = _str(200)
    state: Mapped[str] = mapped_column(String(16), default=NEW)
    priority: Mapped[int] = _int()
    retries: Mapped[int] = _int()
    result: Mapped[str | None] = mapped_column(Text, nullable=True)  # tool output or the error
    compile_start: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    compile_end: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    gpu_id: Mapped[int] = _int(-1)
    machine_name: Mapped[str] = _str(200)
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)  # fencing token
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    not_before: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)  # backoff
    # tune (one-stage), compile or benchmark (two-stage sessions): see STAGES.
    stage: Mapped[str] = mapped_column(String(16), default=TUNE, server_default=TUNE)


class Attempt(Base):
    """Every claim of a job and how it ended: the job's attempts log."""

    __tablename__ = "attempt"
    # Serves the claim's check: WHERE gpu = ? AND ended_at IS NULL.
    __table_args__ = (Index("ix_attempt_gpu", "gpu", "ended_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigId, ForeignKey("job.id", ondelete="CASCADE"), index=True)
    lease_token: Mapped[str] = mapped_column(String(32), unique=True)
    machine_name: Mapped[str] = _str(200)
    gpu_id: Mapped[int] = _int(-1)
    pid: Mapped[int] = _int()
    claimed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # completed | failed | expired | released (given back on a second signal) | cancelled
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The GPU it ran on (GPU_KEY: the GPU's unique id, else MACHINE:INDEX; "" for a compile or
    # CPU attempt), its performance level where the tools report one, and the worker that
    # claimed it (a token per worker process): the claim refuses a GPU on which another
    # worker has a live attempt (queue/sql.py).
    gpu: Mapped[str] = _str(200)
    gpu_perf: Mapped[str] = _str(64)
    worker: Mapped[str | None] = mapped_column(String(32), nullable=True)


def _family_default(context) -> str:
    return perf_config_format(context.get_current_parameters().get("perf_config") or "")


def _perf_family() -> Mapped[str]:
    """keys.perf_config_format of the row's perf_config, filled on insert (one place for it)."""
    return mapped_column(String(16), default=_family_default, server_default="")


class Result(Base):
    """The winner of one problem in one session."""

    __tablename__ = "result"
    __table_args__ = (UniqueConstraint("session_id", "problem_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("session.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problem.id"), index=True)
    # Indexed: a job's page looks its winner up by job (dashboard, `jobs show`).
    job_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("job.id"), nullable=True, index=True
    )
    perf_config: Mapped[str] = mapped_column(String(255))
    kernel_time: Mapped[float | None] = mapped_column(Double, nullable=True)  # ns
    tflops: Mapped[float | None] = mapped_column(Double, nullable=True)
    # For results imported from a .tsv: the row's own commit, timestamp and duration.
    tuned_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Double, nullable=True)
    perf_family: Mapped[str] = _perf_family()
    # What the key had after the plain test vector (keys.Key.suffix): "" (plain),
    # "-supportsSplitK true|false", fusion words. Imported rows keep their file's form.
    key_suffix: Mapped[str] = _str(255)
    # Runner-up time / winner time - 1, and the two medians' noise relative to the winner
    # (mlirtuna.stats): the winner is a coin toss when winner_margin <= winner_noise.
    winner_margin: Mapped[float | None] = mapped_column(Double, nullable=True)
    winner_noise: Mapped[float | None] = mapped_column(Double, nullable=True)
    # Copied by `jobs load --reuse` from this session (an equivalent context); None: tuned here.
    reused_from: Mapped[int | None] = mapped_column(ForeignKey("session.id"), nullable=True)


class Candidate(Base):
    """Every perf config tried: its kernel time, or why it was invalid."""

    __tablename__ = "candidate"
    __table_args__ = (Index("ix_candidate_session_problem", "session_id", "problem_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("session.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problem.id"))
    job_id: Mapped[int] = mapped_column(BigId, ForeignKey("job.id"), index=True)
    perf_config: Mapped[str] = mapped_column(String(255))
    kernel_time: Mapped[float | None] = mapped_column(Double, nullable=True)  # ns
    tflops: Mapped[float | None] = mapped_column(Double, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why it was invalid
    perf_family: Mapped[str] = _perf_family()
    # The samples behind kernel_time (their median), where the tuner has them (mlirtuna.stats):
    time_min: Mapped[float | None] = mapped_column(Double, nullable=True)  # ns
    time_iqr: Mapped[float | None] = mapped_column(Double, nullable=True)  # ns
    samples: Mapped[int | None] = mapped_column(Integer, nullable=True)  # kept after outliers
    remeasured: Mapped[bool] = _bool()  # numbers from the top-k re-measurement
    # The search pass's time (ns) of every valid candidate: kernel_time's own where it was not
    # re-measured, the search's where the top-k pass replaced it (one kind: quick.histories).
    search_time: Mapped[float | None] = mapped_column(Double, nullable=True)
    # The round of a searched session's search that measured it (0 first); None: not searched.
    search_round: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SearchStep(Base):
    """One measurement of a searched job, written as soon as its round was measured, fenced by
    the attempt's lease token (migration 0023): a new attempt of the job (its worker died)
    tells its search these first and measures only what they lack (worker/search.py)."""

    __tablename__ = "search_step"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigId, ForeignKey("job.id", ondelete="CASCADE"), index=True)
    lease_token: Mapped[str] = mapped_column(String(32))  # the attempt that measured it
    search_round: Mapped[int] = mapped_column(Integer)
    perf_config: Mapped[str] = mapped_column(String(255))
    kernel_time: Mapped[float | None] = mapped_column(Double, nullable=True)  # ns; None: invalid
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class QuickList(Base):
    """A stored quick-tuning list: the perf configs `--tuning-space list:NAME` tries, per
    (arch, op, data type), built by `mlirtuna quick-list` from the history (history/quick/)."""

    __tablename__ = "quick_list"
    __table_args__ = (UniqueConstraint("name", "arch", "op", "data_type"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(48))
    arch: Mapped[str] = mapped_column(String(32))
    op: Mapped[str] = mapped_column(String(16))
    data_type: Mapped[str] = mapped_column(String(16))
    # One perf config per line, in the order a tuner should try them.
    perf_configs: Mapped[str] = mapped_column(
        Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
    )
    method: Mapped[str] = _str(200)  # how it was built (ilp/greedy, threshold, folds)
    sessions: Mapped[str] = _str(200)  # the sessions whose history it was built from
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


# A bundle chunk's bytes: LONGBLOB on MySQL/MariaDB (BLOB is 64 KiB), BYTEA / BLOB elsewhere.
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


class Bundle(Base):
    """The compiled candidates of one problem (a compile job's output, tar + gzip), waiting for
    its benchmark job. Its bytes are in bundle_chunk, or in a file of the session's artifact
    store (`in_store`: the file's name is derived from the store and the ids, never stored).
    Only a `complete` bundle is ever read: it is set in the transaction that
    completes the compile job and makes the benchmark job claimable (bundles.py)."""

    __tablename__ = "bundle"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("session.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problem.id"), index=True)
    job_id: Mapped[int] = mapped_column(BigId, ForeignKey("job.id"), index=True)  # the compile job
    lease_token: Mapped[str] = mapped_column(String(32))  # the compile attempt that wrote it
    commit_id: Mapped[str] = _str(64)  # the rocMLIR commit that compiled it (index.json)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = _str(64)
    in_store: Mapped[bool] = _bool()  # a file in the session's artifact store, not chunks
    complete: Mapped[bool] = _bool()
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class BundleChunk(Base):
    """One piece (about 1 MiB) of a bundle kept in the database: every INSERT stays far below
    MariaDB's default max_allowed_packet (16 MiB)."""

    __tablename__ = "bundle_chunk"

    bundle_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("bundle.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    data: Mapped[bytes] = mapped_column(Blob)
