"""LazyConfig: gwdet.norm in L(...) nodes, GW positions via place_norm, save/load round trips."""
from collections import Counter

import numpy as np
import pytest
import torch
from detectron2.config import LazyCall as L
from detectron2.config import LazyConfig, instantiate
from detectron2.modeling.backbone import BasicStem, ResNet
from omegaconf import OmegaConf

import gwdet
from gwdet.errors import GwdetValueError
from gwdet.layers import GroupWhitening
from gwdet.model_zoo.lazy_loading import load_lazy_config
from gwdet.modeling import place_norm

from conftest import REPO

LAZY = REPO / "configs" / "LazyConfig"


def _norms_by_part(model: torch.nn.Module) -> dict:
    found: dict = {}
    for name, layer in model.named_modules():
        kind = type(layer).__name__
        if isinstance(layer, GroupWhitening) or "Norm" in kind:
            part = ("bottom_up" if "bottom_up" in name else "fpn" if ".fpn_" in name
                    else "box_head" if "box_head" in name else "mask_head" if "mask_head" in name else name)
            found.setdefault(part, Counter())[kind] += 1
    return {part: dict(counter) for part, counter in found.items()}


def _gw_values(model: torch.nn.Module) -> set:
    return {(m.num_groups, m.T, m.eps) for m in model.modules() if isinstance(m, GroupWhitening)}


@pytest.mark.parametrize("config, expected", [
    ("mask_rcnn_R_50_FPN_gw.py", {"bottom_up": {"GroupWhitening": 17, "FrozenBatchNorm2d": 36},
                                  "fpn": {"GroupWhitening": 8}, "box_head": {"GroupWhitening": 4},
                                  "mask_head": {"GroupWhitening": 4}}),
    ("scratch_faster_rcnn_R_50_FPN_gw.py", {"bottom_up": {"GroupWhitening": 53}, "fpn": {"GroupWhitening": 8},
                                            "box_head": {"GroupWhitening": 4}}),
])
def test_lazy_configs_build_gw_in_every_part_and_survive_save_and_load(config, expected, tmp_path):
    cfg = LazyConfig.load(str(LAZY / config))
    cfg.model.backbone.norm.num_groups = 16  # one value changed: it must reach the FPN only
    cfg.GW = LazyConfig.load(str(LAZY / "gw_parts.py")).GW  # a .py's public module-level node: a top-level key
    saved = tmp_path / "saved.yaml"
    LazyConfig.save(cfg, str(saved))
    reloaded = LazyConfig.load(str(saved))
    for loaded in (cfg, reloaded):
        torch.manual_seed(0)
        model = instantiate(loaded.model)
        assert _norms_by_part(model) == expected
        fpn = {(m.num_groups, m.T, m.eps) for n, m in model.named_modules()
               if isinstance(m, GroupWhitening) and ".fpn_" in n}
        assert fpn == {(16, 5, 1e-5)}
        assert _gw_values(model) == {(16, 5, 1e-5), (64, 5, 1e-5)}
    saved_again = tmp_path / "saved_again.yaml"
    LazyConfig.save(reloaded, str(saved_again))
    assert saved_again.read_text() == saved.read_text()
    assert "gwdet.norm" in saved.read_text()
    # the saved file holds a .py's module-level node GW as a top-level key: gwdet's loader (the tools') took the
    # file for a yacs config by that upper-case key, and refused it
    assert "\nGW:" in f"\n{saved.read_text()}"
    assert load_lazy_config(str(saved)).model.backbone.norm.num_groups == 16


def test_place_norm_puts_the_norm_at_the_positions_and_freezes_after():
    resnet = place_norm(
        ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"),
               out_features=["res5"], freeze_at=0),
        positions="S1-B2", norm=gwdet.norm("GW", num_groups=4), freeze_at=2)
    assert isinstance(resnet.stem.conv1.norm, GroupWhitening) and resnet.stem.conv1.norm.num_groups == 4
    stage2, stage3 = resnet.stages[0], resnet.stages[1]
    assert all(isinstance(block.conv2.norm, GroupWhitening) for block in stage2)
    assert type(stage2[0].conv1.norm).__name__ == "FrozenBatchNorm2d", "frozen stage: BN -> FrozenBN"
    assert type(stage3[0].conv1.norm).__name__ == "BatchNorm2d", "trainable stage keeps BN"
    assert not any(p.requires_grad for p in stage2.parameters())
    assert all(p.requires_grad for p in stage3.parameters())


# a forward hook on the stem's norm (a feature probe) never fired again after place_norm, without a word
def test_place_norm_moves_a_replaced_norms_hooks_and_refuses_state_dict_hooks():
    def resnet():
        return ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"],
                      freeze_at=0)

    model, seen = resnet(), []
    handle = model.stem.conv1.norm.register_forward_hook(lambda module, args, output: seen.append(type(module)))
    place_norm(model, positions="S1", norm=gwdet.norm("GW", num_groups=4))
    model.eval()(torch.randn(1, 3, 32, 32))
    assert seen == [GroupWhitening]
    handle.remove()  # the handle still removes it
    model.eval()(torch.randn(1, 3, 32, 32))
    assert seen == [GroupWhitening]
    hooked = resnet()
    hooked.stem.conv1.norm._register_state_dict_hook(lambda *args: None)
    before = hooked.stem.conv1.norm
    with pytest.raises(ValueError, match=r"^place_norm: the norm\(s\) BatchNorm2d \(_state_dict_hooks\) at the positions "
                                         r"carry state-dict hooks"):
        place_norm(hooked, positions="S1", norm=gwdet.norm("GW", num_groups=4))
    assert hooked.stem.conv1.norm is before


