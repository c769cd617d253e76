"""The tests' overlay on the package's stand-in tuningRunner.py (see ../README.md): imported by
bin/tuningRunner.py when on its path, it adds the eras and knobs below to the build.

  FAKE_TUNINGRUNNER_ERA=E2 | E2.5: the older eras (e2.py);
  FAKE_TUNINGRUNNER_LOG=path: append {"era", "argv", "cwd", "env", "time", "pid"} as one JSON
    line per invocation (time: when it started, time.time(); env: the visible devices and
    GIT_DIR, and which database secrets it got, as "<set>");
  FAKE_TUNINGRUNNER_STDERR_BYTES=N: first print N bytes of noisy stderr (invalid UTF-8, NUL),
    as a runaway compiler log does;
  FAKE_TUNINGRUNNER_COMMIT: the commit the tool reports instead of its build's;
  FAKE_TUNINGRUNNER_TWO_STAGE=1: E3 also takes E4's --two-stage-topk K;
  FAKE_E25_NUM_CHIPLETS=0: an earlier E2.5 build, without the numChiplets column;
  FAKE_TUNINGRUNNER_E4=lfbo: E4 as the other stored rocmlirTriton line (lfbo.py: the lfbo space,
    --lfbo-effort, --verify-timeout, keys ending -supportsSplitK, Discarded candidates);
  the faults, delays and hanging tools of faults.py (FAKE_TUNINGRUNNER_FAULT, _FAULT_CONFIG,
    _DELAY, _SETSID_CHILD, _TOOL_PIDFILE, _CHILD_PIDFILE, _IGNORE_SIGTERM, _STREAM_FOREIGN);
  the stand-in's bin/rocmlir-gen and bin/rocmlir-tuning-driver, which call install_tool: their
    call log, a driver without --benchmark-config, the key layout before numChiplets (tools.py:
    FAKE_ROCMLIR_TOOLS_LOG, _DRIVER_NO_BENCHMARK_CONFIG, _KEY_LAYOUT; the last one also keys the
    tuningRunner's fusion modules).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

from standin_overlay import e2, faults, lfbo, tools


def install(eras: dict[str, Callable[[list[str]], int]], era: str, argv: list[str]) -> None:
    """Called by bin/tuningRunner.py before it runs `era`: the older eras added to `eras`,
    the invocation logged, the other E4 line and the faults wrapped around the stand-in's
    seams."""
    eras |= {"E2": e2.main, "E2.5": e2.e25_main}
    log_invocation(era, argv)
    if "--help" not in argv:
        spew_stderr(int(os.environ.get("FAKE_TUNINGRUNNER_STDERR_BYTES", "0") or 0))
    if os.environ.get("FAKE_TUNINGRUNNER_E4") == "lfbo":  # a build setting, as the era is
        lfbo.install()
    faults.install(era)
    tools.old_key_layout()


def install_tool(tool: str, argv: list[str], module: ModuleType) -> None:
    """Called by the stand-in's bin/rocmlir-gen and bin/rocmlir-tuning-driver (`module`: the
    tool's own) before they run `argv` (tools.py)."""
    tools.install(tool, argv, module)


def log_invocation(era: str, argv: list[str]) -> None:
    path = os.environ.get("FAKE_TUNINGRUNNER_LOG")
    if not path:
        return
    env = {
        k: os.environ[k]
        for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GIT_DIR")
        if k in os.environ
    }
    secrets = ("MLIRTUNA_DB", "MLIRTUNA_DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD")
    env.update({k: "<set>" for k in secrets if k in os.environ})
    with open(path, "a") as f:
        entry = {"era": era, "argv": argv, "cwd": os.getcwd(), "env": env, "time": time.time(),
                 "pid": os.getpid()}  # fmt: skip
        f.write(json.dumps(entry) + "\n")


def spew_stderr(total: int) -> None:
    """`total` bytes of stderr, 1 MiB at a time: never held whole, as a real runaway log."""
    line = b"warning: \xff\xfe not UTF-8, a NUL \x00 and \xe2\x82 a cut character\n"
    block = line * ((1 << 20) // len(line) + 1)
    while total > 0:
        chunk = block[: min(total, len(block))]
        sys.stderr.buffer.write(chunk)
        total -= len(chunk)
    sys.stderr.buffer.flush()
