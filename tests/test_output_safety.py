"""Nothing the user had is replaced without asking; no report of a model nobody chose.

One tiny training run (module fixture) is reused by the checks on its OUTPUT_DIR; each check that
must fail is asserted to fail before anything of that run changed.
"""
import os
import hashlib
import logging
import json
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision

from gwdet.checkpoint.resilient import CLASSES_KEY, INPUT_KEY, ResilientCheckpointer
from gwdet.errors import GwdetError
from gwdet.engine.arguments import parse_args
from gwdet.engine.run import check_output_request, main
from gwdet.engine.trainer import Trainer, YacsRun
from gwdet.model_zoo import build_config
from gwdet.engine.output_dir import OutputDirLock, check_fresh_start, check_resume_config

from conftest import (DEMO_CONFIG, LAZY_CONFIG, REPO, TINY_OPTS, logged_warnings, run_folder_with_a_link, tiny_run_args,
                      with_statistics)


def _digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}




def test_training_again_into_a_finished_run_is_refused_and_changes_nothing(finished_run):
    before = _digest(finished_run)
    with pytest.raises(FileExistsError, match="already holds a run.*--resume.*--overwrite"):
        main(tiny_run_args(finished_run))
    assert _digest(finished_run) == before


def test_overwrite_deletes_the_earlier_run_first(tmp_path):
    torch.save({"model": {}}, tmp_path / "model_final.pth")  # a checkpoint, as a run saves it
    (tmp_path / "metrics.json").write_text('{"iteration": 99}\n')
    for name in ("config.yaml", "config.yaml.sha256", "results.json", "results.json.sha256"):
        (tmp_path / name).write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "only the run's own files go"


# a 2-byte text of the user's named model_0000999.pth in a finished run: --overwrite deleted it with the run's checkpoints
def test_overwrite_refuses_a_users_file_named_as_a_checkpoint_and_deletes_nothing(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    (run / "model_0000999.pth").write_text("x\n")
    (run / "notes.txt").write_text("mine")
    before = _digest(run)
    with pytest.raises(FileExistsError, match=re.escape(
            f"--overwrite would delete model_0000999.pth in OUTPUT_DIR {str(run)!r}: named as a run's checkpoints, but "
            f"no checkpointer wrote it (no torch.save file, no .sha256 record beside it); nothing was changed. Move it "
            f"out of OUTPUT_DIR, or delete it, then run again (or train into another OUTPUT_DIR).")):
        check_fresh_start(str(run), overwrite=True)
    assert _digest(run) == before and (run / "inference").is_dir()
    # a checkpoint of the run's that lost its record (a kill between the two) is still torch.save's file: deleted
    (run / "model_0000999.pth").unlink()
    (run / "model_final.pth.sha256").unlink()
    check_fresh_start(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]

# before: --overwrite deleted another run's checkpoint copied into the folder as model_0000009.pth with the run's own
def test_overwrite_refuses_another_runs_checkpoint_copied_into_the_folder_and_deletes_nothing(finished_run, tmp_path):
    from gwdet.checkpoint.run_identity import folder_run_id

    run = tmp_path / "run"
    main(tiny_run_args(run))
    shutil.copy(finished_run / "model_final.pth", run / "model_0000009.pth")  # another run's weights, no .sha256
    before = _digest(run)
    other, own = folder_run_id(str(finished_run)), folder_run_id(str(run))
    assert other and own and other != own
    with pytest.raises(FileExistsError, match=re.escape(
            f"--overwrite would delete model_0000009.pth in OUTPUT_DIR {str(run)!r}: named as a run's checkpoints, but "
            f"saved by another run (it records the run {other[:12]}..., the folder's run_id file the run {own[:12]}...); "
            f"nothing was changed. Move it out of OUTPUT_DIR, or delete it, then run again (or train into another "
            f"OUTPUT_DIR).")):
        main(tiny_run_args(run, "--overwrite"))
    assert _digest(run) == before
    # a folder without a run_id file (an older run's) tells no other run's checkpoint apart: deleted with the run
    (run / "run_id").unlink()
    check_fresh_start(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".gwdet.lock"]


# before: --overwrite deleted these user files (listed among the earlier run's), though no run wrote them
@pytest.mark.parametrize("name, content, why", [
    ("config_before_resuming_at_7.yaml", "lr: 0.5\n", "no run's config"),
    ("results_before_resuming_at_2.md", "my notes\n", "no results table as a run writes it"),
    ("results_before_resuming_at_2.json", '{"AP": 1}\n', "no results record as a run writes it"),
    ("events.out.tfevents.mine.txt", "my notes\n", "no TensorBoard event file"),
])
def test_overwrite_refuses_a_users_file_named_as_a_runs_kept_results_config_or_events(finished_run, tmp_path, name,
                                                                                      content, why):
    from gwdet.utils.atomic import record_checksum

    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    (run / name).write_text(content)
    before = _digest(run)
    with pytest.raises(FileExistsError, match=re.escape(
            f"--overwrite would delete {name} ({why}) in OUTPUT_DIR {str(run)!r}: named as a run's files, but no run "
            f"of gwdet wrote it (no .sha256 record beside it, and not what a run writes under such a name); nothing "
            f"was changed. Move it out of OUTPUT_DIR, or delete it, then run again (or train into another "
            f"OUTPUT_DIR).")):
        check_fresh_start(str(run), overwrite=True)
    assert _digest(run) == before
    # the run's own files of these kinds are deleted: TensorBoard's events (a TFRecord), a kept file with its record
    assert any(p.name.startswith("events.out.tfevents.") and p.name != name for p in run.iterdir())
    record_checksum(str(run / name))
    check_fresh_start(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == []


# before: each record logged after the disk of log.txt filled printed a "--- Logging error ---" traceback
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a file whose writes fail: disk full)")
def test_a_full_disk_under_the_runs_log_is_said_once_and_the_console_keeps_the_messages(capfd):
    from gwdet.engine.run_log import LogFileHandler, guard_log_files, unwritten_log_error

    stream = open("/dev/full", "a")
    logger = logging.getLogger("gwdet")  # a logger whose log file a run checks (unwritten_log_error)
    saved = (logger.handlers, logger.propagate, logger.level)
    console = logging.StreamHandler(sys.stdout)
    original = logging.StreamHandler(stream)
    logger.handlers, logger.propagate = [console, original], False
    logger.setLevel(logging.INFO)
    try:
        guard_log_files(("gwdet",))
        assert logger.handlers[0] is console and isinstance(logger.handlers[1], LogFileHandler)
        for number in range(5):
            logger.warning(f"message {number}")
        out, err = capfd.readouterr()
        assert "Logging error" not in err and "Traceback" not in err
        assert err.splitlines() == ["gwdet: the run's log file /dev/full cannot be written (disk full: No space left "
                                    "on device); later messages go to the console only."]
        assert out.splitlines() == [f"message {number}" for number in range(5)]
        assert unwritten_log_error("/dev/full").errno == 28  # the run is still refused as not logged
    finally:
        logger.handlers, logger.propagate, logger.level = saved
        try:
            stream.close()
        except OSError:
            pass


@pytest.mark.parametrize("refused", [("MODEL.WEIGHTS", "missing.pth"), ("MODEL.DEVICE", "cuda:7")])
def test_an_overwrite_whose_new_run_is_refused_before_training_keeps_the_earlier_run(finished_run, tmp_path, refused):
    """--overwrite deleted the earlier run, then refused the new one (weights not there, a device
    this machine lacks, a model detectron2 cannot build): neither run was left."""
    earlier = tmp_path / "run"
    shutil.copytree(finished_run, earlier, ignore=shutil.ignore_patterns(".gwdet.lock"))
    kept = lambda: {name: digest for name, digest in _digest(earlier).items() if name not in ("log.txt", ".gwdet.lock")}
    before = kept()
    with pytest.raises(GwdetError):  # the refusals of the missing file and of the device
        main(tiny_run_args(earlier, "--overwrite", *refused))
    assert kept() == before  # config.yaml and its record too: --resume can continue it (log.txt: appended to)
    assert sorted(set(os.listdir(earlier)) - {".gwdet.lock"}) == sorted(set(os.listdir(finished_run)) - {".gwdet.lock"})


def test_a_resume_with_no_checkpoint_to_continue_gets_a_fresh_starts_checks(finished_run, tmp_path):
    """It starts afresh, so it wrote over a user's config.yaml and an evaluation's results."""
    evaluation = tmp_path / "evaluation"
    evaluation.mkdir()
    for name in ("results.json", "results.json.sha256", "results.md"):
        shutil.copy(finished_run / name, evaluation / name)
    with pytest.raises(FileExistsError, match=r"already holds results \(.*\) but no checkpoint to continue \(an evaluation's, or a training's"):
        main(tiny_run_args(evaluation, "--resume"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my: notes\n")
    with pytest.raises(FileExistsError, match="holds a config.yaml that no run of gwdet wrote"):
        main(tiny_run_args(mine, "--resume"))
    assert (mine / "config.yaml").read_text() == "my: notes\n"


@pytest.mark.parametrize("weights", ["model_final.pth", "eval/model_final/model_final.pth", "link.pth"])
def test_overwrite_never_deletes_the_weights_the_new_run_starts_from(tmp_path, weights):
    torch.save({"model": {}}, tmp_path / "model_final.pth")  # a checkpoint, as a run saves it (and names it)
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    (tmp_path / "eval" / "model_final").mkdir(parents=True)
    (tmp_path / "eval" / "model_final" / "model_final.pth").write_bytes(b"kept apart")
    (tmp_path / "link.pth").symlink_to(tmp_path / "model_final.pth")  # a user's link to the run's file
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError, match=r"--overwrite would delete train.init_checkpoint .*, a file of the "
                                              r"earlier run in train.output_dir .*; nothing was changed. Copy the "
                                              r"weights out of that folder"):
        check_fresh_start(str(tmp_path), True, "train.output_dir", str(tmp_path / weights), "train.init_checkpoint")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_overwrite_starts_from_the_users_own_weights_kept_beside_the_run(tmp_path):
    """Weights of the user's in OUTPUT_DIR are no file of the earlier run: kept, and not refused."""
    torch.save({"model": {}}, tmp_path / "model_final.pth")  # the earlier run's checkpoint
    (tmp_path / "config.yaml.sha256").write_text("record")
    (tmp_path / "imagenet.pth").write_bytes(b"mine")
    check_fresh_start(str(tmp_path), True, weights=str(tmp_path / "imagenet.pth"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet.pth"]


def test_eval_only_without_weights_is_an_error():
    with pytest.raises(ValueError, match="--eval-only needs trained weights.*MODEL.WEIGHTS"):
        check_output_request(tiny_run_args("unused", "--eval-only"), YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS)))


def test_eval_only_resume_with_no_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint to evaluate"):
        main(tiny_run_args(tmp_path / "mistyped", "--eval-only", "--resume"))


def test_resume_with_another_model_is_refused_before_loading(finished_run):
    before = _digest(finished_run)
    with pytest.raises(ValueError, match=r"another model.*MODEL.GW.NUM_GROUPS: 16 -> 8"):
        main(tiny_run_args(finished_run, "--resume", "MODEL.GW.NUM_GROUPS", "8"))
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
    with pytest.raises(ValueError, match="does not hold every weight.*missing: roi_heads.mask_head") as refused:
        ResilientCheckpointer(model, require_every_weight=True).load(str(partial))
    assert str(refused.value).startswith(f"The checkpoint {partial} (MODEL.WEIGHTS) does not hold")  # named the file
    # weights of another class count: their shapes named, not "missing" (detectron2 lists both)
    three = tmp_path / "three.pth"
    ResilientCheckpointer(Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + [
        "MODEL.ROI_HEADS.NUM_CLASSES", "3"])), save_dir=str(tmp_path)).save("three")
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(model, require_every_weight=True).load(str(three))
    assert "roi_heads.box_predictor.cls_score.weight: shape (4, 256) in the checkpoint, (5, 256) in the model" in \
        str(refused.value) and "missing: roi_heads.box_predictor" not in str(refused.value)


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
            main(tiny_run_args(tmp_path))
    with OutputDirLock(str(tmp_path)):
        pass  # released: the next run gets it


def test_flags_may_follow_the_overrides():
    config = str(DEMO_CONFIG)
    args = parse_args(["--config", config, "SOLVER.MAX_ITER", "10", "--resume", "--num-gpus", "2"])
    assert args.resume and args.num_gpus == 2 and args.opts == ["SOLVER.MAX_ITER", "10"]
    with pytest.raises(SystemExit):
        parse_args(["--config", config, "SOLVER.MAX_ITER", "10", "--resme"])


def test_an_empty_config_file_names_the_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty.yaml.*holds no KEY: VALUE mapping"):
        build_config(str(empty))


# before: the resumed run wrote its model_final.pth over the finished run's, so the results kept aside scored
# weights no file held any more (no periodic checkpoint is of the last iteration)
def test_a_finished_run_trained_further_sets_its_earlier_results_and_final_weights_aside(finished_run, tmp_path):
    from gwdet.utils.atomic import checksum_problem

    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    earlier, final = (run / "results.json").read_text(), (run / "model_final.pth").read_bytes()
    with logged_warnings("gwdet.engine.output_dir") as warnings:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert (run / "results_before_resuming_at_2.json").read_text() == earlier
    assert json.loads((run / "results.json").read_text()) != json.loads(earlier)  # the 3-iteration model's
    kept = run / "model_final_before_resuming_at_2.pth"
    assert kept.read_bytes() == final != (run / "model_final.pth").read_bytes()
    assert checksum_problem(str(kept)) is None and (run / "model_final_before_resuming_at_2.pth.sha256").is_file()
    assert f"{run}: the run's model_final.pth, which this run resumed at iteration 2 writes over when it ends, is " \
           "kept as model_final_before_resuming_at_2.pth (the weights of the results and evaluations kept as of " \
           "before this resume)." in warnings
    main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "4"))  # trained further again: each final is kept once
    assert sorted(path.name for path in run.glob("model_final_before_*.pth")) == [
        "model_final_before_resuming_at_2.pth", "model_final_before_resuming_at_3.pth"]


