"""Bad inputs and faults of the run folder, the run's config.yaml and weight files found by a sweep
(sweep B): each refusal names the file, key or flag, the problem and the fix, comes before any
expensive work, and loses nothing the user had; what a run does and what it says agree.

One tiny training run (module fixture) provides a run folder and checkpoints; each check copies
what it changes.
"""
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from gwdet.checkpoint.integrity import DamagedTensorsError, verify_checksums, with_checksums, without_checksums_recipe
from gwdet.checkpoint.resilient import ResilientCheckpointer
from gwdet.engine.arguments import parse_args
from gwdet.engine.output_dir import (OutputDirLock, OutputDirNotWritableError, check_config_file_kept,
                                     check_fresh_start, check_resume_config, check_run_folders, evaluation_folder,
                                     holds_run, run_files)
from gwdet.utils.run_file_names import CONFIG_KEPT, CONFIG_NAME
from gwdet.engine.run import evaluation_request, load_run_config, main
from gwdet.engine.trainer import Trainer
from gwdet.errors import GwdetError, GwdetOSError
from gwdet.model_zoo import build_config
from gwdet.utils.atomic import WriteError

from conftest import DEMO_CONFIG, REPO, TINY_OPTS, error_in_child, logged_warnings, run_folder_with_a_link, tiny_run_args

RECORD = CONFIG_NAME + ".sha256"




def _digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _copy_run(source, target, *names):
    target.mkdir()
    for name in names:
        shutil.copyfile(source / name, target / name)
    return target


@pytest.fixture(scope="module")
def model():
    return Trainer.build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))


# ---- LOSS 1: the config file given is the config.yaml the run writes ----------------------------------

USERS_CONFIG = f'# my experiment\n_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    NUM_GROUPS: 16\n'


def test_a_config_file_that_is_the_output_dirs_config_yaml_is_refused_before_anything_is_written(tmp_path):
    config = tmp_path / CONFIG_NAME
    config.write_text(USERS_CONFIG)
    with pytest.raises(FileExistsError) as refused:
        main(tiny_run_args(tmp_path, config_file=config))
    assert str(refused.value) == (
        f"The config file {config} is OUTPUT_DIR/{CONFIG_NAME} ({config}), where the run writes its full config: "
        f"your file (its comments and _BASE_ too), which no run wrote (no {RECORD} beside it matches it), would be "
        "replaced; nothing was changed. Give the run another OUTPUT_DIR, or keep the config file elsewhere (e.g. mv "
        f"{config} {tmp_path / 'my_config.yaml'} and pass that as --config-file).")
    assert isinstance(refused.value, GwdetError)
    assert config.read_text() == USERS_CONFIG and os.listdir(tmp_path) == [CONFIG_NAME], "nothing written"


def test_a_runs_own_config_yaml_is_still_a_config_file_to_resume_and_evaluate_with(finished_run, tmp_path):
    check_config_file_kept(str(finished_run / CONFIG_NAME), str(finished_run))  # as the run wrote it
    # --eval-only with it: the evaluation goes to eval/<checkpoint>/, the run's config.yaml stays
    args = parse_args(["--config-file", str(finished_run / CONFIG_NAME), "--eval-only",
                       "MODEL.WEIGHTS", str(finished_run / "model_final.pth")])
    run, args = evaluation_request(load_run_config(args.config_file, args.opts), args)
    assert run.output_dir == str(finished_run / "eval" / "model_final")
    check_config_file_kept(args.config_file, run.output_dir)
    # --resume with it: trains on, and its config.yaml is the new dump with a matching record
    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "last_checkpoint", CONFIG_NAME, RECORD)
    text = (run / CONFIG_NAME).read_text().replace(str(finished_run), str(run))
    (run / CONFIG_NAME).write_text(text)
    (run / RECORD).write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  {CONFIG_NAME}\n")
    main(parse_args(["--config-file", str(run / CONFIG_NAME), "--resume", "SOLVER.MAX_ITER", "3"]))
    assert "MAX_ITER: 3" in (run / CONFIG_NAME).read_text() and (run / "model_final.pth").is_file()
    assert (run / RECORD).read_text().split()[0] == hashlib.sha256((run / CONFIG_NAME).read_bytes()).hexdigest()
    # edited by hand, it is the user's file again
    with open(run / CONFIG_NAME, "a") as f:
        f.write("# my notes\n")
    with pytest.raises(FileExistsError, match="which no run wrote"):
        check_config_file_kept(str(run / CONFIG_NAME), str(run))


# ---- LOSS 2, RAW 8: writing config.yaml fails (full disk) ------------------------------------------------

def test_a_resume_whose_config_record_cannot_be_written_leaves_config_and_record_as_they_were(
        finished_run, tmp_path, monkeypatch):
    run = _copy_run(finished_run, tmp_path / "run", "model_0000000.pth", "model_final.pth", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(run)

    def full_disk(path, digest=None):
        raise WriteError(errno.ENOSPC, f"cannot write {path}.sha256: No space left on device")

    monkeypatch.setattr("gwdet.engine.output_dir.record_checksum", full_disk)
    with pytest.raises(GwdetOSError) as refused:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert str(refused.value) == (
        f"OUTPUT_DIR {str(run)!r}: writing the run's {CONFIG_NAME} and log there failed ([Errno 28] cannot write "
        f"{run / CONFIG_NAME}.sha256: No space left on device); {CONFIG_NAME} and {RECORD} there are as they were "
        "before this run, and nothing was trained. Free space there (or fix what the error names), or give the run "
        "another OUTPUT_DIR.")
    assert isinstance(refused.value, GwdetError) and isinstance(refused.value, OSError)
    after = _digest(run)
    assert {name: after[name] for name in before} == before, "config.yaml, its record and the run as they were"
    assert not (run / CONFIG_KEPT).exists()
    monkeypatch.undo()
    check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS + ["SOLVER.MAX_ITER", "3"]), str(run))  # accepted


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_a_config_yaml_on_a_full_disk_is_one_error_naming_output_dir_and_leaves_no_partial_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/full", run / CONFIG_NAME)  # detectron2's write of config.yaml meets a full disk
    (run / RECORD).write_text("the record of a run's config\n")  # a run's, so the run may write there
    with pytest.raises(GwdetOSError, match=rf"^OUTPUT_DIR {str(run)!r}: writing the run's config.yaml and log "
                                                  r"there failed \(\[Errno 28\] No space left on device\); .*nothing "
                                                  r"was trained\. Free space there"):
        main(tiny_run_args(run))
    assert os.readlink(run / CONFIG_NAME) == "/dev/full"
    assert (run / RECORD).read_text() == "the record of a run's config\n"
    assert not (run / CONFIG_KEPT).exists()


def test_a_run_killed_while_writing_config_yaml_has_it_put_back_by_the_next_run(finished_run, tmp_path, caplog):
    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "last_checkpoint", CONFIG_NAME, RECORD)
    before = _digest(run)
    kept = run / CONFIG_KEPT  # what a run keeps while detectron2 rewrites config.yaml in place
    kept.mkdir()
    for name in (CONFIG_NAME, RECORD):
        shutil.copyfile(run / name, kept / name)
    text = (run / CONFIG_NAME).read_text()
    (run / CONFIG_NAME).write_text(text[:text.index("\nMODEL:")])  # the kill came half way
    with caplog.at_level(logging.WARNING, logger="gwdet.engine.output_dir"), OutputDirLock(str(run)):
        pass
    assert {name: digest for name, digest in _digest(run).items() if name != ".gwdet.lock"} == before
    assert not kept.exists()
    assert f"{run}: put config.yaml and config.yaml.sha256 back as they were before a run that stopped" in caplog.text
    check_resume_config(build_config(str(DEMO_CONFIG), TINY_OPTS), str(run))


# ---- SILENT 8: last_checkpoint left, no checkpoint ---------------------------------------------------------

