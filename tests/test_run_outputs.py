"""What a run leaves for its reader: the environment results.json records (package versions,
annotation files and their SHA-256), the checks' messages held until log.txt exists, the last log
line naming where results and drawings are, and the captions of the prediction drawings."""
import hashlib
import json
import math
import os
import logging
import uuid

import numpy as np
import pytest
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.utils.logger import setup_logger

from gwdet.data import ShapesSpec, register_shapes_spec
from gwdet.engine.run_environment import annotation_files, package_versions, run_environment
from gwdet.engine.run_log import HeldRecords
from gwdet.engine.run import log_outputs, main, results_record, write_results_to
from gwdet.engine.visualize import TRUTH_CAPTION, captioned, predictions_caption, side_by_side

from conftest import DEMO_CONFIG, LAZY_CONFIG, logged_warnings, tiny_run_args

VERSION_KEYS = {"python", "gwdet", "torch", "torchvision", "detectron2", "numpy", "Pillow", "pycocotools"}
PER_TASK = {"bbox": {"AP": 12.5, "AP50": 30.0}}


# ---- the environment record ----------------------------------------------------------------------


def test_the_versions_are_those_of_the_imported_packages():
    import detectron2
    import numpy
    import PIL
    import torch
    import torchvision

    versions = package_versions()
    assert set(versions) == VERSION_KEYS
    assert versions["torch"] == torch.__version__ and versions["torchvision"] == torchvision.__version__
    assert versions["detectron2"] == detectron2.__version__ and versions["numpy"] == numpy.__version__
    assert versions["Pillow"] == PIL.__version__
    assert versions["pycocotools"][0].isdigit(), versions  # pycocotools has no __version__: its distribution's


def test_the_annotation_files_of_the_datasets_are_named_with_their_sha256(tmp_path):
    annotations = tmp_path / "mine.json"
    annotations.write_text('{"images": [], "annotations": [], "categories": []}')
    name = f"mine_{uuid.uuid4().hex[:8]}"
    register_coco_instances(name, {}, str(annotations), str(tmp_path))
    try:
        files = annotation_files([name, "never_registered", name])
        assert files == {name: {"json_file": str(annotations), "image_root": str(tmp_path),
                                "json_sha256": hashlib.sha256(annotations.read_bytes()).hexdigest()}}
        annotations.write_text('{"images": [], "annotations": [], "categories": [{"id": 1, "name": "x"}]}')
        assert annotation_files([name])[name]["json_sha256"] == hashlib.sha256(annotations.read_bytes()).hexdigest()
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_the_shapes_dataset_is_named_by_its_split_files(tmp_path):
    folder = register_shapes_spec(ShapesSpec(image_size=32, num_train=2, num_val=1, num_test=1), tmp_path)
    files = annotation_files(["shapes_train", "shapes_val"])
    for split in ("train", "val"):
        json_file = folder / f"{split}.json"
        assert files[f"shapes_{split}"] == {"json_file": str(json_file), "image_root": str(folder / split),
                                            "json_sha256": hashlib.sha256(json_file.read_bytes()).hexdigest()}


def test_results_json_holds_the_results_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AVX2")  # as `make demo` sets it
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    register_shapes_spec(ShapesSpec(image_size=32, num_train=2, num_val=1, num_test=1), tmp_path / "data")
    write_results_to(str(tmp_path), PER_TASK, ["shapes_val"], ["shapes_train"])
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["shapes_val"] == PER_TASK
    assert written["environment"] == run_environment(["shapes_train", "shapes_val"])
    assert set(written["environment"]["versions"]) == VERSION_KEYS
    assert list(written["environment"]["datasets"]) == ["shapes_train", "shapes_val"]
    cpu = written["environment"]["cpu"]
    assert cpu["cores"] == os.cpu_count() and cpu["model"] and cpu["torch_capability"] in (
        "NO AVX", "DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256")
    assert cpu["kernel_limits"]["MKL_CBWR"] == "AVX2" and cpu["kernel_limits"]["ONEDNN_MAX_CPU_ISA"] is None
    # the processes and threads, and the plan that computed GW and BW: each changes the weights' last bits
    assert (written["environment"]["processes"], written["environment"]["threads"]) == (1, torch.get_num_threads())
    monkeypatch.delenv("GWDET_GW_PLAN", raising=False)
    from gwdet.layers.plans import plan_name

    assert written["environment"]["execution_plans"] == {"cpu": "cpu", "cuda": plan_name(torch.device("cuda")),
                                                         "forced": None}
    monkeypatch.setenv("GWDET_GW_PLAN", "accelerator")
    assert run_environment([])["execution_plans"] == {"cpu": "accelerator", "cuda": "accelerator",
                                                       "forced": "accelerator"}
    checksum = (tmp_path / "results.json.sha256").read_text().split()[0]
    assert checksum == hashlib.sha256((tmp_path / "results.json").read_bytes()).hexdigest()


