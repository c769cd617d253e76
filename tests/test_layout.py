"""The package tree is the map (docs/architecture.md): these rules keep it one.

- at most 12 modules at the top of src/mlirtuna (packages do not count);
- the map in docs/architecture.md lists every top-level module and package, lowest layer
  first, and no import runs up it (Alembic's migrations/env.py, which reads db.models, excepted);
- no import cycle of any length between modules, `TYPE_CHECKING` imports included;
- no name starting with `_` imported from another module, or reached through one (`mod._x`), in
  src, tests or bench;
- migrations are frozen: they import nothing of the live package;
- every package's __init__ opens with a docstring saying what the package is;
- tests share helpers through tests/support/ only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "mlirtuna"
TOP_LEVEL_MODULES_MAX = 12
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# The one import allowed up the map: Alembic's environment reads the models' metadata.
UPWARD_ALLOWED = {("mlirtuna.migrations.env", "mlirtuna.db.models")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, package: str) -> Iterator[tuple[str, str]]:
    """(module, name) for every `from M import name` and (M, '') for `import M`, absolute."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                yield module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for module, imported in _imports(path, package):
            if f"{module}.{imported}" in modules:
                deps.add(f"{module}.{imported}")
            if module in modules:  # `from pkg import mod` runs pkg/__init__ first
                deps.add(module)
        edges[name] = deps - {name}
    return edges


def test_top_level_holds_few_modules():
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert len(modules) <= TOP_LEVEL_MODULES_MAX, modules


def test_no_module_imports_one_that_imports_it_back():
    edges = _edges(_sources())
    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges[b]})
    assert cycles == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan): each holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_of_any_length():
    assert _cycles(_edges(_sources())) == []


def test_the_cycle_finder_finds_a_long_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def _map() -> list[str]:
    """The top-level entries of docs/architecture.md's package tree, lowest layer first."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    tree = text[text.index("```\nsrc/mlirtuna/\n") :]
    tree = tree[: tree.index("\n```", 4)]
    return [m.group(1) for m in re.finditer(r"^  (\w+)(?:\.py|/)\s", tree, re.MULTILINE)]


def _part(module: str) -> str:
    """A module's top-level entry: mlirtuna.queue.claim -> queue; the package itself ''."""
    return module.split(".")[1] if "." in module else ""


def test_the_map_lists_every_top_level_entry():
    entries = {p.stem for p in SRC.glob("*.py")} | {
        p.parent.name for p in SRC.glob("*/__init__.py")
    }
    assert sorted(_map()) == sorted(entries - {"__init__", "__main__"})


def test_no_import_runs_up_a_layer():
    # The package's own __init__ (its version) is below everything, __main__ above.
    layer = {"": -1, **{name: i for i, name in enumerate(_map())}, "__main__": len(_map())}
    upward = [
        f"{a} -> {b}"
        for a, deps in _edges(_sources()).items()
        for b in deps
        if layer[_part(b)] > layer[_part(a)] and (a, b) not in UPWARD_ALLOWED
    ]
    assert upward == []