def test_resume_with_last_checkpoint_but_no_checkpoint_is_refused_before_training(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run", "last_checkpoint", "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(run)
    tag = run / "last_checkpoint"
    message = (f"--resume: {tag} names 'model_final.pth', which is not a checkpoint file in {str(run)!r}, and no other "
               "checkpoint is there, so there is nothing to resume: detectron2 would still count the run as resumed "
               f"and start training at iteration 1, from MODEL.WEIGHTS; nothing was changed. Restore model_final.pth "
               f"into {run} (from a copy) to continue the run, or train afresh with --overwrite instead of --resume "
               "(which deletes the earlier run's files).")
    with pytest.raises(FileNotFoundError) as refused:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert str(refused.value) == message and isinstance(refused.value, GwdetError)
    assert {name: digest for name, digest in _digest(run).items() if name != ".gwdet.lock"} == before
    # the trainer itself (gwdet's Python API) refuses the same way instead of starting at iteration 1
    trainer = Trainer(build_config(str(DEMO_CONFIG), TINY_OPTS + ["OUTPUT_DIR", str(run)]))
    with pytest.raises(FileNotFoundError) as refused:
        trainer.resume_or_load(resume=True)
    assert str(refused.value) == message


# ---- MISLEADING 1, 2: a checkpoint changed on purpose ------------------------------------------------------

def test_weights_whose_training_state_was_removed_load_with_a_warning_and_resume_refuses_them(
        finished_run, tmp_path, model, caplog):
    checkpoint = torch.load(finished_run / "model_final.pth", weights_only=True)
    stripped = tmp_path / "stripped.pth"
    torch.save({key: value for key, value in checkpoint.items() if key not in ("trainer", "random_state")}, stripped)
    with caplog.at_level(logging.WARNING):
        ResilientCheckpointer(model, require_every_weight=True).load_weights(str(stripped))
    assert all(torch.equal(value, checkpoint["model"][name]) for name, value in model.state_dict().items()
               if isinstance(value, torch.Tensor))
    assert (f"{stripped}: random_state, trainer were removed from the file after gwdet wrote it (as when a "
            "checkpoint's training state is removed to publish its weights). Its weights match the checksums recorded "
            "with them and are loaded as MODEL.WEIGHTS; the file cannot continue a training with --resume.") in caplog.text
    with pytest.raises(DamagedTensorsError, match=r"is damaged: \d+ value\(s\) of its training state .*If the file was "
                                                  r"changed on purpose .*gwdet_checksums and gwdet_state_checksums"):
        ResilientCheckpointer(model, save_dir=str(tmp_path)).load(str(stripped))  # --resume needs that state


def test_weights_converted_to_float16_are_refused_naming_the_dtype_and_the_recipe_that_keeps_them(
        finished_run, tmp_path, model):
    checkpoint = torch.load(finished_run / "model_final.pth", weights_only=True)
    checkpoint["model"] = {name: value.half() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                           for name, value in checkpoint["model"].items()}
    half = tmp_path / "half.pth"
    torch.save(checkpoint, half)
    with pytest.raises(DamagedTensorsError) as refused:
        ResilientCheckpointer(model, require_every_weight=True).load_weights(str(half))
    text = str(refused.value)
    assert "; every one of them is float16 now)" in text
    assert text.endswith(
        "If the file was changed on purpose (its training state removed to publish the weights, the weights converted "
        "to another dtype), the checksums gwdet recorded in it no longer apply: save it without them (its keys "
        f"gwdet_checksums and gwdet_state_checksums), e.g. {without_checksums_recipe(str(half))}")
    exec(without_checksums_recipe(str(half)))  # the recipe as printed
    ResilientCheckpointer(model, require_every_weight=True).load_weights(str(tmp_path / "half_unchecked.pth"))


def test_only_whole_entries_removed_with_the_weights_intact_are_accepted():
    data = with_checksums({"model": {"w": torch.ones(2)}, "iteration": 3, "trainer": {"iteration": 3, "lr": 0.1}})
    assert verify_checksums("w.pth", {k: v for k, v in data.items() if k not in ("trainer", "iteration")},
                            accept_removed_state=True) == ["iteration", "trainer"]
    partly = {**data, "trainer": {"iteration": 3}}  # a value gone inside an entry that is there: damage
    with pytest.raises(DamagedTensorsError, match=r"\(trainer/lr\)"):
        verify_checksums("w.pth", partly, accept_removed_state=True)
    changed = {k: v for k, v in data.items() if k != "trainer"}
    changed["model"] = {"w": torch.zeros(2)}
    with pytest.raises(DamagedTensorsError, match=r"1 tensor\(s\) differ"):
        verify_checksums("w.pth", changed, accept_removed_state=True)
    with pytest.raises(DamagedTensorsError):
        verify_checksums("w.pth", {k: v for k, v in data.items() if k != "trainer"})  # --resume: refused


# ---- MISLEADING 3, 9: OUTPUT_DIR a file; a user's file named like a run folder -----------------------------

def test_an_output_dir_that_is_a_file_is_called_a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("mine")
    with pytest.raises(OutputDirNotWritableError) as refused:
        with OutputDirLock(str(path)):
            pass
    assert str(refused.value) == (f"OUTPUT_DIR {path} is a file, not a folder: give a folder to write into (it is "
                                  "created if it does not exist), or move the file away. Nothing was changed.")
    assert path.read_text() == "mine"


@pytest.mark.parametrize("name", ["vis", "inference"])
def test_a_users_file_named_like_a_run_folder_is_no_run_and_is_kept(tmp_path, name):
    (tmp_path / name).write_text("my notes")
    assert run_files(str(tmp_path)) == [] and not holds_run(str(tmp_path))
    check_fresh_start(str(tmp_path), overwrite=True)
    assert (tmp_path / name).read_text() == "my notes"
    with pytest.raises(FileExistsError) as refused:  # the run could not create its folder there after training
        main(tiny_run_args(tmp_path, "TEST.VIS_IMAGES", "1"))
    assert str(refused.value).startswith(f"OUTPUT_DIR {str(tmp_path)!r} holds a file {name}, but the run writes ")
    assert f"Move or rename {tmp_path / name} (no run wrote it: --overwrite keeps it)" in str(refused.value)
    assert (tmp_path / name).read_text() == "my notes" and not (tmp_path / CONFIG_NAME).exists()
    check_run_folders(str(tmp_path), ["vis" if name == "inference" else "inference"])  # another name: no matter
    (tmp_path / name).unlink()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / name).symlink_to(tmp_path / "elsewhere")  # a link to a folder is no folder of a run either
    with pytest.raises(FileExistsError, match=rf"holds a link {name} \(to .*elsewhere\), but the run writes "):
        check_run_folders(str(tmp_path), [name])


@pytest.mark.parametrize("name", ["last_checkpoint", "metrics.json", "results.md", "model_final.pth"])
def test_a_users_folder_named_like_a_run_file_is_kept_and_refused_before_anything_is_written(tmp_path, name):
    (tmp_path / name).mkdir()
    (tmp_path / name / "notes.txt").write_text("mine")
    assert run_files(str(tmp_path)) == []  # so --overwrite neither sets it aside nor deletes it
    check_fresh_start(str(tmp_path), overwrite=True)
    with pytest.raises(IsADirectoryError) as refused:
        main(tiny_run_args(tmp_path, "--overwrite"))
    assert str(refused.value).startswith(f"OUTPUT_DIR {str(tmp_path)!r} holds a folder {name}, but the run writes ")
    assert f"Move or rename {tmp_path / name} (no run wrote it: --overwrite keeps it)" in str(refused.value)
    assert isinstance(refused.value, GwdetError) and not (tmp_path / CONFIG_NAME).exists()
    assert (tmp_path / name / "notes.txt").read_text() == "mine"


def test_a_run_whose_last_checkpoint_is_a_folder_is_refused_before_resuming_or_evaluating(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "metrics.json",
                    CONFIG_NAME, RECORD)
    (run / "last_checkpoint").mkdir()
    before = _digest(run)
    with pytest.raises(IsADirectoryError, match=r"holds a folder last_checkpoint, but the run writes the name of its "
                                                r"latest checkpoint into a file of that name"):
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert {name: digest for name, digest in _digest(run).items() if name != ".gwdet.lock"} == before
    args = parse_args(["--config-file", str(DEMO_CONFIG), "--eval-only", "--resume", *TINY_OPTS, "OUTPUT_DIR", str(run)])
    with pytest.raises(GwdetOSError, match=rf"^--eval-only --resume: {run}/last_checkpoint cannot be read \(Is a "
                                           rf"directory\)\. Name the weights to evaluate, e.g. MODEL.WEIGHTS "
                                           rf"{run}/model_final.pth\.$"):
        evaluation_request(load_run_config(args.config_file, args.opts), args)


def test_a_resume_with_another_seed_is_refused_unless_the_run_drew_a_random_one(finished_run, tmp_path):
    from gwdet.engine.output_dir import check_resumed_seed

    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(run)
    with pytest.raises(ValueError) as refused:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3", "SEED", "5"))
    assert str(refused.value) == (
        f"--resume: the run in {str(run)!r} trained with SEED 0, this config gives 5: the data stream continues the "
        "run's order of images after those it read, and another seed orders them otherwise, so it would skip or repeat "
        "images. Resume with SEED 0, or start a new run in another folder from the run's last checkpoint as its "
        "initial weights.")
    assert {name: digest for name, digest in _digest(run).items() if name != ".gwdet.lock"} == before
    with logged_warnings("gwdet.engine.output_dir") as warned:
        check_resumed_seed(-1, 5, str(run), "SEED")  # a random order is continued by any, as another order
    assert any("a seed drawn at random, so the resumed data stream is another order of images" in line
               for line in warned), warned
    check_resumed_seed(3, 3, str(run), "SEED")
    with pytest.raises(ValueError, match="trained with SEED 3, this config gives -1"):
        check_resumed_seed(3, -1, str(run), "SEED")


@pytest.mark.parametrize("key, value", [("DATALOADER.SAMPLER_TRAIN", "RepeatFactorTrainingSampler"),
                                        ("DATALOADER.ASPECT_RATIO_GROUPING", "False"),
                                        ("DATASETS.TRAIN", "('shapes_val',)")])
