"""E4's split of compiling and benchmarking (rocmlir-newest.md §2). `--compile-only DIR` (needs
the three --target-* flags) writes DIR/index.json and, per problem,
DIR/problems/<hash>/manifest.json.z and configs/NNNNNN.hsaco.z; it costs
fake_costs.compile_candidates. The real tool compresses with zstd, which Python 3.11's standard
library lacks: the stand-in uses zlib with the real framing (an 8-byte little-endian size of the
uncompressed bytes, then the compressed bytes). `--benchmark-artifacts DIR` refuses a bundle of
another GPU, or of another commit than the build's unless --allow-commit-mismatch (an ERROR
line, exit 1), benchmarks only the candidates whose manifest status is success
(fake_costs.benchmark_candidates) and writes rows, .debug and .state as the one-stage run does."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zlib

import fake_costs

from standin_runner import candidates, common, problems
from standin_runner.candidates import Result
from standin_runner.e4_tuning import Measure

ZSTD_STAND_IN = "zlib"


def problem_hash(arch: str, num_cu: int, chiplets: int, space: str, flags: str, tv: str) -> str:
    text = f"{arch}|{num_cu}|{chiplets}|{space}|{flags}|{tv}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def write_framed(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(len(data).to_bytes(8, "little") + zlib.compress(data))


def read_framed(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    size, data = int.from_bytes(raw[:8], "little"), zlib.decompress(raw[8:])
    if len(data) != size:
        raise ValueError(f"{path}: {len(data)} bytes, its header says {size}")
    return data


class Target:
    """The GPU a --compile-only run compiles for (no GPU here: from the --target-* flags)."""

    def __init__(self, arch: str, num_cu: int, num_chiplets: int) -> None:
        self.arch, self.num_cu, self.num_chiplets = arch, num_cu, num_chiplets
        self.chip = arch.split(":")[0]


def compile_only(args, configs: list[str], log: common.Log) -> int:
    """run_compile_only: for each config, its bundle into DIR/problems/<hash>/ and its entry
    merged into DIR/index.json (no rocmlirGenFlags). A config that fails to compile is
    discarded (no folder, no entry), the others stay; any failure makes the exit status 1.
    Already compiled at this commit (index entry and manifest there): skipped unless --retune."""
    flags = (args.target_arch, args.target_num_cu, args.target_num_chiplets)
    if any(v is None for v in flags):
        names = ("--target-arch", "--target-num-cu", "--target-num-chiplets")
        missing = [n for n, v in zip(names, flags, strict=True) if v is None]
        return common.usage_error(
            "argument --compile-only: requires " + ", ".join(missing) + " (the compile host is "
            "GPU-less; target identity cannot be auto-discovered)"
        )  # fmt: skip
    target = Target(*flags)
    root = args.compile_only
    os.makedirs(os.path.join(root, "problems"), exist_ok=True)
    run_id = hashlib.sha1(f"{time.time()}{os.getpid()}".encode()).hexdigest()
    failed = 0
    for position, key in enumerate(configs, start=1):
        progress = f"[{position}/{len(configs)}]"
        digest = problem_hash(target.arch, target.num_cu, target.num_chiplets,
                              args.tuning_space, args.rocmlir_gen_flags, key)  # fmt: skip
        problem_dir = os.path.join(root, "problems", digest)
        entry = read_index(root)["problems"].get(digest, {})
        done = os.path.isfile(os.path.join(problem_dir, "manifest.json.z"))
        if not args.retune and entry.get("commitId") == common.commit_id() and done:
            log.info(f"{progress} Skipping already-compiled problem {digest}")
            merge_index(root, target, args, digest, key, run_id)
            continue
        if not compile_problem(args, key, target, problem_dir):
            shutil.rmtree(problem_dir, ignore_errors=True)
            remove_from_index(root, digest)
            log.error(
                f"{progress} compile-only kernel bundle failed for '{key}' (problem {digest})\n"
                "Exit code: 1\nCompilation failed"
            )
            failed += 1
            continue
        merge_index(root, target, args, digest, key, run_id)
        log.info(f"{progress} Compiled problem {digest}")
    log.info(f"Compile phase: {len(configs) - failed} compiled, {failed} failed, "
             f"of {len(configs)} problem(s)")  # fmt: skip
    return 1 if failed else 0


def read_index(directory: str) -> dict:
    path = os.path.join(directory, "index.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"problems": {}}


def write_index(directory: str, index: dict) -> None:
    path = os.path.join(directory, "index.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    os.replace(f"{path}.tmp", path)


def merge_index(directory: str, target: Target, args, digest: str, key: str, run: str) -> None:
    """_merge_index_json: the header from this call, this problem's entry, the others kept."""
    index = read_index(directory)
    index.update(arch=target.arch, numCUs=target.num_cu, numChiplets=target.num_chiplets,
                 tuningSpace=args.tuning_space, lastRunId=run)  # fmt: skip
    index.setdefault("problems", {})[digest] = {
        "testVector": key, "commitId": common.commit_id(), "runId": run,
    }  # fmt: skip
    write_index(directory, index)


