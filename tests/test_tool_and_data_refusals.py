"""Bad inputs of the tools and of registered data: a benchmark report cut short on a full disk, a
section name that breaks its marker, a repeated list flag, COCO image entries that share a file or
have float ids, a folder given as an export, the --register-coco help, the export tool's refusal of
a sample image without detections, collect_env's report into a closed pipe or a full disk, and an
export loaded onto a device the machine lacks.
Each is refused (or handled) with a message naming the file, flag or id and the fix."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from gwdet.collect_env import write_report
from gwdet.errors import GwdetIsADirectoryError, GwdetOSError, GwdetValueError
from gwdet.utils import atomic
from gwdet_lab.benchmark import cli as benchmark_cli
from gwdet_lab.benchmark.report import markers, write_section

from conftest import DEMO_CONFIG, REPO, TINY_OPTS
from gwdet.data import CocoDataset, DatasetError
from test_coco_sweep_checks import refusal, write_dataset

pytest.importorskip("detectron2.export", reason="gwdet.export needs detectron2 >= 0.7")


# ---- L1: benchmark.py --out on a full disk ---------------------------------------------------------

def _full_disk(monkeypatch) -> None:
    """Every write of gwdet.utils.atomic fails as on a full disk."""
    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic._RecordingFile, "write", write)


def test_a_benchmark_section_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.md"
    begin, end = markers("main")
    old = f"# benchmarks\n\n{begin}\nold\n{end}\n\n## my other measurements\n" + "precious row | 1.0 | 2.0\n" * 2000
    out.write_text(old)
    _full_disk(monkeypatch)
    with pytest.raises(GwdetOSError) as refused:
        write_section(out, "new tables", "main")
    assert str(refused.value) == (
        f"cannot write the benchmark section 'main' into {out} (No space left on device); {out} is as it was "
        "before. Free space there (or fix what the error names) and run again, or give --out another file; the "
        "tables are printed above.")
    assert out.read_text() == old and os.listdir(tmp_path) == ["bench.md"], "no partial file left"

    # the tool: the tables on stdout, one error line naming the file, status 2, no traceback
    monkeypatch.setattr(benchmark_cli, "LEVELS", [("layers", lambda args, device: "tables", lambda text: text)])
    monkeypatch.setattr(sys, "argv", ["tools/benchmark.py"])
    with pytest.raises(SystemExit) as stopped:
        benchmark_cli.main(["--layers", "--quick", "--threads", "1", "--out", str(out)])
    printed = capsys.readouterr()
    assert stopped.value.code == 2 and "tables" in printed.out and "Traceback" not in printed.err
    assert printed.err.splitlines()[-2:] == [f"benchmark.py: error: {refused.value}",
                                             "benchmark.py: --verbose shows the Python traceback of this error"]
    assert out.read_text() == old


# ---- S9: benchmark.py --section that cannot sit in the marker --------------------------------------

@pytest.mark.parametrize("section, problem", [
    ("x-->", "holds '-->', which would end the section's marker line (an HTML comment) early and show it in the "
             "rendered file: give a name without it"),
    ("a\nb", "holds a line break, which would end the section's marker line (an HTML comment) early and show it "
             "in the rendered file: give a name without it"),
    (" ", "is empty: give a name (several runs can share one file, each in its own section)"),
])
def test_a_section_name_that_breaks_its_marker_is_refused_naming_the_flag(tmp_path, capsys, section, problem):
    with pytest.raises(SystemExit) as stopped:
        benchmark_cli.parse_args(["--layers", "--out", str(tmp_path / "b.md"), "--section", section])
    assert stopped.value.code == 2
    assert f"error: --section {section!r} {problem}." in capsys.readouterr().err
    with pytest.raises(GwdetValueError, match="the section name .* give a"):
        write_section(tmp_path / "b.md", "body", section)
    assert not (tmp_path / "b.md").exists()


# ---- S7: a repeated --tasks (and other one-value flags of analyze_model.py / export_model.py) ------

def test_a_repeated_flag_of_the_analyze_and_export_tools_is_refused(tmp_path, capsys):
    from gwdet.export import analyze_model, export_model

    with pytest.raises(SystemExit) as stopped:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "flop", "--tasks", "parameter"])
    assert stopped.value.code == 2
    assert ("error: --tasks is given more than once; a second one would replace the first. Give it once, with all "
            "the values: --tasks flop parameter.") in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        analyze_model.main(["--config-file", str(DEMO_CONFIG), "--config", "other.yaml"])
    assert stopped.value.code == 2
    assert ("error: --config-file is given more than once; a second one would replace the first. Give one config "
            "file, and put what the other changes in it (_BASE_) or as KEY VALUE overrides.") in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        export_model.main(["--config-file", str(DEMO_CONFIG), "--output", str(tmp_path / "a"), "--output=" +
                           str(tmp_path / "b")])
    assert stopped.value.code == 2
    assert (f"error: --output is given more than once; a second one would replace the first. Give it once, with the "
            f"value you mean (given: {tmp_path / 'a'}, {tmp_path / 'b'}).") in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- S3, M6: --register-coco image entries sharing a file, ids that are floats --------------------

def test_two_images_naming_one_file_are_refused_naming_the_file_and_the_ids(tmp_path):
    message = refusal(tmp_path, lambda coco, root: coco["images"][1].update(file_name="./000.png"))
    assert message == (
        f"dataset 'm': 1 file name(s) of {tmp_path / 'train.json'} are given to more than one image: '000.png' of "
        "images 1 and 2. detectron2 would read the same pixels for each of those images, so the boxes and masks of "
        "all but one would be trained (and evaluated) on another image. Give each image entry its own file_name, "
        "or merge the entries into one image (one id) with all their annotations.")


def test_float_image_ids_are_refused_as_not_integers(tmp_path):
    def float_ids(coco, root):
        for image in coco["images"]:
            image["id"] = float(image["id"])
        for annotation in coco["annotations"]:
            annotation["image_id"] = float(annotation["image_id"])

    message = refusal(tmp_path, float_ids)
    assert message == (
        f"dataset 'm': the image ids of {tmp_path / 'train.json'} must be integers (COCO's format), and 4 are not: "
        "1.0 of '000.png' (#0), a float; 2.0 of '001.png' (#1), a float; 3.0 of '002.png' (#2), a float; ... (1 more). "
        "Give each image an integer id, unique in the file (e.g. 1 for 1.0), and its annotations that image_id.")
    assert "not unique" not in message
    message = refusal(tmp_path / "ann", lambda coco, root: coco["annotations"][1].update(id=2.5))
    assert message == (
        f"dataset 'm': the annotation ids of {tmp_path / 'ann' / 'train.json'} must be integers (COCO's format), and "
        "1 are not: 2.5 of an annotation of image 2 (#1), a float. COCO evaluation keeps the id of the annotation a "
        "detection matches as a number (a string stops it after training). Give each annotation an integer id, "
        "unique in the file (e.g. 1 for 1.0).")
    # a string stopped COCO evaluation after training; id 0 counted the detection of that object as a false positive
    message = refusal(tmp_path / "str", lambda coco, root: coco["annotations"][1].update(id="a2"))
    assert "'a2' of an annotation of image 2 (#1), a str" in message, message
    message = refusal(tmp_path / "zero", lambda coco, root: coco["annotations"][1].update(id=0))
    assert message == (
        f"dataset 'm': {tmp_path / 'zero' / 'train.json'} has an annotation id 0 of image 2 (001.png): COCO evaluation "
        "takes the annotation id 0 for \"no match\", so a detection of that object counts as a false positive and the "
        "AP is lower than the model's. Number the annotations from 1.")


# ---- M7: load_export of a folder -------------------------------------------------------------------

def test_load_export_of_a_folder_names_the_exports_in_it(tmp_path):
    from gwdet.export import load_export

    (tmp_path / "model.ts").write_bytes(b"an export")
    (tmp_path / "model.onnx").write_bytes(b"another")
    with pytest.raises(GwdetIsADirectoryError) as refused:
        load_export(str(tmp_path))
    assert str(refused.value) == (f"{tmp_path} is a folder, not an export: pass the export file in it, "
                                  f"{tmp_path / 'model.onnx'} or {tmp_path / 'model.ts'}.")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GwdetIsADirectoryError) as refused:
        load_export(str(empty))
    assert str(refused.value) == (
        f"{empty} is a folder, not an export: it holds no export (no .ts or .onnx file). Pass the path of an export "
        "file, written by tools/deploy/export_model.py (model.ts / model.onnx in its --output folder), "
        "gwdet.export.export_torchscript or export_model_onnx.")


# ---- M8: the --register-coco help says how the flag splits its paths -------------------------------

def test_the_register_coco_help_says_where_the_paths_are_split():
    from gwdet.engine.arguments import argument_parser as train_parser
    from gwdet.export.analyze_model import argument_parser as analyze_parser
    from gwdet.export.export_model import argument_parser as export_parser

    for parser in (train_parser(), export_parser(), analyze_parser()):
        text = " ".join(parser.format_help().split())
        assert ("JSON is the annotation file, IMAGE_ROOT the folder its file_name entries are relative to; they are "
                "split at the ':' after which JSON names an existing file, so either path may hold ':' (a value "
                "that reads two ways is refused).") in text, parser.prog
        assert "The last ':'" not in text


# ---- M9: export_model.py with a sample image that gives no detection ------------------------------

def test_a_sample_image_without_detections_is_the_export_tool_s_error_with_status_2(tmp_path, monkeypatch, capsys):
    from gwdet.export.export_model import main

    Image.fromarray(np.zeros((1, 1, 3), dtype=np.uint8)).save(tmp_path / "one.png")
    monkeypatch.setattr(sys, "argv", ["tools/deploy/export_model.py"])
    with pytest.raises(SystemExit) as stopped:
        main(["--config-file", str(DEMO_CONFIG), "--untrained", "--sample-image", str(tmp_path / "one.png"), "--output",
              str(tmp_path / "out"), *TINY_OPTS, "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.0"])
    lines = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2
    assert lines[-2:] == [
        "export_model.py: error: The sample image gave no detection, so the export could not be compared with the "
        "model (empty outputs always agree); nothing was written. Give --sample-image an image with objects the "
        "model detects (or weights trained further).",
        "export_model.py: --verbose shows the Python traceback of this error"]
    assert not (tmp_path / "out").exists()


# ---- R16: collect_env into a closed pipe or onto a full disk ---------------------------------------

def test_the_report_into_a_closed_pipe_ends_quietly_with_status_1(capsys):
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stream:
        assert write_report("a report\n" * 100, stream) == 1
        stream.write("more")  # the descriptor now goes to os.devnull: Python's flush at exit succeeds
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_the_report_onto_a_full_disk_is_one_line_with_status_2(capsys):
    with open("/dev/full", "w") as stream:
        assert write_report("a report", stream) == 2
    assert capsys.readouterr().err == (
        "python -m gwdet.collect_env: error: cannot write the report: No space left on device. Redirect it to a "
        "file that can be written (e.g. > /tmp/gwdet_env.txt).\n")


def test_collect_env_piped_into_a_reader_that_stops_prints_no_traceback():
    script = ("import os, sys; read, write = os.pipe(); os.close(read); os.dup2(write, 1)\n"
              "import gwdet.collect_env as report\n"
              "report.detectron2_table = lambda: 'detectron2 table'; report.gwdet_rows = lambda: {'gwdet': 'x'}\n"
              "sys.exit(report.main([]))")
    completed = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert completed.returncode == 1
    assert "Traceback" not in completed.stderr and "Exception ignored" not in completed.stderr, completed.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="names a device this machine lacks")
def test_load_export_onto_a_missing_gpu_names_the_device_not_a_damaged_file(tmp_path):
    from gwdet.errors import GwdetValueError
    from gwdet.export import load_export

    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), str(path))
    with pytest.raises(GwdetValueError, match=r"^map_location is 'cuda', but this machine has no CUDA GPU .* load it "
                                              r"with map_location='cpu'"):
        with pytest.warns(UserWarning, match="no checksum record"):
            load_export(str(path), map_location="cuda")
    assert isinstance(load_export(str(path), map_location=torch.device("cpu")), torch.jit.ScriptModule)


def test_load_export_takes_a_pathlib_path(tmp_path):
    from gwdet.export import load_export

    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), str(path))
    with pytest.warns(UserWarning, match="no checksum record"):
        assert isinstance(load_export(path), torch.jit.ScriptModule)


def test_a_json_key_given_twice_an_ignore_flag_and_a_named_pipe_are_refused_at_registration(tmp_path):
    """A second "annotations" list replaced the first (box AP 64.4 became 21.0); "ignore": 1 stopped
    detectron2 with a bare assertion that blamed the config; a named pipe hung registration."""
    def twice(coco, root):
        coco["annotations_again"] = coco["annotations"][:1]

    spec = write_dataset(tmp_path / "twice", twice)
    json_file = spec.split(":")[0]
    with open(json_file) as f:
        text = f.read().replace('"annotations_again"', '"annotations"')
    with open(json_file, "w") as f:
        f.write(text)
    with pytest.raises(DatasetError, match=r"gives the key 'annotations' twice in one object: JSON readers keep only "
                                           r"the last"):
        CocoDataset.parse(f"m={spec}").inspected()
    message = refusal(tmp_path / "ignore", lambda coco, root: coco["annotations"][1].update(ignore=1))
    assert "annotation id 2 of " in message and "has \"ignore\": 1, which detectron2 does not read" in message
    # a UTF-16 file (PowerShell's > writes one) was "not UTF-8 text: give the COCO instances JSON file"
    utf16 = tmp_path / "utf16.json"
    utf16.write_text(text, encoding="utf-16")
    with pytest.raises(DatasetError, match=r"utf16.json is UTF-16 text \(as PowerShell's > and Notepad's 'Unicode' "
                                           r"write it\), and JSON files are read as UTF-8: save it as UTF-8"):
        CocoDataset.parse(f"m={utf16}:{spec.split(':')[1]}").inspected()
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    with pytest.raises(DatasetError, match=r"pipe.json is not a regular file \(a named pipe or a device\)"):
        CocoDataset.parse(f"m={pipe}:{tmp_path}").inspected()
    from gwdet.data.image_files import image_file_problem

    os.mkfifo(tmp_path / "image.png")
    assert image_file_problem(str(tmp_path / "image.png")).startswith("is not a regular file (a named pipe")


def test_an_equals_sign_meant_inside_a_register_coco_name_is_named_beside_the_missing_file(tmp_path, capsys,
                                                                                          monkeypatch):
    # before: "dataset 't': the annotation file .../v=/.../ds.json does not exist.", blaming the file alone
    from gwdet.engine.arguments import parse_args

    json_file, root = write_dataset(tmp_path / "data").split(":")
    with pytest.raises(DatasetError) as refused:
        CocoDataset.parse(f"t=v={json_file}:{root}")
    assert str(refused.value) == (
        f"dataset 't': the annotation file {os.path.abspath('v=' + json_file)} does not exist: NAME ends at the first "
        f"'=' of 't=v={json_file}:{root}', so the name is 't' and JSON is 'v={json_file}'. A dataset name cannot hold "
        f"'=' (use letters, digits, '_', '.' and '-'): if 't=v' was meant as the name, give one without '=', e.g. "
        f"--register-coco t_v={json_file}:{root}, and the same name in DATASETS.TRAIN or DATASETS.TEST.")
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--config-file", str(DEMO_CONFIG), "--register-coco", f"t=v={json_file}:{root}"])
    assert stopped.value.code == 2
    assert "A dataset name cannot hold '='" in capsys.readouterr().err
    # an existing file whose name holds '=' is read as it is
    (tmp_path / "v=ds.json").write_bytes(open(json_file, "rb").read())
    monkeypatch.chdir(tmp_path)
    assert CocoDataset.parse(f"t=v=ds.json:{root}") == CocoDataset("t", str(tmp_path / "v=ds.json"), root)
