"""The package's imports only point down: each folder (or top-level module) imports only those of a lower layer or
itself, and no modules import each other in a circle. Parsed with ``ast``, so lazy imports count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_dprobust"

LAYERS = [
    {"core"},
    {"models", "data", "checkpoint_io", "paths"},
    {"zoo"},
    {"metrics"},
    {"robustness"},
    {"callbacks"},
    {"methods"},
    {"recipes"},
    {"zoo.build"},
    {"audit"},
    {"cli", "demo", "demo_ehr"},
]
"""Lowest first; a unit may import its own modules and those of any lower layer. The zoo's hub and catalog sit low
(methods resolve zoo names, e.g. TransDenoiser's public classifier); its build trains recipes, so it sits above them."""
SUBUNITS = {"lightning_dprobust.zoo.build": "zoo.build", "lightning_dprobust.zoo.build_attack": "zoo.build"}
"""Modules that form a unit of their own, apart from their folder."""
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, *, top_level_only: bool) -> set[str]:
    """``lightning_dprobust`` modules imported by ``tree`` (a ``from X import name`` counts ``X.name`` when that is a
    module); ``top_level_only`` skips imports inside functions and ``if TYPE_CHECKING`` blocks."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("lightning_dprobust")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning_dprobust"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
    return found


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def unit(module: str) -> str | None:
    if module in SUBUNITS:
        return SUBUNITS[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_folder_and_top_level_module_has_a_layer():
    units = {unit(name) for name in MODULES} - {None}
    assert units <= RANK.keys(), f"give {sorted(units - RANK.keys())} a layer in LAYERS"


@pytest.mark.parametrize("name", sorted(name for name in MODULES if unit(name) is not None))
def test_imports_point_down(name):
    own = unit(name)
    upward = sorted(
        target
        for target in imported_modules(TREES[name], top_level_only=False)
        if unit(target) not in (None, own) and RANK[unit(target)] >= RANK[own]
    )
    assert not upward, f"{name} imports {upward}: move the shared code down a layer"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a list of nodes, or ``None``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    return next((cycle for node in sorted(graph) if node not in state and (cycle := visit(node))), None)


def test_no_module_level_import_cycle():
    graph = {
        name: {target for target in imported_modules(tree, top_level_only=True) if target != name and target in MODULES}
        for name, tree in TREES.items()
    }
    # a package's __init__ re-exporting its own modules is not a cycle of concerns
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def subpackage_graph(trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    """Imports between modules of one unit (a folder, nested folders included), those inside functions too; a module
    importing its own package counts (the package's ``__init__`` imports it back)."""
    return {
        name: {
            target
            for target in imported_modules(tree, top_level_only=False)
            if target != name and target in MODULES and unit(target) == unit(name)
        }
        for name, tree in trees.items()
        if unit(name) is not None
    }


def test_no_import_cycle_inside_a_subpackage():
    """A lazy import is no excuse for a circle: inside a folder, the modules' imports (at any depth) form no cycle."""
    cycle = find_cycle(subpackage_graph(TREES))
    assert cycle is None, f"import cycle inside a subpackage: {' -> '.join(cycle)}: move shared code into one module"


def test_the_checks_catch_an_upward_import_and_a_cycle():
    tree = ast.parse("def f():\n    from lightning_dprobust.cli import main\n")
    assert {unit(name) for name in imported_modules(tree, top_level_only=False)} == {"cli"}
    assert not imported_modules(tree, top_level_only=True)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
    lazy_base = ast.parse("def f():\n    from lightning_dprobust.methods.base import C\n")
    lazy = {  # methods.registry once imported methods.base inside a function, and base imported registry
        "lightning_dprobust.methods.base": ast.parse("from lightning_dprobust.methods.registry import qualified_name"),
        "lightning_dprobust.methods.registry": lazy_base,
        "lightning_dprobust.core.accounting": lazy_base,  # another folder's import is not inside the subpackage
    }
    assert find_cycle(subpackage_graph(lazy)) == [
        "lightning_dprobust.methods.base",
        "lightning_dprobust.methods.registry",
        "lightning_dprobust.methods.base",
    ]
    to_own_package = {"lightning_dprobust.methods": ast.parse("from lightning_dprobust.methods.registry import f")}
    to_own_package["lightning_dprobust.methods.registry"] = ast.parse("def f():\n    import lightning_dprobust.methods")
    assert find_cycle(subpackage_graph(to_own_package)) is not None
