"""Config strings as perfRunner reads them: enough of from_command_line for the flops and the
`.debug` row of a problem (E3's columns; E4's gemm adds TransO), E3's refusal of a line it
cannot parse, and E4's canonical keys."""

from __future__ import annotations

import contextlib
import sys

from standin_runner import common


def _words(text: str) -> list[str]:
    return text.split()


# perfRunner's TABLE_COLUMNS per op (reportUtils *_TEST_PARAMETERS + LDSBankConflict + TFlops).
CONV_COLUMNS = _words(
    "Direction DataType Chip numCU FilterLayout InputLayout OutputLayout N C H W K Y X "
    "DilationH DilationW StrideH StrideW PaddingH PaddingW PerfConfig LDSBankConflict "
    "TFlops"
)
GEMM_COLUMNS = _words(
    "DataType OutDataType Chip numCU TransA TransB G M K N ScaledGemm ScaleADtype "
    "ScaleBDtype TransScaleA TransScaleB PerfConfig LDSBankConflict TFlops"
)
ATTN_COLUMNS = _words(
    "DataType Chip numCU TransQ TransK TransV TransO Causal ReturnLSE SplitKV "
    "SlidingWindowLookBack WithAttnScale WithAttnBias TransBias G SeqLenQ SeqLenK NumHeadsQ "
    "NumHeadsKV HeadDimQK HeadDimV PerfConfig TFlops"
)
CONV_TYPES = {
    "conv": "f32",
    "convfp16": "f16",
    "convbfp16": "bf16",
    "convint8": "i8",
    "convfp8": "fp8",
    "convfp8_fp8": "fp8_fp8",
}


def debug_columns(op: str) -> list[str]:
    return {"conv": CONV_COLUMNS, "gemm": GEMM_COLUMNS}.get(op, ATTN_COLUMNS)


def _flag_pairs(tokens: list[str]) -> dict[str, str]:
    if len(tokens) % 2:
        raise ValueError("odd number of tokens")
    return {tokens[i]: tokens[i + 1] for i in range(0, len(tokens), 2)}


def describe(op: str, config: str, gpu: common.Gpu) -> tuple[dict, float]:
    """(the per-problem part of a .debug row, flops) for a config string."""
    if op not in TUNED_OPS:
        raise ValueError(refusal())
    return _DESCRIBE[op](config.split(), gpu)


def refusal(*also: str) -> str:
    """The error of a call for an op the stand-in does not tune."""
    return f"the stand-in tunes {', '.join((*TUNED_OPS, *also))} only"