def test_a_run_records_the_initial_weights_it_started_from(finished_run, tmp_path, monkeypatch):
    # config.yaml kept MODEL.WEIGHTS relative (read against another folder, another file loaded), and
    # nothing recorded which bytes a fine-tuning started from: a replaced file went unnoticed
    from gwdet.checkpoint.resilient import INITIAL_WEIGHTS_KEY

    shutil.copy(finished_run / "model_final.pth", tmp_path / "start.pth")
    monkeypatch.chdir(tmp_path)
    main(tiny_run_args("first", "MODEL.WEIGHTS", "start.pth"))
    weights = str(tmp_path / "start.pth")
    assert build_config(str(tmp_path / "first" / "config.yaml")).MODEL.WEIGHTS == weights
    recorded = {"path": weights, "sha256": hashlib.sha256((tmp_path / "start.pth").read_bytes()).hexdigest()}
    results = json.loads((tmp_path / "first" / "results.json").read_text())
    assert results["environment"]["initial_weights"] == recorded
    assert torch.load(tmp_path / "first" / "model_final.pth", weights_only=False)[INITIAL_WEIGHTS_KEY] == recorded
    shutil.copy(finished_run / "model_0000000.pth", tmp_path / "start.pth")  # the file replaced
    with logged_warnings("gwdet.engine.run") as warnings:
        main(tiny_run_args("second", config_file=tmp_path / "first" / "config.yaml"))
    assert [w for w in warnings if "holds other weights" in w] == [
        f"MODEL.WEIGHTS {weights} holds other weights than the run of {tmp_path / 'first' / 'config.yaml'} started "
        f"from (SHA-256 {hashlib.sha256((tmp_path / 'start.pth').read_bytes()).hexdigest()[:12]}... now, "
        f"{recorded['sha256'][:12]}... in that run's records): the file was replaced since, and this run starts "
        "from it as it is now."]
    # a run stopped before its results: its checkpoint's record is read
    (tmp_path / "first" / "results.json").unlink()
    with logged_warnings("gwdet.engine.run") as warnings:
        main(tiny_run_args("third", config_file=tmp_path / "first" / "config.yaml"))
    assert len([w for w in warnings if "holds other weights" in w]) == 1


def test_resume_config_differences_outside_the_model_are_allowed(finished_run):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.CHECKPOINT_PERIOD", "1", "SOLVER.MAX_ITER", "4",
                                                       "OUTPUT_DIR", str(finished_run)])
    check_resume_config(cfg, str(finished_run))


FAILED_SAVE = textwrap.dedent("""
    import os, resource, signal, sys, torch
    from gwdet.utils.atomic import write_atomically
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


def test_a_save_into_a_folder_that_is_a_file_names_the_checkpoint(tmp_path):
    # the error was a raw NotADirectoryError naming the record (pyfile/m.pth.sha256), not the checkpoint
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.utils.atomic import WriteError

    not_a_folder = tmp_path / "pyfile"
    not_a_folder.write_text("the user's file")
    with pytest.raises(WriteError, match=f"^\\[Errno 20\\] cannot write {not_a_folder}/m.pth: Not a directory$"):
        ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(not_a_folder)).save("m")
    assert not_a_folder.read_text() == "the user's file"
    # a folder that does not exist: errno's words alone, without the way out
    missing = tmp_path / "new" / "sub"
    with pytest.raises(WriteError, match=f"^\\[Errno 2\\] cannot write {missing}/m.pth: No such file or directory \\(the "
                                         f"folder {missing} does not exist: create it first, or write into an existing "
                                         "one\\)$"):
        ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(missing)).save("m")


def test_the_converter_refuses_an_existing_output_unless_told(tmp_path, capsys):
    # the tool's main in this process (tests/test_convert.py runs the command line itself)
    from gwdet.convert.cli import main as convert

    source = tmp_path / "resnet50.pth"
    torch.save(with_statistics(torchvision.models.resnet50()).state_dict(), source)
    output = tmp_path / "R-50.pkl"
    output.write_bytes(b"earlier weights")
    assert convert([str(source), str(output)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err
    assert output.read_bytes() == b"earlier weights"
    assert convert([str(source), str(output), "--overwrite"]) == 0
    assert output.read_bytes() != b"earlier weights"


def test_random_bytes_as_weights_are_named_as_not_a_checkpoint(tmp_path):
    junk = tmp_path / "weights.pth"
    junk.write_bytes(bytes(range(256)) * 8)
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    with pytest.raises(Exception, match=r"weights.pth is not a PyTorch checkpoint.*torch.save.*MODEL.WEIGHTS"):
        ResilientCheckpointer(model).resume_or_load(str(junk), resume=False)


def _tree_digest(folder) -> dict:
    """Every file of a run but its evaluations and log.txt (this test process's loggers still hold
    the training's log file open; a command-line evaluation is a process of its own)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and "eval" not in p.relative_to(folder).parts and p.name != "log.txt"}


def test_eval_only_checks_the_expected_results_as_detectron2s_tool_does(finished_run, tmp_path):
    # TEST.EXPECTED_RESULTS was ignored by --eval-only (status 0), where detectron2's tool and gwdet's training exit 1
    weights = ["MODEL.WEIGHTS", str(finished_run / "model_final.pth")]
    with pytest.raises(SystemExit) as failed:
        main(tiny_run_args(tmp_path / "off", "--eval-only", *weights, "TEST.EXPECTED_RESULTS", "[['bbox', 'AP', 50.0, 0.02]]"))
    assert failed.value.code == 1 and (tmp_path / "off" / "results.json").is_file()  # the results are written first


def test_eval_only_into_a_run_writes_under_eval_and_keeps_the_runs_files(finished_run):
    before = _tree_digest(finished_run)
    checkpoint = finished_run / "model_0000000.pth"
    main(tiny_run_args(finished_run, "--eval-only", "MODEL.WEIGHTS", str(checkpoint)))
    assert _tree_digest(finished_run) == before, "the run's config, results, vis, inference stay as they were"
    evaluation = finished_run / "eval" / "model_0000000"
    assert (evaluation / "results.md").is_file() and (evaluation / "config.yaml").is_file()
    # the resume check still reads the training config, not the evaluation's
    with pytest.raises(ValueError, match="trained with another model.*MODEL.GW.NUM_GROUPS"):
        check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.GW.NUM_GROUPS", "8"]), str(finished_run))


def test_eval_only_resume_evaluates_only_the_checkpoint_last_checkpoint_names(finished_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model_0000000.pth").write_bytes((finished_run / "model_0000000.pth").read_bytes())
    (run / "last_checkpoint").write_text("model_final.pth")  # gone: no older file in its place
    with pytest.raises(FileNotFoundError, match="names 'model_final.pth'.*MODEL.WEIGHTS .*model_0000000.pth"):
        check_output_request(tiny_run_args(run, "--eval-only", "--resume"),
                             YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(run)])))
    (run / "last_checkpoint").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="last_checkpoint is damaged"):
        check_output_request(tiny_run_args(run, "--eval-only", "--resume"),
                             YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(run)])))


def test_a_config_left_by_a_run_that_failed_before_training_claims_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("MODEL:\n  GW:\n    NUM_GROUPS: 3\n")
    (tmp_path / "config.yaml.sha256").write_text("its checksum record")
    check_fresh_start(str(tmp_path), overwrite=False)  # the corrected command may start here
    check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS), str(tmp_path))  # nothing to resume
    # a run that stopped at its first step (a config value detectron2 fails on) leaves an empty
    # metrics.json and an empty inference/ folder too: still no claim
    (tmp_path / "metrics.json").write_text("")
    (tmp_path / "inference" / "shapes_val").mkdir(parents=True)
    check_fresh_start(str(tmp_path), overwrite=False)
    (tmp_path / "metrics.json").write_text('{"iteration": 0, "total_loss": 2.3}\n')
    with pytest.raises(FileExistsError, match=r"already holds a run that stopped before its first checkpoint "
                                              r"\(config.yaml, config.yaml.sha256, inference, metrics.json\), nothing "
                                              r"to continue; nothing was changed.*pass --overwrite to delete its files"):
        check_fresh_start(str(tmp_path), overwrite=False)


def test_resume_with_overwrite_is_refused():
    with pytest.raises(ValueError, match="--resume continues.*--overwrite deletes"):
        check_output_request(tiny_run_args("unused", "--resume", "--overwrite"),
                             YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS)))


def test_a_run_on_a_read_only_disk_is_evaluated_with_its_outputs_elsewhere(finished_run, tmp_path):
    import os

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (chmod does not stop root)")
    archived = tmp_path / "archived"
    archived.mkdir()
    for name in ("model_final.pth", "last_checkpoint", "config.yaml"):
        (archived / name).write_bytes((finished_run / name).read_bytes())
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    subprocess.run(["mount", "--bind", str(archived), str(read_only)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(read_only)], check=True)
        with pytest.raises(PermissionError, match="cannot be written.*MODEL.WEIGHTS <run>/model_final.pth OUTPUT_DIR"):
            main(tiny_run_args(read_only, "--eval-only", "--resume"))
        elsewhere = tmp_path / "elsewhere"
        main(tiny_run_args(elsewhere, "--eval-only", "MODEL.WEIGHTS", str(read_only / "model_final.pth")))
        assert (elsewhere / "results.md").is_file()
        assert sorted(p.name for p in read_only.iterdir()) == ["config.yaml", "last_checkpoint", "model_final.pth"]
    finally:
        subprocess.run(["umount", str(read_only)], check=True)


@pytest.mark.parametrize("override", [("MODEL.GW.NUM_GROUPS", "8"), ("MODEL.GW.T", "3"), ("MODEL.GW.EPS", "0.001")])
def test_weights_trained_with_other_norm_values_are_refused_naming_them(finished_run, monkeypatch, override):
    """The same parameter shapes, another function: a silent result without the recorded values."""
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + list(override)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attribute = {"MODEL.GW.NUM_GROUPS": "num_groups", "MODEL.GW.T": "T", "MODEL.GW.EPS": "eps"}[override[0]]
    with pytest.raises(ValueError, match=rf"other norm hyper-parameters.*\.norm {attribute} .* -> .*config.yaml"):
        ResilientCheckpointer(model).load(str(finished_run / "model_final.pth"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "1")  # the documented opt-in
    checkpointer = ResilientCheckpointer(model)
    with logged_warnings("gwdet.checkpoint.resilient") as logged:  # it loaded them without a word in the log
        checkpointer.load(str(finished_run / "model_final.pth"))
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    findings = [message for message in logged if message.startswith(
        f"GWDET_ALLOW_NORM_MISMATCH=1: {finished_run / 'model_final.pth'} is loaded as asked, though its norm layers "
        "differ from the model's: The checkpoint was trained with other norm hyper-parameters")]
    # the finding alone: the refusal's "nothing was loaded" and its advice to set the variable contradicted it
    assert findings and not any("nothing was loaded" in message or "to load them anyway" in message
                                for message in findings), logged


def test_gw_weights_saved_by_plain_torch_into_group_norm_layers_are_refused(tmp_path):
    # torch.save({"model": state_dict}) of a GW model evaluated with a GN config: the GW layers' affine loaded into
    # GroupNorm layers, while the file's own records (the layers' _extra_state) named GroupWhitening
    from gwdet.layers import GroupWhitening

    torch.save({"model": torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), GroupWhitening(4, num_groups=2)).state_dict()},
               tmp_path / "plain.pth")
    grouped = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.GroupNorm(2, 4))
    before = {key: value.clone() for key, value in grouped.state_dict().items()}
    with pytest.raises(ValueError, match=r"^The checkpoint was trained with other norm layers than this config builds "
                                         r"\(1 layers, e.g. 1: GroupWhitening -> GroupNorm\); nothing was loaded"):
        ResilientCheckpointer(grouped).load(str(tmp_path / "plain.pth"))
    assert all(torch.equal(before[key], value) for key, value in grouped.state_dict().items())


@pytest.mark.parametrize("named_types", [True, False], ids=["layer_types given", "no layer_types"])
def test_a_registered_norms_own_layer_is_refused_weights_built_with_other_values(tmp_path, registered, named_types):
    # a norm of one's own (register_norm, its own layer class and a setting p) trained with p=2 loaded into p=3
    # without a word: checkpoints recorded its type only
    import gwdet

    class PowerNorm(torch.nn.Module):
        def __init__(self, channels: int, p: float) -> None:
            super().__init__()
            self.p, self.weight = p, torch.nn.Parameter(torch.ones(channels))

        def forward(self, x):
            return x / x.abs().pow(self.p).mean().pow(1 / self.p) * self.weight[:, None, None]

    registered.append("TestPowerNorm")
    gwdet.register_norm("TestPowerNorm", lambda channels, p=2.0: PowerNorm(channels, p),
                        layer_types=(PowerNorm,) if named_types else ())

    def model(p):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), gwdet.norm("TestPowerNorm", p=p)(4))

    ResilientCheckpointer(model(2.0), str(tmp_path)).save("trained")
    ResilientCheckpointer(model(2.0)).load(str(tmp_path / "trained.pth"))  # the values it was built with
    with pytest.raises(ValueError, match=r"other norm hyper-parameters than this config gives its layers \(1 values, "
                                         r"e.g. 1 p 2.0 -> 3.0\); nothing was loaded"):
        ResilientCheckpointer(model(3.0)).load(str(tmp_path / "trained.pth"))


