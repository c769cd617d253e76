"""GPU busy share on the same work: one-stage per problem, one-stage batched, two-stage.

Issue 16 §3. The real `mlirtuna` CLI drives the stand-in tuningRunner (era E4) with realistic
costs (src/mlirtuna/standin/rocmlir/bin/fake_costs.py): a start-up per tool invocation, a compile
time and
a benchmark time per candidate. Every scenario tunes the same gemm problems in its own session
with G GPU workers (`mlirtuna worker --gpus g`, one process per slot) and, for two-stage, N
compile workers (`mlirtuna worker --role compile`). The stand-in appends each benchmarking
stretch to a GPU log; the attempts table gives each slot's claims.

`--goal` (issue 24): only the goal's scenario: two-stage, the GPU workers benchmarking through a
benchmark stream each (the stand-in's proposed `--benchmark-stream`, offered to them alone), the
compile workers batching `--compile-batch` problems per `--compile-only` call, and as many of
them as give >= 1.2x the GPU slots' demand by the costs; its output ends with the per-slot
timeline and then, as its last line, `goal: mean GPU slot busy NN.N %`. The K=32 variant:
`--goal --batch 32 --problems 128` (with a stream, K does not change the GPU side: a GPU worker
feeds its stream up to 3 jobs ahead whatever K is).

Definitions (the same for every scenario):
- slot window: from the slot's first claim to the end of its last attempt (database clock). A
  benchmark stream is started by its worker before that worker's first claim (while it waits
  for the first bundle), so its one start-up lies outside the window, as the worker's own
  Python start-up does; every tool call a slot starts inside its window is charged there;
- slot busy share: the union of the slot's benchmarking stretches inside its window / window;
- wall: the farm's window, from the first claim of any job to the end of the last attempt;
- farm share: all slots' benchmarking / (G x wall), idle ramp-up and tail included;
- ceiling: the mean slot busy share that a farm which never waits for anything reaches: each
  slot takes its even share of the problems (problems / G, the first slots one more) in calls of
  K (the last one partial: the tail), pays the tool's start-up per call, (one-stage) the compiles,
  and the in-call gaps the run measured (per bundle: from a call's start + start-up to its first
  benchmarking stretch, and between its stretches; the stand-in's own work per problem). The
  capacity table's ceiling, computed before any run, has no in-call gaps;
- where a slot's window went: benchmarking, the tool's start-up (and one-stage compiles) as the
  costs say from the tool calls it made, the rest of the time it held a job (mlirtuna, Python,
  bundles: the farm's own overhead), and the time it held no job.
A diagnostic two-stage row gives the GPU workers' tool calls no start-up (compile calls keep
theirs), to tell what the tool's start-up costs from what the farm itself loses.

Workers start idle; the jobs are loaded once every worker said so (their start-up stays out),
and they are stopped once the session is drained. A scenario that stops making progress, or
runs past its timeout, is stopped and reported as such. Costs are sleeps: the machine's cores
only pay for mlirtuna, the database and the stand-in's Python start-up.

    python bench/bench_gpu_time.py [--backends sqlite] [--smoke] [--out FILE]
        [--problems 32] [--gpus 4] [--space exhaustive] [--startup-s 2] [--compile-ms 50]
        [--bench-ms 10] [--batch 8] [--compile-workers 0,2,8,feed] [--no-diagnostic]
        [--kinds one-stage,batched,two-stage] [--timeout S]
    python bench/bench_gpu_time.py --goal [--batch 8] [--problems 32] [--compile-batch 8]
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import common
import sqlalchemy as sa

from mlirtuna import standin
from mlirtuna.db import Database
from mlirtuna.db.models import COMPLETED, Attempt, Job
from mlirtuna.defaults import ENV_TOOL_ENV
from mlirtuna.queue import jobs

ROOT = Path(__file__).resolve().parent.parent
FAKE_BUILD = standin.BUILD
OVERLAY = ROOT / "tests" / "support" / "standin_faults"  # the stand-in's argv log
# The stand-in's fake GPU; every session must say the same or its workers refuse the results.
ARCH_FULL, NUM_CU, NUM_CHIPLETS = "gfx942:sramecc+:xnack-", 304, 8
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TAG = "bench-gpu-time"
GPU_LOG, TOOL_LOG = "gpu.jsonl", "tool-calls.jsonl"  # per scenario: busy stretches, tool argv
KINDS = ("one-stage", "batched", "two-stage")
STALL_MARGIN_S = 30.0  # beyond the longest single tool call, before "no progress" stops a run
GOAL_CAPACITY = 1.2  # --goal: compile capacity over GPU demand
STALL_IDLE_S = 20.0  # nothing running and nothing claimed (idle workers poll every <= 2 s)
READY_TIMEOUT_S = 120.0  # for every worker to start and report idle (2 cores, tens of workers)
STOP_GRACE_S = 10.0


# -- what is run -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Costs:
    startup_s: float
    compile_ms: float
    bench_ms: float
    candidates: int  # per problem: the tuning space's size in the stand-in

    @property
    def compile_s(self) -> float:
        """One problem's compilation (all its candidates, one CPU)."""
        return self.candidates * self.compile_ms / 1e3

    @property
    def bench_s(self) -> float:
        """One problem's benchmarking (all its candidates, one GPU)."""
        return self.candidates * self.bench_ms / 1e3


