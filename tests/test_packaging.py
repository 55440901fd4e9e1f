"""gwdet as an installed library: its wheel, installed WITH dependency resolution into a fresh
virtual environment that already holds torch and detectron2, changes neither, declares exactly what
gwdet imports, carries every config, and works from any folder without the repository, with no
``pkg_resources`` importable (setuptools >= 81 has none).

The wheel is built from a copy of the checkout (so no build/ folder lands in the repository) with
``pip wheel --no-deps --no-build-isolation`` (the environment's setuptools, nothing downloaded). The
fresh environment (``python -m venv --without-pip``) sees every package of this one, torch,
detectron2 and pip included, but not its gwdet, through a ``.pth`` file: pip lists them as installed,
and cannot change them (they lie outside the new environment). gwdet is then installed by name with
``pip install --no-index --find-links <the wheel's folder>``: pip resolves gwdet's dependencies
against what is installed, and could only fail, not download, when one is missing. Subprocesses run
that environment's python and console scripts in a fresh working directory outside the repository.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

import gwdet
from conftest import REPO, TINY_OPTS
from gwdet.engine.arguments import parse_args
from gwdet.model_zoo import get_config, get_config_file, list_configs, resolve_config_file
from test_lazy_training import LAZY_TINY

# Not part of a build: environments, outputs and what earlier builds left.
NOT_COPIED = {".git", "build", "dist", "output", "datasets", "weights", ".pytest_cache", ".gl", "__pycache__"}
SCRIPTS = ("gwdet-train", "gwdet-convert", "gwdet-export")
EXTRAS = ("lab", "deploy", "cluster", "test")
DEMO = "Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml"
LAZY_DEMO = "LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py"
# Imported by gwdet and deliberately not declared: torch and torchvision (pip could replace a user's
# torch, to which a compiled detectron2 is tied; pyproject.toml), triton (comes with torch's CUDA
# builds; gwdet uses it only when it imports), detectron2 (not on the package index by that name).
NOT_DECLARED = {"torch", "torchvision", "triton", "detectron2"}
# Imported only by an optional part of gwdet: the extra that must declare it.
EXTRA_IMPORTS = {"submitit": "cluster", "onnx": "deploy", "onnxruntime": "deploy"}
# In a subprocess's PYTHONPATH: a sitecustomize that makes `import pkg_resources` fail, as it does
# with setuptools >= 81 (a None entry in sys.modules is Python's own way to block an import).
NO_PKG_RESOURCES = 'import sys\nsys.modules["pkg_resources"] = None\n'


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {name for name in names
            if name in NOT_COPIED or name.startswith(".venv") or name.endswith((".egg-info", ".pyc"))}


def _repo_configs() -> list[str]:
    root = REPO / "configs"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _pip(*args: str, cwd: Path, python: str = sys.executable) -> str:
    """pip of ``python``, ignoring pip's configuration and environment variables (no index, no extra
    find-links or constraints of this machine)."""
    done = subprocess.run([python, "-m", "pip", "--isolated", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# gwdet's own entries in a site-packages folder: its packages (gwdet, gwdet_lab), its metadata
# (gwdet-0.1.0.dist-info, gwdet.egg-info) and an editable install's finder (__editable___gwdet_...).
GWDET_ENTRY = re.compile(r"(__editable__[._]+)?gwdet([-_.]|$)")


def _fresh_environment_with_this_ones_packages(base: Path) -> tuple[Path, Path]:
    """A new virtual environment in which every package of this one (torch, torchvision, detectron2,
    detectron2's dependencies, pip) is installed already, except gwdet: (its python, its
    site-packages). This environment's site-packages reaches it as a folder of links to each entry
    but gwdet's files; detectron2, when it lies outside site-packages (the set-up's registry wheel),
    through its own folder."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    outer_site = Path(sysconfig.get_paths()["purelib"])
    packages = base / "outer-site-packages"
    packages.mkdir()
    for entry in outer_site.iterdir():
        if GWDET_ENTRY.match(entry.name) or entry.suffix == ".pth" or entry.name == "__pycache__":
            continue
        (packages / entry.name).symlink_to(entry)
    folders = [str(packages)]
    detectron2_parent = Path(importlib.util.find_spec("detectron2").origin).parents[1]
    if detectron2_parent.resolve() != outer_site.resolve():
        folders.append(str(detectron2_parent))
    (site / "outer-environment.pth").write_text("\n".join(folders) + "\n")
    return python, site


