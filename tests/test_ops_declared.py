"""An op is declared once: its OpSpec in problems/<op>.py (issues 32, 46 §2). Its module, the
CLI's help texts, the errors that list ops, the one op-guessing rule, its config table, its
`.debug` columns (read and written through formats/debug.py), its perf-config family and its
`.inc` section all derive from it; problems/ finds the op modules itself (no roster to edit)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from support.clitools import cli
from support.results import new_session, record

from mlirtuna import problems
from mlirtuna.db import models
from mlirtuna.errors import UserError
from mlirtuna.formats import debug
from mlirtuna.history import export, quick
from mlirtuna.history.export import ExportQuery
from mlirtuna.problems.spec import op_modules
from mlirtuna.tuners.base import Candidate
from mlirtuna.tuners.rocmlir.debugfile import matches, parse_debug_lines

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "mlirtuna"
REAL = ROOT / "tests" / "data" / "rocmlir-real"  # rocMLIR 3fc5be9e's own files
DEBUG_OPS = [s.name for s in problems.SPECS if s.debug is not None]
REAL_GPU = debug.Gpu("gfx942", 304, 8)  # what the real runs saw


def real_config(op: str) -> str:
    """The config the real tuningRunner ran for tests/data/rocmlir-real/<op>/."""
    command = (REAL / op / "command.txt").read_text()
    found = re.search(r"--config '([^']+)'", command)
    assert found, command
    return found.group(1)


def real_debug(op: str, name: str = "out.tsv.debug") -> list[list[str]]:
    return [line.split("\t") for line in (REAL / op / name).read_text().splitlines()]


# --- the ops and their specs ----------------------------------------------------------------------


def test_the_ops_are_in_one_order_config_list_ops_then_module_ops():
    """Each alphabetical: the order of every list of ops mlirtuna prints (help, errors)."""
    config_list = sorted(s.name for s in problems.SPECS if s.config_list)
    modules = sorted(s.name for s in problems.SPECS if not s.config_list)
    assert (*config_list, *modules) == problems.OPS
    assert tuple(config_list) == problems.CONFIG_LIST_OPS
    assert [problems.problem_class(op).op for op in problems.OPS] == list(problems.OPS)
    assert [s.name for s in problems.SPECS] == list(problems.OPS)


def test_every_module_with_a_spec_is_an_op():
    """problems/ finds its ops by importing its modules: one that declares a SPEC is an op,
    with nothing else to edit (docs/adding-an-op.md), and the helpers are none."""
    declaring = {
        path.stem
        for path in (SRC / "problems").glob("*.py")
        if re.search(r"^SPEC\b", path.read_text(encoding="utf-8"), re.M)
    }
    assert declaring == set(problems.OPS)


def test_a_new_op_module_is_found_and_a_spec_for_another_name_refused(tmp_path):
    """The discovery itself, over a package of its own: a new module with a SPEC is an op in
    its place in the order; one whose SPEC names another op stops the import."""
    package = tmp_path / "ops_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("HELPER = 1\n")
    for op in ("gemm", "fusion", "conv"):
        (package / f"{op}.py").write_text(f"from mlirtuna.problems.{op} import SPEC\n")
    sys.path.insert(0, str(tmp_path))
    try:
        found = op_modules("ops_probe", [str(package)])
        assert list(found) == ["conv", "gemm", "fusion"]
        (package / "winograd.py").write_text("from mlirtuna.problems.conv import SPEC\n")
        with pytest.raises(ImportError, match=r"problems/winograd.py declares op 'conv'"):
            op_modules("ops_probe", [str(package)])
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.partition(".")[0] == "ops_probe"]:
            del sys.modules[name]


@pytest.mark.parametrize("spec", problems.SPECS, ids=lambda s: s.name)
def test_every_specs_columns_exist_on_its_table(spec):
    model = models.CONFIG_TABLES[spec.name]
    assert model.__tablename__ == spec.table
    table = set(model.__table__.columns.keys())
    assert set(spec.columns) <= table, set(spec.columns) - table
    assert table - set(spec.columns) <= {"id"}  # nothing the problem does not fill


def test_every_op_has_its_cpu_kernel():
    from mlirtuna.tuners.cpu.ops import OPS as KERNELS

    assert set(KERNELS) == set(problems.OPS)


def test_an_unknown_op_lists_the_declared_ones():
    with pytest.raises(UserError, match=re.escape(", ".join(problems.OPS))):
        problems.parse("nosuchop", "-t f32")
    with pytest.raises(UserError, match=re.escape(", ".join(problems.OPS))):
        problems.spec_of("nosuchop")


@pytest.mark.parametrize(
    ("command", "ops"),
    [
        (("run",), problems.OPS),
        (("import",), problems.OPS),
        (("import-tsv",), problems.CONFIG_LIST_OPS),
    ],
)
def test_help_texts_list_the_declared_ops(tmp_path, command, ops):
    shown = cli(f"sqlite:///{tmp_path / 'x.db'}", *command, "--help")
    assert shown.code == 0
    words = re.findall(r"\b(?:" + "|".join(problems.OPS) + r")\b", shown.stdout)
    assert set(ops) <= set(words), (command, words)


# --- the one op-guessing rule ------------------------------------------------------------------


@pytest.mark.parametrize("op", problems.CONFIG_LIST_OPS)
def test_one_rule_tells_each_ops_lines_and_vectors(op):
    line = real_config(op)
    assert problems.op_of(line.split()) == op
    canonical = problems.parse(op, line).canonical()
    assert problems.op_of(canonical.split()) == op
    assert problems.op_of_vector(f"{canonical} -supportsSplitK true") == op


def test_where_the_two_old_rules_disagreed():
    """keys.guess_op and keys.op_of_flags, now one rule (docs/adding-an-op.md): op_of_flags's
    answer won where they differed, and guess_op's `-F` still marks a conv."""
    two_gemms = real_config("gemm_gemm").split()
    assert problems.op_of(two_gemms) == "gemm_gemm"  # guess_op: gemm
    assert problems.op_of(real_config("conv_gemm").split()) == "conv_gemm"  # guess_op: conv
    assert problems.op_of(["-t", "f16", "-x", "3"]) is None  # guess_op: gemm
    assert problems.op_of([]) is None  # guess_op: gemm
    assert problems.op_of(["-F", "1", "-n", "2"]) == "conv"  # op_of_flags: None


