"""``tools/deploy/export_model.py``: export a gwdet model from a config and its weights to
TorchScript or ONNX, with detectron2's flags (``tools/deploy/export_model.py`` of detectron2)::

    python tools/deploy/export_model.py --config-file configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml \\
        --format torchscript --export-method tracing --output output/deploy \\
        MODEL.WEIGHTS output/demo/model_final.pth

Without weights in the config the tool refuses, unless ``--untrained`` asks for a model of random
weights. ``--format torchscript`` writes ``model.ts`` (``--export-method tracing`` or ``scripting``),
``--format onnx`` writes ``model.onnx``. The tool runs the written file on a sample input
(``--sample-image``, or the first image of ``DATASETS.TEST[0]`` with a detection) and compares its
detections with the eager model's within ``--tolerance`` (:mod:`gwdet.export.detection_check`):
without a detection to compare, or beyond the tolerance, it stops and writes nothing. An export
takes its name only once checked, with its SHA-256 beside it (``model.ts.sha256``); an existing one
is replaced only with ``--overwrite``, and only when it is an export (its record beside it: a model
of the user's is refused), and one export at a time writes into an ``--output`` folder
(:class:`ExportFolderLock`). ``--run-eval`` (TorchScript, tracing) evaluates the exported model on
``DATASETS.TEST[0]``. A LazyConfig (``.py``; :func:`gwdet.engine.run.load_run_config`) gives the
weights in ``train.init_checkpoint``, the test images in ``dataloader.test`` and the evaluator in
``dataloader.evaluator``.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from detectron2.structures import Instances

from gwdet.errors import (GwdetError, GwdetFileExistsError, GwdetRuntimeError, GwdetValueError,
                          listed)
from gwdet.data import add_register_coco_argument
from gwdet.data.test_images import read_test_image
from gwdet.utils.atomic import checksum_path, foreign_record
from gwdet.utils.cli_errors import add_verbose_argument, as_override, output_path_problem, run_tool
from gwdet.export.deploy import MIN_DETECTOR_OPSET
from gwdet.export.detection_check import TOLERANCE
from gwdet.utils.command_line import parse_with_trailing_flags, refuse_repeated_flags
from gwdet.engine.output_dir import (check_run_detections_kept, check_weights_are_the_runs, checkpoints_in,
                                     folder_locked, lock_holder)
from gwdet.utils.run_file_names import EVALUATOR_FILES, FINAL_WEIGHTS, INFERENCE_FOLDER, LOCK_NAME
from gwdet.engine.run import RunConfig, gives_setting, load_run_config, named_full_disk, warn_of_unused_coco
from gwdet.norms import SYNCHRONIZED_NORMS
from gwdet.modeling.detectron2_failures import compiled_layers_named

logger = logging.getLogger("gwdet.export")

# Instance fields of detectron2's R-CNN outputs, for scripting (detectron2's export_model).
SCRIPTED_FIELDS = {
    "proposal_boxes": "Boxes",
    "objectness_logits": "Tensor",
    "pred_boxes": "Boxes",
    "scores": "Tensor",
    "pred_classes": "Tensor",
    "pred_masks": "Tensor",
    "pred_keypoints": "Tensor",
    "pred_keypoint_heatmaps": "Tensor",
}


def config_parser(description: str) -> argparse.ArgumentParser:
    """A parser with detectron2's ``--config-file`` (alias ``--config``), ``--register-coco`` (as
    in the train tool) and ``--verbose``; add ``opts`` last with :func:`add_opts`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config-file", "--config", dest="config_file", required=True, metavar="FILE")
    add_register_coco_argument(parser)
    add_verbose_argument(parser)
    return parser


def add_opts(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The trailing ``KEY VALUE`` config overrides, as in detectron2's tools."""
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="KEY VALUE pairs overriding the config (key=value for a LazyConfig .py)")
    return parser