# a ResNet in eval mode got a BW in training mode (inference on batch statistics, running_mean moved), a float64 one
# a float32 GW; a pruned norm's pre-hook moved onto the GW, whose first forward failed without weight_mask
def test_place_norm_gives_the_new_norms_the_models_mode_and_dtype_and_refuses_a_pruned_norm():
    from torch.nn.utils import prune

    model = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"],
                   freeze_at=0).double().eval()
    place_norm(model, positions="S1", norm=gwdet.norm("BW", group_size=4))
    bw = model.stem.conv1.norm
    assert not bw.training and {p.dtype for p in model.parameters()} == {torch.float64}
    before = bw.running_mean.clone()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    assert torch.equal(bw.running_mean, before)  # evaluated on running statistics
    pruned = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"],
                    freeze_at=0)
    prune.l1_unstructured(pruned.stem.conv1.norm, "weight", 0.5)
    with pytest.raises(ValueError, match=r"BatchNorm2d \(a pruning of torch.nn.utils.prune: .*\) at the positions carry "
                                         r"state-dict hooks \(or a pruning\)"):
        place_norm(pruned, positions="S1", norm=gwdet.norm("GW", num_groups=4))


# one layer object at two positions (a lambda returning a prebuilt layer) shared its weights without a word; an
# Identity removed the norms, and their convolutions have no bias
def test_place_norm_refuses_one_layer_for_several_positions_and_an_identity():
    def resnet():
        return ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"],
                      freeze_at=0)

    shared, model = GroupWhitening(64, num_groups=4), resnet()
    before = model.stem.conv1.norm
    with pytest.raises(ValueError, match=r"gave the same layer object for more than one of the \d+ positions"):
        place_norm(model, positions="S1-B2", norm=lambda channels: shared)
    with pytest.raises(ValueError, match=r"gave an Identity, which would remove the norms at the positions"):
        place_norm(model, positions="S1", norm=lambda channels: torch.nn.Identity())
    assert model.stem.conv1.norm is before


@pytest.mark.parametrize("norm, freeze_at, built_frozen, message", [
    (None, 0, 0, "norm=None would remove the norms at the positions"),
    ("", 0, 0, "norm='' would remove the norms"),
    ("GW", 0, 0, r"norm='GW' is built by gwdet, not by detectron2's get_norm: give gwdet.norm\('GW', \.\.\.\)"),
    (gwdet.norm("GW", num_groups=4), 6, 0, r"freeze_at=6: give 0 \(nothing frozen\) to 5"),
    (gwdet.norm("GW", num_groups=4), 0, 2, "the ResNet has frozen parameters already"),
])
def test_place_norm_refuses_what_would_remove_norms_or_leave_them_trainable_in_frozen_stages(
        norm, freeze_at, built_frozen, message):
    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"],
                    freeze_at=built_frozen)
    before = resnet.stem.conv1.norm
    with pytest.raises(ValueError, match=message):
        place_norm(resnet, positions="S1-B2", norm=norm, freeze_at=freeze_at)
    assert resnet.stem.conv1.norm is before


def test_place_norm_refuses_a_norm_callable_that_gives_no_layer_and_a_resnet_not_detectron2s():
    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"])
    before = resnet.stem.conv1.norm
    with pytest.raises(TypeError, match=r"place_norm: norm=<function .*> gave None \(a NoneType\), not a norm layer; "
                                        "nothing was replaced"):
        place_norm(resnet, positions="S1-B2", norm=lambda channels: None)
    assert resnet.stem.conv1.norm is before
    # a layer given where its builder belongs: torch's "'int' object has no attribute 'dim'" from its forward
    with pytest.raises(TypeError, match=r"^place_norm: norm=BatchNorm2d\(64, .*\) is a layer, not what builds one for "
                                        r"each position; nothing was replaced. .*or the class BatchNorm2d itself.$"):
        place_norm(resnet, positions="S1-B2", norm=torch.nn.BatchNorm2d(64))
    assert resnet.stem.conv1.norm is before
    # a class that takes more than the channel count: GroupNorm's bare "missing 1 required positional argument"
    with pytest.raises(TypeError, match=r"^place_norm: norm=<class 'torch.nn.modules.normalization.GroupNorm'> could not "
                                        r"build a layer from a channel count \(TypeError: .*num_channels.*\); nothing was "
                                        r"replaced.*lambda channels: torch.nn.GroupNorm\(32, channels\)"):
        place_norm(resnet, positions="S1", norm=torch.nn.GroupNorm)
    assert resnet.stem.conv1.norm is before
    # a LazyConfig node given in Python before instantiate: "'DictConfig' object is not callable"
    with pytest.raises(TypeError, match=r"^place_norm: norm is a LazyConfig node not instantiated \(gwdet.norms.norm with "
                                        r"'name', 'num_groups'\); nothing was replaced. In Python, instantiate it first"):
        place_norm(resnet, positions="S1", norm=L(gwdet.norm)(name="GW", num_groups=4))
    assert resnet.stem.conv1.norm is before
    torchvision = pytest.importorskip("torchvision")
    with pytest.raises(TypeError, match=r"place_norm takes detectron2's ResNet .*, got torchvision.models.resnet.ResNet. "
                                        r"A torchvision ResNet takes its norm when built"):
        place_norm(torchvision.models.resnet18(), positions="S1", norm=gwdet.norm("GW", num_groups=4))
    # a numpy integer is an integer: 2 frozen stages
    resnet = place_norm(resnet, positions="S1", norm=gwdet.norm("GW", num_groups=4), freeze_at=np.int64(2))
    assert not any(p.requires_grad for p in resnet.stages[0].parameters())


@pytest.mark.parametrize("name", ["BW", "BGN"])
def test_place_norm_refuses_norms_with_running_statistics_in_the_stages_it_freezes(name):
    # the frozen stages' running statistics went on changing in training (the yacs path refused it)
    norm = gwdet.norm(name, group_size=16) if name == "BW" else gwdet.norm(name, num_groups=8)
    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"])
    before = resnet.stem.conv1.norm
    with pytest.raises(GwdetValueError, match=rf"place_norm: freeze_at=2 freezes stem, res2, whose norms "
                                              rf"stem.conv1.norm \({type(norm(64)).__name__}\), res2.0.conv2.norm .* keep "
                                              "running statistics that training would go on updating"):
        place_norm(resnet, positions="S1-B2", norm=norm, freeze_at=2)
    assert resnet.stem.conv1.norm is before and all(p.requires_grad for p in resnet.parameters())
    with pytest.raises(GwdetValueError, match=r"freeze_at=1 freezes stem, whose norms stem.conv1.norm"):
        place_norm(resnet, positions="S1-B2", norm=norm, freeze_at=1)
    place_norm(resnet, positions="B2", norm=norm, freeze_at=1)  # the stem keeps its BN, which becomes FrozenBN


