"""Issue 43 §2's race, made deterministic by hooks the tests control (none in the package): a
stream worker's leases run out while their jobs sit in its benchmark stream (a server restart
longer than the lease), the worker's next claim sweeps them back and claims them again, and it
feeds them to the same stream a second time, before the stream answered the first attempts.

`LeasesLostInStream(monkeypatch, lose)`: once every job of the session was fed, `lose(ids)`
runs in the worker's own thread between the last feed and the next claim (it makes those
leases expire: a restart of the server, or the lease set back). The heartbeat thread's renewals
wait until every job was fed again, as they would if the claim came first after the restart;
the worker sweeps expired leases at every claim (SWEEP_S 0), as it does every SWEEP_S seconds.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa

import mlirtuna.tuners.rocmlir.stream as rocmlir_stream
import mlirtuna.worker.heartbeat as heartbeat
import mlirtuna.worker.loop as loop
from mlirtuna.db.models import BENCHMARK, Job, Result
from mlirtuna.worker import Worker


class LeasesLostInStream:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, jobs: int, lose: Callable[[], None]):
        self.jobs, self.lose = jobs, lose
        self.fed: collections.Counter[int] = collections.Counter()  # feeds per job id
        self.keys: list[str] = []
        self.renewals = threading.Event()  # set: the heartbeat thread may renew
        self.renewals.set()
        self.lost_once = False
        real_feed, real_renew = rocmlir_stream.Stream.feed, heartbeat.Heartbeat.renew
        race = self

        def feed(stream, key, problem, artifacts):
            real_feed(stream, key, problem, artifacts)
            race.keys.append(key)
            race.fed[int(key.split("-")[1])] += 1
            if not race.lost_once and len(race.fed) == race.jobs:
                race.lost_once = True
                race.renewals.clear()
                race.lose()
            if race.lost_once and all(n >= 2 for n in race.fed.values()):
                race.renewals.set()

        def renew(beat, lease, lost):
            if threading.current_thread().name == "heartbeat":
                race.renewals.wait(120)
            real_renew(beat, lease, lost)

        monkeypatch.setattr(rocmlir_stream.Stream, "feed", feed)
        monkeypatch.setattr(heartbeat.Heartbeat, "renew", renew)
        monkeypatch.setattr(loop, "SWEEP_S", 0.0)

    def release(self) -> None:
        self.renewals.set()


def assert_each_recorded_from_its_second_attempt(db, sid: int, gpu: Worker, race, n: int) -> None:
    """Each job fed twice (two attempts, two keys), the first attempts' replies dropped, the
    second ones' recorded once; no job failed (no timeout: no heartbeat without progress)."""
    with db.session() as s:
        rows = s.execute(
            sa.select(Job.id, Job.state, Job.retries)
            .where(Job.session_id == sid, Job.stage == BENCHMARK)
            .order_by(Job.id)
        ).all()
        results = s.scalar(
            sa.select(sa.func.count()).select_from(Result).where(Result.session_id == sid)
        )
    assert [j.state for j in rows] == ["completed"] * n
    assert [j.retries for j in rows] == [1] * n  # the expired lease's, none from the stream
    assert results == n
    assert race.fed == {j.id: 2 for j in rows} and len(set(race.keys)) == 2 * n
    assert gpu.stats.completed == n and gpu.stats.lost == n and gpu.stats.failed == 0