def _zero_bytes_inside_the_largest_tensor(path, count=65536):
    """Overwrite ``count`` bytes in the middle of the largest tensor record of a torch.save archive
    (what a bad disk or an interrupted copy does); the archive itself stays readable."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        header = 30 + len(record.filename.encode()) + len(record.extra)
    start = record.header_offset + header + max(0, record.file_size // 2 - count // 2)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\x00" * min(count, record.file_size))


def test_a_checkpoint_with_damaged_tensor_bytes_is_refused_by_name(finished_run, tmp_path):
    damaged = tmp_path / "model_final.pth"
    damaged.write_bytes((finished_run / "model_final.pth").read_bytes())
    _zero_bytes_inside_the_largest_tensor(damaged)
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"{damaged} is damaged: 1 tensor\(s\) differ.*Restore the file"):
        ResilientCheckpointer(model, require_every_weight=True).load(str(damaged))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_resume_skips_a_damaged_checkpoint_for_the_previous_one(finished_run, tmp_path, caplog):
    for name in ("model_0000000.pth", "model_final.pth", "last_checkpoint"):
        (tmp_path / name).write_bytes((finished_run / name).read_bytes())
    _zero_bytes_inside_the_largest_tensor(tmp_path / "model_final.pth")
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    loaded = ResilientCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)
    assert loaded["iteration"] == 0
    assert "is damaged" in caplog.text and "model_final.pth" in caplog.text


def test_converted_weights_with_a_changed_array_are_refused_by_name(tmp_path):
    import pickle

    import numpy as np

    from gwdet.convert.converter import write_detectron2_pkl
    from gwdet.checkpoint.resilient import load_pickle_weights

    path = tmp_path / "weights.pkl"
    write_detectron2_pkl({"stem.conv1.weight": np.ones((4, 3, 3, 3), np.float32)}, path, "test")
    data = load_pickle_weights(str(path))
    data["model"]["stem.conv1.weight"][0, 0, 0, 0] = 0.0  # the checksums stay those of the written array
    path.write_bytes(pickle.dumps(data))
    with pytest.raises(ValueError, match=r"weights.pkl is damaged.*stem.conv1.weight"):
        ResilientCheckpointer(torch.nn.Linear(1, 1))._load_file(str(path))


def test_resume_trims_metrics_a_kill_cut_short_and_iterations_it_repeats(tmp_path):
    from gwdet.engine.output_dir import trim_metrics

    lines = ['{"iteration": 19, "loss": 1.0}', '{"iteration": 39, "loss": 0.9}', '{"iteration": 59, "lo']
    (tmp_path / "metrics.json").write_text("\n".join(lines))
    trim_metrics(str(tmp_path), start_iter=40)  # resumed from the checkpoint of iteration 39
    assert (tmp_path / "metrics.json").read_text() == lines[0] + "\n" + lines[1] + "\n"
    trim_metrics(str(tmp_path), start_iter=40)
    assert (tmp_path / "metrics.json").read_text() == lines[0] + "\n" + lines[1] + "\n"
    trim_metrics(str(tmp_path), start_iter=20)
    assert (tmp_path / "metrics.json").read_text() == lines[0] + "\n"


def test_random_bytes_in_last_checkpoint_fall_back_to_the_newest_checkpoint(finished_run, tmp_path, caplog):
    for name in ("model_0000000.pth", "model_final.pth"):
        (tmp_path / name).write_bytes((finished_run / name).read_bytes())
    (tmp_path / "last_checkpoint").write_bytes(bytes(range(128, 256)))
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    checkpointer = ResilientCheckpointer(model, save_dir=str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in checkpointer.resume_candidates()] == ["model_final.pth", "model_0000000.pth"]
    assert "last_checkpoint in" in caplog.text and "cannot be read" in caplog.text


def test_without_last_checkpoint_the_checkpoint_of_the_latest_iteration_comes_first(tmp_path, caplog):
    # a finished run (model_final of iteration 3) resumed to train further wrote model_0000004.pth; without
    # last_checkpoint the older model_final was resumed, and iteration 4 trained and saved over the newer file.
    # A checkpoint copied back from a backup (written last) was resumed before the run's later ones.
    torch.save({"model": {}, "iteration": 3}, tmp_path / "model_final.pth")
    for name in ("model_0000004.pth", "model_0000002.pth"):
        (tmp_path / name).write_bytes(b"x")
    os.utime(tmp_path / "model_0000004.pth", (1_000, 1_000))  # older than the others, and the latest iteration
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path))
    order = ["model_0000004.pth", "model_final.pth", "model_0000002.pth"]
    assert [p.rsplit("/", 1)[1] for p in checkpointer.resume_candidates()] == order
    # last_checkpoint naming another folder's model_final.pth: not this folder's file of the same name
    (tmp_path / "last_checkpoint").write_text("/elsewhere/run/model_final.pth")
    assert [p.rsplit("/", 1)[1] for p in checkpointer.resume_candidates()] == order
    assert "last_checkpoint names /elsewhere/run/model_final.pth, which is not in" in caplog.text


def test_a_second_config_file_is_refused_instead_of_replacing_the_first():
    with pytest.raises(SystemExit):
        parse_args(["--config-file", str(DEMO_CONFIG), "--config", str(DEMO_CONFIG)])


@pytest.mark.parametrize("setting, example", [("OUTPUT_DIR", "OUTPUT_DIR output/run"),
                                              ("train.output_dir", "train.output_dir=output/run")])
def test_an_empty_output_dir_is_named_as_empty(setting, example):
    # was "cannot be written (No such file or directory)" with advice about read-only disks
    with pytest.raises(ValueError, match=rf"{setting} is empty \(''\): give the folder the run writes into, e.g. "
                                         rf"{example} .*nothing was written"):
        with OutputDirLock("", setting):
            pass


def test_output_dir_with_a_tilde_is_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", "~/runs/demo"])
    assert cfg.OUTPUT_DIR == str(tmp_path / "runs" / "demo")


def test_gw_positions_without_a_norm_to_place_there_are_refused():
    with pytest.raises(ValueError, match="GW_NORM='' would leave those positions without any normalization"):
        build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.RESNETS.GW_NORM", ""])


@pytest.mark.parametrize("damage", [b"MODEL:\n  GW: [unclosed\n", b"\xff\xfe\x00\x01 random bytes", b"MODEL:\n  NO_SUCH_KEY: 1\n",
                                    b"", b"SOLVER:\n  MAX_ITER: 2\n"])
def test_resume_over_a_damaged_config_yaml_names_the_file_and_the_fix(finished_run, tmp_path, damage):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model_0000000.pth").write_bytes((finished_run / "model_0000000.pth").read_bytes())
    (run / "config.yaml").write_bytes(damage)
    with pytest.raises(ValueError, match=r"config.yaml is damaged, so which model the run .* cannot be checked.*"
                                         r"Restore that file, or train afresh .*--overwrite"):
        check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS), str(run))


def test_resume_with_another_batch_size_is_refused(finished_run):
    # the resumed data stream skipped iterations x the new batch: images were skipped without a word
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "9"])
    with pytest.raises(ValueError, match=r"--resume: the run in .* trained with SOLVER.IMS_PER_BATCH 2, this config "
                                         r"gives 4: the data stream continues .* Resume with SOLVER.IMS_PER_BATCH 2"):
        check_resume_config(cfg, str(finished_run))
    check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.MAX_ITER", "9"]), str(finished_run))


def test_resume_never_runs_a_python_tag_of_the_runs_config_yaml(finished_run, tmp_path):
    witness = tmp_path / "ran"
    run = tmp_path / "run"
    run.mkdir()
    (run / "model_0000000.pth").write_bytes((finished_run / "model_0000000.pth").read_bytes())
    tag = f'X: !!python/object/apply:os.system ["touch {witness}"]\n'
    (run / "config.yaml").write_text((finished_run / "config.yaml").read_text() + tag)
    with pytest.raises(ValueError, match=r"holds a YAML tag that builds a Python object .*loading it could run code"):
        check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS), str(run))
    assert not witness.exists()


def _dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(process.stdout)


def test_partial_files_of_a_killed_save_are_removed_when_the_next_run_takes_the_folder(tmp_path, caplog):
    dead, alive = _dead_pid(), os.getpid()
    stale = tmp_path / f".model_0000009.pth.{dead}.0123456789ab.partial"
    record = tmp_path / f"{stale.name}.sha256"  # its checksum record (was left for good)
    running = tmp_path / f".model_0000019.pth.{alive}.ba9876543210.partial"
    for path in (stale, record, running):
        path.write_bytes(b"half a checkpoint")
    with caplog.at_level("WARNING"), OutputDirLock(str(tmp_path)):
        pass
    assert not stale.exists() and not record.exists(), "left by a process that no longer runs"
    assert running.exists(), "a running process may still rename it into place"
    assert f"Removed 2 partial file(s) an interrupted save left in {tmp_path}" in caplog.text


@pytest.mark.parametrize("other, message", [
    # "a torchvision-layout ImageNet checkpoint needs converting first", for weights with the model's own keys
    (["MODEL.RESNETS.STEM_OUT_CHANNELS", "32"],
     r"^3 of the backbone's 53 weights have another shape in the weights than in the model \(e.g. "
     r"backbone.bottom_up.stem.conv1.weight: \(16, 3, 7, 7\) in the weights, \(32, 3, 7, 7\) in the "
     r"model\).*STEM_OUT_CHANNELS"),
    # "so training would start ... Convert ImageNet weights", for a run's checkpoint into a deeper model's evaluation
    (["MODEL.RESNETS.DEPTH", "101"],
     r"so the model would run with a partly random backbone: they hold 6 blocks of res4, the model has 23. The "
     r"model's ResNet is deeper than the one they were trained with: give its depth \(MODEL.RESNETS.DEPTH"),
])
def test_weights_of_another_resnet_size_are_named_as_such_not_sent_to_the_converter(tmp_path, other, message):
    base = TINY_OPTS + ["MODEL.RESNETS.GW_POSITIONS", "", "MODEL.RESNETS.NORM", "FrozenBN", "MODEL.FPN.NORM", ""]
    source = Trainer.build_model(build_config(str(DEMO_CONFIG), base))
    torch.save({"model": source.state_dict()}, tmp_path / "source.pth")
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), base + other))
    with pytest.raises(ValueError, match=message):
        ResilientCheckpointer(model, str(tmp_path), require_every_weight=True).load_weights(str(tmp_path / "source.pth"))


def test_a_pkl_in_detectron2s_names_whose_weights_do_not_fit_is_not_sent_to_the_converter(tmp_path):
    # detectron2's matching by name ends and shapes left the stem of another width unloaded, and the message called
    # the file "a torchvision-layout ImageNet checkpoint" that "needs converting first"
    import pickle

    base = TINY_OPTS + ["MODEL.RESNETS.GW_POSITIONS", "", "MODEL.RESNETS.NORM", "FrozenBN", "MODEL.FPN.NORM", ""]
    source = Trainer.build_model(build_config(str(DEMO_CONFIG), base + ["MODEL.RESNETS.STEM_OUT_CHANNELS", "32"]))
    weights = {key.removeprefix("backbone.bottom_up."): value.numpy() for key, value in source.state_dict().items()
               if key.startswith("backbone.bottom_up.")}
    with open(tmp_path / "source.pkl", "wb") as file:
        pickle.dump({"model": weights, "__author__": "test", "matching_heuristics": True}, file)
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), base))
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(model, str(tmp_path / "run")).load_weights(str(tmp_path / "source.pkl"))
    assert ("that no weight of the model took: named otherwise, or of other shapes (detectron2 matches a .pkl's "
            "names by their ends and their shapes)") in str(refused.value)
    assert "needs converting first" not in str(refused.value)


def test_gw_weights_of_a_deeper_resnet_in_a_shallower_one_are_named_by_their_shapes(tmp_path):
    # R-50 weights evaluated with MODEL.RESNETS.DEPTH 34: torch's raw "Error(s) in loading state_dict" listing the GW
    # layers' recorded channels, with advice to change MODEL.GW.*; DEPTH was never named
    source = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    torch.save({"model": source.state_dict()}, tmp_path / "source.pth")
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.RESNETS.DEPTH", "34",
                                                                          "MODEL.RESNETS.RES2_OUT_CHANNELS", "64"]))
    with pytest.raises(ValueError, match=r"weights have another shape in the weights than in the model \(e.g. "
                                         r"backbone.bottom_up.res2.0.conv1.weight: .*MODEL.RESNETS.DEPTH"):
        ResilientCheckpointer(model, str(tmp_path), require_every_weight=True).load_weights(str(tmp_path / "source.pth"))


def test_a_torchvision_checkpoint_as_model_weights_is_refused_with_the_converter(tmp_path):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    model = Trainer.build_model(cfg)
    source = tmp_path / "resnet50.pth"
    torch.save(torchvision.models.resnet50().state_dict(), source)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"leave \d+ of the backbone's \d+ weights unloaded .*keys like 'conv1.weight'"
                                         r".*tools/convert_pretrained.py IN OUT"):
        ResilientCheckpointer(model, str(tmp_path)).load_weights(str(source))
    # a checkpoint of the model itself loads every backbone weight and is accepted
    ResilientCheckpointer(model, str(tmp_path)).save("complete")
    ResilientCheckpointer(model, str(tmp_path)).load_weights(str(tmp_path / "complete.pth"))
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_resume_refuses_a_config_yaml_that_differs_from_its_recorded_sha256(finished_run, tmp_path):
    # the run recorded the SHA-256 of its config.yaml (and of results.json) as it wrote them
    for name in ("config.yaml", "results.json"):
        assert (finished_run / f"{name}.sha256").read_text() == \
            f"{hashlib.sha256((finished_run / name).read_bytes()).hexdigest()}  {name}\n"
    run = tmp_path / "run"
    run.mkdir()
    for name in ("model_0000000.pth", "config.yaml", "config.yaml.sha256"):
        (run / name).write_bytes((finished_run / name).read_bytes())
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    check_resume_config(cfg, str(run))
    # cut short before MODEL (a kill while detectron2 rewrote it): still valid YAML, and without the
    # record the missing keys would silently take the new config's values
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text[:text.index("\nMODEL:")])
    with pytest.raises(ValueError, match=r"--resume: .*config.yaml is damaged, so which model the run .* cannot be "
                                         r"checked \(its SHA-256 differs from the one recorded in config.yaml.sha256 "
                                         r"when it was written\)\. Restore that file, or train afresh .*--overwrite"):
        check_resume_config(cfg, str(run))
    (run / "config.yaml.sha256").unlink()  # a run of an older gwdet (no record): no MODEL section is damage too
    with pytest.raises(ValueError, match=r"config.yaml is damaged, .*\(it holds no MODEL section\)"):
        check_resume_config(cfg, str(run))


def test_resume_removes_damaged_metrics_lines_and_names_them(tmp_path, caplog):
    from gwdet.engine.output_dir import trim_metrics

    good = [b'{"iteration": 19, "loss": 1.0}', b'{"iteration": 39, "loss": 0.9}']
    damaged = [b"\x00\x00\x00\x00", b'{"iteration": 2\xff9}', b'[19, 1.0]', b'{"loss": 0.8}', b'{"iteration": "29"}']
    (tmp_path / "metrics.json").write_bytes(b"\n".join([good[0], *damaged, good[1]]) + b"\n")
    with caplog.at_level("WARNING"):
        trim_metrics(str(tmp_path), start_iter=40)
    assert (tmp_path / "metrics.json").read_bytes() == b"\n".join(good) + b"\n"
    assert "metrics.json: removed 5 damaged line(s) (line 2, 3, 4, 5, 6) and 0 record(s)" in caplog.text


def test_an_output_dir_name_this_python_cannot_pass_on_is_refused_before_anything_is_written(tmp_path):
    from gwdet.engine.output_dir import OutputDirNameError, check_output_dir_name

    # PYTHONUTF8=0 in the C locale: the bytes of "run ä" reach Python as surrogate escapes
    undecodable = os.path.join(str(tmp_path), b"run \xc3\xa4".decode("ascii", "surrogateescape"))
    with pytest.raises(OutputDirNameError, match=r"has characters beyond ASCII, which this Python cannot pass on "
                                                 r"unchanged .*export PYTHONUTF8=1.*nothing was written"):
        OutputDirLock(undecodable).__enter__()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OutputDirNameError, match="file system encoding is 'iso8859-1', not UTF-8"):
        check_output_dir_name("/runs/run ä", encoding="latin-1")
    check_output_dir_name("/runs/run ä 日本", encoding="utf-8")
    check_output_dir_name("/runs/run a", encoding="ascii")


def test_an_output_dir_holding_an_unexpanded_environment_variable_is_refused_naming_the_expanded_path(
        tmp_path, monkeypatch):
    from gwdet.engine.output_dir import OutputDirNameError, check_output_dir_name

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MYSCRATCH", "/scratch/me")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    with pytest.raises(OutputDirNameError) as refused:
        OutputDirLock("$MYSCRATCH/run").__enter__()
    assert str(refused.value) == (
        "OUTPUT_DIR '$MYSCRATCH/run' holds '$MYSCRATCH', an environment variable that nothing expanded (a quoted "
        "command-line value and a config file keep it as it is): the run would write into a folder named "
        "'$MYSCRATCH'. Let the shell expand it (double quotes), or give the path itself (OUTPUT_DIR "
        "/scratch/me/run); nothing was written.")
    with pytest.raises(OutputDirNameError, match=r"^train.output_dir 'out/\$\{NOT_SET_HERE\}' holds '\$\{NOT_SET_HERE\}'.*"
                                                 r"or set the variable, or give the path itself; nothing was written.$"):
        OutputDirLock("out/${NOT_SET_HERE}", setting="train.output_dir").__enter__()
    assert list(tmp_path.iterdir()) == []
    check_output_dir_name("runs/price$ 5", encoding="utf-8")  # a lone '$' names no variable
    from gwdet.utils.cli_errors import output_path_problem  # every tool's --out (compare_norms, analyze, benchmark)

    assert output_path_problem("--out", "$MYSCRATCH/study", folder=True) == (
        "--out '$MYSCRATCH/study' holds '$MYSCRATCH', an environment variable that nothing expanded (a quoted "
        "command-line value and a config file keep it as it is): the run would write into a folder named '$MYSCRATCH'. "
        "Let the shell expand it (double quotes), or give the path itself (--out=/scratch/me/study); nothing was "
        "written.")
    # a command substitution nobody ran made a folder named '$(date +%F)'
    for command in ("$(date +%F)", "`date +%F`"):
        with pytest.raises(OutputDirNameError, match=re.escape(f"OUTPUT_DIR 'runs/{command}' holds '{command}', a shell "
                                                               "command that nothing ran")):
            OutputDirLock(f"runs/{command}").__enter__()
    assert list(tmp_path.iterdir()) == []


# ---- the whole checkpoint under checksums, and resumes that would train nothing ----------------------

def _optimizer_state(data: dict) -> dict:
    trainer = data["trainer"]
    return (trainer["_trainer"] if "_trainer" in trainer else trainer)["optimizer"]


def test_checkpoints_carry_the_sha256_of_their_bytes_beside_them(finished_run):
    for checkpoint in sorted(finished_run.glob("model_*.pth")):
        record = (finished_run / f"{checkpoint.name}.sha256").read_text()
        assert record == f"{hashlib.sha256(checkpoint.read_bytes()).hexdigest()}  {checkpoint.name}\n"


def test_a_changed_optimizer_state_is_refused_by_name_with_or_without_the_sha256_record(finished_run, tmp_path, caplog):
    data = torch.load(finished_run / "model_final.pth", weights_only=True)
    state = _optimizer_state(data)["state"]
    next(iter(state.values()))["momentum_buffer"].fill_(50.0)  # saved again: a valid file, other momentum
    torch.save(data, tmp_path / "model_final.pth")
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    with pytest.raises(ValueError, match=r"model_final.pth is damaged: 1 value\(s\) of its training state or metadata "
                                         r"differ .*\(trainer/(_trainer/)?optimizer/state/\d+/momentum_buffer\); "
                                         r"nothing was loaded from it\. Restore the file"):
        ResilientCheckpointer(model).load(str(tmp_path / "model_final.pth"))
    # beside its run's checkpoints and records, --resume takes the previous checkpoint instead, naming the file
    for name in ("model_0000000.pth", "model_0000000.pth.sha256", "model_final.pth.sha256", "last_checkpoint"):
        (tmp_path / name).write_bytes((finished_run / name).read_bytes())
    loaded = ResilientCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)
    assert loaded["iteration"] == 0
    assert re.search(r"Cannot read checkpoint .*model_final.pth \(.*model_final.pth is damaged \(its SHA-256 differs "
                     r"from the one recorded in model_final.pth.sha256", caplog.text)


def test_four_bytes_changed_near_the_end_of_a_checkpoint_are_refused_naming_the_file_and_the_fix(finished_run, tmp_path):
    import zipfile

    damaged = tmp_path / "model_final.pth"
    original = (finished_run / "model_final.pth").read_bytes()
    with zipfile.ZipFile(finished_run / "model_final.pth") as archive:  # the last tensor the archive stores
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.header_offset)
        start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra) + record.file_size - 4
    assert len(original) - start < len(original) // 100, "in the last 1 % of the file"
    damaged.write_bytes(original[:start] + bytes(255 - b for b in original[start:start + 4]) + original[start + 4:])
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    with pytest.raises(ValueError, match=r"model_final.pth is damaged: 1 value\(s\) of its training state"):
        ResilientCheckpointer(model).load(str(damaged))  # no record beside it: the checksums inside notice
    (tmp_path / "model_final.pth.sha256").write_bytes((finished_run / "model_final.pth.sha256").read_bytes())
    end = len(original) - 8  # in the archive's directory: bytes no tensor holds
    damaged.write_bytes(original[:end] + b"\x00\x01\x02\x03" + original[end + 4:])
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(model).load(str(damaged))
    assert str(refused.value) == (
        f"{damaged} is damaged (its SHA-256 differs from the one recorded in model_final.pth.sha256 when it was "
        "written); nothing was loaded from it. Restore the file from a copy or write it again (train, or convert the "
        "weights again); if you replaced it on purpose, delete model_final.pth.sha256. A training's --resume uses the "
        "previous checkpoint in the folder instead. (A checkpointer other than gwdet's writing a file of the same name, "
        "as detectron2's PeriodicCheckpointer in a hook of one's own does with its prefix 'model', leaves "
        "model_final.pth.sha256 behind: give it a prefix of its own.)")
    # another checkpoint's record copied beside an intact file: the message said only "damaged"
    damaged.write_bytes(original)
    (tmp_path / "model_final.pth.sha256").write_bytes((finished_run / "model_0000000.pth.sha256").read_bytes())
    with pytest.raises(ValueError, match=r"differs from the one recorded in model_final.pth.sha256 when it was written "
                                         r"\(a record of another file: it names model_0000000.pth, not model_final.pth; "
                                         r"if that record was copied here by mistake, the file may be whole"):
        ResilientCheckpointer(model).load(str(damaged))


def test_a_resume_that_would_train_nothing_is_refused_before_the_runs_records_change(finished_run):
    def records():  # log.txt is appended to by whatever logs in this process
        return {name: digest for name, digest in _digest(finished_run).items() if name != "log.txt"}

    before = records()
    with pytest.raises(ValueError) as refused:
        main(tiny_run_args(finished_run, "SOLVER.MAX_ITER", "1", "--resume"))
    assert str(refused.value) == (
        f"--resume: the run in {str(finished_run)!r} has trained 2 iterations (model_final.pth), more than "
        "SOLVER.MAX_ITER 1: resuming would train nothing and write the run's config.yaml and results again with a "
        "schedule its weights did not have; nothing was changed. To train it further, resume with SOLVER.MAX_ITER "
        "above 2; to evaluate it, use --eval-only --resume.")
    assert records() == before and {"config.yaml", "results.md", "results.json"} <= set(before)


def test_an_exclusive_write_keeps_the_file_another_process_wrote_meanwhile_and_leaves_no_partial(tmp_path):
    from gwdet.utils.atomic import OutputExistsError, write_atomically

    path = tmp_path / "weights.pkl"

    def write_while_another_finishes(file):
        file.write(b"this process's output")
        path.write_bytes(b"the other process's output")  # it renamed its file into place first

    with pytest.raises(OutputExistsError, match="weights.pkl was written by another process while this one wrote it"):
        write_atomically(str(path), write_while_another_finishes, exclusive=True)
    assert path.read_bytes() == b"the other process's output"
    assert os.listdir(tmp_path) == ["weights.pkl"]
    write_atomically(str(path), lambda file: file.write(b"replaced"))  # without exclusive: replaced, as before
    assert path.read_bytes() == b"replaced"


def test_an_evaluation_refuses_test_data_with_the_training_classes_in_another_order(finished_run):
    from detectron2.data import MetadataCatalog

    trained = torch.load(finished_run / "model_final.pth", weights_only=True)[CLASSES_KEY]
    assert trained == list(MetadataCatalog.get("shapes_train").thing_classes)  # recorded as the run trained
    swapped, other = "shapes_val_swapped_ids", "shapes_val_other_names"
    MetadataCatalog.get(swapped).thing_classes = trained[::-1]  # a test json giving the names other ids
    MetadataCatalog.get(other).thing_classes = [f"x{i}" for i in range(len(trained))]
    weights = str(finished_run / "model_final.pth")

    def evaluation(test_set):
        cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", weights, "DATASETS.TEST", f"('{test_set}',)"])
        run = YacsRun(cfg)
        return run.load_weights(run.build_model())

    with pytest.raises(ValueError, match=rf"was trained on the classes \[.*\] \(the order of its outputs\), but "
                                         rf"dataset '{swapped}' has them in the order .*: each prediction would be "
                                         r"scored as another class"):
        evaluation(swapped)
    with logged_warnings("gwdet.data.datasets") as logged:
        evaluation(other)  # another dataset's names: evaluated, and said
    assert any(f"dataset '{other}' has ['x0'" in message for message in logged)
    evaluation("shapes_val")


def test_weights_evaluated_with_other_model_values_than_their_run_are_warned_of(finished_run):
    # an --eval-only with MODEL.PIXEL_MEAN [0, 0, 0] of weights trained with 127.5 scored AP 0 without a word
    weights = str(finished_run / "model_final.pth")
    with logged_warnings("gwdet.engine.run") as logged:
        for opts in (["MODEL.PIXEL_MEAN", "[0.0, 0.0, 0.0]"], []):
            run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", weights, *opts]))
            run.load_weights(run.build_model())
    assert logged == [f"MODEL.WEIGHTS {weights} was trained in a run whose {finished_run / 'config.yaml'} gives the "
                      "model other values: MODEL.PIXEL_MEAN: [127.5, 127.5, 127.5] -> [0.0, 0.0, 0.0]. The weights are "
                      "evaluated with this config's values."]


def test_weights_given_through_a_link_are_checked_by_the_run_and_the_record_they_lead_to(finished_run, tmp_path):
    # best.pth -> run/model_final.pth skipped the run's config.yaml and the .sha256 beside the target
    import os

    link = tmp_path / "best.pth"
    link.symlink_to(finished_run / "model_final.pth")
    with logged_warnings("gwdet.engine.run") as logged:
        run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(link), "MODEL.PIXEL_MEAN",
                                                                  "[0.0, 0.0, 0.0]"]))
        run.load_weights(run.build_model())
    assert any(f"MODEL.WEIGHTS {link} was trained in a run whose {finished_run / 'config.yaml'} gives the model other "
               "values: MODEL.PIXEL_MEAN" in message for message in logged), logged
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("model_final.pth", "model_final.pth.sha256"):
        (damaged / name).write_bytes((finished_run / name).read_bytes())
    with open(damaged / "model_final.pth", "r+b") as file:  # a byte of the zip's directory, past the tensors
        file.seek(os.path.getsize(damaged / "model_final.pth") - 30)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    (tmp_path / "chosen.pth").symlink_to(damaged / "model_final.pth")
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(tmp_path / "chosen.pth")]))
    with pytest.raises(ValueError, match=rf"chosen.pth is damaged \(its SHA-256 differs from the one recorded in "
                                         rf"{damaged / 'model_final.pth.sha256'} when it was written\)"):
        run.load_weights(run.build_model())



def test_weights_evaluated_on_images_given_otherwise_are_said_even_away_from_their_run(finished_run, tmp_path):
    """A checkpoint records the input format and pixel normalization its model was trained with
    (the model's state dict does not hold them); weights evaluated with other values are named."""
    copied = tmp_path / "model_final.pth"  # no config.yaml beside it: only the checkpoint's own record
    shutil.copy(finished_run / "model_final.pth", copied)
    shutil.copy(finished_run / "model_final.pth.sha256", tmp_path / "model_final.pth.sha256")
    recorded = torch.load(copied, map_location="cpu", weights_only=False)[INPUT_KEY]
    assert recorded["input_format"] == "RGB" and len(recorded["pixel_mean"]) == 3
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(copied), "OUTPUT_DIR", str(tmp_path),
                                                              "MODEL.PIXEL_MEAN", "[0.0, 0.0, 0.0]"]))
    with logged_warnings("gwdet.engine.run") as logged:
        run.load_weights(run.build_model())
    assert any(f"MODEL.WEIGHTS {copied} was trained with values this model has otherwise: pixel_mean "
               f"{recorded['pixel_mean']!r} -> [0.0, 0.0, 0.0]." in message for message in logged), logged
    # the stride's place changes the function with the same weight shapes (it was not recorded)
    assert recorded["stride_in_1x1"] is False
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(copied), "OUTPUT_DIR", str(tmp_path),
                                                              "MODEL.RESNETS.STRIDE_IN_1X1", "True"]))
    with logged_warnings("gwdet.engine.run") as logged:
        run.load_weights(run.build_model())
    assert any("stride_in_1x1 False -> True" in message for message in logged), logged
    # nor were the anchors (box AP 0.91 instead of 3.00, no word)
    assert recorded["anchor_sizes"] == [[8.0], [16.0], [32.0], [64.0], [128.0]]
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(copied), "OUTPUT_DIR", str(tmp_path),
                                                              "MODEL.ANCHOR_GENERATOR.SIZES", "[[16],[32],[64],[128],[256]]"]))
    with logged_warnings("gwdet.engine.run") as logged:
        run.load_weights(run.build_model())
    assert any("anchor_sizes [[8.0], [16.0], [32.0], [64.0], [128.0]] -> [[16.0], [32.0], [64.0], [128.0], [256.0]]"
               in message for message in logged), logged
    # nor the FPN's fuse type and the box regressions' weights (AP 5.43 and 4.59 instead of 5.58)
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(copied), "OUTPUT_DIR", str(tmp_path),
                                                              "MODEL.FPN.FUSE_TYPE", "avg",
                                                              "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", "(1, 1, 1, 1)"]))
    with logged_warnings("gwdet.engine.run") as logged:
        run.load_weights(run.build_model())
    assert any("fpn_fuse_type 'sum' -> 'avg'; box_regression_weights {'proposal_generator': [1.0, 1.0, 1.0, 1.0], "
               "'roi_heads.box_predictor': [10.0, 10.0, 5.0, 5.0]} -> {'proposal_generator': [1.0, 1.0, 1.0, 1.0], "
               "'roi_heads.box_predictor': [1.0, 1.0, 1.0, 1.0]}" in message for message in logged), logged
    # nor the ROI poolers and their feature levels (AP 1.01 with ROIAlign, 0.11 with other IN_FEATURES, for 1.73)
    run = YacsRun(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.WEIGHTS", str(copied), "OUTPUT_DIR", str(tmp_path),
                                                              "MODEL.ROI_BOX_HEAD.POOLER_TYPE", "ROIAlign"]))
    with logged_warnings("gwdet.engine.run") as logged:
        run.load_weights(run.build_model())
    assert any("roi_poolers {'roi_heads.box_pooler': {'type': 'ROIAlign', 'aligned': True," in message
               and "'roi_heads.box_pooler': {'type': 'ROIAlign', 'aligned': False," in message
               and "MODEL.ROI_HEADS.IN_FEATURES" in message for message in logged), logged
    # beside their run's config.yaml: INPUT.FORMAT is the model's input, as MODEL.* is
    with pytest.raises(ValueError, match=r"trained with another model .*INPUT.FORMAT: 'RGB' -> 'BGR'"):
        check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS + ["INPUT.FORMAT", "BGR"]), str(finished_run))


