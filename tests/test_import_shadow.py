"""Which gwdet Python imports: inside the checkout it is the package ``gwdet/`` (not the checkout
folder), the build packages only ``gwdet`` and ``gwdet_lab``, and the tests run from a checkout
that is itself named gwdet."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages
from setuptools.config.pyprojecttoml import read_configuration

from conftest import REPO


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    # Without PYTHONPATH: here gwdet is importable only through this environment's install (an
    # editable one is a finder consulted after the working directory).
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_inside_the_checkout_gwdet_is_the_package():
    done = _python("import importlib.util; print(importlib.util.find_spec('gwdet').origin)", REPO)
    assert done.stdout.strip() == str(REPO / "gwdet" / "__init__.py"), done.stdout + done.stderr


def test_the_build_packages_only_gwdet_and_gwdet_lab():
    # setuptools' own reading of pyproject.toml (tomllib is Python >= 3.11 only)
    include = read_configuration(REPO / "pyproject.toml", expand=False)["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(REPO), include=include)
    assert packages and all(name.split(".")[0] in ("gwdet", "gwdet_lab") for name in packages), packages


def test_pytest_collects_from_a_checkout_named_gwdet(tmp_path):
    """The tests import the package gwdet/ of the checkout, not the checkout folder of that name."""
    checkout = tmp_path / "gwdet"
    checkout.mkdir()
    for name in ("pytest.ini", "gwdet", "tests", "configs"):
        (checkout / name).symlink_to(REPO / name)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_norms.py::test_unknown_name_is_a_key_error_listing_the_known_names"], cwd=checkout,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
