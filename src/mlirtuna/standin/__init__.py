"""The stand-in rocMLIR build, shipped with the package: a GPU-less tuningRunner.py (and
rocmlir-gen, rocmlir-driver, …) that speaks the real tool's command line and file formats
(E3 or E4, chosen by FAKE_TUNINGRUNNER_ERA; its modules in rocmlir/bin/standin_runner/), so
that the rocMLIR flow can be tried on any machine (`mlirtuna try-rocmlir`), a pipeline can be
dry-run (examples/Jenkinsfile) and the tests drive the same files (with an overlay of their own,
tests/support/standin_faults: older eras, rocmlirTriton's other E4 line and injected faults,
which the package does not ship; rocmlir/README.md lists what the package's stand-in reads).
Its numbers are made up; what it exercises is mlirtuna's side.

`trial` runs what a person would type: a one-stage `run --tuner rocmlir`, then a two-stage
session (compile worker, then benchmark worker), each as a real `mlirtuna` process."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlirtuna import machine
from mlirtuna.defaults import ENV_ROCMLIR_PYTHON, ENV_TOOL_ENV
from mlirtuna.errors import UserError

BUILD = Path(__file__).parent / "rocmlir"  # bin/tuningRunner.py, bin/rocmlir-gen, below/, …
# What the stand-in reports unless told otherwise (its FAKE_GPU_* and commit defaults).
ARCH_FULL = "gfx942:sramecc+:xnack-"
NUM_CU = 304
NUM_CHIPLETS = 8
COMMIT = machine.standin_commit(BUILD) or ""  # its marker states it (as a build's cache would)
ERA = "E4"  # the newest: two-stage tuning (--compile-only, --benchmark-artifacts)
GEMMS = (
    "-t f32 -out_datatype f32 -transA false -transB false -g 1 -m 256 -n 256 -k 128",
    "-t f16 -out_datatype f16 -transA false -transB true -g 1 -m 512 -n 128 -k 256",
    "-t f16 -out_datatype f16 -transA false -transB false -g 4 -m 128 -n 512 -k 64",
)


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the stand-in needs: its era let through the tool's environment
    allowlist (MLIRTUNA_TOOL_ENV), and this Python to run tuningRunner.py."""
    env = dict(os.environ if base is None else base)
    allowed = [x for x in env.get(ENV_TOOL_ENV, "").split(",") if x.strip()]
    env[ENV_TOOL_ENV] = ",".join(dict.fromkeys([*allowed, "FAKE_*"]))
    for name, value in (("FAKE_TUNINGRUNNER_ERA", ERA), (ENV_ROCMLIR_PYTHON, sys.executable)):
        env[name] = env.get(name) or value  # set and empty counts as unset
    return env


#: Written first into a directory `install` makes: the proof that mlirtuna made it, so that a
#: later install may replace it. It names the directory it was written in (device and inode),
#: so that a marker copied into another directory proves nothing there.
INSTALL_MARKER = ".mlirtuna-try-rocmlir"
#: The database `try-rocmlir` works in unless `--db` is given: a file of the build's own.
TRIAL_DB = "mlirtuna-standin.db"


def install(dest: str | Path) -> Path:
    """The stand-in build copied to `dest` (its tools executable) with a config list of three
    GEMMs at `dest/configs/gemm.txt`. `dest` must not exist, be an empty directory, or be one
    an earlier install made (its INSTALL_MARKER), which is replaced; anything else (a rocMLIR
    build, a link, a file, a directory of someone else's) is refused and left untouched."""
    dest = Path(dest)
    if _made_here(dest):
        _remove(dest)
    elif dest.is_symlink() or dest.exists():
        _check_empty_dir(dest)
    dest.mkdir(mode=0o755, exist_ok=True)
    _write_marker(dest)
    shutil.copytree(
        BUILD, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
    )
    for tool in [*(dest / "bin").iterdir(), *(dest / "below" / "bin").iterdir()]:
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (dest / "configs").mkdir()
    (dest / "configs" / "gemm.txt").write_text("".join(line + "\n" for line in GEMMS))
    return dest


def _identity(info: os.stat_result) -> str:
    return f"{info.st_dev}:{info.st_ino}"


