"""update_running_statistics: the running statistics of torch's batch norms and of BW and BGN
become the mean of their batch statistics over a loader (what torch's update_bn gives batch norms)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn

from gwdet.errors import GwdetTypeError, GwdetValueError
from gwdet.layers import BatchGroupNorm, BatchWhitening, GroupWhitening, update_running_statistics


def batches(count: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [2.0 + torch.randn(4, 8, 5, 5, generator=generator, dtype=torch.float64) * (1 + k) for k in range(count)]


def test_batch_norms_get_what_torchs_update_bn_gives_them():
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.BatchNorm2d(8, momentum=None)).double()
    expected = copy.deepcopy(model)
    update_bn(batches(), expected)
    model.eval()
    assert update_running_statistics(batches(), model) == 3
    for name, buffer in expected.state_dict().items():
        assert torch.allclose(model.state_dict()[name].double(), buffer.double()), name
    assert not model.training and model[1].momentum == 0.1 and model[3].momentum is None


@pytest.mark.parametrize("layer", [BatchWhitening(8, group_size=4, momentum=0.3),
                                   BatchGroupNorm(8, num_groups=8, examples_per_group=2, momentum=0.3)],
                         ids=["BW", "GhostBN"])
def test_bw_and_bgn_running_means_are_the_mean_of_their_batch_means(layer):
    # torch's update_bn resets torch's batch norms only: these layers kept a first model's statistics
    model = nn.Sequential(layer.double())
    data = batches()
    update_running_statistics(data, model)
    batch_means = torch.stack([x.mean(dim=(0, 2, 3)) for x in data])
    assert torch.allclose(layer.running_mean, batch_means.mean(0))
    assert layer.momentum == 0.3
    if isinstance(layer, BatchGroupNorm):  # unbiased variances of each batch's ghost batches of 2 examples, averaged
        variances = torch.stack([torch.stack([x[i:i + 2].var(dim=(0, 2, 3)) for i in (0, 2)]).mean(0) for x in data])
        assert torch.allclose(layer.running_var, variances.mean(0))


def test_a_failing_forward_puts_the_statistics_back_and_a_model_without_any_is_refused():
    layer = BatchWhitening(8, group_size=4).double()
    model = nn.Sequential(layer)
    model(batches(1)[0])
    before = {name: value.clone() for name, value in layer.state_dict().items()}
    with pytest.raises(GwdetValueError, match="expected input of shape"):
        update_running_statistics([batches(1)[0], torch.zeros(2, 3, 5, 5, dtype=torch.float64)], model)
    after = layer.state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    with pytest.raises(GwdetValueError, match="the loader gave no batch"):
        update_running_statistics([], model)
    with pytest.raises(GwdetValueError, match="has no layer with running statistics"):
        update_running_statistics(batches(), nn.Sequential(GroupWhitening(8, num_groups=2)))


def test_a_model_that_needs_detectron2s_event_storage_is_told_to_open_one():
    # usage.md's recipe with a detectron2 model in training mode: detectron2's bare AssertionError
    from detectron2.utils.events import EventStorage, get_event_storage

    class Recording(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm2d(3)

        def forward(self, batch):
            get_event_storage()  # as detectron2's RPN and ROI heads record their sampling in training mode
            return self.norm(batch)

    model = Recording()
    before = model.norm.running_mean.clone()
    with pytest.raises(RuntimeError, match=r"none is open: call it inside `with detectron2.utils.events.EventStorage"
                                           r"\(\):`. The running statistics are as they were."):
        update_running_statistics([torch.randn(2, 3, 4, 4)], model)
    assert torch.equal(model.norm.running_mean, before)
    with EventStorage():
        assert update_running_statistics([torch.randn(2, 3, 4, 4)], model) == 1


def test_one_batch_given_instead_of_batches_is_named():
    # next(iter(loader)), a list of dataset dicts, was taken as batches: detectron2's "string indices must be
    # integers" from inside the model
    class ListModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(2)

        def forward(self, batch):
            return self.norm(torch.stack([record["x"] for record in batch]))

    model = ListModel()
    before = model.norm.running_mean.clone()
    batch = [{"x": torch.randn(2)} for _ in range(4)]
    with pytest.raises(TypeError, match=r"^update_running_statistics: the loader gave a dict \(one image's record, "
                                        r"as iterating over a single batch gives\), not a batch: .*\[batch\] for one "
                                        r"batch\). The running statistics are as they were.$"):
        update_running_statistics(batch, model)
    assert torch.equal(model.norm.running_mean, before)
    assert update_running_statistics([batch], model) == 1


def test_test_batches_without_annotations_are_named_for_a_detector():
    # the test loader's batches (no 'instances'): detectron2's bare "RPN requires gt_instances in training!"
    class Detector(nn.Module):  # what update_running_statistics reads of a detectron2 detector: its proposal generator
        def __init__(self):
            super().__init__()
            self.proposal_generator = nn.Identity()
            self.norm = nn.BatchNorm1d(2)

        def forward(self, batch):
            return self.norm(torch.stack([record["x"] for record in batch]))

    model = Detector()
    before = model.norm.running_mean.clone()
    with pytest.raises(ValueError, match=r"^update_running_statistics: the batches carry no annotations \('instances' "
                                         r"in each image's dict\), .*not a test loader's. The running statistics are "
                                         r"as they were.$"):
        update_running_statistics([[{"x": torch.randn(2)} for _ in range(4)]], model)
    assert torch.equal(model.norm.running_mean, before)
    assert update_running_statistics([[{"x": torch.randn(2), "instances": None} for _ in range(4)]], model) == 1


def test_layers_of_classes_it_does_not_know_that_keep_statistics_are_named_and_left_as_they_were():
    # a norm of one's own registered with batch_statistics=True: its statistics were neither reset nor averaged,
    # without a word
    from detectron2.layers import FrozenBatchNorm2d

    class OwnNorm(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.momentum = 0.5
            self.register_buffer("running_mean", torch.full((channels,), 7.0, dtype=torch.float64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                self.running_mean.lerp_(x.mean(dim=(0, 2, 3)), self.momentum)
            return x - self.running_mean.view(1, -1, 1, 1)

    frozen = FrozenBatchNorm2d(8)  # statistics without a momentum: frozen on purpose, not named
    model = nn.Sequential(nn.BatchNorm2d(8).double(), OwnNorm(8), frozen.double())
    with pytest.warns(RuntimeWarning) as warned:
        update_running_statistics(batches(), model)
    assert [str(w.message) for w in warned] == [
        "update_running_statistics: 1 layer(s) of classes it does not know keep running statistics (1 (OwnNorm)): "
        "they are left as they were (it recomputes torch's batch norms, BW, BGN and GhostBN). Recompute theirs as "
        "their class defines its momentum."]
    assert torch.allclose(model[0].running_mean, torch.stack([x.mean(dim=(0, 2, 3)) for x in batches()]).mean(0))
    assert torch.equal(model[1].running_mean, torch.full((8,), 7.0, dtype=torch.float64))  # its forward moved them


def test_detectron2s_endless_training_loader_is_refused_naming_islice():
    # usage.md's recipe without itertools.islice ran without end and without a word
    import itertools

    from detectron2.data import build_detection_train_loader
    from detectron2.data.samplers import TrainingSampler

    images = [torch.randn(2, 3, 4, 4) for _ in range(4)]
    loader = build_detection_train_loader(images, mapper=lambda image: image, total_batch_size=1,
                                          sampler=TrainingSampler(len(images)), num_workers=0,
                                          aspect_ratio_grouping=False)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(3))
    with pytest.raises(ValueError, match=r"the loader is detectron2's training loader, which draws batches without end "
                                         r".* e.g. itertools.islice\(loader, 200\)"):
        update_running_statistics(loader, model)
    assert update_running_statistics((torch.cat(batch) for batch in itertools.islice(loader, 2)), model) == 2


def test_a_model_that_is_no_module_is_named_with_the_order_of_the_arguments():
    # update_running_statistics(batches, [layer]), or the two swapped: a raw AttributeError from model.modules()
    from gwdet.errors import GwdetTypeError

    layer = nn.BatchNorm2d(4)
    batches = [torch.randn(2, 4, 3, 3)]
    with pytest.raises(GwdetTypeError, match=r"model must be a torch.nn.Module .*, got list; call it as "
                                             r"update_running_statistics\(loader, model\)"):
        update_running_statistics(batches, [layer])
    with pytest.raises(GwdetTypeError, match=r"got list \(the loader and the model given the other way round\?\)"):
        update_running_statistics(layer, batches)


def test_a_loader_that_is_no_iterable_of_batches_is_named():
    # update_running_statistics(None, model): "TypeError: 'NoneType' object is not iterable"
    model = torch.nn.Sequential(BatchWhitening(16, group_size=4))
    before = model[0].running_whitening.clone()
    for loader in (None, 3, "batches"):
        with pytest.raises(TypeError, match=r"update_running_statistics: loader must be an iterable of batches .* got "
                                            rf"{type(loader).__name__}; the running statistics are as they were"):
            update_running_statistics(loader, model)
    assert torch.equal(model[0].running_whitening, before)


# Before: every submodule came back in the model's mode, losing the per-module modes the user set.
@pytest.mark.parametrize("model_training", [True, False])
def test_each_modules_own_mode_is_restored(model_training):
    model = nn.Sequential(nn.Conv2d(8, 8, 1).double(), nn.BatchNorm2d(8).double(), nn.Dropout(0.5))
    model.train(model_training)
    model[0].train(not model_training)
    model[2].train(not model_training)
    modes = [module.training for module in model.modules()]
    update_running_statistics(batches(), model)
    assert [module.training for module in model.modules()] == modes


# Before: batches [x, y] of a DataLoader(TensorDataset(x, y)) gave a raw TypeError from conv2d().
def test_batches_of_inputs_and_targets_name_the_forward_argument():
    model = nn.Sequential(nn.Conv2d(8, 8, 1).double(), nn.BatchNorm2d(8).double())
    pairs = [[x, torch.zeros(4)] for x in batches()]
    before = model[1].running_mean.clone()
    with pytest.raises(GwdetTypeError, match=r"a list of 2 tensors \(as a DataLoader of a TensorDataset gives.*"
                                             r"forward=lambda m, b: m\(b\[0\]\)"):
        update_running_statistics(pairs, model)
    assert torch.equal(model[1].running_mean, before)
    assert update_running_statistics(pairs, model, forward=lambda m, b: m(b[0])) == 3
    # an input with a label that is no tensor (an int, a string) got conv2d's raw TypeError
    for labelled in ([(x, 0) for x in batches()], [[x, "a"] for x in batches()]):
        with pytest.raises(GwdetTypeError, match=r"of 2 items, the first a tensor \(as a DataLoader of a TensorDataset "
                                                 r"gives.*forward=lambda m, b: m\(b\[0\]\)"):
            update_running_statistics(labelled, model)


# Before: dict batches of a plain model got advice for detectron2 models only, not forward=lambda m, b: m(**b).
def test_dict_batches_of_a_plain_model_name_keyword_forward():
    class KeywordModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm2d(8).double()

        def forward(self, pixel_values):
            return self.norm(pixel_values)

    model = KeywordModel()
    loader = [{"pixel_values": x} for x in batches()]
    with pytest.raises(GwdetTypeError, match=r"keyword arguments, pass forward=lambda m, b: m\(\*\*b\)"):
        update_running_statistics(loader, model)
    assert update_running_statistics(loader, model, forward=lambda m, b: m(**b)) == 3


# Before: raw TypeError: 'str' object is not callable.
def test_a_forward_that_is_not_callable_is_named():
    with pytest.raises(GwdetTypeError, match="forward must be a callable forward.model, batch. .*, got str 'model'"):
        update_running_statistics(batches(), nn.Sequential(nn.BatchNorm2d(8)), forward="model")


# Before: "has no layer with running statistics", misleading: the scripted layers hold them.
@pytest.mark.parametrize("jit", ["script", "trace"])
def test_a_scripted_or_traced_model_is_told_to_recompute_before(jit):
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)).double()
    compiled = torch.jit.script(model) if jit == "script" else torch.jit.trace(model, batches(1)[0])
    with pytest.raises(GwdetTypeError, match=r"the model \(Sequential\) is scripted or traced .*recompute them on "
                                             "the eager model first"):
        update_running_statistics(batches(), compiled)


# update_running_statistics(itertools.repeat(batch), model) (or count, cycle) ran without end and without a word
def test_an_endless_itertools_iterator_is_refused_naming_islice():
    import itertools

    model = nn.Sequential(nn.BatchNorm2d(8)).double()
    before = model[0].running_mean.clone()
    batch = batches(1)[0]
    ran = []

    def forward(model, batch):  # fails rather than runs on where the endless loader is not refused
        ran.append(1)
        assert len(ran) < 50, "update_running_statistics ran on an endless loader"
        return model(batch)

    for loader, kind in ((itertools.repeat(batch), "repeat"), (itertools.cycle([batch]), "cycle"),
                         (itertools.count(), "count")):
        with pytest.raises(GwdetValueError, match=rf"^update_running_statistics: the loader is an itertools.{kind} object, "
                                                  r"which yields batches without end, so the recomputation would "
                                                  r"never finish: give a finite number of batches, e.g. "
                                                  r"itertools.islice\(loader, 200\), or a list of them"):
            update_running_statistics(loader, model, forward)
    assert torch.equal(model[0].running_mean, before) and not ran
    assert update_running_statistics(itertools.repeat(batch, 2), model) == 2  # a number of times: finite
    assert update_running_statistics(itertools.islice(itertools.cycle([batch]), 3), model) == 3


# update_running_statistics(loader, model, device=torch.device("cpu")), update_bn's call, was a raw TypeError
def test_device_moves_each_batch_as_torchs_update_bn_does():
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)).double()
    expected = copy.deepcopy(model)
    update_bn(batches(), expected, device=torch.device("cpu"))
    assert update_running_statistics(batches(), model, device=torch.device("cpu")) == 3
    for name, buffer in expected.state_dict().items():
        assert torch.allclose(model.state_dict()[name].double(), buffer.double()), name
    seen = []

    def forward(model, batch):  # the batch arrives moved (meta tensors hold no values: the model runs on a copy)
        tensors = [batch[0], batch[1]["x"], *batch[2]]
        seen.extend(tensor.device.type for tensor in tensors)
        return model(torch.ones(4, 8, 5, 5, dtype=torch.float64))

    loader = [(x, {"x": x, "name": "a"}, [x]) for x in batches(2)]
    assert update_running_statistics(loader, model, forward, device="meta") == 2
    assert seen == ["meta"] * 6 and all(x.device.type == "cpu" for x in loader[0][2])  # the loader's stay


# update_bn's positional device went to forward: "forward must be a callable ..., got str 'cpu'" with no way to give it
def test_a_device_in_forwards_place_names_the_device_keyword_and_bad_devices_are_refused():
    model = nn.Sequential(nn.BatchNorm2d(8)).double()
    before = model[0].running_mean.clone()
    with pytest.raises(GwdetTypeError, match=r"got str 'cpu'; the device torch\.optim\.swa_utils\.update_bn takes in "
                                             r"third place goes by keyword here: update_running_statistics\(loader, "
                                             r"model, device='cpu'\)"):
        update_running_statistics(batches(), model, "cpu")
    with pytest.raises(GwdetValueError, match=r"device must be a torch\.device, .* got str 'gpu', which torch does not "
                                              "read as a device"):
        update_running_statistics(batches(), model, device="gpu")
    with pytest.raises(GwdetTypeError, match=r"device must be a torch\.device, .* got float 1\.5;"):
        update_running_statistics(batches(), model, device=1.5)
    if not torch.cuda.is_available():
        with pytest.raises(GwdetValueError, match=r"^update_running_statistics: device 'cuda' is a CUDA device, but "
                                                  r"CUDA is not available on this machine .*; give a device this "
                                                  "machine has"):
            update_running_statistics(batches(), model, device="cuda")
    assert torch.equal(model[0].running_mean, before)


# device="meta" reached torch: "Tensor on device meta is not on the expected device cpu!"
def test_a_device_the_batches_would_not_reach_the_layers_on_is_refused_naming_the_models_device():
    model = nn.Sequential(BatchGroupNorm(8, num_groups=2)).double()
    before = model[0].running_mean.clone()
    with pytest.raises(GwdetValueError, match=r"^update_running_statistics: device 'meta' holds no values \(a meta "
                                              r"tensor has a shape and no data\), so no statistics can come of the "
                                              r"batches moved there; the model's layers with running statistics are on "
                                              r"cpu: give device='cpu' \(the device of the model's layers\), or leave "
                                              r"device out .* The running statistics are as they were\.$"):
        update_running_statistics(batches(), model, device="meta")
    assert torch.equal(model[0].running_mean, before)
    on_meta = nn.Sequential(BatchGroupNorm(8, num_groups=2, device="meta"))
    with pytest.raises(GwdetValueError, match=r"^update_running_statistics: device 'cpu' is not the device of the "
                                              r"model's layers with running statistics \(meta\): each batch would be "
                                              r"moved there while the model stays where it is .* Materialize the model "
                                              r"there first: model.to_empty\(device='cpu'\)"):
        update_running_statistics(batches(), on_meta, device="cpu")
    if torch.cuda.is_available():
        with pytest.raises(GwdetValueError, match=r"device 'cuda' is not the device of the model's layers with running "
                                                  r"statistics \(cpu\): .* Give device='cpu' \(the device of the model's "
                                                  r"layers\) or leave device out, or move the model there first: "
                                                  r"model.to\('cuda'\)\."):
            update_running_statistics(batches(), model, device="cuda")
        assert update_running_statistics(batches(), model.cuda(), device="cuda") == 3
        assert update_running_statistics(batches(), model, device=torch.cuda.current_device()) == 3
    assert update_running_statistics(batches(), model.cpu(), device="cpu") == 3


# Before: it returned 2 without a word, leaving NaN running statistics (which gwdet's own loader refuses).
# (BW scales huge inputs, so that its running statistics stay finite at 1e30; BGN's running_var overflows)
@pytest.mark.parametrize("bad, cause, layer", [
    (float("nan"), "the batch holds NaN or infinite values", lambda: BatchWhitening(16, group_size=4)),
    (float("nan"), "the batch holds NaN or infinite values", lambda: BatchGroupNorm(16, num_groups=4)),
    (1e30, "so large that their variance overflows torch.float32", lambda: BatchGroupNorm(16, num_groups=4)),
], ids=["BW-nan", "BGN-nan", "BGN-huge"])
def test_a_batch_that_makes_the_running_statistics_non_finite_is_refused_and_they_are_put_back(bad, cause, layer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), layer())
    model[1].running_mean.fill_(0.25)
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    with pytest.raises(GwdetValueError, match=rf"^update_running_statistics: batch 2 of the loader made the running "
                                              rf"statistics of 1 layer\(s\) NaN or infinite \(1 \({type(model[1]).__name__}: "
                                              rf"running_.*\): .*{cause}.* The running statistics are as they were\.$"):
        update_running_statistics([torch.randn(4, 3, 8, 8), torch.full((4, 3, 8, 8), bad)], model)
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name


# Before: torch's raw "Input type (float) and bias type (c10::Half) should be the same" from the model's Conv2d.
def test_batches_of_another_dtype_than_the_model_are_named_with_both_dtypes():
    model = nn.Sequential(nn.Conv2d(3, 16, 3), BatchGroupNorm(16, num_groups=4)).half()
    with pytest.raises(GwdetTypeError, match=r"the batches are torch.float32 and the model's weights torch.float16, "
                                             r".*forward=lambda m, b: m\(b.to\(torch.float16\)\) \(or the model to the "
                                             r"batches': model.float\(\)\)\. The running statistics are as they were"):
        update_running_statistics([torch.randn(4, 3, 8, 8)], model)
    assert torch.equal(model[1].running_var, torch.ones(16, dtype=torch.float16))


# Before: the error named a layer's input shape ([16, 6, 6]), not that the loader was one batch.
def test_a_single_batch_tensor_given_as_the_loader_is_told_to_give_a_list():
    model = nn.Sequential(nn.Conv2d(3, 16, 3), BatchWhitening(16, group_size=4))
    with pytest.raises(GwdetTypeError, match=r"the loader is a single tensor of shape \[4, 3, 8, 8\], iterating over "
                                             r"which gives its items one by one \(of shape \[3, 8, 8\]\).*for one "
                                             r"batch give \[batch\]"):
        update_running_statistics(torch.randn(4, 3, 8, 8), model)
    assert update_running_statistics([torch.randn(4, 3, 8, 8)], model) == 1


class _TwoBranches(torch.nn.Module):
    """A model whose forward reaches one of its two batch norms."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.BatchNorm2d(4), BatchGroupNorm(4, num_groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


