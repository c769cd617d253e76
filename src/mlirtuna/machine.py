"""What this machine is: GPUs from rocminfo, ROCm version, rocMLIR commit, docker image, CPU.

Detection never guesses: a value that cannot be read is None, and the caller decides whether
that is acceptable (a rocmlir session refuses to open without arch and CU count).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlirtuna.defaults import ENV_DOCKER_IMAGE, STANDIN_MARKER

ROCM_PATH = Path(os.environ.get("ROCM_PATH", "/opt/rocm"))


# Chips built in workgroup-processor (WGP) mode: RDNA, wave size 32. rocMLIR's perfRunner
# (chip_uses_wgp_mode: the arch's wave size is 32) counts CUs as HIP does, one per two-CU WGP.
WGP_MODE_PREFIXES = ("gfx10", "gfx11", "gfx12")


@dataclass(frozen=True)
class Gpu:
    index: int  # position among GPU agents, as ROCR_VISIBLE_DEVICES counts them
    arch: str  # gfx942
    arch_full: str  # gfx942:sramecc+:xnack-
    num_cu: int  # as HIP and rocMLIR's tools count them (tool_num_cu), not rocminfo
    rocminfo_cu: int = 0  # what rocminfo prints (twice num_cu on a WGP-mode chip)


def wgp_mode(arch: str) -> bool:
    """Whether the chip runs in WGP mode (wave size 32: gfx10, gfx11, gfx12)."""
    return arch.split(":")[0].startswith(WGP_MODE_PREFIXES)


def tool_num_cu(arch: str, rocminfo_cu: int) -> int:
    """The CU count tuningRunner and perfRunner use (HIP's multiProcessorCount, AmdArchDb's
    min_num_cu) for a GPU rocminfo says has `rocminfo_cu`: half of it on a WGP-mode chip."""
    return rocminfo_cu // 2 if wgp_mode(arch) else rocminfo_cu


def same_num_cu(arch: str, recorded: int, current: int) -> bool:
    """Whether a CU count recorded by the tool or a session names the GPU counted `current`:
    the same count, or on a WGP-mode chip the physical (rocminfo) count, twice HIP's, which
    tuningRunner itself still accepts (matches_current_num_cu) and earlier sessions stored."""
    if recorded == current:
        return True
    return wgp_mode(arch) and (recorded == 2 * current or 2 * recorded == current)


def machine_name() -> str:
    return socket.gethostname()


def _run(argv: list[str], timeout: float = 20.0) -> str | None:
    exe = shutil.which(argv[0]) or (
        str(ROCM_PATH / "bin" / argv[0]) if (ROCM_PATH / "bin" / argv[0]).exists() else None
    )
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from `rocminfo` output, in order (CPU agents are skipped); their CU count as
    the tools see it (tool_num_cu)."""
    gpus: list[Gpu] = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        if not re.search(r"Device Type:\s*GPU", block):
            continue
        name = re.search(r"^\s*Name:\s*(gfx\w+)", block, re.M)
        cus = re.search(r"Compute Unit:\s*(\d+)", block)
        isa = re.search(r"amdgcn-amd-amdhsa--(gfx[\w:+\-]+)", block)
        if name and cus:
            arch_full = isa.group(1) if isa else name.group(1)
            physical = int(cus.group(1))
            chip = name.group(1)
            gpus.append(Gpu(len(gpus), chip, arch_full, tool_num_cu(chip, physical), physical))
    return gpus


@dataclass(frozen=True)
class GpuIdentity:
    """What rocm-smi says of one GPU: its unique id (else its PCI bus id; "" when neither is
    reported) and its performance level (auto, determinism, stable_std, manual, …; "")."""

    uid: str = ""
    perf_level: str = ""


def parse_rocm_smi(text: str, index: int) -> GpuIdentity:
    """GPU `index` from `rocm-smi --showuniqueid --showbus --showperflevel --json` output
    ({"card0": {"Unique ID": "0x…", "PCI Bus": "0000:03:00.0", "Performance Level": "auto"}})."""
    try:
        cards = json.loads(text)
    except ValueError:
        return GpuIdentity()
    card = cards.get(f"card{index}") if isinstance(cards, dict) else None
    if not isinstance(card, dict):
        return GpuIdentity()

    def field(name: str) -> str:
        value = card.get(name)
        if not isinstance(value, str) or value.strip().upper() in ("", "N/A"):
            return ""
        return value.strip()[:64]

    unique, bus = field("Unique ID"), field("PCI Bus")
    uid = f"uid:{unique}" if unique else f"pci:{bus}" if bus else ""
    return GpuIdentity(uid, field("Performance Level"))