def test_the_norms_test_time_settings_are_test_settings_of_the_results(tmp_path):
    # --eval-only MODEL.BGN.EVAL_EXAMPLE_WEIGHT 0.0 of a run trained with 0.5: box AP 0.0036 against 0.0243, and
    # results.md's test settings read word for word like the run's own; results.json recorded none
    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    run = YacsRun(build_config(str(DEMO_CONFIG), ["MODEL.FPN.NORM", "BGN", "MODEL.BGN.EVAL_EXAMPLE_WEIGHT", "0.5"]))
    assert run.test_settings["MODEL.BGN.EVAL_EXAMPLE_WEIGHT"] == 0.5
    assert "MODEL.BGN.EVAL_EXAMPLE_WEIGHT" not in YacsRun(build_config(str(DEMO_CONFIG))).test_settings  # no BGN
    lazy = LazyRun.load(str(LAZY_CONFIG), ["model.backbone.norm.name=BGN", "model.backbone.norm.T=null",
                                           "+model.backbone.norm.eval_example_weight=0.5"])
    assert lazy.test_settings["model.backbone.norm.eval_example_weight"] == 0.5
    write_results_to(str(tmp_path), {"shapes_val": PER_TASK}, ["shapes_val"], test_settings=run.test_settings)
    assert "`MODEL.BGN.EVAL_EXAMPLE_WEIGHT 0.5`" in (tmp_path / "results.md").read_text()
    recorded = json.loads((tmp_path / "results.json").read_text())["environment"]["test_settings"]
    assert recorded == run.test_settings


def test_a_lazyconfigs_test_settings_hold_the_defaults_it_leaves_out_and_the_evaluators_detections():
    # dataloader.evaluator.max_dets_per_image=1 scored COCO's AP over one detection per image with the
    # test settings of the run without it; a box predictor's test_nms_thresh left out was not listed
    from gwdet.engine.lazy import LazyRun

    settings = LazyRun.load(str(LAZY_CONFIG), ["dataloader.evaluator.max_dets_per_image=1"]).test_settings
    assert settings["dataloader.evaluator.max_dets_per_image"] == 1
    assert settings["model.roi_heads.box_predictor.test_nms_thresh"] == 0.5  # FastRCNNOutputLayers' default
    assert settings["model.roi_heads.box_predictor.test_score_thresh"] == 0.05  # the config's, not the default 0.0
    assert "dataloader.evaluator.max_dets_per_image" not in LazyRun.load(str(LAZY_CONFIG)).test_settings


def test_a_test_dataset_named_like_the_environment_key_is_refused():
    with pytest.raises(ValueError, match="A test dataset is named 'environment'.*register the dataset under another"):
        results_record({"environment": PER_TASK})


# ---- the log -------------------------------------------------------------------------------------


def test_messages_logged_before_the_log_file_exists_reach_it(tmp_path):
    """As a run's checks do: a warning logged before detectron2's setup_logger creates log.txt is
    written there (and to the console) once it does. A logger name of this test's own stands for
    gwdet's, as in a fresh process."""
    name = f"gwdet_held_{uuid.uuid4().hex[:8]}"
    with HeldRecords(name) as held:
        logging.getLogger(f"{name}.checks").warning("--resume with config values that differ: SOLVER.MAX_ITER")
        logging.getLogger(f"{name}.checks").debug("a detail")
        setup_logger(str(tmp_path), name=name, color=False)
        held.release()
        logging.getLogger(name).info("after the set-up")
    log = (tmp_path / "log.txt").read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in log] == [
        "--resume with config values that differ: SOLVER.MAX_ITER", "a detail", "after the set-up"]
    assert "WARNING" in log[0]
    logger = logging.getLogger(name)
    assert len(logger.handlers) == 2 and logger.propagate is False  # what setup_logger made, nothing of the hold


