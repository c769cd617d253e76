"""The problem page of one tuning with 200,000 candidates: time, answer size and the server's
memory of each call the page makes (issue 43 §3: unpaged, /candidates was 34 MB in 75 s and took
the server from 202 to 482 MB).

Run (from the repository root, alone on the machine):

    python bench/bench_big_tuning.py --backends sqlite --candidates 200000
    python bench/bench_big_tuning.py --backends sqlite --smoke

Each backend gets a scratch database: one gemm problem, one session, one completed job with
--candidates candidates (every third failed). The real `mlirtuna serve` runs in a subprocess;
each URL is asked --repeat times after a warm-up, over HTTP. The server's memory is read from
/proc (VmRSS before the first call and after the last, VmHWM: the peak).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).parent))

import common

from mlirtuna.db import Database
from mlirtuna.db.models import COMPLETED, Candidate, Job, Result

SMOKE_CANDIDATES = 3000


def fill(url: str, n: int) -> tuple[int, int]:
    """(session, problem) of one tuning with `n` candidates."""
    db = Database(url)
    sid = common.make_session(db, 1)
    with db.session() as s:
        job, pid = s.execute(sa.select(Job.id, Job.problem_id).where(Job.session_id == sid)).one()
        for start in range(0, n, 5000):
            batch = range(start, min(start + 5000, n))
            s.execute(sa.insert(Candidate), [candidate(sid, pid, job, i, n) for i in batch])
        s.execute(sa.update(Job).where(Job.id == job).values(state=COMPLETED))
        s.execute(sa.insert(Result).values(session_id=sid, problem_id=pid, job_id=job,
                                           perf_config="cpu:v1:1,1,8", kernel_time=1000.0,
                                           tflops=10.0))  # fmt: skip
    db.dispose()
    return sid, pid


def candidate(sid: int, pid: int, job: int, i: int, n: int) -> dict[str, object]:
    failed = i % 3 == 0
    return {"session_id": sid, "problem_id": pid, "job_id": job,
            "perf_config": f"cpu:v1:{i},{i % 7},8", "perf_family": "cpu",
            "kernel_time": None if failed else 1000.0 + i % 97,
            "tflops": None if failed else 1.0 + (i % 89) / 10 + i / n,
            "error": f"did not compile: error {i % 5}" if failed else None,
            "remeasured": False}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of a process, in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def serve(url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "MLIRTUNA_DB": url}
    argv = [sys.executable, "-m", "mlirtuna", "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(600):  # up to a minute for the server to answer
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/farm", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"mlirtuna serve did not answer: {proc.stderr.read().decode()[-2000:]}")


def bench(backend: str, n: int, repeat: int) -> list[list[object]]:
    rows: list[list[object]] = []
    with common.scratch_db(backend) as url:
        common.status(f"{backend}: {n} candidates")
        sid, pid = fill(url, n)
        port = free_port()
        proc = serve(url, port)
        try:
            before = memory_mb(proc.pid)
            paths = [f"/problems/{pid}?session={sid}",
                     f"/api/problems/{pid}/candidates?session={sid}",
                     f"/api/problems/{pid}/history?session={sid}",
                     f"/api/problems/{pid}/table?session={sid}",
                     f"/api/problems/{pid}/table?session={sid}&sort=kernel_time&desc=false"
                     "&offset=100000"]  # fmt: skip
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
                for path in paths:
                    client.get(path)  # warm-up
                    times, size = [], 0
                    for _ in range(repeat):
                        start = time.perf_counter()
                        res = client.get(path)
                        times.append(time.perf_counter() - start)
                        res.raise_for_status()
                        size = len(res.content)
                    rows.append([backend, path.split("?")[0].replace(str(pid), "P"),
                                 f"{common.median(times) * 1000:.0f}", f"{max(times) * 1000:.0f}",
                                 f"{size / 1000:.1f}"])  # fmt: skip
            after = memory_mb(proc.pid)
            rows.append([backend, "server memory (MB)", f"RSS {before['VmRSS']:.0f} → "
                         f"{after['VmRSS']:.0f}", f"peak {after['VmHWM']:.0f}", ""])  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--candidates", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    n = SMOKE_CANDIDATES if args.smoke else args.candidates
    load = os.getloadavg()
    rows = [r for b in common.backends(args.backends) for r in bench(b, n, args.repeat)]
    text = (
        f"{common.machine_line()}\nload average at the start: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {n} candidates, {args.repeat} runs\n\n"
        + common.table(["backend", "call", "median ms", "slowest ms", "kB"], rows)
    )
    common.emit(text, args.out)


if __name__ == "__main__":
    main()
