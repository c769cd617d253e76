"""gemm_gemm, conv_gemm and fusion problems: parsing, canonical strings, expansion, flops, the
MIGraphX reader and fusion tuning keys (no database)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.perfrunner_keys import read_key

from mlirtuna.errors import InputError
from mlirtuna.problems import expand, expand_problems, from_columns, parse, problem_class
from mlirtuna.problems import fusion as fusion_problems
from mlirtuna.problems.configlist import read_config_list
from mlirtuna.problems.migraphx import read_module

DATA = Path(__file__).parent / "data"
FUSION = DATA / "fusion"
MODULES = sorted(FUSION.glob("*/*.mlir"))

# Literals from rocMLIR's perfRunner split-K tests (newest perfRunner's to_command_line).
GEMM_GEMM_LITERAL = (
    "-t f16 -transA false -transB false -transC false -transO false -g 1 -m 64 -k 64 -n 64 "
    "-gemmO 32"
)
CONV_GEMM_LITERAL = (
    "-t f16 -f GNC01 -I NGC01 -transC false -transO false -n 1 -c 8 -H 16 -W 16 -k 16 -y 3 "
    "-x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1 -gemmO 32"
)
CONV_GEMM_SIZES = "-n 1 -c 8 -H 16 -W 16 -k 16 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1"


def test_literals_are_canonical() -> None:
    assert parse("gemm_gemm", GEMM_GEMM_LITERAL).canonical() == GEMM_GEMM_LITERAL
    assert parse("conv_gemm", CONV_GEMM_LITERAL).canonical() == CONV_GEMM_LITERAL


def test_gemm_gemm_flag_order_and_defaults() -> None:
    # rocmlir-gen prints -m -n -k; perfRunner's canonical form is -m -k -n, trans flags false.
    p = parse("gemm_gemm", "-t F32 -g 2 -m 7 -n 9 -k 3 -gemmO 5 -transB 1")
    assert p.canonical() == (
        "-t f32 -transA false -transB true -transC false -transO false -g 2 -m 7 -k 3 -n 9 -gemmO 5"
    )


def test_every_tier1_gemmgemm_line_round_trips() -> None:
    lines = [x for x in (DATA / "tier1-gemmgemm-configs").read_text().splitlines() if x.strip()]
    assert len(lines) == 14
    for line in lines:
        problem = parse("gemm_gemm", line)
        assert parse("gemm_gemm", problem.canonical()) == problem
        assert from_columns("gemm_gemm", problem.columns()) == problem
        # tier1 lines spell every flag but in -m -n -k order: only the order changes.
        assert sorted(problem.canonical().split()) == sorted(line.split())
        assert expand("gemm_gemm", line) == [problem.canonical()]


def test_conv_gemm_round_trips_every_expansion() -> None:
    problems = expand_problems("conv_gemm", CONV_GEMM_SIZES + " -gemmO 32")
    for problem in problems:
        assert parse("conv_gemm", problem.canonical()) == problem
        assert from_columns("conv_gemm", problem.columns()) == problem


@pytest.mark.parametrize(
    ("op", "line", "count"),
    [
        # 3 types x 2^4 trans flags
        ("gemm_gemm", "-g 1 -m 4 -k 4 -n 4 -gemmO 4", 48),
        ("gemm_gemm", "-t f16 -g 1 -m 4 -k 4 -n 4 -gemmO 4", 16),
        ("gemm_gemm", "-t f16 -transA true -transC false -g 1 -m 4 -k 4 -n 4 -gemmO 4", 4),
        ("gemm_gemm", GEMM_GEMM_LITERAL, 1),
        # 3 types x 2 filter layouts x 2 input layouts x 2 x 2 trans flags
        ("conv_gemm", CONV_GEMM_SIZES + " -gemmO 32", 48),
        ("conv_gemm", "-t bf16 -f NCHW " + CONV_GEMM_SIZES + " -gemmO 32", 8),
        ("conv_gemm", CONV_GEMM_LITERAL, 1),
    ],
)
def test_expansion_counts(op: str, line: str, count: int) -> None:
    got = expand(op, line)
    assert len(got) == len(set(got)) == count


def test_expansion_order_is_type_then_flags() -> None:
    got = expand("gemm_gemm", "-g 1 -m 4 -k 4 -n 4 -gemmO 4")
    assert got[0].startswith("-t f32 -transA false -transB false -transC false -transO false")
    assert got[1].startswith("-t f32 -transA false -transB false -transC false -transO true")
    assert got[16].startswith("-t f16 ")


def test_flops() -> None:
    p = parse("gemm_gemm", "-t f32 -g 2 -m 3 -k 5 -n 7 -gemmO 11")
    assert p.flops() == 2 * 2 * 3 * 5 * 7 + 2 * 2 * 3 * 7 * 11
    # conv 16x16, 3x3 pad 1 -> 16x16 output; second GEMM over all K channels (perfRunner).
    q = parse("conv_gemm", CONV_GEMM_LITERAL)
    assert q.flops() == 2 * 1 * 8 * 16 * 16 * 16 * 3 * 3 + 2 * (16 * 16) * 16 * 32
    g = parse("conv_gemm", CONV_GEMM_LITERAL.replace("-g 1", "-g 2"))
    assert g.flops() == 2 * 1 * 4 * 16 * 16 * 16 * 3 * 3 + 2 * (16 * 16) * 16 * 32


@pytest.mark.parametrize(
    ("op", "line", "message"),
    [
        ("gemm_gemm", "-t f32 -g 1 -m 4 -k 4 -n 4", "missing required flag -gemmO"),
        ("gemm_gemm", "-t i8 -g 1 -m 4 -k 4 -n 4 -gemmO 4", "unknown data type 'i8'"),
        ("gemm_gemm", "-t f32 -g 1 -m 4 -k 4 -n 4 -gemmO 4 -out_datatype f32", "unknown flag"),
        ("conv_gemm", "-t f32 -f NCHW -I NCHW -n 1 -c 8 -H 16 -W 16 -k 16 -y 3 -x 3 -gemmO 3",
         "missing required flag -p"),
        ("conv_gemm", CONV_GEMM_LITERAL.replace("-f GNC01", "-f NCQW"), "-f: bad layout"),
        ("conv_gemm", CONV_GEMM_LITERAL.replace("-c 8", "-c 9").replace("-g 1", "-g 2"),
         "divisible"),
    ],
)  # fmt: skip
def test_bad_lines(op: str, line: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        parse(op, line)


def test_bad_line_in_a_list_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "gg"
    path.write_text("# models\n" + GEMM_GEMM_LITERAL + "\n-t f32 -g 1 -m 4\n")
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:3: missing required flag"):
        read_config_list(str(path), "gemm_gemm")


def test_fusion_is_not_a_config_line() -> None:
    with pytest.raises(InputError, match=r"are \.mlir modules"):
        parse("fusion", GEMM_GEMM_LITERAL)
    assert problem_class("fusion").op == "fusion"


# --- fusion modules -----------------------------------------------------------------------------


def _operands(text: str, function: str) -> tuple[str, list[list[int]], str]:
    """Independently of mlirtuna: the anchor op name and its operand shapes, by regex."""
    args = {}
    body = text.split(f"@{function}(", 1)[1]
    for name, shape in re.findall(r"(%arg\d+): tensor<([0-9x]+)x[a-z]+\d+>", body.split("{")[0]):
        args[name] = [int(d) for d in shape.split("x")]
    anchor = re.search(r'"?migraphx\.(\w*convolution|\w*dot)"?\s*\(?(%\w+), (%\w+)', body)
    assert anchor, function
    return anchor.group(1), [args[anchor.group(2)], args[anchor.group(3)]], body


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_module_has_a_key_perfrunner_reads(path: Path) -> None:
    text = path.read_text()
    problem = fusion_problems.from_module(text, path.name)
    kind, fields = read_key(problem.tuning_key)
    name, (a, b), _ = _operands(text, problem.function)
    if name.endswith("convolution"):
        assert kind == "conv"
        n, c, h, w = a
        k, _, y, x = b
        assert (fields["n"], fields["c"], fields["hi"], fields["wi"]) == (n, c, h, w)
        assert (fields["k"], fields["y"], fields["x"]) == (k, y, x)
        assert fields["direction"] == 1 and fields["group"] == 1
    else:
        assert kind == "gemm"
        assert (fields["m"], fields["k"]) == tuple(a[-2:])
        assert (fields["k"], fields["n"]) == tuple(b[-2:])
    assert problem.flops() > 0
    assert problem.canonical() == "sha256:" + problem.sha256 and len(problem.sha256) == 64
    assert from_columns("fusion", problem.columns()) == problem


def test_function_under_test_comes_from_fut() -> None:
    text = (FUSION / "mixr-gemm" / "mixr-gemm-add.e2e.mlir").read_text()
    assert read_module(text, "x").function_under_test() == "dot_add"
    extra = (
        "func.func @first(%arg0: tensor<2x2xf32>) -> tensor<2x2xf32> {\n"
        "  return %arg0 : tensor<2x2xf32>\n}\n"
    )
    problem = fusion_problems.from_module(text.replace("module {", "module {\n" + extra), "y.mlir")
    assert problem.function == "dot_add"  # -fut wins over the first func.func


def test_conv_key_attributes() -> None:
    problem = fusion_problems.from_module(
        (FUSION / "resnet50" / "mixr-resnet-fusion-case-2.mlir").read_text(), "c2.mlir"
    )
    assert problem.tuning_key == (
        "conv -F 1 -f GNC01 -I NGC01 -O NGC01 -n 1 -c 256 -H 28 -W 28 -k 256 -y 3 -x 3 "
        "-p 1 -q 1 -u 2 -v 2 -l 1 -j 1 -m conv -g 1 -t 1"
    )
    int8 = fusion_problems.from_module(
        (FUSION / "resnet50" / "mixr-resnet-fusion-case-1-int8.mlir").read_text(), "i8.mlir"
    )
    assert int8.tuning_key.startswith("convint8 ")


DOT_T = """\
func.func @f(%arg0: tensor<2x4x5xf16>, %arg1: tensor<2x3x4xf16>) -> tensor<2x5x3xf16> {
  %0 = migraphx.transpose(%arg0) {permutation = [0, 2, 1]}: (tensor<2x4x5xf16>) -> tensor<2x5x4xf16>
  %1 = migraphx.transpose(%arg1) {permutation = [0, 2, 1]}: (tensor<2x3x4xf16>) -> tensor<2x4x3xf16>
  %2 = migraphx.dot(%0, %1) : (tensor<2x5x4xf16>, tensor<2x4x3xf16>) -> tensor<2x5x3xf16>
  %3 = migraphx.sigmoid(%2) : (tensor<2x5x3xf16>) -> tensor<2x5x3xf16>
  return %3 : tensor<2x5x3xf16>
}
"""


def test_transposes_feeding_a_dot_set_trans_flags() -> None:
    problem = fusion_problems.from_module(DOT_T, "t.mlir")
    assert problem.tuning_key == (
        "-t f16 -out_datatype f16 -transA true -transB true -g 2 -m 5 -n 3 -k 4"
    )


@pytest.mark.parametrize(
    ("replace", "message", "line"),
    [
        (("migraphx.sigmoid", "migraphx.softmax"), "op migraphx.softmax is not one", 5),
        (("%3 = migraphx.sigmoid", "%3 = tosa.sigmoid"), "op tosa.sigmoid is not one", 5),
        (("%2 = migraphx.dot(%0, %1)", "%2 = migraphx.add(%0, %0)"), "nothing to tune", 1),
    ],
)
def test_unreadable_modules_are_file_line_errors(replace, message: str, line: int) -> None:
    with pytest.raises(InputError, match=rf"^t\.mlir:{line}: .*{re.escape(message)}"):
        fusion_problems.from_module(DOT_T.replace(*replace), "t.mlir")


@pytest.mark.parametrize(
    ("emitted", "key"),
    [
        # newest: arch, numCU, numChiplets, problem (no -m conv -t 1; -supportsSplitK)
        ("gfx942\t304\t8\tconvfp16 -F 1 -f GNC01 -I NGC01 -O NGC01 -n 64 -c 256 -H 20 -W 20 "
         "-k 256 -y 7 -x 7 -p 3 -q 3 -u 1 -v 1 -l 1 -j 1 -g 256 -supportsSplitK true\n",
         "convfp16 -F 1 -f GNC01 -I NGC01 -O NGC01 -n 64 -c 256 -H 20 -W 20 -k 256 -y 7 -x 7 "
         "-p 3 -q 3 -u 1 -v 1 -l 1 -j 1 -m conv -g 256 -t 1"),
        # older: arch, numCU, problem
        ("gfx90a\t110\t-t f32 -out_datatype f32 -transA false -transB true -g 1 -m 5 -n 3 -k 4",
         "-t f32 -out_datatype f32 -transA false -transB true -g 1 -m 5 -n 3 -k 4"),
        ("gfx942\t304\t8\t-t f32 -transA false -transB false -transC false -transO false -g 1 "
         "-m 7 -n 7 -k 3 -gemmO 3 -inputFusions=a,b -outputFusions=c -supportsSplitK true",
         "-t f32 -transA false -transB false -transC false -transO false -g 1 -m 7 -k 3 -n 7 "
         "-gemmO 3"),
    ],
)  # fmt: skip
def test_keys_from_rocmlir_gen_both_layouts(emitted: str, key: str) -> None:
    assert fusion_problems.parse_key(emitted)[1] == key


EPILOGUE = """\
// RUN: rocmlir-opt -migraphx-to-tosa %s | rocmlir-driver -host-pipeline highlevel -fut many
func.func @many(%a: tensor<2x6x5xf32>, %b: tensor<2x5x4xf32>, %c: tensor<4xf32>, \
  %d: tensor<2x6x4xf32>) -> tensor<2x4x3x2xf16> {
  %0 = migraphx.dot(%a, %b) : (tensor<2x6x5xf32>, tensor<2x5x4xf32>) -> tensor<2x6x4xf32>
  %1 = migraphx.broadcast(%c) {axis = 2 : i64, out_lens = [2, 6, 4]} \
    : (tensor<4xf32>) -> tensor<2x6x4xf32>
  %2 = migraphx.sub(%0, %1) : (tensor<2x6x4xf32>, tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %3 = migraphx.mul(%2, %d) : (tensor<2x6x4xf32>, tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %4 = migraphx.tanh(%3) : (tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %5 = migraphx.erf(%4) : (tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %6 = migraphx.exp(%5) : (tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %7 = migraphx.sigmoid(%6) : (tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %8 = migraphx.div(%7, %d) : (tensor<2x6x4xf32>, tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %9 = migraphx.clip(%8, %1, %d) \
    : (tensor<2x6x4xf32>, tensor<2x6x4xf32>, tensor<2x6x4xf32>) -> tensor<2x6x4xf32>
  %10 = migraphx.transpose(%9) {permutation = [0, 2, 1]} : (tensor<2x6x4xf32>) -> tensor<2x4x6xf32>
  %11 = migraphx.reshape(%10) {dims = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
  %12 = migraphx.relu(%11) : (tensor<2x4x3x2xf32>) -> tensor<2x4x3x2xf32>
  %13 = migraphx.convert(%12) : (tensor<2x4x3x2xf32>) -> tensor<2x4x3x2xf16>
  return %13 : tensor<2x4x3x2xf16>
}
"""


def test_cpu_fusion_runs_every_epilogue_op_per_tile() -> None:
    """Each tiling computes the module exactly as its unfused float64 reference does."""
    from mlirtuna.tuners.base import TuneContext
    from mlirtuna.tuners.cpu import CpuTuner

    problem = fusion_problems.from_module(EPILOGUE, "many.mlir")
    assert problem.function == "many"
    ctx = TuneContext("cpu", "cpu", 1, 1, "exhaustive", gpu_id=-1)
    outcome = CpuTuner(repeats=1).tune(problem, ctx)
    assert outcome.candidates and all(c.valid for c in outcome.candidates)
    assert any("per-tile epilogue" in note for note in outcome.notes)
