"""Checkpoints and weights gwdet reads itself never execute code unless the user opts in."""
import pathlib
import pickle
import re

import numpy as np
import pytest
import torch
import torchvision

from gwdet.checkpoint.safe_load import load_torch_file
from gwdet.errors import GwdetError
from gwdet.checkpoint.resilient import (
    UNSAFE_PICKLE_ENV,
    UnsafeCheckpointError,
    load_pickle_weights,
    load_torch_checkpoint,
)


class Payload:
    """Stands for any class a malicious file could ask the unpickler to build."""


def test_plain_checkpoint_loads(tmp_path):
    path = tmp_path / "ok.pth"
    torch.save({"model": {"w": torch.ones(2)}, "iteration": 3}, path)
    assert load_torch_checkpoint(str(path))["iteration"] == 3


def test_checkpoint_with_arbitrary_objects_is_refused_unless_opted_in(tmp_path, monkeypatch):
    path = tmp_path / "unsafe.pth"
    torch.save({"model": {"w": torch.ones(2)}, "extra": Payload()}, path)
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_torch_checkpoint(str(path))
    assert "execute arbitrary code" in str(err.value) and UNSAFE_PICKLE_ENV in str(err.value)
    monkeypatch.setenv(UNSAFE_PICKLE_ENV, "1")
    assert isinstance(load_torch_checkpoint(str(path))["extra"], Payload)


def test_numpy_pickle_weights_load_and_code_is_refused(tmp_path, monkeypatch):
    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps({"model": {"stem.conv1.weight": np.ones((2, 3), np.float32)}, "__author__": "t"}))
    assert load_pickle_weights(str(good))["model"]["stem.conv1.weight"].shape == (2, 3)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"model": Payload()}))
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError, match="Payload"):
        load_pickle_weights(str(bad))


def test_an_archive_whose_pickle_is_cut_is_damaged_not_unsafe(tmp_path):
    """A cut pickle ends inside a global's name (``torch.Flo...``): that is damage, not a need for
    unsafe unpickling, so torch's own error comes through instead of an UnsafeCheckpointError."""
    import zipfile

    whole, cut = tmp_path / "whole.pth", tmp_path / "cut.pth"
    torch.save({"model": {"w": torch.zeros(3)}}, whole)
    with zipfile.ZipFile(whole) as source, zipfile.ZipFile(cut, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            target.writestr(name, data[: len(data) // 2] if name.endswith("data.pkl") else data)
    with pytest.raises(Exception) as err:
        load_torch_file(str(cut), allow_unsafe=False, how_to_opt_in="set X")
    assert not isinstance(err.value, UnsafeCheckpointError)
    assert isinstance(load_torch_file(str(whole), allow_unsafe=False, how_to_opt_in="set X"), dict)


def test_pickle_weights_needing_code_load_only_when_opted_in_and_the_refusal_names_file_and_fix(tmp_path):
    from gwdet.checkpoint.safe_load import load_pickle_file

    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"model": Payload()}))
    with pytest.raises(UnsafeCheckpointError) as err:
        load_pickle_file(str(bad), allow_unsafe=False, how_to_opt_in="set GWDET_X=1")
    message = str(err.value)
    assert message.startswith(f"{bad}: refusing to load this file.") and "contains test_safe_loading.Payload" in message
    assert "If you trust where the file comes from, set GWDET_X=1;" in message
    assert isinstance(load_pickle_file(str(bad), allow_unsafe=True, how_to_opt_in="")["model"], Payload)
    # detectron2's zoo files are Python 2 pickles: their byte strings are read as latin-1 text
    py2 = tmp_path / "py2.pkl"
    py2.write_bytes(b"\x80\x02}q\x00U\x03\xe9t\xe9q\x01K\x01s.")  # {b'\xe9t\xe9' (a Python 2 str): 1}
    assert load_pickle_file(str(py2), allow_unsafe=False, how_to_opt_in="") == {"été": 1}


