"""The same GPU seen from two containers is one GPU (issue 42 §1): a GPU worker keys its claims
by what the kernel shows every container of the host alike (the KFD topology under /sys, the
boot id), not by rocm-smi's spelling or the container's host name; a GPU worker that cannot
tell which GPU it has refuses to benchmark (one line, exit 2) unless the operator names it
(`--gpu-identity`); a stand-in worker touches no GPU and needs no identity.

A container here is a directory standing for its `/`: the host's sysfs and boot id (the same
in every container), its own /dev/dri (the render nodes it was given) and its own rocm-smi."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.clitools import cli
from support.gpuspans import Timed, overlaps
from support.workers import job_states, make_session

from mlirtuna import catalog, machine, sessions
from mlirtuna.db.models import Attempt, Job, TuningSession
from mlirtuna.defaults import STANDIN_MARKER
from mlirtuna.errors import UserError
from mlirtuna.problems import ExpandOptions
from mlirtuna.queue import jobs
from mlirtuna.sessions import SessionSpec
from mlirtuna.worker import Worker, WorkerSettings, supervisor
from mlirtuna.worker.supervisor import Slot

BOOT_ID = "5d0f3c1e-8a55-4b6e-9f1d-2f0c7a9e4b21"
UID_A, UID_B = 0x18F68E602B8A790F, 0x2E1D0C3B4A596877  # two MI300X serials
# (unique id, PCI domain, location_id = bus << 8 | device << 3 | function, render minor)
HOST = [(UID_A, 0, 0x0500, 128), (UID_B, 0, 0x2600, 136)]
KFD_ON_THIS_HOST = Path("/sys/class/kfd/kfd/topology/nodes").exists()
REAL_IDENTITY = machine.gpu_identity  # as tests that stand in for it call it


def node_properties(unique_id: int, domain: int, location_id: int, minor: int) -> str:
    """A GPU node's `properties` as kfd_topology.c prints them (a subset, in its order)."""
    return (
        f"cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\ncaches_count 490\n"
        f"io_links_count 1\np2p_links_count 7\ncpu_core_id_base 0\nsimd_id_base 2147487744\n"
        f"max_waves_per_simd 8\nlds_size_in_kb 64\ngfx_target_version 90402\n"
        f"vendor_id 4098\ndevice_id 29857\nlocation_id {location_id}\ndomain {domain}\n"
        f"drm_render_minor {minor}\nhive_id 0\nnum_sdma_engines 2\n"
        f"local_mem_size 0\nfw_version 178\ncapability 1012712064\nunique_id {unique_id}\n"
        f"num_xcc 8\nmax_engine_clk_ccompute 3700\n"
    )


def container(
    root: Path,
    gpus: list[tuple[int, int, int, int]],
    given: list[int],
    rocm_smi: dict | None = None,
    boot_id: str = BOOT_ID,
) -> Path:
    """A container's `/`: the host's KFD topology (a CPU node 0, then `gpus`), the render
    nodes it was given (`given` minors), the host's boot id, and its rocm-smi (None: none)."""
    nodes = root / machine.KFD_NODES
    cpu = nodes / "0"
    cpu.mkdir(parents=True)
    (cpu / "gpu_id").write_text("0\n")
    (cpu / "properties").write_text("cpu_cores_count 96\nsimd_count 0\nlocation_id 0\n")
    for n, gpu in enumerate(gpus, start=1):
        node = nodes / str(n)
        node.mkdir()
        (node / "gpu_id").write_text(f"{40000 + n}\n")
        (node / "properties").write_text(node_properties(*gpu))
        device = root / "sys/class/drm" / f"renderD{gpu[3]}" / "device"
        device.mkdir(parents=True)
        (device / "power_dpm_force_performance_level").write_text("determinism\n")
    dri = root / "dev/dri"
    dri.mkdir(parents=True)
    for minor in given:
        (dri / f"renderD{minor}").write_bytes(b"")
    boot = root / machine.BOOT_ID
    boot.parent.mkdir(parents=True)
    boot.write_text(boot_id + "\n")
    if rocm_smi is not None:
        tool = root / "bin/rocm-smi"
        tool.parent.mkdir()
        tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(rocm_smi)}\nEOF\n")
        tool.chmod(0o755)
    return root


def identity_in(
    root: Path, index: int, monkeypatch: pytest.MonkeyPatch, **environ: str
) -> machine.GpuIdentity:
    """machine.gpu_identity(index) as a worker in that container computes it (its rocm-smi,
    if any, first on PATH)."""
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}/usr/bin:/bin")
    return machine.gpu_identity(index, root, environ)