def remove_from_index(directory: str, digest: str) -> None:
    path = os.path.join(directory, "index.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        index = json.load(f)
    if digest in index.get("problems", {}):
        del index["problems"][digest]
        write_index(directory, index)


def compile_problem(args, config: str, target: Target, directory: str) -> bool:
    """manifest.json.z and one configs/NNNNNN.hsaco.z per candidate that compiled; False when
    the problem failed to compile (a test build's faults)."""
    pcs = candidates.perf_configs(args.op, args.tuning_space, "E4")
    fake_costs.compile_candidates(len(pcs))
    _, flops = problems.describe(args.op, config, target)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.join(directory, "configs"))
    entries = []
    for i, pc in enumerate(pcs):
        if candidates.candidate_time_ns(config, pc, flops) is None:  # rocmlir-gen rejects it
            entries.append({"perfConfig": pc, "status": "not_applicable", "blob": None})
            continue
        blob = f"configs/{i:06d}.hsaco.z"
        code = f"hsaco for {target.arch} {config} {pc}\n".encode() * 8
        write_framed(os.path.join(directory, blob), code)
        entries.append({"perfConfig": pc, "status": "success", "blob": blob, "kernels": 1})
    manifest = {
        "hipVersion": "6.4.43482",
        "arch": target.arch,
        "numCUs": target.num_cu,
        "numChiplets": target.num_chiplets,
        "numConfigs": len(pcs),
        "buffers": [],
        "configs": entries,
    }
    write_framed(os.path.join(directory, "manifest.json.z"), json.dumps(manifest).encode())
    return True


def bundle_benchmark(args, gpu: common.Gpu, gpu_id: int, log: common.Log) -> Measure | None:
    """The `measure` of --benchmark-artifacts DIR, or None (an ERROR logged) when the bundle
    is for another GPU."""
    directory = args.benchmark_artifacts
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    if not _index_matches(args, gpu, gpu_id, index, directory, log):
        return None

    def measure(config: str) -> Result | str | None:
        """A Result, a failed state, or None: a bundle fault (nothing in .state, exit 1)."""
        key = problems.e4_key(args.op, config)
        digest = problem_hash(index["arch"], index["numCUs"], index["numChiplets"],
                              args.tuning_space, args.rocmlir_gen_flags, key)  # fmt: skip
        problem_dir = os.path.join(directory, "problems", digest)
        if not os.path.isdir(problem_dir):
            log.error(f"[GPU {gpu_id}] no artifacts for '{key}' (problem {digest}) in "
                      f"{problem_dir}; the bundle is incomplete for this target")  # fmt: skip
            return None
        compiled_at = index["problems"].get(digest, {}).get("commitId")
        if compiled_at != common.commit_id() and not args.allow_commit_mismatch:
            log.error(f"[GPU {gpu_id}] build-commit mismatch for problem {digest}: artifacts "
                      f"compiled at '{compiled_at}' but benchmarking from "
                      f"'{common.commit_id()}'; pass --allow-commit-mismatch to "
                      "override")  # fmt: skip
            return None
        manifest = json.loads(read_framed(os.path.join(problem_dir, "manifest.json.z")))
        compiled = [c for c in manifest["configs"] if c["status"] == "success"]
        for c in compiled:  # a candidate is run from its code object
            read_framed(os.path.join(problem_dir, c["blob"]))
        fake_costs.benchmark_candidates(len(compiled), gpu_id)
        skipped = frozenset(c["perfConfig"] for c in manifest["configs"]) - {
            c["perfConfig"] for c in compiled
        }
        return candidates.tune(args.op, config, args.tuning_space, gpu, "E4", args.debug, skipped)

    return measure


def _index_matches(args, gpu: common.Gpu, gpu_id: int, index: dict, directory: str,
                   log: common.Log) -> bool:  # fmt: skip
    """As rocmlirTriton: the index against the target this call resolved (--target-* where
    given, else this GPU: HIP's full arch name), field by field, before anything runs."""
    resolved = {
        "arch": (args.target_arch or gpu.arch, "--target-arch"),
        "numCUs": (args.target_num_cu or gpu.num_cu, "--target-num-cu"),
        "numChiplets": (args.target_num_chiplets or gpu.num_chiplets, "--target-num-chiplets"),
        "tuningSpace": (args.tuning_space, "--tuning-space"),
    }
    missing = [name for name in resolved if name not in index]
    if missing:
        log.error(f"artifact index {os.path.join(directory, 'index.json')} is missing required "
                  f"field{'s' if len(missing) != 1 else ''}: {', '.join(missing)}")  # fmt: skip
        return False
    differences = [
        f"artifacts compiled for {name} {index[name]!r} but this host resolved {local!r}; "
        f"pass {option}={index[name]}"
        for name, (local, option) in resolved.items()
        if index[name] != local
    ]
    if differences:
        log.error("\n".join(differences))
        return False
    target = (index["arch"].split(":")[0], index["numCUs"], index["numChiplets"])
    if target != (gpu.chip, gpu.num_cu, gpu.num_chiplets):
        log.error(
            f"bundle compiled for {target[0]}/{target[1]} CUs/{target[2]} chiplets, GPU "
            f"{gpu_id} is {gpu.chip}/{gpu.num_cu} CUs/{gpu.num_chiplets} chiplets"
        )
        return False
    return True