def test_a_file_torch_save_did_not_write_is_named_with_the_fix(tmp_path):
    from gwdet.checkpoint.safe_load import NotACheckpointError

    text = tmp_path / "weights.pth"
    text.write_bytes(b"not a checkpoint at all")
    with pytest.raises(NotACheckpointError) as err:
        load_torch_file(str(text), allow_unsafe=False, how_to_opt_in="")
    assert str(err.value) == (
        f"{text} is not a PyTorch checkpoint: it does not start like a file written by torch.save (a zip archive or "
        "a pickle). Check the path (MODEL.WEIGHTS, OUTPUT_DIR; a LazyConfig's train.init_checkpoint, "
        "train.output_dir), or convert ImageNet weights with tools/convert_pretrained.py.")


def test_a_zip_without_a_pickle_is_not_taken_for_a_complete_checkpoint(tmp_path):
    import zipfile

    from gwdet.checkpoint.safe_load import _pickle_is_complete

    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as target:
        target.writestr("readme.txt", "not torch")
    assert _pickle_is_complete(str(archive)) is False
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    assert _pickle_is_complete(str(tmp_path / "broken.zip")) is False


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_numpy_pickle_weights_of_every_protocol_load(tmp_path, protocol):
    # protocol 5 pickles arrays with numpy's _frombuffer, protocol 2 bytes with _codecs.encode: both were refused
    # as needing unsafe unpickling, though detectron2 reads them
    weights = {"stem.conv1.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.ones(3, np.float64)}
    path = tmp_path / f"protocol{protocol}.pkl"
    path.write_bytes(pickle.dumps({"model": weights, "__author__": "me"}, protocol=protocol))
    loaded = load_pickle_weights(str(path))["model"]
    assert all(np.array_equal(loaded[key], value) and loaded[key].dtype == value.dtype for key, value in weights.items())


def test_torch_saves_legacy_format_of_another_protocol_is_named_and_loads_when_opted_in(tmp_path):
    # before: "is a pickle ... not a file torch.save writes: name it with the .pkl suffix", which then failed too
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "legacy4.pth"
    torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with pytest.raises(GwdetError, match=r"legacy4.pth was written by torch.save in its legacy format "
                                         r"\(_use_new_zipfile_serialization=False\) with pickle protocol 4, .* or opt "
                                         r"in to load it as it is.$"):
        load_torch_file(str(path), allow_unsafe=False, how_to_opt_in="opt in")
    loaded = load_torch_file(str(path), allow_unsafe=True, how_to_opt_in="opt in")
    assert torch.equal(loaded["weight"], model.weight)
    torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False)  # protocol 2: weights-only reads it
    assert torch.equal(load_torch_file(str(path), allow_unsafe=False, how_to_opt_in="")["weight"], model.weight)


def test_python2_pickle_weights_needing_code_load_as_text_when_opted_in(tmp_path):
    from gwdet.checkpoint.safe_load import load_pickle_file

    py2 = tmp_path / "py2_set.pkl"
    py2.write_bytes(b"\x80\x02c__builtin__\nset\nq\x00]q\x01U\x03\xe9t\xe9q\x02a\x85q\x03Rq\x04.")  # set(['été'])
    with pytest.raises(UnsafeCheckpointError, match="contains __builtin__.set"):
        load_pickle_file(str(py2), allow_unsafe=False, how_to_opt_in="")
    assert load_pickle_file(str(py2), allow_unsafe=True, how_to_opt_in="") == {"été"}


def _loading_refusal(model: torch.nn.Module, path) -> str:
    """The message gwdet's checkpointer refuses the weights file ``path`` for ``model`` with."""
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.errors import GwdetError

    with pytest.raises(GwdetError) as refused:
        ResilientCheckpointer(model, save_dir=str(path.parent)).load_weights(str(path))
    return str(refused.value)


