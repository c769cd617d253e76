"""A tuner plugin outside mlirtuna, as docs/adding-a-tuner.md walks it: registered by the entry
point `toy = toytuner:KIND` (group mlirtuna.tuners) of its dist-info, nothing of mlirtuna edited.

It runs a tool (tool.py, a process of its own) per problem through mlirtuna.tuners.process, so a
worker that loses the job's lease kills the tool (TunerKind.stop_tools, the default). Its perf
configs are `toy:v1:N` (one field, `n`: the dashboard's column); its workers are one per GPU
(`--gpus auto` asks rocminfo).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mlirtuna.errors import TunerError
from mlirtuna.problems import Problem
from mlirtuna.tuners import process
from mlirtuna.tuners.base import Candidate, TuneContext, TuneOutcome
from mlirtuna.tuners.registry import TunerKind, fields_by_layout

TOOL = Path(__file__).with_name("tool.py")
KILL_GRACE_S = 2.0


class ToyTuner:
    name = "toy"

    def tune(self, problem: Problem, ctx: TuneContext) -> TuneOutcome:
        argv = [sys.executable, str(TOOL), problem.canonical(), str(ctx.gpu_id)]
        with tempfile.TemporaryDirectory(prefix="toytuner-") as cwd:
            run = process.run(argv, Path(cwd), process.scrubbed_env(), ctx.timeout_s, KILL_GRACE_S)
        if run.returncode != 0:
            raise TunerError(f"toy tool exited {run.returncode}", detail=run.stderr)
        candidates = []
        for line in run.stdout.splitlines():
            perf_config, _, ns = line.partition("\t")
            candidates.append(Candidate(perf_config, float(ns), problem.flops() / float(ns) / 1e3))
        if not candidates:
            raise TunerError("toy tool printed no candidate", detail=run.stderr)
        winner = min(candidates, key=lambda c: c.kernel_time_ns or 0.0)
        return TuneOutcome(candidates=candidates, winner=winner, output=run.stderr)


KIND = TunerKind(
    name="toy",
    make=lambda _arg, _build_dir: ToyTuner(),
    gpu=True,
    spaces=("quick", "full"),
    perf_prefix="toy",
    perf_fields=fields_by_layout({"toy:v1": ("n",)}),
)
