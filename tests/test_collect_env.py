"""``python -m gwdet.collect_env`` reports this process's real environment, and tells apart the ways
detectron2 gets installed."""
import json
import os
import platform
import subprocess
import sys

import detectron2
import pytest
import torch

import gwdet
from gwdet.collect_env import collect_env_info, detectron2_origin, format_report

from conftest import REPO


@pytest.fixture(scope="module")
def cli_report():
    """The JSON report of a fresh interpreter with known thread settings."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GWDET_CACHE": "/nonexistent/gwdet-cache"}
    completed = subprocess.run([sys.executable, "-m", "gwdet.collect_env", "--json"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


def test_versions_are_the_running_ones(cli_report):
    assert cli_report["Python"]["Python"] == platform.python_version()
    assert cli_report["PyTorch"]["torch"] == torch.__version__
    assert cli_report["detectron2"]["detectron2"] == detectron2.__version__
    assert cli_report["detectron2"]["detectron2 path"] == os.path.dirname(os.path.realpath(detectron2.__file__))
    assert cli_report["gwdet"]["gwdet"] == gwdet.__version__


def test_compiled_extension_status_matches_an_import(cli_report):
    try:
        from detectron2 import _C  # noqa: F401
        loads = True
    except Exception:
        loads = False
    status = cli_report["detectron2"]["detectron2._C"]
    features = cli_report["detectron2"]["features needing _C"]
    if loads:
        assert status.startswith("loads")
        assert features == "available: rotated boxes, deformable convolution, fast COCOeval"
    else:
        assert status.startswith("does not load")
        assert features.startswith("missing: ")
        for feature in ("rotated boxes", "deformable convolution", "fast COCOeval"):
            assert feature in features
        assert "--no-build-isolation" in cli_report["detectron2"]["to get _C"]


def test_norm_names_and_backbones_are_gwdet_registrations(cli_report):
    names = getattr(gwdet, "known_norm_names", None)
    if callable(names):
        assert cli_report["gwdet"]["norm names"] == ", ".join(names())
        assert "GW" in cli_report["gwdet"]["norm names"].split(", ")
    else:
        assert "not available" in cli_report["gwdet"]["norm names"]
    assert "build_gw_resnet_fpn_backbone" in cli_report["gwdet"]["gwdet backbones"]


def test_thread_settings_are_reported(cli_report):
    threads = cli_report["threads"]
    assert threads["OMP_NUM_THREADS"] == "1"
    assert threads["torch.get_num_threads"] == "1"
    assert threads["os.cpu_count"] == str(os.cpu_count())
    assert cli_report["environment"]["GWDET_CACHE"] == "/nonexistent/gwdet-cache"


def test_the_feature_probes_answer(cli_report):
    from gwdet.data.resumable import loader_accepts_seed

    seeding = cli_report["detectron2"]["train loader seeding"]
    assert seeding.startswith("build_detection_train_loader(seed=) present") == loader_accepts_seed()
    assert cli_report["detectron2"]["detectron2.data"] == "imports"


def test_text_form_has_one_line_per_entry():
    report = collect_env_info()
    text = format_report(report)
    assert "torch" in text and torch.__version__ in text
    assert len(text.splitlines()) == len(report) + sum(len(section) for section in report.values())


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
    assert "broken on purpose" in report["detectron2"]["detectron2"]
    assert report["gwdet"]["gwdet"].startswith("error: ")
    assert report["PyTorch"]["torch"] == torch.__version__