def test_a_torchscript_model_or_weights_wrapped_in_another_key_are_named_as_such(tmp_path):
    # before: "damaged or cut short" for an export, "neither tensors nor arrays" for a wrapped state dict

    model = torch.nn.Linear(2, 2)
    torch.jit.save(torch.jit.trace(model, torch.zeros(1, 2)), str(tmp_path / "model.ts"))
    assert _loading_refusal(model, tmp_path / "model.ts") == (
        f"{tmp_path / 'model.ts'} is a TorchScript model (written by torch.jit.save, e.g. an exported model.ts), not a "
        "checkpoint: its weights are compiled into the model; nothing was loaded from it. Give the torch.save "
        "checkpoint the model was exported from (e.g. output/run/model_final.pth); gwdet.export.load_export runs the "
        "export.")
    torch.onnx.export(model, (torch.zeros(1, 2),), str(tmp_path / "model.onnx"), dynamo=False)
    assert _loading_refusal(model, tmp_path / "model.onnx") == (  # before: "does not start like a file torch.save writes"
        f"{tmp_path / 'model.onnx'} is an ONNX model (e.g. an exported model.onnx), not a checkpoint: detectron2's "
        "checkpointer does not read ONNX's format; nothing was loaded from it. Give the torch.save checkpoint the model "
        "was exported from (e.g. output/run/model_final.pth); onnxruntime runs the export (docs/deploy.md).")
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, tmp_path / "wrapped.pth")
    assert _loading_refusal(model, tmp_path / "wrapped.pth") == (
        f"{tmp_path / 'wrapped.pth'} holds its weights under 'state_dict' (as some training frameworks save them), "
        "where detectron2's checkpointer reads the file itself or its 'model'. Save that entry on its own, e.g. "
        "torch.save(torch.load(path)['state_dict'], 'weights.pth'), and give that file.")
    # the GW authors' ImageNet files (a DataParallel ResNet under 'state_dict'): the advice above led to a second
    # refusal, "needs converting first"
    resnet = {f"module.{key}": value for key, value in torchvision.models.resnet18().state_dict().items()}
    torch.save({"state_dict": resnet, "epoch": 90}, tmp_path / "authors.pth")
    assert _loading_refusal(model, tmp_path / "authors.pth") == (
        f"{tmp_path / 'authors.pth'} holds a torchvision-layout ResNet under 'state_dict' (keys like 'conv1.weight'): "
        "ImageNet weights that need converting into detectron2's names first, which the converter does with that "
        "entry as it is. Convert them with tools/convert_pretrained.py IN OUT (docs/weights.md) and give OUT as the "
        "weights.")


def test_a_pickle_of_weights_named_pth_is_told_to_take_the_pkl_suffix(tmp_path):
    # before: "does not start like a file written by torch.save (a zip archive or a pickle)", though it is a pickle
    import pickle

    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torch.nn.Linear(2, 2)
    with open(tmp_path / "converted.pth", "wb") as f:
        pickle.dump({key: value.numpy() for key, value in model.state_dict().items()}, f, protocol=4)
    assert _loading_refusal(model, tmp_path / "converted.pth") == (
        f"{tmp_path / 'converted.pth'} is a pickle, as detectron2's .pkl weights are (gwdet's converter writes those), "
        "not a file torch.save writes: name it with the .pkl suffix, which detectron2's checkpointer reads as pickled "
        "weights.")
    (tmp_path / "converted.pth").rename(tmp_path / "converted.pkl")
    ResilientCheckpointer(model, save_dir=str(tmp_path)).load_weights(str(tmp_path / "converted.pkl"))


def test_a_torch_checkpoint_named_pkl_is_told_to_take_the_pth_suffix(tmp_path):
    # before: a raw _pickle.UnpicklingError ("A load persistent id instruction was encountered ...")
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict()}, tmp_path / "best.pkl")
    assert _loading_refusal(model, tmp_path / "best.pkl") == (
        f"{tmp_path / 'best.pkl'} is a file torch.save writes (a zip archive: a checkpoint of a training, gwdet's "
        "model_*.pth), not a pickle as detectron2's .pkl weights are: name it (or the link to it) with the .pth suffix, "
        "which detectron2's checkpointer reads with torch.load.")
    (tmp_path / "best.pkl").rename(tmp_path / "best.pth")
    ResilientCheckpointer(model, save_dir=str(tmp_path)).load_weights(str(tmp_path / "best.pth"))


