"""``python -m gwdet.collect_env`` prints detectron2's own table and gwdet's rows of this process's
real environment, tells apart the ways detectron2 and gwdet get installed, and still reports when
gwdet cannot be imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

import detectron2
import pytest
import torch
from detectron2.utils.collect_env import collect_env_info as detectron2_env_info

import gwdet
from gwdet.collect_env import detectron2_origin, format_rows, gwdet_rows, main, table_rows

from conftest import REPO


@pytest.fixture(scope="module")
def cli_report():
    """The JSON report of a fresh interpreter with known settings."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GWDET_CACHE": "/nonexistent/gwdet-cache",
           "GWDET_ALLOW_NORM_MISMATCH": "1"}
    env.pop("GWDET_ALLOW_UNSAFE_PICKLE", None)
    completed = subprocess.run([sys.executable, "-m", "gwdet.collect_env", "--json"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


def test_detectron2_s_rows_are_detectron2_s_own_table(cli_report):
    assert cli_report["detectron2"] == table_rows(detectron2_env_info())
    assert cli_report["detectron2"]["PyTorch"].startswith(torch.__version__ + " @")
    assert cli_report["detectron2"]["detectron2"].startswith(detectron2.__version__ + " @")


def test_gwdet_s_rows_are_the_running_gwdet(cli_report):
    rows = cli_report["gwdet"]
    assert rows["gwdet"] == f"{gwdet.__version__} @{REPO / 'gwdet'}"
    assert rows["norm names"] == ", ".join(gwdet.known_norm_names()) and "GW" in rows["norm names"].split(", ")
    assert "BACKBONE_REGISTRY: build_gw_resnet_backbone, build_gw_resnet_fpn_backbone" in rows["gwdet components"]
    assert "SEM_SEG_HEADS_REGISTRY: GWSemSegFPNHead" in rows["gwdet components"]  # before: six registries only
    assert rows["execution plan"].startswith("GW/BW execution plan: ")
    assert rows["threads"].startswith("torch uses 1 (inter-op ") and f"({os.cpu_count()} on the machine)" in rows["threads"]
    assert rows["OMP_NUM_THREADS"] == "1" and rows["GWDET_CACHE"] == "/nonexistent/gwdet-cache"
    # every variable that changes what gwdet loads, builds or registers, set or not
    assert rows["GWDET_ALLOW_NORM_MISMATCH"] == "1" and rows["GWDET_ALLOW_UNSAFE_PICKLE"] == "<not set>"
    assert {"GWDET_GW_PLAN", "GWDET_REGISTER_COCO"} <= set(rows)
    assert rows["detectron2 origin"] == detectron2_origin(Path(detectron2.__file__).resolve().parent)


def test_the_text_form_is_detectron2_s_table_then_gwdet_s():
    completed = subprocess.run([sys.executable, "-m", "gwdet.collect_env"], cwd=REPO, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    own = format_rows(gwdet_rows())
    assert completed.stdout.rstrip("\n").endswith(own.splitlines()[-1])
    table = completed.stdout[: completed.stdout.index("\n" + own.splitlines()[0])]
    assert table_rows(table) == table_rows(detectron2_env_info())
    assert table_rows(completed.stdout[len(table) + 1:])["gwdet"].startswith(gwdet.__version__)


def test_table_rows_reads_a_plain_table_and_nothing_else():
    text = format_rows({"a key": "a value", "b": "two words"})
    assert table_rows(text) == {"a key": "a value", "b": "two words"}
    assert table_rows("detectron2's environment table: error: ImportError: x") == {}


def _write_dist_info(folder, name, version, package="detectron2", direct_url=None):
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")
    (info / "RECORD").write_text(f"{package}/__init__.py,sha256=x,1\n{info.name}/METADATA,,\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_origin_of_gwdet_setup_wheel(tmp_path):
    dist = tmp_path / "detectron2-dist"
    (dist / "detectron2").mkdir(parents=True)
    _write_dist_info(dist, "sal-detectron2", "0.7.2")
    origin = detectron2_origin(dist / "detectron2")
    assert origin.startswith("wheel: sal-detectron2 0.7.2") and "setup_env.sh" in origin


def test_origin_of_a_source_build(tmp_path):
    site = tmp_path / "site-packages"
    (site / "detectron2").mkdir(parents=True)
    _write_dist_info(site, "detectron2", "0.6", direct_url={"url": "file:///src/detectron2", "dir_info": {}})
    assert detectron2_origin(site / "detectron2") == "source build: detectron2 0.6 from the folder /src/detectron2"


def test_origin_of_a_git_build_and_of_an_index_wheel(tmp_path):
    site = tmp_path / "site-packages"
    (site / "detectron2").mkdir(parents=True)
    _write_dist_info(site, "detectron2", "0.6", direct_url={
        "url": "https://github.com/facebookresearch/detectron2.git",
        "vcs_info": {"vcs": "git", "commit_id": "02b5c4e"}})
    assert detectron2_origin(site / "detectron2").endswith("at commit 02b5c4e")
    other = tmp_path / "other"
    (other / "detectron2").mkdir(parents=True)
    _write_dist_info(other, "some-detectron2", "1.0")
    assert detectron2_origin(other / "detectron2") == "wheel: some-detectron2 1.0 from a package index"


def test_origin_of_a_bare_source_tree(tmp_path):
    (tmp_path / "checkout" / "detectron2").mkdir(parents=True)
    assert detectron2_origin(tmp_path / "checkout" / "detectron2").startswith("source tree on sys.path")


def test_when_gwdet_does_not_import_the_report_is_detectron2_s_table_and_the_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gwdet", None)  # `import gwdet` now fails (ModuleNotFoundError)
    assert main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gwdet"] == {"gwdet": "error: ModuleNotFoundError: import of gwdet halted; None in sys.modules"}
    assert report["detectron2"]["PyTorch"].startswith(torch.__version__)


def test_run_as_a_file_it_reports_a_broken_detectron2_instead_of_crashing(tmp_path):
    """``python gwdet/collect_env.py`` works when ``import gwdet`` cannot (here: a detectron2 that
    fails to import shadows the real one)."""
    fake = tmp_path / "shadow" / "detectron2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this detectron2 is broken on purpose')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    completed = subprocess.run([sys.executable, str(REPO / "gwdet" / "collect_env.py"), "--json"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    assert report["detectron2"] == {"error": "detectron2's environment table: error: ImportError: this detectron2 is "
                                             "broken on purpose"}
    assert report["gwdet"] == {"gwdet": "error: ImportError: this detectron2 is broken on purpose"}


# GWDET_ALLOW_NORM_MISMATCH=maybe showed as 'maybe' without a word, while an invalid GWDET_GW_PLAN was flagged
def test_an_environment_variable_value_gwdet_refuses_is_flagged_with_the_refusal(monkeypatch):
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "maybe")
    monkeypatch.setenv("GWDET_ALLOW_UNSAFE_PICKLE", "1")
    monkeypatch.setenv("GWDET_REGISTER_COCO", "mine")
    rows = gwdet_rows()
    assert rows["GWDET_ALLOW_NORM_MISMATCH"] == (
        "maybe  (gwdet refuses this value: error: GwdetValueError: GWDET_ALLOW_NORM_MISMATCH='maybe' is neither 1 "
        "nor 0: set GWDET_ALLOW_NORM_MISMATCH=1 to load weights trained with other norm layers or settings, or unset it.)")
    assert rows["GWDET_ALLOW_UNSAFE_PICKLE"] == "1"
    assert rows["GWDET_REGISTER_COCO"].startswith(
        "mine  (gwdet refuses this value: error: DatasetError: GWDET_REGISTER_COCO must be a JSON list of")
