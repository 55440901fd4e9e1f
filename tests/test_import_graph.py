"""The import graph of ``gwdet/``: no circles between its packages, and every import goes down the
layers of docs/design.md ("Layout"). Every import statement counts: at module level and inside
functions, absolute and relative. A node of the graph is a subpackage (``gwdet.engine``), a
top-level module (``gwdet.norms``) or the package's ``__init__`` (``gwdet``)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import REPO

# The layers of the package, bottom first. A unit imports units of the rows above its own row
# (lower layers) only: never one of its own row, never one below. The tiers:
#   bottom          imports nothing of gwdet but the bottom: error types, atomic files, the tools' errors
#   core            the plugin: what a detectron2 user imports to build models with gwdet's norms
#   infrastructure  what runs, records, converts and deploys models
#   tools           reports over everything
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("bottom", ("gwdet.errors",)),
    ("bottom", ("gwdet.utils",)),
    ("core", ("gwdet.layers",)),  # pure PyTorch
    ("core", ("gwdet.config", "gwdet.positions")),
    ("core", ("gwdet.norms",)),
    ("core", ("gwdet.config_checks",)),
    ("core", ("gwdet.solver",)),  # builds an optimizer after the config gate
    ("core", ("gwdet.modeling",)),
    ("core", ("gwdet",)),  # the package's __init__: the plugin's public names
    ("infrastructure", ("gwdet.data", "gwdet.checkpoint", "gwdet.model_zoo")),
    ("infrastructure", ("gwdet.convert", "gwdet.engine")),
    ("infrastructure", ("gwdet.cluster", "gwdet.export")),
    ("tools", ("gwdet.collect_env",)),
]
ROW = {unit: row for row, (_, units) in enumerate(LAYERS) for unit in units}
TIER = {unit: tier for tier, units in LAYERS for unit in units}


class Import(NamedTuple):
    module: str  # the importing module, e.g. gwdet.engine.trainer
    line: int
    target: str  # the imported module, e.g. gwdet.checkpoint.resilient

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    """Whether ``name`` is a module or package under ``root`` (the folder holding the package)."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, root: Path, package: str) -> list[Import]:
    """Every import of ``package``'s modules in the file ``path``, wherever it stands in the file."""
    module = module_name(path, root)
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            # `from gwdet.x import y` imports the module gwdet.x.y when there is one, else a name of gwdet.x
            targets = [f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}", root) else base
                       for alias in node.names]
        else:
            continue
        found += [Import(module, node.lineno, target) for target in targets
                  if target.split(".")[0] == package]
    return found


def unit_of(module: str) -> str:
    """``gwdet.engine.trainer`` -> ``gwdet.engine``; ``gwdet.norms`` -> ``gwdet.norms``; ``gwdet`` -> ``gwdet``."""
    return ".".join(module.split(".")[:2])


def import_graph(root: Path, package: str) -> dict[tuple[str, str], list[Import]]:
    """``{(importing unit, imported unit): [the imports that make the edge]}``, between units only."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for path in sorted((root / package).rglob("*.py")):
        for found in imports_of(path, root, package):
            edge = (unit_of(found.module), unit_of(found.target))
            if edge[0] != edge[1]:
                edges[edge].append(found)
    return dict(edges)


def circles(edges) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan's algorithm)."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph) | {b for targets in graph.values() for b in targets}):
        if node not in index:
            visit(node)
    return found


EDGES = import_graph(REPO, "gwdet")


def _listed(imports) -> str:
    return "\n  ".join(str(found) for found in imports)


def test_every_unit_of_the_package_has_its_layer():
    units = {unit_of(module_name(path, REPO)) for path in (REPO / "gwdet").rglob("*.py")}
    assert units - set(ROW) == set(), "a new package or top-level module: add it to LAYERS (and to docs/design.md)"
    assert set(ROW) - units == set(), "LAYERS names a unit that is gone"
    assert len(EDGES) > 30


def test_there_are_no_circles_between_the_packages():
    found = circles(EDGES)
    report = []
    for component in found:
        inside = [imports for (a, b), imports in sorted(EDGES.items()) if a in component and b in component]
        report.append(f"{' <-> '.join(component)}:\n  " + _listed(found for imports in inside for found in imports))
    assert not found, "import circles:\n" + "\n".join(report)


def test_the_core_imports_no_run_infrastructure():
    upward = [found for (a, b), imports in sorted(EDGES.items()) for found in imports
              if TIER[a] in ("bottom", "core") and TIER[b] not in ("bottom", "core")]
    assert not upward, "the plugin core imports run infrastructure:\n  " + _listed(upward)


def test_every_import_goes_down_the_layers():
    upward = [found for (a, b), imports in sorted(EDGES.items()) for found in imports if ROW[b] >= ROW[a]]
    assert not upward, ("imports of a unit of the same or a higher row of LAYERS (move the shared code down, "
                        "or the import up):\n  " + _listed(upward))


def test_the_graph_sees_imports_inside_functions_relative_ones_and_submodules(tmp_path):
    """The graph builder on a package of its own: each kind of import statement makes its edge."""
    files = {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/files.py": "VALUE = 1\n",
        "pkg/top.py": "def later():\n    from .mid.run import go\n    return go\n",
        "pkg/mid/__init__.py": "",
        "pkg/mid/run.py": "import os\nfrom ..low import files\nfrom pkg.top import later\n\ndef go():\n"
                          "    import pkg.low.files\n    return pkg.low.files.VALUE\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = import_graph(tmp_path, "pkg")
    assert {edge: [(found.module, found.line) for found in imports] for edge, imports in edges.items()} == {
        ("pkg.top", "pkg.mid"): [("pkg.top", 2)],
        ("pkg.mid", "pkg.low"): [("pkg.mid.run", 2), ("pkg.mid.run", 6)],
        ("pkg.mid", "pkg.top"): [("pkg.mid.run", 3)],
    }
    assert circles(edges) == [["pkg.mid", "pkg.top"]]


# ---- imports of other packages ------------------------------------------------------------------

def _external_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


PLUGIN_FILES = sorted((REPO / "gwdet").rglob("*.py"))


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_plugin_never_imports_the_lab_and_the_layers_never_import_detectron2(path):
    modules = _external_imports(path)
    assert not [m for m in modules if m.split(".")[0] == "gwdet_lab"]
    if "layers" in path.relative_to(REPO / "gwdet").parts:
        assert not [m for m in modules if m.split(".")[0] == "detectron2"]