def test_tensors_in_a_pkl_and_arrays_in_a_pth_are_refused_naming_which_file_holds_which(tmp_path):
    # the refusal said "besides tensors and arrays it contains torch._utils._rebuild_tensor_v2": a contradiction
    from gwdet.checkpoint.safe_load import load_pickle_file

    tensors = tmp_path / "tensors.pkl"
    tensors.write_bytes(pickle.dumps({"model": {"w": torch.ones(2)}}))
    with pytest.raises(UnsafeCheckpointError, match=r"besides numpy arrays it contains torch\._utils\.\w+ \(torch tensors "
                                                    r"in a \.pkl weight file, which holds numpy arrays: save tensors "
                                                    r"with torch\.save in a \.pth file\)"):
        load_pickle_file(str(tensors), allow_unsafe=False, how_to_opt_in="")
    arrays = tmp_path / "arrays.pth"
    torch.save({"model": {"w": np.ones(2)}}, arrays)
    with pytest.raises(UnsafeCheckpointError, match=r"besides tensors it contains numpy\..*\(numpy arrays in a \.pth "
                                                    r"file, which holds tensors: save them as tensors, or numpy arrays "
                                                    r"pickled in a \.pkl file\)"):
        load_torch_file(str(arrays), allow_unsafe=False, how_to_opt_in="")


def test_a_safetensors_file_is_named_with_the_way_to_a_checkpoint(tmp_path):
    # before: "not a PyTorch checkpoint ... convert ImageNet weights with tools/convert_pretrained.py", which refused
    # the same file; the format was never named
    import json
    import struct

    from gwdet.convert.loading import ConversionError, read_source_state_dict

    header = json.dumps({"conv1.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "resnet50.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.arange(4, dtype=np.float32).tobytes())
    fix = r"load it with safetensors.torch.load_file\(path\) and save that state dict with torch.save"
    with pytest.raises(GwdetError, match=rf"resnet50.safetensors is a safetensors file \(Hugging Face's format\), "
                                         rf"which detectron2's checkpointer does not read: {fix}"):
        load_torch_file(str(path), allow_unsafe=True, how_to_opt_in="")
    with pytest.raises(ConversionError, match=rf"a safetensors file \(Hugging Face's format\), which the converter does "
                                              rf"not read: {fix}"):
        read_source_state_dict(str(path))


@pytest.mark.parametrize("damage", ["cut short", "a byte changed"])
def test_a_damaged_pkl_is_named_as_a_damaged_file(tmp_path, damage):
    # before: a raw _pickle.UnpicklingError ("pickle data was truncated") or UnicodeDecodeError traceback
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "weights.pkl"
    with open(path, "wb") as file:
        pickle.dump({"model": {key: value.numpy() for key, value in model.state_dict().items()},
                     "__author__": "a converter"}, file)
    raw = path.read_bytes()
    if damage == "cut short":
        path.write_bytes(raw[:len(raw) // 2])
    else:  # the length byte of the first string ('model'): its text is read from other bytes
        at = raw.index(b"model") - 1
        path.write_bytes(raw[:at] + b"\xff" + raw[at + 1:])
    refusal = _loading_refusal(model, path)
    assert refusal.startswith(f"{path} cannot be read: it is damaged or cut short (") and "nothing was loaded" in refusal


@pytest.mark.parametrize("contents, where", [
    ({"model": {}, "__author__": "me", "matching_heuristics": True}, "its 'model' is an empty dict"),
    ({}, "it is an empty dict"),
])
def test_a_weights_file_with_no_weights_is_refused(tmp_path, contents, where):
    # before: detectron2's matching heuristics on no names: a raw "IndexError: max(): Expected reduction dim 1 to have
    # non-zero size"
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    path = tmp_path / "empty.pkl"
    with open(path, "wb") as file:
        pickle.dump(contents, file)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 1), torch.nn.GroupNorm(8, 16))
    with pytest.raises(GwdetError, match=rf"^{path} holds no weights: {where}, with no parameter name or tensor in it, "
                                         r"so nothing could be loaded\. Check the path"):
        ResilientCheckpointer(model).load(str(path))


# a checkpoint whose running_var holds -1 (written by other means, its checksum valid) loaded without a word, and
# the model's evaluation computed NaN
def test_negative_running_variances_are_refused(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.layers import BatchGroupNorm

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 1), BatchGroupNorm(16, num_groups=4))

    saved = model()
    with torch.no_grad():
        saved[1].running_var.fill_(-1.0)
    ResilientCheckpointer(saved, str(tmp_path)).save("negative")
    loading = model()
    before = loading[1].running_var.clone()
    with pytest.raises(ValueError, match=r"negative\.pth holds negative running variances in 1 tensor\(s\) "
                                         r"\(1\.running_var\), which no training computes.*nothing was loaded"):
        ResilientCheckpointer(loading).load(str(tmp_path / "negative.pth"))
    assert torch.equal(loading[1].running_var, before)


