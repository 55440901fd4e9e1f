"""What gwdet's install rests on, checked offline: detectron2's packaged LazyConfigs found without
``pkg_resources`` (gwdet.model_zoo.detectron2_configs), and the lock the set-up installs from
(requirements/lock.txt, scripts/setup_env.sh). The wheel installed with its dependencies into a
fresh environment: tests/test_packaging.py."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

import pytest
from detectron2 import model_zoo as detectron2_model_zoo
from omegaconf import OmegaConf
from packaging.markers import Marker
from packaging.requirements import Requirement

from gwdet.model_zoo import detectron2_config_file, detectron2_configs_dir, detectron2_lazy_config

from conftest import REPO

# Every detectron2 config gwdet's LazyConfigs take parts from.
USED_BY_GWDET = ("common/models/mask_rcnn_fpn.py", "common/data/coco.py", "common/optim.py",
                 "common/coco_schedule.py", "common/train.py")


@pytest.mark.parametrize("name", USED_BY_GWDET)
def test_detectron2s_configs_load_as_detectron2s_model_zoo_loads_them(name):
    ours = detectron2_lazy_config(name)
    theirs = detectron2_model_zoo.get_config(name)  # needs pkg_resources (setuptools < 81 here)
    assert OmegaConf.to_container(ours) == OmegaConf.to_container(theirs)
    assert detectron2_config_file(name) == Path(detectron2_model_zoo.get_config_file(name))


def test_every_detectron2_config_gwdet_uses_is_listed_above():
    used = set()
    for path in (REPO / "configs" / "LazyConfig").rglob("*.py"):
        text = path.read_text()
        used.update(part.split('"')[1] for part in text.split("detectron2_lazy_config(")[1:])
    assert used == set(USED_BY_GWDET)
    assert "detectron2.model_zoo" not in "".join(p.read_text() for p in (REPO / "configs").rglob("*.py"))


def test_a_name_that_is_not_there_or_not_a_lazy_config_is_refused_clearly():
    with pytest.raises(FileNotFoundError, match=r"'common/train' is not among detectron2's packaged configs .*"
                                                r"Did you mean 'common/train.py'"):
        detectron2_config_file("common/train")
    with pytest.raises(FileNotFoundError, match="is not among detectron2's packaged configs"):
        detectron2_config_file("../model_zoo.py")  # a file, but outside the configs folder
    with pytest.raises(ValueError, match=r"'Base-RCNN-FPN.yaml' is not a LazyConfig.*detectron2_config_file"):
        detectron2_lazy_config("Base-RCNN-FPN.yaml")
    assert detectron2_config_file("Base-RCNN-FPN.yaml").parent == detectron2_configs_dir()


def test_no_detectron2_is_named_as_such(monkeypatch):
    monkeypatch.setitem(sys.modules, "detectron2", None)  # Python's own block: find_spec finds nothing
    with pytest.raises(ModuleNotFoundError, match="gwdet's LazyConfigs build on detectron2's packaged configs, "
                                                  "but no detectron2 is importable. Install detectron2 first"):
        detectron2_lazy_config("common/train.py")


LOAD = "from gwdet.model_zoo import detectron2_lazy_config; detectron2_lazy_config('common/train.py')"


def test_a_detectron2_without_its_configs_gets_a_message_naming_the_folder_and_the_fix(tmp_path):
    """A real detectron2 package, copied without model_zoo/configs (as a copy of a checkout's
    detectron2/ folder is), imported first: gwdet names what is missing and how to get it."""
    installed = detectron2_configs_dir().parents[1]
    copy = tmp_path / "detectron2"
    shutil.copytree(installed, copy, ignore=lambda folder, names: {"configs", "__pycache__"} & set(names))
    done = subprocess.run([sys.executable, "-c", LOAD], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert f"FileNotFoundError: detectron2's packaged configs are missing: no folder {copy / 'model_zoo' / 'configs'}." \
        in message
    assert "reinstall detectron2 with pip" in message and f"ln -s <detectron2 checkout>/configs {copy}" in message


# ---- the lock: requirements/lock.txt, installed by scripts/setup_env.sh through scripts/locked_install.py ----

LOCK = REPO / "requirements" / "lock.txt"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def _locked_install_module():
    spec = importlib.util.spec_from_file_location("locked_install", REPO / "scripts" / "locked_install.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


locked_install = _locked_install_module()


def _linux_x86_64(python: str) -> dict[str, str]:
    """The environment markers of CPython ``python`` on x86_64 Linux."""
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "platform_python_implementation": "CPython", "implementation_name": "cpython"}


def _inputs(path: Path) -> list[Requirement]:
    """The requirements of a .in file, following its -r lines."""
    requirements = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            requirements += _inputs(path.parent / line[3:].strip())
        elif line:
            requirements.append(Requirement(line))
    return requirements


def _what_the_set_up_installs() -> list[Requirement]:
    """Every requirement scripts/setup_env.sh installs through the lock: requirements/lock.in (with
    detectron2-runtime.in), the registry's detectron2 wheel, and gwdet's dependencies with every extra."""
    requirements = _inputs(REPO / "requirements" / "lock.in") + _inputs(REPO / "requirements" / "detectron2-wheel.in")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [text for extra in project["optional-dependencies"].values() for text in extra]
    return requirements + [Requirement(text) for text in declared]


def test_the_lock_pins_every_package_the_set_up_installs_with_a_hash_on_each_tested_python():
    pins = locked_install.read_lock(LOCK)
    assert len(pins) > 100 and all(pin.hashes for pin in pins), [pin.name for pin in pins if not pin.hashes]
    assert all(digest.startswith("sha256:") and len(digest) == 71 for pin in pins for digest in pin.hashes)
    wanted = _what_the_set_up_installs()
    names = {locked_install.canonical(requirement.name) for requirement in wanted}
    assert {"torch", "torchvision", "sal-detectron2", "setuptools", "wheel", "pip", "opencv-python-headless",
            "fvcore", "iopath", "hydra-core", "scipy", "pytest", "submitit", "onnx"} <= names
    for python in PYTHONS:
        environment = _linux_x86_64(python)
        applying = {}
        for pin in pins:
            if not pin.marker or Marker(pin.marker).evaluate(environment):
                assert pin.name not in applying, f"two lines of {pin.name} apply on Python {python}"
                applying[pin.name] = pin.version
        for requirement in wanted:
            name = locked_install.canonical(requirement.name)
            assert name in applying, f"the lock has no {name} for Python {python}"
            assert requirement.specifier.contains(applying[name], prereleases=True), \
                f"{name}=={applying[name]} (Python {python}) is outside {requirement}: regenerate the lock"
    sal = [pin for pin in pins if pin.name == "sal-detectron2"]
    assert len(sal) == 1 and not sal[0].marker and sal[0].hashes


def test_the_lock_names_no_index_or_local_path():
    text = LOCK.read_text()
    assert not re.search(r"--(extra-)?index-url|--find-links|file:|https?://", text)
    assert text.startswith("# This file was autogenerated by uv via the following command:\n#    scripts/update_lock.sh\n")


def test_the_set_up_installs_through_the_lock_except_where_it_says_so():
    """Every plain pip install in setup_env.sh is one of the three that the script's header names as
    not from the lock (a detectron2 built from D2_SOURCE, detectron2 v0.6's Pillow < 10) or gwdet
    itself without dependencies."""
    script = (REPO / "scripts" / "setup_env.sh").read_text()
    plain = [line.strip() for line in script.splitlines() if '"${pip[@]}" install' in line]
    assert plain == ['"${pip[@]}" install --no-build-isolation "$d2_source"',
                     '"${pip[@]}" install -q "Pillow<10" || die "installing Pillow < 10 failed; it has wheels for '
                     'Python 3.10 and 3.11 only (on 3.12/3.13 pip must build it, which needs libjpeg and zlib '
                     'headers). Use Python 3.10 or 3.11 for detectron2 v0.6, or a detectron2 built from main."',
                     '"${pip[@]}" install -q --no-deps --no-build-isolation -e "$target"']
    assert script.count("locked ") >= 6 and "versions from ${lock#" in script


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real (tiny) wheel of a package ``name`` that requires ``requires``."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gwdet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fresh_python(tmp_path) -> Path:
    """A new virtual environment whose only package is this environment's pip."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pip_only = tmp_path / "pip_only"
    pip_only.mkdir()
    (pip_only / "pip").symlink_to(Path(importlib.util.find_spec("pip").origin).parent)
    Path(site, "pip-only.pth").write_text(f"{pip_only}\n")
    return python


def _locked(python: Path, lock: Path, wheels: Path, *arguments: str) -> subprocess.CompletedProcess:
    """scripts/locked_install.py run by ``python``, with pip offline on the folder ``wheels``."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    environment.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_CONFIG_FILE=os.devnull)
    return subprocess.run([str(python), str(REPO / "scripts" / "locked_install.py"), str(lock), *arguments],
                          capture_output=True, text=True, env=environment, timeout=300)


def test_locked_install_installs_the_plan_hash_checked_and_refuses_what_the_lock_lacks(tmp_path, fresh_python):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    upper = _wheel(wheels, "gwdetprobe_upper", "1.0", ("gwdetprobe_lower",))
    lower = _wheel(wheels, "gwdetprobe_lower", "2.0")
    _wheel(wheels, "gwdetprobe_lower", "3.0")  # newer, but not the lock's
    lock = tmp_path / "lock.txt"
    lock.write_text(f"gwdetprobe-lower==2.0 \\\n    --hash={_sha256(lower)}\n    # via gwdetprobe-upper\n"
                    f"gwdetprobe-upper==1.0 \\\n    --hash={_sha256(upper)}\n")

    done = _locked(fresh_python, lock, wheels, "--", "gwdetprobe_upper")
    assert done.returncode == 0, done.stderr
    assert "each file checked against its sha256: gwdetprobe-lower==2.0, gwdetprobe-upper==1.0" in done.stdout
    versions = subprocess.run([str(fresh_python), "-c", "import importlib.metadata as m; "
                               "print(m.version('gwdetprobe_upper'), m.version('gwdetprobe_lower'))"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert versions == ["1.0", "2.0"]  # the lock's lower, not the newest
    again = _locked(fresh_python, lock, wheels, "--", "gwdetprobe_upper")
    assert again.returncode == 0 and "nothing to install for gwdetprobe_upper: all at the versions of lock.txt already" in again.stdout

    tampered = tmp_path / "tampered.txt"  # a file that is not the one the lock was made from
    tampered.write_text(lock.read_text().replace(_sha256(upper), "sha256:" + "0" * 64))
    done = _locked(fresh_python, tampered, wheels, "--exact", "gwdetprobe-upper", "--", "--force-reinstall")
    assert done.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr

    stale = tmp_path / "stale.txt"
    stale.write_text(f"gwdetprobe-upper==1.0 --hash={_sha256(upper)}\n")
    done = _locked(fresh_python, stale, wheels, "--", "gwdetprobe_upper", "--force-reinstall")
    assert done.returncode == 1
    assert "needs gwdetprobe-lower==3.0, which" in done.stderr and "regenerate the lock with scripts/update_lock.sh" \
        in done.stderr


def test_a_lock_line_without_a_pin_is_refused(tmp_path):
    broken = tmp_path / "lock.txt"
    broken.write_text("numpy>=2 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(SystemExit, match=r"not a pinned requirement \(name==version\): 'numpy>=2 .*update_lock.sh"):
        locked_install.read_lock(broken)