@dataclass(frozen=True)
class Scenario:
    label: str
    split: bool  # two-stage session (compile jobs, then benchmark jobs)
    batch: int  # the GPU workers' --batch (1: omitted, today's behaviour)
    compile_workers: int = 0
    # A diagnostic: the GPU workers' tool calls start in this many seconds instead of the costs'
    # start-up (0: as if the next call's start-up were hidden behind the current benchmarking).
    gpu_startup_s: float | None = None
    # The GPU workers benchmark through one long-lived stream each (the stand-in's proposed
    # --benchmark-stream): one start-up per slot, before its first claim.
    stream: bool = False
    compile_batch: int = 1  # the compile workers' --batch (problems per --compile-only call)

    def gpu_startup(self, costs: Costs) -> float:
        return costs.startup_s if self.gpu_startup_s is None else self.gpu_startup_s

    def needs(self) -> list[str]:
        """CLI flags this scenario needs from the build under test."""
        wanted = ["--batch"] if self.batch > 1 else []
        if self.split:
            wanted += ["--split", "--role"]
        return wanted

    def ceiling(self, costs: Costs, problems: int, gpus: int, gap_s: float = 0.0) -> float:
        """The mean slot busy share when no slot ever waits: each slot's even share of the
        problems in calls of K (the last one partial), a start-up per call, `gap_s` per bundle
        inside a call, and (one-stage) every problem's compiles."""
        shares = []
        for g in range(min(gpus, problems)):
            n = problems // gpus + (1 if g < problems % gpus else 0)
            calls = 0 if self.stream else math.ceil(n / self.batch)  # stream: before the window
            busy = n * costs.bench_s
            idle = calls * self.gpu_startup(costs) + n * gap_s
            idle += 0 if self.split else n * costs.compile_s
            shares.append(busy / (busy + idle))
        return sum(shares) / len(shares) if shares else float("nan")


@dataclass(frozen=True)
class Plan:
    backend: str
    problems: int
    gpus: int
    space: str
    costs: Costs
    timeout_s: float | None  # per scenario; None: from the costs
    kinds: tuple[str, ...] = KINDS  # which rows: one-stage, batched, two-stage
    goal: bool = False  # --goal: the issue-24 goal row only (last line: its mean slot busy)
    gpu_flags: tuple[str, ...] = ()  # two-stage GPU workers' --batch-wait S / --no-prefetch

    def longest_call_s(self, batch: int) -> float:
        c = self.costs
        return c.startup_s + batch * (c.compile_s + c.bench_s)

    def timeout_for(self, scenario: Scenario) -> float:
        """Generous: three times what the slower of the GPU slots (tuning their share
        one-stage) and the compile workers need, plus slack."""
        if self.timeout_s is not None:
            return self.timeout_s
        per_slot = math.ceil(self.problems / self.gpus) * self.longest_call_s(1)
        serial_compile = self.problems * (self.costs.startup_s + self.costs.compile_s)
        compile_bound = serial_compile / max(scenario.compile_workers, 1) if scenario.split else 0
        bound = max(per_slot, compile_bound)
        return 3 * bound + 60


@dataclass(frozen=True)
class SlotTime:
    """One GPU slot's window and what filled it, in seconds."""

    window: float  # its first claim to the end of its last attempt
    benchmarking: float
    tool_costs: float  # in a job: the stand-in's start-up per call (+ compiles, one-stage)
    in_jobs: float  # holding at least one job
    calls: int  # tool invocations on this slot that started inside its window

    @property
    def share(self) -> float:
        return self.benchmarking / self.window

    @property
    def other_share(self) -> float:
        """In a job, neither benchmarking nor the tool's costs: mlirtuna, Python, bundles."""
        return (self.in_jobs - self.benchmarking - self.tool_costs) / self.window

    @property
    def between_share(self) -> float:
        """Holding no job: polling for one, or nothing claimable."""
        return (self.window - self.in_jobs) / self.window


@dataclass
class Outcome:
    scenario: Scenario
    jobs_done: int = 0
    jobs_total: int = 0
    wall_s: float = float("nan")
    slots: dict[int, SlotTime | None] = field(default_factory=dict)
    farm_share: float = float("nan")
    candidates: int = 0
    cpu_busy_pct: float = float("nan")
    gpu_workers_cpu_s: float = float("nan")  # the GPU worker processes' own CPU
    gpu_tools_cpu_s: float = float("nan")  # their tool calls' CPU
    note: str = ""
    in_call_gap_s: float = 0.0  # per bundle benchmarked: the tool's own time inside a call

    def ceiling(self, plan: Plan) -> float:
        return self.scenario.ceiling(plan.costs, plan.problems, plan.gpus, self.in_call_gap_s)


# -- the farm: build, environment, CLI ---------------------------------------------------------
def fake_build(tmp: Path) -> Path:
    build = tmp / "build"
    shutil.copytree(FAKE_BUILD, build)
    return build