def test_held_messages_without_a_log_set_up_are_handled_as_before(tmp_path):
    name = f"gwdet_held_{uuid.uuid4().hex[:8]}"
    logger = logging.getLogger(name)
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with pytest.raises(ValueError), HeldRecords(name):
            logging.getLogger(f"{name}.checks").warning("held")
            assert seen == []
            raise ValueError("a refused request")
        assert seen == ["held"] and logger.handlers == [handler] and logger.propagate is True
    finally:
        logger.removeHandler(handler)


def test_the_last_log_line_names_the_results_and_the_drawings(tmp_path):
    vis = tmp_path / "vis"
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("gwdet.engine.run")  # detectron2's logger set-up stops propagation above it
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        log_outputs(str(tmp_path), True, [str(vis / "000000.png"), str(vis / "000001.png")], "TEST.VIS_IMAGES",
                    test_datasets=["shapes_val"])
        log_outputs(str(tmp_path), True, [], "TEST.VIS_IMAGES")
        log_outputs(str(tmp_path), False, [], "train.vis_images")
        # two test sets: the drawings were of the first one, which the line did not say
        log_outputs(str(tmp_path), True, [str(vis / "000000.png")], "TEST.VIS_IMAGES",
                    test_datasets=["shapes_val", "shapes_test"])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert lines[0] == (f"Results: {tmp_path / 'results.md'} and results.json (with the package versions and "
                        f"dataset checksums); prediction drawings of shapes_val: {vis}/ (2 PNG files).")
    assert lines[3].endswith(f"prediction drawings of shapes_val: {vis}/ (1 PNG file); shapes_test not drawn (the "
                             "drawings are of the first test set, shapes_val).")
    assert lines[1].endswith("no prediction drawings (TEST.VIS_IMAGES is 0 or there is no test set).")
    assert lines[2] == (f"No results: nothing was evaluated (no test set); the run is in {tmp_path}; no prediction "
                        "drawings (train.vis_images is 0 or there is no test set).")


# ---- the drawings' captions ----------------------------------------------------------------------


def test_each_half_of_a_drawing_has_its_caption_above_it():
    truth = np.full((384, 384, 3), 200, np.uint8)
    predicted = np.full((384, 384, 3), 100, np.uint8)
    drawing = side_by_side(truth, predicted, 0.5)
    band = drawing.shape[0] - 384
    assert band > 12 and drawing.shape[1] == 768
    assert np.array_equal(drawing[band:, :384], truth) and np.array_equal(drawing[band:, 384:], predicted)
    for half in (drawing[:band, :384], drawing[:band, 384:]):
        assert (half == 255).mean() > 0.8 and (half < 100).any(), "a white band with dark text"
    assert np.array_equal(drawing[:band, :384], captioned(truth, TRUTH_CAPTION)[:band])
    assert predictions_caption(0.5) == "predictions, score >= 0.5"
    other = side_by_side(truth, predicted, 0.75)
    assert not np.array_equal(other[:band, 384:], drawing[:band, 384:]), "the threshold is in the caption"
    assert np.array_equal(other[:band, :384], drawing[:band, :384])


def test_the_drawings_show_and_say_the_models_own_score_threshold_above_theirs():
    # with SCORE_THRESH_TEST 0.9 (a LazyConfig's test_score_thresh 0.9) the caption still said "score >= 0.5"
    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.run import drawn_score
    from gwdet.engine.trainer import YacsRun
    from gwdet.model_zoo import build_config

    assert drawn_score(YacsRun(build_config(str(DEMO_CONFIG), ["MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.9"]))) == 0.9
    assert drawn_score(YacsRun(build_config(str(DEMO_CONFIG), ["MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.05"]))) == 0.5
    assert drawn_score(LazyRun.load(str(LAZY_CONFIG), ["model.roi_heads.box_predictor.test_score_thresh=0.9"])) == 0.9