def argument_parser() -> argparse.ArgumentParser:
    parser = config_parser("Export a gwdet (detectron2) model to TorchScript or ONNX.")
    parser.add_argument("--format", choices=["torchscript", "onnx"], default="torchscript")
    parser.add_argument("--export-method", choices=["tracing", "scripting"], default="tracing")
    parser.add_argument("--sample-image", default=None, type=os.path.expanduser,
                        help="image to trace with (default: first test image)")
    parser.add_argument("--run-eval", action="store_true", help="evaluate the exported TorchScript model")
    parser.add_argument("--output", required=True, type=os.path.expanduser, help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output")
    parser.add_argument("--untrained", action="store_true",
                        help="export the model with random weights when the config gives none (MODEL.WEIGHTS or "
                             "train.init_checkpoint empty): to try the export itself")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: gwdet.export.ONNX_OPSET)")
    parser.add_argument("--tolerance", type=_positive_number, default=TOLERANCE, metavar="T",
                        help="largest difference the check of the exported file accepts on the sample image: scores "
                             "and mask probabilities within T, boxes within T x the image's longer side, after "
                             f"matching detections by class and box (default {TOLERANCE:g}; docs/deploy.md)")
    return add_opts(parser)


def _positive_number(text: str) -> float:
    """``--tolerance``: a number in (0, 1); scores and mask probabilities lie in [0, 1], so a
    tolerance of 1 or more would accept any export."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"give a number above 0 and below 1 (scores and mask probabilities lie in "
                                         f"[0, 1], so 1 or more accepts any export), e.g. {TOLERANCE:g}; got {text!r}")
    return value


# How many images of DATASETS.TEST[0] the tool tries, in order, for one with a detection to compare
# the export on (without --sample-image).
SAMPLE_SEARCH_LIMIT = 20


def sample_candidates(run: RunConfig, sample_image: Optional[str]) -> Tuple[Iterator[Tensor], Optional[str]]:
    """The images the export may be compared on, each a ``(3, H, W)`` uint8 tensor resized as
    detectron2's ``DefaultPredictor`` resizes it, and where they come from: ``sample_image`` alone
    (``None``), or those of the first test set in order, at most :data:`SAMPLE_SEARCH_LIMIT` (its
    description, :meth:`~gwdet.engine.run.RunConfig.describe_test_set`)."""
    if sample_image is not None:
        return iter([read_test_image(run.cfg, sample_image)["image"]]), None

    def images() -> Iterator[Tensor]:
        # the loader's batches hold one image each (detectron2's test loader)
        for batch in itertools.islice(run.test_batches(), SAMPLE_SEARCH_LIMIT):
            for sample in batch:
                yield sample["image"]

    return images(), run.describe_test_set()


def folder_in_use(folder: str) -> GwdetRuntimeError:
    """The refusal of an export into ``folder`` while another process holds its lock: a training
    whose output folder it is (its lock file names the process), or another export."""
    holder = lock_holder(folder) if os.path.isfile(os.path.join(folder, LOCK_NAME)) else None
    who = f"a training run ({holder}), whose output folder it is" if holder else "another export (a process holds its lock)"
    return GwdetRuntimeError(f"--output {folder} is in use by {who}; nothing was written. Wait for it to finish, or "
                             "choose another --output.")


def check_folder_free(folder: str) -> None:
    """Refuse an export into ``folder`` while another process holds its lock, before the model is built."""
    if folder_locked(folder):
        raise folder_in_use(folder)


class ExportFolderLock:
    """One export at a time into a folder (``with ExportFolderLock(folder):``): an exclusive
    ``flock`` on the folder itself, so nothing is written into it and the lock goes with the process
    however it ends. A second export into the folder meanwhile stops at once (:class:`~gwdet.errors.GwdetRuntimeError`); on
    entry the partial files of exports killed there (those of processes that no longer run) are
    removed, with a warning."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._descriptor: Optional[int] = None

    def __enter__(self) -> "ExportFolderLock":
        import fcntl

        from gwdet.utils.atomic import remove_stale_partials

        descriptor = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise folder_in_use(self.folder) from None
        self._descriptor = descriptor
        remove_stale_partials(self.folder, "export")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing the descriptor releases the lock
            self._descriptor = None


