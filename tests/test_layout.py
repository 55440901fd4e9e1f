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
