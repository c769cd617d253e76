"""The rocmlir tuner: runs rocMLIR's own `bin/tuningRunner.py` on one problem, on one GPU.

One subprocess per job, as an argument list (never a shell: config strings are data), in a new
session so that a timeout kills the whole pipeline it starts (rocmlir-gen | rocmlir-tuning-driver,
verification). Results are read from the files the tool writes into a fresh temporary directory,
never scraped from stdout: the result row (`--output`, read with mlirtuna.formats.tuningdb) and the
per-candidate `.debug` file (`--debug`). A fresh directory also keeps E3 from skipping the config
as "already tuned" (it reads the existing output file) or as failed earlier (its `.state` file).

Two eras of tuningRunner.py are in use and take different flags (reference: rocmlir-interfaces
§1, §5). The era is read once from `--help`:

- E2 (late 2023 to 2025, what MITuna drives): `--tflops` makes it write TFlops; the GPU is
  chosen through the environment. Its `--rocmlir_gen_flags=--device=N` only reaches rocmlir-gen
  (the generated host code, i.e. verification); rocmlir-tuning-driver has no device option and
  benchmarks on HIP device 0. So the worker pins the GPU with ROCR_VISIBLE_DEVICES and we pass
  `--device=0`, the pinned GPU's index inside the process. (MITuna passed `--device=<gpu>`
  without pinning: its tuning loops all ran on GPU 0.) If nothing pins it, we set
  ROCR_VISIBLE_DEVICES=<gpu_id> ourselves, since E2 has no other way to choose the GPU.
- E3 (2026): it ignores ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES (it overwrites them with a
  warning) and takes physical GPU ids (rocm-smi card numbers) in `--gpus`. So we pass
  `--gpus <ctx.gpu_id>`, the physical id the worker was given, not 0: `--gpus 0` would tune on
  card 0 whatever the worker pinned. It also gets a per-config `--timeout` and
  `--abort-on-error` (with one config it only makes failure explicit).

Fusion modules travel in the database: the module is written into the job's temporary directory
under its file name and tuned with `--op fusion --config FILE.mlir` (E3 and later), or, for E2,
which only reads fusion tests from a directory, `--test_dir` naming a directory holding just that
module. The result row is keyed by the module's tuning key.

E2.5 (rocMLIR, late 2025) is driven as E2 (its flags are E2's plus the greedy space); it writes a
`# commit:` line per run and a failed config as a `### ` line, which becomes the job's error.
E4 (rocmlirTriton's "rocmlirTriton tuning runner", parts being ported back to rocMLIR) is driven
as E3, plus the session settings that change its results: `--rep`, `--warmup`,
`--gpu-run-timeout`, `--lfbo-effort`. Its driver's exit status 3 is recorded by the tool as
state `gpu_timed_out` in `<output>.state`: the job's error then says "GPU run timed out". A
candidate the driver printed as `Discarded` is invalid with that reason. E4 writes keys with
`-supportsSplitK`: they are matched to the problem by their plain part (mlirtuna.keys).

Noise (issue 17). Where the tool has E4's `--two-stage-topk` (rocmlirTriton's tuningRunner, and
rocMLIR once PRs #2407/#2464 land), we pass `--two-stage-topk=<session topk>`: it benchmarks every
candidate at a coarse budget, then the K fastest again at the precise budget, and picks the
winner from those; their candidates are recorded as `remeasured`. E2 and E3 have no such flag;
re-running chosen perf configs there would mean rebuilding the rocmlir-gen command line for
`rocmlir-gen --perf_config=X | rocmlir-tuning-driver` (perfRunner's job), which we do not do, so
their winner is the tool's single-pass choice. The `.debug` has each candidate's statistics:
E4's `MeasurementsMs` (every run, ms) become the candidate's median, min, IQR and count, and
with them the winner's margin over the runner-up and its noise; E3's `Stats` (ms) give a median,
min and IQR without a count (the noise unknown), or, for the driver's one-timer legacy shape, a
mean only (debugfile.py). E2 records no spread.

Batches (`worker --batch K`, E3 and E4): `tune_many` tunes several problems of one op in one
call, the configs on stdin (`-c -`), and yields each problem's outcome as its row and `.debug`
rows appear (batch.BatchTail), reading them with the same functions as one call per problem.
Which of a config's candidates E4's driver Discarded is read from that config's own driver lines
in the batch's stderr, never from another config's (batch.driver_segment); each file and stderr
is read once, as it grows (a poll costs what the tool wrote since the last one).

Attention is tuned with `--verify-mode none`, as MITuna and rocMLIR's weekly CI do: there is no
GPU verifier for attention (E3 falls back to a slow CPU reference with relaxed thresholds), and
an E2 verification failure exits 0 having written nothing.

What a build can do is read as capabilities (eras.CAPABILITIES: gpus, batch, timeout,
gpu-run-timeout, two-stage, topk-remeasure, rep-warmup, lfbo, and the spaces listed); the era
names above are labels for them. Two-stage jobs give compile and benchmark calls the same
`--target-*` flags, and a benchmark call never re-measures the top k (E4 ignores
--two-stage-topk there).

The package, one concern a module: eras (era detection and each era's flags), process (running
the tool), debugfile (the `.debug` reader), outcome (what a run wrote -> an outcome or an error),
batch (tune_many's reading of a batch as it runs), artifacts (two-stage compile/benchmark
bundles), fusionkey (a fusion module's tuning key and file), checks (a session against a build),
chosen (chosen perf configs measured through rocmlir-gen and rocmlir-tuning-driver
--benchmark-config, as perfRunner does, and a space listed by rocmlir-gen: a search's rounds and
`list:` sessions, where the build's driver allows it), and tuner (RocmlirTuner, which builds the
command lines).
"""

from __future__ import annotations

from mlirtuna.tuners.process import kill_tools, scrubbed_env
from mlirtuna.tuners.rocmlir.artifacts import (
    check_bundle,
    index_commits,
    merge_artifacts,
    read_index,
)
from mlirtuna.tuners.rocmlir.checks import check_build, check_split_build
from mlirtuna.tuners.rocmlir.debugfile import DebugRow, parse_debug_lines, read_debug_file
from mlirtuna.tuners.rocmlir.eras import (
    E4_SETTINGS,
    Era,
    build_key_form,
    can_split,
    detect_era,
    lacks_split,
    setting_flags,
    tool_space,
)
from mlirtuna.tuners.rocmlir.fusionkey import emit_tuning_key, key_pipeline
from mlirtuna.tuners.rocmlir.outcome import DISCARDED, GPU_TIMED_OUT
from mlirtuna.tuners.rocmlir.tuner import RocmlirTuner

__all__ = [
    "DISCARDED",
    "E4_SETTINGS",
    "GPU_TIMED_OUT",
    "DebugRow",
    "Era",
    "RocmlirTuner",
    "build_key_form",
    "can_split",
    "check_build",
    "check_bundle",
    "check_split_build",
    "detect_era",
    "emit_tuning_key",
    "index_commits",
    "key_pipeline",
    "kill_tools",
    "lacks_split",
    "merge_artifacts",
    "parse_debug_lines",
    "read_debug_file",
    "read_index",
    "scrubbed_env",
    "setting_flags",
    "tool_space",
]