def test_a_resume_reading_other_training_images_or_another_order_is_refused(finished_run, tmp_path, key, value):
    # resumed with only the "config values that differ" warning: the loader skipped the images the run read of
    # another stream (another sampler, grouping, training set; the results named the new set only)
    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(run)
    with pytest.raises(ValueError) as refused:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3", key, value))
    assert str(refused.value).startswith(f"--resume: the run in {str(run)!r} read its training images otherwise than "
                                         f"this config would ({key}: ")
    assert str(refused.value).endswith(
        "the resumed data stream continues the run's after the images it read, and another training set, sampler or "
        "grouping of images orders them otherwise, so it would skip or repeat images, or read others. Resume with the "
        "run's values, or start a new run in another folder from the run's last checkpoint as its initial weights.")
    assert {name: digest for name, digest in _digest(run).items() if name != ".gwdet.lock"} == before


def test_the_data_stream_settings_of_a_lazy_config_are_told_from_others():
    from gwdet.engine.output_dir import changes_the_data_stream

    for line in ("dataloader.train.dataset.names: shapes_train -> shapes_val",
                 "dataloader.train.sampler._target_: a -> b", "dataloader.train.aspect_ratio_grouping: True -> False",
                 "DATALOADER.REPEAT_THRESHOLD: 0.0 -> 0.1"):
        assert changes_the_data_stream(line), line
    for line in ("dataloader.train.num_workers: 4 -> 0", "DATASETS.TEST: a -> b", "DATASETS.TRAINED: a -> b",
                 "train.max_iter: 2 -> 3"):
        assert not changes_the_data_stream(line), line


def test_a_resume_with_other_config_values_keeps_the_config_of_the_iterations_before(finished_run, tmp_path):
    # config.yaml (with a valid record) held only the resume's values, as if the run had trained with them from 0
    from gwdet.utils.atomic import checksum_problem

    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    before = (run / CONFIG_NAME).read_text()
    with logged_warnings("gwdet.engine.output_dir") as warned:
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3", "DATASETS.TEST", "()"))
    kept = run / "config_before_resuming_at_2.yaml"
    assert kept.read_text() == before and checksum_problem(str(kept)) is None
    assert build_config(str(run / CONFIG_NAME)).SOLVER.MAX_ITER == 3
    assert any("config.yaml now holds the config of the iterations from 2 on; that of the iterations before is kept as "
               "config_before_resuming_at_2.yaml" in line for line in warned), warned
    assert "config_before_resuming_at_2.yaml" in run_files(str(run)), "the run's: --overwrite removes it"


