"""Bad input of sweep A refused before anything is built or started, naming the setting or flag,
its value, the range and the fix: LazyConfig values whose yacs twins are refused already (a
seed, loader workers, the shapes dataset, prediction drawings), LazyConfig values detectron2
asserts on (checkpoints kept, warm-up length, AMP without CUDA), overrides hydra cannot read or
whose key has an empty part; ``--threads`` above the usable CPUs, a ``--dist-url`` no process can
meet at, an empty ``GWDET_CACHE``, a shapes image size too small to hold a shape, repeated
``compare_norms.py --seeds`` / ``--batch-sizes``, and benchmark flags the run would not use."""
import dataclasses
import importlib.util
from datetime import timedelta
import os
import shutil
import subprocess
import sys
import math
from pathlib import Path

import pytest
import torch
from detectron2.config import LazyCall, LazyConfig, instantiate

from gwdet.cluster import training
from gwdet.data import shapes
from gwdet.engine.launch import check_dist_url, launch
from gwdet.engine.lazy import LazyRun
from gwdet.engine.lazy_checks import check_call_arguments
from gwdet.engine import threads
from gwdet.engine.threads import CpuLimits, choose_threads
from gwdet.errors import GwdetError, GwdetTypeError, GwdetValueError
from gwdet.model_zoo.lazy_loading import load_lazy_config
from gwdet.norms import UnknownNormError

from conftest import DEMO_CONFIG, LAZY_CONFIG, REPO



def refusal(overrides, eval_only=False) -> str:
    """The message of the refusal of the demo LazyConfig with ``overrides`` (checked as the train
    tool checks a request, before anything is built)."""
    run = LazyRun.load(str(LAZY_CONFIG), overrides)
    with pytest.raises(GwdetValueError) as refused:
        run.check_request(eval_only=eval_only, world_size=1)
    return str(refused.value)


# ---- LazyConfig values ---------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    # l_seed: detectron2's default_setup compares the seed with 0 (TypeError)
    ("train.seed=abc", "train.seed='abc': give a whole number below 2**32 (numpy's limit), e.g. train.seed=0"),
    ("train.seed=4294967296", "train.seed=4294967296: give a whole number below 2**32"),
    # l_vis: TEST.VIS_IMAGES -1 is refused in a yacs config, and was taken here as 0
    ("train.vis_images=-1", "config: train.vis_images must be an integer >= 0, got -1 (as TEST.VIS_IMAGES"),
    # l_ntrain: AssertionError "Dataset 'shapes_train' is empty!" after generating the other splits
    ("dataloader.shapes.num_train=0", "config: dataloader.shapes.num_train must be an integer >= 1, got 0"),
    # l_imgsz: numpy's "negative dimensions are not allowed"
    ("dataloader.shapes.image_size=-1", "config: dataloader.shapes.image_size must be an integer >= 1, got -1"),
    ("train.init_checkpoint=null", "train.init_checkpoint=None: give '' to start from detectron2's initialization"),
    # a raw TypeError from the run folder's checks (expected str ... not int)
    ("train.output_dir=123", "train.output_dir=123: give the run's folder as a path, e.g. train.output_dir=output/run1"),
    ("train.output_dir=null", "train.output_dir=None: give the run's folder as a path"),
    ("dataloader.shapes.image_size=4", "dataloader.shapes.image_size=4: the shapes dataset needs images of at "
                                       f"least {shapes.MIN_IMAGE_SIZE} pixels a side"),
    # model.pixel_std with a 0 ended in "Training has diverged", a pixel_mean of 2 values in torch's
    # shape error: the words of the yacs check of MODEL.PIXEL_STD / MODEL.PIXEL_MEAN
    ("model.pixel_std=[0,1,1]", "config: model.pixel_std=[0, 1, 1] holds a value <= 0"),
    ("model.pixel_mean=[1,2]", "config: model.pixel_mean=[1, 2] has 2 values, but images of "
                               "model.input_format='RGB' have 3 channels"),
    # a score threshold above 1 kept no detection (AP 0, without a word): the yacs rules' words
    ("model.roi_heads.box_predictor.test_score_thresh=1.5", "model.roi_heads.box_predictor.test_score_thresh=1.5 is "
                                                            "no score threshold (scores are in [0, 1])"),
    ("model.proposal_generator.nms_thresh=2", "model.proposal_generator.nms_thresh=2 is no NMS IoU threshold"),
    ("model.roi_heads.box_predictor.test_topk_per_image=0", "is no number of detections kept per image"),
    # no proposal, so no detection and a NaN AP
    ("model.proposal_generator.pre_nms_topk=[0,0]", "model.proposal_generator.pre_nms_topk.0=0 is no number of "
                                                    "proposals kept before NMS"),
    ("model.proposal_generator.post_nms_topk=[200,0]", "model.proposal_generator.post_nms_topk.1=0 is no number of "
                                                       "proposals kept after NMS"),
    # PIL's "height and width must be > 0" at the first test image
    ("dataloader.test.mapper.augmentations.0.max_size=-1", "dataloader.test.mapper.augmentations.0.max_size=-1 is "
                                                           "no longest image side: give an integer of at least 1"),
    ("dataloader.test.mapper.augmentations.0.short_edge_length=-3", "short_edge_length=-3: give the shorter image "
                                                                    "side as a whole number >= 0 (0: no resizing)"),
    # torch's "batch_size should be a positive integer value" at evaluation, after training
    ("dataloader.test.batch_size=0", "dataloader.test.batch_size=0: give a whole number of images of at least 1"),
    ("dataloader.evaluator.output_dir=/dev/null/inference", "dataloader.evaluator.output_dir /dev/null/inference: "
                                                            "/dev/null is a file, so no folder can be created below it"),
    # the model read images in one format while gwdet's weight checks read another
    ("model.input_format=BGR", "mapper.image_format='RGB', but model.input_format='BGR'"),
    # a test set of another seed: both register shapes_*; results.json recorded the test loader's files as training's
    ("dataloader.test.dataset.names.spec={_target_: gwdet.data.ShapesSpec, seed: 1}",
     "The config has shapes datasets of other settings, dataloader.shapes (ShapesSpec("),
])
def test_values_every_run_reads_are_refused_for_training_and_evaluation(override, message):
    assert message in refusal([override])
    assert message in refusal([override], eval_only=True)


@pytest.mark.parametrize("override, message", [
    # a boolean written no / off is hydra's text 'no', true to detectron2: a class-agnostic box regressor trained
    ("model.roi_heads.box_predictor.cls_agnostic_bbox_reg=no", "model.roi_heads.box_predictor.cls_agnostic_bbox_reg is "
     "a boolean (False), and hydra reads 'no' as the text 'no', which Python takes as true whatever it says: write "
     "model.roi_heads.box_predictor.cls_agnostic_bbox_reg=true or model.roi_heads.box_predictor.cls_agnostic_bbox_reg="
     "false."),
    ("model.roi_heads.proposal_matcher.allow_low_quality_matches=off", "is a boolean (False), and hydra reads 'off'"),
    # "cannot set list: Unsupported value type: 'Optional[Union[...QuotedString]]'": hydra's sweep of the values
    ("optimizer.lr=0.01,0.02", "an unquoted ',' makes hydra read '0.01,0.02' as a sweep over several values"),
    # quoted, the tuple was the text '(500,300)', which failed at the first iteration
    ("model.proposal_generator.pre_nms_topk=(500,300)", "Lists and tuples are written in brackets on the command "
                                                         "line: model.proposal_generator.pre_nms_topk=[500,300]"),
    # the text 'None': KeyError: 'N' at the first iteration
    ("model.roi_heads.mask_in_features=None", "hydra reads None as the text 'None'; null is written null"),
    # raw TypeError / AttributeError from the run's code (the evaluator's after every iteration had trained)
    ("dataloader.evaluator=null", "dataloader.evaluator is the evaluator of the test set, which the run builds and "
                                  "cannot go without; nothing was run"),
    ("train.checkpointer=null", "train.checkpointer is the checkpoint settings"),
    ("optimizer=null", "optimizer is the optimizer"),
    ("model=null", "model is the model"),
    # "Write +...augmentations.5.prob=... to add a new key", which then failed with "list index out of range"
    ("dataloader.train.mapper.augmentations.5.prob=0.5", "dataloader.train.mapper.augmentations is a list of 2 "
                                                         "item(s) (indices 0 to 1), which has no item 5"),
    # 80-line tracebacks when the model or loader was built
    ("model.backbone.norm={_target_: gwdet.nrm, name: GN}", "LazyConfig "
     "model.backbone.norm._target_: gwdet has no 'nrm', so 'gwdet.nrm' cannot be imported. Did you "
     "mean gwdet.norm"),
    ("model.backbone.norm._target_=gwdet.norms", "'gwdet.norms' is a module, not a callable"),
])
def test_override_values_hydra_reads_otherwise_than_meant_are_refused_as_the_config_is_read(override, message):
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY_CONFIG), [override])
    assert message in str(refused.value)


@pytest.mark.parametrize("override, message", [
    # l_nw: torch's "num_workers option should be non-negative" when the loader is built; the words
    # of the yacs check of DATALOADER.NUM_WORKERS (gwdet.config_checks)
    ("dataloader.train.num_workers=-1", "dataloader.train.num_workers=-1 is no number of data-loading processes"),
    # l_keep0: a bare AssertionError from fvcore's PeriodicCheckpointer
    ("train.checkpointer.max_to_keep=0", "train.checkpointer.max_to_keep=0: give the number of periodic checkpoints "
                                         "to keep, a whole number of at least 1"),
    ("train.checkpointer.max_to_keep=-1", "or null to keep every one"),
    # l_warm: fvcore's "where in ParamScheduler must be in [0, 1]" at the first iteration
    ("lr_multiplier.warmup_length=2", "lr_multiplier.warmup_length=2: give the fraction of train.max_iter the "
                                      "warm-up lasts, a number from 0 (no warm-up) to 1"),
    # l_amp: "[AMPTrainer] CUDA is required for AMP training!"; on the CPU it would not autocast either
    ("train.amp.enabled=True", "train.amp.enabled=True with train.device='cpu'"),
    ("model.backbone.bottom_up.freeze_at=7", "model.backbone.bottom_up.freeze_at=7 is no number of frozen backbone "
                                             "stages: give an integer of at least 0 and at most 5"),
    ("model.roi_heads.positive_fraction=1.5", "is no fraction of foreground regions"),
    # trained with loss_box_reg and loss_mask 0 throughout: detectron2 samples int(1 x 0.25) = 0 foreground regions
    ("model.roi_heads.batch_size_per_image=1", "model.roi_heads.positive_fraction=0.25 with "
                                               "model.roi_heads.batch_size_per_image=1 samples int(1 x 0.25) = 0 "
                                               "foreground regions per image"),
    ("model.proposal_generator.batch_size_per_image=1", "so the RPN's box regression loss stays 0 for the whole "
                                                        "training: give a model.proposal_generator.batch_size_per_image "
                                                        "of at least 2, or a larger "
                                                        "model.proposal_generator.positive_fraction."),
    ("lr_multiplier.warmup_method=cosine", "lr_multiplier.warmup_method='cosine' is not one of the values "
                                           "detectron2's warm-up knows"),
    ("dataloader.train.mapper.augmentations.0.max_size=0", "augmentations.0.max_size=0 is no longest image side"),
    # "Cannot find field 'gt_masks' in the given Instances!" at the first iteration
    ("dataloader.train.mapper.use_instance_mask=False", "dataloader.train.mapper.use_instance_mask=False, but the "
                                                        "model has a mask head"),
    # each parameter group's rate: torch checks the optimizer's own lr only, so -1 climbed the loss
    ("optimizer.params.base_lr=-1", "optimizer.params.base_lr=-1 is no learning rate: it must be a finite number >= 0"),
    ("optimizer.params.weight_decay=-1", "optimizer.params.weight_decay=-1 is no weight decay"),
    # fvcore's ValueErrors once the model is built
    ("lr_multiplier.scheduler.milestones=[950,800]", "lr_multiplier cannot be built: ValueError: Milestone must be "
                                                     "smaller than start epoch"),
    ("lr_multiplier.scheduler.milestones=[1200]", "lr_multiplier cannot be built: ValueError: MultiStep scheduler "
                                                  "requires a list of 2 miletones"),
    # detectron2's bare assertion: the 'range' style takes the range's two ends
])
def test_training_values_detectron2_asserts_on_are_refused_first(override, message):
    assert message in refusal([override])
    LazyRun.load(str(LAZY_CONFIG), [override]).check_request(eval_only=True, world_size=1)  # evaluation reads none