def gpu_identity(index: int) -> GpuIdentity:
    """The identity of GPU `index` (as --gpus numbers it) where rocm-smi is installed."""
    text = _run(["rocm-smi", "--showuniqueid", "--showbus", "--showperflevel", "--json"])
    return parse_rocm_smi(text, index) if text else GpuIdentity()


def gpus() -> list[Gpu]:
    """Every GPU rocminfo lists; [] on a machine without ROCm or GPUs."""
    text = _run(["rocminfo"])
    return parse_rocminfo(text) if text else []


def num_chiplets(arch: str) -> int | None:
    """XCDs per GPU where the tools expose it (amd-smi), else None."""
    text = _run(["amd-smi", "static", "--partition", "--json"]) or ""
    match = re.search(r'"(?:num_xcd|xcd_count)"\s*:\s*(\d+)', text)
    return int(match.group(1)) if match else None


def rocm_version() -> str | None:
    path = ROCM_PATH / ".info" / "version"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def git_hash(path: str | Path) -> str | None:
    """The commit of the git checkout holding `path` (a build dir sits inside its source)."""
    return _git(path, "rev-parse", "HEAD")


def is_standin_build(build_dir: str | Path) -> bool:
    """Whether `build_dir` is mlirtuna's stand-in rocMLIR build (its marker file at the root, a
    regular file, not a link): its numbers are made up, whatever else it claims."""
    try:
        return stat.S_ISREG(os.lstat(Path(build_dir) / STANDIN_MARKER).st_mode)
    except OSError:
        return False


def git_dir(path: str | Path) -> str | None:
    """The git directory of the checkout holding `path` (for a tool run elsewhere that asks
    git for its commit), or None outside a checkout."""
    return _git(path, "rev-parse", "--absolute-git-dir")


def _git(path: str | Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def docker_image() -> str | None:
    """The image name where the environment says (CI usually exports one of these)."""
    for var in (ENV_DOCKER_IMAGE, "DOCKER_IMAGE", "CONTAINER_IMAGE"):
        if os.environ.get(var):
            return os.environ[var]
    return None


def cpu_description() -> str:
    """e.g. 'AMD EPYC 7763 64-Core Processor, 2 cores' (what a cpu session was tuned on)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count() or 1} cores"


def platform_machine() -> str:
    return platform.machine() or "unknown"


# -- temporary directories named for their owner --------------------------------------------------
# A worker's temp dirs carry its pid and the process's start time (Linux /proc, clock ticks since
# boot): `mlirtuna-KIND-PID.START-xxxxxxxx`. A SIGKILLed worker cannot remove its own; the next
# worker on the host sweeps those whose owner is gone (a pid reused since has another start time).
TEMP_KINDS = ("benchmark", "compile", "rocmlir", "stream")
_TEMP_RE = re.compile(
    r"mlirtuna-(?:benchmark|compile|rocmlir|stream)-([0-9]{1,10})\.([0-9]{1,20})-[A-Za-z0-9_]+"
)


def _start_time(pid: int) -> str | None:
    """A process's start time from /proc (field 22 of stat), None when it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def temp_owner(pid: int | None = None) -> str:
    """`PID.START` of this (or that) process: what a temp dir's name records."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}.{_start_time(pid) or 0}"


def temp_prefix(kind: str) -> str:
    """The prefix of a temp dir of this process, for mkdtemp / TemporaryDirectory."""
    assert kind in TEMP_KINDS
    return f"mlirtuna-{kind}-{temp_owner()}-"


def make_temp_dir(kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=temp_prefix(kind)))


def _owner_alive(pid: int, start: str) -> bool:
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now is not None and (start == "0" or now == start)
    try:  # no /proc: the pid alone (a reused pid keeps the dir, the safe side)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_temp(root: str | Path | None = None) -> list[Path]:
    """Remove this host's mlirtuna temp dirs whose owner process is gone; the removed ones.
    Only directories (never a link) named by temp_prefix and owned by this user are candidates;
    a live owner's dir, or one of the old unnamed form, is never touched."""
    root = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = _TEMP_RE.fullmatch(entry.name)
        if not match:
            continue
        try:
            if (
                not entry.is_dir(follow_symlinks=False)
                or entry.stat(follow_symlinks=False).st_uid != os.getuid()
            ):
                continue
        except OSError:
            continue
        if _owner_alive(int(match.group(1)), match.group(2)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed
