"""Contracts of the run folder and of checkpoint loading that no other test pinned: which files a
run owns and --overwrite deletes, the refusals of --resume and --eval-only --resume (their exact
words: they name the file, the key and the fix), trimming metrics.json on resume, the OUTPUT_DIR
lock, the checksums of weight files and the refusal of unsafe unpickling. Each test here kills
mutations of the code that the rest of the suite let pass (docs/reliability.md, "Mutation testing").
"""
import argparse
import datetime
import fcntl
import hashlib
import logging
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from detectron2.config import get_cfg

from gwdet.checkpoint.integrity import DamagedTensorsError, verify_checksums, with_checksums
from gwdet.checkpoint.safe_load import UnsafeCheckpointError, _globals_refused, load_torch_file
from gwdet.utils.atomic import DamagedFileError, process_is_gone
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, LAZY_CONFIG, REPO, TINY_OPTS
from gwdet.config import ABSENT
from gwdet.engine.output_dir import (OutputDirLock, OutputDirNotWritableError, check_fresh_start, check_resume_config,
                                     checkpoints_in, config_differences, damaged_config, differing_values,
                                     evaluation_folder, holds_run, record_config_checksum, run_files, tagged_checkpoint,
                                     trim_metrics)
from gwdet.utils.run_file_names import CONFIG_NAME, LOCK_NAME

LOGGER = "gwdet.engine.output_dir"


def make(folder, *names):
    """Empty files (``name``) and folders (``name/``) in ``folder``."""
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith("/"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "wb").close()


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# ---- which files are a run's, and --overwrite ------------------------------------------------------

# Not a run's: the user's own files, whatever their names look like.
USER_FILES = ("notes.txt", "converted.pth", "model_notes.txt", "my.events.out.tfevents", "model_best_by_me.pth",
              "model_best_by_me.pth.sha256", "model_12.pth", "model_final.pth.bak")


def test_a_runs_files_are_checkpoints_records_event_files_and_its_folders_and_nothing_else(tmp_path):
    make(tmp_path, *USER_FILES)
    assert run_files(str(tmp_path)) == [] and not holds_run(str(tmp_path))
    check_fresh_start(str(tmp_path), overwrite=False)  # the user's files are no run: nothing to refuse

    make(tmp_path, "events.out.tfevents.1700000000.host")  # TensorBoard's events alone: a run trained here
    assert run_files(str(tmp_path)) == ["events.out.tfevents.1700000000.host"] and holds_run(str(tmp_path))
    # config.yaml.pkl: detectron2's pickle of a LazyConfig holding a function, kept after --overwrite before
    make(tmp_path, "model_0000009.pth", "inference/", CONFIG_NAME, CONFIG_NAME + ".sha256", CONFIG_NAME + ".pkl",
         "results.json.sha256")
    assert run_files(str(tmp_path)) == [CONFIG_NAME, CONFIG_NAME + ".pkl", CONFIG_NAME + ".sha256",
                                        "events.out.tfevents.1700000000.host", "inference", "model_0000009.pth",
                                        "results.json.sha256"]


def test_a_config_yaml_and_its_checksum_alone_claim_nothing(tmp_path):
    make(tmp_path, CONFIG_NAME, CONFIG_NAME + ".sha256", CONFIG_NAME + ".pkl")
    assert not holds_run(str(tmp_path))
    check_fresh_start(str(tmp_path), overwrite=False)
    assert sorted(os.listdir(tmp_path)) == [CONFIG_NAME, CONFIG_NAME + ".pkl", CONFIG_NAME + ".sha256"]  # the next run writes its own


SEVEN = ("events.out.tfevents.1700000000.host", "inference/", "last_checkpoint", "metrics.json",
         "model_0000009.pth", "model_final.pth", "vis/")


def test_a_fresh_start_over_a_run_is_refused_naming_six_of_its_files_then_how_many_more(tmp_path):
    make(tmp_path, *SEVEN, *USER_FILES)
    with pytest.raises(FileExistsError) as refused:
        check_fresh_start(str(tmp_path), overwrite=False)
    assert str(refused.value) == (
        f"OUTPUT_DIR {str(tmp_path)!r} already holds a run (events.out.tfevents.1700000000.host, inference, "
        "last_checkpoint, metrics.json, model_0000009.pth, model_final.pth, ... (1 more)); nothing was changed. Continue it "
        "with --resume, write to another OUTPUT_DIR, or pass --overwrite to delete that run and start again.")
    assert len(os.listdir(tmp_path)) == len(SEVEN) + len(USER_FILES)


def test_a_fresh_start_over_an_evaluations_results_does_not_advise_resume(tmp_path):
    make(tmp_path, "results.json", "results.json.sha256", "results.md", "inference/")  # --eval-only, no run there
    with pytest.raises(FileExistsError) as refused:
        check_fresh_start(str(tmp_path), overwrite=False)
    assert "holds results (inference, results.json, results.json.sha256, results.md) but no checkpoint to " \
           "continue (an evaluation's, or a training's whose checkpoints were removed)" \
        in str(refused.value) and "--resume" not in str(refused.value)


def test_a_fresh_start_over_a_run_of_six_files_names_them_all_without_dots(tmp_path):
    make(tmp_path, *SEVEN[:6])
    with pytest.raises(FileExistsError) as refused:
        check_fresh_start(str(tmp_path), overwrite=False)
    assert "(events.out.tfevents.1700000000.host, inference, last_checkpoint, metrics.json, model_0000009.pth, " \
           "model_final.pth); nothing was changed." in str(refused.value)


def test_overwrite_deletes_the_runs_files_and_folders_keeps_the_users_and_says_what_it_deleted(tmp_path, caplog):
    make(tmp_path, *SEVEN, *USER_FILES, "inference/coco_instances_results.json", "eval/model_0000009/results.md",
         "results.json", "results.json.sha256", CONFIG_NAME, CONFIG_NAME + ".sha256")
    deleted = run_files(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == sorted(USER_FILES)
    assert warnings_of(caplog) == [f"--overwrite: deleted the earlier run in {tmp_path}: {', '.join(deleted)}; kept "
                                   f"what no run of gwdet wrote there: {', '.join(sorted(USER_FILES))}"]
    assert deleted[:3] == [CONFIG_NAME, CONFIG_NAME + ".sha256", "eval"]


def test_an_overwrite_while_an_evaluation_runs_in_the_folder_is_refused(tmp_path):
    # it deleted eval/ under the running evaluation, which then wrote the deleted run's results there
    make(tmp_path, *SEVEN, "results.json", "results.json.sha256", CONFIG_NAME, CONFIG_NAME + ".sha256")
    evaluation = tmp_path / "eval" / "model_final"
    with OutputDirLock(str(evaluation)):
        before = sorted(os.listdir(tmp_path))
        with pytest.raises(RuntimeError) as refused:
            check_fresh_start(str(tmp_path), overwrite=True)
        assert str(refused.value).startswith(f"OUTPUT_DIR {str(evaluation)!r} is in use by another run (pid "
                                             f"{os.getpid()})")
        assert sorted(os.listdir(tmp_path)) == before
    check_fresh_start(str(tmp_path), overwrite=True)  # once it has ended
    assert not (tmp_path / "eval").exists()


def test_an_overwrite_sets_the_earlier_run_aside_until_the_new_one_starts_or_puts_it_back(tmp_path, caplog):
    """Deleted once the new run has started; put back when it stops before (an error in the block,
    or a kill, which the next run that takes the folder's lock undoes)."""
    from gwdet.engine.output_dir import earlier_run_until_started
    from gwdet.utils.run_file_names import SET_ASIDE

    make(tmp_path, *SEVEN, CONFIG_NAME, CONFIG_NAME + ".sha256", "notes.txt")
    (tmp_path / CONFIG_NAME).write_text("the earlier run's")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError), earlier_run_until_started(str(tmp_path)):
        check_fresh_start(str(tmp_path), overwrite=True, aside=True)
        assert sorted(os.listdir(tmp_path)) == [SET_ASIDE, "notes.txt"]
        (tmp_path / CONFIG_NAME).write_text("the new run's")  # replaced by the earlier run's when it stops
        raise RuntimeError("the new run's weights are missing")
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / CONFIG_NAME).read_text() == "the earlier run's"
    check_fresh_start(str(tmp_path), overwrite=True, aside=True)  # then killed: the next run puts it back
    with caplog.at_level(logging.WARNING, logger=LOGGER), OutputDirLock(str(tmp_path)):
        assert sorted(os.listdir(tmp_path)) == sorted([*before, LOCK_NAME])
    assert "put back the earlier run's files, which a run with --overwrite had set aside" in warnings_of(caplog)[-1]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), earlier_run_until_started(str(tmp_path)):
        check_fresh_start(str(tmp_path), overwrite=True, aside=True)
    assert sorted(os.listdir(tmp_path)) == sorted([LOCK_NAME, "notes.txt"])
    earlier = ", ".join(sorted(set(before) - {"notes.txt"}))
    assert warnings_of(caplog) == [
        f"--overwrite: set aside the earlier run (deleted once the new run has started, put back if it stops before) "
        f"in {tmp_path}: {earlier}; kept what no run of gwdet wrote there: notes.txt",
        f"--overwrite: deleted the earlier run in {tmp_path}: {earlier}"]


def test_a_log_is_the_runs_beside_a_run_and_the_users_alone(tmp_path):
    """A user's log.txt got the run's log appended; an overwritten run's log.txt was kept as if no run
    had written it."""
    from gwdet.engine.output_dir import check_config_not_users

    (tmp_path / "log.txt").write_text("my notes\n")
    with pytest.raises(FileExistsError, match=r"holds a log.txt that no run of gwdet wrote \(no recorded config.yaml, "
                                              r"checkpoint or results.json beside it\), to which the run would append"):
        check_config_not_users(str(tmp_path))
    make(tmp_path, CONFIG_NAME, CONFIG_NAME + ".sha256", "model_final.pth", "log.txt.rank1")
    check_config_not_users(str(tmp_path))  # the log of the run there (its second process's too)
    check_fresh_start(str(tmp_path), overwrite=True)
    assert os.listdir(tmp_path) == []


# (an evaluation of two processes writes eval/<checkpoint>/log.txt.rank1, refused as the user's before)
RUNS_OUTPUTS = ("inference/shapes_val/coco_instances_results.json", "inference/shapes_val/instances_predictions.pth",
                "vis/000.png", "eval/model_final/results.json", "eval/model_final/log.txt", "eval/model_final/.gwdet.lock",
                "eval/model_final/log.txt.rank1",
                "eval/model_final-2/inference/shapes_val/coco_instances_results.json", "eval/model_final-2/vis/1.png")


def test_overwrite_deletes_only_what_runs_write_inside_their_folders_or_refuses_naming_the_rest(tmp_path):
    mine = ("inference/mine/keep.txt", "eval/important.txt", "eval/model_final/notes.md", "vis/sketch.svg")
    make(tmp_path, *SEVEN, *RUNS_OUTPUTS, *mine)
    before = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError) as refused:
        check_fresh_start(str(tmp_path), overwrite=True)
    assert str(refused.value) == (
        f"--overwrite would delete eval/important.txt, eval/model_final/notes.md, inference/mine/keep.txt, "
        f"vis/sketch.svg in the earlier run's folders of OUTPUT_DIR {str(tmp_path)!r}, which no run of gwdet wrote; "
        "nothing was changed. Move them out of OUTPUT_DIR, or train into another OUTPUT_DIR.")
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == before
    for name in mine:
        os.unlink(tmp_path / name)
    check_fresh_start(str(tmp_path), overwrite=True)
    assert os.listdir(tmp_path) == []


def test_overwrite_deletes_checkpoints_by_the_checkpointers_names_with_their_records_and_the_tagged_one(tmp_path, caplog):
    make(tmp_path, "model_0000009.pth", "model_0000009.pth.sha256", "model_12345678.pth", "model_final.pth.sha256",
         "model_best.pth", "model_best_by_me.pth", LOCK_NAME, *[f"mine_{i:02d}.txt" for i in range(11)])
    (tmp_path / "last_checkpoint").write_text("model_best.pth")  # a checkpointer of one's own names its file here
    assert run_files(str(tmp_path)) == ["last_checkpoint", "model_0000009.pth", "model_0000009.pth.sha256",
                                        "model_12345678.pth", "model_best.pth", "model_final.pth.sha256"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == sorted([LOCK_NAME, "model_best_by_me.pth",
                                                   *[f"mine_{i:02d}.txt" for i in range(11)]])
    assert warnings_of(caplog)[0].endswith(  # the lock is the running process's own, not listed
        "; kept what no run of gwdet wrote there: mine_00.txt, mine_01.txt, mine_02.txt, mine_03.txt, mine_04.txt, "
        "mine_05.txt, mine_06.txt, mine_07.txt, mine_08.txt, mine_09.txt, ... (2 more)")


@pytest.mark.parametrize("proof", [None, CONFIG_NAME + ".sha256", "model_0000009.pth", "results.json.sha256"])
def test_overwrite_deletes_results_and_metrics_only_beside_what_only_a_run_writes(tmp_path, proof):
    mine = ("metrics.json", "results.json", "results.md")  # a user's own files of those names
    for name in mine:
        (tmp_path / name).write_text("mine")
    if proof is None:
        for overwrite in (False, True):  # the refusal without --overwrite does not advise it
            with pytest.raises(FileExistsError) as refused:
                check_fresh_start(str(tmp_path), overwrite=overwrite)
            assert str(refused.value) == (
                f"OUTPUT_DIR {str(tmp_path)!r} holds metrics.json, results.json, results.md, named as a run's files, but "
                "nothing there shows that a run of gwdet wrote them (no recorded config.yaml or results.json, no "
                "checkpoint), so --overwrite would not delete them either; nothing was changed. Move them out of "
                "OUTPUT_DIR, or train into another OUTPUT_DIR.")
            assert sorted(os.listdir(tmp_path)) == list(mine)
        return
    make(tmp_path, proof)
    check_fresh_start(str(tmp_path), overwrite=True)
    assert os.listdir(tmp_path) == []


def test_a_users_own_checkpoint_alone_is_no_run_and_nothing_to_resume_or_evaluate(tmp_path):
    make(tmp_path, "model_best_by_me.pth", CONFIG_NAME)
    assert not holds_run(str(tmp_path)) and checkpoints_in(str(tmp_path)) == []
    check_fresh_start(str(tmp_path), overwrite=False)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint to evaluate"):
        tagged_checkpoint(str(tmp_path))


# ---- --resume: which differences count, and its refusals -------------------------------------------

def test_keys_on_one_side_only_differ_even_when_the_other_side_holds_none():
    old = {"MODEL": {"NORM": "GN", "GONE": None}, "SOLVER": {"STEPS": (10, 20)}}
    new = {"MODEL": {"NORM": "GN", "ADDED": None}, "SOLVER": {"STEPS": [10, 20]}}  # a tuple saves as a list
    assert differing_values(old, new) == [("MODEL.ADDED", ABSENT, None), ("MODEL.GONE", None, ABSENT)]
    assert differing_values(new, old) == [("MODEL.ADDED", None, ABSENT), ("MODEL.GONE", ABSENT, None)]
    assert config_differences(old, new) == ["MODEL.ADDED: <absent> -> None", "MODEL.GONE: None -> <absent>"]
    assert differing_values({"A": {"B": 1}}, {"A": {"B": 1, "C": 2}}) == [("A.C", ABSENT, 2)]
    assert differing_values({"A": {"B": 1, "C": 2}}, {"A": {"B": 1}}) == [("A.C", 2, ABSENT)]


def run_folder(folder, cfg):
    """A run folder as training leaves it: its config.yaml and a checkpoint."""
    with open(os.path.join(folder, CONFIG_NAME), "w") as f:
        f.write(cfg.dump())
    make(folder, "model_0000009.pth")
    return str(folder)


def another_model(count):
    """get_cfg() with ``count`` of six MODEL keys changed (sorted: the order the message lists them)."""
    cfg = get_cfg()
    changes = [("MODEL.BACKBONE.FREEZE_AT", 3), ("MODEL.BACKBONE.NAME", "build_resnet_fpn_backbone"),
               ("MODEL.KEYPOINT_ON", True), ("MODEL.LOAD_PROPOSALS", True), ("MODEL.MASK_ON", True),
               ("MODEL.META_ARCHITECTURE", "RetinaNet")]
    for key, value in changes[:count]:
        cfg.merge_from_list([key, value])
    return cfg


FIRST_FIVE_DIFFERENCES = ("MODEL.BACKBONE.FREEZE_AT: 2 -> 3; MODEL.BACKBONE.NAME: 'build_resnet_backbone' -> "
                   "'build_resnet_fpn_backbone'; MODEL.KEYPOINT_ON: False -> True; MODEL.LOAD_PROPOSALS: False -> True; "
                   "MODEL.MASK_ON: False -> True")


def test_resume_of_another_model_names_five_differences_then_how_many_more(tmp_path):
    folder = run_folder(tmp_path, get_cfg())
    with pytest.raises(ValueError) as refused:
        check_resume_config(another_model(6), folder)
    assert str(refused.value) == (
        f"--resume: the run in {folder!r} was trained with another model (config.yaml there): {FIRST_FIVE_DIFFERENCES}; "
        "... (1 more). Resume with the same config and overrides, or train the new model into another OUTPUT_DIR.")


def test_resume_of_another_model_in_five_keys_names_them_all(tmp_path):
    folder = run_folder(tmp_path, get_cfg())
    with pytest.raises(ValueError) as refused:
        check_resume_config(another_model(5), folder)
    assert f"(config.yaml there): {FIRST_FIVE_DIFFERENCES}. Resume with" in str(refused.value)


def test_resume_with_other_values_outside_the_model_logs_each_of_them(tmp_path, caplog):
    trained = get_cfg()
    trained.SOLVER.BASE_LR, trained.SOLVER.MAX_ITER = 0.02, 100
    trained.SEED = 0  # detectron2's -1 draws one at random: its resume is warned of as another order
    folder = run_folder(tmp_path, trained)
    resumed = trained.clone()
    resumed.SOLVER.BASE_LR, resumed.SOLVER.MAX_ITER = 0.04, 200
    resumed.MODEL.WEIGHTS, resumed.MODEL.DEVICE = "elsewhere/model_final.pth", "cpu"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check_resume_config(resumed, folder)
    assert warnings_of(caplog) == [
        f"--resume with config values that differ from {os.path.join(folder, CONFIG_NAME)}: "
        "MODEL.DEVICE: 'cuda' -> 'cpu'; MODEL.WEIGHTS: '' -> 'elsewhere/model_final.pth'; "
        "SOLVER.BASE_LR: 0.02 -> 0.04; SOLVER.MAX_ITER: 100 -> 200"]


@pytest.mark.parametrize("text, reason", [
    ("MODEL:\n  NO_SUCH_KEY: 1\n", "KeyError: 'Non-existent config key: MODEL.NO_SUCH_KEY'"),
    ("MODEL: [unclosed\n", "ParserError: while parsing a flow sequence"),  # the first of the error's lines
])
def test_resume_over_a_config_yaml_that_cannot_be_read_names_the_file_the_error_and_the_fix(tmp_path, text, reason):
    folder = run_folder(tmp_path, get_cfg())
    path = os.path.join(folder, CONFIG_NAME)
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(DamagedFileError) as refused:
        check_resume_config(get_cfg(), folder)
    assert refused.value.path == path
    assert str(refused.value) == (
        f"--resume: {path} is damaged, so which model the run in {folder!r} trained cannot be checked ({reason}). "
        "Restore that file, or train afresh into this OUTPUT_DIR with --overwrite (which deletes the run) or "
        "into another one.")


def test_a_whole_config_yaml_with_a_key_this_version_lacks_is_named_as_another_versions(tmp_path):
    # called damaged ("Restore that file") although it matched its record: a newer gwdet wrote it
    folder = run_folder(tmp_path, get_cfg())
    path = os.path.join(folder, CONFIG_NAME)
    with open(path, "a") as f:
        f.write("NEW_SECTION:\n  NEW_KEY: 1\n")
    record_config_checksum(folder)
    with pytest.raises(ValueError) as refused:
        check_resume_config(get_cfg(), folder)
    assert str(refused.value) == (
        f"--resume: {path} is whole (it matches its recorded SHA-256) but holds a key this gwdet and detectron2 do "
        f"not have (Non-existent config key: NEW_SECTION): another version of them trained the run in {folder!r}, "
        "so which model it trained cannot be checked; nothing was changed. Resume it with the version that trained "
        "it, or train afresh into another OUTPUT_DIR.")


def test_a_damaged_config_error_without_words_still_names_its_type_and_the_setting():
    refused = damaged_config("run/config.yaml", "run", ValueError(), "train.output_dir")
    assert str(refused) == (
        "--resume: run/config.yaml is damaged, so which model the run in 'run' trained cannot be checked "
        "(ValueError: ). Restore that file, or train afresh into this train.output_dir with --overwrite (which "
        "deletes the run) or into another one.")
    assert refused.path == "run/config.yaml"


def test_resume_refuses_a_config_yaml_changed_since_its_checksum_was_recorded(tmp_path):
    folder = run_folder(tmp_path, get_cfg())
    record_config_checksum(folder)
    check_resume_config(get_cfg(), folder)  # as written: accepted
    with open(os.path.join(folder, CONFIG_NAME), "a") as f:
        f.write("\n")
    with pytest.raises(DamagedFileError, match=r"config\.yaml is damaged, so which model") as refused:
        check_resume_config(get_cfg(), folder)
    assert refused.value.path == os.path.join(folder, CONFIG_NAME)


def test_resume_over_a_damaged_checksum_record_of_config_yaml_names_the_record(tmp_path):
    # the intact config.yaml was called damaged, with advice to delete the run
    folder = run_folder(tmp_path, get_cfg())
    record_config_checksum(folder)
    path = os.path.join(folder, CONFIG_NAME)
    with open(path + ".sha256", "w") as f:
        f.write("not a digest\n")
    with pytest.raises(DamagedFileError) as refused:
        check_resume_config(get_cfg(), folder)
    assert refused.value.path == path + ".sha256"
    assert str(refused.value) == (
        f"--resume: {path} cannot be checked against what the run in {folder!r} wrote: its checksum record "
        f"config.yaml.sha256 is damaged; nothing was trained. If {path} is the run's config as the run wrote it, "
        f"record it again (cd {folder} && sha256sum config.yaml > config.yaml.sha256) and resume again; otherwise "
        "restore both files, or train into another output folder.")
    subprocess.run("sha256sum config.yaml > config.yaml.sha256", shell=True, cwd=folder, check=True)
    check_resume_config(get_cfg(), folder)  # as the message says


# ---- --eval-only --resume: the checkpoint last_checkpoint names ------------------------------------

def test_eval_only_resume_of_a_folder_without_checkpoints_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError) as refused:
        tagged_checkpoint(str(tmp_path))
    assert str(refused.value) == (
        f"--eval-only --resume: OUTPUT_DIR {str(tmp_path)!r} holds no checkpoint to evaluate (with --resume, --eval-only "
        "evaluates the run's last checkpoint there). Check OUTPUT_DIR, or leave --resume out to evaluate the weights "
        "MODEL.WEIGHTS names (MODEL.WEIGHTS path/to/model_final.pth).")


def test_eval_only_resume_evaluates_the_named_checkpoint_even_when_a_newer_one_is_there(tmp_path):
    make(tmp_path, "model_0000004.pth", "model_0000009.pth")
    (tmp_path / "last_checkpoint").write_text("model_0000004.pth\n")
    assert tagged_checkpoint(str(tmp_path)) == os.path.join(str(tmp_path), "model_0000004.pth")


def choose(folder):
    return f"Name the weights to evaluate, e.g. MODEL.WEIGHTS {os.path.join(folder, 'model_0000009.pth')}."


def test_eval_only_resume_without_last_checkpoint_suggests_the_newest_checkpoints_path(tmp_path):
    make(tmp_path, "model_0000004.pth", "model_0000009.pth")
    with pytest.raises(FileNotFoundError) as refused:
        tagged_checkpoint(str(tmp_path))
    assert str(refused.value) == (
        f"--eval-only --resume: OUTPUT_DIR {str(tmp_path)!r} has no last_checkpoint file, so which checkpoint is "
        f"the run's is unknown. {choose(str(tmp_path))}")


def test_eval_only_resume_with_a_last_checkpoint_that_is_not_utf8_text_calls_it_damaged(tmp_path):
    make(tmp_path, "model_0000009.pth")
    tag = tmp_path / "last_checkpoint"
    tag.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(ValueError) as refused:
        tagged_checkpoint(str(tmp_path))
    assert str(refused.value) == f"--eval-only --resume: {tag} is damaged (not text). {choose(str(tmp_path))}"


@pytest.mark.parametrize("name", ["", "model_0000004.pth", "../elsewhere/model_final.pth"])
def test_eval_only_resume_refuses_a_last_checkpoint_naming_no_checkpoint_of_this_folder(tmp_path, name):
    folder = tmp_path / "run"
    make(folder, "model_0000009.pth")
    make(tmp_path, "elsewhere/model_final.pth")  # exists, but is another folder's
    tag = folder / "last_checkpoint"
    tag.write_text(name)
    with pytest.raises(FileNotFoundError) as refused:
        tagged_checkpoint(str(folder))
    assert str(refused.value) == (f"--eval-only --resume: {tag} names {name!r}, which is not a file in "
                                  f"{str(folder)!r}. {choose(str(folder))}")


# ---- --eval-only: where the evaluation is written ---------------------------------------------------

def test_eval_only_writes_into_a_folder_of_its_own_named_after_the_checkpoint_and_its_folder(tmp_path):
    run = str(tmp_path / "run")
    assert evaluation_folder(run, "/zoo/R-50/model_final.pth") == run  # no run there (not even the folder)
    make(run, "model_0000009.pth")
    assert evaluation_folder(run, os.path.join(run, "model_0000009.pth")) == os.path.join(run, "eval", "model_0000009")
    assert evaluation_folder(run, "/zoo/R-50/model_final.pth") == os.path.join(run, "eval", "R-50-model_final")


def test_no_evaluation_replaces_an_earlier_one(tmp_path):
    only = str(tmp_path / "evaluations")
    make(only, "results.json")  # an evaluation into a folder without a run wrote here
    assert evaluation_folder(only, "/zoo/R-50/model_final.pth") == os.path.join(only, "eval", "R-50-model_final")
    run = str(tmp_path / "run")
    make(run, "model_final.pth", "eval/model_final/results.json", "eval/model_final-2/results.json")
    assert evaluation_folder(run, os.path.join(run, "model_final.pth")) == os.path.join(run, "eval", "model_final-3")
    # an evaluation still running there (no results.json yet): the next one, not a refusal naming OUTPUT_DIR
    with OutputDirLock(os.path.join(run, "eval", "model_final-3")):
        assert evaluation_folder(run, os.path.join(run, "model_final.pth")) == os.path.join(run, "eval", "model_final-4")
    assert evaluation_folder(run, os.path.join(run, "model_final.pth")) == os.path.join(run, "eval", "model_final-3")


# ---- metrics.json on --resume -----------------------------------------------------------------------

def write_lines(path, lines, end=b"\n"):
    path.write_bytes(b"\n".join(lines) + end)


def test_resume_trims_damaged_lines_and_repeated_records_and_says_which(tmp_path, caplog):
    metrics = tmp_path / "metrics.json"
    lines = [
        b'{"iteration": 0, "loss": 1.5}',
        b'{"iteration": 1, "loss": 1.25, "note": "\xc3\xa9"}',  # UTF-8 beyond ASCII: a good record
        b"",  # an empty line: not a record, not reported
        b'{"iteration": 2, "note": "\xff"}',  # bytes that are not UTF-8 (in a string: no JSON error)
        b'{"iteration": 2, "loss": 1.0}',
        b"[1, 2]",  # JSON, but no record
        b'{"iteration": true}',  # not an integer iteration
        b'{"iteration": "3"}',
        b'{"iteration": 3, "loss": 0.75}',  # from start_iter on: written again
        b'{"iteration": 4, "loss": 0.5}',
        b'{"iteration": 5, "lo',  # cut short by a kill
    ]
    write_lines(metrics, lines, end=b"")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trim_metrics(str(tmp_path), 3)
    assert metrics.read_bytes() == b"\n".join([lines[0], lines[1], lines[4]]) + b"\n"
    assert warnings_of(caplog) == [
        f"{metrics}: removed 5 damaged line(s) (line 4, 6, 7, 8, 11) and 2 record(s) of iterations from 3 on, "
        "which this resumed run writes again."]