def test_an_argument_the_nodes_callable_does_not_take_is_refused_when_the_config_is_loaded():
    # instantiate stopped once the model was built: "Adam.__init__() got an unexpected keyword argument 'momentum'"
    with pytest.raises(GwdetValueError) as refused:
        LazyRun.load(str(LAZY_CONFIG), ["optimizer._target_=torch.optim.Adam"])
    message = str(refused.value)
    assert message.startswith("optimizer: Adam takes no argument 'momentum'; it takes amsgrad, betas, ")
    assert message.endswith("Remove optimizer.momentum from the config (in a .py config of your own, e.g. del "
                            "cfg.optimizer.momentum; a key=value override cannot remove a key), or set optimizer._target_ "
                            "to a callable that takes it.")
    # every argument named (the advice left out num_updates)
    with pytest.raises(GwdetValueError) as refused:
        LazyRun.load(str(LAZY_CONFIG), ["lr_multiplier.scheduler._target_=fvcore.common.param_scheduler.CosineParamScheduler"])
    assert ("Remove lr_multiplier.scheduler.values, lr_multiplier.scheduler.milestones, "
            "lr_multiplier.scheduler.num_updates from the config") in str(refused.value)


def test_hydras_positional_arguments_and_a_norm_node_without_its_channels_are_refused_when_loaded(tmp_path):
    # instantiate stopped after log.txt was written: "type 'partial' takes at least one argument", and
    # "GroupNorm.__init__() missing 1 required positional argument: 'num_channels'"
    with pytest.raises(GwdetValueError) as refused:
        LazyRun.load(str(LAZY_CONFIG), ["model.backbone.norm={_target_: functools.partial, _args_: "
                                        "[torch.nn.GroupNorm, 4]}"])
    assert str(refused.value).startswith(
        "model.backbone.norm._args_: detectron2's instantiate calls partial with keyword arguments only, and passes "
        "_args_ on as one more of them (hydra reads it as positional arguments; detectron2 does not).")
    config = tmp_path / "own.py"
    config.write_text(f"import torch\nfrom detectron2.config import LazyCall as L, LazyConfig\n"
                      f"_base = LazyConfig.load({str(LAZY_CONFIG)!r})\n"
                      "model, dataloader, optimizer, lr_multiplier, train = (_base.model, _base.dataloader, "
                      "_base.optimizer, _base.lr_multiplier, _base.train)\n"
                      "model.backbone.norm = L(torch.nn.GroupNorm)(num_groups=4)\n")
    with pytest.raises(GwdetValueError) as refused:
        LazyRun.load(str(config))
    assert str(refused.value) == (
        "model.backbone.norm: instantiating it calls GroupNorm without its required argument(s) 'num_channels'. A "
        "norm argument takes a name detectron2's get_norm knows, a callable of the channel count, or a node that "
        "builds one: L(gwdet.norm)(name=..., ...), e.g. L(gwdet.norm)(name='GN', num_groups=4) for torch's "
        "GroupNorm of 4 groups.")


@pytest.mark.parametrize("key", ["dataloader.test.dataset.names", "dataloader.train.dataset.names"])
def test_a_lazy_config_naming_an_unregistered_dataset_is_refused_before_training(key):
    # the test set failed with a raw KeyError after the whole training; the training set's failure blamed the model
    evaluated = ["dataloader.evaluator.dataset_name=mine_unregistered"] if key.startswith("dataloader.test") else []
    run = LazyRun.load(str(LAZY_CONFIG), [f"{key}=mine_unregistered", *evaluated])
    with pytest.raises(KeyError, match=r"Dataset 'mine_unregistered' is not registered. Register your own COCO-format "
                                       r"data with --register-coco mine_unregistered="):
        run.prepare_datasets(trains=True, evaluates=True)


@pytest.mark.parametrize("override, message", [
    ("dataloader.train.dataset.names=[a,b]", "The LazyConfig overrides cannot set dataloader.train.dataset.names: "
     "Cannot merge DictConfig with ListConfig. dataloader.train.dataset.names holds a node (an L(...) call or a "
     "mapping), which a list cannot replace: set its keys (dataloader.train.dataset.names.KEY=VALUE), give it a node "
     "of its own (dataloader.train.dataset.names={_target_: ..., ...}), or a single value "
     "(dataloader.train.dataset.names=VALUE; a dataset's names take one name so)."),
    ("train.seed=${nope.x}", "LazyConfig override 'train.seed=${nope.x}' cannot be resolved: Interpolation key "
     "'nope.x' not found. An interpolation ${...} must name a key of the config."),
])
def test_an_override_omegaconf_cannot_apply_or_resolve_is_named(override, message):
    # omegaconf's traceback (a list for a node), or an error only when the run read the value
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY_CONFIG), [override])
    assert str(refused.value).startswith(message)


def test_an_override_below_a_norm_given_by_its_name_says_to_give_a_node(tmp_path):
    # conv_norm='GN' then conv_norm.num_groups=8: detectron2's raw KeyError ("... is not a config, but has type str");
    # the "+key" advice for a string norm of the file led to the same
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    norm = "model.backbone.bottom_up.resnet.stem.norm"
    with pytest.raises(ValueError, match=rf"^LazyConfig override '{norm}.num_groups': '{norm}' holds the value 'GN', not "
                                         rf"a node of keys, so nothing can be set under it: give {norm} a node of its "
                                         rf"own that holds the value, e.g. {norm}=\{{_target_: gwdet.norm, name: GN, "
                                         r"num_groups: ...\}, or set"):
        load_lazy_config(str(LAZY_CONFIG), [f"{norm}=GN", f"{norm}.num_groups=8"])
    config = tmp_path / "named.py"
    config.write_text(f"from detectron2.config import LazyConfig\n_base = LazyConfig.load({str(LAZY_CONFIG)!r})\n"
                      f"globals().update(_base)\n{norm} = 'GN'\n")
    for key in (f"{norm}.num_groups", f"+{norm}.num_groups"):
        with pytest.raises(ValueError, match=rf"'{norm}' holds the value 'GN', not a node of keys"):
            load_lazy_config(str(config), [f"{key}=8"])
    # a number set on the command line before: its value, and no norm node to suggest
    with pytest.raises(ValueError, match=r"'train.max_iter' holds the value 2, not a node of keys, so nothing can be set "
                                         r"under it: set train.max_iter itself.$"):
        load_lazy_config(str(LAZY_CONFIG), ["train.max_iter=2", "train.max_iter.foo=1"])


def test_a_mapping_override_is_checked_key_by_key():
    # train={max_itr:3} added the misspelt key without a word, where train.max_itr=3 was refused
    with pytest.raises(GwdetValueError, match=r"LazyConfig override 'train.max_itr': the config has no 'max_itr' under "
                                              r"'train'. Did you mean 'train.max_iter'\?"):
        load_lazy_config(str(LAZY_CONFIG), ["train={max_itr:3}"])
    assert load_lazy_config(str(LAZY_CONFIG), ["train={max_iter:3}"]).train.max_iter == 3


def test_detectron2s_own_lazy_configs_pass_the_argument_check():
    # found without importing detectron2.model_zoo, which imports pkg_resources
    folder = Path(importlib.util.find_spec("detectron2").submodule_search_locations[0]) / "model_zoo" / "configs"
    configs = [path for path in folder.rglob("*.py") if "common" not in path.parts]
    assert len(configs) > 10
    for path in configs:
        check_call_arguments(LazyConfig.load(str(path)))


def test_a_schedule_of_another_kind_that_cannot_be_built_gets_no_multi_step_advice():
    from fvcore.common.param_scheduler import StepParamScheduler

    cfg = load_lazy_config(str(LAZY_CONFIG))
    cfg.lr_multiplier.scheduler = LazyCall(StepParamScheduler)(num_updates=10, values=[])
    with pytest.raises(GwdetValueError) as refused:
        LazyRun(cfg).check_request(eval_only=False, world_size=1)
    assert str(refused.value) == (
        "lr_multiplier cannot be built: ValueError: Step scheduler requires a list of at least one param value. Fix "
        "the lr_multiplier values the message names (lr_multiplier.scheduler builds StepParamScheduler: give it "
        "values that class accepts).")


@pytest.mark.parametrize("overrides, error, message", [
    # found only when the model was built, after default_setup had written config.yaml and log.txt
    (["model.backbone.norm.name=GWW"], UnknownNormError, "model.backbone.norm: Unknown norm name 'GWW'. Known names: "),
    (["model.roi_heads.box_head.conv_norm.num_groups=0"], GwdetValueError,
     "model.roi_heads.box_head.conv_norm: gwdet.norm: num_groups of norm 'GW' must be an integer >= 1, got 0"),
    (["model.backbone.norm.T=3", "model.backbone.norm.groups=8"], GwdetTypeError,
     "model.backbone.norm: gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not ['groups']"),
    # detectron2's get_norm raised a bare KeyError: 'GWW' when the model was built
    (["model.backbone.norm=GWW"], UnknownNormError,
     "model.backbone.norm='GWW' is not a norm name. detectron2's get_norm builds BN, FrozenBN, GN, LN, SyncBN, "
     "naiveSyncBN, naiveSyncBN_N, nnSyncBN (or '' for none) from a name; gwdet's norms need their settings"),
    (["model.roi_heads.mask_head.conv_norm=GW"], GwdetValueError,
     "model.roi_heads.mask_head.conv_norm='GW': detectron2's get_norm builds only its own names from a string; "
     "give L(gwdet.norm)(name='GW', ...)"),
])
def test_a_lazy_configs_norms_are_checked_when_it_is_loaded(overrides, error, message):
    with pytest.raises(error) as refused:
        LazyRun.load(str(LAZY_CONFIG), overrides)
    assert str(refused.value).startswith(message)


# the override given to load_lazy_config and the model built with gwdet.engine.lazy.build_model in Python: detectron2's
# bare KeyError: 'GW' (the train tool's refusal came from its loading only)
def test_a_lazy_configs_norms_are_checked_when_gwdet_builds_its_model_from_python():
    from gwdet.engine.lazy import build_model

    cfg = load_lazy_config(str(LAZY_CONFIG), ["model.roi_heads.mask_head.conv_norm=GW"])
    with pytest.raises(GwdetValueError, match=r"^model.roi_heads.mask_head.conv_norm='GW': detectron2's get_norm "
                                              r"builds only its own names from a string"):
        build_model(cfg)


def test_a_lazy_norm_node_switched_to_a_norm_without_its_values_names_the_way_out():
    # "gwdet.norm('GW_ZCA') takes ['num_groups', 'eps'], not ['T']" with no way out: an override
    # cannot delete GW's T; set to null it is left out
    with pytest.raises(GwdetTypeError) as refused:
        LazyRun.load(str(LAZY_CONFIG), ["model.backbone.bottom_up.norm.name=GW_ZCA"])
    assert str(refused.value) == (
        "model.backbone.bottom_up.norm: gwdet.norm('GW_ZCA') takes ['num_groups', 'eps'], not ['T']. An override "
        "keeps the node's other values; set those the norm does not take to null to leave them out: "
        "model.backbone.bottom_up.norm.T=null")
    run = LazyRun.load(str(LAZY_CONFIG), ["model.backbone.bottom_up.norm.name=GW_ZCA",
                                          "model.backbone.bottom_up.norm.T=null"])  # the advice works as given
    model = instantiate(run.cfg.model)
    assert {m.method for n, m in model.named_modules() if type(m).__name__ == "GroupWhitening"
            and n.startswith("backbone.bottom_up.")} == {"zca"}
    with pytest.raises((GwdetTypeError, GwdetValueError)):  # null for a value the norm takes is refused
        LazyRun.load(str(LAZY_CONFIG), ["model.backbone.bottom_up.norm.num_groups=null"])


