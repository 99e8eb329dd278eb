"""Imports flow one way (docs/architecture.md) and form no cycle, imports inside functions included.

Every import statement of every module under the `worldloop` namespace is read with `ast` (top level, inside
functions, under `if TYPE_CHECKING`) and resolved to the module it names. The test fails on an arrow against
the layering below, on any cycle between modules, and on an import of a part by its bare name (`import sim`)
anywhere in the repository: only `worldloop.sim` is installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# part -> the parts it may import. The root scripts (worldloop.train_world_model, ...) may import any part.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "cuda_ext": {"common"},
    "data": {"common"},
    "sim": {"common", "data"},
    "world_model": {"common", "data", "cuda_ext"},
    "vla": {"common", "data", "sim", "cuda_ext"},
    "rl_finetune": {"common", "data", "sim", "cuda_ext", "world_model", "vla"},
    "real_robot": {"common", "data", "sim", "cuda_ext", "vla"},
}
PIPELINES = "pipelines"
PARTS = [*ALLOWED, PIPELINES]


def _modules() -> dict[str, Path]:
    """worldloop module name -> file, for every .py in the parts and the root scripts."""
    mods: dict[str, Path] = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(("worldloop", *parts))] = path
    for path in sorted(ROOT.glob("*.py")):
        mods["worldloop" if path.stem == "__init__" else f"worldloop.{path.stem}"] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """The worldloop modules `name` imports (resolved to a module where `from pkg import submodule`)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, attr in targets:
            if attr is not None and f"{module}.{attr}" in MODULES:
                module = f"{module}.{attr}"
            if module in MODULES and (module, node.lineno) not in found:
                found.append((module, node.lineno))
    return found


def _part(module: str) -> str | None:
    """The part a module belongs to; None for the root package and the root scripts."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 2 or (len(pieces) == 2 and pieces[1] in PARTS) else None


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_parts_are_found():
    assert {"worldloop.common.config", "worldloop.world_model.model", "worldloop.train_world_model"} <= set(
        MODULES
    )
    assert any(GRAPH.values()), "no worldloop import was resolved: the test reads nothing"


def test_imports_follow_the_layering():
    wrong = []
    for name, imports in GRAPH.items():
        src = _part(name)
        if src is None or src == PIPELINES:
            continue
        for target, line in imports:
            dst = _part(target)
            if dst is None:
                wrong.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports the root script {target}")
            elif dst != src and dst not in ALLOWED[src]:
                wrong.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {src} -> {dst} ({target})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target, _ in GRAPH[node]:
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in GRAPH:
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("folder", ["tests", "benchmarks", *PARTS, "."])
def test_parts_are_imported_through_worldloop(folder):
    files = sorted((ROOT / folder).glob("*.py") if folder == "." else (ROOT / folder).rglob("*.py"))
    bare = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bare += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PARTS
            ]
    assert not bare, "import these as worldloop.<part>:\n" + "\n".join(bare)