def _private_reaches(path: Path, package: str) -> Iterator[str]:
    """`mod._x` where `mod` names a module of mlirtuna (imported as `import a.b as mod` or
    `from a import mod`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set(_sources())
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            for module, name in _imports_of(node, package):
                if f"{module}.{name}" in modules:
                    bound.add(next(a.asname or a.name for a in node.names if a.name == name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and ast.unparse(node.value) in bound
        ):
            yield f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"


def _imports_of(node: ast.ImportFrom, package: str) -> Iterator[tuple[str, str]]:
    module = node.module or ""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join([*base, module] if module else base)
    for alias in node.names:
        yield module, alias.name


def test_no_private_name_is_reached_through_a_module():
    reached = []
    files = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    for path in files:
        package = "" if SRC not in path.parents else _module_name(path)
        if path.name != "__init__.py" and package:
            package = package.rpartition(".")[0]
        reached += _private_reaches(path, package)
    assert reached == []


def test_no_private_name_crosses_a_module():
    crossings = []
    files = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    for path in files:
        package = "" if SRC not in path.parents else _module_name(path)
        for module, name in _imports(path, package):
            if name.startswith("_") and not name.startswith("__"):
                crossings.append(f"{path.relative_to(ROOT)}: from {module} import {name}")
            if module.rpartition(".")[2].startswith("_") and module != "__future__":
                crossings.append(f"{path.relative_to(ROOT)}: import {module}")
    assert crossings == []


def test_migrations_import_no_live_code():
    live = [
        f"{path.name}: {module}"
        for path in (SRC / "migrations" / "versions").glob("*.py")
        for module, _ in _imports(path, "")
        if module.startswith("mlirtuna")
    ]
    assert live == []


def test_tests_share_helpers_only_through_support():
    """A helper two test modules need lives in tests/support/, never in a test module."""
    crossings = [
        f"{path.name}: {module}"
        for path in (ROOT / "tests").rglob("*.py")
        for module, _ in _imports(path, "")
        if module.partition(".")[0].startswith("test_")
    ]
    assert crossings == []


def test_every_package_says_what_it_is():
    """Each package's __init__ opens with a docstring (what the package is)."""
    silent = [
        str(path.relative_to(ROOT))
        for path in SRC.rglob("__init__.py")
        if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    ]
    assert silent == []


# Quick lists (history/quick/): the steps that work on a history in memory are free of the
# database, so they can be read, tested and reused (bench/) without one.
DATABASE_FREE = (
    "mlirtuna.history.quick.groups",
    "mlirtuna.history.quick.cover",
    "mlirtuna.history.quick.evaluate",
    "mlirtuna.history.quick.across",
)
DATABASE = ("mlirtuna.db", "mlirtuna.catalog", "mlirtuna.sessions", "mlirtuna.queue", "sqlalchemy")


def _reached(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _is_under(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_quick_list_steps_import_nothing_of_the_database():
    sources = _sources()
    edges = _edges(sources)
    found = [
        f"{start}: {module} imports {imported}"
        for start in DATABASE_FREE
        for module in sorted(_reached(start, edges))
        for imported, _ in _imports(sources[module], module.rpartition(".")[0])
        if _is_under(imported, DATABASE)
    ]
    assert found == []


def test_history_asks_the_registry_not_the_cpu_tuner():
    """What a listed perf config means is its TunerKind's (listed); history imports no tuner."""
    found = [
        f"{name}: {module}"
        for name, path in _sources().items()
        if name.startswith("mlirtuna.history")
        for module, imported in _imports(path, name.rpartition(".")[0])
        if _is_under(module, ("mlirtuna.tuners.cpu",))
        or (module == "mlirtuna.tuners" and imported == "cpu")
    ]
    assert found == []


# --- the tuner seam (issue 46): nothing outside tuners/ knows a tuner by its name -------------

#: Where a tuner's name may be written: the tuners themselves, and the frozen migrations (a
#: revision states the data as it was then and may import nothing live to ask the registry).
TUNER_NAME_HOMES = ("tuners", "migrations")
#: Deliberate uses outside them, (file, name) with why:
TUNER_NAME_EXCEPTIONS = {
    # `session new --tuner`'s default, shown by --help: the CLI imports no tuner code to render
    # its help (cli/common.py says why), so the fact lives with the other defaults; the rule's
    # test below holds it to a built-in name.
    ("defaults.py", "DEFAULT_TUNER"),
}
# `auto` (`run --tuner auto`, flow.choose_tuner) is not a tuner name: no kind is called so, and
# the registry resolves it (registry.AUTO); nor is a perf-config family (keys.py's "cpu") or a
# temporary directory's kind (machine.TEMP_KINDS "rocmlir"), which the rule does not look at.


def _tuner_name_uses(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str, str]]:
    """(line, name, what) for each string constant equal to a tuner name that is used as one:
    an operand of a comparison (`==`, `!=`, `in` and the tuple after `in`), a dict key, a match
    case, a parameter's default, the value assigned to a name or field saying `tuner`, or a
    `tuner=` keyword argument. Elsewhere (a message, a return value, a tuple of directory kinds)
    the same word means something else and is not flagged."""

    def named(node: ast.AST | None) -> Iterator[ast.Constant]:
        if isinstance(node, ast.Constant) and node.value in names:
            yield node
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            for element in node.elts:
                yield from named(element)

    for node in ast.walk(tree):
        found: list[tuple[ast.AST | None, str]] = []
        if isinstance(node, ast.Compare):
            found = [(x, "compared") for x in (node.left, *node.comparators)]
        elif isinstance(node, ast.Dict):
            found = [(k, "a dict key") for k in node.keys]
        elif isinstance(node, ast.MatchValue):
            found = [(node.value, "a match case")]
        elif isinstance(node, ast.arguments):
            found = [(d, "a default") for d in (*node.defaults, *node.kw_defaults)]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            text = " ".join(ast.unparse(t) for t in targets)
            if "tuner" in text.lower():
                found = [(node.value, f"assigned to {text}")]
        elif isinstance(node, ast.keyword) and "tuner" in (node.arg or "").lower():
            found = [(node.value, f"{node.arg}=")]
        for value, what in found:
            for constant in named(value):
                yield constant.lineno, constant.value, what


def _assigned_names(tree: ast.AST, line: int) -> set[str]:
    return {
        ast.unparse(t)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.lineno == line
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    }


def _tuner_literals(files: list[Path], names: set[str]) -> list[str]:
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(SRC))
        for line, name, what in _tuner_name_uses(tree, names):
            if any(
                (where, target) in TUNER_NAME_EXCEPTIONS for target in _assigned_names(tree, line)
            ):
                continue
            found.append(f"src/mlirtuna/{where}:{line}: {name!r} {what}")
    return found


