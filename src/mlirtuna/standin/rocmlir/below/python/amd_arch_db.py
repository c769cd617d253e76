"""Fake of rocMLIR's `amd_arch_db` pybind11 binding (AmdArchDb.cpp), as perfRunner.py uses it:
`lookup_arch_info(chip or "native:N")` with default_features, wave_size, has_fp8_conversion_instrs,
has_ocp_fp8_conversion_instrs, has_fp4, min_num_cu, max_num_xcc; `GemmFeatures`; `has_feature`.

In native mode the binding asks HIP for the device, so min_num_cu is HIP's multiprocessor count
(48 on a WGP-mode gfx1100, not rocminfo's 96) and max_num_xcc the device's chiplets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import fake_gpu
from hip import hip


class GemmFeatures(enum.IntFlag):
    NONE = 0
    MFMA = 1 << 0
    WMMA = 1 << 1
    DOT = 1 << 2
    ATOMIC_ADD = 1 << 3


def has_feature(features: GemmFeatures, feature: GemmFeatures) -> bool:
    return bool(features & feature)


@dataclass(frozen=True)
class AmdArchInfo:
    default_features: GemmFeatures
    wave_size: int
    has_fp8_conversion_instrs: bool
    has_ocp_fp8_conversion_instrs: bool
    has_fp4: bool
    min_num_cu: int
    max_num_xcc: int


def _static(chip: str, num_cu: int = 0, num_xcc: int = 1) -> AmdArchInfo:
    wave = fake_gpu.wave_size_of(chip)
    cdna = chip.startswith(("gfx908", "gfx90a", "gfx94", "gfx95"))
    rdna_wmma = chip.startswith(("gfx11", "gfx12"))
    feats = GemmFeatures.DOT | (
        GemmFeatures.MFMA if cdna else GemmFeatures.WMMA if rdna_wmma else GemmFeatures.NONE
    )
    fp8 = chip.startswith(("gfx94", "gfx95"))
    ocp = chip.startswith(("gfx95", "gfx12"))
    return AmdArchInfo(feats, wave, fp8, ocp, chip.startswith("gfx95"), num_cu, num_xcc)


def lookup_arch_info(name: str) -> AmdArchInfo:
    if name.startswith("native:"):
        device = int(name.split(":", 1)[1])
        props = hip.hipDeviceProp_t()
        err = hip.hipGetDeviceProperties(props, device)[0]
        if err != hip.hipError_t.hipSuccess:
            raise RuntimeError(f"no HIP device {device}")
        chip = props.gcnArchName.decode().split(":")[0]
        return _static(chip, props.multiProcessorCount, fake_gpu.current().chiplets)
    return _static(name.split(":")[0])


def infer_num_chiplets(chip: str, num_cu: int) -> int:
    """rocmlirTriton's binding (its tuningRunner 520c8752 calls it): the chiplets of a chip with
    this many CUs. The fake answers for the GPU it pretends to be, else 1."""
    gpu = fake_gpu.current()
    return gpu.chiplets if chip == gpu.chip and num_cu == gpu.hip_cu else 1
