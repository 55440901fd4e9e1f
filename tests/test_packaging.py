"""gwdet as an installed library: the wheel carries every config, and the installed package works
from any folder without the repository.

The wheel is built from a copy of the checkout (so no build/ folder lands in the repository) with
``pip wheel --no-deps --no-build-isolation`` (the environment's setuptools, nothing downloaded),
installed with ``pip install --no-deps --target SITE``, and used by subprocesses whose working
directory is a fresh folder and whose only gwdet is SITE's (``PYTHONPATH=SITE``; detectron2 and
torch come from this environment).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gwdet
from conftest import REPO, TINY_OPTS
from gwdet.engine.trainer import parse_args
from gwdet.model_zoo import get_config_file, list_configs, resolve_config_file

# Not part of a build: environments, outputs and what earlier builds left.
NOT_COPIED = {".git", "build", "dist", "output", "datasets", "weights", ".pytest_cache", ".gl", "__pycache__"}
SCRIPTS = ("gwdet-train", "gwdet-convert", "gwdet-export")
EXTRAS = ("lab", "deploy", "cluster", "test")
DEMO = "Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml"


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {name for name in names
            if name in NOT_COPIED or name.startswith(".venv") or name.endswith((".egg-info", ".pyc"))}


def _repo_configs() -> list[str]:
    root = REPO / "configs"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """{"wheel": the built wheel, "site": the folder it is installed into, "elsewhere": an empty
    working directory outside the repository}."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(base / "wheel"), str(source), cwd=base)
    wheels = list((base / "wheel").glob("gwdet-*.whl"))
    assert len(wheels) == 1, wheels
    site = base / "site"
    _pip("install", "--no-deps", "-q", "--target", str(site), str(wheels[0]), cwd=base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(REPO)
    return {"wheel": wheels[0], "site": site, "elsewhere": elsewhere}


def _environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


def _run(command: list[str], installed: dict[str, Path], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=installed["elsewhere"], env=_environment(installed["site"]),
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_every_config_the_metadata_and_the_scripts(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
        prefix = "gwdet/model_zoo/configs/"
        packaged = sorted(name[len(prefix):] for name in names if name.startswith(prefix) and not name.endswith("/"))
        info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    repo_configs = _repo_configs()
    assert len(repo_configs) > 20 and packaged == repo_configs
    assert f"Version: {gwdet.__version__}\n" in metadata
    for extra in EXTRAS:
        assert f"Provides-Extra: {extra}\n" in metadata
    assert "gwdet/model_zoo/__init__.py" in names
    for script, function in zip(SCRIPTS, ("gwdet.cluster.training:run", "gwdet.convert.cli:main",
                                          "gwdet.export.export_model:main"), strict=True):
        assert f"{script} = {function}" in entry_points
        assert (installed["site"] / "bin" / script).is_file()


CHECKS = """
import json, sys
from pathlib import Path
import gwdet
from gwdet import model_zoo
cfg = model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml")
lazy = model_zoo.get_config("LazyConfig/mask_rcnn_R_50_FPN_gw.py")
print(json.dumps({
    "file": gwdet.__file__,
    "version": gwdet.__version__,
    "sys.path": [str(Path(p).resolve()) for p in sys.path],
    "configs_dir": str(model_zoo.configs_dir()),
    "headline": model_zoo.get_config_file("mask_rcnn_gw.yaml"),
    "configs": model_zoo.list_configs(),
    "gw_positions": cfg.MODEL.RESNETS.GW_POSITIONS,
    "gw_groups": cfg.MODEL.GW.NUM_GROUPS,
    "frozen": cfg.is_frozen(),
    "lazy_backbone_positions": lazy.model.backbone.bottom_up.positions,
    "lazy_has": sorted(k for k in ("model", "dataloader", "optimizer", "train") if k in lazy),
}))
"""


def test_the_installed_package_finds_its_configs_from_another_folder(installed):
    done = _run([sys.executable, "-c", CHECKS], installed)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    site = installed["site"].resolve()
    assert Path(report["file"]).resolve().is_relative_to(site)  # the wheel's gwdet, not the checkout's
    assert str(REPO) not in report["sys.path"]
    assert report["version"] == gwdet.__version__
    assert Path(report["configs_dir"]).resolve() == site / "gwdet" / "model_zoo" / "configs"
    assert Path(report["headline"]).resolve() == site / "gwdet" / "model_zoo" / "configs" / "mask_rcnn_gw.yaml"
    assert report["configs"] == [name for name in _repo_configs() if name.endswith((".yaml", ".py"))]
    assert report["gw_positions"] == "S1-B2" and report["gw_groups"] > 0 and not report["frozen"]
    assert report["lazy_backbone_positions"] == "S1-B2"
    assert report["lazy_has"] == ["dataloader", "model", "optimizer", "train"]


def test_the_console_scripts_run_from_another_folder(installed):
    for script in SCRIPTS:
        done = _run([str(installed["site"] / "bin" / script), "--help"], installed)
        assert done.returncode == 0, f"{script} --help:\n{done.stderr}"
        assert f"usage: {script}" in done.stdout


def test_gwdet_train_trains_a_packaged_config_given_by_name(installed):
    output = installed["elsewhere"] / "run"
    command = [str(installed["site"] / "bin" / "gwdet-train"), "--config-file", DEMO, "--threads", "1",
               *TINY_OPTS, "OUTPUT_DIR", str(output)]
    done = _run(command, installed)
    assert done.returncode == 0, done.stderr[-3000:]
    packaged = installed["site"] / "gwdet" / "model_zoo" / "configs" / DEMO
    assert f"using gwdet's packaged config '{DEMO}' ({packaged})" in done.stderr
    assert json.loads((output / "results.json").read_text())
    assert f"Contents of args.config_file={packaged}" in (output / "log.txt").read_text()


def test_a_config_found_nowhere_names_both_places(installed):
    done = _run([str(installed["site"] / "bin" / "gwdet-train"), "--config", "configs/no_such.yaml"], installed)
    assert done.returncode == 2
    assert "gwdet-train: error: Config file 'configs/no_such.yaml' does not exist" in done.stderr
    assert str(installed["elsewhere"] / "configs" / "no_such.yaml") in done.stderr
    assert str(installed["site"] / "gwdet" / "model_zoo" / "configs") in done.stderr
    assert "\n  mask_rcnn_gw.yaml" in done.stderr and "Traceback" not in done.stderr


# ---- the checkout (an editable install): the same names, resolved to the repository's configs/ ----


def test_a_checkout_reads_the_repository_configs(tmp_path, monkeypatch):
    assert get_config_file("mask_rcnn_gw.yaml") == str(REPO / "configs" / "mask_rcnn_gw.yaml")
    assert list_configs() == [name for name in _repo_configs() if name.endswith((".yaml", ".py"))]
    with pytest.raises(FileNotFoundError, match=r"Did you mean 'COCO-Detection/faster_rcnn_R_50_FPN_1x_gw.yaml'"):
        get_config_file("faster_rcnn_R_50_FPN_1x_gw.yaml")
    with pytest.raises(FileNotFoundError, match="outside gwdet's configs folder"):
        get_config_file("../setup.py")

    monkeypatch.chdir(tmp_path)
    local = tmp_path / "configs" / "mask_rcnn_gw.yaml"
    announced = []
    assert resolve_config_file("configs/mask_rcnn_gw.yaml", announced.append) == str(REPO / "configs" / "mask_rcnn_gw.yaml")
    assert len(announced) == 1 and str(local) in announced[0]
    local.parent.mkdir()
    local.write_text("MODEL:\n  MASK_ON: True\n")
    assert resolve_config_file("configs/mask_rcnn_gw.yaml", announced.append) == "configs/mask_rcnn_gw.yaml"  # a local file wins
    assert len(announced) == 1


def test_the_train_tool_takes_a_config_name_with_either_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    demo = str(REPO / "configs" / DEMO)
    assert parse_args(["--config", DEMO, "SOLVER.MAX_ITER", "2"]).config_file == demo
    assert parse_args([f"--config-file={DEMO}", "--resume"]).config_file == demo
    assert parse_args(["SOLVER.MAX_ITER", "2", "--config-file", DEMO]).config_file == demo
    assert "using gwdet's packaged config" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--config", "nowhere.yaml"])
    assert stopped.value.code == 2 and "not among gwdet's packaged configs" in capsys.readouterr().err
