"""A checkout named gwdet/ cannot pass for the package: Python started in the folder that holds
it stops at ``import gwdet`` with an error naming the checkout and the fix, instead of importing
the checkout as an empty namespace package (the repository's top-level ``__init__.py``). That file
is inert under any other name, stays out of the build, and leaves pytest's collection alone."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages
from setuptools.config.pyprojecttoml import read_configuration

from conftest import REPO

ROOT_INIT = REPO / "__init__.py"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    # Without PYTHONPATH: here gwdet is importable only through this environment's install (an
    # editable one is a finder consulted after the working directory).
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_import_gwdet_beside_a_checkout_named_gwdet_says_what_is_wrong(tmp_path):
    checkout = tmp_path / "gwdet"
    checkout.symlink_to(REPO, target_is_directory=True)
    done = _python("import gwdet", tmp_path)
    assert done.returncode == 1
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("ImportError: 'import gwdet' found the gwdet repository checkout"), done.stderr
    for fragment in (str(checkout), "the working directory", f"cd {checkout}", f"pip install -e {checkout}"):
        assert fragment in error, (fragment, error)
    # nothing half-imported is left behind: a second import fails the same way, never a namespace
    done = _python("import sys\ntry:\n    import gwdet\nexcept ImportError as e:\n    print(e.name, e.path)\n"
                   "print('gwdet' in sys.modules)", tmp_path)
    assert done.stdout.split() == ["gwdet", str(checkout / "__init__.py"), "False"], done.stdout + done.stderr


def test_inside_the_checkout_gwdet_is_the_package():
    done = _python("import importlib.util; print(importlib.util.find_spec('gwdet').origin)", REPO)
    assert done.stdout.strip() == str(REPO / "gwdet" / "__init__.py"), done.stdout + done.stderr


def test_the_root_init_does_nothing_under_another_name():
    """What pytest does when it collects the tests: it imports the file as the folder's name."""
    spec = importlib.util.spec_from_file_location("gwdet_checkout_root", ROOT_INIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not [name for name in vars(module) if not name.startswith("__") and name != "os"]


def test_the_build_packages_only_gwdet_and_gwdet_lab():
    # setuptools' own reading of pyproject.toml (tomllib is Python >= 3.11 only)
    include = read_configuration(REPO / "pyproject.toml", expand=False)["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(REPO), include=include)
    assert packages and all(name.split(".")[0] in ("gwdet", "gwdet_lab") for name in packages), packages


def test_pytest_collects_from_a_checkout_named_gwdet(tmp_path):
    """pytest makes the checkout a package (it has __init__.py) and, when it sets the tests up,
    imports that file under the folder's name, here gwdet: the package conftest.py imported first."""
    checkout = tmp_path / "gwdet"
    checkout.mkdir()
    for name in ("__init__.py", "pytest.ini", "gwdet", "tests", "configs"):
        (checkout / name).symlink_to(REPO / name)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_norms.py::test_unknown_name_is_a_key_error_listing_the_known_names"], cwd=checkout,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
