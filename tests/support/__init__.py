"""Helpers shared by the tests.

One GPU lock directory per test process (pytest-xdist runs several): two tests' workers on
"GPU 0" of this one host must not hold each other's lock (mlirtuna.worker.gpulock)."""

import os
import tempfile

from mlirtuna.defaults import ENV_GPU_LOCK_DIR

os.environ.setdefault(ENV_GPU_LOCK_DIR, tempfile.mkdtemp(prefix="mlirtuna-gpu-locks-"))