def _describe_conv(tokens: list[str], gpu: common.Gpu) -> tuple[dict, float]:
    dtype = CONV_TYPES[tokens[0]] if tokens and not tokens[0].startswith("-") else "f32"
    rest = tokens[1:] if tokens and not tokens[0].startswith("-") else tokens
    f = _flag_pairs(rest)
    n, c, hi, wi, k = (int(f[x]) for x in ("-n", "-c", "-H", "-W", "-k"))
    y, x, g = int(f["-y"]), int(f["-x"]), int(f.get("-g", "1"))
    p, q, u, v = (int(f.get(x, d)) for x, d in (("-p", "0"), ("-q", "0"), ("-u", "1"), ("-v", "1")))
    dil_h, dil_w = int(f.get("-l", "1")), int(f.get("-j", "1"))
    ho = (hi + 2 * p - (y - 1) * dil_h - 1) // u + 1
    wo = (wi + 2 * q - (x - 1) * dil_w - 1) // v + 1
    flops = 2.0 * n * (c // g) * k * ho * wo * y * x
    row = {
        "Direction": {"1": "fwd", "2": "bwd", "4": "wrw"}[f.get("-F", "1")],
        "DataType": dtype,
        "Chip": gpu.chip,
        "numCU": gpu.num_cu,
        "FilterLayout": _map_layout(f.get("-f", "NCHW"), {"N": "k", "C": "c"}),
        "InputLayout": _map_layout(f.get("-I", "NCHW"), {"N": "n", "C": "c"}),
        "OutputLayout": _map_layout(f.get("-O", "NCHW"), {"N": "n", "C": "k"}),
        "N": n,
        "C": c,
        "H": hi,
        "W": wi,
        "K": k,
        "Y": y,
        "X": x,
        "DilationH": dil_h,
        "DilationW": dil_w,
        "StrideH": u,
        "StrideW": v,
        "PaddingH": p,
        "PaddingW": q,
    }
    return row, flops


def _map_layout(layout: str, nc: dict) -> str:
    table = dict(nc, H="0", W="1", G="g")
    return "".join(table.get(ch, ch) for ch in layout).lower()


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true")


def _describe_gemm(tokens: list[str], gpu: common.Gpu) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, m, k, n = (int(f[x]) for x in ("-g", "-m", "-k", "-n"))
    row = {
        "DataType": f["-t"],
        "OutDataType": f.get("-out_datatype", f["-t"]),
        "Chip": gpu.chip,
        "numCU": gpu.num_cu,
        "TransA": _bool(f.get("-transA", "false")),
        "TransB": _bool(f.get("-transB", "false")),
        "G": g,
        "M": m,
        "K": k,
        "N": n,
        "ScaledGemm": False,
        "ScaleADtype": "",
        "ScaleBDtype": "",
        "TransScaleA": False,
        "TransScaleB": False,
    }
    return row, 2.0 * g * m * k * n


def _describe_attention(tokens: list[str], gpu: common.Gpu) -> tuple[dict, float]:
    f = _flag_pairs(tokens)
    g, sq, sk = int(f["-g"]), int(f["-seq_len_q"]), int(f["-seq_len_k"])
    dqk, dv = int(f["-head_dim_qk"]), int(f["-head_dim_v"])
    hq, hkv = int(f.get("-num_heads_q", "1")), int(f.get("-num_heads_kv", "1"))
    heads = g * max(hq, hkv)
    flops = 2.0 * heads * sq * dqk * sk + 2.0 * heads * sq * sk * dv
    row = {"DataType": f["-t"], "Chip": gpu.chip, "numCU": gpu.num_cu}
    for col, flag in (
        ("TransQ", "-transQ"),
        ("TransK", "-transK"),
        ("TransV", "-transV"),
        ("TransO", "-transO"),
    ):
        row[col] = _bool(f.get(flag, "false"))
    row.update(
        {
            "Causal": _bool(f.get("-causal", "false")),
            "ReturnLSE": _bool(f.get("-return_lse", "false")),
            "SplitKV": int(f.get("-split_kv", "1")),
            "SlidingWindowLookBack": int(f.get("-sliding_window_lookback", "-1")),
            "WithAttnScale": _bool(f.get("-with-attn-scale", "false")),
            "WithAttnBias": _bool(f.get("-with-attn-bias", "false")),
            "TransBias": _bool(f.get("-transBias", "false")),
            "G": g,
            "SeqLenQ": sq,
            "SeqLenK": sk,
            "NumHeadsQ": hq,
            "NumHeadsKV": hkv,
            "HeadDimQK": dqk,
            "HeadDimV": dv,
        }
    )
    return row, flops


# What the stand-in can "tune" (fusion: as one of them): the ops it describes. A new op it should
# tune is its columns (debug_columns) and a describer here (docs/adding-an-op.md).
_DESCRIBE = {"conv": _describe_conv, "gemm": _describe_gemm, "attention": _describe_attention}
TUNED_OPS = tuple(_DESCRIBE)


def with_chiplets(problem: dict, gpu: common.Gpu) -> dict:
    """E3's table_entry: numChiplets right after numCU."""
    entry = {}
    for name, value in problem.items():
        entry[name] = value
        if name == "numCU":
            entry["numChiplets"] = gpu.num_chiplets
    return entry


def e4_gemm_entry(entry: dict) -> dict:
    """GEMM_TEST_PARAMETERS of reportUtils 046da074: TransO after TransB."""
    out = {}
    for name, value in entry.items():
        out[name] = value
        if name == "TransB":
            out["TransO"] = entry.get("TransO", False)
    return out


# perfRunner's GemmConfiguration.from_command_line at rocMLIR 3fc5be9e: its flags, its required.
E3_GEMM_FLAGS = ("-t", "-g", "-m", "-k", "-n", "-transA", "-transB", "-out_datatype",
                 "-perf_config", "-perf_priority", "-scale_a_dtype", "-scale_b_dtype",
                 "-transScaleA", "-transScaleB")  # fmt: skip
E3_GEMM_REQUIRED = ("-t", "-out_datatype", "-g", "-m", "-k", "-n", "-transA", "-transB")


def e3_check_gemm(config: str, from_file: bool) -> None:
    """The real tool canonicalizes every line before tuning any: one it cannot parse is a
    ValueError traceback, exit 1, nothing tuned (no rows, no .state). With -c, the tool's own
    expansion supplies -out_datatype/-transA/-transB first."""
    tokens = config.split()
    pairs = dict(zip(tokens[::2], tokens[1::2], strict=False))
    why = None
    for opt, val in pairs.items():
        if opt != "-scaledGemm" and opt not in E3_GEMM_FLAGS:
            why = f"Unknown GEMM config argument {opt} -> {val}"
            break
    missing = [f for f in E3_GEMM_REQUIRED if f not in pairs]
    if from_file:
        missing = [f for f in missing if f not in ("-out_datatype", "-transA", "-transB")]
    if why is None and missing:
        why = "Incomplete GEMM configuration"
    if why is None:
        return
    error = f"Failed to parse '{config}' as GemmConfiguration: {why}"
    if from_file:
        source = "/tmp/tuning_configs_fake.txt"
        error = f"Failed to canonicalize config from {source} '{config}': {error}"
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "tuningRunner.py", line 2165, in main', file=sys.stderr)
    print(f"ValueError: {error}", file=sys.stderr)
    sys.exit(1)


E4_GEMM_VALUE_FLAGS = ("-t", "-out_datatype", "-transA", "-transB", "-transO", "-g", "-m")
E4_GEMM_VALUE_FLAGS += ("-n", "-k")


def e4_gemm_canonical(config: str) -> str:
    """perfRunner eb003bed's GemmConfiguration.from_command_line then to_command_line: -transO
    false unless given, always printed after -transB; ValueError as the real parser raises."""
    tokens = config.split()
    values: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        if i + 1 >= len(tokens):
            raise ValueError(f"Missing value for argument {tokens[i]}")
        opt, val = tokens[i], tokens[i + 1]
        if opt not in E4_GEMM_VALUE_FLAGS and opt != "-perf_config":
            raise ValueError(f"Unknown GEMM config argument {opt} -> {val}")
        values[opt] = val
        i += 2
    if any(f not in values for f in E4_GEMM_VALUE_FLAGS if f != "-transO"):
        raise ValueError("Incomplete GEMM configuration")

    def b(flag: str) -> str:
        return "true" if values.get(flag, "false").lower() in ("1", "true") else "false"

    return (
        f"-t {values['-t']} -out_datatype {values['-out_datatype'].lower()} "
        f"-transA {b('-transA')} -transB {b('-transB')} -transO {b('-transO')} "
        f"-g {int(values['-g'])} -m {int(values['-m'])} -n {int(values['-n'])} "
        f"-k {int(values['-k'])}"
    )


def e4_key(op: str, config: str) -> str:
    """The key the tool canonicalizes a config to (its perfRunner's to_command_line): gemm in
    perfRunner's own form; the stand-in trusts the other ops' lines to be canonical already."""
    if op == "gemm":
        # kept verbatim when it cannot be parsed, as canonicalize_configs does: it fails later
        with contextlib.suppress(ValueError):
            config = e4_gemm_canonical(config)
    return config


def e4_expand_gemm(lines: list[str]) -> list[str]:
    """get_gemm_configurations for lines that give -t, -out_datatype, -transA and -transB: a
    line without `-transO ` becomes two configs, -transO false and -transO true (after the
    line's other flags are in; order: -transO false's of every line, then true's)."""
    configs: list[str] = []
    for trans_o in ("false", "true"):
        for line in lines:
            one = line if "-transO " in line else f"-transO {trans_o} {line}"
            if one not in configs:
                configs.append(one)
    return configs
