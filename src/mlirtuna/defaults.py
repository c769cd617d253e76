"""Defaults that `--help` shows, apart from the modules that use them: the CLI reads them without
importing the database layer, so `mlirtuna --help` starts fast (docs/benchmarks.md, start-up).

The ops are not listed here: problems/ finds its op modules itself (problems.OPS), and the help
texts that name them import that package, which pulls in nothing heavy."""

from __future__ import annotations

# Every space some tuningRunner offers (lfbo: rocmlirTriton; smart: rocMLIR's analysis work);
# which ones a build has is read from its --help (tuners.rocmlir.Era).
TUNING_SPACES = ("quick", "full", "greedy", "exhaustive", "lfbo", "smart")
DEFAULT_TUNING_SPACE = "full"  # tuningRunner E3's default
DEFAULT_TUNER = "cpu"  # `session new`: what runs anywhere (tuners/registry.py knows them all)
DEFAULT_LEASE_S = 120.0
# The longest lease a worker may take (`--lease`): a job's lease that runs out later than this
# from now was not set by a claim or a heartbeat (a worker login may UPDATE lease_expires_at):
# the claim's GPU check does not trust it and lease expiry takes the job back (issue 43).
MAX_LEASE_S = 3600.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_S = 10.0
DEFAULT_BATCH_WAIT_S = 2.0  # a GPU worker's wait for a full batch of bundles: ~ one tool start-up
DEFAULT_QUICK_THRESHOLD = 0.93  # quickTuningGen.py's --th and tuning_eval's coverage threshold
DEFAULT_TOPK = 3  # candidates re-measured after the search (1: keep the search's winner)
# The largest .mlir module `import --op fusion` reads (`--max-module-mib`): MIGraphX's modules
# are kilobytes; a 1 GiB file is refused by its size, never read whole.
DEFAULT_MAX_MODULE_BYTES = 16 << 20
# A bundle's caps when unpacked (a session's `--bundle-cap-mib` sets the total; one file may be
# as large as the total): the compile output of one problem is a few MiB.
DEFAULT_BUNDLE_CAP_BYTES = 4 << 30

# Every environment variable mlirtuna reads, named once (modules import the name, never the text).
ENV_DB = "MLIRTUNA_DB"  # the database URL (--db)
ENV_DB_PASSWORD = "MLIRTUNA_DB_PASSWORD"  # its password, kept out of the URL
ENV_ROLE_PASSWORD = "MLIRTUNA_ROLE_PASSWORD_{}"  # …_ADMIN, …_WORKER, …_READER (db roles)
ENV_ROCMLIR_BUILD = "MLIRTUNA_ROCMLIR_BUILD"  # the rocMLIR build dir (--mlir-build-dir)
# A file at the root of mlirtuna's stand-in rocMLIR build (src/mlirtuna/standin/rocmlir/): a
# session opened on a build that has it is a stand-in session (made-up numbers, session.standin).
STANDIN_MARKER = "MLIRTUNA_STANDIN.md"
# A failed job's retries (--max-retries) and the wait before the first (worker --retry-backoff):
# one setting for every worker a node or a pipeline starts.
ENV_MAX_RETRIES = "MLIRTUNA_MAX_RETRIES"
ENV_RETRY_BACKOFF = "MLIRTUNA_RETRY_BACKOFF"
ENV_ROCMLIR_PYTHON = "MLIRTUNA_ROCMLIR_PYTHON"  # the python that runs tuningRunner.py
# A directory holding tuningRunner.py and perfRunner.py (rocMLIR's mlir/utils/performance) to run
# instead of <build>/bin's, over the build's binaries: a checkout's scripts with a ROCm python.
ENV_ROCMLIR_SCRIPT_DIR = "MLIRTUNA_ROCMLIR_SCRIPT_DIR"
KILL_GRACE_S = 5.0  # a tool's time between SIGTERM and SIGKILL (the worker waits longer)
ENV_TOOL_ENV = "MLIRTUNA_TOOL_ENV"  # more variables the tool may see: "NAME,PREFIX*"
ENV_DOCKER_IMAGE = "MLIRTUNA_DOCKER_IMAGE"  # the image a session records (machine.docker_image)
# One worker per GPU: the directory of the per-host GPU lock files (`worker --gpu-lock-dir`); one
# directory for every user of the host, so a second worker on a GPU, whoever runs it, is refused.
ENV_GPU_LOCK_DIR = "MLIRTUNA_GPU_LOCK_DIR"
# `--gpus auto`: the descriptor of the GPU's lock the supervisor took and handed to the worker it
# started (it took the lock first, so that two supervisors started together never share a GPU).
ENV_GPU_LOCK_FD = "MLIRTUNA_GPU_LOCK_FD"
# One worker per GPU across containers: the GPU's key as the operator names it (`--gpu-identity`),
# where the kernel's KFD topology cannot tell it.
ENV_GPU_IDENTITY = "MLIRTUNA_GPU_IDENTITY"
DEFAULT_GPU_LOCK_DIR = "/tmp/mlirtuna-gpu-locks"
