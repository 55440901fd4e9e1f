"""``make gpu-check`` (tools/gpu_check.py, gwdet_lab.benchmark.gpu_check) on a machine without CUDA:
it refuses and writes nothing, and refuses first an ``--out`` that cannot take the section; and the
parts that need no GPU: the section it writes, the GPU it compares with the cost model."""
import hashlib
import subprocess
import sys

import pytest
import torch

from gwdet_lab.benchmark import gpu_check
from gwdet_lab.benchmark.report import markers, write_section

from conftest import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA GPU")
def test_without_cuda_the_check_refuses_and_writes_nothing(tmp_path, capsys):
    docs = REPO / "docs" / "benchmarks.md"
    before = hashlib.sha256(docs.read_bytes()).hexdigest()
    out = tmp_path / "benchmarks.md"
    # the command of `make gpu-check` (the default file), then another file by the same main in this process
    completed = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py")], cwd=REPO,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2 and gpu_check.main(["--out", str(out)]) == 2
    for stderr, named in ((completed.stderr, "docs/benchmarks.md"), (capsys.readouterr().err, str(out))):
        assert "gpu-check needs a CUDA GPU and torch.cuda.is_available() is False here" in stderr
        assert f"{named} is unchanged" in stderr  # the file given, not always the default
    assert not out.exists()
    assert hashlib.sha256(docs.read_bytes()).hexdigest() == before


def test_the_cost_model_gpu_of_a_device():
    assert gpu_check.model_gpu_name("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_check.model_gpu_name("NVIDIA H200") == "H100"
    assert gpu_check.model_gpu_name("Tesla V100-SXM2-16GB") == "V100"
    assert gpu_check.model_gpu_name("NVIDIA A100-SXM4-80GB") is None


def test_the_section_holds_the_measurements_beside_the_model_and_names_what_was_skipped(tmp_path):
    box_head = (512, 256, 7, 7)
    layers = {(box_head, "GW triton"): 0.912, (box_head, "GN(32)"): 0.051}
    body = gpu_check.render(
        "2026-11-28", ["- device: NVIDIA H100 80GB HBM3"], "exit status 0: 80 passed", layers,
        {(box_head, "GW triton"): 0.842}, "H100", {"float32": 41.5, "float16 autocast": 38.25},
        [{"kernel": "itn_whitening_vjp_kernel", "warps": 4, "registers": 198, "spills": 0, "shared": 15360, "stack": 0}],
        ["(2048, 256, 7, 7) GW cpu"],
    )
    assert body.startswith("### GPU check (2026-11-28)")
    assert "- tests/test_cuda.py: exit status 0: 80 passed" in body
    assert "| (512, 256, 7, 7) | - | 0.051 | - | - | 0.912 (0.842) |" in body
    assert "prediction for an H100" in body
    assert "- float32: 41.5" in body and "- float16 autocast: 38.2" in body
    assert "| itn_whitening_vjp_kernel | 4 | 198 | 0 | 15360 | 0 |" in body
    assert "Not measured (past the 280 s budget): (2048, 256, 7, 7) GW cpu." in body
    # a dated section per day and GPU: written again the same day, it is replaced
    out = tmp_path / "benchmarks.md"
    out.write_text("# gwdet benchmarks\n\nkept text\n")
    name = gpu_check.section_name("2026-11-28", "NVIDIA H100 80GB HBM3")
    write_section(out, body, name)
    write_section(out, body.replace("0.912", "0.905"), name)
    text = out.read_text()
    assert text.count(markers(name)[0]) == 1 and "0.905" in text and "0.912" not in text and "kept text" in text


def test_an_out_that_cannot_take_the_section_is_refused_before_anything_is_measured(tmp_path, capsys):
    script = tmp_path / "tool.py"
    script.write_text("print('mine')\n")
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", str(script)])
    assert stop.value.code == 2
    assert f"--out {script}: the tables go into a markdown file (.md)" in capsys.readouterr().err
    assert script.read_text() == "print('mine')\n"
