"""What this machine is: GPUs from rocminfo and which GPU each is (the KFD topology), ROCm
version, a build's rocMLIR commit, docker image, CPU.

Detection never guesses: a value that cannot be read is None, and the caller decides whether
that is acceptable (a rocmlir session refuses to open without arch and CU count).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlirtuna.defaults import ENV_DOCKER_IMAGE, STANDIN_MARKER
from mlirtuna.errors import UserError

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
    """Which GPU this is, as every container of the host would name it (`key`, "" when that
    cannot be told: gpu_identity), and its performance level (auto, determinism, stable_std,
    manual, …; "" when unknown)."""

    key: str = ""
    perf_level: str = ""


@dataclass(frozen=True)
class KfdGpu:
    """A GPU node of the kernel's KFD topology (/sys/class/kfd/kfd/topology/nodes/N)."""

    node: int  # the topology's node number
    unique_id: int  # the GPU's serial (what ROCr's UUID GPU-<16 hex> spells); 0: not reported
    pci: str  # domain:bus:device.function from `domain` and `location_id`
    render_minor: int  # /dev/dri/renderD<minor>


# A sysfs attribute is at most a page; never read more (a planted file could be any size).
SYSFS_READ_MAX = 4096
KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
BOOT_ID = "proc/sys/kernel/random/boot_id"  # the kernel's, per boot: every container reads it
_BOOT_ID_RE = re.compile(r"[0-9a-f-]{32,36}")
# What an operator may name a GPU with (`worker --gpu-identity`): one word, stored in attempt.gpu.
_GPU_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._@/+-]{0,199}")
_UUID_RE = re.compile(r"GPU-([0-9a-f]{1,16})", re.I)