# before: a checkpoint cut to ~4.5 KB-65 KB raised torch's bare "OSError: [Errno 22] Invalid argument" naming no
# file, and an empty one (or one cut within its first 4 bytes) was said not to be a file torch.save writes
def test_a_checkpoint_cut_at_any_length_is_named_as_damaged(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.layers import GroupWhitening
    from gwdet.utils.atomic import DamagedFileError

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), GroupWhitening(64, 16), torch.nn.Conv2d(64, 64, 3))

    ResilientCheckpointer(model(), str(tmp_path)).save("whole")
    whole = (tmp_path / "whole.pth").read_bytes()
    cut = tmp_path / "cut.pth"
    loading = model()
    before = {key: value.clone() for key, value in loading.state_dict().items()}
    lengths = [0, 1, 2, 3, *range(512, 70_000, 512), len(whole) // 2, len(whole) - 1]
    torch_errors = set()
    for length in lengths:
        cut.write_bytes(whole[:length])
        with pytest.raises(DamagedFileError, match=rf"^{cut} cannot be read: it is damaged or cut short \(.*\); "
                                                   r"nothing was loaded from it\. Restore the file") as refused:
            ResilientCheckpointer(loading).load(str(cut))
        assert refused.value.path == str(cut)
        torch_errors.add(type(refused.value.__cause__).__name__)
    assert "OSError" in torch_errors, "the lengths at which torch's zip reader raises OSError are covered"
    assert all(torch.equal(value, before[key]) for key, value in loading.state_dict().items())
    cut.write_bytes(b"")
    with pytest.raises(DamagedFileError, match=r"cut short \(the file is empty: 0 bytes\); nothing was loaded"):
        ResilientCheckpointer(loading).load(str(cut))


def _small_model():
    from gwdet.layers import GroupWhitening

    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), GroupWhitening(16, num_groups=4))


def _tensor_with_a_path() -> torch.Tensor:
    tensor = torch.zeros(2)
    tensor.origin = pathlib.Path("/tmp")  # an attribute torch.save keeps with the tensor
    return tensor


# before: save() wrote a pathlib.Path or numpy array extra without a word, and gwdet's own loader then refused the
# file as unsafe; a lambda raised pickle's bare AttributeError. Plain data is taken without a trial pickling: a
# value nested in a list or kept on a tensor is still found
@pytest.mark.parametrize("value, problem, fix", [
    (pathlib.Path("/tmp"), r"\(PosixPath\) needs pathlib\.PosixPath to be read back", r"where=str\(path\)"),
    ([1, {"p": pathlib.Path("/tmp")}], r"\(list\) needs pathlib\.PosixPath to be read back", r"where=str\(path\)"),
    (_tensor_with_a_path(), r"\(Tensor\) needs pathlib\.PosixPath to be read back", r"where=str\(path\)"),
    (np.arange(3), r"\(ndarray\) needs .*numpy\.ndarray to be read back", r"where=torch\.from_numpy\(array\)"),
    (lambda: 1, r"\(function\) cannot be pickled \(\w+Error: ", r"Save plain values"),
])
def test_save_refuses_an_extra_its_own_loader_would_refuse_before_writing(tmp_path, value, problem, fix):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    with pytest.raises(GwdetError, match=rf"^Checkpoint 'pl' cannot be saved: its extra 'where' {problem}.*nothing "
                                         rf"was written\. .*{fix}"):
        ResilientCheckpointer(_small_model(), save_dir=str(tmp_path)).save("pl", where=value)
    assert list(tmp_path.iterdir()) == []
    plain = {"a": [1, 2.0, "x", None, np.float64(1.0)], "t": torch.zeros(2), "dtype": torch.float32}
    ResilientCheckpointer(_small_model(), save_dir=str(tmp_path)).save("pl", where=plain)
    assert ResilientCheckpointer(_small_model()).load(str(tmp_path / "pl.pth"))["where"]["a"][:3] == [1, 2.0, "x"]