@pytest.mark.parametrize("damaged, shown", [(10, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10"),
                                            (11, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (1 more)")])
def test_resume_names_the_first_ten_damaged_lines(tmp_path, caplog, damaged, shown):
    write_lines(tmp_path / "metrics.json", [b"{"] * damaged + [b'{"iteration": 0}'])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trim_metrics(str(tmp_path), 1)
    assert warnings_of(caplog) == [
        f"{tmp_path / 'metrics.json'}: removed {damaged} damaged line(s) (line {shown}) and 0 record(s) of "
        "iterations from 1 on, which this resumed run writes again."]
    assert (tmp_path / "metrics.json").read_bytes() == b'{"iteration": 0}\n'


def test_resume_with_only_repeated_records_names_no_lines(tmp_path, caplog):
    write_lines(tmp_path / "metrics.json", [b'{"iteration": 0}', b'{"iteration": 1}', b'{"iteration": 2}'])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trim_metrics(str(tmp_path), 1)
    assert warnings_of(caplog) == [f"{tmp_path / 'metrics.json'}: removed 0 damaged line(s) and 2 record(s) of "
                                   "iterations from 1 on, which this resumed run writes again."]


def test_resume_leaves_metrics_with_nothing_to_trim_byte_for_byte_as_they_are(tmp_path, caplog):
    trim_metrics(str(tmp_path), 5)  # no metrics.json: nothing to do
    content = b'{"iteration": 0}\n\n{"iteration": 4}'  # no newline at the end, an empty line
    (tmp_path / "metrics.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trim_metrics(str(tmp_path), 5)
    assert (tmp_path / "metrics.json").read_bytes() == content and warnings_of(caplog) == []


# ---- the OUTPUT_DIR lock ------------------------------------------------------------------------------

def in_use(folder, holder):
    return (f"OUTPUT_DIR {folder!r} is in use by another run ({holder}). Wait for it to finish, or give this run "
            "another OUTPUT_DIR.")


def test_a_held_output_dir_is_refused_naming_the_holder_and_released_at_the_end(tmp_path):
    folder = str(tmp_path / "run")
    first = OutputDirLock(folder)
    with first:
        assert (tmp_path / "run" / LOCK_NAME).read_text() == f"pid {os.getpid()}\n"
        with pytest.raises(RuntimeError) as refused:
            with OutputDirLock(folder):
                pass
        assert str(refused.value) == in_use(folder, f"pid {os.getpid()}")
    with OutputDirLock(folder):
        pass  # released: the next run gets it
    first.__exit__(None, None, None)  # releasing again: nothing to do
    OutputDirLock(folder).__exit__(None, None, None)  # never taken: nothing to do


def test_a_trainer_from_python_takes_the_lock_unless_its_process_holds_it(tmp_path):
    # gwdet's Trainer from one's own code ignored the lock of a tool's run training in the same folder: both
    # trained into it, metrics.json interleaved, one's model_final.pth replaced by the other's
    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.trainer import YacsRun
    from gwdet.engine.training import training_lock

    folder = str(tmp_path)
    run = YacsRun(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "OUTPUT_DIR", folder]))
    with open(tmp_path / LOCK_NAME, "a+") as held:  # another run's: it holds the file through another descriptor
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1\n")
        held.flush()
        with pytest.raises(RuntimeError) as refused:
            with training_lock(None, run):
                pass
        assert str(refused.value) == in_use(folder, "pid 1")
    with OutputDirLock(folder):  # the tool's own run holds it: its trainer trains under it
        with training_lock(None, run):
            assert (tmp_path / LOCK_NAME).read_text() == f"pid {os.getpid()}\n"
    lazy = LazyRun.load(str(LAZY_CONFIG), [f"train.output_dir={folder}"])
    with training_lock(None, lazy):  # nobody holds it: taken, then released
        with pytest.raises(RuntimeError, match=r"^train.output_dir .* is in use by another run"):
            with OutputDirLock(folder, "train.output_dir"):
                pass
    with OutputDirLock(folder):
        pass


def test_a_trainer_refuses_to_train_with_a_config_changed_since_its_build(tmp_path, monkeypatch):
    # in a notebook, cfg.SOLVER.BASE_LR = 0.0 (or a group count, a dataset, a batch) after Trainer(cfg) trained with the
    # built values without a word; OUTPUT_DIR changed (or a relative one read after os.chdir) split the run over two
    # folders: checkpoints and metrics in the first, inference/ and the lock in the second
    from types import SimpleNamespace

    from gwdet.engine.trainer import YacsRun
    from gwdet.engine.training import note_built_config, training_lock

    cfg = build_config(str(DEMO_CONFIG), [*TINY_OPTS, "OUTPUT_DIR", "run"])
    cfg.defrost()
    monkeypatch.chdir(tmp_path)
    trainer = SimpleNamespace()
    note_built_config(trainer, YacsRun(cfg))
    with training_lock(trainer, YacsRun(cfg)):
        pass
    cfg.SOLVER.BASE_LR = 0.0
    with pytest.raises(ValueError, match=r"^The config changed since this trainer was built \(SOLVER.BASE_LR: 0.02 -> "
                                         r"0.0; the built value first\): .*Build the trainer again after changing the "
                                         r"config, or set it back.$"):
        training_lock(trainer, YacsRun(cfg))
    cfg.SOLVER.BASE_LR = 0.02
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=rf"^OUTPUT_DIR 'run' is now '{tmp_path / 'elsewhere' / 'run'}', but this "
                                         rf"trainer was built to write '{tmp_path / 'run'}'.*would be split over the two "
                                         "folders"):
        training_lock(trainer, YacsRun(cfg))
    assert not (tmp_path / "elsewhere" / "run").exists()


def test_a_holder_that_wrote_no_pid_is_called_another_process(tmp_path):
    with open(tmp_path / LOCK_NAME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError) as refused:
            with OutputDirLock(str(tmp_path)):
                pass
    assert str(refused.value) == in_use(str(tmp_path), "another process")


def test_a_lock_held_after_its_run_ended_names_the_processes_it_started(tmp_path):
    # a killed run's data loader workers held the lock for seconds; the refusal named the dead pid
    # as the run that was using the folder
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid no process has now
    with open(tmp_path / LOCK_NAME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {child.pid}\n")
        held.flush()
        with pytest.raises(RuntimeError) as refused:
            with OutputDirLock(str(tmp_path)):
                pass
    assert str(refused.value) == (
        f"OUTPUT_DIR {str(tmp_path)!r} is in use by another run (pid {child.pid}, which no longer runs on this "
        "machine: processes it started, such as the data loader workers of a run that was killed, hold the lock "
        "until they end, within seconds; or it runs on another machine that shares this folder). Run the command "
        "again in a moment, or give this run another OUTPUT_DIR.")


def test_an_output_dir_that_cannot_be_created_is_refused_with_the_os_reason_and_the_fix(tmp_path):
    make(tmp_path, "afile")
    folder = str(tmp_path / "afile" / "run")
    with pytest.raises(OutputDirNotWritableError) as refused:
        with OutputDirLock(folder):
            pass
    assert str(refused.value) == (
        f"OUTPUT_DIR {folder!r} cannot be written (Not a directory); nothing was changed. Give the run a writable "
        "OUTPUT_DIR; to evaluate or export a run kept on a read-only disk, name its weights and write elsewhere: "
        "MODEL.WEIGHTS <run>/model_final.pth OUTPUT_DIR <writable folder>.")


def test_taking_the_lock_removes_partial_files_of_dead_processes_and_names_them(tmp_path, caplog):
    with open("/proc/sys/kernel/pid_max") as f:
        dead = int(f.read()) + 1  # no process can have it
    assert process_is_gone(dead)
    stale = sorted([f".model_0000009.pth.{dead}.0123456789ab.partial", f".model_final.pth.{dead}.ba9876543210.partial"])
    live = f".model_final.pth.{os.getpid()}.aaaaaaaaaaaa.partial"  # this process may still finish it
    make(tmp_path, *stale, live)
    with caplog.at_level(logging.WARNING, logger="gwdet.utils.atomic"), OutputDirLock(str(tmp_path)):
        pass
    assert sorted(os.listdir(tmp_path)) == sorted([LOCK_NAME, live])
    [message] = [r.getMessage() for r in caplog.records if r.name == "gwdet.utils.atomic"]
    head, names = message.split(": ")
    assert head == f"Removed 2 partial file(s) an interrupted save left in {tmp_path}"
    assert sorted(names.split(", ")) == stale


# ---- checksums of weight files ------------------------------------------------------------------------

def damaged_weights(count):
    names = [f"layer{i}.weight" for i in range(6)]
    data = with_checksums({"model": {name: torch.full((3,), float(i)) for i, name in enumerate(names)}})
    for name in names[:count]:
        data["model"][name][0] += 1
    return data, names[:count]


def test_damaged_tensors_are_named_four_then_how_many_more_and_kept_on_the_error(tmp_path):
    data, names = damaged_weights(5)
    with pytest.raises(DamagedTensorsError) as refused:
        verify_checksums("run/model_final.pth", data)
    assert str(refused.value) == (
        "run/model_final.pth is damaged: 5 tensor(s) differ from what was written (layer0.weight, layer1.weight, "
        "layer2.weight, layer3.weight, ... (1 more)); nothing was loaded from it. Restore the file from a copy or write it "
        "again (train, or convert the weights again); a training's --resume uses the previous checkpoint in the folder "
        "instead. If the file was changed on purpose (its training state removed to publish the weights, the weights "
        "converted to another dtype), the checksums gwdet recorded in it no longer apply: save it without them (its "
        "keys gwdet_checksums and gwdet_state_checksums), e.g. import torch; d = torch.load(\"run/model_final.pth\", "
        "weights_only=True); torch.save({k: v for k, v in d.items() if k not in (\"gwdet_checksums\", "
        "\"gwdet_state_checksums\")}, \"run/model_final_unchecked.pth\")")
    assert refused.value.damaged == names and refused.value.path == "run/model_final.pth"
    assert isinstance(refused.value, DamagedFileError)


def test_four_damaged_tensors_are_all_named_without_dots():
    data, names = damaged_weights(4)
    with pytest.raises(DamagedTensorsError) as refused:
        verify_checksums("w.pth", data)
    assert "(layer0.weight, layer1.weight, layer2.weight, layer3.weight); nothing was loaded" in str(refused.value)
    assert refused.value.damaged == names


def test_undamaged_weights_and_weights_removed_by_the_user_are_no_damage():
    data, _ = damaged_weights(0)
    verify_checksums("w.pth", data)
    del data["model"]["layer0.weight"]
    verify_checksums("w.pth", data)


# ---- unsafe unpickling ------------------------------------------------------------------------------

def test_a_checkpoint_needing_unsafe_globals_is_refused_naming_every_one_of_them(tmp_path):
    path = str(tmp_path / "run.pth")
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=0.1), "day": datetime.date(2024, 1, 2)},
               path)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load_torch_file(path, allow_unsafe=False, how_to_opt_in="set GWDET_ALLOW_UNSAFE_PICKLE=1")
    assert str(refused.value) == (
        f"{path}: refusing to load this file. It needs unsafe unpickling: besides tensors it contains "
        "argparse.Namespace, datetime.date, and unpickling that can execute arbitrary code. If you trust where the "
        "file comes from, set GWDET_ALLOW_UNSAFE_PICKLE=1; otherwise re-save only the state dict "
        "(torch.save(model.state_dict(), path)) where the file is trusted.")
    assert load_torch_file(path, allow_unsafe=True, how_to_opt_in="")["args"].lr == 0.1


def test_unsafe_globals_named_only_in_the_error_torch_chained_are_found(tmp_path):
    # The legacy format has no archive to list globals from: the names come from torch's error,
    # which another torch version may put in the error it chained instead of its own words.
    path = str(tmp_path / "legacy.pth")
    torch.save({"args": argparse.Namespace()}, path, _use_new_zipfile_serialization=False)
    try:
        try:
            raise pickle.UnpicklingError("Unsupported global: GLOBAL argparse.Namespace was not an allowed global")
        except pickle.UnpicklingError:
            raise pickle.UnpicklingError("Weights only load failed.") from None
    except pickle.UnpicklingError as error:
        assert _globals_refused(path, error) == ["argparse.Namespace"]


def test_a_config_yaml_changed_since_it_was_recorded_is_refused_naming_the_run_and_the_setting(tmp_path):
    from gwdet.utils.atomic import record_checksum
    from gwdet.engine.output_dir import check_config_checksum

    folder = tmp_path / "run"
    folder.mkdir()
    config = folder / "config.yaml"
    config.write_text("MODEL:\n  MASK_ON: true\n")
    record_checksum(str(config))
    check_config_checksum(str(config), str(folder))  # as written: fine
    config.write_text("MODEL:\n  MASK_ON: false\n")
    with pytest.raises(DamagedFileError) as refused:
        check_config_checksum(str(config), str(folder), "train.output_dir")
    assert str(refused.value) == (
        f"--resume: {config} is damaged, so which model the run in {str(folder)!r} trained cannot be checked (its "
        "SHA-256 differs from the one recorded in config.yaml.sha256 when it was written). Restore that file, or "
        "train afresh into this train.output_dir with --overwrite (which deletes the run) or into another one.")
    (folder / "model_0000009.pth").write_bytes(b"")  # a run to resume: the check reads its config.yaml
    with pytest.raises(DamagedFileError, match=rf"the run in {re.escape(repr(str(folder)))} trained"):
        check_resume_config(get_cfg(), str(folder))


def test_an_output_dir_name_the_file_system_encoding_cannot_carry_is_refused_with_the_fix():
    from gwdet.engine.output_dir import check_output_dir_name

    check_output_dir_name("runs/été", encoding="utf-8")
    check_output_dir_name("runs/plain", encoding="ascii")
    with pytest.raises(ValueError) as refused:
        check_output_dir_name("runs/été", encoding="latin-1")
    assert str(refused.value) == (
        "OUTPUT_DIR 'runs/été' has characters beyond ASCII, which this Python cannot pass on unchanged (its file "
        "system encoding is 'iso8859-1', not UTF-8): TensorBoard's writer would fail or write elsewhere. Run Python "
        "in UTF-8 mode (export PYTHONUTF8=1, or a UTF-8 locale such as LC_ALL=C.UTF-8), or choose an OUTPUT_DIR of "
        "ASCII characters; nothing was written.")
    with pytest.raises(ValueError, match="has characters beyond ASCII"):
        check_output_dir_name("runs/\udcc3\udca4", encoding="utf-8")  # undecodable bytes of another locale


def test_bfloat16_and_empty_tensors_have_checksums_that_notice_a_change(tmp_path):
    from gwdet.checkpoint.integrity import tensor_checksum, verify_checksums, with_checksums

    weights = {"half": torch.arange(6, dtype=torch.bfloat16), "empty": torch.zeros(0)}
    data = with_checksums({"model": dict(weights)})
    verify_checksums("ok.pth", data)
    assert tensor_checksum(torch.zeros(0)) == 0
    changed = dict(data, model={**weights, "half": weights["half"] + 1})
    with pytest.raises(DamagedTensorsError, match="half"):
        verify_checksums("changed.pth", changed)
    verify_checksums("no-model.pth", {k: v for k, v in data.items() if k != "model"})  # nothing to compare


# ---- the iteration a --resume starts from, and the checksums of a checkpoint's other values --------

def checkpoint_file(folder, name, data, tag=True):
    torch.save(data, os.path.join(folder, name))
    if tag:
        with open(os.path.join(folder, "last_checkpoint"), "w") as f:
            f.write(name)
    return os.path.join(folder, name)


def test_the_resumed_iteration_is_the_tagged_checkpoints_plus_one_read_from_it_or_its_trainer_state(tmp_path):
    from gwdet.engine.output_dir import resumed_iteration

    assert resumed_iteration(str(tmp_path)) is None  # nothing tagged
    path = checkpoint_file(tmp_path, "model_0000009.pth", {"model": {}, "iteration": 9})
    assert resumed_iteration(str(tmp_path)) == (path, 10)
    path = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "trainer": {"iteration": 19}})
    assert resumed_iteration(str(tmp_path)) == (path, 20)
    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": "19"})
    assert resumed_iteration(str(tmp_path)) is None, "no integer iteration: the resume decides"
    with open(path, "wb") as f:
        f.write(b"not a checkpoint")
    # the resume passes over the unreadable tagged checkpoint and takes the folder's other one
    assert resumed_iteration(str(tmp_path)) == (os.path.join(tmp_path, "model_0000009.pth"), 10)


def test_a_tagged_checkpoint_that_differs_from_its_sha256_record_tells_no_iteration(tmp_path):
    from gwdet.utils.atomic import record_checksum
    from gwdet.engine.output_dir import resumed_iteration

    path = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 99})
    record_checksum(path)
    assert resumed_iteration(str(tmp_path)) == (path, 100)
    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 98})  # the record is the old file's
    assert resumed_iteration(str(tmp_path)) is None, "the resume takes an older checkpoint: its iteration is unknown"