def _sysfs_text(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(SYSFS_READ_MAX).decode("ascii", "replace")
    except OSError:
        return None


def _kfd_properties(text: str) -> dict[str, int]:
    """`name value` lines of a KFD node's `properties` (kfd_topology.c prints every value as a
    decimal integer)."""
    props: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            props[name] = int(value)
    return props


def _pci_address(domain: int, location_id: int) -> str:
    """kfd_topology.c: location_id = pci_dev_id = bus << 8 | devfn, devfn = device << 3 |
    function (a partition's node id OR-ed into it on multi-partition GPUs, so that each
    partition has its own); domain = pci_domain_nr."""
    bus, devfn = (location_id >> 8) & 0xFF, location_id & 0xFF
    return f"{domain & 0xFFFF:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def _kfd_node(node_dir: Path) -> KfdGpu | None:
    """The node's GPU (None: a CPU node, gpu_id 0, or one without compute units)."""
    gpu_id = (_sysfs_text(node_dir / "gpu_id") or "").strip()
    props = _kfd_properties(_sysfs_text(node_dir / "properties") or "")
    if not gpu_id.isdigit() or int(gpu_id) == 0 or props.get("simd_count", 0) == 0:
        return None
    if "location_id" not in props or "drm_render_minor" not in props:
        return None
    pci = _pci_address(props.get("domain", 0), props["location_id"])
    return KfdGpu(int(node_dir.name), props.get("unique_id", 0), pci, props["drm_render_minor"])


def kfd_gpus(root: Path = Path("/")) -> list[KfdGpu] | None:
    """Every GPU node of the KFD topology under `root`, in node order (None: no topology).
    sysfs is the host's, not the container's: every container lists the same nodes."""
    try:
        dirs = [d for d in (root / KFD_NODES).iterdir() if d.name.isdigit()]
    except OSError:
        return None
    found = (_kfd_node(d) for d in sorted(dirs, key=lambda d: int(d.name)))
    return [g for g in found if g is not None]


def _render_node_opens(root: Path, minor: int) -> bool | None:
    """Whether this process can open the GPU's render node, as ROCr's thunk does before it
    counts a GPU (libhsakmt topology_sysfs_check_node_supported): a container given some GPUs
    opens only theirs (ENOENT, EPERM: not this container's GPU). None: another error (EACCES:
    not in the render group; ELOOP: a link where a device node belongs), where the thunk itself
    fails or we will not follow."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(root / "dev" / "dri" / f"renderD{minor}", flags)
    except OSError as exc:
        return False if exc.errno in (errno.ENOENT, errno.EPERM) else None
    os.close(fd)
    return True


def rocr_gpus(root: Path = Path("/")) -> list[KfdGpu] | None:
    """The GPUs ROCr enumerates here before *_VISIBLE_DEVICES (KFD node order, only those whose
    render node this process opens); None when that cannot be told."""
    nodes = kfd_gpus(root)
    if not nodes:
        return None
    opens = [_render_node_opens(root, g.render_minor) for g in nodes]
    if None in opens:
        return None
    return [g for g, ok in zip(nodes, opens, strict=True) if ok]


def _visible(gpus: list[KfdGpu], spec: str) -> list[KfdGpu] | None:
    """ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES: indices into `gpus` or UUIDs (GPU-<hex>
    of the unique id), in the order given. None: an entry names no GPU here."""
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        uuid = _UUID_RE.fullmatch(entry)
        if uuid:
            found = [g for g in gpus if g.unique_id and g.unique_id == int(uuid.group(1), 16)]
        elif entry.isdigit() and int(entry) < len(gpus):
            found = [gpus[int(entry)]]
        else:
            return None
        if len(found) != 1:
            return None
        out += found
    return out


def worker_gpu(
    index: int, root: Path = Path("/"), environ: Mapping[str, str] | None = None
) -> KfdGpu | None:
    """The GPU that `--gpus index` names in this process: the index-th GPU ROCr enumerates,
    after ROCR_VISIBLE_DEVICES then HIP_VISIBLE_DEVICES where set; a worker pinned to one GPU
    (the supervisor sets ROCR_VISIBLE_DEVICES=index) has that one as its device 0."""
    env = os.environ if environ is None else environ
    gpus = rocr_gpus(root)
    pinned = False
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if gpus is not None and env.get(name) is not None:
            gpus, pinned = _visible(gpus, env[name]), True
    if not gpus:
        return None
    if pinned and len(gpus) == 1:
        return gpus[0]
    return gpus[index] if index < len(gpus) else None


def gpu_key(gpu: KfdGpu, nodes: list[KfdGpu], boot_id: str) -> str:
    """The one spelling of a GPU's identity: ROCr's UUID (GPU-<16 hex> of the unique id), which
    no other GPU anywhere has; with the partition's PCI function on a GPU split into several
    (they share the unique id). A GPU without a unique id: its PCI address on this boot of this
    host (the kernel's boot id, the same in every container): bus addresses repeat across hosts."""
    if gpu.unique_id:
        uuid = f"GPU-{gpu.unique_id:016x}"
        shared = sum(1 for n in nodes if n.unique_id == gpu.unique_id) > 1
        return f"{uuid}@{gpu.pci}" if shared else uuid
    return f"pci:{gpu.pci}@{boot_id}" if boot_id else ""


def canonical_gpu_name(name: str) -> str:
    """An operator's name for a GPU (`--gpu-identity`), spelled as gpu_identity spells it (a
    UUID GPU-<hex> as 16 lower-case hex digits); UserError for what cannot be one."""
    text = name.strip()
    if not _GPU_NAME_RE.fullmatch(text):
        raise UserError(
            f"--gpu-identity {name!r}: give one word of letters, digits and : . _ @ / + - "
            "(at most 200), e.g. ROCr's UUID GPU-<hex> from rocminfo"
        )
    uuid = _UUID_RE.fullmatch(text)
    return f"GPU-{int(uuid.group(1), 16):016x}" if uuid else text


def rocm_smi_perf_level(text: str, index: int) -> str:
    """GPU `index`'s performance level from `rocm-smi --showperflevel --json` output
    ({"card0": {"Performance Level": "auto"}}); "" when not reported."""
    try:
        cards = json.loads(text)
    except ValueError:
        return ""
    card = cards.get(f"card{index}") if isinstance(cards, dict) else None
    value = card.get("Performance Level") if isinstance(card, dict) else None
    if not isinstance(value, str) or value.strip().upper() in ("", "N/A"):
        return ""
    return value.strip()[:64]


def _perf_level(gpu: KfdGpu | None, index: int, root: Path) -> str:
    """The GPU's performance level: amdgpu's power_dpm_force_performance_level of its device,
    else what rocm-smi says of card `index`."""
    if gpu is not None:
        device = root / "sys" / "class" / "drm" / f"renderD{gpu.render_minor}" / "device"
        level = (_sysfs_text(device / "power_dpm_force_performance_level") or "").strip()
        if level:
            return level[:64]
    text = _run(["rocm-smi", "--showperflevel", "--json"])
    return rocm_smi_perf_level(text, index) if text else ""


def gpu_identity(
    index: int, root: Path = Path("/"), environ: Mapping[str, str] | None = None
) -> GpuIdentity:
    """The identity of GPU `index` (as --gpus numbers it), from what the kernel shows every
    container of the host alike (the KFD topology, the boot id); key "" when it cannot be
    told. `root` is where /sys, /dev and /proc are (another only in tests)."""
    gpu = worker_gpu(index, root, environ)
    key = ""
    if gpu is not None:
        boot_id = (_sysfs_text(root / BOOT_ID) or "").strip().lower()
        boot_id = boot_id if _BOOT_ID_RE.fullmatch(boot_id) else ""
        key = gpu_key(gpu, kfd_gpus(root) or [], boot_id)
    return GpuIdentity(key, _perf_level(gpu, index, root))


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


# What a build dir says of the source it was built from: CMake's cache, `KEY:TYPE=VALUE` lines.
# The source dir is `<project>_SOURCE_DIR` (project() of rocMLIR's top CMakeLists.txt: `rocMLIR`
# today, `miopen-mlir` in its early years), else CMAKE_HOME_DIRECTORY (the top source dir).
CMAKE_CACHE = "CMakeCache.txt"
CMAKE_CACHE_MAX_BYTES = 8 << 20  # a whole LLVM + rocMLIR cache is well under 1 MiB
ROCMLIR_PROJECTS = ("rocMLIR", "miopen-mlir")
# What makes a source tree rocMLIR's: its tuning script (every era), or its top CMakeLists.txt
# naming one of its projects.
ROCMLIR_TUNING_SCRIPT = "mlir/utils/performance/tuningRunner.py"
_PROJECT_RE = re.compile(r"^\s*project\(\s*(" + "|".join(ROCMLIR_PROJECTS) + r")[\s)]", re.M)
_CACHE_LINE_RE = re.compile(r"^([A-Za-z0-9_.+-]+):[A-Z]+=(.*)$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")  # SHA-1 or SHA-256
_MARKER_COMMIT_RE = re.compile(r"^commit: ([0-9a-f]{40})$", re.M)
MARKER_MAX_BYTES = 16 << 10
# Our own git calls read the checkout they are pointed at, whatever the caller's shell exports.
_GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE")


@dataclass(frozen=True)
class BuildCommit:
    """The rocMLIR commit a build was built from, and where it was read: `git_dir` is the source
    checkout's git directory (the GIT_DIR its tools must be given to report it), None for the
    stand-in (its marker says it); `commit` is "" when it cannot be told, `why` then says why."""

    commit: str
    git_dir: str | None = None
    why: str = ""


def build_commit(build_dir: str | Path) -> BuildCommit:
    """The commit `build_dir` was built from: the git commit of the source dir its CMakeCache.txt
    names, checked to be a rocMLIR checkout of its own; for mlirtuna's stand-in build (no cache)
    the commit its marker states. Never the commit of a git tree the build dir merely lies in
    (a pipeline's repo holding the build): that one says nothing of the compiler."""
    build = Path(build_dir)
    cache = read_cmake_cache(build / CMAKE_CACHE)
    if cache is None:
        if is_standin_build(build):
            commit = standin_commit(build)
            why = "" if commit else f"the stand-in's {STANDIN_MARKER} states no commit"
            return BuildCommit(commit or "", None, why)
        return BuildCommit("", None, f"no readable {CMAKE_CACHE} in it")
    project = cache.get("CMAKE_PROJECT_NAME", "")
    source = cache.get(f"{project}_SOURCE_DIR") or cache.get("CMAKE_HOME_DIRECTORY", "")
    if not source or not os.path.isabs(source):
        return BuildCommit("", None, f"its {CMAKE_CACHE} names no source directory")
    return source_commit(Path(source))


def source_commit(source: Path) -> BuildCommit:
    """The commit of a rocMLIR source checkout: `source` must be rocMLIR's tree and the top of
    a git checkout of its own (a source dir inside another repository is not a rocMLIR
    checkout, whatever that repository's HEAD is)."""
    if not is_rocmlir_source(source):
        return BuildCommit("", None, f"its source {source} is not a rocMLIR checkout")
    found = _git(source, "rev-parse", "--show-toplevel", "--absolute-git-dir", "HEAD")
    lines = found.splitlines() if found else []
    if len(lines) != 3:
        return BuildCommit("", None, f"its source {source} is not a git checkout")
    top, git_dir, commit = lines
    if os.path.realpath(top) != os.path.realpath(source):
        return BuildCommit("", None, f"its source {source} lies in another git tree ({top})")
    if not _COMMIT_RE.fullmatch(commit):
        return BuildCommit("", None, f"its source {source} has no commit")
    return BuildCommit(commit, git_dir)


def is_rocmlir_source(source: Path) -> bool:
    """Whether `source` is rocMLIR's source tree: its tuning script is there (a regular file),
    or its top CMakeLists.txt declares one of rocMLIR's projects."""
    if _regular_file(source / ROCMLIR_TUNING_SCRIPT):
        return True
    top = _read_head(source / "CMakeLists.txt", 64 << 10)
    return top is not None and _PROJECT_RE.search(top) is not None


def read_cmake_cache(path: Path) -> dict[str, str] | None:
    """`KEY -> VALUE` of a CMakeCache.txt (a regular file, not a link, read up to a bound);
    None when there is none or it cannot be read."""
    text = _read_head(path, CMAKE_CACHE_MAX_BYTES)
    if text is None:
        return None
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _CACHE_LINE_RE.match(line)
        if match:
            values.setdefault(match.group(1), match.group(2).strip())
    return values


def standin_commit(build_dir: str | Path) -> str | None:
    """The commit the stand-in build's tools report: the `commit: HEX` line of its marker."""
    text = _read_head(Path(build_dir) / STANDIN_MARKER, MARKER_MAX_BYTES)
    match = _MARKER_COMMIT_RE.search(text) if text else None
    return match.group(1) if match else None


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_head(path: Path, limit: int) -> str | None:
    """At most `limit` bytes of a regular file, opened without following a link; None when
    it is missing, a link, not a regular file or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(limit).decode("utf-8", errors="replace")


def is_standin_build(build_dir: str | Path) -> bool:
    """Whether `build_dir` is mlirtuna's stand-in rocMLIR build (its marker file at the root, a
    regular file, not a link): its numbers are made up, whatever else it claims."""
    return _regular_file(Path(build_dir) / STANDIN_MARKER)


def _git(path: str | Path, *args: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROPPED}
    try:
        proc = subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=env,
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
    # Not platform.processor(): on Linux it runs `uname -p` (a process of its own, in every
    # process that makes a session) to say less than /proc/cpuinfo does.
    model = platform.machine() or "unknown CPU"
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