# before: save('mk', model={...}) replaced the model's weights in the file with the extra, without a word
def test_save_refuses_an_extra_that_would_replace_what_the_checkpointer_writes(tmp_path):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    model = _small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpointer = ResilientCheckpointer(model, save_dir=str(tmp_path), optimizer=optimizer)
    for key in ("model", "optimizer", "gwdet_norm_types"):
        with pytest.raises(GwdetError, match=rf"^Checkpoint 'mk' cannot be saved with the extra '{key}': the "
                                             r"checkpointer writes that key itself .*nothing was written\. Give the "
                                             r"extra another name"):
            checkpointer.save("mk", **{key: {"x": torch.zeros(1)}})
    assert list(tmp_path.iterdir()) == []


# before: save(..., iteration='abc') was written, and --resume then failed with int()'s bare ValueError
@pytest.mark.parametrize("iteration", ["abc", -1, 2.5, True])
def test_save_refuses_an_iteration_that_is_no_whole_number(tmp_path, iteration):
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    checkpointer = ResilientCheckpointer(_small_model(), save_dir=str(tmp_path))
    with pytest.raises(GwdetError, match=rf"^Checkpoint 'model_0000004' cannot be saved with iteration="
                                         rf"{re.escape(repr(iteration))} \(.*a whole number >= 0, after which "
                                         r"--resume continues; nothing was written\. Give it as an int"):
        checkpointer.save("model_0000004", iteration=iteration)
    assert list(tmp_path.iterdir()) == []
    checkpointer.save("model_0000004", iteration=np.int64(4))
    assert ResilientCheckpointer(_small_model()).load(str(tmp_path / "model_0000004.pth"))["iteration"] == 4


# Before: a model holding NaN was saved with its checksum without a word, and its own load refused the file.
def test_saving_a_model_holding_nan_warns_that_loading_refuses_it_and_keeps_it_readable(tmp_path):
    from conftest import logged_warnings
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.layers import BatchWhitening

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), BatchWhitening(16, group_size=4))
    model[1].running_mean.fill_(float("nan"))
    with logged_warnings("gwdet.checkpoint.resilient") as warned:
        ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_0000001")
    path = tmp_path / "model_0000001.pth"
    assert len(warned) == 1 and re.search(
        r"'model_0000001' is saved, but .* NaN or infinite values in 1 tensor\(s\) \(1\.running_mean\).*refuses it.*"
        r"torch\.load\(.*model_0000001\.pth', weights_only=True\)\['model'\]", warned[0])
    assert torch.isnan(torch.load(path, weights_only=True)["model"]["1.running_mean"]).all()
    with pytest.raises(GwdetError, match=r"holds NaN or infinite values in 1 tensor\(s\) \(1\.running_mean\)"):
        ResilientCheckpointer(torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), BatchWhitening(16, group_size=4))).load(
            str(path))
    with logged_warnings("gwdet.checkpoint.resilient") as warned:  # a finite model saves without a word
        model[1].running_mean.zero_()
        ResilientCheckpointer(model, save_dir=str(tmp_path)).save("model_0000002")
    assert warned == []