def test_a_resume_of_a_finished_run_is_refused_and_one_stopped_before_its_results_is_not(tmp_path):
    from gwdet.engine.output_dir import check_resume_trains
    from gwdet.utils.atomic import write_text_with_checksum

    checkpoint = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 99})
    results = tmp_path / "results.json"
    write_text_with_checksum(str(results), '{"shapes_val": {"bbox": {"AP": 50.0}}}')
    os.utime(checkpoint, (1, 1))  # the results came after the last checkpoint
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError) as refused:
        check_resume_trains(str(tmp_path), 100)
    assert str(refused.value) == (
        f"--resume: the run in {str(tmp_path)!r} is finished: it trained its 100 iterations (model_final.pth) and its "
        "results are in results.json; resuming would train nothing and write its config.yaml, metrics and results "
        "again; nothing was changed. To evaluate it again, use --eval-only --resume; to train it further, resume "
        "with SOLVER.MAX_ITER above 100.")
    assert sorted(os.listdir(tmp_path)) == before
    check_resume_trains(str(tmp_path), 150)  # a longer schedule trains on
    results.write_text("{")  # cut short (its record no longer matches): the evaluation is done again
    check_resume_trains(str(tmp_path), 100)
    # last_checkpoint rolled back by hand to an earlier checkpoint: results.json is model_final.pth's, not its
    earlier = checkpoint_file(tmp_path, "model_0000049.pth", {"model": {}, "iteration": 49})
    (tmp_path / "last_checkpoint").write_text("model_0000049.pth")
    os.utime(earlier, (1, 1))
    os.utime(checkpoint, (2, 2))
    write_text_with_checksum(str(results), '{"shapes_val": {"bbox": {"AP": 50.0}}}')
    with pytest.raises(ValueError, match=r"is finished, and its last_checkpoint names model_0000049.pth \(iteration 50\), "
                                         r"an earlier checkpoint than its model_final.pth, whose results results.json "
                                         r"holds; .* To evaluate model_0000049.pth, give it as the weights of an "
                                         r"--eval-only into another folder"):
        check_resume_trains(str(tmp_path), 50)


# before: a finished run whose model_final.pth (named by last_checkpoint) was damaged was refused saying that
# last_checkpoint names the earlier model_0000049.pth, and the damage went unnamed
def test_a_resume_of_a_finished_run_whose_final_weights_are_damaged_names_the_damage_and_the_tagged_file(tmp_path):
    from gwdet.engine.output_dir import check_resume_trains
    from gwdet.utils.atomic import record_checksum, write_text_with_checksum

    earlier = checkpoint_file(tmp_path, "model_0000049.pth", {"model": {}, "iteration": 49})
    final = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 49})
    for path in (earlier, final):
        record_checksum(path)
    write_text_with_checksum(str(tmp_path / "results.json"), '{"shapes_val": {"bbox": {"AP": 50.0}}}')
    os.utime(earlier, (1, 1))
    os.utime(final, (2, 2))
    with pytest.raises(ValueError, match=r"is finished: it trained its 50 iterations \(model_final.pth\)"):
        check_resume_trains(str(tmp_path), 50)
    with open(final, "r+b") as f:
        f.truncate(100)  # cut short
    os.utime(final, (2, 2))
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    with pytest.raises(ValueError) as refused:
        check_resume_trains(str(tmp_path), 50)
    assert str(refused.value) == (
        f"--resume: the run in {str(tmp_path)!r} is finished, and its last_checkpoint names model_final.pth, which is "
        "damaged (its SHA-256 differs from the one recorded in model_final.pth.sha256 when it was written), so the "
        "resume would take its newest readable checkpoint, model_0000049.pth (iteration 50), an earlier checkpoint "
        "than the model_final.pth whose results results.json holds; resuming would train nothing and write its "
        "config.yaml, metrics and results again; nothing was changed. Restore model_final.pth from a copy (if you "
        "replaced it on purpose, delete model_final.pth.sha256); to train on from model_0000049.pth, resume with "
        "SOLVER.MAX_ITER above 50; to evaluate model_0000049.pth, give it as the weights of an --eval-only into "
        "another folder.")
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    os.remove(final + ".sha256")  # no record: its load names the damage
    with pytest.raises(ValueError, match=r"its last_checkpoint names model_final.pth, which is damaged \(reading it "
                                         r"fails with \w+: .*\), so the resume would take .* Restore model_final.pth "
                                         r"from a copy; to train on"):
        check_resume_trains(str(tmp_path), 50)
    (tmp_path / "last_checkpoint").unlink()  # nothing tagged: the damage is the final weights'
    with pytest.raises(ValueError, match=r"is finished, and its model_final.pth is damaged \(reading it fails"):
        check_resume_trains(str(tmp_path), 50)


def test_results_of_the_model_before_a_resume_are_kept_under_names_that_say_so(tmp_path, caplog):
    # a kill during a resumed run's final evaluation left the earlier model's results.json (whole,
    # by its record) beside the new model_final.pth, as its results
    from gwdet.engine.output_dir import set_aside_results
    from gwdet.utils.atomic import checksum_problem, write_text_with_checksum

    write_text_with_checksum(str(tmp_path / "results.json"), '{"shapes_val": {"bbox": {"AP": 50.0}}}')
    (tmp_path / "results.md").write_text("AP 50")
    (tmp_path / "results_before_resuming_at_250.md").write_text("an earlier extension's")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        set_aside_results(str(tmp_path), 250)
    assert sorted(os.listdir(tmp_path)) == [
        "results_before_resuming_at_250.json", "results_before_resuming_at_250.json.sha256",
        "results_before_resuming_at_250.md", "results_before_resuming_at_250_2.md"]
    assert (tmp_path / "results_before_resuming_at_250.md").read_text() == "an earlier extension's"
    assert (tmp_path / "results_before_resuming_at_250_2.md").read_text() == "AP 50"
    assert checksum_problem(str(tmp_path / "results_before_resuming_at_250.json")) is None
    # they are the run's files: --overwrite deletes them with the run (it kept them as the user's)
    assert run_files(str(tmp_path)) == sorted(os.listdir(tmp_path))
    assert warnings_of(caplog) == [f"{tmp_path}: the results the run wrote before this resume at iteration 250 (of the "
                                   "model it had when it wrote them, which may be past that iteration) are kept as "
                                   "results_before_resuming_at_250_2.md and results_before_resuming_at_250.json; the "
                                   "train tool writes the run's results.md and results.json anew when it ends (a trainer "
                                   "of one's own code writes none: tools/train_net.py --eval-only --resume evaluates its "
                                   "last checkpoint)."]


def test_drawings_of_the_model_before_a_resume_go_into_a_folder_that_says_so(tmp_path, caplog):
    # a resume without TEST.VIS_IMAGES left vis/ showing the earlier model's drawings beside the new results
    from gwdet.engine.output_dir import set_aside_results

    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from gwdet.engine.visualize import DRAWING_KEY, DRAWING_MARK

    (tmp_path / "vis" / "before_resuming_at_2").mkdir(parents=True)  # an earlier resume's
    mark = PngInfo()
    mark.add_text(DRAWING_KEY, DRAWING_MARK)
    for name in ("0_a.png", "1_b.png"):  # drawings as save_prediction_pngs writes them
        Image.new("RGB", (4, 4)).save(tmp_path / "vis" / name, format="PNG", pnginfo=mark)
    Image.new("RGB", (4, 4)).save(tmp_path / "vis" / "my_figure.png", format="PNG")  # a picture of the user's
    (tmp_path / "vis" / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        set_aside_results(str(tmp_path), 2)
    assert sorted(os.listdir(tmp_path / "vis")) == ["before_resuming_at_2", "before_resuming_at_2_2", "my_figure.png",
                                                    "notes.txt"]
    assert sorted(os.listdir(tmp_path / "vis" / "before_resuming_at_2_2")) == ["0_a.png", "1_b.png"]
    assert "are kept as vis/before_resuming_at_2_2/; the train tool writes" in warnings_of(caplog)[0]
    set_aside_results(str(tmp_path), 3)  # nothing left to move: no folder
    assert not (tmp_path / "vis" / "before_resuming_at_3").exists()


def test_evaluations_of_the_final_weights_a_resume_replaces_are_renamed(tmp_path, caplog):
    # eval/model_final/ (an --eval-only --resume) stayed named for model_final.pth after a resume replaced that file,
    # and the next evaluation of the new one went to eval/model_final-2/
    from gwdet.engine.output_dir import OutputDirLock, set_aside_results

    for name in ("model_final", "model_final-2", "model_0000001", "other-model_final", "model_final-3"):
        (tmp_path / "eval" / name).mkdir(parents=True)
        (tmp_path / "eval" / name / "results.md").write_text(name)
    with OutputDirLock(str(tmp_path / "eval" / "model_final-3")), caplog.at_level(logging.WARNING, logger=LOGGER):
        set_aside_results(str(tmp_path), 2)  # -3 is still evaluating: it stays
    assert sorted(os.listdir(tmp_path / "eval")) == [
        "model_0000001", "model_final-3", "model_final_before_resuming_at_2", "model_final_before_resuming_at_2-2",
        "other-model_final"]
    assert (tmp_path / "eval" / "model_final_before_resuming_at_2-2" / "results.md").read_text() == "model_final-2"
    assert "kept as eval/model_final_before_resuming_at_2/ and eval/model_final_before_resuming_at_2-2/;" \
        in warnings_of(caplog)[0]


def test_results_changed_since_the_run_wrote_them_keep_their_record_when_set_aside(tmp_path, caplog):
    # a results.json edited after the run (its record no longer matching) was renamed and its record deleted: the
    # changed numbers then read as an unrecorded file of an older gwdet
    from gwdet.engine.output_dir import set_aside_results
    from gwdet.utils.atomic import checksum_problem, write_text_with_checksum

    write_text_with_checksum(str(tmp_path / "results.json"), '{"shapes_val": {"bbox": {"AP": 0.0}}}')
    (tmp_path / "results.json").write_text('{"shapes_val": {"bbox": {"AP": 55.5}}}')
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        set_aside_results(str(tmp_path), 2)
    assert sorted(os.listdir(tmp_path)) == ["results_before_resuming_at_2.json",
                                            "results_before_resuming_at_2.json.sha256"]
    assert checksum_problem(str(tmp_path / "results_before_resuming_at_2.json")) is not None
    # the record names the renamed file, so that sha256sum -c checks it (not the run's new results.json)
    record = (tmp_path / "results_before_resuming_at_2.json.sha256").read_text()
    assert record.endswith("  results_before_resuming_at_2.json\n")
    assert record.split()[0] == hashlib.sha256(b'{"shapes_val": {"bbox": {"AP": 0.0}}}').hexdigest()
    assert warnings_of(caplog)[0] == (
        f"{tmp_path / 'results.json'} no longer matches the SHA-256 recorded when the run wrote it (it was changed "
        "since); it is kept as results_before_resuming_at_2.json with that record, which a reader of it checks.")


def test_a_resume_is_refused_only_when_the_checkpoint_is_past_the_schedule(tmp_path):
    from gwdet.engine.output_dir import check_resume_trains

    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 99})
    check_resume_trains(str(tmp_path), 100)  # stopped before its results (preempted while evaluating): evaluated
    check_resume_trains(str(tmp_path), 150)
    with pytest.raises(ValueError) as refused:
        check_resume_trains(str(tmp_path), 99, "train.max_iter")
    assert str(refused.value) == (
        f"--resume: the run in {str(tmp_path)!r} has trained 100 iterations (model_final.pth), more than "
        "train.max_iter 99: resuming would train nothing and write the run's config.yaml and results again with a "
        "schedule its weights did not have; nothing was changed. To train it further, resume with train.max_iter "
        "above 100; to evaluate it, use --eval-only --resume.")
    cfg = get_cfg()
    cfg.SOLVER.MAX_ITER = 50  # without the run's config.yaml the model cannot be checked: refused first
    with pytest.raises(FileNotFoundError, match="has checkpoints but no config.yaml, so which model it trained") as refused:
        check_resume_config(cfg, str(tmp_path))
    # a run trained from Python never had one (it "restored" a file that never was): its way on from there is named
    assert str(refused.value).endswith("A run trained from one's own code (gwdet's Trainer or LazyTrainer without "
                                       "detectron2's default_setup, which writes config.yaml) continues from there: "
                                       "Trainer(cfg) (LazyTrainer(cfg) for a LazyConfig), resume_or_load(resume=True), "
                                       "then train().")