def test_norm_names_detectron2_builds_pass_the_load_check():
    run = LazyRun.load(str(LAZY_CONFIG), ["model.backbone.norm=BN", "model.roi_heads.box_head.conv_norm=''"])
    assert run.cfg.model.backbone.norm == "BN"


def test_optimizer_parameter_values_of_none_take_the_optimizers_own():
    LazyRun.load(str(LAZY_CONFIG), ["optimizer.params.base_lr=null", "optimizer.params.weight_decay=null"]
                 ).check_request(eval_only=False, world_size=1)


def test_a_training_resize_range_takes_its_two_ends():
    resize = "dataloader.train.mapper.augmentations.0"
    assert "(sample_style='range', ResizeShortestEdge's default, takes exactly two: the range's ends)" in refusal(
        [f"{resize}.short_edge_length=[64,80,96]", f"{resize}.sample_style=range"])  # detectron2's bare assertion
    LazyRun.load(str(LAZY_CONFIG), [f"{resize}.short_edge_length=[64,96]", f"{resize}.sample_style=range"]
                 ).check_request(eval_only=False, world_size=1)
    # from high to low: numpy's bare "low >= high" at the first iteration
    assert f"{resize}.short_edge_length=[96, 64] is a range from its larger end: with sample_style='range' give the " \
           "ends from low to high, [64, 96]." in refusal([f"{resize}.short_edge_length=[96,64]",
                                                        f"{resize}.sample_style=range"])


def test_the_warm_up_refusal_converts_iterations_into_the_fraction():
    assert "for a warm-up of 2 iterations of train.max_iter=1000, lr_multiplier.warmup_length=0.002" in refusal(
        ["lr_multiplier.warmup_length=2"])


def test_the_values_these_checks_allow_pass():
    LazyRun.load(str(LAZY_CONFIG), ["train.seed=-1", "train.checkpointer.max_to_keep=null",
                                    "lr_multiplier.warmup_length=0", "dataloader.train.num_workers=0",
                                    f"dataloader.shapes.image_size={shapes.MIN_IMAGE_SIZE}",
                                    "train.vis_images=0"]).check_request(eval_only=False, world_size=1)
    LazyRun.load(str(LAZY_CONFIG), ["train.checkpointer.max_to_keep=3"]).check_request(eval_only=False, world_size=1)


# ---- LazyConfig overrides ------------------------------------------------------------------------

def test_an_override_hydra_cannot_read_is_named_with_the_fix():
    # l_eq2: hydra's OverrideParseException traceback
    with pytest.raises(GwdetValueError, match=r"LazyConfig override 'train.max_iter==3' cannot be read "
                                              r"\(extraneous input '='\)\. Did you mean train.max_iter=3\?"):
        load_lazy_config(str(LAZY_CONFIG), ["train.max_iter==3"])
    with pytest.raises(GwdetValueError, match=r"'train.output_dir=a=b' cannot be read .*quote a value"):
        load_lazy_config(str(LAZY_CONFIG), ["train.output_dir=a=b"])
    assert load_lazy_config(str(LAZY_CONFIG), ["train.output_dir='a=b'"]).train.output_dir == "a=b"


def test_the_train_tool_prints_the_unreadable_override_on_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        training.run(["--config-file", str(LAZY_CONFIG), "--threads", "1", "train.max_iter==3"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert "error: LazyConfig override 'train.max_iter==3' cannot be read" in err, err


@pytest.mark.parametrize("override, meant", [("train..max_iter=3", "train.max_iter=3"),
                                             ("+train.extra.=1", "+train.extra=1")])
def test_a_key_with_an_empty_part_is_named_as_such(override, meant):
    # l_dots: was "the config has no '' under 'train' ... Write +train..max_iter=... to add a new key"
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY_CONFIG), [override])
    message = str(refused.value)
    assert "has an empty part" in message and f"e.g. {meant}" in message and "to add a new key" not in message


@pytest.mark.parametrize("override, message", [
    # the only fix offered was +MODEL.WEIGHTS=..., which then trained from scratch without a word
    ("MODEL.WEIGHTS=/x.pth", "the config has no 'MODEL' at the top of the config. MODEL.WEIGHTS is a yacs config's "
                             "key; a LazyConfig sets it as train.init_checkpoint=..."),
    ("+MODEL.WEIGHTS=/x.pth", "'+MODEL.WEIGHTS' adds 'MODEL' at the top of the config, which nothing reads: the run "
                              "would go on as without it. MODEL.WEIGHTS is a yacs config's key; a LazyConfig sets it "
                              "as train.init_checkpoint=..."),
    ("SOLVER.GAMMA=0.1", "SOLVER.* are a yacs config's keys, which a LazyConfig does not read"),
    ("+extra.value=1", "'+extra.value' adds 'extra' at the top of the config, which nothing reads"),
    ("trian.max_iter=3", "the config has no 'trian' at the top of the config. Did you mean 'train'?"),
])
def test_yacs_keys_and_new_top_nodes_given_to_a_lazyconfig_are_refused_naming_its_settings(override, message):
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY_CONFIG), [override])
    assert message in str(refused.value) and "Write +" not in str(refused.value)
    assert load_lazy_config(str(LAZY_CONFIG), ["+train.note=1"]).train.note == 1  # under a node: added


# ---- --threads, --dist-url -----------------------------------------------------------------------

def test_a_thread_count_far_above_the_usable_cpus_is_refused_and_a_few_more_are_said():
    two = CpuLimits(2, None, None)
    with pytest.raises(GwdetValueError) as refused:
        choose_threads(100000, environ={}, limits=lambda: two)
    assert str(refused.value).startswith("--threads 100000 is more than 16 times the 2 CPUs this process may use "
                                         "(affinity mask 2)") and "give --threads 2 or fewer" in str(refused.value)
    assert choose_threads(2, environ={}, limits=lambda: two).reason == "--threads"
    more = choose_threads(8, environ={}, limits=lambda: two)  # another machine's count, repeated here
    assert more.threads == 8 and "more than the 2 CPUs this process may use" in more.reason


def test_thread_limits_that_cannot_be_read_do_not_block_threads_n():
    # the limits' own error says "choose the thread count with --threads N": N up to the CPUs here works
    assert choose_threads(1, environ={"SLURM_CPUS_PER_TASK": "two"}).threads == 1


