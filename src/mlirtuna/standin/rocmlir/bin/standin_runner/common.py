"""What every era of the stand-in shares: the GPU it reports, its log lines, the config list,
the output, `.debug` and `.state` files, and the build's commit."""

from __future__ import annotations

import json
import os
import sys

E3_OPS = ["conv", "gemm", "fusion", "attention", "gemm_gemm", "conv_gemm"]
E3_SPACES = ["quick", "full", "greedy", "exhaustive"]
VERIFY_MODES = ["none", "cpu", "gpu"]
E3_TYPES = ["f32", "f16", "bf16", "i8", "i8_i32", "i8_i8", "fp8", "fp8_f32", "fp8_fp8", "f4E2M1FN"]
V3_HEADER = (
    "# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace\tcommitId"
    "\ttimestamp\tdurationSec"
)


class Gpu:
    """The GPU the tool finds (FAKE_GPU_ARCH, FAKE_GPU_NUM_CU, FAKE_GPU_NUM_CHIPLETS)."""

    def __init__(self) -> None:
        self.arch = os.environ.get("FAKE_GPU_ARCH", "gfx942:sramecc+:xnack-")
        self.num_cu = int(os.environ.get("FAKE_GPU_NUM_CU", "304"))
        self.num_chiplets = int(os.environ.get("FAKE_GPU_NUM_CHIPLETS", "8"))
        self.chip = self.arch.split(":")[0]


def available_gpus() -> list[int]:
    """The GPU ids --gpus accepts (FAKE_GPU_COUNT, default 8)."""
    return list(range(int(os.environ.get("FAKE_GPU_COUNT", "8"))))


class Log:
    """E3's and E4's logging: "LEVEL: message", continuation lines indented."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def _emit(self, level: str, msg: str) -> None:
        lines = msg.splitlines() or [""]
        print(
            "{}: {}".format(level, "\n".join([lines[0]] + ["    " + x for x in lines[1:]])),
            file=sys.stderr,
        )

    def info(self, msg: str) -> None:
        if not self.quiet:
            self._emit("INFO", msg)

    def warning(self, msg: str) -> None:
        if not self.quiet:
            self._emit("WARNING", msg)

    def error(self, msg: str) -> None:
        self._emit("ERROR", msg)


def read_configs_file(path: str) -> list[str]:
    if path == "-":
        lines = [line.strip() for line in sys.stdin]
    else:
        with open(path) as f:
            lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("#")]


def open_output(path: str):
    return sys.stdout if path == "-" else open(path, "a")


def debug_cell(value) -> str:
    """A value as pandas' to_csv writes it (NaN and None empty, lists as their repr)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def append_debug(path: str, entries: list[dict]) -> None:
    """`<output>.debug` appended, its header written once (E3, E4)."""
    columns = list(entries[0].keys())
    write_header = not (os.path.exists(path) and os.path.getsize(path) > 0)
    with open(path, "a") as f:
        if write_header:
            f.write("\t".join(columns) + "\n")
        for e in entries:
            f.write("\t".join(debug_cell(e[c]) for c in columns) + "\n")


def write_state(output: str, context: str, failed: dict) -> None:
    """`<output>.state`: the failed configs of this context merged into the file's."""
    if output == "-":
        return
    path = output + ".state"
    data: dict = {"contexts": {}}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data["contexts"].setdefault(context, {}).update(failed)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def usage_error(message: str) -> int:
    """What argparse prints for a usage error (status 2)."""
    print(f"usage: rocmlirTriton tuning runner\nerror: {message}", file=sys.stderr)
    return 2


def marker_commit() -> str:
    """The commit the build's MLIRTUNA_STANDIN.md states (where a real tuningRunner asks git of
    its checkout; mlirtuna reads the same line at `session new`)."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    try:
        with open(os.path.join(build, "MLIRTUNA_STANDIN.md")) as f:
            text = f.read(16384)
    except OSError:
        return "unknown"  # what E3 writes when git cannot say
    for line in text.splitlines():
        if line.startswith("commit: "):
            return line.split()[1]
    return "unknown"  # what E3 writes when git cannot say


MARKER_COMMIT = marker_commit()


def commit_id() -> str:
    """The commit the tool reports in its rows and bundles."""
    return MARKER_COMMIT