def _write_marker(dest: Path) -> None:
    fd = os.open(dest / INSTALL_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
    with os.fdopen(fd, "w") as marker:
        marker.write(
            f"made by `mlirtuna try-rocmlir` (directory {_identity(os.lstat(dest))}): a later "
            "try-rocmlir may replace this directory\n"
        )


def _made_here(dest: Path) -> bool:
    """Whether `dest` is a directory (not a link) of ours that an install made: its marker a
    regular file of ours (not a link) naming this very directory."""
    try:
        info = os.lstat(dest)
        marker = os.lstat(dest / INSTALL_MARKER)
    except OSError:
        return False
    ours = info.st_uid == marker.st_uid == os.geteuid()
    if not (stat.S_ISDIR(info.st_mode) and stat.S_ISREG(marker.st_mode) and ours):
        return False
    try:
        fd = os.open(dest / INSTALL_MARKER, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            text = f.read(512).decode("utf-8", "replace")  # ours is one short line
    except OSError:
        return False
    return f"(directory {_identity(info)})" in text


def _check_empty_dir(dest: Path) -> None:
    """An existing `dest` that an install did not make: only an empty directory (not a link)
    is used, and nothing in it is ever removed."""
    is_dir = not dest.is_symlink() and dest.is_dir()
    if is_dir and not any(dest.iterdir()):
        return
    what = (
        "a link" if dest.is_symlink()
        else "a rocMLIR build" if (dest / "bin" / "tuningRunner.py").exists()
        else "a directory" if is_dir
        else "a file"
    )  # fmt: skip
    raise UserError(
        f"{dest}: exists ({what}) and was not made by try-rocmlir (its {INSTALL_MARKER} naming "
        "this directory): nothing touched; give a new or empty directory"
    )


def _remove(dest: Path) -> None:
    """An earlier install removed; rmtree opens each level without following links (Linux:
    shutil.rmtree.avoids_symlink_attacks), so a link planted inside is removed, not followed."""
    try:
        shutil.rmtree(dest)
    except OSError as e:
        raise UserError(
            f"{dest}: could not remove the earlier stand-in build ({e.strerror}): remove it, "
            "or give another directory"
        ) from e


def session_flags(build: Path) -> list[str]:
    """What `session new` would detect on a GPU machine with this build, given instead (the
    commit it reads off the build itself, as of a real one)."""
    return [
        "--tuner", "rocmlir", "--mlir-build-dir", str(build), "--arch-full", ARCH_FULL,
        "--num-cu", str(NUM_CU), "--num-chiplets", str(NUM_CHIPLETS), "--tuning-space", "quick",
    ]  # fmt: skip


@dataclass(frozen=True)
class Trial:
    one_stage: int  # the session of `run`
    two_stage: int  # the split session
    results: str  # `mlirtuna results` of both, as printed


def trial(db_url: str, build: Path, say: Callable[[str], None]) -> Trial:
    """A one-stage and a two-stage session on the stand-in build, each step a real `mlirtuna`
    process (what a person types: `say` shows each command line first)."""
    env = environment() | {"MLIRTUNA_DB": db_url}
    configs = str(build / "configs" / "gemm.txt")

    def mlirtuna(*args: str) -> str:
        say("$ mlirtuna " + shlex.join(args))
        done = subprocess.run(
            [sys.executable, "-m", "mlirtuna", *args], env=env, stdout=subprocess.PIPE, text=True
        )
        if done.returncode != 0:
            raise UserError(f"`mlirtuna {args[0]} …` failed (exit {done.returncode}): see above")
        return done.stdout

    run = json.loads(
        mlirtuna(
            "run", "--op", "gemm", "--tuner", "rocmlir", "--mlir-build-dir", str(build),
            "--arch", ARCH_FULL, "--num-cu", str(NUM_CU), "--num-chiplets", str(NUM_CHIPLETS),
            "--tuning-space", "quick", "--gpus", "0", "--json", "-o",
            str(build / "mlir_tuning_one_stage.tsv"), configs,
        )
    )  # fmt: skip
    made = json.loads(
        mlirtuna(
            "session", "new", *session_flags(build), "--split", "compile,benchmark",
            "--name", "two-stage trial", "--json",
        )
    )  # fmt: skip
    sid = str(made["id"])
    mlirtuna("import", "--op", "gemm", "--tag", "trial", configs)
    mlirtuna("jobs", "load", "--session", sid, "--tag", "trial")
    common = ["--session", sid, "--mlir-build-dir", str(build), "--until-empty"]
    mlirtuna("worker", "--role", "compile", *common)
    mlirtuna("worker", "--gpus", "0", *common)
    one = str(run["session"])
    results = mlirtuna("results", "--session", one) + mlirtuna("results", "--session", sid)
    return Trial(int(one), int(sid), results)