def _scripted_adapter(model: Any) -> torch.nn.Module:  # GeneralizedRCNN, checked below
    from detectron2.modeling import GeneralizedRCNN

    if not isinstance(model, GeneralizedRCNN):
        raise GwdetValueError("--export-method scripting supports detectron2's GeneralizedRCNN models only")

    class ScriptableAdapter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.eval()

        def forward(self, inputs: Tuple[Dict[str, Tensor]]) -> List[Dict[str, Tensor]]:
            instances = self.model.inference(inputs, do_postprocess=False)
            return [i.get_fields() for i in instances]

    return ScriptableAdapter()


def _plain_containers(model: torch.nn.Module) -> None:
    """Turn the OmegaConf lists and dicts that a LazyConfig's ``instantiate`` leaves in the
    modules' attributes (a ResNet's ``_out_features``) into Python's, which TorchScript compiles;
    the model computes the same."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, (DictConfig, ListConfig)):
                setattr(module, name, OmegaConf.to_container(value, resolve=True))


def script_model(model: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` of an R-CNN (detectron2's ``scripting_with_instances``)."""
    from detectron2.export import scripting_with_instances
    from detectron2.structures import Boxes

    types = {"Boxes": Boxes, "Tensor": Tensor}
    fields = {name: types[kind] for name, kind in SCRIPTED_FIELDS.items()}
    _plain_containers(model)
    return scripting_with_instances(_scripted_adapter(model), fields)


def check_scriptable(model: torch.nn.Module) -> None:
    """Refuse, before anything is run or written, a model with layers TorchScript cannot compile:
    torch's ``SyncBatchNorm`` and detectron2's ``NaiveSyncBatchNorm`` (NORM ``SyncBN``, ``nnSyncBN``,
    ``naiveSyncBN``: :data:`gwdet.norms.SYNCHRONIZED_NORMS`) ask the process group from Python in
    their forward."""
    synced = [name for name, module in model.named_modules() if isinstance(module, SYNCHRONIZED_NORMS)]
    if synced:
        raise GwdetValueError(
            f"--export-method scripting: the model has synchronized batch norm layers ({listed(synced, 3)}; NORM "
            "SyncBN, nnSyncBN or naiveSyncBN), which TorchScript cannot compile: they ask the process group in "
            "Python. Export with --export-method tracing (the default), or set those NORM keys to BN or FrozenBN, "
            "which load the same weights; nothing was written.")


def _scripted_fields(model, scripted, image: Tensor) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The eager and the scripted model's instance fields on ``image``."""
    with torch.no_grad():
        expected = model.inference([{"image": image}], do_postprocess=False)[0].get_fields()
        got = scripted(({"image": image},))[0]
    return dict(expected), dict(got)


def _instance_fields(outputs: Any) -> Optional[Dict[str, Any]]:
    """The instance fields of one image in outputs a ``TracingAdapter``'s schema rebuilt
    (``[{"instances": Instances}]`` of an R-CNN, ``[{"proposals": Instances}]`` of a proposal
    network, or the ``Instances`` themselves); ``None`` otherwise."""
    if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
        outputs = outputs[0]
    if isinstance(outputs, dict):
        outputs = outputs.get("instances", outputs.get("proposals"))
    fields = getattr(outputs, "get_fields", None)
    return dict(fields()) if callable(fields) else None


def _adapter_fields(adapter, flat_outputs: Sequence[Any]) -> Optional[Dict[str, Any]]:
    """:func:`_instance_fields` of the flat outputs of an export (tensors or onnxruntime's arrays)."""
    return _instance_fields(adapter.outputs_schema([torch.as_tensor(output) for output in flat_outputs]))


def evaluate_traced(run: RunConfig, traced, adapter, output_folder: str) -> Dict:
    """COCO evaluation of the traced model on the first test set with the config's evaluator
    (postprocessed like eager), its files written into ``output_folder``."""
    from detectron2.evaluation import inference_on_dataset, print_csv_format
    from detectron2.modeling.postprocessing import detector_postprocess

    loader, evaluator = run.test_loader(), run.evaluator(output_folder)

    def run_traced(inputs):
        # the traced model stops before the resize to the original image size
        sample = inputs[0]
        instances = adapter.outputs_schema(traced(sample["image"]))[0]["instances"]
        return [{"instances": detector_postprocess(instances, sample["height"], sample["width"])}]

    others = run.test_datasets()[1:]
    print(f"COCO evaluation of the export on {run.describe_test_set()}"
          + (f"; the other test sets ({', '.join(others)}) are not evaluated" if others else "") + ":")
    results = inference_on_dataset(run_traced, loader, evaluator)
    print_csv_format(results)
    return results


class ExportCheckError(GwdetError, RuntimeError):
    """The export could not be compared with the eager model (no detection, empty outputs), or its
    outputs differ beyond the tolerance; nothing was written. The message names why and the fix."""


def count_detections(model: Any, image: Tensor) -> int:
    """The number of detections ``model`` (a detectron2 meta-architecture in evaluation mode) makes
    on ``image``: its ``inference`` (R-CNN), or the first ``Instances`` of its output (RetinaNet:
    ``instances``; a ``ProposalNetwork``: ``proposals``)."""
    with torch.no_grad():
        if hasattr(model, "inference"):
            return len(model.inference([{"image": image}], do_postprocess=False)[0])
        output = model([{"image": image}])[0]
    found = [value for value in output.values() if isinstance(value, Instances)]
    return len(found[0]) if found else 0


def pick_sample(model: torch.nn.Module, images: Iterable[Tensor], source: Optional[str] = None) -> Tuple[Tensor, int]:
    """The first of ``images`` on which ``model`` detects something, and its detection count;
    :class:`ExportCheckError` when there is none (``source`` names where the images came from, ``None``
    for ``--sample-image``). An export is compared with the eager model on the outputs of this image,
    and empty outputs would agree whatever the exported file computes."""
    tried = 0
    for image in images:
        tried += 1
        found = count_detections(model, image)
        if found:
            return image, found
    if source is None:
        nothing = "The sample image gave no detection"
    else:
        nothing = f"None of the first {tried} images of {source} gave a detection"
    raise ExportCheckError(
        f"{nothing}, so the export could not be compared with the model (empty outputs always agree); "
        "nothing was written. Give --sample-image an image with objects the model detects (or weights "
        "trained further)."
    )


def check_export(model: torch.nn.Module, image: Tensor, expected: Any, actual: Any, tolerance: float) -> str:
    """Compare the export's outputs ``actual`` with the eager model's ``expected`` on ``image`` and
    say how they agree; :class:`ExportCheckError` (nothing is written) beyond ``tolerance``. Detections (instance
    fields, dicts) are matched by class and box first (:func:`~gwdet.export.detection_check.compare_detections`);
    other outputs (sequences of tensors) are compared in order (:func:`compared_difference`), within
    ``tolerance`` of their largest magnitude (at least 1)."""
    from gwdet.export.detection_check import Detections, compare_detections, detection_limits

    eager = Detections.from_fields(expected) if isinstance(expected, dict) else None
    exported = Detections.from_fields(actual) if isinstance(actual, dict) else None
    if eager is not None and exported is not None:
        threshold, most = detection_limits(model)
        size = (int(image.shape[-2]), int(image.shape[-1]))
        comparison = compare_detections(eager, exported, size, tolerance, threshold, most)
        if comparison.problems:
            raise ExportCheckError(comparison.refusal())
        return (f"{comparison.summary()}; largest absolute difference from the eager model on the sample input: "
                f"{comparison.largest:.3g}")
    difference = compared_difference(expected, actual)
    scale = max([1.0] + [float(torch.as_tensor(output).double().abs().max()) for output in expected
                         if torch.as_tensor(output).numel()])
    if difference > tolerance * scale:
        raise ExportCheckError(f"The exported model's outputs differ from the eager model's by {difference:.3g}, "
                               f"beyond the tolerance {tolerance:g} of their largest magnitude {scale:.3g}; nothing was "
                               "written. Check the config and weights it was built from; a larger --tolerance accepts "
                               "larger rounding differences.")
    return f"largest absolute difference from the eager model on the sample input: {difference:.3g}"


