"""The package boundaries of docs/design.md, checked on every import statement of the plugin."""
import ast

import pytest

from conftest import REPO


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


PLUGIN_FILES = sorted((REPO / "gwdet").rglob("*.py"))


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_plugin_never_imports_the_lab_and_the_layers_never_import_detectron2(path):
    modules = list(_imports(path))
    assert not [m for m in modules if m.split(".")[0] == "gwdet_lab"]
    if "layers" in path.relative_to(REPO / "gwdet").parts:
        assert not [m for m in modules if m.split(".")[0] == "detectron2"]


def test_the_boundary_check_sees_the_files():
    assert len(PLUGIN_FILES) > 30
    assert "detectron2.config" in set(_imports(REPO / "gwdet" / "config.py"))


def test_the_top_level_is_the_plugin_and_run_infrastructure_has_its_own_packages():
    modules = sorted(path.name for path in (REPO / "gwdet").glob("*.py"))
    assert len(modules) <= 8, modules
    packages = {path.name for path in (REPO / "gwdet").iterdir() if (path / "__init__.py").is_file()}
    assert {"engine", "convert", "checkpoint", "layers", "modeling", "export"} <= packages


@pytest.mark.parametrize("path", sorted((REPO / "gwdet" / "layers").rglob("*.py")), ids=lambda p: p.name)
def test_the_layers_hold_no_ambient_state_and_no_export_code(path):
    text = path.read_text()
    assert "ContextVar" not in text
    assert not [m for m in _imports(path) if m.startswith("gwdet.export")]
