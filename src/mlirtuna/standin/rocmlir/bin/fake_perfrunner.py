"""The stand-in's share of perfRunner's configuration classes: what mlirtuna asks a build's
perfRunner for to measure chosen perf configs (tuners/rocmlir/chosen.py, LINE_PROBE), under the
names tuningRunner imports them by: `from_command_line(tokens, arch, num_cu, num_chiplets)`, then
`generate_mlir_driver_commandline(rocmlir_gen_flags, kernel_repeats=None)`, the arguments of
rocmlir-gen for the problem with an empty --perf_config (the driver sets the config itself).

The stand-in's rocmlir-gen (bin/rocmlir-gen) reads those arguments back: the op, the GPU, and
the config line itself, whose tokens never start with `--`. The real classes spell rocmlir-gen's
own flags (--fil_layout, -m, …); only mlirtuna's side is exercised here, which treats the
arguments as opaque.
"""

from __future__ import annotations


class _Configuration:
    OP = ""

    def __init__(self, tokens: list[str], arch: str, num_cu: int, num_chiplets: int) -> None:
        self.tokens = [t for t in tokens if t]
        self.arch = arch
        self.num_cu = num_cu
        self.num_chiplets = num_chiplets

    @classmethod
    def from_command_line(cls, tokens: list[str], arch: str, num_cu: int, num_chiplets: int):
        return cls(tokens, arch, num_cu, num_chiplets)

    def generate_mlir_driver_commandline(self, rocmlir_gen_flags: str, kernel_repeats=None) -> str:
        repeats = "" if kernel_repeats is None else f" --kernel-repeats={kernel_repeats}"
        return (
            f"-operation {self.OP} --arch={self.arch} --num_cu={self.num_cu} "
            f"--num_chiplets={self.num_chiplets} {rocmlir_gen_flags}{repeats} --perf_config= "
            + " ".join(self.tokens)
        )


class GemmConfiguration(_Configuration):
    OP = "gemm"


class ConvConfiguration(_Configuration):
    OP = "conv"


class AttentionConfiguration(_Configuration):
    OP = "attention"


class GemmGemmConfiguration(_Configuration):
    OP = "gemm_gemm"


class ConvGemmConfiguration(_Configuration):
    OP = "conv_gemm"