def test_a_gn_models_weights_saved_by_detectron2s_checkpointer_are_refused_by_a_gw_model(tmp_path, monkeypatch):
    # every GW layer took the GN layer's affine without a word: detectron2's checkpointer records no
    # norm types, and torch's GroupNorm saves no settings
    from detectron2.checkpoint import DetectionCheckpointer

    gn_norms = ["MODEL.RESNETS.NORM", "GN", "MODEL.RESNETS.GW_POSITIONS", "", "MODEL.FPN.NORM", "GN",
                "MODEL.ROI_BOX_HEAD.NORM", "GN", "MODEL.ROI_MASK_HEAD.NORM", "GN"]
    DetectionCheckpointer(Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + gn_norms)),
                          save_dir=str(tmp_path)).save("gn")
    gw = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    before = {key: value.clone() for key, value in gw.state_dict().items() if isinstance(value, torch.Tensor)}
    with pytest.raises(ValueError) as refused:
        ResilientCheckpointer(gw).load(str(tmp_path / "gn.pth"))
    assert str(refused.value).startswith("The checkpoint holds weights for 33 gwdet norm layer(s) of this model "
                                         "(backbone.fpn_lateral2.norm (GroupWhitening), ")
    assert all(torch.equal(before[key], value) for key, value in gw.state_dict().items() if key in before)
    # a GW model's weights saved by detectron2's checkpointer carry the layers' settings: accepted
    DetectionCheckpointer(gw, save_dir=str(tmp_path)).save("gw")
    ResilientCheckpointer(Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))).load(str(tmp_path / "gw.pth"))
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "1")  # the opt-in the message names
    ResilientCheckpointer(gw).load(str(tmp_path / "gn.pth"))


