"""--benchmark-stream: a PROPOSED extension of E4 (mlirtuna's docs/formats.md, "Streaming
benchmarks"), offered only by a build with FAKE_TUNINGRUNNER_STREAM=1 (e4.STREAM). One
long-lived process per GPU: after its start-up it reads one JSON request a line from stdin,
  {"id": "17", "op": "gemm", "config": "<config>", "artifacts": "DIR", "output": "FILE"}
benchmarks it exactly as `--op OP --config CONFIG --benchmark-artifacts DIR --output FILE` with
the process's other flags would (FILE, FILE.debug, FILE.state; its log lines, driver lines
included, go to FILE.log instead of stderr), then writes one reply line on stdout,
  {"id": "17", "status": 0, "error": ""}
status: the exit status that call would have had (2: a request it cannot parse). Requests are
benchmarked one at a time, in order; EOF on stdin ends the process (status 0)."""

from __future__ import annotations

import argparse
import json
import sys

from standin_runner import common, e4_bundles, e4_tuning, problems


def serve(args, log: common.Log) -> int:
    gpu = common.Gpu()
    gpu_id = args.gpus[0]
    if not ready(gpu_id, log):
        return 1
    log.info(f"Using 1 GPU(s)\nGPU {gpu_id}: benchmark stream ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        request, rid = None, None
        try:
            request = json.loads(line)
            rid = str(request["id"])
            fields = [str(request[k]) for k in ("op", "config", "artifacts", "output")]
        except (ValueError, KeyError, TypeError) as e:
            reply(rid, 2, f"bad request: {e!r}")
            continue
        answer(args, gpu, gpu_id, rid, *fields)
    return 0


def ready(gpu_id: int, log: common.Log) -> bool:
    """Whether the GPU opened (a test build's faults say no here)."""
    return True


def answer(args, gpu: common.Gpu, gpu_id: int, rid: str, op: str, config: str, artifacts: str,
           output: str) -> None:  # fmt: skip
    """One request benchmarked and replied to; its own failure never ends the stream."""
    try:
        status = stream_one(args, gpu, gpu_id, op, config, artifacts, output)
        error = "" if status == 0 else "see the request's .log"
    except Exception as e:
        status, error = 1, f"{type(e).__name__}: {e}"
    reply(rid, status, error)


def reply(rid, status: int, error: str) -> None:
    print(json.dumps({"id": rid, "status": status, "error": error}), flush=True)


def stream_one(args, gpu: common.Gpu, gpu_id: int, op, config, artifacts, output) -> int:
    one = argparse.Namespace(**vars(args))
    one.op, one.config, one.configs_file = op, config, None
    one.benchmark_artifacts, one.output = artifacts, output
    with open(f"{output}.log", "w") as logfile:
        saved, sys.stderr = sys.stderr, logfile
        try:
            if op not in problems.TUNED_OPS:
                common.Log(False).error(problems.refusal())
                return 1
            request_log = common.Log(args.quiet)
            measure = e4_bundles.bundle_benchmark(one, gpu, gpu_id, request_log)
            if measure is None:
                return 1
            return e4_tuning.tune_all(one, gpu, gpu_id, [config], measure, request_log)
        finally:
            sys.stderr = saved