def farm_env(url: str, build: Path, costs: Costs, gpus: int, logs: Path) -> dict[str, str]:
    """The environment of every mlirtuna process (and so of the stand-in they start)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FAKE_") and k not in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    }
    env.update(
        # The tests' overlay on the stand-in (its argv log, FAKE_TUNINGRUNNER_LOG) on the path.
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "src"), str(OVERLAY), os.environ.get("PYTHONPATH", "")]
        ),
        PYTHONUNBUFFERED="1",
        MLIRTUNA_DB=url,
        MLIRTUNA_ROCMLIR_BUILD=str(build),
        MLIRTUNA_ROCMLIR_PYTHON=sys.executable,
        # The tool's environment is an allowlist (issue 23): the stand-in's settings pass.
        **{ENV_TOOL_ENV: "FAKE_*"},
        FAKE_TUNINGRUNNER_ERA="E4",
        FAKE_GPU_ARCH=ARCH_FULL,
        FAKE_GPU_NUM_CU=str(NUM_CU),
        FAKE_GPU_NUM_CHIPLETS=str(NUM_CHIPLETS),
        FAKE_GPU_COUNT=str(max(8, gpus)),
        FAKE_TUNINGRUNNER_COMMIT=COMMIT,
        FAKE_TUNINGRUNNER_STARTUP_S=str(costs.startup_s),
        FAKE_TUNINGRUNNER_COMPILE_MS=str(costs.compile_ms),
        FAKE_TUNINGRUNNER_BENCH_MS=str(costs.bench_ms),
        FAKE_TUNINGRUNNER_GPU_LOG=str(logs / GPU_LOG),
        FAKE_TUNINGRUNNER_LOG=str(logs / TOOL_LOG),
    )
    return env


def mlirtuna(env: dict[str, str], *args: str) -> str:
    """One short CLI command; its stdout. A failure stops the bench with the command's stderr."""
    argv = [sys.executable, "-m", "mlirtuna", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`mlirtuna {' '.join(args)}` failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def cli_flags(env: dict[str, str]) -> set[str]:
    """The flags of `worker` and `session new` in the build under test (features come and go)."""
    text = mlirtuna(env, "worker", "--help") + mlirtuna(env, "session", "new", "--help")
    return {word.strip(",.;:()[]") for word in text.split() if word.startswith("--")}


def problem_lines(n: int) -> list[str]:
    """`n` distinct gemm configs (bert-like shapes; the stand-in's costs do not depend on them)."""
    shapes = [
        (m, nn, k)
        for m in (128, 256, 384, 512, 768, 1024, 2048, 4096)
        for nn in (256, 768, 2304, 3072)
        for k in (64, 256, 768, 1024, 3072)
    ]
    if n > len(shapes):
        raise SystemExit(f"--problems: at most {len(shapes)}")
    line = "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m {} -n {} -k {}"
    return [line.format(*shape) for shape in shapes[:n]]


def open_session(env: dict[str, str], plan: Plan, scenario: Scenario) -> int:
    args = [
        "session", "new", "--tuner", "rocmlir", "--tuning-space", plan.space,
        "--arch-full", ARCH_FULL, "--num-cu", str(NUM_CU), "--num-chiplets", str(NUM_CHIPLETS),
        "--rocm-v", "6.4", "--mlir-v", COMMIT, "--reason", f"bench_gpu_time: {scenario.label}",
        "--json",
    ]  # fmt: skip
    if scenario.split:
        args += ["--split", "compile,benchmark"]
    return int(json.loads(mlirtuna(env, *args))["id"])


def worker_argvs(sid: int, plan: Plan, scenario: Scenario) -> dict[str, list[str]]:
    """Each worker process by name: one per GPU slot, then the compile workers."""
    base = [sys.executable, "-m", "mlirtuna", "worker", "--session", str(sid)]
    batch = ["--batch", str(scenario.batch)] if scenario.batch > 1 else []
    extra = list(plan.gpu_flags) if scenario.split and scenario.batch > 1 else []
    argvs = {f"gpu{g}": [*base, "--gpus", str(g), *batch, *extra] for g in range(plan.gpus)}
    compile_batch = ["--batch", str(scenario.compile_batch)] if scenario.compile_batch > 1 else []
    for i in range(scenario.compile_workers):
        argvs[f"compile{i}"] = [*base, "--role", "compile", *compile_batch]
    return argvs


# -- running one scenario ----------------------------------------------------------------------
@contextlib.contextmanager
def workers(argvs: dict[str, list[str]], envs: dict[str, dict], logs: Path) -> Iterator[list]:
    """The worker processes (each its own process group, its stderr in a file), stopped after."""
    procs = []
    try:
        for name, argv in argvs.items():
            with open(logs / f"{name}.log", "w") as err:
                proc = subprocess.Popen(
                    argv,
                    env=envs[name],
                    stdout=err,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((name, proc))
        yield procs
    finally:
        stop(procs)


def stop(procs: list) -> None:
    """SIGTERM (stop after the job), again (give the job back), then SIGKILL the group."""
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        alive = [p for _, p in procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(p.pid, sig)  # the worker's tool call too
                else:
                    p.send_signal(sig)
        deadline = time.monotonic() + STOP_GRACE_S / 2
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if p.poll() is None]
            time.sleep(0.1)
    for _, p in procs:
        p.wait()


def wait_idle(procs: list, logs: Path) -> None:
    """Until every worker has connected and found nothing to claim (or died: an error)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = {name for name, _ in procs}
    while waiting and time.monotonic() < deadline:
        for name, proc in procs:
            if proc.poll() is not None:
                tail = (logs / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"worker {name} exited with {proc.returncode}:\n{tail}")
            if name in waiting and "idle: no job" in (logs / f"{name}.log").read_text():
                waiting.discard(name)
        time.sleep(0.2)
    if waiting:
        common.status(f"  not idle after {READY_TIMEOUT_S:.0f} s: {sorted(waiting)}; going on")


@dataclass(frozen=True)
class Progress:
    claimed: int  # attempts begun
    ended: int  # attempts ended
    stretches: int  # benchmarking stretches logged

    @property
    def running(self) -> bool:
        return self.claimed > self.ended


def progress(db: Database, sid: int, gpu_log: Path) -> Progress:
    with db.session() as s:
        claimed, ended = s.execute(
            sa.select(sa.func.count(), sa.func.count(Attempt.ended_at))
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.session_id == sid)
        ).one()
    lines = gpu_log.read_text().count("\n") if gpu_log.exists() else 0
    return Progress(int(claimed), int(ended), lines)


def drive(db: Database, sid: int, gpu_log: Path, timeout_s: float, longest_call_s: float) -> str:
    """Wait until the session is drained; '' or why the run was cut short.

    Stalled: nothing claimed, ended or benchmarked for STALL_IDLE_S with no attempt running
    (no worker can claim what is left), or for the longest tool call + STALL_MARGIN_S with one
    running (a call that hangs)."""
    start = last_change = time.monotonic()
    seen = progress(db, sid, gpu_log)
    while not jobs.is_drained(db, sid):
        now = time.monotonic()
        if now - start > timeout_s:
            return f"timed out after {timeout_s:.0f} s"
        quiet = now - last_change
        if quiet > (longest_call_s + STALL_MARGIN_S if seen.running else STALL_IDLE_S):
            what = "attempts running" if seen.running else "nothing claimable"
            return f"stalled: no progress for {quiet:.0f} s, {what}; stopped"
        time.sleep(0.5)
        current = progress(db, sid, gpu_log)
        if current != seen:
            seen, last_change = current, time.monotonic()
    return ""


def run_scenario(url: str, tmp: Path, build: Path, plan: Plan, scenario: Scenario) -> Outcome:
    workdir = tmp / scenario.label.replace(" ", "_").replace(",", "")
    workdir.mkdir()
    gpu_log = workdir / GPU_LOG
    env = farm_env(url, build, plan.costs, plan.gpus, workdir)
    sid = open_session(env, plan, scenario)
    db = Database(url)
    try:
        argvs = worker_argvs(sid, plan, scenario)
        envs = {name: env for name in argvs}
        if scenario.gpu_startup_s is not None:
            gpu_env = dict(env, FAKE_TUNINGRUNNER_STARTUP_S=str(scenario.gpu_startup_s))
            envs.update({name: gpu_env for name in argvs if name.startswith("gpu")})
        if scenario.stream:  # the stand-in offers --benchmark-stream to the GPU workers
            stream_env = dict(envs["gpu0"], FAKE_TUNINGRUNNER_STREAM="1")
            envs.update({name: stream_env for name in argvs if name.startswith("gpu")})
        with workers(argvs, envs, workdir) as procs:
            wait_idle(procs, workdir)
            gpu_pids = [p.pid for name, p in procs if name.startswith("gpu")]
            gpu_cpu0 = gpu_side_cpu(gpu_pids)
            busy0 = common.cpu_busy_s()
            t0 = time.monotonic()
            mlirtuna(env, "jobs", "load", "--session", str(sid), "--tag", TAG)
            longest = plan.longest_call_s(scenario.batch)
            note = drive(db, sid, gpu_log, plan.timeout_for(scenario), longest)
            elapsed = time.monotonic() - t0
            cpu = 100 * (common.cpu_busy_s() - busy0) / (elapsed * (os.cpu_count() or 1))
            gpu_cpu1 = gpu_side_cpu(gpu_pids)
        outcome = measure(db, sid, workdir, plan, scenario)
        outcome.gpu_workers_cpu_s = gpu_cpu1[0] - gpu_cpu0[0]
        outcome.gpu_tools_cpu_s = gpu_cpu1[1] - gpu_cpu0[1]
    finally:
        db.dispose()
    if note and scenario.split and scenario.compile_workers == 0:
        note = f"cannot finish without compile workers ({note})"
    outcome.note, outcome.cpu_busy_pct = note, cpu
    return outcome


# -- measuring ---------------------------------------------------------------------------------
def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of a process itself and of its reaped children (its tool calls)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0, 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    tick = os.sysconf("SC_CLK_TCK")
    return (utime + stime) / tick, (cutime + cstime) / tick


def gpu_side_cpu(pids: Sequence[int]) -> tuple[float, float]:
    """(the GPU workers' own CPU, their tool calls' CPU) in seconds, summed."""
    own_and_tool = [process_cpu_s(pid) for pid in pids]
    return sum(o for o, _ in own_and_tool), sum(t for _, t in own_and_tool)


def epoch(value: dt.datetime | str) -> float:
    """A naive UTC timestamp from the database as seconds since the epoch (as time.time())."""
    stamp = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value)
    return stamp.replace(tzinfo=dt.UTC).timestamp()


def union_within(stretches: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one stretch."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in stretches if b > lo and a < hi)
    total, cur_lo, cur_hi = 0.0, None, None
    for a, b in clipped:
        if cur_hi is None or a > cur_hi:
            total += 0.0 if cur_hi is None else cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    return total + (0.0 if cur_hi is None else cur_hi - cur_lo)


def read_gpu_log(path: Path) -> tuple[dict[int, list[tuple[float, float]]], int]:
    """Busy stretches per GPU id, and the candidates benchmarked in all."""
    stretches: dict[int, list[tuple[float, float]]] = {}
    candidates = 0
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            stretches.setdefault(int(entry["gpu"]), []).append((entry["start"], entry["end"]))
            candidates += int(entry["candidates"])
    return stretches, candidates


def tool_calls(path: Path) -> dict[int, list[float]]:
    """The start times of the tool invocations per GPU id (`--gpus N`; compile-only calls have
    none), --help left out, in order."""
    calls: dict[int, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            argv = json.loads(line)["argv"]
            if "--help" in argv:
                continue
            for i, arg in enumerate(argv):
                value = arg.partition("=")[2] if arg.startswith("--gpus=") else None
                if arg == "--gpus" and i + 1 < len(argv):
                    value = argv[i + 1]
                if value is not None:
                    calls.setdefault(int(value), []).append(float(json.loads(line)["time"]))
    return {g: sorted(starts) for g, starts in calls.items()}


def in_call_gaps(
    starts: Sequence[float], stretches: Sequence[tuple[float, float]], startup_s: float
) -> float:
    """Seconds a slot's calls spent neither starting up nor benchmarking between their first and
    last stretch: from a call's start + start-up to its first stretch, then between stretches."""
    total, call, prev_end = 0.0, -1, 0.0
    for a, b in sorted(stretches):
        owner = max((i for i, t in enumerate(starts) if t <= a), default=-1)
        if owner < 0:
            continue
        if owner != call:
            call, prev_end = owner, starts[owner] + startup_s
        total += max(a - prev_end, 0.0)
        prev_end = max(prev_end, b)
    return total


def stream_gaps(stretches: Sequence[tuple[float, float]]) -> float:
    """Seconds between consecutive benchmarking stretches of one slot."""
    ordered = sorted(stretches)
    return sum(max(b[0] - a[1], 0.0) for a, b in itertools.pairwise(ordered))


def measure(db: Database, sid: int, logs: Path, plan: Plan, scenario: Scenario) -> Outcome:
    with db.session() as s:
        attempts = s.execute(
            sa.select(Attempt.gpu_id, Attempt.claimed_at, Attempt.ended_at)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.session_id == sid, Attempt.ended_at.is_not(None))
        ).all()
        states = dict(
            s.execute(
                sa.select(Job.state, sa.func.count())
                .where(Job.session_id == sid)
                .group_by(Job.state)
            ).all()
        )
    stretches, candidates = read_gpu_log(logs / GPU_LOG)
    out = Outcome(scenario, states.get(COMPLETED, 0), sum(states.values()), candidates=candidates)
    if not attempts:
        return out
    times = [(g, epoch(a), epoch(b)) for g, a, b in attempts]
    lo, hi = min(a for _, a, _ in times), max(b for _, _, b in times)
    out.wall_s = hi - lo
    calls = tool_calls(logs / TOOL_LOG)
    startup = scenario.gpu_startup(plan.costs)
    if scenario.stream:  # one call per slot, started before its window: the gaps between
        # consecutive stretches (the stream's own time per bundle, and any wait for one)
        gaps = sum(stream_gaps(stretches.get(g, [])) for g in calls)
        bundles = sum(max(len(v) - 1, 0) for v in stretches.values())
    else:
        gaps = sum(in_call_gaps(calls.get(g, []), stretches.get(g, []), startup) for g in calls)
        bundles = sum(len(v) for v in stretches.values())
    out.in_call_gap_s = gaps / bundles if bundles else 0.0
    for g in range(plan.gpus):
        held = [(a, b) for gpu, a, b in times if gpu == g]
        out.slots[g] = slot_time(held, stretches.get(g, []), calls.get(g, []), plan, scenario)
    busy_all = sum(union_within(stretches.get(g, []), lo, hi) for g in range(plan.gpus))
    out.farm_share = busy_all / (plan.gpus * out.wall_s) if out.wall_s > 0 else float("nan")
    return out


def slot_time(
    held: list[tuple[float, float]],
    busy: list[tuple[float, float]],
    starts: list[float],
    plan: Plan,
    scenario: Scenario,
) -> SlotTime | None:
    """Where one slot's window went: benchmarking, the tool's own costs (the start-ups of the
    tool calls that began inside the window: a stream started before it costs the window
    nothing), the rest of a job's time (mlirtuna, Python, bundles), and no job held at all."""
    if not held:
        return None
    lo, hi = min(a for a, _ in held), max(b for _, b in held)
    if hi <= lo:
        return None
    calls = sum(1 for t in starts if lo <= t <= hi)
    benchmarking = union_within(busy, lo, hi)
    in_jobs = union_within(held, lo, hi)
    costs = calls * scenario.gpu_startup(plan.costs)
    if not scenario.split:  # one-stage: every benchmarked config was compiled on this slot
        costs += len(busy) * plan.costs.compile_s
    costs = min(costs, max(in_jobs - benchmarking, 0.0))
    return SlotTime(hi - lo, benchmarking, costs, in_jobs, calls)


# -- reporting ---------------------------------------------------------------------------------
def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f} %"


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def result_row(o: Outcome, plan: Plan) -> list[object]:
    slots = [o.slots.get(g) for g in range(plan.gpus)]
    known = [t for t in slots if t is not None]
    rate = o.candidates / o.wall_s if o.wall_s > 0 else float("nan")
    sc = o.scenario
    return [
        sc.label,
        sc.batch,
        sc.compile_workers if sc.split else "-",
        f"{o.jobs_done}/{o.jobs_total}",
        "-" if math.isnan(o.wall_s) else f"{o.wall_s:.1f}",
        *(pct(t.share if t else None) for t in slots),
        pct(mean([t.share for t in known])),
        pct(o.farm_share),
        pct(o.ceiling(plan)),
        "-" if math.isnan(rate) else f"{rate:.0f}",
        o.note,
    ]