def test_every_value_of_a_checkpoint_is_checked_by_its_place_whatever_its_container(tmp_path):
    from collections import OrderedDict

    from gwdet.checkpoint.integrity import STATE_CHECKSUMS_KEY, value_checksum

    state = {"model": {"w": torch.ones(2)}, "iteration": 7, "note": "run",
             "trainer": {"optimizer": {"state": {0: {"momentum_buffer": torch.zeros(3)}},
                                       "param_groups": [{"lr": 0.02, "params": [0]}]},
                         "hooks": {"a/b": {"x": 1.5}}, "empty": {}}}
    data = with_checksums(state)
    assert sorted(data[STATE_CHECKSUMS_KEY]) == ["iteration", "note", "trainer/empty", "trainer/hooks/a/b/x",
                                                 "trainer/optimizer/param_groups", "trainer/optimizer/state/0/momentum_buffer"]
    verify_checksums("run.pth", data)
    assert value_checksum(OrderedDict(a=[1, 2.0])) == value_checksum({"a": (1, 2.0)}), "as torch.load gives them back"
    assert value_checksum([1, 2.0]) != value_checksum([1, 2.0000000001]) != value_checksum([1, 2])
    changed = pickle.loads(pickle.dumps(data))
    changed["trainer"]["optimizer"]["param_groups"][0]["lr"] = 0.2
    changed["trainer"]["hooks"]["a/b"]["x"] = 2.5
    del changed["note"]
    with pytest.raises(DamagedTensorsError) as refused:
        verify_checksums("run.pth", changed)
    assert refused.value.state == ["note", "trainer/optimizer/param_groups", "trainer/hooks/a/b/x"]
    assert refused.value.damaged == []
    assert str(refused.value).startswith(
        "run.pth is damaged: 3 value(s) of its training state or metadata differ from what was written or are gone "
        "(note, trainer/optimizer/param_groups, trainer/hooks/a/b/x); nothing was loaded from it.")


def test_folders_named_like_a_runs_holding_the_users_files_are_not_called_a_run(tmp_path):
    # "already holds a run that stopped before its first checkpoint (eval, vis) ... pass --overwrite",
    # which was then refused
    make(tmp_path, "vis/mine.txt", "eval/notes.txt", "README.md")
    with pytest.raises(FileExistsError, match=r"holds eval, vis, named as a run's folders, with files no run of gwdet "
                                              r"writes \(eval/notes.txt, vis/mine.txt\), and nothing there shows a run"):
        check_fresh_start(str(tmp_path), overwrite=False)
    make(tmp_path, "vis/000.png")  # a run's visualizations beside them change nothing
    with pytest.raises(FileExistsError, match=r"with files no run of gwdet writes \(eval/notes.txt, vis/mine.txt\)"):
        check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(os.listdir(tmp_path / "vis")) == ["000.png", "mine.txt"]


def test_a_folder_of_drawings_named_as_a_runs_but_no_run_is_kept(tmp_path):
    # vis/000000.png of the user's own, nothing else: "a run that stopped before its first checkpoint ... pass
    # --overwrite", which deleted it
    make(tmp_path, "vis/000000.png")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match=r"holds vis, named as a run's folders, with files named as a run "
                                                  r"writes them \(vis/000000.png\), but nothing there shows that a run "
                                                  r"of gwdet wrote them .*--overwrite would not delete them either"):
            check_fresh_start(str(tmp_path), overwrite=overwrite)
    assert os.listdir(tmp_path / "vis") == ["000000.png"]
    (tmp_path / "vis" / "000000.png").unlink()
    check_fresh_start(str(tmp_path), overwrite=True)  # an empty folder: nothing of anyone's to keep


def test_a_resumed_training_records_what_each_stretch_of_its_iterations_ran_with(tmp_path):
    # results.json's environment showed only the last stretch's values (an accelerator plan for a run
    # whose first iterations used the cpu plan, 1 process for a run of 2)
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine.run import results_record

    model = torch.nn.Linear(2, 2)
    first = {"execution_plans": {"cpu": "cpu"}, "threads": 2, "processes": 1}
    ResilientCheckpointer(model, str(tmp_path), segment=first).save("model_0000003", iteration=3)
    resumed = ResilientCheckpointer(model, str(tmp_path), segment={**first, "execution_plans": {"cpu": "accelerator"}})
    resumed.resume_or_load("", resume=True)
    resumed.save("model_0000005", iteration=5)
    expected = [{"from_iteration": 0, **first}, {"from_iteration": 4, **first, "execution_plans": {"cpu": "accelerator"}}]
    assert resumed.run_segments() == expected
    again = ResilientCheckpointer(model, str(tmp_path), segment=first)
    again.resume_or_load("", resume=True)
    assert again.run_segments() == [*expected, {"from_iteration": 6, **first}]
    record = results_record({}, segments=resumed.run_segments())["environment"]
    assert record["segments"] == expected and record["threads"] == torch.get_num_threads()  # the last stretch's
    assert "segments" not in results_record({}, segments=expected[:1])["environment"]  # not resumed: one stretch


def test_a_run_whose_lock_file_was_deleted_still_holds_its_folder_and_two_trainers_of_a_process_do_not_share_it(
        tmp_path):
    # .gwdet.lock deleted while a run trained (a clean-up of "stale" locks): a second run with --overwrite deleted the
    # running run's files; a trainer in a background thread and another in the main thread trained into one folder
    # (the lock was skipped because this process held it)
    from gwdet.engine.output_dir import lock_holder
    from gwdet.engine.trainer import YacsRun
    from gwdet.engine.training import training_lock

    folder = str(tmp_path)
    with OutputDirLock(folder):
        os.unlink(tmp_path / LOCK_NAME)
        assert lock_holder(folder) == "another process (its lock file was deleted)"
        with pytest.raises(RuntimeError) as refused:
            with OutputDirLock(folder):
                pass
        assert str(refused.value) == in_use(folder, "another process (its lock file was deleted)")
    with OutputDirLock(folder):  # released with the run
        pass
    run = YacsRun(build_config(str(DEMO_CONFIG), [*TINY_OPTS, "OUTPUT_DIR", folder]))
    with training_lock(None, run):
        assert lock_holder(folder) == f"pid {os.getpid()} (a trainer started from Python)"
        with pytest.raises(RuntimeError) as refused:
            with training_lock(None, run):
                pass
        assert str(refused.value) == in_use(folder, f"pid {os.getpid()} (a trainer started from Python)")


def test_gw_positions_in_another_spelling_are_the_same_model():
    # --resume with S1-B2 of a run trained with B2-S1 was refused as "trained with another model", and --eval-only
    # warned of other values: both spellings build GW at the stem and conv2
    from gwdet.engine.output_dir import model_differences

    def positions(spec):
        return build_config(str(DEMO_CONFIG), ["MODEL.RESNETS.GW_POSITIONS", spec])

    assert model_differences(positions("B2-S1"), positions("S1-B2")) == []
    assert model_differences(positions("B1-B2"), positions("B12")) == []
    assert model_differences(positions("B2"), positions("S1-B2")) == ["MODEL.RESNETS.GW_POSITIONS: 'B2' -> 'S1-B2'"]


# a GN run trained with MODEL.GW.NUM_GROUPS 8 (which no layer reads) was refused on --resume without it as "trained
# with another model"
def test_norm_values_no_norm_of_either_config_reads_build_the_same_model():
    from gwdet.engine.output_dir import config_differences, model_differences

    gn = str(REPO / "configs" / "Demo" / "scratch_faster_rcnn_gn_shapes.yaml")
    plain = build_config(gn)
    unread = build_config(gn, ["MODEL.GW.NUM_GROUPS", "4"])
    assert config_differences(unread, plain) and model_differences(unread, plain) == []
    assert model_differences(build_config(gn, ["MODEL.BGN.EXAMPLES_PER_GROUP", "4"]), plain) == []
    assert model_differences(build_config(gn, ["MODEL.GN.NUM_GROUPS", "4"]), plain) == [
        f"MODEL.GN.NUM_GROUPS: 4 -> {plain.MODEL.GN.NUM_GROUPS}"]  # read by the GN layers: another model
    # read by the norm one of the two configs builds: another model
    assert model_differences(build_config(gn, ["MODEL.FPN.NORM", "GW", "MODEL.GW.NUM_GROUPS", "4"]), plain) == [
        "MODEL.FPN.NORM: 'GW' -> 'GN'", f"MODEL.GW.NUM_GROUPS: 4 -> {plain.MODEL.GW.NUM_GROUPS}"]


def test_initial_weights_under_a_checkpoint_name_in_the_output_folder_are_named(tmp_path):
    # "already holds a run (model_final.pth) ... Continue it with --resume, ... or pass --overwrite", both of which
    # then failed: the "run" was the MODEL.WEIGHTS on the same command line
    torch.save({"model": {}}, tmp_path / "model_final.pth")
    with pytest.raises(FileExistsError, match=r"^MODEL.WEIGHTS '.*model_final.pth' is in OUTPUT_DIR '.*' under a name "
                                              r"the run's checkpoints take \(model_final.pth\), so the folder looks like "
                                              r"a run's; nothing was changed. Move the initial weights out of OUTPUT_DIR"):
        check_fresh_start(str(tmp_path), False, weights=str(tmp_path / "model_final.pth"))
    assert os.listdir(tmp_path) == ["model_final.pth"]
    with pytest.raises(FileExistsError, match=r"holds model_final.pth, named as a run's files, but nothing there shows"):
        check_fresh_start(str(tmp_path), False, weights=str(tmp_path / "elsewhere.pth"))  # no record: no run's
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    with pytest.raises(FileExistsError, match=r"already holds a run \(last_checkpoint, model_final.pth\)"):
        check_fresh_start(str(tmp_path), False, weights=str(tmp_path / "elsewhere.pth"))