def test_the_train_tool_refuses_a_huge_thread_count_before_starting(capsys, monkeypatch):
    # threads_huge: MemoryError (or a crash) while starting the threads; nothing is started here
    started = []
    monkeypatch.setattr(threads, "apply_threads", lambda choice: started.append(choice))
    monkeypatch.setattr(training, "launch", lambda *args, **kwargs: started.append("launch"))
    with pytest.raises(SystemExit) as stop:
        training.run(["--config-file", str(DEMO_CONFIG), "--threads", "100000"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "error: --threads 100000 is more than 16 times the" in err, err
    assert not started


def never_called() -> None:
    raise AssertionError("no process should start")


def test_a_dist_url_no_process_can_meet_at_is_refused_before_any_starts(monkeypatch, tmp_path):
    # distbad: torch's "No rendezvous handler for foo://" from every started process
    with pytest.raises(GwdetValueError, match=r"--dist-url 'foo://bar' is not an address the processes can meet "
                                              r"at: give tcp://HOST:PORT .*file:///PATH.*env://.* or auto"):
        launch(never_called, 2, dist_url="foo://bar")
    for url in ("tcp://host", "tcp://127.0.0.1:port", "file://", "127.0.0.1:29500"):
        with pytest.raises(GwdetValueError, match="--dist-url"):
            check_dist_url(url)
    for port in ("99999", "0"):  # the generic refusal named a form the address had
        with pytest.raises(GwdetValueError, match=rf"^--dist-url 'tcp://127.0.0.1:{port}': port {port} is outside "
                                                  r"the ports there are \(1 to 65535\): give a free port in that range"):
            check_dist_url(f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for url in ("tcp://127.0.0.1:29500", f"file://{tmp_path}/rendezvous", "env://", "auto", None):
        check_dist_url(url)
    # env:// without its variables, a file rendezvous left by an earlier run (it hung for minutes): named first
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(GwdetValueError, match=r"--dist-url env:// reads the address from MASTER_ADDR and MASTER_PORT, "
                                              r"and MASTER_PORT is not set: export them"):
        check_dist_url("env://")
    (tmp_path / "rendezvous").write_text("left by an earlier run")
    with pytest.raises(GwdetValueError, match=r"the file exists, left by an earlier run, and torch's file rendezvous "
                                              r"needs a new one"):
        check_dist_url(f"file://{tmp_path}/rendezvous")
    # a file in a folder that does not exist: both processes started, then torch's raw DistStoreError
    with pytest.raises(GwdetValueError, match=rf"--dist-url file://{tmp_path}/nope/rdv: the folder {tmp_path}/nope "
                                              r"does not exist, so torch's file rendezvous cannot create the file"):
        check_dist_url(f"file://{tmp_path}/nope/rdv")
    # several machines meet at the first one's tcp:// address, which the others wait for: file:// was refused on
    # rank 1 only, and rank 0 waited without end
    with pytest.raises(GwdetValueError, match=r"several machines meet at tcp://HOST:PORT, the address of the first"):
        check_dist_url(f"file://{tmp_path}/rendezvous", num_machines=2)
    # torch's raw int() error, and its port range, from every started process
    monkeypatch.setenv("MASTER_PORT", "abc")
    for port in ("abc", "99999"):
        monkeypatch.setenv("MASTER_PORT", port)
        with pytest.raises(GwdetValueError, match=rf"^--dist-url env:// reads the port from MASTER_PORT, which is "
                                                  rf"'{port}': export a free port from 1 to 65535"):
            check_dist_url("env://")
    # a host that names no address (32 s, then "could not meet the others"), and one of another machine for a
    # one-machine run (torch retried the connection for 300 s)
    with pytest.raises(GwdetValueError, match=r"^--dist-url tcp://999.1.1.1:29561: the host '999.1.1.1' names no "
                                              r"address \(it resolves to none: "):
        check_dist_url("tcp://999.1.1.1:29561")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("MASTER_ADDR", "999.1.1.1")
    with pytest.raises(GwdetValueError, match=r"^MASTER_ADDR: the host '999.1.1.1' names no address"):
        check_dist_url("env://")
    with pytest.raises(GwdetValueError, match=r"^--dist-url tcp://192.0.2.1:29535: the host '192.0.2.1' is not an "
                                              r"address of this machine, and a one-machine run's processes all run "
                                              r"here: give 127.0.0.1"):
        check_dist_url("tcp://192.0.2.1:29535")
    check_dist_url("tcp://192.0.2.1:29535", num_machines=2)  # the first machine's address, on another machine
    check_dist_url("tcp://localhost:29535")


def test_a_port_another_program_listens_on_is_named(capsys):
    # "could not meet the others ... start every machine with the same --dist-url": the fix is another port
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(GwdetError, match=rf"another program already listens on port {port} of 127.0.0.1, so the "
                                             r"processes cannot meet there\. Give another port"):
            launch(never_called, 2, dist_url=f"tcp://127.0.0.1:{port}", rendezvous_timeout=timedelta(seconds=10))
        # a second "machine" started as machine 0 of a run whose machine 0 listens there: "give another port" made
        # two runs that each waited for a machine 1
        with pytest.raises(GwdetError, match=rf"another program already listens on port {port} of 127.0.0.1, so the "
                                             r"processes cannot meet there\. It may be the first machine of this run, "
                                             r"started already with --machine-rank 0: start this machine with its own "
                                             r"--machine-rank \(1\); else give another port"):
            launch(never_called, 1, num_machines=2, dist_url=f"tcp://127.0.0.1:{port}",
                   rendezvous_timeout=timedelta(seconds=10))


# ---- the shapes dataset ----------------------------------------------------------------------------

def test_an_empty_cache_variable_is_the_default_cache(monkeypatch):
    # cache_empty: the dataset went into the current folder (Path(""))
    monkeypatch.setenv("GWDET_CACHE", "")
    assert shapes.default_cache_root() == Path.home() / ".cache" / "gwdet"
    message = shapes._unwritable_root_message(Path("/ro"), None, PermissionError(13, "Permission denied", "/ro"))
    assert "the default cache folder '/ro', as GWDET_CACHE is empty" in message, message
    # a full disk is writable: "Point GWDET_CACHE at a writable directory" named the wrong problem
    full = shapes._unwritable_root_message(Path("/full"), None, OSError(28, "No space left on device", "/full/x"))
    assert full.endswith("Free space there (its disk or quota is full), or: point GWDET_CACHE at a writable directory, "
                         "e.g. export GWDET_CACHE=/tmp/gwdet-cache."), full


def test_a_file_size_limit_is_named_as_the_cause_when_the_dataset_is_generated(tmp_path):
    # ulimit -f: "Point GWDET_CACHE at a writable directory", though the folder is writable and no other would do
    script = ("import resource, sys\n"
              "from gwdet.data.shapes import ShapesSpec, ensure_generated\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))\n"
              "ensure_generated(ShapesSpec(image_size=64, num_train=2, num_val=2, num_test=2), sys.argv[1])\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1].endswith(
        "A limit on the size of the files this process may write stops it (the shell's ulimit -f): raise or lift it "
        "(ulimit -f unlimited), then run again."), done.stderr[-2000:]


def test_an_image_size_too_small_for_a_shape_is_refused_before_generating(tmp_path):
    # imgsz4: "None of the images of shapes_train has an annotation ... check the json's annotations"
    from detectron2.config import get_cfg

    from gwdet import add_gwdet_config

    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.ROOT = 4, str(tmp_path / "shapes")
    with pytest.raises(GwdetValueError) as refused:
        shapes.register_shapes(cfg)
    assert str(refused.value).startswith("DATASETS.SHAPES.IMAGE_SIZE=4: the shapes dataset needs images of at least "
                                         f"{shapes.MIN_IMAGE_SIZE} pixels a side")
    assert not (tmp_path / "shapes").exists()


@pytest.mark.parametrize("size", [64.0, "64"])
def test_an_image_size_that_is_not_an_integer_is_named_as_such(tmp_path, size):
    # 64.0 and "64" got the long explanation of images too small to hold a shape
    from detectron2.config import get_cfg

    from gwdet import add_gwdet_config

    with pytest.raises(GwdetValueError) as refused:
        shapes.ShapesSpec(image_size=size)
    kind = type(size).__name__
    assert str(refused.value) == (
        f"the ShapesSpec's image_size={size!r} ({kind}): the image side is a number of pixels, an integer of at least "
        "10, e.g. 64 (the demo's images are 128 pixels a side).")
    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.ROOT = size, str(tmp_path / "shapes")
    with pytest.raises(GwdetValueError, match=rf"^DATASETS.SHAPES.IMAGE_SIZE={size!r} \({kind}\): the image side"):
        shapes.register_shapes(cfg)


def test_a_shapes_spec_of_numpy_integers_holds_python_integers():
    # np.int64 passed the spec's checks, then json.dumps of the cache key raised a raw TypeError
    import numpy as np

    spec = shapes.ShapesSpec(image_size=np.int32(32), num_train=np.int64(4), num_val=np.int64(2), seed=np.uint8(3),
                             num_test=np.int64(2))
    assert spec == shapes.ShapesSpec(image_size=32, num_train=4, num_val=2, seed=3, num_test=2)
    assert all(type(value) is int for value in dataclasses.asdict(spec).values())
    assert spec.cache_key() == shapes.ShapesSpec(image_size=32, num_train=4, num_val=2, seed=3, num_test=2).cache_key()


def test_registering_shapes_of_a_config_without_gwdets_keys_says_how_to_add_them():
    # a raw AttributeError: SHAPES
    from detectron2.config import get_cfg

    with pytest.raises(KeyError, match=r"gwdet.data.register_shapes needs gwdet's config keys \(MODEL.GW.\*, ...\), "
                                       r"but the config has none: call gwdet.add_gwdet_config\(cfg\)"):
        shapes.register_shapes(get_cfg())


def test_the_smallest_image_size_is_where_the_largest_shape_covers_the_visible_area():
    largest_area = lambda size: math.pi * (shapes.MAX_RADIUS_FRACTION * size) ** 2  # a circle, the largest class
    assert largest_area(shapes.MIN_IMAGE_SIZE - 1) < shapes.MIN_VISIBLE_AREA <= largest_area(shapes.MIN_IMAGE_SIZE)
    assert not any(shapes.render_image(0, "train", index, 4)[1] for index in range(30))
    assert any(shapes.render_image(0, "train", index, shapes.MIN_IMAGE_SIZE)[1] for index in range(30))


# ---- compare_norms.py, benchmark.py ----------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--study", "paper", "--seeds", "0", "0", "1"], "--seeds gives 0 more than once"),
    (["--study", "batch-sweep", "--batch-sizes", "2", "2"], "--batch-sizes gives 2 more than once"),
    # the weights were ignored without a word
    # train_net's words followed: "or a negative one", which the study refuses
    (["--study", "paper", "--seeds", "4294967296"], "--seeds 4294967296: give seeds from 0 to 2**32 - 1 = 4294967295"),
    (["--study", "paper", "--seeds", "0", "--example-weights", "0.5", "--no-example-weighing"],
     "--example-weights chooses among weights that --no-example-weighing skips: give one of them."),
])
def test_a_repeated_seed_or_batch_size_is_named(capsys, tmp_path, flags, message):
    from gwdet_lab.study import cli

    with pytest.raises(SystemExit) as stop:
        cli.main([*flags, "--list", "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "NAME=CONFIG" not in err, err
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("flags, message", [
    (["--layers", "--quick", "--amp", "fp16"], "--amp fp16 applies to the model level (--models) only"),
    (["--layers", "--quick", "--section", "mine"], "--section mine: it names the section of --out"),
    (["--models", "--image-size", "0"], "argument --image-size: give an integer of at least 32, got '0'"),
    # before: run, with the report's Command line showing flags that never applied
    (["--layers", "--quick", "--model-opts", "SOLVER.MAX_ITER", "3", "--image-size", "64"],
     "--model-opts and --image-size apply to the model level (--models) only, which this run does not measure "
     "(--layers). Add that level, or leave --model-opts and --image-size out."),
    (["--op-counts", "--model-repeats", "2"], "--model-repeats applies to the model and inference levels (--models, "
                                              "--inference) only"),
    # before: the choices joined by ", " while one of them holds ", "
    (["--norms", "GW"], "--norms: unknown 'GW'; choose from 'conv 3x3', "),
    # layer-level flags in a run without the layer level, shown in the report's Command line as if applied
    (["--models", "--quick", "--compile"], "--compile applies to the layer level (--layers) only"),
    (["--inference", "--quick", "--norms", "BN"], "--norms applies to the layer level (--layers) only"),
    (["--op-counts", "--repeats", "2"], "--repeats applies to the layer and inference levels (--layers, --inference) "
                                        "only"),
    # the one layer asked for dropped without a word; a compiled case called unknown
    (["--layers", "--quick", "--norms", "GW (itn), autograd", "--no-autograd-gw"],
     "--norms asks for 'GW (itn), autograd', which --no-autograd-gw leaves out: give one of them."),
    (["--layers", "--quick", "--norms", "GW (itn), compiled"],
     "--norms: 'GW (itn), compiled' time(s) torch.compile of a layer, which only --compile adds"),
])
def test_benchmark_flags_the_run_would_not_use_or_cannot_measure_are_refused(capsys, flags, message):
    from gwdet_lab.benchmark.cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(flags)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_benchmark_out_must_be_a_markdown_text_file_before_the_benchmark_runs(tmp_path, capsys):
    # a script given as --out got a markdown section appended (and no longer ran); a binary file
    # ended in UnicodeDecodeError once the whole benchmark had run
    from gwdet_lab.benchmark.cli import parse_args

    script = tmp_path / "tool.py"
    script.write_text("print('mine')\n")
    binary = tmp_path / "notes.md"
    binary.write_bytes(b"\xff\xfe\x00binary")
    for out, message in ((script, f"--out {script}: the tables go into a markdown file (.md)"),
                         (binary, f"--out {binary} is not UTF-8 text: give a markdown file")):
        with pytest.raises(SystemExit) as stop:
            parse_args(["--layers", "--quick", "--out", str(out)])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert script.read_text() == "print('mine')\n"


def test_benchmark_section_defaults_to_main_with_out(tmp_path):
    from gwdet_lab.benchmark.cli import parse_args

    assert parse_args(["--layers", "--out", str(tmp_path / "b.md")]).section == "main"
    assert parse_args(["--amp", "bf16", "--image-size", "32"]).models  # every level, the model level too


@pytest.mark.parametrize("override, message", [
    # lo_ncls: trained and evaluated a 3-class model on the 4 shapes categories without a word
    ("model.roi_heads.num_classes=3", "model.roi_heads.num_classes=3, but dataset 'shapes_train' has 4 categories"),
    # nc_c: a box predictor of 5 classes for the 4 shapes trained, then the evaluation died with an IndexError
    ("model.roi_heads.box_predictor.num_classes=5", "model.roi_heads.box_predictor.num_classes=5, but "
                                                    "model.roi_heads.num_classes=4: the heads would predict other"),
    ("model.roi_heads.mask_head.num_classes=3", "model.roi_heads.mask_head.num_classes=3, but "
                                                "model.roi_heads.num_classes=4"),
    # lo_evalname: scored the predictions on shapes_val's images against shapes_test's annotations
    ("dataloader.evaluator.dataset_name=shapes_test", "dataloader.evaluator.dataset_name='shapes_test', but "
                                                      "dataloader.test.dataset.names is 'shapes_val'"),
])
def test_a_lazy_configs_class_count_and_evaluated_dataset_must_fit_its_datasets(override, message):
    run = LazyRun.load(str(LAZY_CONFIG), [override])
    with pytest.raises(GwdetValueError, match=message.replace("(", r"\(")):
        run.prepare_datasets(trains=True, evaluates=True)
    LazyRun.load(str(LAZY_CONFIG)).prepare_datasets(trains=True, evaluates=True)


def test_a_class_agnostic_mask_head_of_a_lazy_config_is_taken():
    # one mask channel is detectron2's class-agnostic mask head (CLS_AGNOSTIC_MASK True in yacs, which trains):
    # refused as a class count other than the model's
    LazyRun.load(str(LAZY_CONFIG), ["model.roi_heads.mask_head.num_classes=1"]).prepare_datasets(
        trains=True, evaluates=True)


# ---- config files that cannot be read as configs: named before anything else ----------------

def test_a_lazy_config_without_a_model_a_syntax_error_or_a_missing_relative_import_is_named(tmp_path):
    # before: gwdet's own check stopped with a TypeError; detectron2's SyntaxError / ImportError as tracebacks
    (tmp_path / "nomodel.py").write_text("x = 1\n")
    with pytest.raises(GwdetValueError, match=r"^Config file '.*nomodel.py' defines no model: a LazyConfig names the "
                                              r"model to build in model = L\(...\)\(...\), beside train"):
        LazyRun.load(str(tmp_path / "nomodel.py"), ["train.output_dir=out"])
    load_lazy_config(str(tmp_path / "nomodel.py"))  # in Python, any LazyConfig file (a config's parts too)
    (tmp_path / "syntax.py").write_text("model = dict(\n\ndef f(:\n")
    with pytest.raises(GwdetValueError, match=r"^Config file '.*syntax.py' is not valid Python: .* \(line \d+\)\. "
                                              r"Correct that line.$"):
        load_lazy_config(str(tmp_path / "syntax.py"))
    copy = tmp_path / "copy.py"
    copy.write_text((REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py").read_text())
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(copy))
    assert str(refused.value).endswith(
        f"common/shapes.py does not exist. A LazyConfig's relative imports (from .common... import ...) read files "
        f"beside it: copy the folders it imports along with it (for gwdet's: cp -r configs/LazyConfig/common {tmp_path}/).")


def test_a_run_value_set_to_an_object_that_detectron2s_loader_drops_is_named(tmp_path):
    # before: "it has no lr_multiplier" for a file that sets one (detectron2's LazyConfig.load keeps
    # dicts, lists and LazyCall nodes only, and drops an object built in the file)
    base = REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    header = ("from fvcore.common.param_scheduler import CosineParamScheduler\nfrom detectron2.config import LazyConfig\n"
              f"_base = LazyConfig.load({str(base)!r})\n"
              "model, dataloader, optimizer, train = _base.model, _base.dataloader, _base.optimizer, _base.train\n")
    for line, example in (("lr_multiplier = CosineParamScheduler(start_value=1.0, end_value=0.0)\n",
                           "lr_multiplier = L(CosineParamScheduler)(start_value=1.0, end_value=0.0) (from "
                           "detectron2.config import LazyCall as L)."),
                          ("lr_multiplier: object = CosineParamScheduler(1.0, 0.0)\n",
                           "lr_multiplier = L(CosineParamScheduler)(...), each argument given by name")):
        (tmp_path / "objects.py").write_text(header + line)
        with pytest.raises(GwdetValueError) as refused:
            LazyRun.load(str(tmp_path / "objects.py"), ["train.output_dir=out"])
        assert str(refused.value).startswith(
            f"Config file {str(tmp_path / 'objects.py')!r} (line 5) sets lr_multiplier = CosineParamScheduler(")
        assert "an object that detectron2's LazyConfig.load leaves out (it keeps dicts, lists and L(...)(...) nodes " \
               "only), so the config would have no lr_multiplier. Write it as a node to be built: " + example \
            in str(refused.value)
    (tmp_path / "objects.py").write_text(header + "from detectron2.config import LazyCall as L\n"
                                         "lr_multiplier = L(CosineParamScheduler)(start_value=1.0, end_value=0.0)\n")
    assert LazyRun.load(str(tmp_path / "objects.py"), ["train.output_dir=out"]).cfg.lr_multiplier.end_value == 0.0


def test_a_yacs_base_that_is_a_lazy_config_or_not_yaml_is_named(tmp_path):
    from gwdet.model_zoo.loading import build_config

    for base, message in ((REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py", "a LazyConfig (.py): "
                           "a yacs config's _BASE_ is another yacs .yaml config."),
                          (tmp_path / "model_final.pth", "is not text (a checkpoint?): a _BASE_ names another yacs "
                           ".yaml config. Correct that line."),
                          (tmp_path / "broken.yaml", "is not valid YAML (")):
        (tmp_path / "model_final.pth").write_bytes(bytes(range(128, 256)))
        (tmp_path / "broken.yaml").write_text("MODEL: [\n")
        config = tmp_path / "config.yaml"
        config.write_text(f'_BASE_: "{base}"\n')
        with pytest.raises(GwdetValueError) as refused:
            build_config(str(config))
        assert str(refused.value).startswith(f"Config file {str(config)!r} names _BASE_: {str(base)!r}")
        assert message in str(refused.value)
    # a LazyConfig run's saved config.yaml (fvcore read it unsafely, then "Key model.roi_heads... is not a valid
    # type"), and a folder ("there is no file ..., gwdet ships a config of that name: <the folder>")
    from gwdet.errors import GwdetError

    (tmp_path / "lazy_run").mkdir()
    (tmp_path / "lazy_run" / "config.yaml").write_text("model:\n  _target_: detectron2.modeling.GeneralizedRCNN\n"
                                                        "train:\n  max_iter: 2\n")
    for base, message in ((tmp_path / "lazy_run" / "config.yaml", "a LazyConfig run's saved config (model, train, "
                           "dataloader): a yacs config's _BASE_ is another yacs .yaml config."),
                          (REPO / "configs" / "Demo", "which is a folder (it holds Base-Scratch-Shapes.yaml, Base-Shapes.yaml, ")):
        config = tmp_path / "config.yaml"
        config.write_text(f'_BASE_: "{base}"\n')
        with pytest.raises(GwdetError) as refused:
            build_config(str(config))
        assert message in str(refused.value), str(refused.value)


def test_a_runs_results_json_given_as_its_config_names_the_runs_config(tmp_path):
    # "gives the key 'INPUT.MIN_SIZE_TEST' under environment.test_settings ...: write it as nested blocks"
    from gwdet.model_zoo.loading import build_config

    (tmp_path / "results.json").write_text('{"shapes_val": {"bbox": {"AP": 1.0}}}')
    (tmp_path / "config.yaml").write_text("MODEL:\n  GW:\n    NUM_GROUPS: 8\n")
    with pytest.raises(GwdetValueError, match=rf"is a run's results \(results.json\), not a config: the run's config "
                                              rf"is {tmp_path / 'config.yaml'}\. Give that file"):
        build_config(str(tmp_path / "results.json"))
    # results.md: PyYAML's "while scanning a block scalar ... expected a comment or a line break"
    (tmp_path / "results.md").write_text("# Results\n\n| AP | 1.0 |\n")
    with pytest.raises(GwdetValueError, match=r"is a run's results \(results.md\), not a config: the run's config is"):
        build_config(str(tmp_path / "results.md"))


def test_a_relative_shapes_root_is_registered_and_recorded_as_an_absolute_path(tmp_path, monkeypatch):
    # before: results.json recorded a json_file relative to wherever the run had started
    from detectron2.config import get_cfg
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from gwdet import add_gwdet_config

    monkeypatch.chdir(tmp_path)
    cfg = add_gwdet_config(get_cfg())
    cfg.DATASETS.SHAPES.IMAGE_SIZE, cfg.DATASETS.SHAPES.NUM_TRAIN, cfg.DATASETS.SHAPES.NUM_VAL = 32, 2, 2
    cfg.DATASETS.SHAPES.ROOT = "shapes"
    try:
        folder = shapes.register_shapes(cfg)
        assert folder.is_absolute() and folder.parent == tmp_path / "shapes"
        assert MetadataCatalog.get("shapes_train").json_file == str(folder / "train.json")
    finally:
        for split in shapes.SPLITS:  # leave the catalog to the tests' own shapes datasets
            if f"shapes_{split}" in DatasetCatalog.list():
                DatasetCatalog.remove(f"shapes_{split}")
                MetadataCatalog.remove(f"shapes_{split}")


def test_an_unexpanded_variable_in_the_shapes_root_or_cache_is_refused(tmp_path, monkeypatch):
    # before: a folder literally named $NOPE was made in the current folder
    from detectron2.config import get_cfg

    from gwdet import add_gwdet_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOPE", raising=False)
    monkeypatch.setenv("GWDET_CACHE", "$NOPE/cache")
    cfg = add_gwdet_config(get_cfg())
    with pytest.raises(GwdetValueError, match=r"^GWDET_CACHE '\$NOPE/cache' holds '\$NOPE', an environment variable "
                                              r"that nothing expanded"):
        shapes.register_shapes(cfg)
    monkeypatch.setenv("SCRATCH_HERE", str(tmp_path / "scratch"))
    cfg.DATASETS.SHAPES.ROOT = "${SCRATCH_HERE}/shapes"
    with pytest.raises(GwdetValueError, match=r"give the path itself \(DATASETS.SHAPES.ROOT .*/scratch/shapes\); "
                                              r"nothing was written.$"):
        shapes.register_shapes(cfg)
    assert os.listdir(tmp_path) == []


def test_a_binary_config_an_unwritable_out_and_a_users_own_file_for_the_model_zoo_are_named(tmp_path):
    # before: a UnicodeDecodeError traceback, an OSError traceback after the work, and a list of gwdet's names
    import gwdet.model_zoo
    from gwdet.model_zoo.loading import build_config
    from gwdet.utils.cli_errors import output_path_problem

    (tmp_path / "model.ts").write_bytes(bytes(range(128, 256)))
    with pytest.raises(GwdetValueError, match=r"model.ts' is not text \(a checkpoint or an export\?\): give a yacs "
                                              r"\.yaml config \(see configs/\) or a LazyConfig \.py\.$"):
        build_config(str(tmp_path / "model.ts"))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)  # root may still write there; the kernel's /proc/sys it may not
    try:
        unwritable = next((folder for folder in (locked, Path("/proc/sys"))
                           if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK)), None)
        if unwritable is None:
            pytest.skip("no folder this process may not write into")
        assert output_path_problem("--out", unwritable, folder=True) == (
            f"--out {unwritable} cannot be written: this process may not write into it (a read-only disk, or another "
            "owner's folder). Give a folder this process may write.")
        assert output_path_problem("--out", unwritable / "new", folder=True).startswith(
            f"--out {unwritable / 'new'} cannot be written: {unwritable} is a folder this process may not write into")
    finally:
        locked.chmod(0o700)
    own = tmp_path / "my.yaml"
    own.write_text("MODEL: {}\n")
    with pytest.raises(FileNotFoundError, match=r"For a config file of your own, use "
                                                r"gwdet.model_zoo.build_config\(path\) \(a yacs .yaml\)"):
        gwdet.model_zoo.get_config(str(own))


@pytest.mark.parametrize("kind", ["pipe", "loop", "dangling"])
def test_a_config_path_that_is_no_regular_file_is_named_as_such(tmp_path, kind):
    # before: "does not exist" (or a list of gwdet's configs), though the path is there
    from gwdet.model_zoo import resolve_config_file
    from gwdet.model_zoo.loading import build_config

    path = tmp_path / ("config.py" if kind == "dangling" else "config.yaml")
    if kind == "pipe":
        os.mkfifo(path)
    else:
        path.symlink_to(path if kind == "loop" else tmp_path / "gone.py")
    assert resolve_config_file(str(path)) == str(path)
    load = load_lazy_config if kind == "dangling" else build_config
    with pytest.raises(GwdetValueError, match=r"is not a regular file \(a named pipe, a device, or a link that leads "
                                              r"nowhere or in a loop\): give the config file itself.$"):
        load(str(path))


def test_the_config_loaders_take_paths_and_refuse_overrides_as_one_string_and_the_other_kind():
    from gwdet.model_zoo import build_config

    assert build_config(DEMO_CONFIG).MODEL.GW.NUM_GROUPS == 16  # a pathlib.Path, as get_config takes
    assert load_lazy_config(LAZY_CONFIG, ["train.max_iter=3"]).train.max_iter == 3
    for load, overrides in ((build_config, "MODEL.GW.T 3"), (load_lazy_config, "train.max_iter=3")):
        config = DEMO_CONFIG if load is build_config else LAZY_CONFIG
        with pytest.raises(GwdetTypeError, match=f"{load.__name__}: opts must be a list of strings, .* got "
                                                 f"'{overrides}'"):  # before: read letter by letter
            load(str(config), overrides)
    with pytest.raises(GwdetValueError, match=r"is a yacs config \(upper-case sections such as MODEL, or _BASE_\), not "
                                              r"a LazyConfig: read it with gwdet.model_zoo.build_config\("):
        load_lazy_config(str(DEMO_CONFIG))  # before: the raw YAML, its _BASE_ unresolved, as a LazyConfig


def test_a_packaged_config_name_given_as_a_path_is_named_with_both_ways_to_load_it(tmp_path, monkeypatch):
    # build_config('Demo/...') at the repository root: "does not exist (run from the repository root?)"
    from gwdet.model_zoo import build_config

    monkeypatch.chdir(tmp_path)
    name = "Demo/scratch_faster_rcnn_gw_shapes.yaml"
    for load in (build_config, load_lazy_config):
        with pytest.raises(FileNotFoundError) as refused:
            load(name)
        assert str(refused.value) == (
            f"Config file {name!r} does not exist in {tmp_path}; {name!r} names a config gwdet packages: load it by "
            f"name with gwdet.model_zoo.get_config({name!r}), or give its path {str(REPO / 'configs' / name)!r}.")
    with pytest.raises(FileNotFoundError, match=r"^Config file 'configs/nope.yaml' does not exist in .* \(gwdet."
                                                r"model_zoo.list_configs\(\) names the configs gwdet packages"):
        build_config("configs/nope.yaml")


def test_config_files_misread_by_their_name_encoding_or_imports_are_named(tmp_path):
    # .PY was read as YAML ("expected '<document start>'"); UTF-16 was "not text (a checkpoint?)"; a star import
    # was detectron2's KeyError: '*'
    from gwdet.model_zoo import build_config
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    upper = tmp_path / "mine.PY"
    upper.write_text((LAZY_CONFIG).read_text())
    with pytest.raises(ValueError, match=r"ends in '\.PY': a LazyConfig is told by its suffix '\.py', in lower case"):
        load_lazy_config(str(upper))
    wide = tmp_path / "mine.yaml"
    wide.write_text("SEED: 1\n", encoding="utf-16")
    with pytest.raises(ValueError, match="is UTF-16 text .*save it as UTF-8"):
        build_config(str(wide))
    shutil.copytree(LAZY_CONFIG.parent / "common", tmp_path / "common")
    shutil.copy(LAZY_CONFIG, tmp_path / LAZY_CONFIG.name)
    star = tmp_path / "star.py"
    star.write_text(f"from .{LAZY_CONFIG.stem} import *\n")
    with pytest.raises(ValueError, match=r"imports with '\*', which detectron2's LazyConfig loader cannot"):
        load_lazy_config(str(star))


def test_a_lazy_head_norm_without_convolutions_is_warned_about_as_a_yacs_one():
    # conv_dims=[] dropped the box head's GW without a word (NUM_CONV 0 with a NORM is warned of)
    from conftest import logged_warnings

    from gwdet.engine.lazy import build_model

    with logged_warnings("gwdet.engine.lazy_checks") as warned:  # when the model is built: in the run's log.txt
        build_model(LazyRun.load(str(LAZY_CONFIG), ["model.roi_heads.box_head.conv_dims=[]"]).cfg)
    assert any("model.roi_heads.box_head.conv_norm is given, but model.roi_heads.box_head.conv_dims=[] gives the head "
               "no convolution to normalize" in line for line in warned), warned
    with logged_warnings("gwdet.engine.lazy_checks") as warned:
        build_model(LazyRun.load(str(LAZY_CONFIG)).cfg)
    assert not warned


def test_a_lazy_evaluation_in_a_yacs_runs_folder_falls_back_on_the_checkpoints_record(tmp_path):
    # the yacs run's config.yaml counted as compared (no differences), so the checkpoint's record of
    # its anchors was never read: other anchors evaluated without a word (box AP 3.09 instead of 3.36)
    from gwdet.model_zoo import build_config

    path = tmp_path / "config.yaml"
    path.write_text(build_config(str(DEMO_CONFIG)).dump())
    with pytest.raises(GwdetValueError, match="is not a LazyConfig run's config.yaml"):
        LazyRun.load(str(LAZY_CONFIG), []).model_differences_from(str(path))


def test_the_advice_for_a_missing_coco_names_a_lazyconfigs_settings_too():
    # a LazyConfig user was told DATASETS.TRAIN ('shapes_train',) only
    from detectron2.data import MetadataCatalog

    from gwdet.data.datasets import check_dataset_files

    if os.path.isfile(MetadataCatalog.get("coco_2017_val").json_file):
        pytest.skip("this machine has COCO")
    with pytest.raises(FileNotFoundError) as refused:
        check_dataset_files(["coco_2017_val"])
    assert ("dataloader.train.dataset.names=shapes_train dataloader.test.dataset.names=shapes_val in a LazyConfig"
            in str(refused.value))


def test_an_evaluator_folder_of_ones_own_that_holds_detections_is_not_written_over(tmp_path):
    # dataloader.evaluator.output_dir=<run>/inference replaced the run's detections (and an earlier
    # evaluation's), while results.md kept the run's numbers
    import argparse

    from gwdet.engine.lazy import LazyRun
    from gwdet.engine.run import evaluation_request

    lazy = Path(__file__).resolve().parents[1] / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw_shapes.py"
    (tmp_path / "run" / "inference").mkdir(parents=True)
    (tmp_path / "run" / "inference" / "coco_instances_results.json").write_text("[]")
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"")
    opts = [f"train.output_dir={tmp_path / 'new'}", f"train.init_checkpoint={weights}",
            f"dataloader.evaluator.output_dir={tmp_path / 'run' / 'inference'}"]
    args = argparse.Namespace(config_file=str(lazy), opts=opts, eval_only=True, resume=False, overwrite=False)
    with pytest.raises(FileExistsError, match=r"The evaluator writes into .*run/inference, which holds an earlier "
                                              r"evaluation's coco_instances_results.json .*: this evaluation would "
                                              r"replace them; nothing was evaluated"):
        evaluation_request(LazyRun.load(str(lazy), opts), args)
    opts[-1] = f"dataloader.evaluator.output_dir={tmp_path / 'mine'}"  # a folder of its own: evaluated
    evaluation_request(LazyRun.load(str(lazy), opts), args)
    # a training's evaluations into another run's inference/: its detections were replaced without a word
    from gwdet.engine.run import main

    opts[-1] = f"dataloader.evaluator.output_dir={tmp_path / 'run' / 'inference'}"
    training = argparse.Namespace(config_file=str(lazy), opts=opts[:1] + opts[2:], eval_only=False, resume=False,
                                  overwrite=False, register_coco=(), threads=1)
    with pytest.raises(FileExistsError, match=r"The evaluator writes into .*run/inference, which holds an earlier "
                                              r"evaluation's coco_instances_results.json .*: this evaluation would "
                                              r"replace them; nothing was trained"):
        main(training)
    assert (tmp_path / "run" / "inference" / "coco_instances_results.json").read_text() == "[]"
    assert not (tmp_path / "new").exists()


# strict=true was named among the values the norm does not take (model.backbone.bottom_up.norm.strict=null)
def test_a_switched_norm_nodes_strict_is_not_named_among_the_values_to_leave_out():
    with pytest.raises(GwdetTypeError) as refused:
        LazyRun.load(str(LAZY_CONFIG), ["model.backbone.bottom_up.norm.name=GW_ZCA",
                                        "model.backbone.bottom_up.norm.strict=true"])
    assert str(refused.value) == (
        "model.backbone.bottom_up.norm: gwdet.norm('GW_ZCA') takes ['num_groups', 'eps'], not ['T']. An override "
        "keeps the node's other values; set those the norm does not take to null to leave them out: "
        "model.backbone.bottom_up.norm.T=null")


# Before: accepted; the FPN's convolutions got neither a norm nor a bias (detectron2's bias = norm == "").
def test_a_norm_of_none_is_refused_naming_the_empty_string():
    with pytest.raises(GwdetValueError, match=r"^model\.backbone\.norm=None: give '' for no norm "
                                              r"\(model\.backbone\.norm=''\), or a norm's name\..*neither"):
        LazyRun.load(str(LAZY_CONFIG), ["model.backbone.norm=null"])


# gwdet.engine.lazy's functions given a yacs config, a dict or None: omegaconf's and yacs's raw AttributeErrors
def test_the_lazyconfig_functions_refuse_what_is_no_lazyconfig():
    from gwdet.engine import lazy
    from gwdet.model_zoo import build_config

    yacs = build_config(str(DEMO_CONFIG))
    with pytest.raises(TypeError, match=r"^gwdet.engine.lazy.build_model takes a LazyConfig \(an omegaconf DictConfig\), "
                                        r"not a yacs CfgNode: for a yacs config, use gwdet.build_model\.$"):
        lazy.build_model(yacs)
    for call in (lambda: lazy.build_optimizer(None, None), lambda: lazy.evaluate({}, None),
                 lambda: lazy.build_train_loader(yacs), lambda: lazy.check_resume_config(yacs, "out")):
        with pytest.raises(TypeError, match=r"^gwdet.engine.lazy.\w+ takes a LazyConfig"):
            call()


# ---- gwdet.engine.lazy's functions check what they build as the tools do -----------------------------

def demo_lazy(**values):
    """The demo LazyConfig on the CPU with ``values`` set in Python (dotted keys given with ``__``)."""
    import gwdet.model_zoo

    cfg = gwdet.model_zoo.get_config(str(LAZY_CONFIG), opts=["train.device=cpu"])
    for key, value in values.items():
        *parents, last = key.split("__")
        node = cfg
        for parent in parents:
            node = node[parent]
        node[last] = value
    return cfg


# Before: omegaconf's raw ConfigAttributeError / TypeError "object of type '_Absent' has no len()".
def test_lazy_build_model_refuses_a_node_or_a_config_without_train_device():
    from omegaconf import OmegaConf

    from gwdet.engine import lazy

    cfg = demo_lazy()
    with pytest.raises(GwdetTypeError, match=r"^gwdet.engine.lazy.build_model takes the whole LazyConfig \(the cfg that "
                                             r"holds model, train.device\), not one of its nodes: .*Give "
                                             r"build_model\(cfg\), not build_model\(cfg.model\)\.$"):
        lazy.build_model(cfg.model)
    for config in (OmegaConf.create({"model": cfg.model}), OmegaConf.create({"model": cfg.model, "train": {}})):
        with pytest.raises(GwdetValueError, match=r"^gwdet.engine.lazy.build_model reads model, train.device of the "
                                                  r"LazyConfig, but this one has no train.device\. Add train.device "
                                                  r"\(e.g. cfg.train.device = 'cpu'"):
            lazy.build_model(config)


# Before: built without a word (no proposal kept, a threshold that keeps nothing, a BGN group that a batch of 4
# cannot fill, inf inputs), or detectron2's and torch's raw errors (negative dimension, different shapes, the
# first forward's "not enough values to unpack"), or a message naming the norm, not the setting.
@pytest.mark.parametrize("values, message", [
    ({"model__roi_heads__num_classes": -1}, "model.roi_heads.num_classes=-1 is no number of classes: give an integer "
                                            "of at least 1."),
    ({"model__backbone__out_channels": 0}, "model.backbone.out_channels=0 is no number of channels: give an integer "
                                           "of at least 1."),
    ({"model__proposal_generator__post_nms_topk": (0, 0)},
     "model.proposal_generator.post_nms_topk.0=0 is no number of proposals kept after NMS"),
    ({"model__proposal_generator__pre_nms_topk": (0, 0)},
     "model.proposal_generator.pre_nms_topk.0=0 is no number of proposals kept before NMS"),
    ({"model__roi_heads__box_predictor__test_score_thresh": 1.5},
     "model.roi_heads.box_predictor.test_score_thresh=1.5 is no score threshold (scores are in [0, 1])"),
    ({"model__roi_heads__box_predictor__box2box_transform__weights": (10.0, 10.0)},
     "model.roi_heads.box_predictor.box2box_transform.weights=[10.0, 10.0] is no set of box regression weights: "
     "detectron2's Box2BoxTransform takes four numbers"),
    ({"model__pixel_std": [0.0, 0.0, 0.0]}, "config: model.pixel_std=[0.0, 0.0, 0.0] holds a value <= 0"),
    ({"model__pixel_mean": [1.0, 2.0]}, "config: model.pixel_mean=[1.0, 2.0] has 2 values, but images of "
                                        "model.input_format='RGB' have 3 channels"),
    ({"model__backbone__bottom_up__norm": None},
     "model.backbone.bottom_up.norm=None: place_norm puts a norm at model.backbone.bottom_up.positions and would "
     "remove the norms there without one. Give a norm, e.g. model.backbone.bottom_up.norm=L(gwdet.norm)(name='GW', "
     "num_groups=64), or leave the positions out"),
])
def test_lazy_build_model_refuses_the_values_the_tool_refuses(values, message):
    from gwdet.engine import lazy

    with pytest.raises(GwdetValueError) as refused:
        lazy.build_model(demo_lazy(**values))
    assert str(refused.value).startswith(message)


# Before: built without a word; the last image of every batch of 4 normalized as a group of its own.
def test_lazy_build_model_checks_example_groups_against_the_batch():
    import gwdet
    from gwdet.engine import lazy

    cfg = demo_lazy(model__backbone__bottom_up__resnet__stem__norm=LazyCall(gwdet.norm)(
        name="BGN", num_groups=8, examples_per_group=3))
    with pytest.raises(GwdetValueError, match=r"model.backbone.bottom_up.resnet.stem.norm.examples_per_group=3 does "
                                              r"not divide the 4 images each process trains on \(dataloader.train."
                                              r"total_batch_size=4"):
        lazy.build_model(cfg)


# Before: AttributeError "'int' object has no attribute 'is_nested'" (get_norm called the layer with 64).
def test_lazy_build_model_refuses_a_layer_given_as_a_norm():
    from gwdet.engine import lazy
    from gwdet.layers import GroupWhitening

    with pytest.raises(GwdetTypeError, match=r"^model.backbone.norm is a layer, GroupWhitening, not what builds one: "
                                             r".*Give L\(gwdet.norm\)\(name=..., ...\)"):
        lazy.build_model(demo_lazy(model__backbone__norm=GroupWhitening(64, 8)))


# Before: omegaconf's "Missing key optimizer", AttributeError on None's named_parameters, SGD built with
# momentum 1.5 or lr nan without a word, torch's raw "Invalid learning rate" / "'<' not supported".
def test_lazy_build_optimizer_checks_its_config_and_model():
    from omegaconf import OmegaConf
    import torch

    from gwdet.engine import lazy

    model = torch.nn.Linear(2, 2)
    with pytest.raises(GwdetValueError, match=r"^gwdet.engine.lazy.build_optimizer reads optimizer of the LazyConfig, "
                                              r"but this one has no optimizer\. Add optimizer \(e.g. cfg.optimizer = "):
        lazy.build_optimizer(OmegaConf.create({"model": {}}), model)
    with pytest.raises(GwdetTypeError, match=r"^gwdet.engine.lazy.build_optimizer\(cfg, model\) takes the model as a "
                                             r"torch.nn.Module, got None \(NoneType\)\. Build it first"):
        lazy.build_optimizer(demo_lazy(), None)
    for key, value, message in (
            ("momentum", 1.5, r"optimizer.momentum=1.5: give a number from 0 to below 1, e.g. optimizer.momentum=0.9"),
            ("lr", float("nan"), r"optimizer.lr=nan is no learning rate: it must be a finite number >= 0"),
            ("lr", -1.0, r"optimizer.lr=-1.0 is no learning rate"),
            ("lr", "0.02", r"optimizer.lr='0.02' is no learning rate"),
            ("weight_decay", -0.1, r"optimizer.weight_decay=-0.1: give a number finite and at least 0")):
        with pytest.raises(GwdetValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
            lazy.build_optimizer(demo_lazy(**{f"optimizer__{key}": value}), model)


# Before: the sampler seeded with int(1.5) == int(True) == 1 without a word, int('abc')'s raw ValueError, and
# detectron2's misleading "Total batch size (0) must be divisible by the number of gpus (1)".
@pytest.mark.parametrize("values, message", [
    ({"train__seed": 1.5}, "train.seed=1.5: give a whole number below 2**32"),
    ({"train__seed": True}, "train.seed=True: give a whole number below 2**32"),
    ({"train__seed": "abc"}, "train.seed='abc': give a whole number below 2**32"),
    ({"dataloader__train__total_batch_size": 0}, "dataloader.train.total_batch_size=0, which 1 process(es)"),
    ({"dataloader__train__total_batch_size": 2.5}, "dataloader.train.total_batch_size=2.5 is no whole number of "
                                                   "images (float)"),
])
def test_lazy_build_train_loader_refuses_the_values_the_tool_refuses(values, message):
    from gwdet.engine import lazy

    with pytest.raises(GwdetValueError) as refused:
        lazy.build_train_loader(demo_lazy(**values))
    assert str(refused.value).startswith(message)


# Before: detectron2's raw TypeError "'NoneType' object is not callable" / KeyError "... is not registered!".
def test_lazy_evaluate_refuses_no_model_and_an_unregistered_test_set():
    import torch

    from gwdet.engine import lazy
    from gwdet.errors import GwdetKeyError

    with pytest.raises(GwdetTypeError, match=r"^gwdet.engine.lazy.evaluate\(cfg, model\) takes the model as a "
                                             r"torch.nn.Module, got None"):
        lazy.evaluate(demo_lazy(), None)
    with pytest.raises(GwdetKeyError, match=r"Dataset 'nope_test' is not registered\.( Did you mean '\w+'\?)? Register "
                                            r"your own COCO-format "
                                            r"data with --register-coco nope_test=path/to/instances.json"):
        lazy.evaluate(demo_lazy(dataloader__test__dataset__names="nope_test"), torch.nn.Linear(2, 2))


# Before: detectron2's raw KeyError "Dataset 'nope' is not registered! Available datasets are: ...".
def test_the_yacs_trainer_refuses_unregistered_datasets_in_the_tools_words(tmp_path):
    import torch

    from gwdet.engine.trainer import Trainer
    from gwdet.errors import GwdetKeyError
    from gwdet.model_zoo.loading import build_config

    unregistered = (r"Dataset 'nope' is not registered\.( Did you mean '\w+'\?)? Register your own COCO-format data "
                    r"with --register-coco nope=")
    with pytest.raises(GwdetKeyError, match=unregistered):
        Trainer.test(build_config(str(DEMO_CONFIG), ["DATASETS.TEST", "('nope',)"]), torch.nn.Linear(2, 2))
    cfg = build_config(str(DEMO_CONFIG), ["OUTPUT_DIR", str(tmp_path / "run"), "MODEL.DEVICE", "cpu",
                                          "DATASETS.TRAIN", "('nope',)"])
    with pytest.raises(GwdetKeyError, match=unregistered):
        Trainer(cfg)


# the suggestion was 'optimizer.weight_decay' (the global decay) or +optimizer.weight_decay_norm=..., which SGD refuses
def test_a_missing_keys_name_found_deeper_under_its_parent_is_suggested_first():
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY_CONFIG), ["optimizer.weight_decay_norm=0.3"])
    assert str(refused.value).endswith(
        "the config has no 'weight_decay_norm' under 'optimizer' (SGD takes dampening, differentiable, foreach, fused, "
        "lr, maximize, momentum, nesterov, params, weight_decay). Did you mean 'optimizer.params.weight_decay_norm' or "
        "'optimizer.weight_decay'? SGD takes no argument 'weight_decay_norm', and instantiate passes every key of the "
        "node to it: a key added with +optimizer.weight_decay_norm=... would stop it.")
    with pytest.raises(GwdetValueError, match=r"Did you mean 'model\.backbone\.norm\.num_groups' or "):
        load_lazy_config(str(LAZY_CONFIG), ["model.num_groups=8"])
    assert load_lazy_config(str(LAZY_CONFIG), ["optimizer.params.weight_decay_norm=0.3"]).optimizer.params[
        "weight_decay_norm"] == 0.3


