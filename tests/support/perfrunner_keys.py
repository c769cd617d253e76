"""A perfRunner-style reader of tuning keys, written for tests from the reference
(rocmlir-interfaces §2b/§2c, rocmlir-newest §6). It shares no code with mlirtuna.problems on
purpose: it checks that the keys mlirtuna stores are what perfRunner would parse.

perfRunner decides by the first token: `conv…` is a ConvConfiguration (its data type from the
prefix: conv f32, convfp16 f16, convbfp16 bf16, convint8 i8), otherwise a GemmConfiguration.
"""

from __future__ import annotations

CONV_PREFIXES = {"conv": "f32", "convfp16": "f16", "convbfp16": "bf16", "convint8": "i8"}
CONV_FLAGS = {
    "-F": "direction", "-f": "fil_layout", "-I": "in_layout", "-O": "out_layout", "-n": "n",
    "-c": "c", "-H": "hi", "-W": "wi", "-k": "k", "-y": "y", "-x": "x", "-p": "pad_h",
    "-q": "pad_w", "-u": "stride_h", "-v": "stride_w", "-l": "dil_h", "-j": "dil_w", "-m": "mode",
    "-g": "group", "-t": "timing",
}  # fmt: skip
GEMM_FLAGS = {
    "-t": "dtype", "-out_datatype": "out_dtype", "-transA": "trans_a", "-transB": "trans_b",
    "-transO": "trans_o", "-g": "g", "-m": "m", "-n": "n", "-k": "k",
}  # fmt: skip
GEMM_TYPES = ("f32", "f16", "bf16", "i8", "fp8")


def read_key(key: str) -> tuple[str, dict]:
    """('conv' | 'gemm', fields) or ValueError, as perfRunner's from_command_line would."""
    tokens = key.split()
    if tokens and tokens[0].startswith("conv"):
        if tokens[0] not in CONV_PREFIXES:
            raise ValueError(f"unknown conv prefix {tokens[0]}")
        fields: dict = {"dtype": CONV_PREFIXES[tokens[0]]}
        pairs = tokens[1:]
        names = CONV_FLAGS
    else:
        fields, pairs, names = {}, tokens, GEMM_FLAGS
    if len(pairs) % 2:
        raise ValueError("odd number of tokens")
    for flag, value in zip(pairs[::2], pairs[1::2], strict=True):
        if flag not in names:
            raise ValueError(f"unknown flag {flag}")
        name = names[flag]
        if name.startswith("trans"):
            fields[name] = value.lower() in ("1", "true")
        elif value.lstrip("-").isdigit():
            fields[name] = int(value)
        else:
            fields[name] = value
    if names is CONV_FLAGS:
        for need in ("direction", "n", "c", "hi", "wi", "k", "y", "x", "group"):
            if need not in fields:
                raise ValueError(f"incomplete conv key: no {need}")
        return "conv", fields
    for need in ("dtype", "g", "m", "n", "k"):
        if need not in fields:
            raise ValueError(f"incomplete gemm key: no {need}")
    if fields["dtype"] not in GEMM_TYPES:
        raise ValueError(f"invalid gemm data type {fields['dtype']}")
    return "gemm", fields