def test_results_that_cannot_be_set_aside_are_named_with_the_fix(tmp_path):
    # results.json made immutable: a raw PermissionError traceback from set_aside_results
    from gwdet.engine.output_dir import set_aside_results
    from gwdet.errors import GwdetOSError
    from gwdet.utils.atomic import write_text_with_checksum

    results = tmp_path / "results.json"
    write_text_with_checksum(str(results), '{"shapes_val": {"bbox": {"AP": 50.0}}}')
    if subprocess.run(["chattr", "+i", str(results)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this file system")
    try:
        with pytest.raises(GwdetOSError, match=r"^--resume keeps the run's earlier results as "
                                               r"results_before_resuming_at_6.json, but .*results.json cannot be "
                                               r"renamed \(Operation not permitted\); nothing was trained. .*chattr -i"):
            set_aside_results(str(tmp_path), 6)
    finally:
        subprocess.run(["chattr", "-i", str(results)], check=True)
    set_aside_results(str(tmp_path), 6)
    assert (tmp_path / "results_before_resuming_at_6.json").is_file()


def test_a_resume_is_refused_while_an_evaluation_of_its_final_weights_runs(tmp_path):
    # the evaluation's results named <run>/model_final.pth with the old SHA-256 while the path held the new model
    from gwdet.engine.output_dir import check_resume_trains

    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 5})
    (tmp_path / "eval" / "model_final").mkdir(parents=True)
    with OutputDirLock(str(tmp_path / "eval" / "model_final")):
        with pytest.raises(ValueError, match=r"^--resume: an evaluation of the run's model_final.pth is running in "
                                             r".*eval/model_final \(pid \d+.*\), and the resumed run would replace the "
                                             r"file it scores while it reads it; nothing was changed"):
            check_resume_trains(str(tmp_path), 8)
        check_resume_trains(str(tmp_path), 6)  # at its own length it trains nothing, so nothing is replaced
    check_resume_trains(str(tmp_path), 8)


def test_an_evaluation_of_the_final_weights_is_refused_while_a_resume_of_the_run_trains(tmp_path):
    # the other order: the evaluation was let in, then the resume replaced model_final.pth, leaving
    # eval/model_final/ scoring weights that no longer existed, without a word
    from gwdet.engine.output_dir import check_final_weights_not_training

    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 5})
    checkpoint_file(tmp_path, "model_0000004.pth", {"model": {}, "iteration": 4})
    with OutputDirLock(str(tmp_path)):  # the resumed training holds its run
        with pytest.raises(ValueError, match=r"^--eval-only of .*model_final.pth: a training holds the run in "
                                             r"OUTPUT_DIR .* \(pid \d+.*; a --resume of the finished run\), and writes its "
                                             r"model_final.pth again at its end.*nothing was evaluated"):
            check_final_weights_not_training(str(tmp_path), str(tmp_path / "model_final.pth"))
        check_final_weights_not_training(str(tmp_path), str(tmp_path / "model_0000004.pth"))  # a file it keeps
    check_final_weights_not_training(str(tmp_path), str(tmp_path / "model_final.pth"))


def test_a_file_of_the_users_named_as_a_checkpoint_is_no_run_to_overwrite(tmp_path):
    # a 12-byte text file named model_final.pth was called a run, and --overwrite deleted it
    (tmp_path / "model_final.pth").write_text("my precious\n")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match=r"holds model_final.pth, named as a run's files, but nothing there "
                                                  r"shows that a run of gwdet wrote them .* --overwrite would not delete "
                                                  r"them either; nothing was changed"):
            check_fresh_start(str(tmp_path), overwrite=overwrite)
    assert (tmp_path / "model_final.pth").read_text() == "my precious\n"
    torch.save({"model": {}}, tmp_path / "model_final.pth")  # a torch.save of the user's is no run either
    with pytest.raises(FileExistsError, match="holds model_final.pth, named as a run's files, but nothing there shows"):
        check_fresh_start(str(tmp_path), overwrite=True)
    (tmp_path / "last_checkpoint").write_text("model_final.pth")  # what a checkpointer writes beside it is a run's
    check_fresh_start(str(tmp_path), overwrite=True)
    assert os.listdir(tmp_path) == []


def test_a_folder_of_the_users_named_as_the_kept_config_is_refused_not_removed(tmp_path):
    # .gwdet-config-before/keep.txt of the user's: "put config.yaml ... back", and keep.txt was deleted unnamed
    from gwdet.engine.output_dir import OutputDirLock
    from gwdet.utils.run_file_names import CONFIG_KEPT

    (tmp_path / CONFIG_KEPT).mkdir()
    (tmp_path / CONFIG_KEPT / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds .gwdet-config-before/keep.txt, in a folder of the name gwdet keeps "
                                              r"a run's config.yaml and its record in .* nothing was changed. Move that "
                                              r"folder out of OUTPUT_DIR"):
        with OutputDirLock(str(tmp_path)):
            pass
    assert (tmp_path / CONFIG_KEPT / "keep.txt").read_text() == "mine"
    (tmp_path / CONFIG_KEPT).rename(tmp_path / "mine")
    with OutputDirLock(str(tmp_path)):  # the refusal let the lock go: the folder is free once that folder is moved
        pass
    assert (tmp_path / "mine" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("record", ["model_final.pth.sha256", "model_0000001.pth.sha256", "results.json.sha256"])
def test_a_folder_named_as_a_record_the_run_writes_is_refused_before_training(tmp_path, record):
    # training ran to its end, then "[Errno 21] cannot write .../model_final.pth: Is a directory" named another file
    from gwdet.engine.output_dir import check_run_file_names

    (tmp_path / record).mkdir()
    (tmp_path / record / "keep.txt").write_text("mine")
    recorded = record.removesuffix(".sha256")
    with pytest.raises(IsADirectoryError, match=rf"holds a folder {re.escape(record)}, but the run records the SHA-256 "
                                                rf"of its \w+ {re.escape(recorded)} in a file of that name, which would "
                                                rf"fail when the run writes {re.escape(recorded)}"):
        check_run_file_names(str(tmp_path))
    assert (tmp_path / record / "keep.txt").read_text() == "mine"


# --overwrite deleted the user's vis/my_figure.png, inference/my_labels.json, inference/my_backup.pth,
# inference/my_annotations/instances_val.json and eval/<evaluation>/vis/my_plot.png: judged by extension
def test_overwrite_refuses_users_files_named_like_a_runs_outputs_and_deletes_drawings_and_evaluator_files(tmp_path):
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo
    from gwdet.engine.visualize import DRAWING_KEY, DRAWING_MARK, is_prediction_drawing

    mark = PngInfo()
    mark.add_text(DRAWING_KEY, DRAWING_MARK)
    make(tmp_path, *SEVEN, CONFIG_NAME, CONFIG_NAME + ".sha256", "eval/a1-model_final/results.json",
         "inference/shapes_val/shapes_val_coco_format.json", "inference/shapes_val/shapes_val_coco_format.json.lock",
         "inference/shapes_val/coco_instances_results.json")
    Image.new("RGB", (4, 4)).save(tmp_path / "vis" / "0_a.png", pnginfo=mark)  # a run's drawing
    (tmp_path / "eval" / "a1-model_final" / "vis").mkdir()
    mine = ("eval/a1-model_final/vis/my_plot.png", "inference/my_annotations/instances_val.json",
            "inference/my_backup.pth", "inference/my_labels.json", "vis/my_figure.png")
    (tmp_path / "inference" / "my_annotations").mkdir()
    for name in mine:
        Image.new("RGB", (4, 4)).save(tmp_path / name, format="PNG")
    assert is_prediction_drawing(str(tmp_path / "vis" / "0_a.png"))
    assert not is_prediction_drawing(str(tmp_path / "vis" / "my_figure.png"))
    before = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError, match=re.escape(
            f"--overwrite would delete {', '.join(mine)} in the earlier run's folders of OUTPUT_DIR "
            f"{str(tmp_path)!r}, which no run of gwdet wrote; nothing was changed.")):
        check_fresh_start(str(tmp_path), overwrite=True)
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == before
    for name in mine:
        os.unlink(tmp_path / name)
    check_fresh_start(str(tmp_path), overwrite=True)  # the drawings and the evaluators' files: the run's
    assert os.listdir(tmp_path) == []


# ---- the checkpoint a --resume takes where last_checkpoint cannot be used ---------------------------

UNUSABLE_TAGS = ["", "  \n", "../other_run/model_final.pth", "model_0000500.pth"]


@pytest.mark.parametrize("tag", UNUSABLE_TAGS)
def test_checks_of_a_resume_read_the_checkpoint_it_takes_past_an_unusable_last_checkpoint(tmp_path, tag):
    # before: an empty last_checkpoint, or one naming a file outside the folder or none there, told no
    # iteration, so a --resume past SOLVER.MAX_ITER got detectron2's "where in ParamScheduler must be in [0, 1]"
    from gwdet.engine.output_dir import check_resume_trains, resumed_iteration
    from gwdet.errors import GwdetValueError

    final = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 99}, tag=False)
    checkpoint_file(tmp_path, "model_0000049.pth", {"model": {}, "iteration": 49}, tag=False)
    (tmp_path / "last_checkpoint").write_text(tag)
    assert resumed_iteration(str(tmp_path)) == (final, 100)
    with pytest.raises(GwdetValueError, match=re.escape(
            f"--resume: the run in {str(tmp_path)!r} has trained 100 iterations (model_final.pth), more than "
            "SOLVER.MAX_ITER 50: resuming would train nothing")):
        check_resume_trains(str(tmp_path), 50)


def test_checks_of_a_resume_pass_over_a_checkpoint_that_differs_from_its_record_as_the_resume_does(tmp_path):
    # before: a tagged checkpoint that differs from its SHA-256 record told no iteration, though the resume
    # takes the previous checkpoint
    from gwdet.engine.output_dir import check_resume_trains, recorded_initial_weights, resumed_iteration
    from gwdet.checkpoint.resilient import INITIAL_WEIGHTS_KEY
    from gwdet.errors import GwdetValueError
    from gwdet.utils.atomic import record_checksum

    weights = {"path": "/weights/R-50.pkl", "sha256": "ab" * 32}
    earlier = checkpoint_file(tmp_path, "model_0000049.pth",
                              {"model": {}, "iteration": 49, INITIAL_WEIGHTS_KEY: weights}, tag=False)
    final = checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 99})
    record_checksum(final)
    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 98})  # the record is the old file's
    assert resumed_iteration(str(tmp_path)) == (earlier, 50)
    assert recorded_initial_weights(str(tmp_path)) == weights
    with pytest.raises(GwdetValueError, match=r"has trained 50 iterations \(model_0000049.pth\), more than "
                                              r"SOLVER.MAX_ITER 40"):
        check_resume_trains(str(tmp_path), 40)
    (tmp_path / "last_checkpoint").write_text("")  # the same without a name: newest first, the damaged one passed
    assert resumed_iteration(str(tmp_path)) == (earlier, 50)


def test_a_moved_schedule_is_warned_of_with_an_empty_last_checkpoint(tmp_path, caplog):
    # before: no warning, though the resume starts from the folder's own model_final.pth at iteration 3
    from gwdet.engine.output_dir import ScheduleAt, warn_of_a_moved_schedule

    checkpoint_file(tmp_path, "model_final.pth", {"model": {}, "iteration": 2})
    (tmp_path / "last_checkpoint").write_text("")
    (tmp_path / CONFIG_NAME).write_text("SOLVER:\n  MAX_ITER: 3\n")
    asked = []

    def factors(path, iteration):
        asked.append(iteration)
        return ScheduleAt(3, 5, 1.0, 0.6004)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        warn_of_a_moved_schedule(str(tmp_path), factors, max_iter_setting="SOLVER.MAX_ITER", schedule="the schedule",
                                 rate_setting="SOLVER.BASE_LR", keep="SOLVER.MAX_ITER {}", alternative=None)
    assert asked == [3]
    assert ("at the resumed iteration 3 the learning rate becomes 0.6004 x SOLVER.BASE_LR, where the run had 1 x"
            in caplog.text)