# the momentum was 1/k at the k-th batch whatever the forward did: layers called twice per batch, or on some batches
# only, ended away from the mean of their batch statistics; a layer the forward never reached, or a forward that ran
# no layer in training mode (it never called the model, or called model.eval() first), left reset statistics
@pytest.mark.parametrize("layer", [lambda: torch.nn.BatchNorm2d(4), lambda: BatchWhitening(4, group_size=2),
                                   lambda: BatchGroupNorm(4, num_groups=4, examples_per_group=8)],
                         ids=["BN", "BW", "BGN"])
def test_the_statistics_are_the_mean_over_each_layers_calls_and_uncalled_layers_keep_theirs(layer):
    torch.manual_seed(0)
    batches = [torch.randn(8, 4, 5, 5) * 2 + 1 for _ in range(4)]
    model = torch.nn.Sequential(layer())
    update_running_statistics(batches, model, forward=lambda m, b: (m(b), m(b)))  # each layer called twice per batch
    assert torch.allclose(model[0].running_mean, torch.cat(batches).mean(dim=(0, 2, 3)), atol=1e-5)
    seen = [batches[1], batches[3]]
    update_running_statistics(enumerate(batches), model, forward=lambda m, b: m(b[1]) if b[0] % 2 else None)
    assert torch.allclose(model[0].running_mean, torch.cat(seen).mean(dim=(0, 2, 3)), atol=1e-5)
    before = model[0].running_mean.clone()
    for forward in (lambda m, b: None, lambda m, b: m.eval()(b)):
        with pytest.raises(GwdetValueError, match=r"the forward called none of the model's layers with running "
                                                  r"statistics in training mode over 4 batch\(es\).*as they were\.$"):
            update_running_statistics(batches, model, forward=forward)
        assert torch.equal(model[0].running_mean, before)


def test_a_layer_the_forward_never_reaches_keeps_its_statistics_with_a_warning():
    model = _TwoBranches()
    model.unused.running_mean.fill_(7.0)
    with pytest.warns(RuntimeWarning, match=r"the forward never called 1 of the layers with running statistics in "
                                            r"training mode \(unused: a branch the batches do not reach\?\); their "
                                            r"running statistics are kept as they were\."):
        update_running_statistics([torch.randn(8, 4, 5, 5)], model)
    assert torch.equal(model.unused.running_mean, torch.full((4,), 7.0))