def where_row(o: Outcome, plan: Plan) -> list[object]:
    """Where the slots' windows went, mean over slots."""
    known = [t for t in o.slots.values() if t is not None]
    return [
        o.scenario.label,
        pct(mean([t.share for t in known])),
        pct(mean([t.tool_costs / t.window for t in known])),
        pct(mean([t.other_share for t in known])),
        pct(mean([t.between_share for t in known])),
        fmt(mean([t.other_share * t.window / t.calls for t in known if t.calls]), ".2f"),
        fmt(per_call(o.gpu_workers_cpu_s, known), ".2f"),
        fmt(per_call(o.gpu_tools_cpu_s, known), ".2f"),
        f"{o.cpu_busy_pct:.0f} %",
    ]


def per_call(seconds: float, known: Sequence[SlotTime]) -> float | None:
    calls = sum(t.calls for t in known)
    return seconds / calls if calls else None


WHERE_HEADERS = [
    "scenario", "benchmarking", "in a job: tool start-up (+ compile, one-stage)",
    "in a job: the rest (mlirtuna, Python, bundles)", "between jobs (no job held)",
    "the rest per tool call, s", "CPU per tool call: GPU worker, s",
    "CPU per tool call: the tool (stand-in), s", "machine CPU busy",
]  # fmt: skip


