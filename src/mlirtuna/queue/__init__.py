"""The job queue: the job table itself, made safe for any number of workers on any machines.

Four operations, each one short transaction (docs/architecture.md explains why they are safe):
- claim (claim.py): the next `new` job of a session, or up to K of them (claim_many);
- heartbeat, record / complete / fail / release, reclaim_expired (settle.py): fenced writes,
  applied only while the job still carries this worker's lease token; record_and_claim records
  a job and claims the next in one transaction (one durable commit per job);
- the statements behind them are built once per backend (sql.py).
Jobs as people manage them (load, list, requeue, cancel, wait) are in jobs.py; a two-stage job's
bundle in bundles.py; waking idle workers (PostgreSQL LISTEN) in wakeup.py.

Callers use the package: `queue.claim(...)`, `queue.record(...)` (tests replace those names
here, and the worker looks them up here on every call).
"""

from mlirtuna.queue.claim import (
    Claimant,
    GpuHolder,
    Lease,
    NextClaim,
    claim,
    claim_many,
    claimed_with,
    claimed_with_any,
    gpu_holder,
    new_token,
)
from mlirtuna.queue.settle import (
    MAX_BACKOFF_S,
    AlsoInTransaction,
    complete,
    fail,
    heartbeat,
    reclaim_expired,
    record,
    record_and_claim,
    record_steps,
    release,
    steps,
    take_back,
)

__all__ = [
    "MAX_BACKOFF_S",
    "AlsoInTransaction",
    "Claimant",
    "GpuHolder",
    "Lease",
    "NextClaim",
    "claim",
    "claim_many",
    "claimed_with",
    "claimed_with_any",
    "complete",
    "fail",
    "gpu_holder",
    "heartbeat",
    "new_token",
    "reclaim_expired",
    "record",
    "record_and_claim",
    "record_steps",
    "release",
    "steps",
    "take_back",
]