LOWER = "0x2e1d0c3b4a596877"  # rocm-smi's spelling of UID_B in one container


def smi(card: str, unique_id: str) -> dict:
    """What a container's `rocm-smi --showuniqueid --showbus --showperflevel --json` prints."""
    return {card: {"Unique ID": unique_id, "PCI Bus": "0000:26:00.0", "Performance Level": "auto"}}


def test_two_containers_name_one_gpu_alike(tmp_path, monkeypatch):
    """The GPU at 0000:26:00.0 is `--gpus 1` in a container given every GPU (its rocm-smi
    spells the unique id 0x…, lower case) and `--gpus 0` in one given only it (its rocm-smi
    spells it upper case without 0x; a third has no rocm-smi, a fourth is pinned by UUID):
    one key in all, ROCr's UUID; the other GPU has another."""
    every = container(tmp_path / "a", HOST, [128, 136], smi("card1", LOWER))
    only = container(tmp_path / "b", HOST, [136], smi("card0", "2E1D0C3B4A596877"))
    bare = container(tmp_path / "c", HOST, [136])
    a = identity_in(every, 1, monkeypatch)
    b = identity_in(only, 0, monkeypatch)
    c = identity_in(bare, 0, monkeypatch)
    uuid = identity_in(every, 0, monkeypatch, ROCR_VISIBLE_DEVICES="GPU-2E1D0C3B4A596877")
    assert a == b == c == uuid == machine.GpuIdentity("GPU-2e1d0c3b4a596877", "determinism")
    assert identity_in(every, 0, monkeypatch).key == "GPU-18f68e602b8a790f"


def test_a_worker_pinned_by_the_supervisor_names_its_gpu(tmp_path, monkeypatch):
    """The supervisor pins worker N with ROCR_VISIBLE_DEVICES=N: the GPU is its device 0, and
    the key is still GPU N's; an index or pin naming no GPU here tells nothing."""
    every = container(tmp_path / "a", HOST, [128, 136])
    assert identity_in(every, 1, monkeypatch, ROCR_VISIBLE_DEVICES="1").key == f"GPU-{UID_B:016x}"
    both = identity_in(every, 1, monkeypatch, ROCR_VISIBLE_DEVICES="0,1")
    assert both.key == f"GPU-{UID_B:016x}"
    assert identity_in(every, 0, monkeypatch, ROCR_VISIBLE_DEVICES="7").key == ""
    assert identity_in(every, 2, monkeypatch).key == ""
    unknown = identity_in(every, 0, monkeypatch, ROCR_VISIBLE_DEVICES="GPU-00000000000000aa")
    assert unknown.key == ""


def test_a_gpu_without_a_unique_id_is_its_pci_address_on_this_boot(tmp_path, monkeypatch):
    """No unique id (0): the PCI address from domain and location_id, with the kernel's boot
    id: the same in both containers, another on another host at the same bus address."""
    plain = [(0, 1, 0x0308, 128), (0, 1, 0x2600, 129)]
    a = container(tmp_path / "a", plain, [128, 129])
    b = container(tmp_path / "b", plain, [128])
    other_host = container(tmp_path / "c", plain, [128], boot_id=BOOT_ID.replace("5d0f", "77aa"))
    key = f"pci:0001:03:01.0@{BOOT_ID}"
    assert identity_in(a, 0, monkeypatch).key == identity_in(b, 0, monkeypatch).key == key
    assert identity_in(other_host, 0, monkeypatch).key not in ("", key)
    assert identity_in(a, 1, monkeypatch).key == f"pci:0001:26:00.0@{BOOT_ID}"


def test_partitions_of_one_gpu_are_each_their_own(tmp_path, monkeypatch):
    """A GPU split into partitions (CPX) shows one KFD node each, with the one unique id and
    the partition's node id OR-ed into location_id: each partition keys apart."""
    parts = [(UID_A, 0, 0x0500 | n, 128 + n) for n in range(2)]
    root = container(tmp_path / "a", parts, [128, 129])
    keys = [identity_in(root, n, monkeypatch).key for n in range(2)]
    assert keys == [f"GPU-{UID_A:016x}@0000:05:00.0", f"GPU-{UID_A:016x}@0000:05:00.1"]


