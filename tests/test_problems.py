"""mlirtuna.problems: parsing, canonical strings, expansion and flops (no database)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mlirtuna import keys, problems
from mlirtuna.errors import InputError, UserError
from mlirtuna.problems import (
    AttentionProblem,
    ConvProblem,
    ExpandOptions,
    GemmProblem,
    expand,
    expand_problems,
    from_columns,
    parse,
    problem_class,
)

DATA = Path(__file__).parent / "data"
# The ops of tier1 lists with a tier1-<op>-configs file here; gemm_gemm, conv_gemm and fusion
# have their own tests (test_fused_problems.py).
OPS = ("conv", "gemm", "attention")

# Literal from rocMLIR's perfRunner tests (reference §2b).
CONV_LITERAL = (
    "convfp16 -F 1 -f NCHW -I NCHW -O NCHW -n 256 -c 1024 -H 14 -W 14 -k 256 -y 1 -x 1 "
    "-p 0 -q 0 -u 1 -v 1 -l 1 -j 1 -m conv -g 1 -t 1"
)
GEMM_LITERAL = "-t f16 -out_datatype f16 -transA false -transB false -g 1 -m 1024 -n 512 -k 769"
ATTENTION_LITERAL = (
    "-t f16 -transQ false -transK false -transV false -transO false -causal false "
    "-return_lse false -split_kv 1 -g 1 -seq_len_q 256 -seq_len_k 256 -num_heads_q 8 "
    "-num_heads_kv 8 -head_dim_qk 64 -head_dim_v 64 -with-attn-scale false -with-attn-bias false"
)
BARE_CONV = "-n 1 -c 32 -H 28 -W 28 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1"
FULL_CONV = "-F 1 -f NCHW -I NCHW -O NCHW " + BARE_CONV


def config_lines(op: str) -> list[str]:
    lines = (DATA / f"tier1-{op}-configs").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


# --- canonical strings -------------------------------------------------------------------------


def test_reference_literals_are_canonical() -> None:
    assert parse("conv", CONV_LITERAL).canonical() == CONV_LITERAL
    assert parse("gemm", GEMM_LITERAL).canonical() == GEMM_LITERAL
    # The newest perfRunner appends -transBias to the test's literal.
    assert (
        parse("attention", ATTENTION_LITERAL).canonical() == ATTENTION_LITERAL + " -transBias false"
    )


def test_tuning_key_form_gains_the_miopen_trailers() -> None:
    key = (
        "convfp16 -F 1 -f GNC01 -I NGC01 -O NGC01 -n 64 -c 256 -H 20 -W 20 -k 256 -y 7 -x 7 "
        "-p 3 -q 3 -u 1 -v 1 -l 1 -j 1 -g 256"
    )
    assert parse("conv", key).canonical() == key.replace("-g 256", "-m conv -g 256 -t 1")


def test_e2_attention_line_gets_newest_form() -> None:
    line = (
        "-t f16 -transQ false -transK true -transV false -transO false -g 12 -seq_len_q 384 "
        "-seq_len_k 384 -head_dim_qk 64 -head_dim_v 64 -with-attn-scale False"
    )
    assert parse("attention", line).canonical() == (
        "-t f16 -transQ false -transK true -transV false -transO false -causal false "
        "-return_lse false -split_kv 1 -g 12 -seq_len_q 384 -seq_len_k 384 -num_heads_q 1 "
        "-num_heads_kv 1 -head_dim_qk 64 -head_dim_v 64 -with-attn-scale false "
        "-with-attn-bias false -transBias false"
    )


def test_gemm_trans_o_defaults_false_and_is_spelled_only_when_true() -> None:
    plain = parse("gemm", GEMM_LITERAL)
    assert plain.trans_o is False and plain.canonical() == GEMM_LITERAL
    # `-transO false` names the same problem as no -transO (one gemm problem, every key form)
    spelled = GEMM_LITERAL.replace("-transB false", "-transB false -transO 0")
    assert parse("gemm", spelled) == plain
    with_o = GEMM_LITERAL.replace("-transB false", "-transB false -transO TRUE")
    problem = parse("gemm", with_o)
    assert problem.trans_o is True
    assert problem.canonical() == with_o.replace("TRUE", "true")


def test_gemm_e4_spelling_round_trips_to_the_stored_vector() -> None:
    e4 = keys.e4_vector("gemm", GEMM_LITERAL)
    assert e4 == GEMM_LITERAL.replace("-transB false", "-transB false -transO false")
    assert keys.stored_vector(e4, "gemm") == GEMM_LITERAL == problems.stored_vector(e4)
    assert problems.stored_vector(f"{e4} -supportsSplitK true") == GEMM_LITERAL
    transposed = parse("gemm", e4.replace("-transO false", "-transO true")).canonical()
    assert keys.e4_vector("gemm", transposed) == transposed == problems.stored_vector(transposed)
    attention = parse("attention", ATTENTION_LITERAL).canonical()
    assert keys.e4_vector("attention", attention) == attention  # already spells -transO


def test_booleans_any_case_and_digits() -> None:
    line = GEMM_LITERAL.replace("-transA false", "-transA 1").replace(
        "-transB false", "-transB True"
    )
    problem = parse("gemm", line)
    assert (problem.trans_a, problem.trans_b) == (True, True)
    assert "-transA true -transB true" in problem.canonical()


@pytest.mark.parametrize("layout", ["N01GC", "GNC01", "01NGC", "NGC01", "G0NC1", "NHWC", "GN01C"])
def test_layouts_survive_round_trip(layout: str) -> None:
    line = f"conv -F 1 -f {layout} -I {layout} -O {layout} " + BARE_CONV
    problem = parse("conv", line)
    assert (problem.fil_layout, problem.in_layout, problem.out_layout) == (layout,) * 3
    assert parse("conv", problem.canonical()) == problem
    assert f"-f {layout} -I {layout} -O {layout} " in problem.canonical()


def test_lowercase_layout_is_upper_cased() -> None:
    problem = parse("conv", "conv -F 1 -f nchw -I nhwc -O nchw " + BARE_CONV)
    assert (problem.fil_layout, problem.in_layout, problem.out_layout) == ("NCHW", "NHWC", "NCHW")


def test_mixed_fp8_prefix_round_trips_with_operand_types() -> None:
    problem = parse("conv", "convfp8_bf8 " + FULL_CONV)
    assert (problem.data_type, problem.in_data_type, problem.fil_data_type) == (
        "fp8_bf8",
        "fp8",
        "bf8",
    )
    assert problem.out_data_type == "f32"
    assert problem.canonical().startswith("convfp8_bf8 -F 1 ")
    assert parse("conv", problem.canonical()) == problem


@pytest.mark.parametrize(
    ("prefix", "types"),
    [
        ("conv", ("f32", "f32", "f32", "f32")),
        ("convfp16", ("f16", "f16", "f16", "f16")),
        ("convbfp16", ("bf16", "bf16", "bf16", "bf16")),
        ("convint8", ("i8", "i8", "i8", "i32")),
        ("convfp8", ("fp8", "fp8", "fp8", "f32")),
        ("convfp8_fp8", ("fp8_fp8", "fp8", "fp8", "f32")),
        ("convbf8_fp8", ("bf8_fp8", "bf8", "fp8", "f32")),
        ("convbf8_bf8", ("bf8_bf8", "bf8", "bf8", "f32")),
    ],
)
def test_conv_prefixes(prefix: str, types: tuple[str, ...]) -> None:
    problem = parse("conv", f"{prefix} {FULL_CONV}")
    assert (
        problem.data_type,
        problem.in_data_type,
        problem.fil_data_type,
        problem.out_data_type,
    ) == types
    assert problem.canonical().split()[0] == prefix


def test_conv_without_prefix_is_f32_and_defaults_fill_in() -> None:
    problem = parse("conv", "-F 4 -f NCHW -I NCHW -O NCHW -n 2 -c 8 -H 9 -W 9 -k 4 -y 3 -x 3")
    assert (problem.data_type, problem.direction) == ("f32", "wrw")
    assert (problem.pad_h, problem.conv_stride_w, problem.dilation_h, problem.group_size) == (
        0,
        1,
        1,
        1,
    )
    assert problem.canonical().startswith("conv -F 4 ")


# --- round trips over real config lists ---------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_round_trip_every_tier1_expansion(op: str) -> None:
    count = 0
    for line in config_lines(op):
        for problem in expand_problems(op, line):
            text = problem.canonical()
            again = parse(op, text)
            assert again == problem
            assert again.canonical() == text
            assert from_columns(op, problem.columns()) == problem
            count += 1
    assert count > 0


def test_columns_are_the_dataclass_fields() -> None:
    for op in OPS:
        cls = problem_class(op)
        assert cls.op == op
        problem = expand_problems(op, config_lines(op)[0])[0]
        assert list(problem.columns()) == [f.name for f in dataclasses.fields(cls)]
    assert list(parse("conv", CONV_LITERAL).columns()) == [
        "data_type", "in_data_type", "fil_data_type", "out_data_type", "direction",
        "fil_layout", "in_layout", "out_layout", "spatial_dim", "in_channels", "in_h", "in_w",
        "fil_h", "fil_w", "out_channels", "batchsize", "pad_h", "pad_w", "conv_stride_h",
        "conv_stride_w", "dilation_h", "dilation_w", "group_size", "kernel_repeats",
    ]  # fmt: skip


def test_from_columns_ignores_extra_keys_and_validates() -> None:
    problem = parse("gemm", GEMM_LITERAL)
    assert from_columns("gemm", {**problem.columns(), "id": 7}) == problem
    with pytest.raises(InputError, match=r"^-m: expected an integer >= 1, got 0$"):
        from_columns("gemm", {**problem.columns(), "m": 0})
    with pytest.raises(InputError, match="unknown data type 'f64'"):
        from_columns("gemm", {**problem.columns(), "data_type": "f64"})


# --- expansion ----------------------------------------------------------------------------------


def test_conv_bare_line_expands_over_directions_types_layouts() -> None:
    problems = expand_problems("conv", BARE_CONV)
    # 3 directions x (f32, bf16, f16) x 2 layouts + fwd x (fp8, i8) x 2 layouts
    assert len(problems) == 3 * 3 * 2 + 1 * 2 * 2 == 22
    combos = {(p.direction, p.data_type) for p in problems}
    assert ("fwd", "i8") in combos and ("fwd", "fp8") in combos
    assert not any(d != "fwd" and t in ("i8", "fp8") for d, t in combos)
    assert {(p.fil_layout, p.in_layout, p.out_layout) for p in problems} == {
        ("NHWC",) * 3,
        ("NCHW",) * 3,
    }
    assert len({p.canonical() for p in problems}) == 22


def test_conv_miopen_style_line_with_trailers() -> None:
    line = (
        "-n 256 -c 1024 -H 14 -W 14 -k 2048 -y 1 -x 1 -p 0 -q 0 -u 2 -v 2 -l 1 -j 1 -g 1 "
        "-m conv -t 1"
    )
    assert len(expand("conv", line)) == 22


def test_conv_expansion_keeps_what_the_line_says() -> None:
    # -F 2 given: the int8/fp8 combinations are dropped, layouts still expand.
    assert len(expand_problems("conv", "-F 2 " + BARE_CONV)) == 3 * 2
    # prefix given, -F missing: int8 is forward only.
    int8 = expand_problems("conv", "convint8 " + BARE_CONV)
    assert [(p.direction, p.data_type) for p in int8] == [("fwd", "i8")] * 2
    # both given: kept as written, even int8 backward.
    assert len(expand_problems("conv", "convint8 -F 2 -f NCHW -I NCHW -O NCHW " + BARE_CONV)) == 1
    # -f given, -I/-O filled in.
    mixed = expand_problems("conv", "conv -F 1 -f GNC01 " + BARE_CONV)
    assert [(p.fil_layout, p.in_layout) for p in mixed] == [("GNC01", "NHWC"), ("GNC01", "NCHW")]


def test_conv_expansion_options() -> None:
    options = ExpandOptions(
        data_types=("f16", "convint8"), directions=("1", "wrw"), layouts=("nhwc",)
    )
    problems = expand_problems("conv", BARE_CONV, options)
    assert [(p.direction, p.data_type, p.in_layout) for p in problems] == [
        ("fwd", "f16", "NHWC"),
        ("fwd", "i8", "NHWC"),
        ("wrw", "f16", "NHWC"),
    ]


def test_options_accept_any_sequence() -> None:
    assert ExpandOptions(data_types=["f16"], layouts="NHWC") == ExpandOptions(
        data_types=("f16",), layouts=("NHWC",)
    )
    assert len(expand("gemm", "-g 1 -m 2 -n 2 -k 2", ExpandOptions(data_types=["i8"]))) == 4


def test_no_expand_takes_the_line_as_written() -> None:
    options = ExpandOptions(expand=False)
    assert expand("conv", FULL_CONV, options) == [parse("conv", FULL_CONV).canonical()]
    with pytest.raises(InputError, match="missing required flag -F"):
        expand("conv", BARE_CONV, options)
    with pytest.raises(InputError, match="missing required flag -t"):
        expand("gemm", "-transA 0 -transB 0 -g 1 -m 2 -n 2 -k 2", options)


def test_gemm_line_without_type_and_transposes() -> None:
    problems = expand_problems("gemm", "-g 1 -m 384 -n 2304 -k 768")
    assert len(problems) == 5 * 2 * 2 == 20  # f32 f16 bf16 i8 fp8 x transA x transB
    outs = {p.data_type: p.out_data_type for p in problems}
    assert outs == {"f32": "f32", "f16": "f16", "bf16": "bf16", "i8": "i32", "fp8": "f32"}
    assert {(p.trans_a, p.trans_b) for p in problems} == {
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    }
    assert not any(p.trans_o for p in problems)  # a line without -transO is -transO false


def test_gemm_out_type_follows_the_lines_own_type() -> None:
    problems = expand_problems("gemm", "-t i8 -transA false -g 1 -m 8 -n 8 -k 8")
    assert [(p.data_type, p.out_data_type, p.trans_b) for p in problems] == [
        ("i8", "i32", False),
        ("i8", "i32", True),
    ]
    only = ExpandOptions(data_types=("bf16",))
    assert expand("gemm", "-transA 0 -transB 1 -g 2 -m 3 -n 4 -k 5", only) == [
        "-t bf16 -out_datatype bf16 -transA false -transB true -g 2 -m 3 -n 4 -k 5"
    ]


def test_attention_line_without_type_and_transposes() -> None:
    line = "-g 2 -seq_len_q 64 -seq_len_k 64 -head_dim_qk 32 -head_dim_v 32"
    problems = expand_problems("attention", line)
    assert len(problems) == 4 * 2**4 == 64  # i8 f32 f16 bf16 x transQ/K/V/O
    assert {p.data_type for p in problems} == {"i8", "f32", "f16", "bf16"}
    assert not any(p.causal or p.return_lse or p.with_attn_scale or p.trans_bias for p in problems)
    assert len(expand("attention", "-t f16 -transQ true " + line)) == 8


# --- tier1 totals with default options ----------------------------------------------------------


@pytest.mark.parametrize(("op", "lines", "problems"), [
    ("conv", 96, 96 * 5),  # every line has -F 1 -f -I -O, no prefix: 5 data types
    ("gemm", 230, 172),  # fully specified; 58 lines repeat an earlier one
    ("attention", 28, 28),  # fully specified
])  # fmt: skip
def test_tier1_totals(op: str, lines: int, problems: int) -> None:
    read = config_lines(op)
    assert len(read) == lines
    unique = {p for line in read for p in expand(op, line)}
    assert len(unique) == problems


# --- flops --------------------------------------------------------------------------------------


def test_conv_flops() -> None:
    assert parse("conv", CONV_LITERAL).flops() == 2 * 256 * 1024 * 256 * 14 * 14 * 1 * 1
    # stride 2, pad 1, 3x3 on 640x640: Ho = Wo = (640 + 2 - 2 - 1) // 2 + 1 = 320
    strided = "conv -F 1 -f NCHW -I NCHW -O NCHW -n 1 -c 3 -H 640 -W 640 -k 16 -y 3 -x 3 -p 1 -q 1 "
    problem = parse("conv", strided + "-u 2 -v 2 -l 1 -j 1 -g 1")
    assert problem.out_size() == (320, 320)
    assert problem.flops() == 2 * 1 * 3 * 16 * 320 * 320 * 9
    bwd = parse("conv", strided.replace("-F 1", "-F 2") + "-u 2 -v 2 -l 1 -j 1 -g 1")
    assert bwd.flops() == problem.flops()
    # depthwise: C/G = 1; dilation 2 makes the 3x3 filter span 5: Ho = 28 - 5 + 1 = 24
    grouped = (
        "conv -F 1 -f GNC01 -I NGC01 -O NGC01 -n 2 -c 32 -H 28 -W 28 -k 32 -y 3 -x 3 "
        "-l 2 -j 2 -g 32"
    )
    assert parse("conv", grouped).flops() == 2 * 2 * 1 * 32 * 24 * 24 * 9


def test_gemm_and_attention_flops() -> None:
    assert parse("gemm", GEMM_LITERAL).flops() == 2 * 1 * 1024 * 769 * 512
    gqa = (
        "-t f16 -g 2 -seq_len_q 16 -seq_len_k 32 -num_heads_q 8 -num_heads_kv 2 "
        "-head_dim_qk 64 -head_dim_v 32"
    )
    batches = 2 * 8
    expected = 2 * batches * 16 * 64 * 32 + 2 * batches * 16 * 32 * 32
    assert parse("attention", gqa).flops() == expected == 1572864


# --- bad lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "line", "message"),
    [
        ("conv", FULL_CONV + " -z 1", "unknown flag -z for conv"),
        ("conv", FULL_CONV.replace("-n 1", "-n abc"), "-n: expected an integer, got 'abc'"),
        ("conv", FULL_CONV.replace(" -k 64", ""), "missing required flag -k"),
        ("conv", "convf64 " + FULL_CONV, "unknown data type prefix 'convf64' (known: conv, "),
        ("conv", FULL_CONV.replace("-F 1", "-F 3"), "-F: expected 1 (fwd), 2 (bwd) or 4 (wrw)"),
        ("conv", FULL_CONV + " -m trans", "-m: only 'conv' is supported, got 'trans'"),
        ("conv", FULL_CONV + " -t f16", "-t: expected 0 or 1 (MIOpenDriver's timing flag;"),
        ("conv", FULL_CONV.replace("-f NCHW", "-f NCXW"), "-f: bad layout 'NCXW'"),
        ("conv", FULL_CONV.replace("-g 1", "-g 3"), "-g: -c 32 and -k 64 must both be divisible"),
        ("conv", FULL_CONV.replace("-H 28", "-H 1").replace("-p 1", "-p 0"), "output size"),
        ("conv", FULL_CONV.replace("-p 1", "-p -1"), "-p: expected an integer >= 0, got -1"),
        ("conv", FULL_CONV + " -n 2", "-n: given twice"),
        ("conv", FULL_CONV + " -g", "-g: missing value"),
        ("gemm", GEMM_LITERAL.replace("f16", "f64", 1), "-t: unknown data type 'f64' (known: f32"),
        ("gemm", GEMM_LITERAL + " -scaledGemm", "scaled gemm is not supported yet"),
        ("gemm", GEMM_LITERAL.replace("-transA false", "-transA yes"), "-transA: expected true"),
        ("gemm", GEMM_LITERAL.replace(" -k 769", ""), "missing required flag -k"),
        ("gemm", GEMM_LITERAL + " -transQ false", "unknown flag -transQ for gemm"),
        ("attention", ATTENTION_LITERAL + " -transBias true", "-transBias true needs"),
        (
            "attention",
            ATTENTION_LITERAL.replace("-t f16", "-t fp8"),
            "-t: unknown data type 'fp8' (known: i8, f32, f16, bf16)",
        ),
    ],
)
def test_bad_lines(op: str, line: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse(op, line)
    assert str(caught.value).startswith(message)
    with pytest.raises(InputError):
        expand(op, line)


def test_unknown_op_and_options_are_user_errors() -> None:
    # problems.OPS's order: config-list ops, then module ops, each alphabetical.
    known = r"\(known: attention, conv, conv_gemm, gemm, gemm_gemm, fusion\)"
    with pytest.raises(UserError, match=r"unknown op 'winograd' " + known):
        parse("winograd", GEMM_LITERAL)
    with pytest.raises(UserError, match=r"unknown gemm data type 'f64' \(known: f32, f16, "):
        expand("gemm", GEMM_LITERAL, ExpandOptions(data_types=("f64",)))
    with pytest.raises(UserError, match="unknown direction 'up'"):
        expand("conv", BARE_CONV, ExpandOptions(directions=("up",)))
    with pytest.raises(UserError, match="bad layout 'NXHW'"):
        expand("conv", BARE_CONV, ExpandOptions(layouts=("NXHW",)))


def test_problem_classes() -> None:
    assert problem_class("conv") is ConvProblem
    assert problem_class("gemm") is GemmProblem
    assert problem_class("attention") is AttentionProblem
    problem = parse("gemm", GEMM_LITERAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.m = 2  # type: ignore[misc]
