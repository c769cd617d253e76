"""The GPU every fake below tuningRunner.py reports, configured by environment variables.

FAKE_GPU picks a preset (default gfx942); FAKE_GPU_ARCH, FAKE_GPU_NUM_CU (HIP's count),
FAKE_GPU_NUM_CHIPLETS and FAKE_GPU_COUNT override its fields.

- gfx942 (CDNA3, MI300X): wave64, MFMA, 304 CUs, 8 chiplets (XCDs).
- gfx1100 (RDNA3, RX 7900 XTX): wave32, so HIP runs it in WGP mode and counts one
  multiprocessor per two-CU workgroup processor: HIP reports 48, rocminfo prints 96.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class FakeGpu:
    arch: str  # HIP gcnArchName, with feature suffix
    hip_cu: int  # hipDeviceProp_t.multiProcessorCount
    chiplets: int
    wave_size: int
    sku: str  # rocm-smi "Card SKU"
    marketing_name: str
    count: int = 1

    @property
    def chip(self) -> str:
        return self.arch.split(":")[0]

    @property
    def wgp_mode(self) -> bool:
        return self.wave_size == 32

    @property
    def rocminfo_cu(self) -> int:
        """rocminfo prints physical CUs: twice HIP's count in WGP mode."""
        return 2 * self.hip_cu if self.wgp_mode else self.hip_cu


PRESETS = {
    "gfx942": FakeGpu("gfx942:sramecc+:xnack-", 304, 8, 64, "MI3SRIOV", "AMD Instinct MI300X"),
    "gfx1100": FakeGpu("gfx1100", 48, 1, 32, "NAVI31", "Radeon RX 7900 XTX"),
}


def wave_size_of(chip: str) -> int:
    return 32 if chip.startswith(("gfx10", "gfx11", "gfx12")) else 64


def current() -> FakeGpu:
    base = PRESETS[os.environ.get("FAKE_GPU", "gfx942")]
    arch = os.environ.get("FAKE_GPU_ARCH", base.arch)
    return FakeGpu(
        arch=arch,
        hip_cu=int(os.environ.get("FAKE_GPU_NUM_CU", base.hip_cu)),
        chiplets=int(os.environ.get("FAKE_GPU_NUM_CHIPLETS", base.chiplets)),
        wave_size=wave_size_of(arch.split(":")[0]),
        sku=base.sku,
        marketing_name=base.marketing_name,
        count=int(os.environ.get("FAKE_GPU_COUNT", 1)),
    )
