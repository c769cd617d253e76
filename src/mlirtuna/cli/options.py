"""The option blocks more than one command declares, each declared once here.

`run` and `worker` share --workers, --max-retries, --batch, --gpu-identity and --mlir-build-dir;
`run` and `session new` share --mlir-v; `problems import`, `jobs load` and `run` share the
expansion options; listings share --csv. Each function returns a fresh typer.Option, used as a
parameter's default. Only typer is imported: `--help` stays fast (common.py says why).
"""

from __future__ import annotations

import typer

from mlirtuna.defaults import (
    DEFAULT_MAX_RETRIES,
    ENV_GPU_IDENTITY,
    ENV_MAX_RETRIES,
    ENV_ROCMLIR_BUILD,
)


def csv_opt():
    return typer.Option(False, "--csv", help="Print CSV (a header line, then one line a row).")


def mlir_build_dir_opt():
    """--mlir-build-dir, shared by every command that may run or describe rocMLIR."""
    return typer.Option(
        None, "--mlir-build-dir", envvar=ENV_ROCMLIR_BUILD, show_envvar=True,
        help="rocMLIR build dir (holds bin/tuningRunner.py; the commit of the source checkout its "
        "CMakeCache.txt names becomes mlir_v).",
    )  # fmt: skip


def mlir_v_opt():
    """--mlir-v, shared by `session new` and `run` (for the session either opens)."""
    return typer.Option(
        None, "--mlir-v", metavar="HASH",
        help="rocMLIR commit [the build's: the git commit of the source checkout its "
        "CMakeCache.txt names; a build that names none is refused without this].",
    )  # fmt: skip


def gpu_identity_opt():
    """--gpu-identity ID,…, shared by `worker` and `run`."""
    return typer.Option(
        None, "--gpu-identity", envvar=ENV_GPU_IDENTITY, show_envvar=True, metavar="ID,…",
        help="Name each GPU of --gpus (in its order) where mlirtuna cannot tell which GPU it is "
        "from /sys/class/kfd (a container without it): the same ID on every container and "
        "host that sees that GPU, e.g. its Uuid GPU-<hex> from rocminfo. Two workers on one "
        "ID never benchmark at once [default: read from the kernel's KFD topology].",
    )  # fmt: skip


def batch_opt():
    """--batch K, shared by `worker` and `run`."""
    return typer.Option(
        1, "--batch", metavar="K",
        help="Claim up to K jobs at once. rocmlir on E3/E4 builds tunes them in one "
        "tuningRunner.py call (start-up paid once; each job recorded as its row appears); "
        "fusion problems, E2/E2.5 builds take one call per job, other tuners tune a claimed "
        "batch in turn.",
    )  # fmt: skip


def data_type_opt():
    return typer.Option(
        None,
        "--data-type",
        help="Comma-separated rocMLIR types to expand over "
        "(f32,f16,bf16,i8,fp8…) [default: perfRunner's].",
    )


def direction_opt():
    return typer.Option(
        None, "--direction", help="Conv directions to expand over: fwd,bwd,wrw [default: all]."
    )


def layout_opt():
    return typer.Option(
        None, "--layout", help="Conv layouts to expand over: NCHW,NHWC [default: both]."
    )


def no_expand_opt():
    return typer.Option(False, "--no-expand", help="Import each line as written.")


def workers_opt():
    """--workers, shared by `worker` and `run`."""
    return typer.Option(1, "--workers", help="CPU workers (a GPU has one worker, always).")


def max_retries_opt():
    """--max-retries, shared by `worker` and `run`."""
    return typer.Option(
        DEFAULT_MAX_RETRIES, "--max-retries", envvar=ENV_MAX_RETRIES, show_envvar=True,
        help="Failed attempts before a job ends in error.",
    )  # fmt: skip