def test_place_norm_refuses_a_registered_norm_with_running_statistics_in_the_stages_it_freezes(registered):
    # a registered name with batch_statistics=True kept updating its running statistics in frozen stages
    from gwdet.norms import register_norm

    class RunningStatistics(torch.nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.register_buffer("running_mean", torch.zeros(channels))

        def forward(self, x):
            return x - self.running_mean.view(1, -1, 1, 1)

    register_norm("RunStat", RunningStatistics, batch_statistics=True, layer_types=(RunningStatistics,))
    registered.append("RunStat")
    resnet = ResNet(BasicStem(3, 64, norm="BN"), ResNet.make_default_stages(18, norm="BN"), out_features=["res5"])
    with pytest.raises(GwdetValueError, match=r"freeze_at=1 freezes stem, whose norms stem.conv1.norm "
                                              r"\(RunningStatistics\) keep running statistics"):
        place_norm(resnet, positions="S1", norm=gwdet.norm("RunStat"), freeze_at=1)


def test_a_norm_name_detectron2_does_not_know_fails_loudly_in_a_lazy_config():
    node = L(BasicStem)(in_channels=3, out_channels=16, norm="GW")
    with pytest.raises(KeyError):
        instantiate(node)


# ---- the LazyConfigs of the shapes models: the same models, data and recipe as their yacs configs ----

SHAPES_PAIRS = [  # (LazyConfig, its yacs config, which of DATASETS.TEST the LazyConfig evaluates on)
    ("mask_rcnn_R_50_FPN_gw_shapes.py", "Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml", 0),
    ("Study/bn.py", "Study/bn.yaml", -1),
    ("Study/bn_gw_s1b2.py", "Study/bn_gw_s1b2.yaml", -1),
    ("Study/gn.py", "Study/gn.yaml", -1),
    ("Study/gw.py", "Study/gw.yaml", -1),
]


def _attributes(module: torch.nn.Module) -> dict:
    """A module's settings: the plain values among its attributes (thresholds, sizes, group numbers,
    norm hyper-parameters, ...), loss weights with detectron2's default of 1.0 filled in."""
    values = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training" or not isinstance(value, (bool, int, float, str, tuple, dict)):
            continue
        if key == "loss_weight" and isinstance(value, dict):
            value = {name: value.get(name, 1.0) for name in ("loss_cls", "loss_box_reg", "loss_mask")}
        values[key] = value
    return values


def _built_pair(lazy_name: str, yacs_name: str):
    from gwdet.engine.trainer import Trainer
    from gwdet.model_zoo import build_config

    cfg = build_config(str(REPO / "configs" / yacs_name))
    lazy = LazyConfig.load(str(LAZY / lazy_name))
    torch.manual_seed(0)
    yacs_model = Trainer.build_model(cfg)
    torch.manual_seed(0)
    lazy_model = instantiate(lazy.model)
    return cfg, lazy, yacs_model, lazy_model


@pytest.mark.parametrize("lazy_name, yacs_name, test_index", SHAPES_PAIRS, ids=[p[0] for p in SHAPES_PAIRS])
def test_shapes_lazy_configs_build_their_yacs_models_weight_for_weight(lazy_name, yacs_name, test_index):
    _, _, yacs_model, lazy_model = _built_pair(lazy_name, yacs_name)
    yacs_modules, lazy_modules = dict(yacs_model.named_modules()), dict(lazy_model.named_modules())
    assert list(lazy_modules) == list(yacs_modules), "the same modules, in the same order"
    for name, module in yacs_modules.items():
        other = lazy_modules[name]
        # gwdet's registered heads (GWFastRCNNConvFCHead, ...) are detectron2's with norms from the config
        assert type(other).__name__ == type(module).__name__.removeprefix("GW"), name
        assert _attributes(other) == _attributes(module), name
        if not list(module.children()):
            assert repr(other) == repr(module), name  # layer shapes, norm types and hyper-parameters
    yacs_state, lazy_state = yacs_model.state_dict(), lazy_model.state_dict()
    assert list(lazy_state) == list(yacs_state)
    for key, tensor in yacs_state.items():  # built in the same order from the same seed
        assert torch.equal(lazy_state[key], tensor), key
    if "gw" in lazy_name:
        assert _gw_values(lazy_model) == {(16, 5, 1e-5)}


@pytest.mark.parametrize("lazy_name, yacs_name, test_index", SHAPES_PAIRS, ids=[p[0] for p in SHAPES_PAIRS])
def test_shapes_lazy_configs_train_and_test_as_their_yacs_configs(lazy_name, yacs_name, test_index):
    from detectron2.data import DatasetMapper

    from gwdet.data import ShapesSpec
    from gwdet.engine.trainer import Trainer
    from gwdet.engine.lazy import build_optimizer

    cfg, lazy, yacs_model, lazy_model = _built_pair(lazy_name, yacs_name)
    # data: the same images, masks, augmentations, batches and test set
    assert instantiate(lazy.dataloader.shapes) == ShapesSpec.from_config(cfg)
    assert lazy.dataloader.train.dataset.names.split == "train" and cfg.DATASETS.TRAIN == ("shapes_train",)
    assert f"shapes_{lazy.dataloader.test.dataset.names.split}" == cfg.DATASETS.TEST[test_index]
    for is_train, node in ((True, lazy.dataloader.train.mapper), (False, lazy.dataloader.test.mapper)):
        expected, mapper = DatasetMapper(cfg, is_train=is_train), instantiate(node)
        # annotations (instance masks, keypoints, proposals) are read for training only
        for key in ("is_train", "image_format") + (("use_instance_mask", "instance_mask_format", "recompute_boxes",
                                                     "use_keypoint", "proposal_topk") if is_train else ()):
            assert getattr(mapper, key) == getattr(expected, key), key
        theirs, ours = expected.augmentations.augs, mapper.augmentations.augs
        assert [type(a) for a in ours] == [type(a) for a in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert {k: set(v) if isinstance(v, tuple) else v for k, v in vars(a).items()} == \
                   {k: set(v) if isinstance(v, tuple) else v for k, v in vars(b).items()}
    train = lazy.dataloader.train
    assert (train.total_batch_size, train.num_workers, train.aspect_ratio_grouping, train.dataset.filter_empty) == (
        cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_WORKERS, cfg.DATALOADER.ASPECT_RATIO_GROUPING,
        cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
    # training: the optimizer's value for every parameter, the learning rate at every iteration
    ours, theirs = build_optimizer(lazy, lazy_model), Trainer.build_optimizer(cfg, yacs_model)
    names = {id(p): n for n, p in lazy_model.named_parameters()} | {id(p): n for n, p in yacs_model.named_parameters()}

    def by_parameter(optimizer):
        return {names[id(p)]: {k: v for k, v in group.items() if k not in ("params", "param_names", "foreach")}
                for group in optimizer.param_groups for p in group["params"]}

    assert by_parameter(ours) == by_parameter(theirs)
    assert "model" not in lazy.optimizer.params, "the model is not left in the config"
    schedule, expected = instantiate(lazy.lr_multiplier), Trainer.build_lr_scheduler(cfg, theirs)
    for iteration in range(0, cfg.SOLVER.MAX_ITER, 7):
        where = iteration / cfg.SOLVER.MAX_ITER
        assert schedule(where) == pytest.approx(expected._multiplier(where), rel=1e-12), iteration
    settings = lazy.train
    assert (settings.max_iter, settings.checkpointer.period, settings.eval_period, settings.seed, settings.device,
            settings.init_checkpoint) == (cfg.SOLVER.MAX_ITER, cfg.SOLVER.CHECKPOINT_PERIOD, cfg.TEST.EVAL_PERIOD,
                                          cfg.SEED, cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS)


@pytest.mark.parametrize("lazy_name", [p[0] for p in SHAPES_PAIRS])
def test_shapes_lazy_configs_survive_save_and_load(lazy_name, tmp_path):
    cfg = LazyConfig.load(str(LAZY / lazy_name))
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    assert not (tmp_path / "config.yaml.pkl").exists(), "saved as yaml, not pickled"
    reloaded = LazyConfig.load(str(tmp_path / "config.yaml"))
    # the same model (the saved file sorts keys, so parts are built, and drawn, in another order)
    assert repr(instantiate(reloaded.model)) == repr(instantiate(cfg.model))
    assert instantiate(reloaded.dataloader.shapes) == instantiate(cfg.dataloader.shapes)
    evaluator = OmegaConf.to_container(reloaded.dataloader.evaluator, resolve=True)
    assert evaluator["dataset_name"]["split"] == cfg.dataloader.test.dataset.names.split
    assert evaluator["output_dir"] == f"{cfg.train.output_dir}/inference"


def test_one_norm_node_per_part_reaches_exactly_that_part():
    cfg = LazyConfig.load(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    cfg.model.backbone.bottom_up.resnet.stem.norm.num_groups = 4  # GN of the whole ResNet
    cfg.model.backbone.bottom_up.norm.num_groups = 8  # GW at S1-B2
    model = instantiate(cfg.model)

    def groups(kind, part):
        return {m.num_groups for n, m in model.named_modules() if isinstance(m, kind) and part in n}

    assert groups(torch.nn.GroupNorm, "") == {4}
    assert groups(GroupWhitening, "bottom_up") == {8}
    assert groups(GroupWhitening, "fpn_") == groups(GroupWhitening, "roi_heads") == {16}


# ---- the embedded data from a LazyConfig ----

def test_shapes_dataset_registers_the_splits_of_its_spec_and_returns_the_name():
    from detectron2.data import DatasetCatalog, MetadataCatalog

    from gwdet.data import ShapesSpec, shapes_dataset

    spec = ShapesSpec(image_size=32, num_train=3, num_val=2, num_test=2, seed=5)
    assert shapes_dataset("val", spec) == "shapes_val"
    assert len(DatasetCatalog.get("shapes_val")) == 2 and len(DatasetCatalog.get("shapes_train")) == 3
    assert spec.folder_name() in MetadataCatalog.get("shapes_test").json_file
    with pytest.raises(ValueError, match="'validation' is not one of the shapes splits train, val, test"):
        shapes_dataset("validation", spec)
    with pytest.raises(TypeError, match=r"spec must be a gwdet.data.ShapesSpec .*L\(ShapesSpec\)"):
        shapes_dataset("train", {"image_size": 32})


# ---- overrides: checked keys, never a silent new one ----

def test_lazy_overrides_are_checked_against_the_config_and_the_nodes_arguments():
    from gwdet.engine.lazy import load_lazy_config

    demo = str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py")
    cfg = load_lazy_config(demo, ["train.max_iter=7", "dataloader.shapes.num_train=8",
                                  "dataloader.test.dataset.names.split=test",
                                  "model.roi_heads.box_predictor.test_nms_thresh=0.4",  # an argument left at its default
                                  "+train.note=mine"])
    assert (cfg.train.max_iter, cfg.dataloader.shapes.num_train, cfg.train.note) == (7, 8, "mine")
    assert cfg.model.roi_heads.box_predictor.test_nms_thresh == 0.4
    with pytest.raises(ValueError, match=r"'train.max_iters'.*Did you mean 'train.max_iter'\?"):
        load_lazy_config(demo, ["train.max_iters=7"])
    with pytest.raises(ValueError, match=r"no 'num_trian' under 'dataloader.shapes' \(ShapesSpec takes image_size"):
        load_lazy_config(demo, ["dataloader.shapes.num_trian=8"])
    with pytest.raises(ValueError, match=r"no 'trian'.*Did you mean 'dataloader.train'"):
        load_lazy_config(demo, ["dataloader.trian.num_workers=0"])
    # under a callable taking **kwargs (StandardROIHeads) a misspelt key passed the check: detectron2's bare TypeError
    with pytest.raises(ValueError, match=r"no 'num_clases' under 'model.roi_heads', and StandardROIHeads passes unknown "
                                         r"keywords on \(\*\*kwargs\).*Did you mean 'model.roi_heads.num_classes'\? "
                                         r"Write \+model.roi_heads.num_clases=\.\.\. to pass 'num_clases' on purpose"):
        load_lazy_config(demo, ["model.roi_heads.num_clases=7"])
    with pytest.raises(ValueError, match="is not key=value.*KEY VALUE pairs are for yacs configs"):
        load_lazy_config(demo, ["SOLVER.MAX_ITER", "7"])
    # below a reference to a shared node, a value would replace the reference: refused, naming it
    stage = "model.backbone.bottom_up.resnet.stages.1.norm"
    with pytest.raises(ValueError, match=rf"'{stage}' is \$\{{...stem.norm\}}, a reference to a node other settings"):
        load_lazy_config(demo, [f"{stage}.num_groups=4"])
    own = load_lazy_config(demo, [f"{stage}={{_target_: gwdet.norm, name: GN, num_groups: 4}}"])  # its own node
    model = instantiate(own.model)
    assert {m.num_groups for n, m in model.named_modules() if isinstance(m, torch.nn.GroupNorm)
            and n.startswith("backbone.bottom_up.res3.")} == {4}
    assert {m.num_groups for n, m in model.named_modules() if isinstance(m, torch.nn.GroupNorm)
            and n.startswith("backbone.bottom_up.res4.")} == {8}


def test_the_yacs_loader_names_a_lazy_config_instead_of_a_yaml_error():
    from gwdet.model_zoo import build_config

    with pytest.raises(ValueError, match=r"is a LazyConfig \(.py\), not a yacs config.*load_lazy_config"):
        build_config(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"))


# ---- flop counts of a LazyConfig GW model ----

@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_gwdets_flop_count_of_a_lazy_config_gw_model_is_complete_where_detectron2s_is_not():
    pytest.importorskip("detectron2.export", reason="gwdet.export needs detectron2 >= 0.7")
    from detectron2.utils.analysis import FlopCountAnalysis as Detectron2FlopCountAnalysis

    from gwdet.export import FlopCountAnalysis
    from gwdet.layers.cost import group_whitening_macs

    torch.manual_seed(0)
    model = instantiate(LazyConfig.load(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py")).model).eval()
    inputs = [{"image": torch.rand(3, 64, 64) * 255}]
    layers = {name: module for name, module in model.named_modules() if isinstance(module, GroupWhitening)}
    assert len(layers) == 33  # S1 + 16 B2 positions, 8 in the FPN, 4 in each head
    shapes: dict = {}

    def record(name):
        def hook(module, args, output):
            shapes.setdefault(name, tuple(args[0].shape))
        return hook

    hooks = [module.register_forward_hook(record(name)) for name, module in layers.items()]
    with torch.no_grad():
        model(inputs)
    for hook in hooks:
        hook.remove()

    ours, theirs = FlopCountAnalysis(model, inputs), Detectron2FlopCountAnalysis(model, inputs)
    for analysis in (ours, theirs):
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with torch.no_grad():
        counts = ours.by_model_module()
        theirs.total()
    for name, layer in layers.items():
        assert not ours.unsupported_ops(f"model.{name}"), name  # every operation of GW counted ...
        assert counts[name] == group_whitening_macs(shapes[name], layer.num_groups, layer.T), name  # ... as gwdet.layers.cost
    assert counts["backbone.bottom_up.stem.conv1.norm"] > 0
    # detectron2's own analysis (its tools/analyze_model.py) meets GW's operations one by one and
    # counts only its matrix products; what is left unsupported is detectron2's own (anchors, ROI align, ...)
    assert "aten::eye" in theirs.unsupported_ops("model.backbone.fpn_lateral2.norm")
    assert set(ours.unsupported_ops()) < set(theirs.unsupported_ops())
    assert set(ours.unsupported_ops()) <= {"prim::CallFunction", "aten::pad", "aten::topk", "torchvision::roi_align"}


@pytest.mark.parametrize("lazy, yacs", [("scratch_faster_rcnn_R_50_FPN_gw.py", "configs/Scratch/faster_rcnn_R_50_FPN_gw.yaml"),
                                        ("mask_rcnn_R_50_FPN_gw.py", "configs/mask_rcnn_gw.yaml")])
def test_a_lazy_config_reads_images_as_its_yacs_twin(lazy, yacs):
    # the scratch LazyConfig read BGR images with pixel std 1, where its yacs twin reads RGB with std ~58
    from gwdet.model_zoo import build_config

    from conftest import REPO

    cfg, twin = LazyConfig.load(str(LAZY / lazy)), build_config(str(REPO / yacs))
    assert cfg.model.input_format == cfg.dataloader.train.mapper.image_format == twin.INPUT.FORMAT
    assert list(cfg.model.pixel_mean) == list(twin.MODEL.PIXEL_MEAN)
    assert list(cfg.model.pixel_std) == list(twin.MODEL.PIXEL_STD)


def test_a_norm_object_in_a_lazyconfig_is_read_as_its_node_so_a_saved_config_reads_back(tmp_path):
    # the README's `conv_norm = gwdet.norm("GW", ...)` was saved as a Python tag in config.yaml, which
    # gwdet's own --eval-only from that config.yaml then refused
    import shutil

    from gwdet.model_zoo.lazy_loading import load_lazy_config

    folder = tmp_path / "LazyConfig"
    shutil.copytree(REPO / "configs" / "LazyConfig", folder)
    mine = folder / "mask_rcnn_R_50_FPN_gw_shapes.py"
    mine.write_text(mine.read_text() + "\nimport gwdet as _gwdet\n"
                    "model.roi_heads.box_head.conv_norm = _gwdet.norm('GW', num_groups=8)\n")
    cfg = load_lazy_config(str(mine))
    node = cfg.model.roi_heads.box_head.conv_norm
    assert node._target_ is gwdet.norm and (node.name, node.num_groups) == ("GW", 8)
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    assert "gwdet.norms.Norm" not in (tmp_path / "config.yaml").read_text()
    saved = load_lazy_config(str(tmp_path / "config.yaml")).model.roi_heads.box_head.conv_norm
    assert (saved._target_, saved.name, saved.num_groups) == ("gwdet.norm", "GW", 8)


def test_an_interpolation_a_wrapped_node_no_longer_resolves_is_named_when_the_config_is_loaded(tmp_path):
    # detectron2's mask_rcnn_fpn with its bottom_up wrapped in place_norm: omegaconf's raw "Interpolation key
    # 'bottom_up.out_features' not found" traceback from deep inside the run
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    config = tmp_path / "wrapped.py"
    config.write_text("from detectron2.config import LazyCall as L\nfrom detectron2.model_zoo import get_config\n"
                      "import gwdet\nfrom gwdet.modeling import place_norm\n\n"
                      "model = get_config('common/models/mask_rcnn_fpn.py').model\n"
                      "model.backbone.bottom_up = L(place_norm)(resnet=model.backbone.bottom_up, positions='S1-B2', "
                      "norm=L(gwdet.norm)(name='GW'))\n")
    with pytest.raises(ValueError, match=r"model.backbone.in_features cannot be resolved: Interpolation key "
                                         r"'bottom_up.out_features' not found. .* give the value itself, e.g. "
                                         r"model.backbone.in_features=\[...\]"):
        load_lazy_config(str(config))
    load_lazy_config(str(config), ["model.backbone.in_features=[res2,res3,res4,res5]"])


def test_the_comparison_copy_of_a_config_holding_a_lambda_is_saved_without_naming_its_temporary_folder(caplog):
    # detectron2's "Config is saved using cloudpickle at /tmp/tmpXXXX/config.yaml.pkl", a folder already deleted, was
    # the console's last word on where the run's config went
    import logging

    from gwdet.engine.lazy import saved_tree

    from conftest import LAZY_CONFIG

    cfg = load_lazy_config(str(LAZY_CONFIG))
    cfg.model.backbone.norm = lambda channels: torch.nn.GroupNorm(8, channels)
    with caplog.at_level(logging.WARNING):
        assert saved_tree(cfg)["model"]["_target_"]
    assert not [record.getMessage() for record in caplog.records if record.name.startswith("detectron2")]
    assert not logging.getLogger("detectron2.config.lazy").filters  # given back


def test_a_config_saved_with_gwdet_norm_objects_is_read_back_as_their_nodes(tmp_path):
    # LazyConfig.save writes a gwdet.norm(...) object as a Python tag, which gwdet refused, pointing at a .py
    # the config never had
    import functools

    cfg = LazyConfig.load(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    cfg.model.roi_heads.box_head.conv_norm = gwdet.norm("GW", num_groups=4, strict=True)
    LazyConfig.save(cfg, str(tmp_path / "saved.yaml"))
    loaded = load_lazy_config(str(tmp_path / "saved.yaml"))
    node = loaded.model.roi_heads.box_head.conv_norm
    assert node._target_ is gwdet.norm and (node.name, node.num_groups, node.strict) == ("GW", 4, True)
    built = instantiate(node)
    assert (built.name, built.params["num_groups"], built.strict) == ("GW", 4, True)
    # an object gwdet cannot read back: the message names the way to save it
    cfg.model.roi_heads.mask_head.conv_norm = functools.partial(GroupWhitening, num_groups=4)
    LazyConfig.save(cfg, str(tmp_path / "partial.yaml"))
    with pytest.raises(GwdetValueError, match=r"functools.partial would build a Python object .* give that value as a "
                                              r"node before saving it \(a norm: L\(gwdet.norm\)\(name='GW'"):
        load_lazy_config(str(tmp_path / "partial.yaml"))


def test_a_norm_value_the_norm_does_not_take_says_how_to_leave_it_out():
    # "gwdet.norm('GW_ZCA') takes ['num_groups', 'eps'], not ['T']" gave no way out in Python
    cfg = load_lazy_config(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"), ["model.backbone.norm.name=GW_ZCA"])
    with pytest.raises(TypeError, match=r"gwdet.norm\('GW_ZCA'\) takes \['num_groups', 'eps'\], not \['T'\]. Leave T "
                                        r"out; in a LazyConfig node that an override switched to 'GW_ZCA', set it to "
                                        r"null \(<the node's path>.T=null\)"):
        instantiate(cfg.model)


# the mapping was merged into the node: the layers kept the old node's T and eps, not the defaults
def test_a_node_given_by_an_override_replaces_the_node_it_is_set_on(tmp_path):
    source = (LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py").read_text(encoding="utf-8")
    assert '_GW = norm("GW", num_groups=16, T=5, eps=1.0e-5)' in source
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "shapes.py").write_text((LAZY / "common" / "shapes.py").read_text(encoding="utf-8"))
    config = tmp_path / "t3.py"
    config.write_text(source.replace('_GW = norm("GW", num_groups=16, T=5, eps=1.0e-5)',
                                     '_GW = norm("GW", num_groups=16, T=3, eps=1e-3)'))
    cfg = load_lazy_config(str(config), ["model.backbone.norm={_target_: gwdet.norm, name: GW, num_groups: 8}"])
    assert dict(cfg.model.backbone.norm) == {"_target_": "gwdet.norm", "name": "GW", "num_groups": 8}
    layer = instantiate(cfg.model.backbone.norm)(64)
    assert (layer.num_groups, layer.T, layer.eps) == (8, 5, 1e-5)  # the defaults of what the node leaves out
    switched = load_lazy_config(str(config), ["model.backbone.norm={_target_: gwdet.norm, name: GN, num_groups: 4}"])
    assert instantiate(switched.model.backbone.norm)(64).num_groups == 4  # no GW T or eps left to refuse
    merged = load_lazy_config(str(config), ["model.backbone.norm={num_groups: 4}"])  # no _target_: its keys are set
    assert (merged.model.backbone.norm.num_groups, merged.model.backbone.norm.T) == (4, 3)
    with pytest.raises(TypeError, match=r"LazyConfig override 'model.backbone.norm=\{_target_: gwdet.norm, name: GW, "
                                        r"num_group: 8\}': gwdet.norm\('GW'\) takes \['num_groups', 'T', 'eps'\], not "
                                        r"\['num_group'\]. Did you mean model.backbone.norm.num_groups \(not "
                                        r"num_group\)\?"):
        load_lazy_config(str(config), ["model.backbone.norm={_target_: gwdet.norm, name: GW, num_group: 8}"])
    with pytest.raises(ValueError, match=r"GroupNorm takes no argument 'num_group'; it takes .*Did you mean num_groups"):
        load_lazy_config(str(config), ["model.backbone.norm={_target_: torch.nn.GroupNorm, num_group: 8}"])


# accepted at load (gwdet.norm takes **params); instantiate then said to set it to null, never naming num_groups
def test_a_misspelt_setting_of_a_norm_node_is_refused_at_load_naming_the_close_one():
    config = str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py")
    with pytest.raises(TypeError) as refused:
        gwdet.model_zoo.get_config("LazyConfig/mask_rcnn_R_50_FPN_gw_shapes.py",
                                   opts=["model.backbone.norm.num_group=8"])
    assert str(refused.value) == ("model.backbone.norm: gwdet.norm('GW') takes ['num_groups', 'T', 'eps'], not "
                                  "['num_group']. Did you mean model.backbone.norm.num_groups (not num_group)?")
    with pytest.raises(TypeError, match=r"not \['group_size'\]. group_size is a setting of BW, BW_ItN, not of 'GW': "
                                        r"give the node a norm that takes it \(model.backbone.norm.name=BW\), or leave "
                                        r"it out.$"):
        load_lazy_config(config, ["model.backbone.norm.group_size=4"])
    switched = ["model.backbone.norm.T=null", "model.backbone.norm.num_groups=null", "model.backbone.norm.group_size=4"]
    for name_first in (True, False):  # the norm the node names after every override counts
        name = ["model.backbone.norm.name=BW"]
        cfg = load_lazy_config(config, name + switched if name_first else switched + name)
        assert instantiate(cfg.model.backbone.norm)(64).group_size == 4
    cfg = load_lazy_config(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"), ["model.backbone.norm.strict=true"])
    assert cfg.model.backbone.norm.strict is True
    # a misspelt setting written in the file itself: the Python refusal names the close one
    with pytest.raises(TypeError, match=r"not \['num_group'\]. Did you mean num_groups \(not num_group\)\?$"):
        gwdet.norm("GW", num_group=8)


# a config importing a missing module stopped with a 25-frame traceback ending in ModuleNotFoundError
def test_a_config_importing_a_missing_module_is_refused_naming_its_line_and_the_module(tmp_path):
    config = tmp_path / "my_lazy.py"
    config.write_text("x = 1\nimport nonexistent_module_xyz\n")
    with pytest.raises(GwdetValueError, match=r"^Config file '.*my_lazy.py' \(line 2: import nonexistent_module_xyz\) "
                                              r"cannot import 'nonexistent_module_xyz': no module "
                                              r"'nonexistent_module_xyz' is installed in this environment \(.*\). "
                                              r"Install it, or correct the import.$"):
        load_lazy_config(str(config))
    config.write_text("from detectron2.nosuch import x\n")
    with pytest.raises(GwdetValueError, match=r"\(line 1: from detectron2.nosuch import x\) cannot import "
                                              r"'detectron2.nosuch': 'detectron2' is installed but has no module "
                                              r"'detectron2.nosuch'. Correct the import.$"):
        load_lazy_config(str(config))
    (tmp_path / "sub.py").write_text("import nosuch_pkg.mod\n")
    config.write_text("from .sub import y\n")
    with pytest.raises(GwdetValueError, match=r"my_lazy.py' imports '.*sub.py', which \(line 1: import "
                                              r"nosuch_pkg.mod\) cannot import 'nosuch_pkg'"):
        load_lazy_config(str(config))
    # a ModuleNotFoundError with a message of its own keeps that message and its fix
    config.write_text("raise ModuleNotFoundError('detectron2 is not importable: install it first.', name='detectron2')\n")
    with pytest.raises(GwdetValueError, match=r"\(line 1: raise .*\) cannot import 'detectron2': detectron2 is not "
                                              r"importable: install it first.$"):
        load_lazy_config(str(config))


# an unknown top-level key was refused without naming the config's top-level keys or a way out
def test_an_unknown_top_level_key_is_refused_naming_the_top_level_keys():
    with pytest.raises(GwdetValueError) as refused:
        load_lazy_config(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"), ["train.max_iter=3", "foo.bar=1"])
    assert str(refused.value) == (
        "LazyConfig override 'foo.bar': the config has no 'foo' at the top of the config. The config's top-level keys "
        "are dataloader, lr_multiplier, model, optimizer, train; nothing reads a key added beside them, so set one of "
        "theirs (e.g. train.max_iter=...).")


# override norm.track_running_stats=no on the node of a registered BatchNorm2d: kept as the text 'no', built truthy
def test_a_text_override_for_a_flag_of_a_registered_norm_is_refused_when_loaded_and_when_built(registered, tmp_path):
    config = tmp_path / "own_norm.py"
    config.write_text("import torch\nimport gwdet\nfrom detectron2.config import LazyCall as L\n\n"
                      "if 'TestFlagBN3' not in gwdet.known_norm_names():\n"
                      "    gwdet.register_norm('TestFlagBN3', torch.nn.BatchNorm2d)\n"
                      "norm = L(gwdet.norm)(name='TestFlagBN3')\n")
    registered.append("TestFlagBN3")
    with pytest.raises(GwdetValueError, match=r"LazyConfig override 'norm.track_running_stats=no': "
                                              r"norm.track_running_stats is a boolean \(True\), and hydra reads 'no' "
                                              r"as the text 'no'.* write norm.track_running_stats=true or "
                                              r"norm.track_running_stats=false"):
        load_lazy_config(str(config), ["norm.track_running_stats=no"])
    cfg = load_lazy_config(str(config), ["norm.track_running_stats=false"])
    assert instantiate(cfg.norm)(8).track_running_stats is False
    cfg.norm.track_running_stats = "no"  # set past the override check: refused when the norm is built
    with pytest.raises(GwdetValueError, match=r"gwdet.norm\('TestFlagBN3'\): track_running_stats='no' is not True "
                                              r"or False"):
        instantiate(cfg.norm)


# configs/LazyConfig/mask_rcnn_R_50_FPN_gw.py had a top-level GW node (gw_parts.GW imported by that name) that an
# override GW.num_groups=32 changed while every GW layer kept 64 groups
def test_every_shipped_lazyconfig_holds_only_the_nodes_a_run_reads():
    from gwdet.model_zoo.lazy_loading import load_lazy_config

    configs = [path for path in sorted(LAZY.rglob("*.py")) if path.name != "gw_parts.py" and "common" not in path.parts]
    assert len(configs) >= 7
    for path in configs:
        assert set(load_lazy_config(str(path)).keys()) <= {"model", "dataloader", "optimizer", "lr_multiplier",
                                                             "train"}, path
    with pytest.raises(GwdetValueError, match=r"^LazyConfig override 'GW.num_groups': the config has no 'GW' at the "):
        load_lazy_config(str(LAZY / "mask_rcnn_R_50_FPN_gw.py"), ["GW.num_groups=32"])


# load_lazy_config(path, model='no') read 'no' as true and refused a file without a model
def test_load_lazy_config_refuses_a_model_flag_that_is_no_bool(tmp_path):
    config = tmp_path / "nomodel.py"
    config.write_text('train = dict(device="cpu", output_dir="x")\n')
    with pytest.raises(GwdetValueError, match=r"^load_lazy_config: model must be True or False, got 'no' \(str\), "
                                              r"which would be read as a truth value whatever it says: give model=True"):
        load_lazy_config(str(config), model="no")
    assert "model" not in load_lazy_config(str(config), model=False)


# a numpy number in a .py LazyConfig was taken: the run trained and saved a config.yaml with a numpy tag, which was
# then refused with "give that value as a node before saving it", a fix that did not apply
def test_a_numpy_value_in_a_python_lazy_config_is_refused_naming_its_key_and_the_python_value(tmp_path):
    from gwdet.model_zoo.lazy_loading import numpy_values

    source = (LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py").read_text(encoding="utf-8")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "shapes.py").write_text((LAZY / "common" / "shapes.py").read_text(encoding="utf-8"))
    config = tmp_path / "np_gw.py"
    config.write_text("import numpy as np\n" + source.replace(
        '_GW = norm("GW", num_groups=16, T=5, eps=1.0e-5)', '_GW = norm("GW", num_groups=np.int64(8), T=5, eps=1.0e-5)'
    ))
    with pytest.raises(GwdetValueError, match=r"^Config file '.*np_gw.py' holds numpy values: "
                                              r"model.backbone.bottom_up.norm.num_groups is np.int64\(8\), to give as 8 "
                                              r"\(int\(...\)\); model.backbone.norm.num_groups is np.int64\(8\), .*\. "
                                              r"LazyConfig.save writes them as tags that build Python objects, so "
                                              r"the config.yaml a run saves could not be read again: give Python values "
                                              r"\(int\(...\), float\(...\), bool\(...\); of a numpy array: .item\(\) or "
                                              r".tolist\(\)\).$"):
        load_lazy_config(str(config))
    config.write_text(source + "import numpy as np\ntrain.seed = np.array(3)\ntrain.amp.enabled = np.bool_(False)\n")
    with pytest.raises(GwdetValueError, match=r"holds numpy values: train.amp.enabled is np.False_, to give as False "
                                              r"\(bool\(...\)\); train.seed is array\(3\), to give as 3 \(.item\(\)\). "):
        load_lazy_config(str(config))
    found = dict(numpy_values(LazyConfig.load(str(config))))
    assert found == {"train.seed": 3, "train.amp.enabled": False}
    assert numpy_values(OmegaConf.create({"a": [1, {"b": (2.0, np.float32(0.5))}]}, flags={"allow_objects": True})) \
        == [("a.1.b.1", np.float32(0.5))]
    from gwdet.engine.lazy import LazyRun

    built = LazyConfig.load(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"))  # a config changed in Python
    built.model.backbone.norm = L(gwdet.norm)(name="GW", num_groups=np.int64(8))
    with pytest.raises(GwdetValueError, match=r"^The LazyConfig holds numpy values: model.backbone.norm.num_groups is "
                                              r"np.int64\(8\), to give as 8 \(int\(...\)\)"):
        LazyRun(built).check_request(eval_only=False, world_size=1)


# a numpy scalar in a node saved by LazyConfig.save was refused with "give that value as a node before saving it",
# although it was in such a node; the numpy value and int(...) were not named
def test_a_saved_lazy_config_with_a_numpy_tag_names_the_numpy_value_and_the_python_one(tmp_path):
    cfg = LazyConfig.load(str(LAZY / "mask_rcnn_R_50_FPN_gw_shapes.py"))
    cfg.model.backbone.norm = L(gwdet.norm)(name="GW", num_groups=np.int64(8), eps=np.float32(0.5))
    saved = tmp_path / "np.yaml"
    LazyConfig.save(cfg, str(saved))
    with pytest.raises(GwdetValueError, match=r"^Config file '.*np.yaml' is a LazyConfig saved as YAML, but it holds "
                                              r"numpy values, which LazyConfig.save writes as tags that would build "
                                              r"Python objects \(!!python/object/apply:numpy...\): "
                                              r"model.backbone.norm.eps is np.float32\(0.5\), to give as 0.5 "
                                              r"\(float\(...\)\); model.backbone.norm.num_groups is np.int64\(8\), to "
                                              r"give as 8 \(int\(...\)\). A saved LazyConfig holds plain values: in the "
                                              r"config built in Python, give Python values \(int\(...\), float\(...\), "
                                              r"bool\(...\); of a numpy array: .item\(\) or .tolist\(\)\) and save it "
                                              r"again, or write the value in place of its tag in this file.$"):
        load_lazy_config(str(saved))
    cfg.model.backbone.norm = L(gwdet.norm)(name="GW", num_groups=int(np.int64(8)), eps=float(np.float32(0.5)))
    LazyConfig.save(cfg, str(saved))  # the fix the message names
    assert load_lazy_config(str(saved)).model.backbone.norm.num_groups == 8