def test_weights_saved_from_a_compiled_module_load_by_their_names_and_keep_their_checks(tmp_path):
    # keys with torch.compile's _orig_mod. were called "a torchvision-layout ImageNet checkpoint"
    compiled = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    compiled.backbone = torch.compile(compiled.backbone, backend="eager")
    ResilientCheckpointer(compiled, save_dir=str(tmp_path)).save("compiled")
    assert any(key.startswith("backbone._orig_mod.") for key in torch.load(tmp_path / "compiled.pth",
                                                                           weights_only=False)["model"])
    fresh = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))
    ResilientCheckpointer(fresh, require_every_weight=True).load(str(tmp_path / "compiled.pth"))
    saved = compiled.backbone._orig_mod.state_dict()
    assert all(torch.equal(value, saved[key]) for key, value in fresh.backbone.state_dict().items()
               if isinstance(value, torch.Tensor))
    other = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + ["MODEL.FPN.NORM", "GN"]))
    other.backbone = torch.compile(other.backbone, backend="eager")
    ResilientCheckpointer(other, save_dir=str(tmp_path)).save("compiled_gn")
    with pytest.raises(ValueError, match=r"other norm layers .* backbone.fpn_lateral2.norm: GroupNorm -> GroupWhitening"):
        ResilientCheckpointer(fresh).load(str(tmp_path / "compiled_gn.pth"))  # the records renamed too


def test_python_loading_compares_the_checkpoints_input_record(finished_run, caplog):
    # ResilientCheckpointer.load wrote the record but never read it: other anchors, no word
    model = Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS + [
        "MODEL.ANCHOR_GENERATOR.OFFSET", "0.5", "INPUT.FORMAT", "BGR"]))
    with caplog.at_level(logging.WARNING):
        ResilientCheckpointer(model).load(str(finished_run / "model_final.pth"))
    warned = [r.getMessage() for r in caplog.records if "was trained with values this model has otherwise" in
              r.getMessage()]
    assert len(warned) == 1 and "input_format 'RGB' -> 'BGR'" in warned[0] and "anchor_offset 0.0 -> 0.5" in warned[0]


def test_a_long_legal_output_name_is_written(tmp_path):
    # a 254-byte name failed with "File name too long": its temporary file's name was longer still
    from gwdet.utils.atomic import write_atomically

    path = tmp_path / ("b" * 250 + ".pkl")
    write_atomically(str(path), lambda file: file.write(b"weights"))
    assert path.read_bytes() == b"weights" and os.listdir(tmp_path) == [path.name]


def test_a_failed_write_keeps_the_earlier_files_checksum_record(tmp_path):
    # a save that failed (a size limit, a full disk) left the older checkpoint but deleted its record: read unchecked
    from gwdet.utils.atomic import checksum_problem, write_with_checksum

    path = tmp_path / "model_0000002.pth"
    write_with_checksum(str(path), lambda file: file.write(b"the earlier checkpoint"))

    def failing(file):
        file.write(b"half of a new one")
        raise OSError(27, "File too large")

    with pytest.raises(OSError, match="File too large"):
        write_with_checksum(str(path), failing)
    assert path.read_bytes() == b"the earlier checkpoint"
    assert (tmp_path / "model_0000002.pth.sha256").is_file() and checksum_problem(str(path)) is None


def test_last_checkpoint_that_is_a_link_is_replaced_not_written_through(tmp_path):
    # ResilientCheckpointer.save wrote the checkpoint's name into the user's file the link led to
    notes, run = run_folder_with_a_link(tmp_path, "last_checkpoint", "my notes")
    ResilientCheckpointer(torch.nn.Linear(2, 2), str(run)).save("model_final")
    assert notes.read_text() == "my notes"
    assert not (run / "last_checkpoint").is_symlink() and (run / "last_checkpoint").read_text() == "model_final.pth"


def test_a_refused_load_leaves_the_checkpointer_ready_for_the_next(tmp_path):
    # every later load of the same ResilientCheckpointer failed with a bare AssertionError
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    checkpointer.save("good")
    (tmp_path / "bad.pth").write_bytes(b"x")
    with pytest.raises(GwdetError, match="is not a PyTorch checkpoint"):  # refused inside detectron2's load
        checkpointer.load(str(tmp_path / "bad.pth"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpointer.load(str(tmp_path / "missing.pth"))
    assert "model" not in checkpointer.load(str(tmp_path / "good.pth"))  # the model's weights went into the model


def test_fine_tuning_on_the_same_class_names_in_another_order_is_refused(tmp_path):
    # the box and mask predictors started on the wrong classes without a word
    model = torch.nn.Linear(2, 2)
    ResilientCheckpointer(model, str(tmp_path), classes=["circle", "square"]).save("trained")
    with pytest.raises(ValueError, match=r"was trained on the classes \['circle', 'square'\] \(the order of its "
                                         r"outputs\), but the training data has them in the order \['square', 'circle'\]"):
        ResilientCheckpointer(model, str(tmp_path / "ft"), classes=["square", "circle"]).load_weights(
            str(tmp_path / "trained.pth"))
    # other names: another dataset, whose predictors are fine-tuned as detectron2 does; the model now learns them
    # (its classes were those of the loaded weights: the evaluation after training warned of the wrong ones)
    ResilientCheckpointer(model, str(tmp_path / "ft"), classes=["cat", "dog"]).load_weights(str(tmp_path / "trained.pth"))
    assert model.gwdet_classes == ["cat", "dog"]
    ResilientCheckpointer(model, str(tmp_path / "ev")).load_weights(str(tmp_path / "trained.pth"))  # an evaluation's
    assert model.gwdet_classes == ["circle", "square"]


def test_load_reads_a_home_path_and_takes_no_path_as_none(tmp_path, monkeypatch):
    # load("~/x.pth") gave a bare AssertionError (MODEL.WEIGHTS expands ~); load(None) a TypeError (detectron2: {})
    monkeypatch.setenv("HOME", str(tmp_path))
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    checkpointer.save("mine")
    assert "model" not in checkpointer.load("~/mine.pth")
    assert checkpointer.load(None) == {} and checkpointer.load("") == {}
    # a blank path loaded nothing without a word; a bytes path was torch's raw TypeError
    with pytest.raises(ValueError, match=r"the path '  ' is blank: give the checkpoint's path"):
        checkpointer.load("  ")
    with pytest.raises(TypeError, match=r"give the checkpoint's path as a str or pathlib.Path, not bytes"):
        checkpointer.load(str(tmp_path / "mine.pth").encode())
    # classes given as a generator: the type check consumed it and no class record was kept
    assert ResilientCheckpointer(torch.nn.Linear(2, 2), classes=(name for name in ["a", "b"])).classes == ["a", "b"]


def test_box_only_weights_in_a_mask_model_name_mask_on(tmp_path):
    # 16 missing mask-head weights listed, and MODEL.MASK_ON False never named
    class Detector(torch.nn.Module):
        def __init__(self, masks):
            super().__init__()
            self.roi_heads = torch.nn.Module()
            self.roi_heads.box_head = torch.nn.Linear(2, 2)
            if masks:
                self.roi_heads.mask_head = torch.nn.Linear(2, 2)

    ResilientCheckpointer(Detector(masks=False), str(tmp_path)).save("boxes")
    with pytest.raises(ValueError, match=r"The weights have no mask head: they were trained without masks "
                                         r"\(MODEL.MASK_ON False; "):
        ResilientCheckpointer(Detector(masks=True), str(tmp_path), require_every_weight=True).load_weights(
            str(tmp_path / "boxes.pth"))


def test_max_to_keep_counts_the_checkpoints_of_the_run_before_a_resume(tmp_path):
    # a LazyConfig's train.checkpointer.max_to_keep=2 kept 2 per process: a resumed run left 4 periodic checkpoints
    from detectron2.engine import TrainerBase

    from gwdet.engine.lazy import RunPeriodicCheckpointer

    class Resumed(TrainerBase):
        def run_step(self):
            pass

    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    for iteration in (3, 4):  # the periodic checkpoints the first process kept, then a kill
        checkpointer.save(f"model_{iteration:07d}")
    trainer = Resumed()
    trainer.register_hooks([RunPeriodicCheckpointer(checkpointer, period=1, max_to_keep=2)])
    trainer.train(5, 8)
    assert sorted(path.name for path in tmp_path.glob("model_*.pth")) == [
        "model_0000006.pth", "model_0000007.pth", "model_final.pth"]


def test_a_new_training_into_a_folder_of_another_runs_checkpoints_is_refused(tmp_path):
    # gwdet's Trainer (Python) trained twice into one OUTPUT_DIR: the second replaced model_final.pth and metrics of
    # the first without a word (the tools refuse it; detectron2's DefaultTrainer does the same)
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    assert checkpointer.resume_or_load("", resume=False) == {}  # an empty folder: a new run
    checkpointer.save("model_final", iteration=0)
    with pytest.raises(FileExistsError, match=r"holds the checkpoints of another run \(model_final.pth\), which a new "
                                              r"training there would replace: continue that run \(resume_or_load\(resume=True\)"):
        checkpointer.resume_or_load("", resume=False)
    checkpointer.resume_or_load("", resume=True)  # continuing it is fine


def test_a_training_is_refused_where_another_run_wrote_checkpoints_since_its_resume_or_load(tmp_path):
    # two trainers built into one OUTPUT_DIR in a notebook, both resume_or_load(False) before either trained: the
    # second train() replaced the first's finished model_final.pth and detections without a word
    first = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    second = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    first.resume_or_load("", resume=False)
    second.resume_or_load("", resume=False)
    second.save("model_final", iteration=0)
    second.check_folder_unchanged()  # its own checkpoint
    with pytest.raises(FileExistsError, match=r"holds checkpoints written since this trainer's resume_or_load "
                                              r"\(model_final.pth\): another run trained there in between"):
        first.check_folder_unchanged()
    first.resume_or_load("", resume=True)  # noted again: continuing from them is fine
    first.check_folder_unchanged()
    ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path)).check_folder_unchanged()  # never started: nothing


def test_gwdets_trainer_from_python_neither_trains_over_a_finished_run_nor_sets_its_results_aside(finished_run, tmp_path):
    # Trainer(cfg).train() without resume_or_load replaced a finished run's model_final.pth; resume_or_load(resume=True)
    # of it trained nothing and set its results.json aside (the tool refuses both)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    final = (run / "model_final.pth").read_bytes()
    cfg = build_config(str(run / "config.yaml"), ["OUTPUT_DIR", str(run)])
    with pytest.raises(ValueError, match=r"--resume: the run in .* is finished: it trained its \d+ iterations"):
        Trainer(cfg).resume_or_load(resume=True)
    with pytest.raises(FileExistsError, match=r"holds the checkpoints of another run"):
        Trainer(cfg).train()
    assert (run / "model_final.pth").read_bytes() == final and (run / "results.json").is_file()


