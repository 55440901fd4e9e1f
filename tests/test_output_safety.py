"""Nothing the user had is replaced without asking; no report of a model nobody chose.

One tiny training run (module fixture) is reused by the checks on its OUTPUT_DIR; each check that
must fail is asserted to fail before anything of that run changed.
"""
import argparse
import hashlib
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision

from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.engine import Trainer, build_config, check_run_request, main, parse_args
from gwdet.output_dir import OutputDirLock, check_fresh_start, check_resume_config

from conftest import DEMO_CONFIG, REPO, TINY_OPTS


def _digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _args(output_dir, *extra: str) -> argparse.Namespace:
    return parse_args(["--config", str(DEMO_CONFIG), *TINY_OPTS, "SOLVER.CHECKPOINT_PERIOD", "1",
                       "OUTPUT_DIR", str(output_dir), *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("finished_run")
    main(_args(output_dir))
    assert (output_dir / "model_final.pth").is_file() and (output_dir / "model_0000000.pth").is_file()
    return output_dir


def test_training_again_into_a_finished_run_is_refused_and_changes_nothing(finished_run):
    before = _digest(finished_run)
    with pytest.raises(FileExistsError, match="already holds a run.*--resume.*--overwrite"):
        main(_args(finished_run))
    assert _digest(finished_run) == before


def test_overwrite_deletes_the_earlier_run_first(tmp_path):
    (tmp_path / "model_final.pth").write_bytes(b"old")
    (tmp_path / "metrics.json").write_text('{"iteration": 99}\n')
    (tmp_path / "notes.txt").write_text("mine")
    check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "only the run's own files go"


def test_eval_only_without_weights_is_an_error():
    with pytest.raises(ValueError, match="--eval-only needs trained weights.*MODEL.WEIGHTS"):
        check_run_request(build_config(str(DEMO_CONFIG), TINY_OPTS), _args("unused", "--eval-only"))


def test_eval_only_resume_with_no_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint to evaluate"):
        main(_args(tmp_path / "mistyped", "--eval-only", "--resume"))


def test_resume_with_another_model_is_refused_before_loading(finished_run):
    before = _digest(finished_run)
    with pytest.raises(ValueError, match=r"another model.*MODEL.GW.NUM_GROUPS: 16 -> 8"):
        main(_args(finished_run, "--resume", "MODEL.GW.NUM_GROUPS", "8"))
    assert _digest(finished_run) == before


def test_weights_trained_with_other_norms_are_refused_before_any_weight_is_copied(finished_run):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.ROI_BOX_HEAD.NORM", "GN"])
    model = Trainer.build_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"other norm layers.*GroupWhitening -> GroupNorm.*GWDET_ALLOW_NORM_MISMATCH"):
        ResilientCheckpointer(model).load(str(finished_run / "model_final.pth"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_eval_only_refuses_a_checkpoint_that_leaves_weights_missing(finished_run, tmp_path):
    state = torch.load(finished_run / "model_final.pth", weights_only=True)
    state["model"] = {k: v for k, v in state["model"].items() if "mask_head" not in k}
    partial = tmp_path / "partial.pth"
    torch.save(state, partial)
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    with pytest.raises(ValueError, match="does not hold every weight.*missing: roi_heads.mask_head"):
        ResilientCheckpointer(model, require_every_weight=True).load(str(partial))


def test_resume_when_the_named_checkpoint_is_gone_uses_the_previous_one(finished_run, tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("last_checkpoint", "model_0000000.pth", "config.yaml"):
        (run / name).write_bytes((finished_run / name).read_bytes())
    assert (run / "last_checkpoint").read_text().strip() == "model_final.pth"
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(run)])
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=True)
    assert trainer.start_iter == 1, "continued after model_0000000.pth"
    assert "not in" in caplog.text


def test_a_second_run_on_the_same_output_dir_is_refused(tmp_path):
    with OutputDirLock(str(tmp_path)):
        with pytest.raises(RuntimeError, match=r"in use by another run \(pid \d+\)"):
            main(_args(tmp_path))
    with OutputDirLock(str(tmp_path)):
        pass  # released: the next run gets it


def test_flags_may_follow_the_overrides():
    args = parse_args(["--config", "x.yaml", "SOLVER.MAX_ITER", "10", "--resume", "--num-gpus", "2"])
    assert args.resume and args.num_gpus == 2 and args.opts == ["SOLVER.MAX_ITER", "10"]
    with pytest.raises(SystemExit):
        parse_args(["--config", "x.yaml", "SOLVER.MAX_ITER", "10", "--resme"])


def test_an_empty_config_file_names_the_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty.yaml.*holds no KEY: VALUE mapping"):
        build_config(str(empty))


def test_resume_config_differences_outside_the_model_are_allowed(finished_run):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.CHECKPOINT_PERIOD", "1", "SOLVER.MAX_ITER", "4",
                                                       "OUTPUT_DIR", str(finished_run)])
    check_resume_config(cfg, str(finished_run))


FAILED_SAVE = textwrap.dedent("""
    import os, resource, signal, sys, torch
    from gwdet.atomic import write_atomically
    target = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))   # a disk that fills up
    try:
        write_atomically(target, lambda f: torch.save({"w": torch.ones(1_000_000)}, f))
    except OSError as error:
        print(type(error).__name__, error)
""")


def test_a_failed_save_names_the_os_error_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "model_final.pth"
    target.write_bytes(b"the user's file")
    result = subprocess.run([sys.executable, "-c", FAILED_SAVE, str(target)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"WriteError [Errno 27] cannot write {target}: File too large" in result.stdout
    assert target.read_bytes() == b"the user's file"
    assert [p.name for p in tmp_path.iterdir()] == ["model_final.pth"], "no partial file left"


def test_the_converter_refuses_an_existing_output_unless_told(tmp_path):
    source = tmp_path / "resnet50.pth"
    torch.save(torchvision.models.resnet50().state_dict(), source)
    output = tmp_path / "R-50.pkl"
    output.write_bytes(b"earlier weights")
    command = [sys.executable, str(REPO / "tools" / "convert_pretrained.py"), str(source), str(output)]
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "already exists" in refused.stderr and "--overwrite" in refused.stderr
    assert output.read_bytes() == b"earlier weights"
    replaced = subprocess.run(command + ["--overwrite"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert output.read_bytes() != b"earlier weights"


def test_random_bytes_as_weights_are_named_as_not_a_checkpoint(tmp_path):
    junk = tmp_path / "weights.pth"
    junk.write_bytes(bytes(range(256)) * 8)
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    with pytest.raises(Exception, match=r"weights.pth is not a PyTorch checkpoint.*torch.save.*MODEL.WEIGHTS"):
        ResilientCheckpointer(model).resume_or_load(str(junk), resume=False)