def test_the_deeper_keys_walk_passes_missing_values_and_follows_no_reference():
    from omegaconf import OmegaConf

    from gwdet.model_zoo.lazy_loading import _deeper_keys

    node = OmegaConf.create({"head": {"lr": "???", "inner": {"lr": 1, "rate": "???"}}, "alias": "${head}",
                             "items": [{"lr": 2}]})
    assert _deeper_keys(node, "lr", "optimizer") == ["optimizer.head.lr", "optimizer.head.inner.lr",
                                                     "optimizer.items.0.lr"]  # the shallowest first
    assert _deeper_keys(node, "rate", "") == ["head.inner.rate"]


# "model.backbone.norm: None names no norm ... give None itself where the norm goes", and None was then refused:
# "model.backbone.norm=None: give '' for no norm"
@pytest.mark.parametrize("name", ["null", "''"])
def test_a_norm_node_named_none_says_to_give_the_empty_string_as_a_norm_of_none_does(name):
    from gwdet.engine.lazy import build_model

    with pytest.raises(UnknownNormError) as refused:
        build_model(load_lazy_config(str(LAZY_CONFIG), [f"model.backbone.norm.name={name}"]))
    said = str(refused.value)
    assert said.startswith(
        f"model.backbone.norm: {None if name == 'null' else ''!r} names no norm, so there is nothing to build or look "
        "up. For no norm, give '' where the norm goes: model.backbone.norm='' (an override; model.backbone.norm = '' "
        "in Python), in place of the gwdet.norm node.")
    assert "None itself" not in said and ("gwdet refuses None" in said) == (name == "null")
    # the advice taken: the model builds with no norm in the FPN, and its convolutions keep their bias
    fpn = build_model(load_lazy_config(str(LAZY_CONFIG), ["model.backbone.norm=''"])).backbone
    assert fpn.fpn_lateral2.norm is None and fpn.fpn_lateral2.bias is not None
    with pytest.raises(GwdetValueError, match=r"^model\.backbone\.norm=None: give '' for no norm"):
        build_model(load_lazy_config(str(LAZY_CONFIG), ["model.backbone.norm=null"]))