def test_no_topology_no_render_node_tells_nothing(tmp_path, monkeypatch):
    """No KFD topology, a GPU node whose render node this container lacks (or has as a link):
    no key (the worker refuses); a huge planted file is not read past a page."""
    assert identity_in(tmp_path / "empty", 0, monkeypatch).key == ""
    lacking = container(tmp_path / "a", HOST, [])
    assert identity_in(lacking, 0, monkeypatch).key == ""
    (lacking / "dev/dri/renderD128").symlink_to(tmp_path / "elsewhere")  # never followed
    (tmp_path / "elsewhere").write_bytes(b"")
    assert identity_in(lacking, 0, monkeypatch).key == ""
    huge = container(tmp_path / "b", HOST, [128])
    planted = huge / machine.KFD_NODES / "1" / "properties"
    planted.write_text("x" * machine.SYSFS_READ_MAX + "\n" + node_properties(*HOST[0]))
    with open(planted, "r+b") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB, what a GPU node says lies past the first page
    assert identity_in(huge, 0, monkeypatch).key == ""


@pytest.mark.parametrize("batch", [1, 2])
def test_two_containers_on_one_gpu_never_benchmark_at_once(db, tmp_path, monkeypatch, batch):
    """Two workers in two containers (other host names, other rocm-smi spellings, no shared
    lock file) on the one GPU, each computing its key from its own `/`: one key, and neither
    their benchmarks nor their completed attempts ever overlap."""
    roots = {
        "c1": (container(tmp_path / "c1", HOST, [128, 136], smi("card1", LOWER)), 1),
        "c2": (container(tmp_path / "c2", HOST, [136]), 0),
    }
    sid = make_session(db, tmp_path, 8, tuner="sleep")
    runs: list[tuple[str, float, float]] = []
    workers = []
    for name, (root, index) in roots.items():
        monkeypatch.setattr(machine, "gpu_identity", lambda i, r=root: REAL_IDENTITY(i, r, {}))
        settings = WorkerSettings(session_id=sid, tuner="sleep", gpu_id=index, until_empty=True,
                                  machine_name=name, batch=batch, wait_for_gpu=True,
                                  lease_s=30)  # fmt: skip
        workers.append(Worker(db, settings, tuner=Timed(0.05, runs, name)))
    assert {w.claimant.gpu for w in workers} == {f"GPU-{UID_B:016x}"}
    start = threading.Barrier(2)

    def run(w: Worker) -> None:
        start.wait()
        w.run()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert job_states(db, sid) == {"completed": 8} and len(runs) == 8
    assert overlaps(runs) == []
    with db.session() as s:
        attempts = s.execute(
            sa.select(Attempt.worker, Attempt.claimed_at, Attempt.ended_at, Attempt.gpu).where(
                Attempt.outcome == "completed"
            )
        ).all()
    assert {a.gpu for a in attempts} == {f"GPU-{UID_B:016x}"}
    assert overlaps([tuple(a)[:3] for a in attempts]) == []


def rocmlir_session(db, tmp_path: Path) -> tuple[int, Path]:
    """A rocmlir session on a build that is not the stand-in, one job; the build dir."""
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "tuningRunner.py").write_text("raise SystemExit(1)\n")
    lines = tmp_path / "gemm"
    lines.write_text("-t f16 -transA false -transB false -g 1 -m 64 -n 64 -k 64\n")
    catalog.import_files(db, "gemm", [str(lines)], ExpandOptions(expand=False), tag="id")
    spec = SessionSpec(tuner="rocmlir", arch_full="gfx942:sramecc+:xnack-", num_cu=304,
                       num_chiplets=8, mlir_v="abc")  # fmt: skip
    made = sessions.create(db, spec)
    jobs.load(db, made.id, tag="id")
    return made.id, build


NO_IDENTITY = (
    "cannot tell which GPU --gpus 0 is on this host (no GPU node in the KFD topology under "
    "/sys/class/kfd whose render node this process opens): two containers on one GPU could "
    "benchmark at once; name it with --gpu-identity ID (the same ID on every container that "
    "sees this GPU, e.g. its Uuid from rocminfo)"
)


@pytest.mark.skipif(KFD_ON_THIS_HOST, reason="this host's kernel tells its GPUs apart")
def test_a_gpu_worker_that_cannot_tell_its_gpu_refuses(db, db_url, tmp_path):
    """A rocmlir worker where /sys shows no KFD GPU: the one line, exit 2, nothing claimed
    (one GPU and two: refused before any worker starts)."""
    sid, build = rocmlir_session(db, tmp_path)
    for gpus in ("0", "0,1"):
        run = cli(db_url, "worker", "--session", str(sid), "--gpus", gpus,
                  "--mlir-build-dir", str(build), "--until-empty")  # fmt: skip
        assert run.code == 2, run.stderr
        assert run.stderr.strip().splitlines() == [f"error: {NO_IDENTITY}"]
    with db.session() as s:
        assert s.scalars(sa.select(Job.state)).all() == ["new"]
        assert s.scalars(sa.select(Attempt.id)).all() == []