def test_results_of_a_model_that_detected_nothing_are_said_to_be_nan(tmp_path):
    nothing = {"shapes_val": {"bbox": {"AP": float("nan"), "AP50": float("nan")}}}
    with logged_warnings("gwdet.engine.run") as logged:
        write_results_to(str(tmp_path), nothing, ["shapes_val"])
        write_results_to(str(tmp_path), {"shapes_val": {"bbox": {"AP": 1.5, "AP50": float("nan")}}}, ["shapes_val"])
    assert logged == [
        "Every AP on shapes_val is NaN (written nan in results.md, null in results.json): detectron2 reports NaN when "
        "the model detected nothing (a model early in its training, or a score threshold "
        "(MODEL.ROI_HEADS.SCORE_THRESH_TEST) above every score; no masks are scored then), or when the test set has "
        "no annotation COCO's evaluation counts (none, or every one iscrowd)."]
    # strict JSON (JavaScript's JSON.parse, jq) has no NaN: null, which the study reads back as NaN
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and json.loads(text)["shapes_val"]["bbox"] == {"AP": 1.5, "AP50": None}
    from gwdet_lab.study.run_folder import RunFolder

    assert math.isnan(RunFolder(tmp_path).results()["shapes_val"]["bbox"]["AP50"])


def test_the_score_threshold_named_is_the_runs_own():
    # a LazyConfig or RetinaNet run was told of MODEL.ROI_HEADS.SCORE_THRESH_TEST
    from gwdet.engine.run import load_run_config

    from conftest import DEMO_CONFIG, REPO

    assert load_run_config(str(DEMO_CONFIG)).score_threshold_setting == "MODEL.ROI_HEADS.SCORE_THRESH_TEST"
    retina = load_run_config(str(DEMO_CONFIG), ["MODEL.META_ARCHITECTURE", "GWRetinaNet"])
    assert retina.score_threshold_setting == "MODEL.RETINANET.SCORE_THRESH_TEST"
    lazy = load_run_config(str(REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    assert lazy.score_threshold_setting == "model.roi_heads.box_predictor.test_score_thresh"
    assert lazy.cfg.model.roi_heads.box_predictor.test_score_thresh is not None  # the setting exists


class _ReadsAGoneFile:
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 1

    def __getitem__(self, index):
        with open(self.path) as file:
            return file.read()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_file_gone_while_the_run_reads_is_named_with_the_way_on(tmp_path, workers):
    # GWDET_CACHE moved during a training: the data loader's raw FileNotFoundError traceback, twice
    import torch.utils.data

    from gwdet.engine.run import named_lost_file

    gone = tmp_path / "cache" / "shapes" / "0001.png"
    loader = torch.utils.data.DataLoader(_ReadsAGoneFile(str(gone)), num_workers=workers, batch_size=None)
    with pytest.raises(FileNotFoundError) as refused:
        with named_lost_file("The run's checkpoints are kept: continue it with --resume."):
            next(iter(loader))
    assert str(refused.value) == (
        f"A file the run reads or writes is gone ([Errno 2] No such file or directory: '{gone}'): moved or deleted "
        "while the run was working (a dataset's images, its annotation file, $GWDET_CACHE, its output folder)? Put "
        "it back (or register the dataset where it is now). The run's checkpoints are kept: continue it with "
        "--resume."
        if workers else
        f"A file the run reads or writes is gone (No such file or directory: {gone}): moved or deleted while the run "
        "was working (a dataset's images, its annotation file, $GWDET_CACHE, its output folder)? Put it back (or "
        "register the dataset where it is now). The run's checkpoints are kept: continue it with --resume.")


class _ReadsAnImage(_ReadsAGoneFile):
    def __getitem__(self, index):
        from detectron2.data.detection_utils import read_image

        return read_image(self.path, format="RGB")


@pytest.mark.parametrize("workers", [0, 1])
def test_an_image_damaged_while_the_run_reads_is_named_with_the_way_on(tmp_path, workers):
    # a cached PNG cut short during a training: 150 lines of PIL's traceback, "OSError: image file is truncated"
    import numpy as np
    import torch.utils.data
    from PIL import Image

    from gwdet.engine.run import named_lost_file

    image = tmp_path / "000000.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(image)
    image.write_bytes(image.read_bytes()[:2000])
    loader = torch.utils.data.DataLoader(_ReadsAnImage(str(image)), num_workers=workers, batch_size=None)
    with pytest.raises(OSError) as refused:
        with named_lost_file("The run's checkpoints are kept: continue it with --resume."):
            next(iter(loader))
    assert str(refused.value).startswith("An image the run reads cannot be decoded (image file is truncated"), \
        str(refused.value)
    assert str(refused.value).endswith(
        "): damaged or overwritten while the run was working (a dataset's images, $GWDET_CACHE)? The images were "
        "checked to decode when the run started. Put the intact files back (the shapes dataset is generated again "
        "where its files differ from their checksums). The run's checkpoints are kept: continue it with --resume.")
    with pytest.raises(PermissionError):  # other errors of the OS pass unchanged
        with named_lost_file("Then evaluate again."):
            raise PermissionError(13, "Permission denied", str(image))


def test_a_long_config_difference_is_shortened_in_the_another_model_warning(tmp_path):
    # a LazyConfig run's list of ResNet stages made a 3 KB warning before the one real change
    from gwdet.engine.run import SHOWN_LENGTH, load_run_config

    from conftest import DEMO_CONFIG

    run = load_run_config(str(DEMO_CONFIG))
    (tmp_path / "config.yaml").write_text("MODEL: {}\n")
    long_line = "model.backbone.bottom_up.resnet.stages: " + "[{...}] " * 400 + "-> [...]"
    run.model_differences_from = lambda path: [long_line, "model.backbone.norm.num_groups: 8 -> 4"]
    with logged_warnings("gwdet.engine.run") as logged:
        assert run._warn_of_another_model(str(tmp_path / "model_final.pth"))
    [warning] = logged
    assert f"{long_line[:SHOWN_LENGTH]} ...; model.backbone.norm.num_groups: 8 -> 4." in warning
    assert len(warning) < 2 * SHOWN_LENGTH + 300


def test_the_warnings_of_a_run_reach_its_log_and_results(tmp_path):
    # a warning of the config checks was printed before log.txt existed, among hundreds of lines:
    # SOLVER.GAMMA 10 raised the rate ten-fold with no trace in the run's files
    main(tiny_run_args(tmp_path, "SOLVER.GAMMA", "10.0", "SOLVER.STEPS", "(1,)"))
    rises = "SOLVER.GAMMA 10.0 is above 1: each step of the schedule multiplies the learning rate by it"
    assert rises in (tmp_path / "log.txt").read_text()
    warnings = (tmp_path / "results.md").read_text().split("\n## Warnings\n")[1]
    assert f"- {rises}" in warnings
    recorded = json.loads((tmp_path / "results.json").read_text())["environment"]["warnings"]
    assert any(message.startswith(rises) for message in recorded)
    assert all(f"- {message}" in warnings for message in recorded)


# with TEST.EVAL_PERIOD 2 under the writer's period of 20, the first periodic evaluation was replaced in
# the event storage by the next before any write: metrics.json and TensorBoard missed it
def test_every_periodic_evaluation_reaches_metrics_json(tmp_path):
    from types import SimpleNamespace
    from detectron2.engine.hooks import PeriodicWriter
    from detectron2.utils.events import EventStorage, JSONWriter
    from gwdet.engine.training import EvaluationWriter, writing_every_evaluation

    path = str(tmp_path / "metrics.json")
    hook = writing_every_evaluation([PeriodicWriter([JSONWriter(path)], period=20)], eval_period=2)[0]
    assert isinstance(hook, EvaluationWriter)
    hook.trainer = SimpleNamespace(max_iter=5)
    with EventStorage(0) as storage:
        for iteration in range(5):
            storage.iter, hook.trainer.iter = iteration, iteration
            if (iteration + 1) % 2 == 0 or iteration == 4:  # detectron2's EvalHook: every 2 iterations, and the last
                storage.put_scalars(**{"bbox/AP": float(iteration)}, smoothing_hint=False)
            hook.after_step()
        hook.after_train()
    with open(path) as file:
        evaluations = [(line["iteration"], line["bbox/AP"]) for line in map(json.loads, file) if "bbox/AP" in line]
    assert evaluations == [(1, 1.0), (3, 3.0), (4, 4.0)]


# INPUT.MAX_SIZE_TRAIN 1 (or MIN_SIZE_TRAIN (1,)) stopped at the first flipped image with numpy's bare
# "At least one stride in the given numpy array is negative"
@pytest.mark.parametrize("opts, named", [(["INPUT.MAX_SIZE_TRAIN", "1"], "INPUT.MAX_SIZE_TRAIN 1"),
                                         (["INPUT.MIN_SIZE_TRAIN", "(1,)"], r"INPUT.MIN_SIZE_TRAIN \(1,\)")])
def test_training_sizes_too_small_to_train_on_are_refused_before_the_model_is_built(opts, named):
    from gwdet.engine.trainer import check_training_image_sizes
    from gwdet.errors import GwdetValueError
    from gwdet.model_zoo import build_config

    cfg = build_config(DEMO_CONFIG, opts)
    with pytest.raises(GwdetValueError, match=rf"^{named} resizes the training images to less than 32 pixels a side, "
                                              r"too small to train a detector on .* at least 32 pixels"):
        check_training_image_sizes(cfg)


# INPUT.MAX_SIZE_TRAIN 64 below MIN_SIZE_TRAIN 128 trained every image at 64x64 while testing at 128, and
# INPUT.MAX_SIZE_TEST 64 below MIN_SIZE_TEST 128 evaluated every image at 64x64 while results.md led with 128, without
# a word
@pytest.mark.parametrize("overrides, warning", [
    (["INPUT.MIN_SIZE_TRAIN", "(128,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "128"],
     "INPUT.MAX_SIZE_TRAIN 64 is below INPUT.MIN_SIZE_TRAIN (128,): detectron2's resize caps the longer image side at "
     "64, so no training image's shorter side reaches more than 64 (square images train at 64x64, while testing at "
     "INPUT.MIN_SIZE_TEST 128). Set INPUT.MAX_SIZE_TRAIN to at least 128 (e.g. 213, detectron2's ratio), or lower "
     "INPUT.MIN_SIZE_TRAIN."),
    (["INPUT.MIN_SIZE_TEST", "128", "INPUT.MAX_SIZE_TEST", "64"],
     "INPUT.MAX_SIZE_TEST 64 is below INPUT.MIN_SIZE_TEST 128: detectron2's resize caps the longer image side at 64, "
     "so the test images' shorter side reaches no more than 64 (square images are evaluated at 64x64, not 128x128). "
     "Set INPUT.MAX_SIZE_TEST to at least 128 (e.g. 213, detectron2's ratio), or lower INPUT.MIN_SIZE_TEST."),
])
def test_a_max_image_size_below_the_min_image_size_is_warned_of(overrides, warning, caplog):
    from gwdet.engine.trainer import check_evaluation_values, check_training_image_sizes
    from gwdet.model_zoo import build_config

    cfg = build_config(DEMO_CONFIG, overrides)
    with caplog.at_level(logging.WARNING, logger="gwdet.engine.trainer"):
        check_training_image_sizes(cfg)
        check_evaluation_values(cfg)  # the test size, on the training and --eval-only paths alike
    assert [warning] == [r.getMessage() for r in caplog.records]


# an absolute INPUT.CROP.SIZE [300, 300] on 128-pixel shapes images never cropped, without a word
def test_an_absolute_crop_not_smaller_than_the_images_is_warned_of(caplog):
    from gwdet.engine.trainer import check_training_image_sizes
    from gwdet.model_zoo import build_config

    cfg = build_config(DEMO_CONFIG, ["INPUT.CROP.ENABLED", "True", "INPUT.CROP.TYPE", "absolute",
                                     "INPUT.CROP.SIZE", "[300, 300]", "DATASETS.SHAPES.IMAGE_SIZE", "128",
                                     "INPUT.MAX_SIZE_TRAIN", "213"])
    with caplog.at_level(logging.WARNING, logger="gwdet.engine.trainer"):
        check_training_image_sizes(cfg)
    assert [r.getMessage() for r in caplog.records] == [
        "INPUT.CROP.SIZE [300, 300] (INPUT.CROP.TYPE 'absolute') is not smaller than the 128x128 images of "
        f"{', '.join(cfg.DATASETS.TRAIN)} (DATASETS.SHAPES.IMAGE_SIZE 128): detectron2's RandomCrop, applied before "
        "the resize, keeps every image whole, so nothing is cropped. Give a crop size below 128 pixels (e.g. "
        "INPUT.CROP.SIZE [96, 96]), or INPUT.CROP.TYPE 'relative_range' with fractions, or INPUT.CROP.ENABLED False."]
    cfg = build_config(DEMO_CONFIG, ["INPUT.CROP.ENABLED", "True", "INPUT.CROP.TYPE", "absolute",
                                     "INPUT.CROP.SIZE", "[100, 300]", "DATASETS.SHAPES.IMAGE_SIZE", "128",
                                     "INPUT.MAX_SIZE_TRAIN", "213"])  # crops the height
    caplog.clear()
    check_training_image_sizes(cfg)
    assert not caplog.records


# SIGUSR1 (SLURM's --signal=USR1) and SIGXCPU (ulimit -St) killed a training by their default action: no
# checkpoint, no log line; SIGXCPU's repeats every CPU second would also have counted as a second request
@pytest.mark.parametrize("signum", ["SIGUSR1", "SIGXCPU"])
def test_sigusr1_and_sigxcpu_save_a_checkpoint_and_stop_training_saying_so(signum, caplog):
    import signal
    import types

    from gwdet.checkpoint.signal_hook import SAME_REQUEST_SECONDS, CheckpointOnSignal, TrainingInterrupted

    number = getattr(signal, signum)
    saved = []
    hook = CheckpointOnSignal()
    hook.trainer = types.SimpleNamespace(iter=30, max_iter=200, checkpointer=types.SimpleNamespace(
        save=lambda name, iteration: saved.append(name)))
    before = signal.getsignal(number)
    try:
        with caplog.at_level(logging.INFO, logger="gwdet.checkpoint.signal_hook"):
            hook.before_train()
            assert signal.getsignal(number) == hook._handle
            signal.raise_signal(number)
            if number == signal.SIGXCPU:  # the kernel's repeat, a second later: the same request
                hook._received_at -= SAME_REQUEST_SECONDS
                signal.raise_signal(number)
            with pytest.raises(TrainingInterrupted) as stopped:
                hook.after_step()
    finally:
        hook.release()
        signal.signal(number, before)
    assert saved == ["model_0000030"] and stopped.value.code == 128 + number
    assert f"Received {signum}: the current iteration finishes, a checkpoint is saved" in caplog.text
    assert f"Stopped by {signum} after iteration 30; saved model_0000030.pth. Continue with the same command and " \
           "--resume" in caplog.text


# a stop signal while the run drew its predictions (after results.json) ended the process by its default action
# without a word, and --resume then called the run "finished" though vis/ held 1 of its drawings
def test_a_stop_signal_while_drawing_is_logged_and_the_resume_says_how_to_draw(tmp_path, monkeypatch):
    import signal

    import gwdet.engine.run as run_module
    from gwdet.checkpoint.signal_hook import TrainingInterrupted
    from gwdet.errors import GwdetValueError

    drawn_first = run_module.save_prediction_pngs

    def stopped_after_the_first(cfg, model, dataset, num_images, out_dir, score):
        drawn = drawn_first(cfg, model, dataset, 1, out_dir, score)
        signal.raise_signal(signal.SIGTERM)  # as `kill -TERM` while drawing the second
        return drawn

    monkeypatch.setattr(run_module, "save_prediction_pngs", stopped_after_the_first)
    before = signal.getsignal(signal.SIGTERM)
    output = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as stopped:
        main(tiny_run_args(output, "TEST.VIS_IMAGES", "3"))
    assert stopped.value.code == 128 + signal.SIGTERM and signal.getsignal(signal.SIGTERM) == before
    vis = output / "vis"
    assert (f"Stopped by SIGTERM while drawing: 1 of 3 drawings written in {vis}{os.sep}; the results are complete "
            f"(results.md, results.json). To draw them, run the same command with --eval-only --resume: it evaluates "
            f"model_final.pth again and writes its results and its 3 drawings in {output / 'eval' / 'model_final' / 'vis'}"
            f"{os.sep}, leaving the run's own files as they are.") in (output / "log.txt").read_text()
    assert json.loads((output / "results.json").read_text())["environment"]["drawings"] == {"folder": "vis", "count": 3}
    monkeypatch.undo()
    with pytest.raises(GwdetValueError, match=r"has trained its 2 iterations \(model_final.pth\) and its results are in "
                       r"results.json, but its drawing step was stopped: .*vis/ holds 1 of the 3 prediction drawings "
                       r"it was making \(TEST.VIS_IMAGES\)\. Resuming would train nothing; nothing was changed\. To draw them, "
                       r"run the same command with --eval-only --resume"):
        main(tiny_run_args(output, "TEST.VIS_IMAGES", "3", "--resume"))
    evaluated = main(tiny_run_args(output, "TEST.VIS_IMAGES", "3", "--eval-only", "--resume"))  # the way given
    assert evaluated is not None and len(list((output / "eval" / "model_final" / "vis").glob("*.png"))) == 3


# BatchWhitening's rank warning of a run training one image per batch was printed on stderr only:
# log.txt, results.md's Warnings and the last log line's count did not have it
def test_gwdets_python_warnings_in_a_run_reach_the_gwdet_logger_and_the_runs_warnings():
    import warnings

    from gwdet.engine.run_log import RunWarnings
    from gwdet.layers.batch_whitening import BatchWhitening

    layer = BatchWhitening(16, group_size=16).train()
    hook = warnings.showwarning
    with warnings.catch_warnings(record=True) as shown, logged_warnings("gwdet") as logged:
        warnings.simplefilter("always")
        with RunWarnings() as warned:
            layer(torch.randn(1, 16, 1, 2))  # 2 samples per group of 16 channels
            torch.tensor(torch.ones(1))  # torch's own UserWarning: not gwdet's
    rank = ("BatchWhitening: 2 samples (N x H x W) per group of 16 channels in training: the group covariance has "
            "rank at most 1, so the running whitening matrix keeps up to eps^-1/2 = 316 along the 15 missing "
            "directions, and evaluation amplifies them. Train with more than 16 samples per batch, or a group_size "
            "below 2.")
    assert warned.messages == [rank] and logged == [rank]
    assert [str(warning.message) for warning in shown if "BatchWhitening" in str(warning.message)] == []
    assert [warning.category for warning in shown] == [UserWarning]  # torch's stays a Python warning
    assert "copy construct from a tensor" in str(shown[0].message)
    assert warnings.showwarning is hook


# gwdet's warnings were plain RuntimeWarnings, which a run could not tell from other packages'
def test_gwdets_warning_categories_are_the_built_in_ones_too():
    import warnings

    from gwdet.errors import GwdetRuntimeWarning, GwdetUserWarning, GwdetWarning
    from gwdet.layers.batch_whitening import BatchWhitening

    assert issubclass(GwdetRuntimeWarning, RuntimeWarning) and issubclass(GwdetRuntimeWarning, GwdetWarning)
    assert issubclass(GwdetUserWarning, UserWarning) and issubclass(GwdetUserWarning, GwdetWarning)
    layer = BatchWhitening(16, group_size=16).train()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with pytest.warns(RuntimeWarning, match=r"BatchWhitening: 2 samples \(N x H x W\) per group of 16") as shown:
            layer(torch.randn(1, 16, 1, 2))
    assert [warning.category for warning in shown] == [GwdetRuntimeWarning]


# a run training BW on one image per batch printed BatchWhitening's rank warning on stderr only:
# log.txt and results.md did not have it, and the last log line did not count it
def test_a_layers_warning_in_a_run_reaches_its_log_and_results(tmp_path):
    main(tiny_run_args(tmp_path, "MODEL.RESNETS.NORM", "BW", "SOLVER.IMS_PER_BATCH", "1"))
    rank = "per group of 16 channels in training: the group covariance has rank at most"
    assert "gwdet WARNING: BatchWhitening: " in (tmp_path / "log.txt").read_text()
    assert rank in (tmp_path / "log.txt").read_text()
    warnings = (tmp_path / "results.md").read_text().split("\n## Warnings\n")[1]
    assert f"- BatchWhitening: 16 samples (N x H x W) {rank} 15" in warnings
    recorded = json.loads((tmp_path / "results.json").read_text())["environment"]["warnings"]
    assert any(rank in message for message in recorded)
    last = (tmp_path / "log.txt").read_text().splitlines()[-1]
    assert f"gwdet warned {len(recorded)} times in this run" in last