def skipped_row(scenario: Scenario, plan: Plan, missing: list[str]) -> list[object]:
    why = f"skipped: needs {', '.join(missing)}: not in this build"
    cw = scenario.compile_workers if scenario.split else "-"
    return [scenario.label, scenario.batch, cw, *["-"] * (plan.gpus + 6), why]


def result_headers(gpus: int) -> list[str]:
    slots = [f"GPU {g} busy" for g in range(gpus)]
    return [
        "scenario", "batch K", "compile workers", "jobs done", "wall s", *slots,
        "mean slot busy", "farm busy", "ceiling", "candidates/s", "note",
    ]  # fmt: skip


def capacity_rows(plan: Plan, scenarios: Sequence[Scenario]) -> list[list[object]]:
    """Two-stage: what N compile workers supply vs what the GPU slots consume, by the costs."""
    c, rows = plan.costs, []
    for sc in scenarios:
        if not sc.split:
            continue
        per_compile = compile_s_per_problem(c, sc)  # a start-up per call of compile_batch
        per_bench = bench_s_per_problem(c, sc)  # start-up amortized over K (stream: none)
        supply = sc.compile_workers / per_compile
        demand = plan.gpus / per_bench
        rows.append(
            [
                sc.label,
                sc.compile_workers,
                f"{supply:.3f}",
                f"{demand:.3f}",
                f"{supply / demand:.2f}",
                math.ceil(plan.gpus * per_compile / per_bench),
                pct(sc.ceiling(c, plan.problems, plan.gpus)),
                workers_for_95(plan, sc),
            ]
        )
    return rows