# place_norm's node named None was told to give '' in its place, which place_norm refuses too
def test_a_place_norm_node_named_none_is_told_to_give_a_norm():
    import re

    with pytest.raises(UnknownNormError, match=re.escape(
            "model.backbone.bottom_up.norm: None names no norm, and place_norm puts a norm at "
            "model.backbone.bottom_up.positions (it would remove the norms there without one, as it refuses '' and "
            "None). Give a norm's name, e.g. model.backbone.bottom_up.norm.name=GW, or leave the positions out (build "
            "model.backbone.bottom_up.resnet alone).")):
        LazyRun.load(str(REPO / "configs" / "LazyConfig" / "mask_rcnn_R_50_FPN_gw.py"),
                     ["model.backbone.bottom_up.norm.name=null"])


# optimizer.params.overrides with a misspelt group key or a negative decay was accepted (the decay applied or ignored
# without a word, a warning then advising check_model(..., weight_decay_bias=-1)); a bare number stopped on detectron2's
# "'float' object is not iterable"
@pytest.mark.parametrize("override, error, message", [
    ("optimizer.params.overrides={bias:{weight_decy:0.0}}", GwdetValueError,
     "optimizer.params.overrides['bias']['weight_decy'] is no key of a parameter group of torch's optimizers, so the "
     "optimizer would carry it and ignore it. Did you mean 'weight_decay'"),
    ("optimizer.params.overrides={bias:{weight_decay:-1.0}}", GwdetValueError,
     "optimizer.params.overrides['bias']['weight_decay'] must be a finite number >= 0, got -1.0"),
    ("optimizer.params.overrides={bias:0.0}", GwdetTypeError,
     "optimizer.params.overrides['bias'] is 0.0 (float), but an override is a dict of the parameter group's values"),
])
def test_optimizer_param_overrides_are_checked_before_anything_is_built(override, error, message):
    run = LazyRun.load(str(LAZY_CONFIG), [override])
    with pytest.raises(error) as refused:
        run.check_request(eval_only=False, world_size=1)
    assert message in str(refused.value)
    LazyRun.load(str(LAZY_CONFIG), ["optimizer.params.overrides={bias:{weight_decay:0.0}}"]).check_request(
        eval_only=False, world_size=1)