# --- perf-config family and .inc section ----------------------------------------------------------


def test_attention_perf_configs_fit_the_attention_kernel_ops_only():
    fitting = {op for op in problems.OPS if problems.perf_config_fits(op, "attn:v2:1,2")}
    assert fitting == {"attention", "gemm_gemm", "conv_gemm"}
    assert fitting == {s.name for s in problems.SPECS if s.attention_kernel}
    assert all(problems.perf_config_fits(op, "v2:1,2,3") for op in problems.OPS)
    assert not problems.perf_config_fits("gemm", "cpu:attn:v1:32,32")


def test_the_inc_section_is_the_specs():
    assert problems.spec_of("gemm").inc_section is None
    for spec in problems.SPECS:
        for arch, data_type in (("gfx942", "f16"), ("gfx1100", "f16"), ("gfx1100", "f32")):
            section = quick.instruction_type(arch, data_type, spec.name)
            by_arch = quick.instruction_type(arch, data_type, "gemm")  # gemm has no section
            assert section == (spec.inc_section or by_arch)


# --- the .debug columns: the real tool's, read and written through one module ------------------


@pytest.mark.parametrize("op", DEBUG_OPS)
def test_debug_header_is_the_real_tools(op):
    layout = problems.spec_of(op).debug
    assert layout is not None
    assert list(layout.header("E3", debug=True)) == real_debug(op)[0]


def test_quick_tune_data_header_is_the_real_tools():
    layout = problems.spec_of("gemm").debug
    assert layout is not None
    assert list(layout.header("E3")) == real_debug("gemm-quick-tune-data")[0]
    e4 = layout.header("E4", debug=True)
    assert e4[e4.index("TransB") + 1] == "TransO" and e4[-2:] == ("MeasurementsMs", "Status")
    assert "numChiplets" not in layout.header("E2")


@pytest.mark.parametrize("op", DEBUG_OPS)
def test_debug_problem_cells_are_the_real_tools(op):
    """Every cell before PerfConfig, as mlirtuna writes it for the config the real tool ran,
    is the real tool's; the reader takes that row for this problem."""
    layout = problems.spec_of(op).debug
    assert layout is not None
    problem = problems.parse(op, real_config(op))
    header, first = real_debug(op)[:2]
    cells = debug.problem_cells(layout, "E3", problem, REAL_GPU)
    assert list(cells) == first[: header.index("PerfConfig")]
    rows = parse_debug_lines(["\t".join(header), "\t".join(first)], Path("out.tsv.debug"))
    assert matches(problem, rows[0].problem) is True


@pytest.mark.parametrize("op", DEBUG_OPS)
def test_debug_export_reads_back_as_written(db, tmp_path, op):
    """export --format debug -> the rocmlir tuner's reader: the same rows, in order, each
    naming its problem (the invalid candidate's TFlops missing)."""
    tv = problems.parse(op, real_config(op)).canonical()
    prefix = "attn:v2" if problems.spec_of(op).attention_kernel else "v2"
    cands = [
        Candidate(f"{prefix}:1,2", 1e5, 2.5),
        Candidate(f"{prefix}:3,4", 2e5, 1.0 / 3),
        Candidate(f"{prefix}:5,6", error="not applicable"),
    ]
    sid = new_session(db)
    record(db, tmp_path, sid, {tv: cands}, {tv: cands[0].perf_config}, op=op)
    text = export.render(db, ExportQuery(sessions=(sid,)), "debug").text
    rows = parse_debug_lines(text.splitlines(), tmp_path / f"{op}.debug")
    assert [(r.perf_config, r.tflops) for r in rows] == [(c.perf_config, c.tflops) for c in cands]
    problem = problems.parse(op, tv)
    for row in rows:
        assert matches(problem, row.problem) is True
        assert dict(row.problem)["Chip"] == "gfx942" and dict(row.problem)["numChiplets"] == "8"


# --- no op-name lists outside the places that declare ops -----------------------------------------

# Where a collection of op names may stand: the op modules, the schema (one model per op) and
# what the rocmlir tuner knows of the real tool's ops.
OP_LISTS_ALLOWED = {
    "db/models.py",
    "tuners/rocmlir/stream.py",
}


def _op_lists(path: Path) -> list[int]:
    """Lines of tuples, lists, sets and dict keys holding two or more op names."""
    ops = set(problems.OPS)
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) or items is None:
            continue
        names = [x.value for x in items if isinstance(x, ast.Constant) and x.value in ops]
        if len(names) >= 2:
            lines.append(node.lineno)
    return lines


def test_no_op_name_lists_outside_the_declaring_places():
    found = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("problems/", "standin/", "migrations/")) or rel in OP_LISTS_ALLOWED:
            continue
        lines = _op_lists(path)
        if lines:
            found[rel] = lines
    assert found == {}, "per-op knowledge belongs in the op's OpSpec (docs/adding-an-op.md)"