def compile_s_per_problem(c: Costs, sc: Scenario) -> float:
    """A compile worker's seconds per problem: one start-up per call of `compile_batch`."""
    return c.startup_s / sc.compile_batch + c.compile_s


def bench_s_per_problem(c: Costs, sc: Scenario) -> float:
    """A GPU slot's seconds per problem: its start-up per call of K (none with a stream)."""
    return (0.0 if sc.stream else sc.gpu_startup(c) / sc.batch) + c.bench_s


def workers_for_95(plan: Plan, sc: Scenario) -> str:
    """Compile workers that keep the slots >= 95 % busy, or why no number of them can."""
    c = plan.costs
    if sc.ceiling(c, plan.problems, plan.gpus) < 0.95:
        k_min = math.ceil(19 * sc.gpu_startup(c) / c.bench_s)  # K b / (s + K b) >= 0.95
        return f"none: start-up caps it; needs K >= {k_min}"
    return str(math.ceil(0.95 * plan.gpus * compile_s_per_problem(c, sc) / c.bench_s))


def goal_scenario(plan: Plan, batch: int, compile_batch: int) -> Scenario:
    """Issue 24's goal: two-stage, K, a benchmark stream per GPU slot, compile workers
    batching `compile_batch` problems a call, enough of them for >= 1.2x the GPUs' demand."""
    sc = Scenario("goal", True, batch, stream=True, compile_batch=compile_batch)
    c = plan.costs
    demand = plan.gpus / bench_s_per_problem(c, sc)
    n = math.ceil(GOAL_CAPACITY * demand * compile_s_per_problem(c, sc))
    label = f"two-stage {n} compile (--batch {compile_batch}), benchmark stream"
    return Scenario(label, True, batch, n, stream=True, compile_batch=compile_batch)


def timeline_rows(o: Outcome, plan: Plan) -> list[list[object]]:
    """Per slot: its window and where it went (seconds and shares)."""
    rows: list[list[object]] = []
    for g in range(plan.gpus):
        t = o.slots.get(g)
        if t is None:
            rows.append([f"GPU {g}", *["-"] * 7])
            continue
        rest = t.in_jobs - t.benchmarking - t.tool_costs
        rows.append(
            [
                f"GPU {g}",
                f"{t.window:.2f}",
                f"{t.benchmarking:.2f} ({pct(t.share)})",
                f"{t.tool_costs:.2f} ({pct(t.tool_costs / t.window)})",
                f"{rest:.2f} ({pct(t.other_share)})",
                f"{t.window - t.in_jobs:.2f} ({pct(t.between_share)})",
                t.calls,
                pct(t.share),
            ]
        )
    return rows


TIMELINE_HEADERS = [
    "slot", "window s (first claim to end of last attempt)", "benchmarking s",
    "tool start-up in the window s", "in a job, the rest s (mlirtuna, bundles, replies)",
    "holding no job s", "tool calls started in the window", "busy",
]  # fmt: skip