def test_a_misspelt_override_key_is_matched_among_the_keys_of_the_config_s_optimizer():
    from omegaconf import OmegaConf
    from gwdet.engine.lazy_checks import check_optimizer_values

    def config(optimizer: str):
        return OmegaConf.create({"optimizer": {"_target_": optimizer, "params": {
            "_target_": "gwdet.solver.get_default_optimizer_params", "overrides": {"bias": {"momentun": 0.004}}}}})

    for optimizer, meant in (("torch.optim.NAdam", "'momentum_decay'"), ("torch.optim.SGD", "'momentum'")):
        with pytest.raises(GwdetValueError, match=rf"\['momentun'\] is no key .* Did you mean {meant}\?"):
            check_optimizer_values(config(optimizer))


# --eval-only with INPUT.MAX_SIZE_TEST below INPUT.MIN_SIZE_TEST (96 and 64, or 256 and the demo's 128) evaluated at the
# capped size without a word; only a training run warned
@pytest.mark.parametrize("overrides, eval_only, asked, capped", [
    (["INPUT.MIN_SIZE_TEST", "96", "INPUT.MAX_SIZE_TEST", "64"], True, 96, 64),
    (["INPUT.MIN_SIZE_TEST", "256"], True, 256, 128),
    (["INPUT.MIN_SIZE_TEST", "96", "INPUT.MAX_SIZE_TEST", "64"], False, 96, 64),
])
def test_a_yacs_test_size_capped_by_max_size_test_is_warned_of_once_in_evaluation_and_training(
        overrides, eval_only, asked, capped):
    from conftest import logged_warnings
    from gwdet.engine.trainer import YacsRun

    run = YacsRun.load(str(DEMO_CONFIG), overrides)
    with logged_warnings("gwdet") as warned:
        run.check_request(eval_only=eval_only, world_size=1)
    expected = (f"INPUT.MAX_SIZE_TEST {capped} is below INPUT.MIN_SIZE_TEST {asked}: detectron2's resize caps the "
                f"longer image side at {capped}, so the test images' shorter side reaches no more than {capped} "
                f"(square images are evaluated at {capped}x{capped}, not {asked}x{asked}). Set INPUT.MAX_SIZE_TEST to "
                f"at least {asked} (e.g. {asked * 5 // 3}, detectron2's ratio), or lower INPUT.MIN_SIZE_TEST.")
    assert warned.count(expected) == 1


