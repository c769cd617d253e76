"""The package tree is the map (docs/architecture.md): these rules keep it one.

- at most 12 modules at the top of src/mlirtuna (packages do not count);
- no import cycle between two modules, `TYPE_CHECKING` imports included;
- no name starting with `_` imported from another module, in src, tests or bench;
- migrations are frozen: they import nothing of the live package;
- tests share helpers through tests/support/ only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "mlirtuna"
TOP_LEVEL_MODULES_MAX = 12


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
