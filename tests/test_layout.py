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