# a LazyConfig's L(ResizeShortestEdge) max_size below its short_edge_length (test loader: --eval-only and training;
# training loader: training) read every image at the capped size without a word, and a max_size beside
# short_edge_length 0 (no resizing) capped nothing without a word either
@pytest.mark.parametrize("overrides, eval_only, expected", [
    (["dataloader.test.mapper.augmentations.0.max_size=64"], True,
     "dataloader.test.mapper.augmentations.0.max_size=64 is below its short_edge_length 128: detectron2's resize caps "
     "the longer image side at 64, so the test images' shorter side reaches no more than 64 (square images are "
     "evaluated at 64x64, not 128x128). Set dataloader.test.mapper.augmentations.0.max_size to at least 128 (e.g. 213, "
     "detectron2's ratio), or lower dataloader.test.mapper.augmentations.0.short_edge_length."),
    (["dataloader.test.mapper.augmentations.0.max_size=64"], False,
     "dataloader.test.mapper.augmentations.0.max_size=64 is below its short_edge_length 128: detectron2's resize caps "
     "the longer image side at 64, so the test images' shorter side reaches no more than 64"),
    (["dataloader.train.mapper.augmentations.0.max_size=64"], False,
     "dataloader.train.mapper.augmentations.0.max_size=64 is below its short_edge_length 128: detectron2's resize caps "
     "the longer image side at 64, so no training image's shorter side reaches more than 64 (square images train at "
     "64x64, not 128x128). Set dataloader.train.mapper.augmentations.0.max_size to at least 128 (e.g. 213, "
     "detectron2's ratio), or lower dataloader.train.mapper.augmentations.0.short_edge_length."),
    (["dataloader.train.mapper.augmentations.0.short_edge_length=[96,160]",
      "dataloader.train.mapper.augmentations.0.max_size=128"], False,
     "dataloader.train.mapper.augmentations.0.max_size=128 is below its short_edge_length [96, 160] (largest 160): "
     "detectron2's resize caps the longer image side at 128"),
    (["dataloader.test.mapper.augmentations.0.short_edge_length=0"], True,
     "dataloader.test.mapper.augmentations.0.short_edge_length=0: detectron2 evaluates the images at their own size and "
     "resizes none, so dataloader.test.mapper.augmentations.0.max_size=128 caps nothing. To cap the image size, give "
     "short_edge_length a size as well."),
])
def test_a_lazy_resize_whose_max_size_caps_its_short_edge_length_is_warned_of(overrides, eval_only, expected):
    from conftest import logged_warnings

    run = LazyRun.load(str(LAZY_CONFIG), overrides)
    with logged_warnings("gwdet") as warned:
        run.check_request(eval_only=eval_only, world_size=1)
    assert len([message for message in warned if message.startswith(expected)]) == 1, warned


# the warnings read the loaders a request reads, and a max_size that caps nothing is no cap: the training loader's
# resize is not warned of in --eval-only, nor the demo's own sizes, nor a max_size of ResizeShortestEdge's default
@pytest.mark.parametrize("overrides, eval_only", [
    (["dataloader.train.mapper.augmentations.0.max_size=64"], True),
    ([], False),
    ([f"dataloader.test.mapper.augmentations.0.max_size={sys.maxsize}"], True),
])
def test_a_lazy_resize_is_not_warned_of_where_nothing_is_capped(overrides, eval_only):
    from conftest import logged_warnings

    run = LazyRun.load(str(LAZY_CONFIG), overrides)
    with logged_warnings("gwdet") as warned:
        run.check_request(eval_only=eval_only, world_size=1)
    assert not [message for message in warned if "short_edge_length" in message]


# ---- a plain callable given as a LazyConfig norm argument ------------------------------------------------------------

class _ChannelNorm(torch.nn.Module):
    """A user's norm class that takes the channel count as its only argument."""

    def __init__(self, channels):
        super().__init__()
        self.inner = torch.nn.GroupNorm(1, channels)

    def forward(self, x):
        return self.inner(x)


def _with_norm(key, value):
    """The demo LazyConfig with ``value`` set as the norm argument at ``model.<key>`` in Python."""
    cfg = load_lazy_config(str(LAZY_CONFIG), ["train.device=cpu"])
    *parents, last = key.split(".")
    node = cfg.model
    for part in parents:
        node = node[part]
    node[last] = value
    return cfg, node, last


# before: None and Identity built the FPN's and the box head's convs with neither norm nor bias without a word; a layer
# of other channels, of float64 or no module at all failed only at the first forward in torch; a GroupNorm of 32 groups on
# 16 channels stopped with torch's bare ValueError; torch.nn.GroupNorm gave instantiate's raw "missing 1 required
# positional argument: 'num_channels'"
@pytest.mark.parametrize("key, value, error, message", [
    ("backbone.norm", lambda ch: None, GwdetTypeError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned None \(NoneType\) for 64 channels, not a "
     r"torch\.nn\.Module; a norm argument takes a name .* for no norm, give model\.backbone\.norm=''"),
    ("backbone.norm", lambda ch: torch.nn.Identity(), GwdetValueError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned Identity\(\) for 64 channels; detectron2 drops the "
     r"bias of a conv given a norm, so the layer would have neither normalization nor bias\. For no norm, give "
     r"model\.backbone\.norm=''"),
    ("roi_heads.box_head.conv_norm", lambda ch: None, GwdetTypeError,
     r"^model\.roi_heads\.box_head\.conv_norm: the callable .*<lambda> returned None"),
    ("backbone.bottom_up.resnet.stem.norm", lambda ch: torch.nn.Identity(), GwdetValueError,
     r"^model\.backbone\.bottom_up\.resnet\.stem\.norm: the callable .*<lambda> returned Identity\(\) for 16 channels"),
    ("backbone.norm", lambda ch: torch.nn.GroupNorm(2, ch * 2), GwdetValueError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned a GroupNorm of 128 channels where 64 were asked \(its "
     r"first input would fail in torch\): build the layer for the channel count the callable is given\."),
    ("backbone.norm", lambda ch: 5, GwdetTypeError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned 5 \(int\) for 64 channels, not a torch\.nn\.Module"),
    ("backbone.norm", lambda ch: torch.nn.GroupNorm(4, ch, dtype=torch.float64), GwdetValueError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned a GroupNorm for 64 channels whose weight is "
     r"torch\.float64"),
    ("backbone.norm", lambda ch: torch.nn.GroupNorm(-2, ch), GwdetValueError,
     r"^model\.backbone\.norm: the callable .*<lambda> returned a GroupNorm for 64 channels, holding GroupNorm\(-2, 64\)"
     r": torch's GroupNorm needs at least 1 group"),
    ("backbone.bottom_up.resnet.stem.norm", lambda ch: torch.nn.GroupNorm(32, ch), GwdetValueError,
     r"^model\.backbone\.bottom_up\.resnet\.stem\.norm: the callable .*<lambda> could not build a layer of 16 "
     r"channels: it raised ValueError: num_channels \(16\) must be divisible by num_groups \(32\)\. Make it build"),
    ("backbone.norm", torch.nn.GroupNorm, GwdetTypeError,
     r"^model\.backbone\.norm=torch\.nn\.modules\.normalization\.GroupNorm: detectron2's get_norm calls a norm argument "
     r"with the channel count alone \(GroupNorm\(256\)\), which it cannot take \(missing a required argument: "
     r"'num_channels'\)\. A norm argument takes .*L\(gwdet\.norm\)\(name='GN', num_groups=32\)"),
])
def test_a_plain_callable_lazy_norm_is_checked_as_a_registered_build_is(key, value, error, message):
    from gwdet.engine.lazy import build_model

    cfg, node, last = _with_norm(key, value)
    with pytest.raises(error, match=message):
        build_model(cfg)
    assert node[last] is value, "the user's config is left as it was (the copy instantiated holds the checks)"


# the checks of a plain callable norm leave a working one alone: a user's norm class of the channel count, a callable of
# it and one set on the stem (the stages interpolate it) build, and an object the config holds is the one the model gets
def test_a_plain_callable_lazy_norm_that_builds_a_norm_layer_is_accepted():
    from gwdet.engine.lazy import build_model

    cfg, node, _ = _with_norm("backbone.norm", _ChannelNorm)
    cfg.model.roi_heads.box_head.conv_norm = lambda channels: torch.nn.GroupNorm(8, channels)
    cfg.model.backbone.bottom_up.resnet.stem.norm = lambda channels: torch.nn.GroupNorm(1, channels)
    top_block = instantiate(cfg.model.backbone.top_block)
    cfg.model.backbone.top_block = top_block
    model = build_model(cfg)
    assert isinstance(model.backbone.fpn_lateral2.norm, _ChannelNorm)
    assert isinstance(model.roi_heads.box_head.conv1.norm, torch.nn.GroupNorm)
    assert type(model.backbone.bottom_up.res3[0].conv1.norm).__name__ == "GroupNorm"
    assert model.backbone.top_block is top_block
    assert node.norm is _ChannelNorm and cfg.model.backbone.top_block is top_block


# before: the print function saved as a yaml LazyConfig's FPN norm printed the channel counts and built the FPN without
# norm and bias
def test_a_yaml_lazy_configs_callable_norm_is_checked_when_the_model_is_built(tmp_path):
    from gwdet.engine.lazy import build_model

    LazyConfig.save(load_lazy_config(str(LAZY_CONFIG), ["train.device=cpu"]), str(tmp_path / "saved.yaml"))
    text = (tmp_path / "saved.yaml").read_text()
    fpn_norm = "\n    norm: {T: 5, _target_: gwdet.norm, eps: 1.0e-05, name: GW, num_groups: 16}\n"
    assert text.count(fpn_norm) == 1
    (tmp_path / "saved.yaml").write_text(text.replace(fpn_norm, "\n    norm: !!python/name:builtins.print ''\n"))
    cfg = load_lazy_config(str(tmp_path / "saved.yaml"), ["train.device=cpu"])
    with pytest.raises(GwdetTypeError, match=r"^model\.backbone\.norm: the callable print returned None \(NoneType\) "
                                             r"for 64 channels, not a torch\.nn\.Module"):
        build_model(cfg)