def test_an_empty_last_checkpoint_is_named_when_the_resume_tries_the_checkpoints_newest_first(tmp_path, caplog):
    # before: an empty (or blank) last_checkpoint was passed over without a word
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    checkpoint_file(tmp_path, "model_0000001.pth", {"model": {}, "iteration": 1}, tag=False)
    checkpoint_file(tmp_path, "model_0000003.pth", {"model": {}, "iteration": 3}, tag=False)
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), save_dir=str(tmp_path))
    for text in ("", " \n"):
        (tmp_path / "last_checkpoint").write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gwdet.checkpoint.resilient"):
            candidates = checkpointer.resume_candidates()
        assert [os.path.basename(path) for path in candidates] == ["model_0000003.pth", "model_0000001.pth"]
        assert (f"last_checkpoint in {tmp_path} is empty; trying the checkpoints there newest first."
                in caplog.messages)


def test_a_resume_past_the_schedule_with_an_empty_last_checkpoint_is_gwdets_refusal(finished_run, tmp_path):
    # before: detectron2's "where in ParamScheduler must be in [0, 1]: got 1.5", not gwdet's refusal
    import shutil

    from conftest import tiny_run_args
    from gwdet.engine.run import main
    from gwdet.errors import GwdetValueError

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "last_checkpoint").write_text("")
    with pytest.raises(GwdetValueError, match=re.escape(
            f"--resume: the run in {str(run)!r} has trained 2 iterations (model_final.pth), more than SOLVER.MAX_ITER "
            "1: resuming would train nothing")):
        main(tiny_run_args(run, "--resume", "SOLVER.MAX_ITER", "1"))


# ---- a run's recorded config.yaml given as --config-file of another folder --------------------------

def recorded_run(folder):
    """A run folder as a run leaves it: ``config.yaml`` with its SHA-256 record, and a checkpoint."""
    from gwdet.utils.atomic import record_checksum

    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, CONFIG_NAME)
    with open(config, "w") as file:
        file.write("MODEL:\n  DEVICE: cpu\nOUTPUT_DIR: ./elsewhere\n")
    record_checksum(config)
    make(folder, "model_final.pth")
    return config


RECORDS_REFUSALS = {
    "--resume": ("--resume", "continue the run there", "continue the run beside the config file",
                 "resume the other folder"),
    "--eval-only": ("--eval-only", "write the evaluation there", "write it beside the config file",
                    "write it elsewhere"),
    "--overwrite": ("--overwrite", "delete the run there and train anew in its place",
                    "train anew beside the config file (replacing the run there)", "train into another folder"),
    "": ("A training", "train into that folder",
         "train anew beside the config file (with --overwrite, replacing the run there)", "train into another folder"),
    "--something-else": ("A training", "train into that folder",
                         "train anew beside the config file (with --overwrite, replacing the run there)",
                         "train into another folder"),
}


@pytest.mark.parametrize("request_flag", [None, *RECORDS_REFUSALS])
def test_a_runs_recorded_config_of_another_folder_is_refused_with_what_the_request_would_do_and_the_fix(
        tmp_path, request_flag):
    """The refusal names the request, the file, both folders, what would happen and the override that
    keeps the run beside its config; without a request or setting given it is --resume's, of OUTPUT_DIR."""
    from gwdet.engine.output_dir import check_run_folder_is_the_records
    from gwdet.errors import GwdetValueError

    config = recorded_run(str(tmp_path / "copy"))
    folder, other = str(tmp_path / "copy"), str(tmp_path / "original")
    flag, outcome, beside, fix = RECORDS_REFUSALS["--resume" if request_flag is None else request_flag]
    setting = "OUTPUT_DIR" if request_flag is None else "MY.OUTPUT"
    with pytest.raises(GwdetValueError) as refusal:
        if request_flag is None:
            check_run_folder_is_the_records(config, other)
        else:
            check_run_folder_is_the_records(config, other, setting, request_flag)
    assert str(refusal.value) == (
        f"{flag} with --config-file {config}, the record of the run in {folder}, whose {setting} is another "
        f"folder, {other!r}: that would {outcome}, not beside the config file (a copy of a run keeps the "
        f"{setting} of the run it was copied from); nothing was changed. Add {setting} {folder} to "
        f"{beside}, or give {setting} on the command line to {fix}.")


def test_a_recorded_config_refuses_another_folder_only_beside_checkpoints_and_under_its_own_name(tmp_path):
    """No refusal for a recorded config.yaml beside no checkpoint (no run to continue or delete), nor
    for a recorded file of another name (the user's copy of a config), nor for the run's own folder."""
    from gwdet.engine.output_dir import check_run_folder_is_the_records
    from gwdet.utils.atomic import record_checksum

    other = str(tmp_path / "original")
    config = recorded_run(str(tmp_path / "no_checkpoints"))
    os.unlink(tmp_path / "no_checkpoints" / "model_final.pth")
    check_run_folder_is_the_records(config, other, "OUTPUT_DIR", "--overwrite")

    config = recorded_run(str(tmp_path / "renamed"))
    renamed = str(tmp_path / "renamed" / "my_config.yaml")
    os.rename(config, renamed)
    os.rename(config + ".sha256", renamed + ".sha256")
    record_checksum(renamed)
    check_run_folder_is_the_records(renamed, other, "OUTPUT_DIR", "--overwrite")

    config = recorded_run(str(tmp_path / "same"))
    check_run_folder_is_the_records(config, str(tmp_path / "same"), "OUTPUT_DIR", "--overwrite")


# ---- which files named as a run's hold what a run writes ---------------------------------------------

def test_a_drawing_below_vis_is_a_runs_file_relative_to_the_current_folder_by_default(tmp_path, monkeypatch):
    """Without a folder given, the relative path is read from the current folder."""
    from gwdet.engine.output_dir import _written_by_a_run

    make(tmp_path, "vis/drawing.png")  # empty: a drawing with nothing to lose
    monkeypatch.chdir(tmp_path)
    assert _written_by_a_run(["vis", "drawing.png"])
    assert not _written_by_a_run(["vis", "other.png"])


def test_a_file_named_in_last_checkpoint_that_holds_no_checkpoint_is_named(tmp_path):
    """The checkpoint last_checkpoint names (a checkpointer's own name) is checked as the standard names
    are: a text of the user's under it is no checkpoint, an empty file or torch.save's output is."""
    from gwdet.engine.output_dir import _not_checkpoints

    (tmp_path / "last_checkpoint").write_text("my_weights.pth")
    (tmp_path / "my_weights.pth").write_text("my notes, not weights")
    (tmp_path / "model_0000009.pth").write_text("my notes too")
    torch.save({"model": {}}, tmp_path / "model_final.pth")
    make(tmp_path, "model_0000004.pth", "other.pth")
    (tmp_path / "other.pth").write_text("not named as a checkpoint")
    names = sorted(os.listdir(tmp_path))
    assert _not_checkpoints(str(tmp_path), names) == ["model_0000009.pth", "my_weights.pth"]


def unlike(folder, name, content):
    from gwdet.engine.output_dir import _unlike_what_runs_write

    path = os.path.join(folder, name)
    with open(path, "wb") as file:
        file.write(content)
    return _unlike_what_runs_write(path)


@pytest.mark.parametrize("name, content, why", [
    ("events.out.tfevents.1700000000.host.sha256", b"my notes\n", "no SHA-256 record"),
    ("results_before_resuming_at_5.json.sha256", b"my notes\n", "no SHA-256 record"),
    ("results_before_resuming_at_5.md", b"### Results of the model\n\n| AP | AP50 |\n", None),
    ("results_before_resuming_at_5.md", b"# My results\n\n| AP |\n", "no results table as a run writes it"),
    ("config_before_resuming_at_5.yaml", b"_BASE_: base.yaml\nMODEL:\n  DEVICE: cpu\n", None),
    ("config_before_resuming_at_5.yaml", b"model:\n  x: 1\n", None),
    ("config_before_resuming_at_5.yaml", b"SOLVER:\n  MODEL: 1\n", "no run's config"),
    # only the first 64 KiB are read: a model section further on is not found
    ("config_before_resuming_at_5.yaml", b"# padding\n" * 7000 + b"MODEL:\n  DEVICE: cpu\n", "no run's config"),
    ("results_before_resuming_at_5.json", b'{"environment": {"torch": "2"}, "bbox": {}}', None),
    ("results_before_resuming_at_5.json", b'{"bbox": {}}', "no results record as a run writes it"),
    ("results_before_resuming_at_5.json", b'["environment"]', "no results record as a run writes it"),
    ("results_before_resuming_at_5.json", b'{"environment": ', "no results record as a run writes it"),
])
def test_files_named_as_a_runs_results_config_or_records_are_told_by_their_content(tmp_path, name, content, why):
    assert unlike(str(tmp_path), name, content) == why


def test_a_link_named_as_an_event_file_is_left_alone(tmp_path):
    """A link is never called the run's or not: the file it points to is not the folder's."""
    from gwdet.engine.output_dir import _unlike_what_runs_write

    (tmp_path / "target").write_bytes(b"not an event file at all")
    os.symlink(tmp_path / "target", tmp_path / "events.out.tfevents.1700000000.host")
    assert _unlike_what_runs_write(str(tmp_path / "events.out.tfevents.1700000000.host")) is None
    assert unlike(str(tmp_path), "events.out.tfevents.1700000001.host", b"not an event file at all") == (
        "no TensorBoard event file")


def test_a_file_that_cannot_be_read_is_named_with_the_systems_reason(tmp_path, monkeypatch):
    import errno

    from gwdet.engine.output_dir import _unlike_what_runs_write

    path = tmp_path / "results_before_resuming_at_5.json"
    path.write_bytes(b"{}")

    def failing(_):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os.path, "getsize", failing)
    assert _unlike_what_runs_write(str(path)) == "cannot be read: Input/output error"


def test_the_files_an_interrupted_overwrite_set_aside_are_named_four_then_dots(tmp_path):
    from gwdet.engine.output_dir import set_aside_problem
    from gwdet.utils.run_file_names import SET_ASIDE

    assert set_aside_problem(str(tmp_path)) is None
    aside = tmp_path / SET_ASIDE
    make(str(aside), "model_final.pth", "last_checkpoint", "metrics.json", "config.yaml", "log.txt")
    assert set_aside_problem(str(tmp_path)) == (
        f"an --overwrite run in {tmp_path} was stopped before training and left the earlier run's files set "
        f"aside in {aside}/ (config.yaml, last_checkpoint, log.txt, metrics.json...): the next run that takes the "
        "folder (e.g. tools/train_net.py with its config and --resume) puts them back, or name the file there.")


RUN_LOG_PREFIX = b"[01/02 03:04:05] detectron2 INFO: Rank of current process: "


@pytest.mark.parametrize("length, expected", [(200, True), (201, False)])
def test_a_runs_log_is_told_by_its_first_200_bytes(tmp_path, length, expected):
    """The first line is matched within its first 200 bytes: one whose rank runs past them is no run's."""
    from gwdet.engine.output_dir import is_a_runs_log

    digits = length - len(RUN_LOG_PREFIX) - 2  # the match ends with ". "
    (tmp_path / "log.txt").write_bytes(RUN_LOG_PREFIX + b"0" * digits + b". World size: 1\n")
    assert is_a_runs_log(str(tmp_path / "log.txt")) is expected


def test_a_log_that_cannot_be_read_is_no_runs_log(tmp_path):
    from gwdet.engine.output_dir import is_a_runs_log

    assert not is_a_runs_log(str(tmp_path / "missing.txt"))
    (tmp_path / "log.txt").mkdir()
    assert not is_a_runs_log(str(tmp_path / "log.txt"))
