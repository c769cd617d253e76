"""An op is declared once (defaults.OPS, re-exported as problems.OPS): its module, the CLI's help
texts and the errors that list ops all derive from it (issue 32)."""

from __future__ import annotations

import re

import pytest
from support.clitools import cli

from mlirtuna import defaults, problems
from mlirtuna.errors import UserError


def test_every_op_has_its_module_in_the_declared_order():
    assert problems.OPS is defaults.OPS
    assert [problems.problem_class(op).op for op in problems.OPS] == list(problems.OPS)
    assert tuple(op for op in problems.OPS if op != "fusion") == problems.CONFIG_LIST_OPS


def test_an_unknown_op_lists_the_declared_ones():
    with pytest.raises(UserError, match=re.escape(", ".join(problems.OPS))):
        problems.parse("nosuchop", "-t f32")


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