# torch's, torchvision's and detectron2's version and where each is imported from.
FRAMEWORKS = """
import importlib.metadata as m, importlib.util, json, os
spec = importlib.util.find_spec("detectron2")
import detectron2
print(json.dumps({
    "torch": [m.version("torch"), os.path.realpath(importlib.util.find_spec("torch").origin)],
    "torchvision": [m.version("torchvision"), os.path.realpath(importlib.util.find_spec("torchvision").origin)],
    "detectron2": [detectron2.__version__, os.path.realpath(spec.origin)],
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """{"wheel": the built wheel, "python": the fresh environment's interpreter, "bin": its scripts,
    "site": its site-packages, "elsewhere": an empty working directory outside the repository,
    "before"/"after": FRAMEWORKS before and after the install, "report": pip's installation report}."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)
    wheels = base / "wheel"
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source), cwd=base)
    built = list(wheels.glob("gwdet-*.whl"))
    assert len(built) == 1, built
    python, site = _fresh_environment_with_this_ones_packages(base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(REPO)

    def frameworks() -> dict:
        done = subprocess.run([str(python), "-c", FRAMEWORKS], cwd=elsewhere, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    before = frameworks()
    report = base / "report.json"
    _pip("install", "-q", "--no-index", "--find-links", str(wheels), "--report", str(report), "gwdet",
         cwd=elsewhere, python=str(python))
    return {"wheel": built[0], "python": python, "bin": python.parent, "site": site, "elsewhere": elsewhere,
            "before": before, "after": frameworks(), "report": json.loads(report.read_text())}


def _environment(extra_path: Path | None = None) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    environment["OMP_NUM_THREADS"] = "1"
    if extra_path is not None:
        environment["PYTHONPATH"] = str(extra_path)
    return environment


def _run(command: list[str], installed: dict, timeout: float = 300, extra_path: Path | None = None
         ) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=installed["elsewhere"], env=_environment(extra_path),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def without_pkg_resources(tmp_path_factory) -> Path:
    """A folder for PYTHONPATH whose sitecustomize blocks ``import pkg_resources``."""
    folder = tmp_path_factory.mktemp("no_pkg_resources")
    (folder / "sitecustomize.py").write_text(NO_PKG_RESOURCES)
    return folder


@pytest.mark.slow
def test_pip_installs_gwdet_alone_and_keeps_torch_and_detectron2(installed):
    installs = [(item["metadata"]["name"], item["metadata"]["version"]) for item in installed["report"]["install"]]
    assert installs == [("gwdet", gwdet.__version__)], "pip installed or replaced something beside gwdet"
    assert installed["after"] == installed["before"]
    outer = sysconfig.get_paths()["purelib"]
    for name in ("torch", "torchvision"):
        assert installed["after"][name][1].startswith(os.path.realpath(outer)), installed["after"][name]
    assert not any(installed["site"].glob("torch*")) and not any(installed["site"].glob("detectron2*"))
    listed = {_canonical(item["name"]): item["version"]
              for item in json.loads(_pip("list", "--format=json", cwd=installed["elsewhere"],
                                          python=str(installed["python"])))}
    assert listed["torch"] == installed["before"]["torch"][0]  # pip saw torch as installed
    assert listed["torchvision"] == installed["before"]["torchvision"][0]
    assert listed["gwdet"] == gwdet.__version__
    assert {"fvcore", "omegaconf", "pycocotools", "numpy"} <= set(listed)
    checked = _pip("check", cwd=installed["elsewhere"], python=str(installed["python"]))
    assert "No broken requirements found" in checked


def _wheel_metadata(wheel_path: Path) -> tuple[list[str], str, str]:
    """The wheel's file names, its METADATA and its entry_points.txt."""
    with zipfile.ZipFile(wheel_path) as wheel:
        names = wheel.namelist()
        info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        return names, wheel.read(f"{info}/METADATA").decode(), wheel.read(f"{info}/entry_points.txt").decode()


@pytest.mark.slow
def test_the_wheel_carries_every_config_the_metadata_and_the_scripts(installed):
    names, metadata, entry_points = _wheel_metadata(installed["wheel"])
    prefix = "gwdet/model_zoo/configs/"
    packaged = sorted(name[len(prefix):] for name in names if name.startswith(prefix) and not name.endswith("/"))
    repo_configs = _repo_configs()
    assert len(repo_configs) > 20 and packaged == repo_configs
    assert f"Version: {gwdet.__version__}\n" in metadata
    for extra in EXTRAS:
        assert f"Provides-Extra: {extra}\n" in metadata
    assert "gwdet/model_zoo/__init__.py" in names
    for script, function in zip(SCRIPTS, ("gwdet.cluster.training:run", "gwdet.convert.cli:main",
                                          "gwdet.export.export_model:main"), strict=True):
        assert f"{script} = {function}" in entry_points
        assert (installed["bin"] / script).is_file()


def _declared(metadata: str) -> dict[str, set[str]]:
    """The wheel's requirements by extra ("" for the plain install): canonical distribution names."""
    declared: dict[str, set[str]] = {"": set()}
    extras = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")]
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        marker: Marker | None = requirement.marker
        for extra in ["", *extras]:
            if marker is None and extra == "" or marker is not None and extra and marker.evaluate({"extra": extra}):
                declared.setdefault(extra, set()).add(_canonical(requirement.name))
    return declared


def _imported_distributions(*folders: Path) -> set[str]:
    """Canonical names of the distributions whose modules the Python files under ``folders`` import
    (every import statement, at any depth; not the standard library's, not gwdet's own); a module
    that no installed distribution provides is reported under its own name."""
    providers = importlib.metadata.packages_distributions()
    modules = set()
    for folder in folders:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"gwdet", "gwdet_lab"}
    return {_canonical(providers[module][0]) if module in providers else module for module in modules}


@pytest.mark.slow
def test_the_wheel_declares_what_gwdet_imports_and_no_torch(installed):
    _, metadata, _ = _wheel_metadata(installed["wheel"])
    declared = _declared(metadata)
    everything = set().union(*declared.values())
    assert not everything & {"torch", "torchvision", "detectron2", "sal-detectron2"}, everything
    plugin = _imported_distributions(REPO / "gwdet", REPO / "configs")
    optional = set(EXTRA_IMPORTS)
    assert declared[""] == plugin - NOT_DECLARED - optional  # every import declared, nothing more
    for module, extra in EXTRA_IMPORTS.items():
        assert module in plugin and module in declared[extra] and module not in declared[""], module
    lab = _imported_distributions(REPO / "gwdet_lab")
    assert declared["lab"] == lab - declared[""] - NOT_DECLARED, "the lab extra is what gwdet_lab imports beside gwdet"


CHECKS = """
import json, sys
from pathlib import Path
import gwdet
from gwdet import model_zoo
cfg = model_zoo.get_config("Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml")
lazy = {name: model_zoo.get_config(name) for name in model_zoo.list_configs() if name.endswith(".py")}
try:
    import pkg_resources
    blocked = False
except ModuleNotFoundError:
    blocked = True
model_zoo_imported = [name for name in sys.modules if name.startswith("detectron2.model_zoo")]
try:  # what the block does to detectron2's own model_zoo (as setuptools >= 81 does)
    import detectron2.model_zoo
    model_zoo_error = ""
except ModuleNotFoundError as error:
    model_zoo_error = str(error)
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
    "lazy_backbone_positions": lazy["LazyConfig/mask_rcnn_R_50_FPN_gw.py"].model.backbone.bottom_up.positions,
    "lazy_has": {name: sorted(k for k in ("model", "dataloader", "optimizer", "train") if k in config)
                 for name, config in lazy.items()},
    "pkg_resources_blocked": blocked,
    "model_zoo_imported": model_zoo_imported,
    "model_zoo_error": model_zoo_error,
}))
"""


@pytest.mark.slow
def test_the_installed_package_loads_every_config_from_another_folder_without_pkg_resources(
        installed, without_pkg_resources):
    done = _run([str(installed["python"]), "-c", CHECKS], installed, extra_path=without_pkg_resources)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["pkg_resources_blocked"] and report["model_zoo_imported"] == []
    assert "pkg_resources" in report["model_zoo_error"]  # the block is what detectron2's model_zoo needs
    site = installed["site"].resolve()
    assert Path(report["file"]).resolve().is_relative_to(site)  # the wheel's gwdet, not the checkout's
    assert str(REPO) not in report["sys.path"]
    assert report["version"] == gwdet.__version__
    assert Path(report["configs_dir"]).resolve() == site / "gwdet" / "model_zoo" / "configs"
    assert Path(report["headline"]).resolve() == site / "gwdet" / "model_zoo" / "configs" / "mask_rcnn_gw.yaml"
    parts = {"LazyConfig/gw_parts.py", "LazyConfig/common/shapes.py"}  # imported by the configs, not configs
    assert report["configs"] == [name for name in _repo_configs() if name.endswith((".yaml", ".py")) and name not in parts]
    assert report["gw_positions"] == "S1-B2" and report["gw_groups"] > 0 and not report["frozen"]
    assert report["lazy_backbone_positions"] == "S1-B2"
    full = ["dataloader", "model", "optimizer", "train"]
    assert report["lazy_has"] == {name: full for name in report["lazy_has"]}
    assert len(report["lazy_has"]) >= 7


@pytest.mark.slow
def test_the_console_scripts_run_from_another_folder(installed):
    running = {script: subprocess.Popen([str(installed["bin"] / script), "--help"], cwd=installed["elsewhere"],
                                        env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for script in SCRIPTS}
    for script, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"{script} --help:\n{stderr}"
        assert f"usage: {script}" in stdout


@pytest.mark.slow
def test_gwdet_train_trains_a_packaged_config_given_by_name(installed):
    output = installed["elsewhere"] / "run"
    command = [str(installed["bin"] / "gwdet-train"), "--config-file", DEMO, "--threads", "1",
               *TINY_OPTS, "OUTPUT_DIR", str(output)]
    done = _run(command, installed)
    assert done.returncode == 0, done.stderr[-3000:]
    packaged = installed["site"] / "gwdet" / "model_zoo" / "configs" / DEMO
    assert f"using gwdet's packaged config '{DEMO}' ({packaged})" in done.stderr
    assert json.loads((output / "results.json").read_text())
    assert f"Contents of args.config_file={packaged}" in (output / "log.txt").read_text()


@pytest.mark.slow
def test_gwdet_train_trains_a_packaged_lazy_config_without_pkg_resources(installed, without_pkg_resources):
    """The LazyConfig path of issue 36: installed with its dependencies, trained by name from another
    folder, with no pkg_resources importable (setuptools >= 81)."""
    output = installed["elsewhere"] / "lazy_run"
    command = [str(installed["bin"] / "gwdet-train"), "--config-file", LAZY_DEMO, "--threads", "1", *LAZY_TINY,
               "train.max_iter=1", "dataloader.shapes.num_val=2", f"train.output_dir={output}"]
    done = _run(command, installed, extra_path=without_pkg_resources)
    assert done.returncode == 0, done.stderr[-3000:]
    packaged = installed["site"] / "gwdet" / "model_zoo" / "configs" / LAZY_DEMO
    assert f"using gwdet's packaged config '{LAZY_DEMO}' ({packaged})" in done.stderr
    assert (output / "model_final.pth").is_file()
    metrics = [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]
    assert any("total_loss" in record for record in metrics)
    assert "bbox" in json.loads((output / "results.json").read_text())["shapes_val"]


@pytest.mark.slow
def test_a_config_found_nowhere_names_both_places(installed):
    done = _run([str(installed["bin"] / "gwdet-train"), "--config", "configs/no_such.yaml"], installed)
    assert done.returncode == 2
    assert "gwdet-train: error: Config file 'configs/no_such.yaml' does not exist" in done.stderr
    assert str(installed["elsewhere"] / "configs" / "no_such.yaml") in done.stderr
    assert str(installed["site"] / "gwdet" / "model_zoo" / "configs") in done.stderr
    assert "\n  mask_rcnn_gw.yaml" in done.stderr and "Traceback" not in done.stderr


# ---- the checkout (an editable install): the same names, resolved to the repository's configs/ ----


def test_a_checkout_reads_the_repository_configs(tmp_path, monkeypatch):
    assert get_config_file("mask_rcnn_gw.yaml") == str(REPO / "configs" / "mask_rcnn_gw.yaml")
    # the LazyConfig parts the configs import are no configs: get_config of one defined no model without a word
    parts = ["LazyConfig/common/shapes.py", "LazyConfig/gw_parts.py"]
    assert list_configs() == [name for name in _repo_configs() if name.endswith((".yaml", ".py")) and name not in parts]
    for name in parts:
        with pytest.raises(ValueError, match=r"defines no model"):
            get_config(name)
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
