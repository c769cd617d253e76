"""Fake of hip-python's `hip.hip`: only what rocMLIR's perfRunner.py and gpu_topology.py call.

Calls return a tuple whose first item is a hipError_t, like hip-python's:
`hipGetDeviceCount()` -> (err, count); `hipGetDeviceProperties(props, id)` -> (err,) and fills
`props`. The device is fake_gpu.current().
"""

from __future__ import annotations

import enum
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fake_gpu


class hipError_t(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidDevice = 101


class hipDeviceProp_t:
    def __init__(self) -> None:
        self.name = b""
        self.gcnArchName = b""
        self.multiProcessorCount = 0
        self.warpSize = 0


def _visible() -> int:
    """Devices left visible by ROCR_VISIBLE_DEVICES (tuningRunner isolates to one)."""
    gpu = fake_gpu.current()
    ids = os.environ.get("ROCR_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES")
    if not ids:
        return gpu.count
    return len([i for i in ids.split(",") if i.strip() and int(i) < gpu.count])


def hipGetDeviceCount():
    return (hipError_t.hipSuccess, _visible())


def hipGetDeviceProperties(props: hipDeviceProp_t, device: int):
    if not 0 <= device < _visible():
        return (hipError_t.hipErrorInvalidDevice,)
    gpu = fake_gpu.current()
    props.name = gpu.marketing_name.encode()
    props.gcnArchName = gpu.arch.encode()
    props.multiProcessorCount = gpu.hip_cu
    props.warpSize = gpu.wave_size
    return (hipError_t.hipSuccess,)