def test_run_refuses_a_gpu_it_cannot_tell_before_it_writes(db, db_url, tmp_path):
    """`run` on a real build where /sys shows no KFD GPU: the one line, exit 2, and no session,
    problem or job written (it asks before it opens the session, not after)."""
    _, build = rocmlir_session(db, tmp_path / "other")
    lines = tmp_path / "gemm-run"
    lines.write_text("-t f32 -transA false -transB false -g 1 -m 32 -n 32 -k 32\n")
    before = len(sessions.list_all(db))
    run = cli(db_url, "run", "--op", "gemm", "--tuner", "rocmlir", "--mlir-build-dir", str(build),
              "--mlir-v", "abc", "--arch", "gfx942", "--num-cu", "304", "--num-chiplets", "8",
              "--gpus", "0", "-q", str(lines))  # fmt: skip
    assert run.code == 2, run.stderr
    assert run.stderr.strip().splitlines() == [f"error: {NO_IDENTITY}"]
    assert len(sessions.list_all(db)) == before


def test_gpu_identity_names_the_gpu(db, db_url, tmp_path):
    """`--gpu-identity` names the GPU where the kernel cannot: the claim carries it (a UUID
    spelled as the kernel's key would be), and a second worker on that name is refused."""
    sid, build = rocmlir_session(db, tmp_path)
    settings = WorkerSettings(session_id=sid, tuner="rocmlir", gpu_id=0, mlir_build_dir=str(build),
                              gpu_identity="GPU-2E1D0C3B4A596877")  # fmt: skip
    slots = supervisor.name_gpus([Slot(0)], "GPU-2E1D0C3B4A596877")
    assert slots == [Slot(0, f"GPU-{UID_B:016x}")]
    settings = supervisor.slot_settings(settings, slots[0])
    worker = Worker(db, settings)
    assert worker.claimant.gpu == f"GPU-{UID_B:016x}"
    assert "--gpu-identity" in supervisor.worker_argv(settings, slots[0])
    from mlirtuna import queue

    held = queue.claim(db, sid, worker.claimant, 30)
    assert held is not None
    other = supervisor.slot_settings(settings, Slot(3, f"GPU-{UID_B:016x}"))
    assert queue.gpu_holder(db, Worker(db, other).claimant) is not None


def test_bad_gpu_identities_are_refused(db, db_url, tmp_path):
    """One name per GPU of --gpus, each once, one word: else one line, exit 2, before work."""
    sid, build = rocmlir_session(db, tmp_path)
    base = ("worker", "--session", str(sid), "--mlir-build-dir", str(build))
    cases = {
        ("--gpus", "0,1", "--gpu-identity", "a"): "1 name(s) for 2 GPU(s) (GPU 0, GPU 1)",
        ("--gpus", "0,1", "--gpu-identity", "a,a"): "each once",
        ("--gpus", "0", "--gpu-identity", "a b"): "give one word",
    }
    for extra, said in cases.items():
        run = cli(db_url, *base, *extra)
        assert run.code == 2 and said in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
    with db.session() as s:
        assert s.scalars(sa.select(Attempt.id)).all() == []
    lines = tmp_path / "gemm"
    run = cli(db_url, "run", "--op", "gemm", str(lines), "--gpu-identity", "GPU-1,x y")
    assert run.code == 2 and "--gpu-identity 'x y': give one word" in run.stderr
    with db.session() as s:  # `run` refused it before any work: no session opened
        assert s.scalars(sa.select(TuningSession.id)).all() == [sid]


def test_a_standin_worker_needs_no_gpu_identity(db, tmp_path, monkeypatch):
    """A stand-in session (tuned on the stand-in build, which its workers must run: sessions.
    check_build_for) touches no GPU: keyed standin:MACHINE:INDEX, never refused, even where the
    kernel shows no GPU; the same session made real is refused."""
    monkeypatch.setattr(machine, "gpu_identity", lambda i: machine.GpuIdentity())
    sid, build = rocmlir_session(db, tmp_path)
    settings = WorkerSettings(session_id=sid, tuner="rocmlir", gpu_id=2, machine_name="box",
                              mlir_build_dir=str(build))  # fmt: skip
    with pytest.raises(UserError, match="cannot tell which GPU --gpus 2"):
        Worker(db, settings)
    (build / STANDIN_MARKER).write_text("the stand-in\n")  # the build is the stand-in's
    with db.session() as s:  # and so is the session (session new marks it, from the build)
        s.execute(sa.update(TuningSession).where(TuningSession.id == sid).values(standin=True))
    assert Worker(db, settings).claimant.gpu == "standin:box:2"
