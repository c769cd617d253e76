"""Helpers shared by the tests.

One GPU lock directory per test process (pytest-xdist runs several): two tests' workers on
"GPU 0" of this one host must not hold each other's lock (mlirtuna.worker.gpulock). Keyed by
the process id, since xdist's workers inherit the environment of the process that started them
(which imports this package too)."""

import os
import tempfile

from mlirtuna.defaults import ENV_GPU_LOCK_DIR

_OWNER = "MLIRTUNA_TEST_GPU_LOCK_DIR_PID"
if os.environ.get(_OWNER) != str(os.getpid()):
    os.environ[ENV_GPU_LOCK_DIR] = tempfile.mkdtemp(prefix="mlirtuna-gpu-locks-")
    os.environ[_OWNER] = str(os.getpid())