def test_a_finished_run_whose_last_checkpoint_is_gone_is_not_resumed(finished_run, tmp_path):
    # model_final.pth deleted: the resume took model_0000001.pth (the same iteration), trained nothing,
    # rewrote config.yaml and the results, left last_checkpoint naming the missing file, and set the
    # results aside once more at every try
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    (run / "model_final.pth").unlink()
    (run / "model_final.pth.sha256").unlink()
    def files() -> dict:
        return {path.name: path.read_bytes() for path in run.iterdir() if path.is_file() and path.name != ".gwdet.lock"}

    before = files()
    with pytest.raises(ValueError, match=r"--resume: last_checkpoint in .* names model_final.pth, the run's last "
                                         r"checkpoint, which is not there .*Put model_final.pth back"):
        main(tiny_run_args(run, "--resume"))
    assert files() == before


def test_a_run_stopped_between_its_final_detections_and_its_results_is_evaluated_when_resumed(finished_run, tmp_path):
    # killed after detectron2 saved inference/ and before gwdet wrote results.json: every --resume was refused as
    # "would replace the detections of the finished run", so results.json could never be written
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns(".gwdet.lock"))
    (run / "results.json").unlink()
    (run / "results.json.sha256").unlink()
    final = (run / "model_final.pth").read_bytes()
    assert "bbox" in main(tiny_run_args(run, "--resume"))
    assert (run / "results.json").is_file() and (run / "model_final.pth").read_bytes() == final


def test_gwdets_trainers_from_python_check_the_request_as_the_tools_do(finished_run, tmp_path, caplog):
    # Trainer(cfg) from one's own code trained with what the tool refuses (no foreground region sampled:
    # loss_box_reg 0 throughout; MAX_ITER 0: fvcore's bare ValueError) and resumed a run with another
    # seed, batch or warm-up without a word
    from gwdet.engine.lazy import LazyTrainer
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "new")])
    for key, value, message in (("MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 1, "samples int(1 x 0.25) = 0 foreground"),
                                ("SOLVER.MAX_ITER", 0, "SOLVER.MAX_ITER is 0: a run trains for at least 1 iteration")):
        changed = cfg.clone()
        changed.merge_from_list([key, value])
        with pytest.raises(ValueError, match=re.escape(message)):
            Trainer(changed)
    lazy = load_lazy_config(str(LAZY_CONFIG), ["model.roi_heads.batch_size_per_image=1",
                                               f"train.output_dir={tmp_path / 'lazy'}"])
    with pytest.raises(ValueError, match=r"batch_size_per_image"):
        LazyTrainer(lazy)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    saved = build_config(str(run / "config.yaml"), ["OUTPUT_DIR", str(run)])
    longer = ["SOLVER.MAX_ITER", str(saved.SOLVER.MAX_ITER + 2)]
    reseeded = build_config(str(run / "config.yaml"), ["OUTPUT_DIR", str(run), "SEED", str(saved.SEED + 5), *longer])
    with pytest.raises(ValueError, match=rf"--resume: the run in .* trained with SEED {saved.SEED}, this config gives "
                                         rf"{saved.SEED + 5}"):
        Trainer(reseeded).resume_or_load(resume=True)
    weighted = cfg.clone()  # initial weights named, train() without resume_or_load: trained from random weights
    weighted.defrost()
    weighted.merge_from_list(["MODEL.WEIGHTS", str(run / "model_final.pth"), "OUTPUT_DIR", str(tmp_path / "w")])
    with pytest.raises(ValueError, match=r"^MODEL.WEIGHTS names initial weights \(.*\), which only resume_or_load "
                                         r"loads: without it the model would train from its random initialization") \
            as refused:
        Trainer(weighted).train()
    # a subclass's own resume_or_load that loads the weights itself was told they were not loaded
    assert str(refused.value).endswith("A subclass's own resume_or_load must call gwdet's "
                                       "(super().resume_or_load(resume)), which loads through the trainer's checkpointer, "
                                       "takes the output folder's lock and positions the data stream.")
    trainer = Trainer(cfg)  # a second train() of a trainer that finished: detectron2's "'EvalHook' object has no
    trainer.iter = trainer.max_iter  # attribute '_func'" (its hooks let go of what they ran)
    with pytest.raises(ValueError, match=r"^This trainer has trained its \d+ iterations already \(train\(\) returned\)"):
        trainer.train()
    (run / "config.yaml").unlink()  # a run trained from one's own code, without detectron2's default_setup
    (run / "config.yaml.sha256").unlink(missing_ok=True)
    with caplog.at_level("WARNING"):
        Trainer(reseeded).resume_or_load(resume=True)
    assert "without checking that its checkpoints were trained with this config (model, batch, seed): config.yaml" \
        in caplog.text


def test_an_evaluation_from_python_keeps_a_finished_runs_detections(finished_run, tmp_path):
    # Trainer.test(cfg, model) with a run's config replaced the run's inference/<dataset>/ detections, which its
    # results.json describes, with another model's (gwdet.engine.lazy.evaluate likewise)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    detections = run / "inference" / "shapes_val" / "coco_instances_results.json"
    before = detections.read_bytes()
    cfg = build_config(str(run / "config.yaml"), ["OUTPUT_DIR", str(run)])
    with pytest.raises(FileExistsError, match=r"which holds the detections of the finished run in .*: this evaluation "
                                              r"would replace them; nothing was evaluated. Give the evaluation a folder "
                                              r"of its own \(Trainer.test\(cfg, model, evaluators="):
        Trainer.test(cfg, Trainer.build_model(cfg))
    assert detections.read_bytes() == before
    # a run trained from one's own code writes no results.json: its detections, as new as its model_final.pth, too
    (run / "results.json").unlink()
    with pytest.raises(FileExistsError, match=r"holds the detections of the finished run in .* \(coco_instances_"
                                              r"results.json.*its evaluation of model_final.pth\): this evaluation would "
                                              r"replace them"):
        Trainer.test(cfg, Trainer.build_model(cfg))
    assert detections.read_bytes() == before


def test_a_resume_from_a_checkpoint_slimmed_to_its_weights_is_refused(tmp_path):
    # model_final.pth saved as {"model": ...} to save space: --resume started again at iteration 1 with a fresh
    # momentum and schedule, without a word
    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict()}, tmp_path / "model_final.pth")
    with pytest.raises(ValueError, match=r"--resume: .*model_final.pth holds no iteration state \(a checkpoint slimmed "
                                         r"to its weights\), so the run cannot continue from it"):
        ResilientCheckpointer(model, str(tmp_path)).resume_or_load("", resume=True)
    # with its iteration but without the optimizer's state: resumed with a fresh momentum and schedule
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.save({"model": model.state_dict(), "iteration": 4}, tmp_path / "model_final.pth")
    with pytest.raises(ValueError, match=r"holds no optimizer state \(a checkpoint slimmed to its weights\)"):
        ResilientCheckpointer(model, str(tmp_path), optimizer=optimizer).resume_or_load("", resume=True)


def test_a_resume_of_a_run_another_trainer_wrote_is_refused_naming_it(tmp_path):
    # detectron2's lazyconfig_train_net.py run (model, optimizer, scheduler, iteration): called "a checkpoint
    # slimmed to its weights", to be restored "as the run wrote it"
    from gwdet.engine.training import RandomState

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "iteration": 2}, tmp_path / "model_final.pth")
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    checkpointer = ResilientCheckpointer(model, str(tmp_path), optimizer=optimizer, scheduler=scheduler,
                                         random_state=RandomState())
    with pytest.raises(ValueError) as refused:
        checkpointer.resume_or_load("", resume=True)
    assert str(refused.value) == (
        f"--resume: {tmp_path / 'model_final.pth'} was written by another trainer (detectron2's own tools, say: it "
        "holds detectron2's training state but no random_state state and none of gwdet's records), so gwdet's tool "
        "cannot continue that run as it would have gone on. Continue it with the tool that trained it, or start a new "
        f"run from its weights (MODEL.WEIGHTS {tmp_path / 'model_final.pth'}) into another output folder.")


def test_records_of_deleted_checkpoints_go_and_a_string_of_classes_is_refused(tmp_path):
    # detectron2's max_to_keep deleted model_0000001.pth and left its .sha256; classes="ab" recorded ["a", "b"]. A
    # checkpoint the user moved aside lost its record at the next save (it then loaded unchecked when put back).
    from detectron2.engine import TrainerBase

    from gwdet.engine.lazy import RunPeriodicCheckpointer

    class Trains(TrainerBase):
        def run_step(self):
            pass

    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    checkpointer.save("model_0000009")
    (tmp_path / "model_0000009.pth").rename(tmp_path / "aside.pth")  # the user's move
    (tmp_path / "notes.sha256").write_text("mine")
    trainer = Trains()
    trainer.register_hooks([RunPeriodicCheckpointer(checkpointer, period=1, max_to_keep=1)])
    trainer.train(0, 2)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "aside.pth", "last_checkpoint", "model_0000001.pth", "model_0000001.pth.sha256", "model_0000009.pth.sha256",
        "model_final.pth", "model_final.pth.sha256", "notes.sha256"]
    with pytest.raises(TypeError, match=r"classes must be a list of class names .*, got 'circle,square'"):
        ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path), classes="circle,square")


def test_gwdets_trainers_from_python_seed_the_initial_weights_with_the_configs_seed(tmp_path):
    # two Trainer(cfg) of one config drew other initial weights (only the tools' default_setup seeded), and neither
    # the tool's run's
    from gwdet.engine.training import mark_seeded

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path)])
    first, second = (Trainer(cfg).model.state_dict() for _ in range(2))
    assert all(torch.equal(first[key], second[key]) for key in first)
    marked = cfg.clone()
    mark_seeded(marked)  # as the tools' set-up marks it after default_setup seeded: not seeded again
    torch.manual_seed(12345)
    other = Trainer(marked).model.state_dict()
    assert not all(torch.equal(first[key], other[key]) for key in first)


def test_a_trainers_max_iter_changed_after_the_build_or_an_output_dir_that_is_a_file_is_refused(tmp_path):
    # trainer.max_iter raised in a notebook trained past the schedule's end into fvcore's "where in ParamScheduler
    # must be in [0, 1]: got 1.5", without a checkpoint; OUTPUT_DIR a file: a raw FileExistsError after the build
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "run")])
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.max_iter += 2
    with pytest.raises(ValueError, match=rf"^This trainer's max_iter is {cfg.SOLVER.MAX_ITER + 2}, but its config's "
                                         rf"SOLVER.MAX_ITER is {cfg.SOLVER.MAX_ITER}: .* build a new trainer from a config"):
        trainer.train()
    assert not list((tmp_path / "run").glob("model_*.pth"))
    (tmp_path / "notes").write_text("mine")
    filed = cfg.clone()
    filed.defrost()
    filed.OUTPUT_DIR = str(tmp_path / "notes")
    with pytest.raises(PermissionError, match=r"^OUTPUT_DIR .*notes is a file"):
        Trainer(filed)
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_resume_where_last_checkpoint_names_another_checkpointers_file_names_the_runs_own(tmp_path):
    # detectron2's PeriodicCheckpointer of one's own hook (file_prefix "d2model") tagged its file: the resume was
    # refused as "a checkpoint slimmed to its weights", gwdet's whole model_final.pth beside it unnamed
    from detectron2.checkpoint import DetectionCheckpointer

    model = torch.nn.Linear(2, 2)
    ResilientCheckpointer(model, str(tmp_path), random_state=torch.nn.Module()).save("model_final", iteration=1)
    DetectionCheckpointer(model, str(tmp_path)).save("d2model_final", iteration=1)
    with pytest.raises(ValueError, match=r"last_checkpoint names d2model_final.pth, which holds no random_state state: "
                                         r"another checkpointer wrote it .* The run's checkpoints are model_final.pth: "
                                         r"write the name of the one to continue from into last_checkpoint"):
        ResilientCheckpointer(model, str(tmp_path), random_state=torch.nn.Module()).resume_or_load("", resume=True)


def test_a_norm_taken_out_of_a_layer_that_had_one_is_refused(tmp_path):
    # a GW run's weights (copied out of their folder) evaluated with MODEL.RESNETS.NORM "": 36 GroupNorm layers
    # dropped, only fvcore's list of unused keys said so
    from detectron2.layers import Conv2d

    def model(norm):
        return torch.nn.Sequential(Conv2d(3, 4, 1, norm=norm))

    ResilientCheckpointer(model(torch.nn.GroupNorm(2, 4)), str(tmp_path)).save("trained")
    with pytest.raises(ValueError, match=r"^The checkpoint was trained with other norm layers than this config builds "
                                         r"\(1 layers, e.g. 0.norm: GroupNorm -> no norm\); nothing was loaded"):
        ResilientCheckpointer(model(None)).load(str(tmp_path / "trained.pth"))
    ResilientCheckpointer(torch.nn.Sequential()).load(str(tmp_path / "trained.pth"))  # the part absent as a whole


def test_group_norm_weights_without_records_are_refused_by_layers_that_keep_statistics(tmp_path):
    # a GN model's weights saved without gwdet's records into MODEL.RESNETS.NORM FrozenBN: every FrozenBN took GN's
    # scale and shift and detectron2 filled in mean 0 and variance 1, without a word
    from detectron2.layers import FrozenBatchNorm2d

    torch.save({"model": torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.GroupNorm(2, 4)).state_dict()},
               tmp_path / "gn.pth")
    frozen = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4))
    with pytest.raises(ValueError, match=r"^The checkpoint holds the affine weights of 1 layer\(s\) that keep running "
                                         r"statistics in this model \(1 \(FrozenBatchNorm2d\)\) but no statistics for "
                                         r"them: .*nothing was loaded. Build the model with the norms"):
        ResilientCheckpointer(frozen).load(str(tmp_path / "gn.pth"))
    # the same in a .pkl whose names detectron2 matches by their ends (GW weights converted by detectron2's own
    # convert-torchvision-to-d2.py): loaded into FrozenBN layers with mean 0 and variance 1, without a word
    import pickle

    weights = {key: value.numpy() for key, value in torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 1), torch.nn.GroupNorm(2, 4)).state_dict().items()}
    with open(tmp_path / "gn.pkl", "wb") as file:
        pickle.dump({"model": weights, "__author__": "test", "matching_heuristics": True}, file)
    nested = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4)))  # 0.1.weight
    with pytest.raises(ValueError, match=r"^The checkpoint holds the affine weights of 1 layer\(s\) that keep running "
                                         r"statistics in this model \(0.1 \(FrozenBatchNorm2d\)\) but no statistics"):
        ResilientCheckpointer(nested).load(str(tmp_path / "gn.pkl"))


