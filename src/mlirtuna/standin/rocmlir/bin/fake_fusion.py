"""Fusion for the rocMLIR stand-ins (tuningRunner.py and rocmlir-gen): written for tests from the
reference (rocmlir-newest §6), sharing no code with mlirtuna.

- `emit_tuning_key(text)`: what `rocmlir-gen --emit-tuning-key` prints for a MIGraphX module:
  `arch\\tnumCU\\tnumChiplets\\tPROBLEM`; with `new_layout=False` (the tests' overlay asks for it)
  `arch\\tnumCU\\tPROBLEM`, as builds before numChiplets printed it. PROBLEM is rocmlir-gen's
  own form: a conv key without `-m conv -t 1`; a gemm key with `-transO` and, in the new layout,
  `-supportsSplitK true`. Only what rocMLIR's resnet50 / mixr-gemm tests hold is read: one
  migraphx.convolution / quant_convolution (NCHW) or migraphx.dot.
- `fusion_configs(config, test_dir)`: the modules tuningRunner tunes for `--op fusion`
  (`--config FILE.mlir`, or every `*.mlir` of `--test-dir`), each as (module path, PROBLEM).

Standard library only.
"""

from __future__ import annotations

import glob
import os
import re

CONV_PREFIX = {"f32": "conv", "f16": "convfp16", "bf16": "convbfp16", "i8": "convint8"}


def _shape(text: str) -> tuple[list[int], str]:
    dims = text.split("x")
    return [int(d) for d in dims[:-1]], dims[-1]


def _args(text: str) -> dict[str, tuple[list[int], str]]:
    head = re.search(r"func\.func[^(]*\((.*?)\)\s*->", text, re.S)
    if head is None:
        raise ValueError("no func.func")
    return {n: _shape(t) for n, t in re.findall(r"(%\w+)\s*:\s*tensor<([^>]+)>", head.group(1))}


def _ints(attrs: str, name: str, default: list[int]) -> list[int]:
    match = re.search(name + r"\s*=\s*\[([^\]]*)\]", attrs)
    if match is None:
        return default
    return [int(re.sub(r":.*", "", v).strip()) for v in match.group(1).split(",")]


def problem_string(text: str, new_layout: bool) -> str:
    args = _args(text)
    conv = re.search(r"migraphx\.(?:quant_)?convolution\((%\w+), (%\w+)\)\s*\{([^}]*)\}", text)
    if conv:
        (n, c, h, w), dtype = args[conv.group(1)]
        (k, _, y, x), _ = args[conv.group(2)]
        attrs = conv.group(3)
        pad = _ints(attrs, "padding", [0, 0, 0, 0])
        u, v = _ints(attrs, "stride", [1, 1])
        dl, dj = _ints(attrs, "dilation", [1, 1])
        group = re.search(r"group\s*=\s*(\d+)", attrs)
        g = int(group.group(1)) if group else 1
        key = (
            f"{CONV_PREFIX[dtype]} -F 1 -f GNC01 -I NGC01 -O NGC01 -n {n} -c {c} -H {h} -W {w} "
            f"-k {k} -y {y} -x {x} -p {pad[0]} -q {pad[1]} -u {u} -v {v} -l {dl} -j {dj} -g {g}"
        )
        return key + (" -supportsSplitK true" if new_layout else "")
    dot = re.search(r'"?migraphx\.dot"?\((%\w+), (%\w+)\)[^:]*:.*->\s*tensor<([^>]+)>', text)
    if dot is None:
        raise ValueError("no convolution or dot")
    (*_batch, m, k), dtype = args[dot.group(1)]
    out, out_type = _shape(dot.group(3))
    g = 1
    for d in out[:-2]:
        g *= d
    n = out[-1]
    key = (
        f"-t {dtype} -out_datatype {out_type} -transA false -transB false -transO false "
        f"-g {g} -m {m} -n {n} -k {k}"
    )
    return key + (" -supportsSplitK true" if new_layout else "")


def emit_tuning_key(text: str, new_layout: bool = True) -> str:
    arch = os.environ.get("FAKE_GPU_ARCH", "gfx942:sramecc+:xnack-").split(":")[0]
    num_cu = os.environ.get("FAKE_GPU_NUM_CU", "304")
    chiplets = os.environ.get("FAKE_GPU_NUM_CHIPLETS", "8")
    fields = [arch, num_cu, chiplets] if new_layout else [arch, num_cu]
    return "\t".join([*fields, problem_string(text, new_layout)])


def key_problem(text: str) -> str:
    """The PROBLEM part tuningRunner keys a module's row under (the last tab field)."""
    return emit_tuning_key(text).split("\t")[-1]


def fusion_configs(config: str | None, test_dir: str | None) -> list[tuple[str, str]]:
    paths = [config] if config else sorted(glob.glob(os.path.join(test_dir or ".", "*.mlir")))
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out.append((path, key_problem(f.read())))
    return out


def op_of(problem: str) -> str:
    """The op whose description a fusion key gets (conv or gemm)."""
    return "conv" if problem.startswith("conv") else "gemm"


def strip_key_flags(problem: str) -> str:
    return re.sub(r" -supportsSplitK \w+", "", problem)
