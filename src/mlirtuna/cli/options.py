"""The option blocks more than one command declares, each declared once here.

`run` and `worker` share --gpus, --workers, --job-timeout, --max-retries, --batch,
--gpu-identity and --mlir-build-dir; `run` and `session new` share --tuning-space, --arch,
--num-cu, --num-chiplets, --mlir-v, --reason and --name; `problems import`, `jobs load` and
`run` share the expansion options; listings share --csv. Each function returns a fresh
typer.Option, used as a parameter's default. Only typer is imported: `--help` stays fast
(common.py says why). --tuner, --session and --json are each command's own: a new session's
tuner, `run`'s auto, the tuner a worker checks against its session's; the session `run`
resumes or a worker drains (tests/test_cli_help.py holds the list and checks that every other
option `run`, `worker` and `session new` have in common is the same: help, default, type).
"""

from __future__ import annotations

import typer

from mlirtuna.defaults import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TUNING_SPACE,
    ENV_GPU_IDENTITY,
    ENV_MAX_RETRIES,
    ENV_ROCMLIR_BUILD,
    TUNING_SPACES,
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


def gpus_opt():
    """--gpus, shared by `worker` and `run`."""
    return typer.Option(
        "auto", "--gpus",
        help="auto (every GPU rocminfo lists; one CPU worker where there is none) or 0,1,…: "
        "one worker process each.",
    )  # fmt: skip


def job_timeout_opt():
    """--job-timeout, shared by `worker` and `run`."""
    return typer.Option(
        None, "--job-timeout", metavar="SECONDS",
        help="Stop a tuner after this many seconds (the job is retried) [default: by tuning "
        "space: quick 1 h, full/greedy 4 h, exhaustive 24 h].",
    )  # fmt: skip


def tuning_space_opt():
    """--tuning-space, shared by `session new` and `run` (for the session either opens)."""
    built_in, with_build = TUNING_SPACES[:4], TUNING_SPACES[4:]
    return typer.Option(
        DEFAULT_TUNING_SPACE, "--tuning-space",
        help=f"{', '.join(built_in)}; {' or '.join(with_build)} if the build's tuningRunner has "
        "them; list:NAME for a stored quick list.",
    )  # fmt: skip


def arch_opt():
    """--arch, shared by `session new` and `run`."""
    return typer.Option(
        None, "--arch", help="GPU chip name, e.g. gfx942 (a cpu session's is its CPU's) [detected]."
    )


def num_cu_opt():
    """--num-cu, shared by `session new` and `run`."""
    return typer.Option(None, "--num-cu", help="Compute units [detected].")


def num_chiplets_opt():
    """--num-chiplets, shared by `session new` and `run`."""
    return typer.Option(None, "--num-chiplets", help="Chiplets (XCDs) [detected].")


def reason_opt():
    """--reason, shared by `session new` and `run`."""
    return typer.Option("", "--reason", help="Why this tuning is run.")


def name_opt():
    """--name, shared by `session new` and `run`."""
    return typer.Option(
        "", "--name",
        help="A name to tell the session apart (session list, the dashboard); without it, "
        "`run` names its session OP: FILES.",
    )  # fmt: skip


def search_opt():
    """--search NAME, shared by `session new` and `run` (for the session either opens)."""
    return typer.Option(
        None, "--search", metavar="NAME",
        help="Choose each job's candidates with this search strategy (mlirtuna.search: "
        "random, exhaustive, and what the registry holds), measured in rounds up to --budget "
        "[default: none, the tuning space's every candidate].",
    )  # fmt: skip


def budget_opt():
    """--budget N, shared by `session new` and `run`: goes with --search."""
    return typer.Option(
        None, "--budget", metavar="N",
        help="With --search: the most candidates measured per job (required with it).",
    )  # fmt: skip