def test_a_registered_subclass_of_gwdets_layer_records_its_own_setting_too(tmp_path, registered):
    # a GroupWhitening subclass with a setting of its own (scale): its checkpoints recorded GroupWhitening's only,
    # and weights of scale 2.0 loaded into 3.0 without a word
    import gwdet
    from gwdet.layers import GroupWhitening

    class ScaledGW(GroupWhitening):
        def __init__(self, channels: int, scale: float) -> None:
            super().__init__(channels, num_groups=2)
            self.scale = scale

    registered.append("TestScaledGW")
    gwdet.register_norm("TestScaledGW", lambda channels, scale=1.0: ScaledGW(channels, scale), layer_types=(ScaledGW,))
    ResilientCheckpointer(torch.nn.Sequential(gwdet.norm("TestScaledGW", scale=2.0)(4)), str(tmp_path)).save("w")
    with pytest.raises(ValueError, match=r"other norm hyper-parameters .*0 scale 2.0 -> 3.0"):
        ResilientCheckpointer(torch.nn.Sequential(gwdet.norm("TestScaledGW", scale=3.0)(4))).load(str(tmp_path / "w.pth"))


def test_weights_behind_a_wrappers_prefix_or_a_whole_pickled_model_are_named(tmp_path, monkeypatch):
    # Lightning's state_dict saved on its own: keys behind "model.", called a torchvision checkpoint to convert;
    # torch.save({"model": model}) read with GWDET_ALLOW_UNSAFE_PICKLE=1: a raw AttributeError
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    model = Trainer.build_model(cfg)
    torch.save({"model": {f"model.{key}": value for key, value in model.state_dict().items()}}, tmp_path / "p.pth")
    with pytest.raises(ValueError, match=r"The file holds the model's keys behind the prefix 'model.' \(e.g. 'model\..*'\): "
                                         r"save its weights with the prefix taken off"):
        ResilientCheckpointer(Trainer.build_model(cfg)).load(str(tmp_path / "p.pth"))
    # an EMA's or SWA's AveragedModel: its n_averaged beside the model behind "module.", called a torchvision
    # checkpoint to convert
    averaged = torch.optim.swa_utils.AveragedModel(model)
    torch.save({"model": averaged.state_dict()}, tmp_path / "ema.pth")
    with pytest.raises(ValueError, match=r"The file is the state dict of torch's AveragedModel \(EMA or SWA: its "
                                         r"'n_averaged' and the model's keys behind 'module.'\): save the averaged "
                                         r"model's own weights \(averaged.module.state_dict\(\)\) and load that file"):
        ResilientCheckpointer(Trainer.build_model(cfg)).load(str(tmp_path / "ema.pth"))
    torch.save({"model": averaged.module.state_dict()}, tmp_path / "ema.pth")
    ResilientCheckpointer(Trainer.build_model(cfg)).load(str(tmp_path / "ema.pth"))
    # model.backbone.state_dict() saved on its own: its keys lack "backbone.", called "named otherwise"
    torch.save({"model": model.backbone.state_dict()}, tmp_path / "backbone.pth")
    with pytest.raises(ValueError, match=r"The file holds the model's keys without their 'backbone.' \(e.g. '.*' is the "
                                         r"model's 'backbone\..*'\): the state dict of model.backbone, not of the model"):
        ResilientCheckpointer(Trainer.build_model(cfg)).load(str(tmp_path / "backbone.pth"))
    torch.save({"model": model}, tmp_path / "whole.pth")
    monkeypatch.setenv("GWDET_ALLOW_UNSAFE_PICKLE", "1")
    loaded = Trainer.build_model(cfg)
    ResilientCheckpointer(loaded).load(str(tmp_path / "whole.pth"))
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in loaded.state_dict().items())


def test_a_trainer_refuses_a_second_train_a_moved_start_and_requests_it_cannot_read(tmp_path):
    # train() again after a stop (Ctrl-C, a hook's error) started at iteration 0 and wrote over model_0000000.pth;
    # start_iter set to 0 after a resume wrote over the run's first checkpoints; resume="False" resumed; OUTPUT_DIR ""
    # failed after the build; a crashed attempt's metrics.json got the new run's lines appended
    from detectron2.engine import HookBase

    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "run")])

    class FailingHook(HookBase):
        def after_step(self):
            raise RuntimeError("my hook failed")

    trainer = Trainer(cfg)
    trainer.register_hooks([FailingHook()])
    trainer.resume_or_load(resume=False)
    with pytest.raises(RuntimeError, match="my hook failed"):
        trainer.train()
    with pytest.raises(ValueError, match=r"^This trainer's train\(\) ran already and stopped at iteration 0 .*build it "
                                         r"and call resume_or_load\(resume=True\), then train\(\).$"):
        trainer.train()
    with pytest.raises(TypeError, match=r"^resume_or_load\(resume='False'\): give resume as True"):
        Trainer(cfg).resume_or_load(resume="False")
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.json").write_text('{"iteration": 24}\n')
    fresh = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "fresh")])
    with pytest.raises(FileExistsError, match=r"holds metrics.json of an earlier training that wrote no checkpoint"):
        Trainer(fresh).resume_or_load(resume=False)
    (tmp_path / "fresh" / "metrics.json").unlink()
    (tmp_path / "fresh" / "events.out.tfevents.1.host.2.0").write_bytes(b"earlier")
    with pytest.raises(FileExistsError, match=r"holds events.out.tfevents.1.host.2.0 of an earlier training"):
        Trainer(fresh).resume_or_load(resume=False)
    empty = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", ""])
    with pytest.raises(ValueError, match=r"^OUTPUT_DIR is '': give the folder the run writes"):
        Trainer(empty)
    done = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "done")])
    first = Trainer(done)
    first.resume_or_load(resume=False)
    first.train()
    longer = build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(tmp_path / "done"), "SOLVER.MAX_ITER",
                                                         str(done.SOLVER.MAX_ITER + 2)])
    resumed = Trainer(longer)
    resumed.resume_or_load(resume=True)
    resumed.start_iter = 0
    with pytest.raises(ValueError, match=rf"^This trainer resumed the run at iteration {done.SOLVER.MAX_ITER}, but its "
                                         r"start_iter is 0 now"):
        resumed.train()


def test_the_checkpointers_warnings_are_among_a_runs_warnings(tmp_path):
    # a fine-tuning from weights trained on RGB images fed BGR was warned of by fvcore's logger only: not in
    # results.md's Warnings, easy to miss
    from gwdet.engine.run_log import RunWarnings

    ResilientCheckpointer(Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS)), str(tmp_path)).save("rgb")
    bgr = Trainer.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "INPUT.FORMAT", "BGR"]))
    with RunWarnings() as warned:
        ResilientCheckpointer(bgr).load(str(tmp_path / "rgb.pth"))
    assert any("rgb.pth was trained with values this model has otherwise: input_format 'RGB' -> 'BGR'" in message
               for message in warned.messages), warned.messages


def test_initial_weights_replaced_while_they_load_are_refused(tmp_path):
    # a conversion with --overwrite into MODEL.WEIGHTS as a training started: the records named the new file's
    # SHA-256, the model held the old file's weights
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    for name in ("a", "b"):  # (a file copied by hand: no .sha256 record beside it)
        torch.save({"model": Trainer.build_model(cfg).state_dict()}, tmp_path / f"{name}.pth")

    class ReplacedWhileLoading(ResilientCheckpointer):
        def _load_model(self, checkpoint):
            os.replace(tmp_path / "b.pth", tmp_path / "a.pth")  # another process's rename, once read
            return super()._load_model(checkpoint)

    with pytest.raises(RuntimeError, match=r"^MODEL.WEIGHTS .*a.pth was replaced or written to while it was read .*"
                                           r"nothing was trained or evaluated"):
        ReplacedWhileLoading(Trainer.build_model(cfg)).load_weights(str(tmp_path / "a.pth"))
    ResilientCheckpointer(Trainer.build_model(cfg)).load_weights(str(tmp_path / "a.pth"))  # as it stays: loaded


def test_an_fpn_models_weights_for_a_c4_model_are_named_by_their_resnets_place(tmp_path):
    # "named otherwise, or of other shapes (detectron2 matches a .pkl's names ...)" and ImageNet conversion advice,
    # though the file's whole ResNet was there under backbone.bottom_up.
    c4 = ["MODEL.BACKBONE.NAME", "build_gw_resnet_backbone", "MODEL.RESNETS.OUT_FEATURES", '["res4"]',
          "MODEL.RPN.IN_FEATURES", '["res4"]', "MODEL.ROI_HEADS.IN_FEATURES", '["res4"]', "MODEL.ROI_HEADS.NAME",
          "GWRes5ROIHeads", "MODEL.ANCHOR_GENERATOR.SIZES", "[[16,32,64]]", "MODEL.MASK_ON", "False"]
    fpn = Trainer.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "MODEL.MASK_ON", "False"]))
    torch.save({"model": fpn.state_dict()}, tmp_path / "fpn.pth")
    with pytest.raises(ValueError, match=r"The file's ResNet is under 'backbone.bottom_up.' \(e.g. "
                                         r"'backbone.bottom_up.stem.conv1.weight'\), the model's under 'backbone.': the "
                                         r"weights of a model with an FPN for one without"):
        ResilientCheckpointer(Trainer.build_model(build_config(str(DEMO_CONFIG), [*TINY_OPTS, *c4]))).load_weights(
            str(tmp_path / "fpn.pth"))


def test_a_resume_from_another_runs_checkpoint_under_a_later_name_is_refused(tmp_path):
    # another run's model_final.pth (iteration 3) copied over model_0000022.pth: the run went on from iteration 4,
    # cut its metrics there and mixed two trainings' checkpoints, without a word
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ResilientCheckpointer(model, str(tmp_path), optimizer=optimizer).save("model_0000003", iteration=3)
    os.replace(tmp_path / "model_0000003.pth", tmp_path / "model_0000022.pth")
    (tmp_path / "model_0000003.pth.sha256").unlink()
    digest = hashlib.sha256((tmp_path / "model_0000022.pth").read_bytes()).hexdigest()
    (tmp_path / "model_0000022.pth.sha256").write_text(f"{digest}  model_0000022.pth\n")
    (tmp_path / "last_checkpoint").write_text("model_0000022.pth")
    resumed = ResilientCheckpointer(model, str(tmp_path), optimizer=optimizer)
    with pytest.raises(ValueError, match=r"--resume: .*model_0000022.pth records iteration 3, not 22 as its name says: "
                                         r"it is another run's checkpoint copied or renamed there .* nothing was changed"):
        resumed.resume_or_load("", resume=True)
    os.replace(tmp_path / "model_0000022.pth", tmp_path / "model_0000003.pth")  # under its own name it resumes
    os.replace(tmp_path / "model_0000022.pth.sha256", tmp_path / "model_0000003.pth.sha256")
    (tmp_path / "model_0000003.pth.sha256").write_text(f"{digest}  model_0000003.pth\n")
    (tmp_path / "last_checkpoint").write_text("model_0000003.pth")
    assert ResilientCheckpointer(model, str(tmp_path), optimizer=optimizer).resume_or_load("", resume=True)["iteration"] == 3


def test_a_resume_from_another_runs_checkpoint_of_the_same_name_and_iteration_is_refused(tmp_path):
    # another run's model_final.pth (or model_0000003.pth), its .sha256 made anew, copied over this run's: the resume
    # went on from the other run's weights, optimizer and random state without a word (its iteration matched the name)
    from gwdet.checkpoint.run_identity import RUN_ID_KEY

    def run(folder):
        folder.mkdir()
        model = torch.nn.Linear(2, 2)
        checkpointer = ResilientCheckpointer(model, str(folder), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        checkpointer.resume_or_load("", resume=False)
        checkpointer.save("model_final", iteration=3)
        return checkpointer

    ours, other = run(tmp_path / "ours"), run(tmp_path / "other")
    assert ours.run_id != other.run_id and (tmp_path / "ours" / "run_id").read_text() == ours.run_id
    assert torch.load(tmp_path / "ours" / "model_final.pth", weights_only=False)[RUN_ID_KEY] == ours.run_id
    kept = (tmp_path / "ours" / "model_final.pth").read_bytes()
    shutil.copy(tmp_path / "other" / "model_final.pth", tmp_path / "ours" / "model_final.pth")
    digest = hashlib.sha256((tmp_path / "ours" / "model_final.pth").read_bytes()).hexdigest()
    (tmp_path / "ours" / "model_final.pth.sha256").write_text(f"{digest}  model_final.pth\n")
    model = torch.nn.Linear(2, 2)
    resumed = ResilientCheckpointer(model, str(tmp_path / "ours"), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=rf"--resume: .*model_final.pth was saved by another run than the one in .*ours: "
                                         rf"it records the run {other.run_id[:12]}\.\.\., the folder's run_id file the run "
                                         rf"{ours.run_id[:12]}\.\.\.; it is another run's checkpoint copied there"):
        resumed.resume_or_load("", resume=True)
    (tmp_path / "ours" / "model_final.pth").write_bytes(kept)  # its own checkpoint back: resumed, the identity kept
    digest = hashlib.sha256(kept).hexdigest()
    (tmp_path / "ours" / "model_final.pth.sha256").write_text(f"{digest}  model_final.pth\n")
    again = ResilientCheckpointer(model, str(tmp_path / "ours"), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert again.resume_or_load("", resume=True)["iteration"] == 3 and again.run_id == ours.run_id
    # without the folder's record, its other checkpoints tell the run's identity
    shutil.copy(tmp_path / "ours" / "model_final.pth", tmp_path / "ours" / "model_0000003.pth")
    shutil.copy(tmp_path / "other" / "model_final.pth", tmp_path / "ours" / "model_final.pth")
    digest = hashlib.sha256((tmp_path / "ours" / "model_final.pth").read_bytes()).hexdigest()
    (tmp_path / "ours" / "model_final.pth.sha256").write_text(f"{digest}  model_final.pth\n")
    (tmp_path / "ours" / "run_id").unlink()
    with pytest.raises(ValueError, match=rf"it records the run {other.run_id[:12]}\.\.\., its other checkpoint "
                                         rf"model_0000003.pth the run {ours.run_id[:12]}\.\.\."):
        ResilientCheckpointer(model, str(tmp_path / "ours"),
                              optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).resume_or_load("", resume=True)
    (tmp_path / "ours" / "model_final.pth").write_bytes(kept)
    (tmp_path / "ours" / "model_final.pth.sha256").write_text(f"{hashlib.sha256(kept).hexdigest()}  model_final.pth\n")
    (tmp_path / "ours" / "model_0000003.pth").unlink()
    # a folder without the record (gwdet before it; detectron2's checkpointer) takes the identity of what it resumes
    adopted = ResilientCheckpointer(model, str(tmp_path / "ours"), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    adopted.resume_or_load("", resume=True)
    adopted.save("model_0000004", iteration=4)
    assert adopted.run_id == ours.run_id and (tmp_path / "ours" / "run_id").read_text() == ours.run_id


def _small_gw_model() -> torch.nn.Module:
    from gwdet.layers import GroupWhitening

    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), GroupWhitening(4, num_groups=2))


def test_a_checkpoint_holding_nan_is_refused_by_load_and_by_resume_naming_the_file(tmp_path):
    # ResilientCheckpointer(predictor.model).load(path) (docs/weights.md) loaded NaN weights without a word, and a
    # resume went on from them; only load_weights / resume_or_load(resume=False) refused the file
    diverged = _small_gw_model()
    ResilientCheckpointer(diverged, save_dir=str(tmp_path)).save("model_0000001", iteration=1)
    with torch.no_grad():
        diverged[0].weight[0, 0] = float("nan")
    ResilientCheckpointer(diverged, save_dir=str(tmp_path)).save("model_0000003", iteration=3)
    model = _small_gw_model()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    path = tmp_path / "model_0000003.pth"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} holds NaN or infinite values in 1 tensor\(s\) "
                                         r"\(0.weight\): a model built from them computes NaN, so its results would "
                                         r"mean nothing; nothing was loaded. The run that wrote them diverged: use an "
                                         r"earlier checkpoint of it, or other weights.$"):
        ResilientCheckpointer(model).load(str(path))
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    checkpointer = ResilientCheckpointer(model, save_dir=str(tmp_path))
    with pytest.raises(ValueError, match=rf"^--resume: {re.escape(str(path))} holds NaN or infinite values in 1 "
                                         r"tensor\(s\) \(0.weight\): the run diverged before it saved them, and training "
                                         r"on from them would compute NaN; nothing was loaded. Continue from an earlier "
                                         r"checkpoint of the run by writing its name into .*last_checkpoint \(e.g. "
                                         r"model_0000001.pth\), or train afresh"):
        checkpointer.resume_or_load("", resume=True)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    (tmp_path / "last_checkpoint").write_text("model_0000001.pth")  # the fix the message names
    assert checkpointer.resume_or_load("", resume=True)["iteration"] == 1