CAPACITY_HEADERS = [
    "scenario", "compile workers", "compile capacity problems/s", "GPU demand problems/s",
    "capacity/demand", "compile workers to feed the GPUs", "GPU busy ceiling",
    "compile workers for >= 95 %",
]  # fmt: skip


def scenarios(plan: Plan, batch: int, counts: Sequence[str], diagnostic: bool) -> list[Scenario]:
    """a) one-stage, b) batched, c) two-stage per compile worker count ('feed': enough)."""
    chosen = []
    if "one-stage" in plan.kinds:
        chosen.append(Scenario("one-stage", split=False, batch=1))
    if "batched" in plan.kinds:
        chosen.append(Scenario(f"one-stage batched K={batch}", split=False, batch=batch))
    if "two-stage" not in plan.kinds:
        return chosen
    for text in counts:
        n = feed_count(plan, batch, plan.costs.startup_s) if text == "feed" else int(text)
        chosen.append(Scenario(f"two-stage {n} compile", True, batch, compile_workers=n))
    if diagnostic:
        n = feed_count(plan, batch, 0.0)
        label = f"two-stage {n} compile, GPU calls without start-up (diagnostic)"
        chosen.append(Scenario(label, True, batch, compile_workers=n, gpu_startup_s=0.0))
    return chosen


def feed_count(plan: Plan, batch: int, gpu_startup_s: float) -> int:
    """Compile workers that keep the GPU slots fed (the capacity table's number)."""
    c = plan.costs
    per_bench = gpu_startup_s / batch + c.bench_s
    return math.ceil(plan.gpus * (c.startup_s + c.compile_s) / per_bench)


def run_backend(plan: Plan, chosen: Sequence[Scenario]) -> list[Outcome | list[object]]:
    rows: list[Outcome | list[object]] = []
    with common.scratch_db(plan.backend) as url, tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        build = fake_build(tmp)
        env = farm_env(url, build, plan.costs, plan.gpus, tmp)
        flags = cli_flags(env)
        (tmp / "problems.txt").write_text("\n".join(problem_lines(plan.problems)) + "\n")
        mlirtuna(
            env, "import", "--op", "gemm", "--no-expand", "--tag", TAG, str(tmp / "problems.txt")
        )
        for sc in chosen:
            missing = [f for f in sc.needs() if f not in flags]
            if missing:
                rows.append(skipped_row(sc, plan, missing))
                continue
            common.status(f"{plan.backend}: {sc.label} ...")
            outcome = run_scenario(url, tmp, build, plan, sc)
            common.status(
                f"  {outcome.jobs_done}/{outcome.jobs_total} jobs in {outcome.wall_s:.1f} s"
            )
            rows.append(outcome)
    return rows


# -- options -----------------------------------------------------------------------------------
def space_size(space: str) -> int:
    """Candidates per problem in the stand-in's E4 space (what its costs are charged for)."""
    sys.path.insert(0, str(FAKE_BUILD / "bin"))
    from standin_runner import candidates  # the stand-in itself: its spaces are the truth

    return len(candidates.perf_configs("gemm", space, "E4"))


def options():
    p = common.parser(__doc__.split("\n\n")[0])
    p.set_defaults(backends="sqlite")
    p.description += (
        " Default backend: SQLite only, since the share is set by the tool's seconds-long "
        "costs, not by the queue's milliseconds (those are bench_overhead.py's)."
    )
    add = p.add_argument
    add("--problems", type=int, help="gemm problems per scenario (default 32; smoke 4)")
    add("--gpus", type=int, help="GPU slots: GPU worker processes (default 4; smoke 2)")
    add("--space", help="the stand-in's tuning space: quick 8, full 40, greedy 60, "
        "exhaustive 144 candidates (default exhaustive; smoke quick)")  # fmt: skip
    add("--startup-s", type=float, help="tool start-up per invocation, s (default 2)")
    add("--compile-ms", type=float, help="compile per candidate, ms (default 50)")
    add("--bench-ms", type=float, help="benchmark per candidate, ms (default 10)")
    add("--batch", type=int, help="K: jobs per GPU worker's tool call, batched rows (default 8)")
    add("--compile-workers", help="two-stage rows: comma-separated compile worker counts; "
        "'feed' = enough for the costs, '' none (default 0,2,8,feed; smoke 1)")  # fmt: skip
    add("--kinds", default=",".join(KINDS), help="rows to run (default: all three kinds)")
    add("--no-diagnostic", action="store_true", help="leave out the two-stage row whose GPU "
        "calls have no start-up (it tells the start-up's cost from the queue's)")  # fmt: skip
    add("--timeout", type=float, help="seconds per scenario (default: 3x one-stage's + 60)")
    add("--batch-wait", type=float, help="two-stage GPU workers' --batch-wait S (default: "
        "the worker's; 0 with --no-prefetch: the behaviour before issue 24)")  # fmt: skip
    add("--no-prefetch", action="store_true", help="two-stage GPU workers' --no-prefetch")
    add(
        "--goal",
        action="store_true",
        help="issue 24's goal only: two-stage, a benchmark "
        "stream per GPU slot, compile workers for >= 1.2x the GPU demand; the last line is "
        "`goal: mean GPU slot busy NN.N %%` (K=32 variant: --goal --batch 32 --problems 128)",
    )
    add("--compile-batch", type=int, help="--goal: the compile workers' --batch (default 8)")
    return p.parse_args()


def gpu_flags(args) -> tuple[str, ...]:
    flags = () if args.batch_wait is None else ("--batch-wait", str(args.batch_wait))
    return (*flags, "--no-prefetch") if args.no_prefetch else flags


def pick(value, real, smoke, is_smoke: bool):
    return value if value is not None else (smoke if is_smoke else real)


