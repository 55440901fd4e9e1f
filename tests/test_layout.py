"""The package's shape: the top level holds the plugin, run infrastructure has its own packages, and
the layers hold no ambient state. Which package may import which: tests/test_import_graph.py."""
import pytest

from conftest import REPO


def test_the_top_level_is_the_plugin_and_run_infrastructure_has_its_own_packages():
    modules = sorted(path.name for path in (REPO / "gwdet").glob("*.py"))
    assert len(modules) <= 8, modules
    packages = {path.name for path in (REPO / "gwdet").iterdir() if (path / "__init__.py").is_file()}
    assert {"engine", "convert", "checkpoint", "layers", "modeling", "export"} <= packages


@pytest.mark.parametrize("path", sorted((REPO / "gwdet" / "layers").rglob("*.py")), ids=lambda p: p.name)
def test_the_layers_hold_no_ambient_state(path):
    assert "ContextVar" not in path.read_text()