def _check_adapter_outputs(model, image: Tensor, adapter, exported: Sequence[Any], tolerance: float) -> str:
    """:func:`check_export` of the flat outputs of a traced or ONNX export against the eager
    model's through the same ``TracingAdapter``: as detections where its schema rebuilds them."""
    expected = adapter(image)
    eager, actual = _adapter_fields(adapter, expected), _adapter_fields(adapter, exported)
    if eager is not None and actual is not None:
        return check_export(model, image, eager, actual, tolerance)
    return check_export(model, image, expected, exported, tolerance)


def compared_difference(expected: Sequence[Tensor], actual: Sequence) -> float:
    """:func:`~gwdet.export.deploy.max_abs_difference` of the exported file's outputs from the
    eager model's, on outputs that hold values only: :class:`ExportCheckError` (nothing is written) when an
    eager output is empty (an agreement on it would say nothing) or when the shapes differ."""
    from gwdet.export.deploy import max_abs_difference

    empty = [index for index, output in enumerate(expected) if torch.as_tensor(output).numel() == 0]
    if empty:
        raise ExportCheckError(
            f"The eager model's outputs {empty} are empty on the sample image, so the export could not be "
            "compared there; nothing was written."
        )
    try:
        return max_abs_difference(expected, actual)
    except ValueError as error:
        raise ExportCheckError(f"The exported model's outputs differ from the eager model's ({error}); nothing was "
                               "written.") from error


# The ONNX opsets the export accepts: from the first whose RoiAlign computes detectron2's aligned
# ROIAlign (16; GW's aten::diagonal needs 13, detectron2's STABLE_ONNX_OPSET_VERSION is 11) to the
# newest torch's exporter writes.
MIN_ONNX_OPSET = MIN_DETECTOR_OPSET


def export_path(args: argparse.Namespace) -> str:
    """The file the export writes: ``model.onnx`` or ``model.ts`` in ``--output``."""
    return os.path.join(args.output, "model.onnx" if args.format == "onnx" else "model.ts")


def check_export_flags(args: argparse.Namespace) -> None:
    """Refuse, before the model is built, flags the export cannot use: an ``--output`` that is a
    file or cannot be written, a ``--sample-image`` that is missing or not an image detectron2 reads
    as it is (:func:`gwdet.data.image_files.image_file_problem`), an ``--opset`` the exporter cannot write."""
    from torch.onnx import _constants

    from gwdet.data.image_files import image_file_problem

    if not args.output.strip():
        raise GwdetValueError("--output is empty: give the folder to write model.ts / model.onnx into (it is "
                              "created when missing), e.g. --output output/deploy.")
    problem = output_path_problem("--output", args.output, folder=True)
    if problem:
        raise GwdetValueError(problem)
    for written in (export_path(args), checksum_path(export_path(args))):
        if os.path.isdir(written):
            raise GwdetValueError(f"--output {args.output} holds a folder {os.path.basename(written)}, where the export "
                                  "writes a file of that name: move the folder away, or choose another --output.")
    if args.sample_image is not None:
        if "://" in args.sample_image and not os.path.exists(args.sample_image):
            raise GwdetValueError(
                f"--sample-image {args.sample_image!r} is a URL, and the tool reads a local image file: download it "
                f"first (e.g. curl -o sample.jpg {args.sample_image}) and give its path (--sample-image sample.jpg); "
                "nothing was written.")
        problem = image_file_problem(args.sample_image)
        if problem:
            raise GwdetValueError(f"--sample-image {args.sample_image} {problem}.")
    check_folder_free(args.output)
    evaluation = os.path.join(args.output, INFERENCE_FOLDER)
    held = [name for name in EVALUATOR_FILES if os.path.isfile(os.path.join(evaluation, name))]
    if held and not args.run_eval and args.overwrite and os.path.isfile(export_path(args)):
        raise GwdetFileExistsError(
            f"--output {args.output} holds the detections of an earlier --run-eval ({', '.join(held)} in inference/), "
            f"of the {os.path.basename(export_path(args))} that --overwrite replaces: they would be left beside a model "
            "they are not of; nothing was written. Add --run-eval to evaluate the new export into them, move "
            "inference/ away, or choose another --output.")
    if args.overwrite:
        check_replaced_file_is_an_export(export_path(args), args.format)
    if args.run_eval:  # a LazyConfig run keeps its detections directly in <run>/inference, where --run-eval writes
        own_folder = ("Give --output a folder of its own for the export and its evaluation, e.g. "
                      f"--output {os.path.join(args.output, 'deploy')}.")
        checkpoints = checkpoints_in(args.output) if os.path.isdir(args.output) else []
        if checkpoints:
            raise GwdetFileExistsError(
                f"--output {args.output} holds a training run ({os.path.basename(checkpoints[0])}), and --run-eval "
                "writes its evaluation into inference/ there, among the run's files: a later --overwrite of the run "
                f"would delete it with them; nothing was written. {own_folder}")
        check_run_detections_kept(evaluation, args.output, own_folder)
        if held and not args.overwrite:
            raise GwdetFileExistsError(
                f"--output {args.output} holds an earlier evaluation's detections ({', '.join(held)} in inference/), "
                "which --run-eval would replace; nothing was written. Pass --overwrite to replace them, or choose "
                "another --output.")
    if args.opset is not None:
        if args.format != "onnx":
            raise GwdetValueError(f"--opset {args.opset} is an ONNX setting: add --format onnx, or leave --opset out.")
        newest = getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _constants.ONNX_MAX_OPSET)
        if not MIN_ONNX_OPSET <= args.opset <= newest:
            raise GwdetValueError(f"--opset {args.opset}: give an ONNX opset from {MIN_ONNX_OPSET} (the first whose "
                                  "RoiAlign computes detectron2's aligned ROIAlign: an older one exports other "
                                  f"detections) to {newest} (the newest torch's exporter writes); the default is "
                                  "gwdet.export.ONNX_OPSET.")