def main() -> None:
    args = options()
    smoke = args.smoke
    space = pick(args.space, "exhaustive", "quick", smoke)
    costs = Costs(
        startup_s=pick(args.startup_s, 2.0, 0.1, smoke),
        compile_ms=pick(args.compile_ms, 50.0, 5.0, smoke),
        bench_ms=pick(args.bench_ms, 10.0, 5.0, smoke),
        candidates=space_size(space),
    )
    batch = pick(args.batch, 8, 2, smoke)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        raise SystemExit(f"--kinds: a subset of {','.join(KINDS)}, not {args.kinds!r}")
    problems, gpus = pick(args.problems, 32, 4, smoke), pick(args.gpus, 4, 2, smoke)
    plans = [
        Plan(b, problems, gpus, space, costs, args.timeout, kinds, gpu_flags(args))
        for b in common.backends(args.backends)
    ]
    counts = pick(args.compile_workers, "0,2,8,feed", "1", smoke).split(",")
    counts = [c.strip() for c in counts if c.strip()]  # "": no two-stage rows
    chosen = scenarios(plans[0], batch, counts, not (smoke or args.no_diagnostic))
    if args.goal:
        compile_batch = pick(args.compile_batch, 8, 2, smoke)
        chosen = [goal_scenario(plans[0], batch, compile_batch)]
    sections = [header(plans, batch)]
    goal_lines = []
    for plan in plans:
        results = run_backend(plan, chosen)
        rows = [r if isinstance(r, list) else result_row(r, plan) for r in results]
        where = [where_row(r, plan) for r in results if isinstance(r, Outcome) and r.slots]
        sections += [
            f"#### {common.LABEL[plan.backend]}",
            common.table(result_headers(plan.gpus), rows),
            "Where each GPU slot's window went (mean over slots):",
            common.table(WHERE_HEADERS, where),
        ]
        for r in results:
            if isinstance(r, Outcome) and r.slots:
                sections += [
                    f"Per-slot timeline, {r.scenario.label}:",
                    common.table(TIMELINE_HEADERS, timeline_rows(r, plan)),
                ]
        if args.goal:
            shares = [t.share for r in results if isinstance(r, Outcome)
                      for t in r.slots.values() if t is not None]  # fmt: skip
            goal_lines.append(
                f"goal: mean GPU slot busy {fmt(100 * (mean(shares) or math.nan), '.1f')} %"
            )
    caps = capacity_rows(plans[0], chosen)
    if caps:
        sections += ["#### Two-stage: compile capacity vs GPU demand (from the costs)",
                     common.table(CAPACITY_HEADERS, caps)]  # fmt: skip
    # --goal: the last line is the goal's number (several backends: one line each, in order).
    common.emit("\n\n".join([*sections, "\n".join(goal_lines)] if goal_lines else sections),
                args.out)  # fmt: skip


def header(plans: Sequence[Plan], batch: int) -> str:
    plan, c = plans[0], plans[0].costs
    load = os.getloadavg()[0]
    return "\n\n".join(
        [
            "### GPU busy share: one-stage, batched, two-stage",
            common.machine_line()
            + " "
            + common.server_versions([p.backend for p in plans])
            + f" Load average at start: {load:.2f}.",
            f"{plan.problems} gemm problems per scenario, tuning space `{plan.space}` "
            f"({c.candidates} candidates each), {plan.gpus} GPU slots (`mlirtuna worker --gpus g`"
            f", one process each), the stand-in tuningRunner in era E4 with start-up "
            f"{c.startup_s:g} s per call, compile {c.compile_ms:g} ms and benchmark "
            f"{c.bench_ms:g} ms per candidate (so {c.compile_s:.2f} s and {c.bench_s:.2f} s per "
            f"problem); batched GPU workers `--batch {batch}"
            f"{''.join(' ' + f for f in plan.gpu_flags)}`. "
            "Costs are sleeps: the CPUs only "
            "pay for mlirtuna, the database and the stand-in's Python start-up.",
            "Slot busy = the union of the slot's benchmarking stretches (GPU log) over its "
            "window, first claim to the end of its last attempt (database clock). Wall = first "
            "claim of any job to the end of the last attempt (two-stage: a compile and a benchmark "
            "job per problem). Farm busy = all benchmarking / "
            "(slots x wall), ramp-up and tail included. Ceiling = the mean slot busy of a farm "
            "that never waits: each slot's even share of the problems in calls of K (the last "
            "one partial: the tail), a start-up per call, the compiles (one-stage) and the "
            "in-call gaps this run measured (the stand-in's own time per bundle between a "
            "call's start-up and its benchmarking stretches). Candidates/s = candidates "
            "benchmarked / wall. Machine CPU busy: all cores, from loading the jobs to the "
            "drained session.",
            "Where the windows went: the tool's start-up (+ compiles, one-stage) is what the "
            "costs charge for the tool calls each slot made (the stand-in's call log); the "
            "rest is the remaining time the slot held a job (mlirtuna's claim, record and "
            "bundle fetch, the stand-in's Python start-up, waiting for a CPU); between jobs = "
            "holding none. CPU per tool call = the CPU time (/proc) of the GPU worker processes, "
            "and apart of their tool calls, over the run / the tool calls: what the "
            "rest would shrink to if the GPU hosts' CPUs were their own (here the compile "
            "workers share the same 2 cores); part of it overlaps the tool's sleeps (rows are "
            "recorded while the next config runs), so it can exceed the rest.",
        ]
    )


if __name__ == "__main__":
    main()