def test_no_tuner_name_outside_tuners():
    """farm-studio's rule: what a tuner is, the rest asks its TunerKind (tuners/registry.py);
    a tuner's name in a comparison, a dict key or a default outside tuners/ is a branch on it."""
    from mlirtuna.defaults import DEFAULT_TUNER
    from mlirtuna.tuners.registry import AUTO, BUILT_IN

    names = set(BUILT_IN)
    assert "auto" not in names and set(AUTO) <= names  # `auto` is no tuner's name
    assert DEFAULT_TUNER in names  # the one exception names a tuner that exists
    files = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in TUNER_NAME_HOMES]
    assert _tuner_literals(files, names) == []


def test_the_tuner_name_rule_finds_each_kind_of_use(tmp_path):
    """The rule catches what it says, and leaves a word that only looks like a name alone."""
    code = (
        "def f(tuner='cpu'):\n"  # 1: a default
        "    if kind == 'rocmlir': pass\n"  # 2: compared
        "    if name in ('sleep', 'x'): pass\n"  # 3: in a tuple after `in`
        "    d = {'cpu': 1}\n"  # 4: a dict key
        "    DEFAULT_TUNER = 'sleep'\n"  # 5: assigned to a name saying tuner
        "    g(tuner='cpu')\n"  # 6: a tuner= keyword
        "    return 'cpu'\n"  # not a use as a name: a return value
        "KINDS = ('rocmlir', 'stream')\n"  # not one: a tuple of other things
        "raise E('the cpu tuner')\n"  # not one: a message
    )
    (tmp_path / "m.py").write_text(code)
    lines = [line for line, _, _ in _tuner_name_uses(ast.parse(code), {"cpu", "rocmlir", "sleep"})]
    assert sorted(lines) == [1, 2, 3, 4, 5, 6]


def test_the_settle_module_names_no_tuner():
    """queue/settle.py records what a tuner returns (formats/outcome.py) without importing any
    tuner code, TYPE_CHECKING imports included."""
    path = SRC / "queue" / "settle.py"
    imported = {module for module, _ in _imports(path, "mlirtuna.queue")}
    assert sorted(m for m in imported if m.startswith("mlirtuna.tuners")) == []
