"""The house rules of the layout: no import cycle, policies stay pure, packages say what they are.

Every import counts, lazy ones inside functions and ``TYPE_CHECKING`` ones
included: a cycle hidden in a function is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "policies")
# What policies/ may never import: the proxy itself and every I/O library.
IMPURE = {
    "proxy",
    "starlette",
    "uvicorn",
    "aiosqlite",
    "sqlite3",
    "aiohttp",
    "httpx",
    "litellm",
    "structlog",
    "tiktoken",
    "redis",
    "asyncpg",
    "psycopg",
    "logging",
    "time",
    "asyncio",
    "socket",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `path` imports (``from pkg import mod`` resolves to pkg.mod)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    edges = {name: imports_of(path, known) - {name} for name, path in mods.items()}
    # A package's __init__ holds a docstring only, so importing a.b also runs a's
    # __init__: that edge carries nothing and is left out.
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_of_proxy_or_policies_is_part_of_an_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_reports_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted((REPO / "policies").rglob("*.py")), ids=str)
def test_policies_import_no_proxy_module_and_no_io_library(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in IMPURE, f"{path.name} imports {name}"


def package_inits() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py"))


@pytest.mark.parametrize("path", package_inits(), ids=lambda p: str(p.relative_to(REPO)))
def test_each_package_init_holds_only_a_docstring_that_says_what_it_may_import(
    path: Path,
) -> None:
    body = ast.parse(path.read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{path}: docstring only"
    assert isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    if path.parent.name not in PACKAGES:  # the top-level packages describe the project
        assert "import" in body[0].value.value, f"{path}: say what the package may import"