def is_export_file(path: str) -> bool:
    """Whether the file at ``path`` is an export of gwdet: its SHA-256 record is beside it
    (``path.sha256``, a checksum record as every export writes, even one that no longer matches a
    file replaced by hand). A model saved by other means (``torch.jit.save``, ``torch.onnx.export``)
    has no such record: it is a file of the user's, whatever its format."""
    return os.path.lexists(checksum_path(path)) and foreign_record(path) is None


def check_replaced_file_is_an_export(path: str, export_format: str) -> None:
    """Refuse, before the model is built, an ``--overwrite`` whose ``path`` (``model.ts`` /
    ``model.onnx`` in ``--output``) holds a file that is no export of gwdet (:func:`is_export_file`):
    a file of the user's, a model of the same format included, that the export would replace. A link
    whose target is gone is replaced as a link."""
    if not os.path.isfile(path) or is_export_file(path):
        return
    name = os.path.basename(path)
    kind = "a TorchScript" if export_format == "torchscript" else "an ONNX"
    raise GwdetFileExistsError(
        f"--overwrite replaces an earlier export, and {path} is none: it has no {name}.sha256 record beside it (which "
        f"every export gets), so it is a file of yours ({kind} model saved otherwise included) that the export "
        f"would delete; nothing was written. Move it out of {os.path.dirname(path) or '.'} (or delete it yourself), "
        "or choose another --output.")


def warn_of_other_format_export(args: argparse.Namespace, run: RunConfig) -> None:
    """A warning (logged on the console) when ``--output`` holds an export of the other format than
    the one just written (``model.onnx`` beside a new ``model.ts``, or the reverse; an export of
    gwdet's: its checksum record beside it, :func:`is_export_file`). That file is left as it is, and
    it may hold other weights than this export's."""
    other_format = "torchscript" if args.format == "onnx" else "onnx"
    other = os.path.join(args.output, "model.ts" if other_format == "torchscript" else "model.onnx")
    if not os.path.isfile(other) or not is_export_file(other):
        return
    weights = f"{run.weights_setting} {run.weights}" if run.weights else "--untrained, random weights"
    logger.warning(
        f"{other} is an earlier export of the other format, and it was left as it is: it may hold other weights than "
        f"this export's ({weights}), so {args.output} may now hold exports of two different models. Export "
        f"{other_format} again into {args.output} with the same weights (--format {other_format} --overwrite), or "
        f"remove {other} and {os.path.basename(checksum_path(other))}.")