def test_a_model_on_the_meta_device_is_refused_by_save_and_load_and_meta_weights_by_load(tmp_path):
    # a model built on the meta device: save and load failed with torch's "Cannot copy out of meta tensor; no data!";
    # a state dict saved from one, loaded with .load(path), with torch's error per parameter
    ResilientCheckpointer(_small_gw_model(), save_dir=str(tmp_path)).save("real")
    with torch.device("meta"):
        meta = _small_gw_model()
    with pytest.raises(ValueError, match=r"^Checkpoint 'empty' cannot be saved: the model is on the meta device \(4 of "
                                         r"its tensors, e.g. '0.weight': a model built under torch.device\('meta'\) or "
                                         r"with MODEL.DEVICE meta\), whose tensors hold shapes but no values, so there "
                                         r"is nothing to save; nothing was written. Build the model on the CPU or GPU"):
        ResilientCheckpointer(meta, save_dir=str(tmp_path)).save("empty")
    assert not (tmp_path / "empty.pth").exists()
    with pytest.raises(ValueError, match=r"^ResilientCheckpointer.load: .*real.pth cannot be loaded into the model: the "
                                         r"model is on the meta device .* nothing was loaded. Build the model on the "
                                         r"CPU or GPU .*and load the checkpoint into it \(model.to_empty\(\) would leave"):
        ResilientCheckpointer(meta).load(str(tmp_path / "real.pth"))
    torch.save({"model": meta.state_dict()}, tmp_path / "meta.pth")
    with pytest.raises(ValueError, match=r"^.*meta.pth: its tensors hold no values \(4 on the meta device, e.g. "
                                         r"'0.weight'\): the state dict of a model built on torch.device\('meta'\). Save "
                                         r"the weights of a model on the CPU .* and give that file; nothing was loaded.$"):
        ResilientCheckpointer(_small_gw_model()).load(str(tmp_path / "meta.pth"))


@pytest.mark.parametrize("default, other", [
    (torch.nn.ReLU, torch.nn.SiLU),  # a class: recorded as its import path
    (float("nan"), 0.5),  # NaN as an 'unset' mark: equal to itself
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])),  # a tensor: recorded as its values
    ((4, 2), (4, 3)),  # a tuple: recorded as a list
], ids=["class", "nan", "tensor", "tuple"])
def test_a_registered_norms_values_are_recorded_as_plain_data_that_loads_back(tmp_path, registered, default, other):
    # a class default was pickled into the checkpoint, which gwdet then refused as unsafe; NaN was refused against
    # itself; a tensor default failed with "Boolean value of Tensor with more than one value is ambiguous"
    import gwdet

    registered.append("TestPlainValues")
    gwdet.register_norm("TestPlainValues", lambda channels, value=default: torch.nn.GroupNorm(2, channels))

    def model(**value):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), gwdet.norm("TestPlainValues", **value)(4))

    ResilientCheckpointer(model(), str(tmp_path)).save("trained")
    recorded = torch.load(tmp_path / "trained.pth", weights_only=True)["gwdet_norm_settings"]["1"]["value"]
    assert isinstance(recorded, (str, float, list))
    ResilientCheckpointer(model()).load(str(tmp_path / "trained.pth"))  # its own checkpoint, read without unpickling
    with pytest.raises(ValueError, match=r"other norm hyper-parameters than this config gives its layers \(1 values, "
                                         r"e.g. 1 value .* -> .*\); nothing was loaded"):
        ResilientCheckpointer(model(value=other)).load(str(tmp_path / "trained.pth"))


def _conv_and_norm(norm) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), norm(8))


def test_a_lazy_config_nodes_list_is_recorded_as_a_list_and_its_checkpoint_loads(tmp_path, registered):
    # detectron2's instantiate gives a node's tuple as an OmegaConf ListConfig, which the checkpoint pickled: gwdet
    # refused its own checkpoint as needing unsafe unpickling
    import gwdet
    from detectron2.config import LazyCall as L, instantiate

    registered.append("TestTupleGN")
    gwdet.register_norm("TestTupleGN", lambda channels, groups=(4,): torch.nn.GroupNorm(groups[0], channels))
    node = L(_conv_and_norm)(norm=L(gwdet.norm)(name="TestTupleGN", groups=(2,)))
    built = instantiate(node)
    assert type(built[1]).__name__ == "GroupNorm" and built[1].num_groups == 2
    ResilientCheckpointer(built, str(tmp_path)).save("lazy")
    assert torch.load(tmp_path / "lazy.pth", weights_only=True)["gwdet_norm_settings"]["1"]["groups"] == [2]
    ResilientCheckpointer(instantiate(node)).load(str(tmp_path / "lazy.pth"))
    in_python = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), gwdet.norm("TestTupleGN", groups=(2,))(8))
    ResilientCheckpointer(in_python).load(str(tmp_path / "lazy.pth"))  # the same values given as a tuple


def test_a_registered_norms_value_no_checkpoint_can_record_is_refused_at_save(tmp_path, registered):
    # an object of no plain value was pickled into the checkpoint, which gwdet then refused to read
    import gwdet

    class Opaque:
        pass

    registered.append("TestOpaque")
    gwdet.register_norm("TestOpaque", lambda channels, thing=None: torch.nn.GroupNorm(2, channels))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), gwdet.norm("TestOpaque", thing=Opaque())(4))
    with pytest.raises(ValueError, match=r"^Checkpoint 'opaque' cannot be saved; nothing was written. The norm layer 1 "
                                         r"\(GroupNorm\) was built with thing=<.*Opaque object at 0x.*> \(Opaque\), which "
                                         r"a checkpoint cannot record: .* Give thing as plain data .* or give Opaque a "
                                         r"__repr__ that shows the values that make it what it is.$"):
        ResilientCheckpointer(model, str(tmp_path)).save("opaque")
    assert not (tmp_path / "opaque.pth").exists()


# last_checkpoint holding ./model_0000001.pth: "names ./model_0000001.pth, which is not in ..." and the newest other
# checkpoint resumed instead of the one named
def test_a_last_checkpoint_naming_its_file_with_a_dot_folder_is_the_file_it_names(tmp_path, caplog):
    model = torch.nn.Linear(2, 2)
    saver = ResilientCheckpointer(model, str(tmp_path), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    saver.resume_or_load("", resume=False)
    saver.save("model_0000001", iteration=1)
    saver.save("model_final", iteration=4)
    (tmp_path / "last_checkpoint").write_text("./model_0000001.pth\n")
    resumed = ResilientCheckpointer(model, str(tmp_path), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with caplog.at_level(logging.WARNING):
        assert resumed.resume_or_load("", resume=True)["iteration"] == 1
    assert "is not in" not in caplog.text


# "cannot be written (Not a directory / File name too long); nothing was changed", with the folders made on the way
# (r/newdir, 20 nested folders of a path too long) left behind
def test_an_output_folder_that_cannot_be_made_leaves_no_folder_made_on_the_way(tmp_path):
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "model_final.pth").write_bytes(b"weights")
    for output_dir in (tmp_path / "newdir" / ".." / "run1" / "model_final.pth" / "sub",
                       tmp_path.joinpath(*["b" * 200] * 25)):
        with pytest.raises(GwdetError, match=r"cannot be written \((Not a directory|File name too long)\); nothing was "
                                             "changed"):
            with OutputDirLock(str(output_dir)):
                pass
        assert sorted(os.listdir(tmp_path)) == ["run1"]


# OUTPUT_DIR 'runs/nl\nx' (a newline in the name) trained, and its --resume then failed with fvcore's raw
# "AssertionError: Checkpoint runs/nlx/model_final.pth not found!"
def test_an_output_dir_with_a_control_character_is_refused_before_anything_is_written(tmp_path):
    from gwdet.engine.output_dir import OutputDirNameError, check_output_dir_name

    folder = tmp_path / "nl\nx"
    expected = (r"OUTPUT_DIR '.*nl\\nx' holds a control character \('\\n', e.g. a newline pasted into the name\): "
                r"the run's records name its files line by line \(last_checkpoint names its last checkpoint\), so a "
                r"--resume or an evaluation of the run would not find its checkpoints; nothing was written. Give a "
                r"folder name without it, e.g. OUTPUT_DIR .*nlx")
    with pytest.raises(OutputDirNameError, match=expected):
        main(tiny_run_args(folder))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OutputDirNameError, match=r"^train.output_dir 'out\\tput' holds a control character \('\\t'"):
        check_output_dir_name("out\tput", setting="train.output_dir")
    check_output_dir_name(str(tmp_path / "plain name"))


# a file replaced by a tool (benchmark --out, convert --overwrite) came back with the umask's mode 644 (a private
# 600 file made readable by all, a read-only one writable), and a hard link of it was broken without a word
def test_a_replaced_file_keeps_its_mode_and_a_broken_hard_link_is_warned_of(tmp_path, caplog):
    import logging
    import stat

    from gwdet.utils.atomic import path_written_atomically, write_atomically

    for mode in (0o600, 0o444, 0o664):
        path = tmp_path / f"notes_{mode:o}.md"
        path.write_text("old")
        path.chmod(mode)
        write_atomically(str(path), lambda file: file.write(b"new"))
        assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == mode
    torchscript = tmp_path / "model.ts"
    torchscript.write_bytes(b"old")
    torchscript.chmod(0o600)
    with path_written_atomically(str(torchscript)) as temporary:
        with open(temporary, "wb") as file:
            file.write(b"new")
    assert stat.S_IMODE(torchscript.stat().st_mode) == 0o600
    linked, other = tmp_path / "hl1.md", tmp_path / "hl2.md"
    linked.write_text("old")
    os.link(linked, other)
    with caplog.at_level(logging.WARNING, logger="gwdet.utils.atomic"):
        write_atomically(str(linked), lambda file: file.write(b"new"))
    assert linked.read_text() == "new" and other.read_text() == "old"
    assert [f"{linked} is one of 2 hard links of one file: the new file replaces this name only, and the file's other "
            "names keep the old content. Link them to the new file again if they are meant to follow it."] == [
        record.getMessage() for record in caplog.records]
    fresh = tmp_path / "fresh.md"
    write_atomically(str(fresh), lambda file: file.write(b"new"))  # a new file: the umask's mode
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# a record of two lines was checked on its first line only: a wrong second line passed, swapped lines refused the file
def test_a_checksum_record_of_several_lines_is_an_unusable_record_not_checked_on_its_first_line(tmp_path):
    from gwdet.engine.output_dir import check_config_checksum
    from gwdet.errors import GwdetUserWarning
    from gwdet.export import verify_export
    from gwdet.utils.atomic import DamagedFileError, checksum_findings, record_checksum

    export = tmp_path / "t.ts"
    export.write_bytes(b"an export")
    record_checksum(str(export))
    record = tmp_path / "t.ts.sha256"
    right, wrong = record.read_text(), "0" * 64 + "  t.ts\n"
    said = ("its checksum record t.ts.sha256 holds 2 lines; gwdet writes one (sha256sum t.ts > t.ts.sha256 writes it "
            "anew)")
    for text in (right + wrong, wrong + right, right + "\n" + right):
        record.write_text(text)
        assert checksum_findings(str(export)) == (said, None)
        with pytest.warns(GwdetUserWarning, match=re.escape(f"{export}: {said}, so the export is loaded unchecked.")):
            assert verify_export(str(export)) is False
    record.write_text(right + "\n  \n")  # blank lines aside, the one entry checks the file
    assert checksum_findings(str(export)) == (None, None) and verify_export(str(export)) is True
    config = tmp_path / "config.yaml"
    config.write_text("MODEL: {}\n")
    record_checksum(str(config))
    (tmp_path / "config.yaml.sha256").write_text((tmp_path / "config.yaml.sha256").read_text() + wrong)
    with pytest.raises(DamagedFileError, match=re.escape(
            "its checksum record config.yaml.sha256 holds 2 lines; gwdet writes one (sha256sum config.yaml > "
            "config.yaml.sha256 writes it anew); nothing was trained.")):
        check_config_checksum(str(config), str(tmp_path))