def test_eval_only_neither_reads_nor_checks_the_training_sets(finished_run, tmp_path):
    # detectron2 registers COCO whether or not its files are there; evaluating a COCO model needs val only
    results = main(tiny_run_args(tmp_path / "eval", "--eval-only", "MODEL.WEIGHTS", str(finished_run / "model_final.pth"),
                                 "DATASETS.TRAIN", "('coco_2017_train',)", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.01"))
    assert set(results) == {"bbox", "segm"}
    environment = json.loads((tmp_path / "eval" / "results.json").read_text())["environment"]
    assert set(environment["datasets"]) == {"shapes_val"}  # the datasets the evaluation read
    # which weights were scored, whatever later replaces a file of that name (a resumed run's model_final.pth)
    digest = hashlib.sha256((finished_run / "model_final.pth").read_bytes()).hexdigest()
    assert environment["weights"] == {"path": str(finished_run / "model_final.pth"), "sha256": digest}
    markdown = (tmp_path / "eval" / "results.md").read_text()
    assert f"(SHA-256 {digest})" in markdown
    # the test settings the results were evaluated with (the run's config.yaml has 0.05)
    assert "`MODEL.ROI_HEADS.SCORE_THRESH_TEST 0.01`" in markdown and "`INPUT.MIN_SIZE_TEST " in markdown
    assert "`MODEL.RPN.NMS_THRESH 0.7`" in markdown  # the proposals' NMS, which changed the AP unnamed
    with pytest.raises(FileNotFoundError, match="Dataset 'coco_2017_train': its json_file"):
        main(tiny_run_args(tmp_path / "train", "DATASETS.TRAIN", "('coco_2017_train',)", "DATASETS.TEST", "()",
                           "MODEL.ROI_HEADS.NUM_CLASSES", "80"))


def test_an_evaluation_records_the_weights_it_loaded_when_the_file_is_replaced_while_it_runs(finished_run, tmp_path,
                                                                                           monkeypatch):
    # a --resume replacing model_final.pth during an --eval-only: the results named the new file's SHA-256
    from gwdet.engine.trainer import YacsRun

    weights = tmp_path / "model_final.pth"
    shutil.copy(finished_run / "model_final.pth", weights)
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    evaluate = YacsRun.evaluate

    def replaced_while_evaluating(self, model):
        shutil.copy(finished_run / "model_0000000.pth", weights)
        return evaluate(self, model)

    monkeypatch.setattr(YacsRun, "evaluate", replaced_while_evaluating)
    main(tiny_run_args(tmp_path / "eval", "--eval-only", "MODEL.WEIGHTS", str(weights)))
    environment = json.loads((tmp_path / "eval" / "results.json").read_text())["environment"]
    assert environment["weights"]["sha256"] == digest != hashlib.sha256(weights.read_bytes()).hexdigest()


def test_an_evaluation_of_weights_at_a_url_records_the_url_and_its_local_copys_checksum(finished_run, tmp_path,
                                                                                      monkeypatch):
    # detectron2:// weights: the record was the URL joined to the working folder ("<cwd>/detectron2:/x.pth"), with
    # "not a local file" for a SHA-256, although iopath's local copy was read (a training recorded it right)
    cached = tmp_path / "iopath" / "detectron2" / "gwdet-test" / "model_final.pth"
    cached.parent.mkdir(parents=True)
    shutil.copy(finished_run / "model_final.pth", cached)
    monkeypatch.setenv("FVCORE_CACHE", str(tmp_path / "iopath"))  # iopath's cache: nothing is downloaded
    url = "detectron2://gwdet-test/model_final.pth"
    main(tiny_run_args(tmp_path / "eval", "--eval-only", "MODEL.WEIGHTS", url))
    environment = json.loads((tmp_path / "eval" / "results.json").read_text())["environment"]
    assert environment["weights"] == {"path": url, "sha256": hashlib.sha256(cached.read_bytes()).hexdigest()}
    assert f"Weights evaluated: `{url}`" in (tmp_path / "eval" / "results.md").read_text()


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_copy_of_a_run_made_of_links_is_refused_before_it_changes_the_original(finished_run, tmp_path, link):
    # cp -al / cp -rs: the resume rewrote the original's config.yaml in place, which then failed its own record
    original = _copy_run(finished_run, tmp_path / "original", "model_final.pth", "model_final.pth.sha256",
                         "last_checkpoint", "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(original)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in original.iterdir():
        (os.link if link == "hard" else lambda source, target: os.symlink(source, target))(path, copy / path.name)
    with pytest.raises(FileExistsError) as refused:
        main(tiny_run_args(copy, "--resume", "SOLVER.MAX_ITER", "3"))
    assert "the run writes into these files in place, so it would change the files they share their data with" \
        in str(refused.value) and "config.yaml (a" in str(refused.value)
    assert _digest(original) == before


def test_a_lock_file_that_is_a_link_or_a_folder_is_refused_and_its_target_kept(tmp_path):
    notes, run = run_folder_with_a_link(tmp_path, ".gwdet.lock", "my important notes")
    with pytest.raises(OutputDirNotWritableError, match=r"holds a link \.gwdet\.lock \(to .*notes.txt\), where a run "
                                                        r"keeps its lock file"):
        main(tiny_run_args(run))
    assert notes.read_text() == "my important notes"
    (run / ".gwdet.lock").unlink()
    (run / ".gwdet.lock").mkdir()
    with pytest.raises(OutputDirNotWritableError, match=r"holds a folder \.gwdet\.lock"):
        main(tiny_run_args(run))


def test_a_runs_config_yaml_without_weights_given_does_not_stand_for_its_trained_weights(finished_run, tmp_path,
                                                                                     capsys):
    # --eval-only and the export of a fine-tuned run by its config.yaml alone took the weights the run started from
    # (its MODEL.WEIGHTS), not its model_final.pth beside the file, without a word
    from gwdet.export.export_model import main as export_main
    from gwdet.utils.atomic import write_text_with_checksum

    tuned = _copy_run(finished_run, tmp_path / "tuned", "model_final.pth", "model_final.pth.sha256", "last_checkpoint")
    started = str(finished_run / "model_final.pth")
    text = (finished_run / CONFIG_NAME).read_text().replace(f"OUTPUT_DIR: {finished_run}", f"OUTPUT_DIR: {tuned}")
    write_text_with_checksum(str(tuned / CONFIG_NAME), re.sub(r"(?m)^  WEIGHTS: .*$", f"  WEIGHTS: {started}", text))
    assert load_run_config(str(tuned / CONFIG_NAME)).weights == started
    refusal = (rf"^--config-file {tuned / CONFIG_NAME} is the record of the run in {tuned}, whose MODEL.WEIGHTS "
               rf"\({started}\) names the weights that run started from, not the ones it trained; nothing was "
               rf"{{}}. Give MODEL.WEIGHTS {tuned / 'model_final.pth'} for the trained model, or give MODEL.WEIGHTS "
               "on the command line to use the weights it started from.$")
    with pytest.raises(ValueError, match=refusal.format("evaluated")):
        main(parse_args(["--config-file", str(tuned / CONFIG_NAME), "--eval-only"]))
    with pytest.raises(SystemExit, match="2"):
        export_main(["--config-file", str(tuned / CONFIG_NAME), "--output", str(tmp_path / "export")])
    assert refusal.format("written")[1:-1].replace("\\", "") in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "export").exists()
    args = parse_args(["--config-file", str(tuned / CONFIG_NAME), "--eval-only", "MODEL.WEIGHTS", started])
    assert evaluation_request(load_run_config(args.config_file, args.opts), args)[0].weights == started  # asked for


def test_a_run_whose_triton_kernels_could_not_run_says_so_in_its_log_and_records(tmp_path, monkeypatch):
    # GWDET_GW_PLAN=triton on a machine without a GPU: log.txt and results.json said triton while every call was
    # computed by the accelerator plan's operations (a RuntimeWarning on stderr only said so)
    from gwdet.checkpoint.resilient import RUN_SEGMENTS_KEY
    from gwdet.layers.plans import triton_plan

    monkeypatch.setattr(triton_plan, "_failures", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("GWDET_GW_PLAN", "triton")
    main(tiny_run_args(tmp_path))  # the layers' warning that the kernels cannot run goes to the run's log
    assert "cannot run on cpu" in (tmp_path / "log.txt").read_text()
    plans = json.loads((tmp_path / "results.json").read_text())["environment"]["execution_plans"]
    assert plans["forced"] == "triton"
    assert re.match(r"itn_whitening_kernel \(tile \d+\) on cpu: KernelUnavailable: Triton kernels run on CUDA",
                    plans["fallbacks"])
    segments = torch.load(tmp_path / "model_final.pth", weights_only=False)[RUN_SEGMENTS_KEY]
    assert segments[-1]["execution_plans"] == plans
    assert f"Triton kernels that cannot run, computed by 'accelerator' instead: {plans['fallbacks']}" in \
        (tmp_path / "log.txt").read_text()


def test_resuming_by_a_copied_runs_config_yaml_is_refused_where_it_names_the_original(finished_run, tmp_path):
    # the copy's config.yaml names the original folder: its model_final.pth and results were replaced
    branch = _copy_run(finished_run, tmp_path / "branch", "model_final.pth", "model_final.pth.sha256",
                       "last_checkpoint", "metrics.json", CONFIG_NAME, RECORD)
    before = _digest(finished_run)
    args = parse_args(["--config-file", str(branch / CONFIG_NAME), "--resume", "SOLVER.MAX_ITER", "3"])
    with pytest.raises(ValueError, match=rf"the record of the run in {branch}, whose OUTPUT_DIR is another folder, "
                                         rf"'{finished_run}'.*Add OUTPUT_DIR {branch} to continue the run beside"):
        main(args)
    assert _digest(finished_run) == before
    # --eval-only --resume evaluated the original's newer weights the same way
    args = parse_args(["--config-file", str(branch / CONFIG_NAME), "--eval-only", "--resume"])
    with pytest.raises(ValueError, match=rf"the record of the run in {branch}, whose OUTPUT_DIR is another folder"):
        main(args)
    # --eval-only of the copy's weights wrote its results into the original's folder (re-created it when moved)
    args = parse_args(["--config-file", str(branch / CONFIG_NAME), "--eval-only", "MODEL.WEIGHTS",
                       str(branch / "model_final.pth")])
    with pytest.raises(ValueError, match=rf"--eval-only with --config-file {branch / CONFIG_NAME}, the record of the "
                                         rf"run in {branch}, whose OUTPUT_DIR is another folder, '{finished_run}': "
                                         rf"that would write the evaluation there.*Add OUTPUT_DIR {branch} to write "
                                         "it beside the config file"):
        main(args)
    assert _digest(finished_run) == before
    # a new training by the copy's config.yaml with --overwrite deleted the original run (a plain one is refused so too)
    for flags, start in ((["--overwrite"], "--overwrite"), ([], "A training")):
        args = parse_args(["--config-file", str(branch / CONFIG_NAME), *flags, "SOLVER.MAX_ITER", "3"])
        with pytest.raises(ValueError, match=rf"^{start} with --config-file {branch / CONFIG_NAME}, the record of the run "
                                             rf"in {branch}, whose OUTPUT_DIR is another folder, '{finished_run}'"):
            main(args)
    assert _digest(finished_run) == before


def test_a_resume_with_another_test_time_or_sampling_setting_is_no_other_model(finished_run, caplog):
    # MODEL.ROI_HEADS.SCORE_THRESH_TEST 0.3 was refused as "trained with another model"
    from gwdet.engine.output_dir import is_test_setting, leaves_the_model
    from gwdet.engine.run import check_output_request

    args = tiny_run_args(finished_run, "--resume", "SOLVER.MAX_ITER", "4", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.3")
    with caplog.at_level(logging.WARNING):
        check_output_request(args, load_run_config(args.config_file, args.opts))
    assert "MODEL.ROI_HEADS.SCORE_THRESH_TEST: 0.05 -> 0.3" in caplog.text
    assert is_test_setting("model.roi_heads.box_predictor.test_score_thresh: 0.05 -> 0.3")
    assert not is_test_setting("MODEL.GW.NUM_GROUPS: 16 -> 8")
    # the ROIs sampled per image in training were refused as "trained with another model"
    caplog.clear()
    args = tiny_run_args(finished_run, "--resume", "SOLVER.MAX_ITER", "4", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32",
                         "MODEL.RPN.POST_NMS_TOPK_TRAIN", "500")
    with caplog.at_level(logging.WARNING):
        check_output_request(args, load_run_config(args.config_file, args.opts))
    assert "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE: 64 -> 32" in caplog.text
    assert "MODEL.RPN.POST_NMS_TOPK_TRAIN: " in caplog.text
    assert leaves_the_model("model.roi_heads.positive_fraction: 0.25 -> 0.5")
    assert not leaves_the_model("MODEL.ROI_HEADS.NUM_CLASSES: 4 -> 5")


def test_a_last_checkpoint_naming_its_file_by_absolute_path_is_evaluated_as_it_is_resumed(finished_run, tmp_path):
    # a training --resume followed it; --eval-only --resume refused it as "not a file in" its own folder
    from gwdet.engine.output_dir import tagged_checkpoint

    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "metrics.json",
                    CONFIG_NAME, RECORD)
    (run / "last_checkpoint").write_text(str(run / "model_final.pth"))
    assert tagged_checkpoint(str(run)) == str(run / "model_final.pth")
    (run / "last_checkpoint").write_text(str(finished_run / "model_final.pth"))  # another folder's: still refused
    with pytest.raises(FileNotFoundError, match="which is not a file in"):
        tagged_checkpoint(str(run))


def test_path_problems_of_the_output_folder_are_named_not_called_a_read_only_disk(finished_run, tmp_path):
    # a link to nowhere and a user's file named eval were both "cannot be written ... read-only disk"
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputDirNotWritableError, match=rf"OUTPUT_DIR '{tmp_path / 'link'}' is a link to "
                                                        rf"{tmp_path / 'nowhere'}, which does not exist: create"):
        main(tiny_run_args(tmp_path / "link"))
    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    (run / "eval").write_text("my notes")
    with pytest.raises(FileExistsError, match=r"holds a run and a file eval, where --eval-only writes its evaluations"):
        main(tiny_run_args(run, "--eval-only", "--resume"))
    assert (run / "eval").read_text() == "my notes"


def test_a_lock_file_that_cannot_be_written_is_one_error_naming_the_folder(tmp_path):
    # a full disk at the start: a raw OSError from the lock's write (here: a file size limit of 0 bytes)
    import resource
    import signal

    def file_size_limit_zero() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    def lock() -> None:
        with OutputDirLock(str(tmp_path)):
            pass

    said = error_in_child(file_size_limit_zero, lock)
    assert said.startswith(f"OUTPUT_DIR {str(tmp_path)!r}: writing the run's lock file .gwdet.lock failed (File too "
                           "large); nothing was changed. Free space there"), said


def test_an_evaluation_of_a_run_set_aside_by_a_stopped_overwrite_says_where_it_is(finished_run, tmp_path):
    # after a kill during --overwrite's set-aside: "does not exist" / "holds no checkpoint", so the user might delete it
    from gwdet.utils.run_file_names import SET_ASIDE

    run = tmp_path / "run"
    run.mkdir()
    _copy_run(finished_run, run / SET_ASIDE, "model_final.pth", "last_checkpoint", CONFIG_NAME, RECORD)
    for extra in (["--resume"], ["MODEL.WEIGHTS", str(run / "model_final.pth"), "OUTPUT_DIR", str(tmp_path / "e")]):
        args = parse_args(["--config-file", str(DEMO_CONFIG), "--eval-only", *TINY_OPTS, "OUTPUT_DIR", str(run), *extra])
        with pytest.raises(FileNotFoundError, match=rf"an --overwrite run in {run} was stopped before training and left "
                                                    rf"the earlier run's files set aside in {run / SET_ASIDE}/"):
            evaluation_request(load_run_config(args.config_file, args.opts), args)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_a_full_disk_while_evaluating_is_one_error_with_the_way_on(finished_run, tmp_path):
    # several raw OSError tracebacks from detectron2's COCOEvaluator, nothing about what to do
    # a folder holding only an inference/ counts as an earlier evaluation: this one goes to eval/<weights>/
    evaluation = tmp_path / "eval" / f"{finished_run.name}-model_final"
    predictions = evaluation / "inference" / "shapes_val" / "instances_predictions.pth"
    predictions.parent.mkdir(parents=True)
    os.symlink("/dev/full", predictions)  # the evaluator's first file meets a full disk
    with pytest.raises(GwdetOSError, match=rf"^The disk of {evaluation} is full \(No space left on device: .*\); files "
                                           r"written at that moment may be cut short\. Free space there\. Evaluate "
                                           r"again once it can be written\."):
        main(tiny_run_args(tmp_path, "--eval-only", "MODEL.WEIGHTS", str(finished_run / "model_final.pth")))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_a_full_disk_at_metrics_json_while_training_is_one_error_with_the_way_on(tmp_path):
    # detectron2's trainer ran its writers again after JSONWriter's failed write: chained tracebacks ending in its
    # printer's ZeroDivisionError, the full disk three exceptions down
    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/full", run / "metrics.json")
    with pytest.raises(GwdetOSError, match=rf"^The disk of {run} is full \(No space left on device: .*\); files written "
                                           r"at that moment may be cut short\. Free space there\. Its checkpoints are "
                                           r"kept: continue with --resume once it can be written"):
        main(tiny_run_args(run))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_a_run_whose_log_could_not_be_written_does_not_end_as_a_success(tmp_path):
    # Python's logging printed "--- Logging error ---" for each line and went on: exit status 0, and results.md sent
    # the reader to warnings in a log.txt that held nothing
    run = tmp_path / "run"
    main(tiny_run_args(run))
    (run / "log.txt").unlink()
    os.symlink("/dev/full", run / "log.txt")
    # a process of its own: detectron2 caches the log stream of each file name for the process
    completed = subprocess.run([sys.executable, str(REPO / "tools" / "train_net.py"), "--config-file", str(DEMO_CONFIG),
                                *TINY_OPTS, "SOLVER.MAX_ITER", "3", "OUTPUT_DIR", str(run), "--resume"],
                               cwd=REPO, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert completed.returncode == 2 and "--- Logging error ---" in completed.stderr
    assert (f"train_net.py: error: The disk of {run} is full (No space left on device: {run / 'log.txt'}): the run's log "
            f"could not be written, so {run / 'log.txt'} lacks its lines (the console had them). Free space there; the "
            "run's other files were written") in completed.stderr, completed.stderr[-3000:]
    assert torch.load(run / "model_final.pth", weights_only=False)["iteration"] == 2  # the rest of the run is there


def test_a_full_disk_met_by_torch_save_is_named_as_a_full_disk(tmp_path):
    # the export's --run-eval on a full disk: torch.save's archive writer raised a RuntimeError ("unexpected pos 64 vs
    # 0") while handling the OSError, a raw traceback without the tool's line
    from gwdet.engine.run import named_full_disk

    with pytest.raises(GwdetOSError, match=rf"^The disk of {tmp_path} is full \(No space left on device: a file there\); "
                                           r"files written at that moment may be cut short\. Free space there\. Go on\.$"):
        with named_full_disk(str(tmp_path), "Go on."), open("/dev/full", "wb") as file:  # as detectron2's evaluator
            torch.save({"predictions": torch.zeros(4096)}, file)
    with pytest.raises(RuntimeError, match="not a disk"):  # another RuntimeError is left as it is
        with named_full_disk(str(tmp_path), "Go on."):
            raise RuntimeError("not a disk")


def test_a_full_disk_met_by_an_atomic_write_is_named_as_a_full_disk(tmp_path, monkeypatch):
    # the export's checksum record on a full disk: a bare "[Errno 28] cannot write .../.model.ts.<pid>.<id>.partial.sha256"
    import errno

    from gwdet.engine.run import named_full_disk
    from gwdet.utils import atomic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)  # the disk's answer once the bytes are flushed
    with pytest.raises(GwdetOSError) as refused:
        with named_full_disk(str(tmp_path), "Any earlier model.ts is as it was."):
            atomic.write_text_with_checksum(str(tmp_path / "model.ts"), "an export")
    assert str(refused.value) == (f"The disk of {tmp_path} is full (No space left on device: {tmp_path / 'model.ts'}); "
                                  "files written at that moment may be cut short. Free space there. Any earlier "
                                  "model.ts is as it was.")
    assert sorted(os.listdir(tmp_path)) == []


class _KilledInTheWorker(torch.utils.data.Dataset):
    """A dataset whose loading process is killed by SIGKILL (as by the out-of-memory killer)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        os.kill(os.getpid(), 9)


def test_a_killed_data_loading_process_is_one_error_with_the_way_on():
    # torch's raw "DataLoader worker (pid N) is killed by signal: Killed." traceback, no advice
    from gwdet.engine.run import named_killed_loader

    with pytest.raises(GwdetError) as refused:
        with named_killed_loader("The run's checkpoints are kept: continue it with --resume."):
            next(iter(torch.utils.data.DataLoader(_KilledInTheWorker(), num_workers=1)))
    assert re.fullmatch(r"A data loading process of the run \(pid \d+\) was killed by signal Killed: the out-of-memory "
                        r"killer, most likely \(each loading process holds its own copy of the dataset's records\), or a "
                        r"kill from outside\. Use fewer of them \(DATALOADER\.NUM_WORKERS; a LazyConfig's "
                        r"dataloader\.train\.num_workers\) or free memory\. The run's checkpoints are kept: continue it "
                        r"with --resume\.", str(refused.value)), str(refused.value)


def test_a_run_folder_that_can_no_longer_be_written_is_one_error_with_the_way_on(tmp_path):
    # a run folder made read-only mid-run (chattr +i, a disk remounted read-only): raw tracebacks ending in
    # PermissionError on metrics.json, nothing about the checkpoints kept
    import errno

    from gwdet.engine.run import named_full_disk

    for number, words in ((errno.EPERM, "Operation not permitted"), (errno.EROFS, "Read-only file system")):
        with pytest.raises(GwdetOSError) as refused:
            with named_full_disk(str(tmp_path), "Its checkpoints are kept: continue with --resume."):
                raise OSError(number, words, str(tmp_path / "metrics.json"))
        assert str(refused.value) == (
            f"{tmp_path} can no longer be written ({words}: {tmp_path / 'metrics.json'}): its disk was made read-only, "
            "or its permissions changed, while the run worked; files written at that moment may be cut short. Make it "
            "writable again. Its checkpoints are kept: continue with --resume.")
    with pytest.raises(PermissionError):  # a file elsewhere (a dataset's) is not the run folder's to name
        with named_full_disk(str(tmp_path), "Go on."):
            raise PermissionError(errno.EACCES, "Permission denied", "/elsewhere/image.png")


def test_a_resume_refused_once_its_config_was_written_leaves_the_runs_config_yaml_as_it_was(finished_run, tmp_path):
    # a resume refused for its damaged checkpoint rewrote config.yaml (MAX_ITER, OUTPUT_DIR) and its record
    from gwdet.utils.run_file_names import CONFIG_KEPT

    run = _copy_run(finished_run, tmp_path / "run", "model_final.pth", "model_final.pth.sha256", "last_checkpoint",
                    "metrics.json", CONFIG_NAME, RECORD)
    damaged = bytearray((run / "model_final.pth").read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (run / "model_final.pth").write_bytes(bytes(damaged))
    config, record = (run / CONFIG_NAME).read_bytes(), (run / RECORD).read_bytes()
    with pytest.raises(GwdetError):
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "3"))
    assert (run / CONFIG_NAME).read_bytes() == config and (run / RECORD).read_bytes() == record
    assert not (run / CONFIG_KEPT).exists()
    main(tiny_run_args(tmp_path / "fresh"))  # a run that starts keeps no copy behind
    assert not (tmp_path / "fresh" / CONFIG_KEPT).exists() and (tmp_path / "fresh" / CONFIG_NAME).is_file()


# ---- MISLEADING 7, RAW 11: MODEL.WEIGHTS with ~ or as a file:// URL ---------------------------------------

def test_model_weights_with_a_tilde_are_found_in_the_home_folder(finished_run, tmp_path, monkeypatch, model):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copyfile(finished_run / "model_final.pth", tmp_path / "w.pth")
    ResilientCheckpointer(model, require_every_weight=True).load_weights("~/w.pth")


# MODEL.WEIGHTS '$HOME/w.pth' (quoted, or in a config file) was "does not exist" with advice on converting weights
def test_model_weights_holding_an_unexpanded_variable_name_it(tmp_path, monkeypatch, model):
    from gwdet.utils.cli_errors import unexpanded_variable_note

    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=rf"^MODEL.WEIGHTS file '\$HOME/w.pth' does not exist\. It holds "
                                                rf"'\$HOME', which nothing expanded .* let the shell expand it \(double "
                                                rf"quotes\), or write the path out \({tmp_path}/w.pth\)\. Convert"):
        ResilientCheckpointer(model).load_weights("$HOME/w.pth")
    # made absolute by a tool before the check: the variable is named, without a guess at the path meant
    assert unexpanded_variable_note("/work/$HOME/b.json").endswith("or write the path out.")
    assert unexpanded_variable_note("/work/b.json") == ""


def test_model_weights_as_a_file_url_are_read_as_the_local_file(finished_run, tmp_path, model):
    weights = finished_run / "model_final.pth"
    ResilientCheckpointer(model, require_every_weight=True).load_weights(f"file://{weights}")
    with pytest.raises(FileNotFoundError, match=rf"^MODEL.WEIGHTS file '{tmp_path}/gone.pth' does not exist\."):
        ResilientCheckpointer(model).load_weights(f"file://{tmp_path}/gone.pth")
    with pytest.raises(ValueError, match=r"^MODEL.WEIGHTS file://server/w.pth names a file on the host 'server', "
                                         r"which cannot be read from here\. Copy the file to this machine"):
        ResilientCheckpointer(model).load_weights("file://server/w.pth")
    assert evaluation_folder(str(finished_run), f"file://{weights}") == str(finished_run / "eval" / "model_final")


def test_resume_of_a_run_without_its_config_yaml_or_of_a_lazyconfig_run_by_a_yacs_config_is_named(
        finished_run, tmp_path):
    from gwdet.engine.lazy import check_resume_config as check_lazy_resume
    from gwdet.engine.output_dir import check_resume_config
    from gwdet.model_zoo import build_config
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    from conftest import DEMO_CONFIG, REPO, TINY_OPTS

    run = tmp_path / "run"
    run.mkdir()
    (run / "model_0000000.pth").write_bytes((finished_run / "model_0000000.pth").read_bytes())
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    lazy = load_lazy_config(str(REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    for check, config, setting in ((check_resume_config, cfg, "OUTPUT_DIR"),
                                   (check_lazy_resume, lazy, "train.output_dir")):
        with pytest.raises(FileNotFoundError, match=f"has checkpoints but no config.yaml, .* in another {setting}"):
            check(config, str(run))  # dm4: the model check was skipped
    (run / "config.yaml").write_text("model:\n  _target_: x\ntrain:\n  max_iter: 2\ndataloader: {}\n")
    with pytest.raises(ValueError, match="was trained from a LazyConfig .*Resume it with the LazyConfig"):
        check_resume_config(cfg, str(run))  # was: "damaged ... --overwrite", which deletes the run
    # a LazyConfig dump holding a python tag (as LazyConfig.save writes a ShapeSpec): was "Remove the tag"
    (run / "config.yaml").write_text("model:\n  _target_: x\n  shape: !!python/object:detectron2.layers.ShapeSpec "
                                     "{channels: 3}\ntrain:\n  max_iter: 2\n")
    with pytest.raises(ValueError, match="was trained from a LazyConfig .*Resume it with the LazyConfig"):
        check_resume_config(cfg, str(run))


def test_eval_only_resume_with_weights_named_on_the_command_line_is_refused(finished_run, tmp_path):
    from gwdet.engine.arguments import parse_args
    from gwdet.engine.run import evaluation_request, load_run_config

    from conftest import DEMO_CONFIG, TINY_OPTS

    other = tmp_path / "other.pth"
    other.write_bytes((finished_run / "model_final.pth").read_bytes())
    args = parse_args(["--config-file", str(DEMO_CONFIG), "--eval-only", "--resume", *TINY_OPTS,
                       "OUTPUT_DIR", str(finished_run), "MODEL.WEIGHTS", str(other)])
    with pytest.raises(ValueError, match=r"--eval-only --resume evaluates the checkpoint that .*last_checkpoint names "
                                         r".*not MODEL.WEIGHTS .*other.pth given on the command line: leave out"):
        evaluation_request(load_run_config(args.config_file, args.opts), args)


def test_a_training_resume_with_other_weights_named_on_the_command_line_is_refused(finished_run, tmp_path, caplog):
    # the resume continues from the run's checkpoint: weights named beside --resume were not loaded, without a word
    from gwdet.engine.run import check_output_request, load_run_config

    other = tmp_path / "other.pth"
    other.write_bytes((finished_run / "model_final.pth").read_bytes())
    longer = ["SOLVER.MAX_ITER", "4"]
    args = tiny_run_args(finished_run, "--resume", *longer, "MODEL.WEIGHTS", str(other))
    with pytest.raises(ValueError) as refused:
        check_output_request(args, load_run_config(args.config_file, args.opts))
    assert str(refused.value) == (
        f"--resume continues the run in {str(finished_run)!r} from its last checkpoint, so MODEL.WEIGHTS given on the "
        f"command line would not be loaded (MODEL.WEIGHTS: '' -> {str(other)!r}, against "
        f"{finished_run / 'config.yaml'}). Leave out --resume to train from those weights into another OUTPUT_DIR, or "
        "leave out MODEL.WEIGHTS to continue the run.")
    same = tiny_run_args(finished_run, "--resume", *longer, "MODEL.WEIGHTS", "")  # as the run's config.yaml has it
    with caplog.at_level(logging.WARNING):
        check_output_request(same, load_run_config(same.config_file, same.opts))
    assert "SOLVER.MAX_ITER: 2 -> 4" in caplog.text


def test_a_training_that_diverges_after_its_first_iteration_is_named_with_its_checkpoints_kept(tmp_path):
    # detectron2's FloatingPointError reached the user as a traceback (the first iteration's was named already)
    args = tiny_run_args(tmp_path, "SOLVER.MAX_ITER", "30", "SOLVER.WARMUP_ITERS", "0", "SOLVER.BASE_LR", "50.0",
                         "DATASETS.TEST", "()")
    with pytest.raises(GwdetError) as refused:
        main(args)
    message = str(refused.value)
    # where the run first meets the divergence depends on the CPU's kernels (AVX2, AVX-512; Intel, AMD): a loss
    # detectron2 finds non-finite, or weights the checkpoint of that iteration refuses to save
    assert message.startswith("Training diverged: ") and ("Training has diverged." in message or (
        "was not saved: the model's weights hold NaN or inf" in message))
    assert message.endswith(f"The checkpoints written before it are kept in {tmp_path}. Lower the learning rate or "
                            "lengthen the warm-up and train again; --resume would continue from the last checkpoint, "
                            "which may diverge the same way.")
    assert isinstance(refused.value, FloatingPointError), "still what detectron2's trainer raises, for callers catching it"
    assert isinstance(refused.value.__cause__, FloatingPointError)
    assert list(tmp_path.glob("model_00*.pth")), "the checkpoints of the iterations before it"
    # no checkpoint before the divergence (an --overwrite run deleted the earlier one's): none is promised
    args = tiny_run_args(tmp_path / "none", "SOLVER.MAX_ITER", "30", "SOLVER.WARMUP_ITERS", "0", "SOLVER.BASE_LR",
                         "50.0", "DATASETS.TEST", "()", "SOLVER.CHECKPOINT_PERIOD", "1000")
    with pytest.raises(GwdetError) as refused:
        main(args)
    assert str(refused.value).endswith(f"No checkpoint was written before it: {tmp_path / 'none'} holds none to "
                                       "continue from. Lower the learning rate or lengthen the warm-up and train again.")


def test_a_users_own_config_yaml_in_the_output_folder_is_not_replaced(tmp_path):
    # before: detectron2's default_setup wrote the run's config over it, with exit 0
    (tmp_path / "config.yaml").write_text("experiment: mine\n")
    for extra in ((), ("--eval-only", "MODEL.WEIGHTS", str(tmp_path / "weights.pth"))):
        with pytest.raises(FileExistsError) as refused:
            main(tiny_run_args(tmp_path, *extra))
        assert str(refused.value) == (
            f"OUTPUT_DIR {str(tmp_path)!r} holds a config.yaml that no run of gwdet wrote (no config.yaml.sha256 record "
            "beside it), where the run writes its full config: the file would be replaced; nothing was changed. Move it "
            f"(e.g. mv {tmp_path / 'config.yaml'} {tmp_path / 'my_config.yaml'}), or give the run another OUTPUT_DIR.")
        assert sorted(os.listdir(tmp_path)) == [".gwdet.lock", "config.yaml"]
        assert (tmp_path / "config.yaml").read_text() == "experiment: mine\n"


def test_a_config_rescaled_to_the_processes_is_checked_and_recorded_as_it_trains(tmp_path):
    """SOLVER.REFERENCE_WORLD_SIZE 2 on one process trains batch 1 for twice the iterations: config.yaml
    recorded batch 2, so --resume without the reference size continued at batch 2 with only a log line,
    and the same command was refused as having trained more iterations than SOLVER.MAX_ITER."""
    with logged_warnings("gwdet.engine.trainer") as logged:  # no line said the batch was halved
        run = load_run_config(str(DEMO_CONFIG), [*TINY_OPTS, "SOLVER.REFERENCE_WORLD_SIZE", "2"]).for_processes(1)
    assert (run.cfg.SOLVER.IMS_PER_BATCH, run.cfg.SOLVER.MAX_ITER, run.cfg.SOLVER.REFERENCE_WORLD_SIZE) == (1, 4, 1)
    assert logged and logged[0].startswith(
        "SOLVER.REFERENCE_WORLD_SIZE is 2, and the run has 1 process(es): detectron2 rescales the config to them "
        "(SOLVER.IMS_PER_BATCH 2 -> 1; SOLVER.BASE_LR ")
    unscaled = load_run_config(str(DEMO_CONFIG), list(TINY_OPTS))
    assert unscaled.for_processes(1) is unscaled  # nothing to rescale
    main(tiny_run_args(tmp_path, "SOLVER.REFERENCE_WORLD_SIZE", "2"))
    assert "IMS_PER_BATCH: 1\n" in (tmp_path / "config.yaml").read_text()
    main(tiny_run_args(tmp_path, "SOLVER.REFERENCE_WORLD_SIZE", "2", "SOLVER.MAX_ITER", "3", "--resume"))  # 6 here
    with pytest.raises(GwdetError, match=r"--resume: the run in .* trained with SOLVER.IMS_PER_BATCH 1, this config "
                                         r"gives 2"):
        main(tiny_run_args(tmp_path, "SOLVER.MAX_ITER", "10", "--resume"))


def test_the_log_of_a_run_refused_as_its_weights_loaded_does_not_block_the_next_run(tmp_path):
    # a run refused while its weights loaded left log.txt only, and the corrected command was refused as
    # "holds a log.txt that no run of gwdet wrote", with --overwrite too
    from gwdet.engine.output_dir import check_config_not_users, is_a_runs_log

    with pytest.raises(GwdetError):
        main(tiny_run_args(tmp_path, "MODEL.WEIGHTS", str(tmp_path.parent / "no_such_weights.pth")))
    assert (tmp_path / "log.txt").is_file() and is_a_runs_log(str(tmp_path / "log.txt"))
    check_config_not_users(str(tmp_path))
    (tmp_path / "log.txt").write_text("[11/30 00:15:00] detectron2 INFO: my own notes\n")
    assert not is_a_runs_log(str(tmp_path / "log.txt"))  # the format, but not a run's first line


def test_a_path_with_dotdot_after_a_link_is_refused_where_it_names_two_places(tmp_path, monkeypatch):
    # MODEL.WEIGHTS lnk/../R.pkl loaded ./R.pkl while the system (ls, the converter) reads dq/R.pkl;
    # OUTPUT_DIR lnk/../rr trained into two folders; --register-coco registered another file
    from gwdet.checkpoint.resilient import absolute_weights_path
    from gwdet.data.coco_registration import CocoDataset, DatasetError
    from gwdet.engine.output_dir import OutputDirNameError, check_output_dir_name
    from gwdet.utils.cli_errors import link_dotdot_problem

    (tmp_path / "dq" / "sub").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "dq" / "sub")
    for folder in (tmp_path, tmp_path / "dq"):
        (folder / "R.pkl").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert link_dotdot_problem("MODEL.WEIGHTS", "lnk/../R.pkl") == (
        f"MODEL.WEIGHTS 'lnk/../R.pkl' has '..' after a link, so it names two places: the system reads it as "
        f"{tmp_path / 'dq' / 'R.pkl'}, and {tmp_path / 'R.pkl'} once the '..' is taken off the text, as gwdet (and "
        f"most tools) make paths absolute. Give the path without '..' (e.g. {tmp_path / 'dq' / 'R.pkl'}); nothing was "
        "read or written.")
    with pytest.raises(ValueError, match="has '..' after a link"):
        absolute_weights_path("lnk/../R.pkl")
    with pytest.raises(OutputDirNameError, match="OUTPUT_DIR 'lnk/../rr' has '..' after a link"):
        check_output_dir_name("lnk/../rr")
    with pytest.raises(DatasetError, match="has '..' after a link"):
        CocoDataset.parse("x_val=lnk/../v.json:dq")
    assert link_dotdot_problem("OUTPUT_DIR", "dq/sub/../R.pkl") is None  # '..' after a folder: one place
    assert absolute_weights_path("dq/../R.pkl") == str(tmp_path / "R.pkl")


def test_a_config_file_edited_between_a_jobs_submission_and_its_start_is_refused(tmp_path):
    # a SLURM job read the config file again when it started: T 5 -> 2 trained without a word
    from gwdet.engine.run import check_config_unchanged, config_text

    config = tmp_path / "mine.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    T: 5\n', encoding="utf-8")
    submitted = config_text(load_run_config(str(config), list(TINY_OPTS)))
    check_config_unchanged(load_run_config(str(config), list(TINY_OPTS)), submitted, "when the job was submitted")
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  GW:\n    T: 2\n', encoding="utf-8")
    with pytest.raises(GwdetError, match=r"^The config changed since it was checked when the job was submitted \(its "
                                         r"file or a _BASE_ of it was edited in between\): MODEL.GW.T: 5 -> 2 \(the "
                                         r"checked value first\)\. Nothing was trained"):
        check_config_unchanged(load_run_config(str(config), list(TINY_OPTS)), submitted, "when the job was submitted")


def test_an_evaluation_with_overwrite_is_refused_as_a_flag_it_does_not_read(tmp_path):
    # --eval-only --overwrite wrote a new eval/model_final-3 and ignored --overwrite without a word
    from gwdet.engine.run import check_output_request

    args = tiny_run_args(tmp_path, "--eval-only", "--overwrite", "MODEL.WEIGHTS", str(tmp_path / "w.pth"))
    with pytest.raises(GwdetError, match=r"^--overwrite deletes a run's files before a training starts, and "
                                         r"--eval-only deletes nothing"):
        check_output_request(args, load_run_config(args.config_file, args.opts))


def test_a_run_in_a_process_left_with_float64_or_without_gradients_names_the_process_state():
    # the run failed at the first iteration with nms' "dets should have the same type as scores" (float64) or "element
    # 0 of tensors does not require grad" (no gradients), blamed on the config's values
    from gwdet.engine.training import check_torch_state

    try:
        torch.set_default_dtype(torch.float64)
        with pytest.raises(ValueError, match=r"^torch's default dtype is torch.float64 in this process .* Call "
                                             r"torch.set_default_dtype\(torch.float32\) before the run.$"):
            check_torch_state(training=False)
        # gwdet.build_model from one's own code too (it built a float64 model that failed in torchvision's nms)
        from gwdet import build_model
        from gwdet.model_zoo import build_config

        with pytest.raises(ValueError, match=r"^torch's default dtype is torch.float64 in this process .* Call "
                                             r"torch.set_default_dtype\(torch.float32\) before the build.$"):
            build_model(build_config(str(DEMO_CONFIG), ["MODEL.DEVICE", "cpu"]))
    finally:
        torch.set_default_dtype(torch.float32)
    try:
        torch.set_default_device("meta")
        with pytest.raises(ValueError, match=r"^torch's default device is meta in this process"):
            check_torch_state(training=False)
    finally:
        torch.set_default_device(None)
    if not torch.cuda.is_available():  # a device this machine lacks: torch's "Found no NVIDIA driver" from the check
        try:
            torch.set_default_device("cuda")
            with pytest.raises(ValueError, match=r"^torch's default device cannot be used in this process \(.*\): "
                                                 r"torch.set_default_device was called with a device this machine "
                                                 r"lacks before the run"):
                check_torch_state(training=False)
        finally:
            torch.set_default_device(None)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^Gradients are switched off in this process"):
            check_torch_state(training=True)
        check_torch_state(training=False)  # an evaluation needs none
    with torch.inference_mode(), torch.set_grad_enabled(True):  # gradients "on", but no tensor records them
        with pytest.raises(ValueError, match=r"^The run is inside torch.inference_mode\(\) in this process"):
            check_torch_state(training=True)
    check_torch_state(training=True)


def test_an_evaluations_config_names_the_weights_file_itself(finished_run, tmp_path, monkeypatch):
    # an evaluation's config.yaml kept MODEL.WEIGHTS relative, as typed: read again from another folder, it evaluated
    # whatever file sat at that path there (a training's config.yaml records the file itself)
    from gwdet.model_zoo import build_config

    shutil.copy(finished_run / "model_final.pth", tmp_path / "w.pth")
    monkeypatch.chdir(tmp_path)
    main(tiny_run_args("eval", "--eval-only", "MODEL.WEIGHTS", "w.pth"))
    assert build_config(str(tmp_path / "eval" / "config.yaml")).MODEL.WEIGHTS == str(tmp_path / "w.pth")


def test_a_resume_checked_with_its_weights_named_is_not_checked_again_without(finished_run):
    # the tool's --resume naming MODEL.WEIGHTS was checked again by the trainer it built (a weaker check), and the
    # moved-schedule warning could print twice
    from gwdet.engine.trainer import YacsRun

    checked = []

    class Counted(YacsRun):
        def check_resume(self, weights_named: bool) -> None:
            checked.append(weights_named)

    cfg = build_config(str(finished_run / CONFIG_NAME), ["OUTPUT_DIR", str(finished_run)])
    for weights_named in (True, False, True):
        Counted(cfg).check_resume_request(weights_named)
    assert checked == [True]
    weaker_first = build_config(str(finished_run / CONFIG_NAME), ["OUTPUT_DIR", str(finished_run)])
    for weights_named in (False, True):
        Counted(weaker_first).check_resume_request(weights_named)
    assert checked == [True, False, True]  # a pass of the weaker check does not count for the stricter


def test_more_detections_per_image_than_coco_ap_counts_are_said(tmp_path):
    # TEST.DETECTIONS_PER_IMAGE 300: the same AP as with 100 (COCO's maxDets), while results.md said 300
    from omegaconf import OmegaConf

    from gwdet.engine.run import warn_of_uncounted_detections

    from gwdet.data import prepare_datasets

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "TEST.DETECTIONS_PER_IMAGE", "300", "OUTPUT_DIR", str(tmp_path)])
    prepare_datasets(cfg, trains=False)
    with logged_warnings("gwdet.engine.run") as warned:
        Trainer.build_evaluator(cfg, "shapes_val")
        warn_of_uncounted_detections(300, "test_topk_per_image", OmegaConf.create([1, 10, 300]))  # counted: no word
        warn_of_uncounted_detections(100, "TEST.DETECTIONS_PER_IMAGE")
    assert warned == ["TEST.DETECTIONS_PER_IMAGE is 300, but COCO's AP counts the 100 highest-scoring detections of each "
                      "image (maxDets 100, as detectron2's COCOEvaluator computes it): the results are those of the best "
                      "100, while the detections file holds up to 300."]


def test_the_checks_a_run_was_told_to_let_pass_are_recorded_in_its_environment(monkeypatch):
    # with GWDET_ALLOW_NORM_MISMATCH=1 results.json recorded neither the opt-in nor the mismatch (only log.txt said it)
    from gwdet.engine.run_environment import run_environment

    monkeypatch.delenv("GWDET_ALLOW_UNSAFE_PICKLE", raising=False)
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "0")
    assert "opt_ins" not in run_environment([])
    monkeypatch.setenv("GWDET_ALLOW_NORM_MISMATCH", "1")
    assert run_environment([])["opt_ins"] == {"GWDET_ALLOW_NORM_MISMATCH": "1"}


def test_a_new_output_path_that_begins_or_ends_with_whitespace_is_refused(tmp_path):
    # OUTPUT_DIR "out/sp " (a YAML value's, a pasted path's) trained into 'sp ', and a later --resume OUTPUT_DIR out/sp
    # started from iteration 0
    from gwdet.engine.output_dir import OutputDirNameError, check_output_dir_name
    from gwdet.engine.training import check_output_folder

    new = str(tmp_path / "sp ")
    message = f"^OUTPUT_DIR '{re.escape(new)}' begins or ends with whitespace, which would become part of the new " \
              f"folder's name \\(not '{re.escape(new.strip())}'\\): give the path without it."
    with pytest.raises(OutputDirNameError, match=message):
        check_output_dir_name(new)
    with pytest.raises(GwdetError, match=message):
        check_output_folder(new, "OUTPUT_DIR")
    assert not os.path.exists(new)
    os.mkdir(new)  # a folder of that name that exists is the user's choice
    check_output_dir_name(new)
    check_output_folder(new, "OUTPUT_DIR")


# cfg.train.output_dir = pathlib.Path("r/z4") was refused as "give the folder the run writes into"
def test_an_output_folder_given_as_a_path_object_says_to_give_a_string(tmp_path):
    from pathlib import Path
    from gwdet.engine.training import check_output_folder

    with pytest.raises(TypeError, match=r"^train.output_dir is PosixPath\('r/z4'\), a path object: give it as a "
                                        r"string, train.output_dir = 'r/z4' \(str\(path\) in Python\)\.$"):
        check_output_folder(Path("r/z4"), "train.output_dir")


def test_a_runs_config_yaml_writes_each_value_in_full(finished_run):
    # detectron2's dump wrote MODEL.RETINANET.BBOX_REG_WEIGHTS as the anchor &id002 and MODEL.RPN.BBOX_REG_WEIGHTS
    # as its alias: an edit of RetinaNet's weights in a copy of the file trained the RPN with them too
    from gwdet.model_zoo import build_config

    text = (finished_run / "config.yaml").read_text()
    assert "&id" not in text and "*id" not in text
    edited = finished_run.parent / "edited.yaml"
    lines = text.splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("  RETINANET:"))
    weights = next(index for index in range(at, len(lines)) if "BBOX_REG_WEIGHTS:" in lines[index])
    lines[weights + 1] = lines[weights + 1].replace("1.0", "2.0")
    edited.write_text("\n".join(lines) + "\n")
    cfg = build_config(str(edited))
    assert cfg.MODEL.RETINANET.BBOX_REG_WEIGHTS[0] == 2.0 and list(cfg.MODEL.RPN.BBOX_REG_WEIGHTS) == [1.0] * 4


def test_a_run_folder_replaced_while_the_run_trains_stops_the_training(tmp_path):
    # `mv run run.bak; mkdir run` while it trained: it went on without a word, its later checkpoints
    # and results in the new folder, its config, log and metrics in the moved one
    from detectron2.engine import HookBase, TrainerBase

    from gwdet.engine.training import RunFolderKept
    from gwdet.errors import GwdetRuntimeError

    run, moved = tmp_path / "run", tmp_path / "run.bak"
    run.mkdir()

    class Steps(TrainerBase):
        def run_step(self) -> None:
            pass

    class ReplaceAfter(HookBase):
        def after_step(self) -> None:
            if self.trainer.iter == 1:
                run.rename(moved)
                run.mkdir()

    trainer = Steps()
    trainer.register_hooks([RunFolderKept(str(run)), ReplaceAfter()])
    with pytest.raises(GwdetRuntimeError) as stopped:
        trainer.train(0, 5)
    assert str(stopped.value).startswith(
        f"OUTPUT_DIR '{run}' was replaced while the run trained: the run's folder is now {moved}, and another folder "
        "took its path")
    assert "stopped before iteration 2. Move the run's folder back" in str(stopped.value)
    kept = Steps()  # a folder left in place trains to the end
    kept.register_hooks([RunFolderKept(str(moved))])
    kept.train(0, 3)


def test_a_full_disk_before_the_first_checkpoint_promises_no_checkpoint(tmp_path):
    # a stop signal's checkpoint, the run's first, failed on a full disk: "Its checkpoints are kept: continue with
    # --resume", which the folder's no checkpoint then refused
    import errno

    from gwdet.engine.run import named_full_disk, training_way_on

    def full_disk() -> str:
        with pytest.raises(GwdetOSError) as refused:
            with named_full_disk(str(tmp_path), lambda: training_way_on(str(tmp_path))):
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "model_0000003.pth"))
        return str(refused.value)

    assert full_disk().endswith(
        "The run had no checkpoint yet (the one being saved, a stop signal's too, is what could not be written), so "
        "nothing of its training is kept: once it can be written, start it again with --overwrite.")
    torch.save({"model": {}, "iteration": 1}, tmp_path / "model_0000001.pth")
    assert full_disk().endswith("Its checkpoints are kept: continue with --resume once it can be written (a finished "
                                "training is evaluated again).")


# a data loading process killed before the run's first checkpoint: the refusal said "The run's checkpoints are kept:
# continue it with --resume", and that --resume was refused (no checkpoint)
def test_a_killed_loader_or_lost_file_before_the_first_checkpoint_advises_a_new_start(tmp_path):
    from gwdet.engine.run import named_killed_loader, named_lost_file, stopped_training_way_on
    from gwdet.errors import GwdetFileNotFoundError, GwdetRuntimeError

    way_on = lambda: stopped_training_way_on(str(tmp_path))  # noqa: E731
    fresh = (r"The run had saved no checkpoint yet, so nothing of its training is kept: start it again with "
             r"--overwrite \(which deletes the files it left\).$")
    with pytest.raises(GwdetRuntimeError, match=r"^A data loading process of the run \(pid 123\) was killed by "
                                                 r"signal Killed: .* " + fresh):
        with named_killed_loader(way_on):
            raise RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed.")
    with pytest.raises(GwdetFileNotFoundError, match=r"^A file the run reads or writes is gone .* " + fresh):
        with named_lost_file(way_on):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "images/a.png")
    (tmp_path / "model_0000004.pth").write_bytes(b"")
    with pytest.raises(GwdetRuntimeError, match=r"The run's checkpoints are kept: continue it with --resume\.$"):
        with named_killed_loader(way_on):
            raise RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed.")


# Trainer.test(cfg, model, evaluators=[]) with one test set ended in detectron2's bare "AssertionError: 1 != 0"
def test_trainer_test_with_another_number_of_evaluators_than_test_sets_names_both():
    from detectron2.evaluation import DatasetEvaluator

    cfg = build_config(str(DEMO_CONFIG), ["DATASETS.TEST", '("shapes_val", "shapes_train")'])
    model = torch.nn.Linear(1, 1)  # refused before the model is used
    with pytest.raises(GwdetError, match=r"^Trainer.test: evaluators holds 0 evaluator\(s\), but DATASETS.TEST names 2 "
                                         r"test set\(s\) \('shapes_val', 'shapes_train'\): detectron2 evaluates the i-th"):
        Trainer.test(cfg, model, evaluators=[])
    with pytest.raises(GwdetError, match=r"evaluators holds 1 evaluator\(s\), but DATASETS.TEST names 2"):
        Trainer.test(cfg, model, evaluators=DatasetEvaluator())