def check_weights_given(run: RunConfig, untrained: bool) -> None:
    """Refuse to export a model of random weights unless asked (``--untrained``), and ``--untrained``
    beside weights the config gives. The refusal names the final weights in the config's output
    folder where they are (a run's own config.yaml given)."""
    if not run.weights and not untrained:
        final = os.path.join(run.output_dir, FINAL_WEIGHTS)
        example = as_override(run.weights_setting, final if os.path.isfile(final) else "output/demo/model_final.pth")
        raise GwdetValueError(f"{run.weights_setting} is empty: the export would hold a model of random weights, "
                              f"not a trained one; nothing was written. Give the trained weights ({example}), or pass "
                              "--untrained to export random weights on purpose.")
    if run.weights and untrained:
        raise GwdetValueError(f"--untrained exports random weights, but the config gives {run.weights_setting} "
                              f"{run.weights}; nothing was written. Leave --untrained out to export those weights.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``gwdet-export`` / ``tools/deploy/export_model.py``: the exit status. An error gwdet raises on
    purpose ends it with ``<tool>: error: <message>`` and status 2; ``--verbose`` shows tracebacks
    (:mod:`gwdet.utils.cli_errors`). torch's FutureWarnings that TorchScript is deprecated are not
    shown: their advice, ``torch.export``, cannot capture a detectron2 R-CNN (docs/deploy.md, Limits)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        return run_tool(_export, argv)


def _export(argv: Sequence[str]) -> int:
    from detectron2.utils.logger import setup_logger

    from gwdet.model_zoo import resolve_config_argument
    from gwdet.utils.atomic import path_written_with_checksum
    from gwdet.export.deploy import (ONNX_OPSET, flattened_names, run_onnx, save_script_module, trace_model,
                                     write_model_onnx)

    parser = argument_parser()
    refuse_repeated_flags(parser, argv)
    args = parse_with_trailing_flags(parser, argv)
    resolve_config_argument(parser, args)
    setup_logger(name="gwdet")
    setup_logger(name="detectron2")
    if args.format == "onnx" and args.export_method != "tracing":
        raise GwdetValueError("--format onnx needs --export-method tracing (the default): leave --export-method "
                              "scripting out, or export to TorchScript.")
    if args.run_eval and (args.format != "torchscript" or args.export_method != "tracing"):
        raise GwdetValueError("--run-eval evaluates a traced TorchScript model: use --format torchscript "
                              "--export-method tracing")
    check_export_flags(args)
    path = export_path(args)
    if os.path.lexists(path) and not args.overwrite:  # a link whose target is gone too
        raise GwdetFileExistsError(f"{path} already exists; it is left as it is. Pass --overwrite to replace it, or "
                                   "choose another --output.")
    foreign = foreign_record(path)
    if foreign is not None and not args.overwrite:
        raise GwdetFileExistsError(f"{foreign} is there and is no checksum record, but the export writes its own record "
                                   "under that name: it is left as it is. Move it away, pass --overwrite to replace it, "
                                   "or choose another --output.")
    run = load_run_config(args.config_file, args.opts, tool=True)
    run.check_plain_model("the export holds (and --run-eval evaluates)")
    check_weights_given(run, args.untrained)
    if not gives_setting(args.opts, run.weights_setting):
        check_weights_are_the_runs(args.config_file, run.weights, run.weights_setting, "nothing was written")
    if args.sample_image is None and not run.test_datasets():
        raise GwdetValueError(f"The export is compared with the eager model on a test image, and {run.test_setting} "
                              "names no test set to take one from; nothing was written. Give --sample-image IMAGE, "
                              f"or name a test set in {run.test_setting}.")
    run.register_datasets(args.register_coco, trains=False, evaluates=args.run_eval,
                          reads_tests=args.sample_image is None or args.run_eval)
    tests = run.test_datasets()
    if (args.sample_image is None or args.run_eval) and tests:
        first = f"{tests[0]} ({run.test_setting}'s first dataset)"
        if args.sample_image is None and args.run_eval:
            reads = f"takes its sample image from {first} and evaluates on it, not on"
        elif args.run_eval:
            reads = f"evaluates on {first}, not on"
        else:
            reads = f"takes its sample image from {first}, not from"
        warn_of_unused_coco(args.register_coco or (), tests[:1], f"the export {reads}",
                            f"name it first in {run.test_setting} to use it.")
    with compiled_layers_named(run.cfg, "; nothing was written"):
        model = run.build_trained_model(
            evaluates=args.run_eval, exports=True, incomplete_outcome="the export would hold a partly random model",
            meta_refusal=("The export runs the model on a sample image (to trace it and to check the exported file), "
                          "and the config puts it on the meta device, whose tensors hold no values: set the device to "
                          "cpu (MODEL.DEVICE cpu, or train.device=cpu), or cuda; nothing was written."))
    if args.export_method == "scripting":
        check_scriptable(model)
    image, found = pick_sample(model, *sample_candidates(run, args.sample_image))
    logger.info("The sample image gives %d detections to compare the export on.", found)
    created_output = not os.path.isdir(args.output)
    os.makedirs(args.output, exist_ok=True)
    # Only a complete, checked export takes the name (and its SHA-256 record): a failed one leaves an earlier one.
    try:
        kept = f"Any earlier {os.path.basename(path)} is as it was: export again once it can be written."
        with ExportFolderLock(args.output), torch.no_grad(), named_full_disk(args.output, kept):
            if os.path.lexists(path) and not args.overwrite:  # another export finished meanwhile
                raise GwdetFileExistsError(f"{path} was written by another export while this one ran; it is left as "
                                           "it is. Pass --overwrite to replace it, or choose another --output.")
            with path_written_with_checksum(path) as written:
                if args.format == "torchscript" and args.export_method == "scripting":
                    scripted = script_model(model)
                    save_script_module(scripted, written)
                    agreement = check_export(model, image, *_scripted_fields(model, scripted, image), args.tolerance)
                elif args.format == "torchscript":
                    traced, adapter = trace_model(model, image)
                    save_script_module(traced, written)
                    agreement = _check_adapter_outputs(model, image, adapter, traced(image), args.tolerance)
                    logger.info("Inputs schema: %s", adapter.inputs_schema)
                    logger.info("Outputs schema: %s", adapter.outputs_schema)
                else:
                    adapter = write_model_onnx(model, image, written, path, args.opset or ONNX_OPSET)
                    try:
                        agreement = _check_adapter_outputs(model, image, adapter, run_onnx(written, [image]),
                                                           args.tolerance)
                    except ImportError:
                        agreement = None
                        logger.warning("onnxruntime is not installed: the exported file was not run.")
    except BaseException:
        # a folder this call made and left empty goes too
        if created_output and not os.listdir(args.output):
            os.rmdir(args.output)
        raise
    logger.info("Exported %s", path)
    warn_of_other_format_export(args, run)
    if agreement is not None:
        print(f"Exported {path}; {agreement}")
    channels = getattr(model, "input_format", None)
    if channels:
        kind = str(image.dtype).replace("torch.", "")
        only = "; an ONNX file takes no other type" if args.format == "onnx" else ""
        scripted = args.format == "torchscript" and args.export_method == "scripting"
        takes = ('a tuple of one dict per image, ({"image": image},), and returns a list of dicts of the detections\' '
                 "fields, one per image; each image" if scripted else "an image")
        print(f"The exported model takes {takes} as a {kind} (C, H, W) tensor of 0-255 pixel values (the type it was "
              f"exported with{only}) with the channels in {channels} order, as the model does (the config's input "
              "format).")
    if args.format == "onnx":
        print(f"Its input is named image; its outputs, in order: {', '.join(flattened_names(adapter.outputs_schema))} "
              "(as onnxruntime's session.get_outputs() names them).")
    if args.run_eval:  # its files beside the export, not in the training run's inference/
        with ExportFolderLock(args.output), named_full_disk(args.output, f"The export ({path}) is kept: evaluate it "
                                                            "again with --overwrite --run-eval once it can be written."):
            evaluate_traced(run, traced, adapter, os.path.join(args.output, INFERENCE_FOLDER))
    return 0
