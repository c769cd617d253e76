"""A worker: claims jobs of one session, runs the tuner on its GPU, records through the fence.

- loop.py: `Worker`, the claim and the outer loop, dispatching each job by its stage;
- runner.py: one job's run and its outcome, `Settled`, recorded or failed;
- batch.py: a claimed batch's run (`--batch K`): one tool call per op, each job settled;
- heartbeat.py: the thread that renews the leases of the jobs being run;
- stages.py: a split session's compile and benchmark stages, on the runner's public API;
- gpulock.py: one worker per GPU on a host (a flock per GPU);
- supervisor.py: local worker processes, one per GPU (`mlirtuna worker --gpus`, `mlirtuna run`),
  each started again when it dies (bounded).

The database's retry policies a worker runs its queue operations under are db/faults.py's.
"""

from mlirtuna.worker import gpulock
from mlirtuna.worker.heartbeat import Heartbeat
from mlirtuna.worker.loop import (
    POLL_MAX_S,
    POLL_MIN_S,
    SWEEP_S,
    Worker,
    check_lease,
    gpu_holder_of,
    role_stage,
    session_tuner,
)
from mlirtuna.worker.runner import (
    DEFAULT_JOB_TIMEOUT_S,
    RELEASE,
    GiveBack,
    JobTimedOut,
    Runner,
    Settled,
    WorkerSettings,
    WorkerStats,
    foreign_perf_config,
)

__all__ = [
    "DEFAULT_JOB_TIMEOUT_S",
    "POLL_MAX_S",
    "POLL_MIN_S",
    "RELEASE",
    "SWEEP_S",
    "GiveBack",
    "Heartbeat",
    "JobTimedOut",
    "Runner",
    "Settled",
    "Worker",
    "WorkerSettings",
    "WorkerStats",
    "check_lease",
    "foreign_perf_config",
    "gpu_holder_of",
    "gpulock",
    "role_stage",
    "session_tuner",
]
