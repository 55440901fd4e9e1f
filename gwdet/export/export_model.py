"""``tools/deploy/export_model.py``: export a gwdet model from a config and its weights to
TorchScript or ONNX, with detectron2's flags (``tools/deploy/export_model.py`` of detectron2)::

    python tools/deploy/export_model.py --config-file configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml \\
        --format torchscript --export-method tracing --output output/deploy \\
        MODEL.WEIGHTS output/demo/model_final.pth

``--format torchscript`` writes ``model.ts`` (``--export-method tracing`` or ``scripting``),
``--format onnx`` writes ``model.onnx`` (tracing, opset ``--opset``). The sample input is
``--sample-image`` resized as detectron2's ``DefaultPredictor`` does, or else the first image of
``DATASETS.TEST[0]`` on which the model detects something (of the first ``SAMPLE_SEARCH_LIMIT``).
After exporting, the tool runs the file (TorchScript in this process, ONNX in onnxruntime) on the
sample input and prints the largest absolute difference from the eager model, over outputs that
all hold values: without a detection to compare, or when an output shape differs, it stops and
writes nothing. The file is written under a temporary name and takes its name only once checked,
and its SHA-256 is recorded beside it (``model.ts.sha256``; :func:`gwdet.export.load_export`
checks it); an existing export is replaced only with ``--overwrite``.
``--run-eval`` (TorchScript, tracing) evaluates the exported model on ``DATASETS.TEST[0]`` with the
config's evaluator, as detectron2's tool does.
A LazyConfig (``.py``, ``key=value`` overrides; :func:`load_config`) gives its model
``train.init_checkpoint`` and its test images from ``dataloader.test`` (``--sample-image`` read in
the test mapper's format, through its augmentations), and ``--run-eval`` uses ``dataloader.evaluator``.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from gwdet.data.test_images import read_test_image
from gwdet.engine.cli_errors import add_verbose_argument, reported_errors, split_verbose

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
    """A parser with detectron2's ``--config-file`` (alias ``--config``); add ``opts`` last with
    :func:`add_opts`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config-file", "--config", dest="config_file", required=True, metavar="FILE")
    add_verbose_argument(parser)
    return parser


def add_opts(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The trailing ``KEY VALUE`` config overrides, as in detectron2's tools."""
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="KEY VALUE pairs overriding the config (key=value for a LazyConfig .py)")
    return parser


def load_config(config_file: str, opts: Sequence[str] = ()) -> Any:
    """The config the export and analyze tools work from, its test images read in this process: a
    yacs ``CfgNode`` with ``KEY VALUE`` overrides (:func:`gwdet.engine.trainer.build_config`), or for a
    ``.py`` file the LazyConfig with ``key=value`` overrides (:func:`gwdet.engine.lazy.load_lazy_config`)."""
    from gwdet.engine.lazy import is_lazy_config, load_lazy_config, without_loader_workers

    if is_lazy_config(config_file):
        return without_loader_workers(load_lazy_config(config_file, list(opts)))
    from gwdet.engine.trainer import build_config

    return build_config(config_file, ["DATALOADER.NUM_WORKERS", "0"] + list(opts))


def is_lazy(cfg: Any) -> bool:
    """Whether ``cfg`` is a LazyConfig (what :func:`load_config` returns for a ``.py`` file)."""
    from omegaconf import DictConfig

    return isinstance(cfg, DictConfig)


def argument_parser() -> argparse.ArgumentParser:
    parser = config_parser("Export a gwdet (detectron2) model to TorchScript or ONNX.")
    parser.add_argument("--format", choices=["torchscript", "onnx"], default="torchscript")
    parser.add_argument("--export-method", choices=["tracing", "scripting"], default="tracing")
    parser.add_argument("--sample-image", default=None, help="image to trace with (default: first test image)")
    parser.add_argument("--run-eval", action="store_true", help="evaluate the exported TorchScript model")
    parser.add_argument("--output", required=True, help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: gwdet.export.ONNX_OPSET)")
    return add_opts(parser)


# How many images of DATASETS.TEST[0] the tool tries, in order, for one with a detection to compare
# the export on (without --sample-image).
SAMPLE_SEARCH_LIMIT = 20


def sample_inputs(cfg, sample_image: Optional[str]) -> List[Dict]:
    """``[{"image": (3, H, W) float tensor, "height", "width"}]`` from ``sample_image`` resized like
    detectron2's ``DefaultPredictor``, or the first batch of ``DATASETS.TEST[0]``."""
    if sample_image is None:
        return next(_test_batches(cfg))
    return [read_test_image(cfg, sample_image)]


def _test_batches(cfg) -> Iterator[List[Dict]]:
    if is_lazy(cfg):
        from gwdet.engine.lazy import iter_test_batches

        return iter_test_batches(cfg)
    from detectron2.data import build_detection_test_loader

    from gwdet.data.datasets import prepare_datasets

    prepare_datasets(cfg)
    return iter(build_detection_test_loader(cfg, cfg.DATASETS.TEST[0]))


def sample_candidates(cfg, sample_image: Optional[str]) -> Tuple[Iterator[Tensor], Optional[str]]:
    """The images the export may be compared on, each ``(3, H, W)`` as :func:`sample_inputs` gives
    it, and where they come from: ``sample_image`` alone (``None``), or those of
    ``DATASETS.TEST[0]`` in order, at most :data:`SAMPLE_SEARCH_LIMIT` (the dataset's name)."""
    if sample_image is not None:
        return iter([read_test_image(cfg, sample_image)["image"]]), None

    def images() -> Iterator[Tensor]:
        # the loader's batches hold one image each (detectron2's test loader)
        for batch in itertools.islice(_test_batches(cfg), SAMPLE_SEARCH_LIMIT):
            for sample in batch:
                yield sample["image"]

    if is_lazy(cfg):
        from gwdet.engine.lazy import describe_test_set

        return images(), describe_test_set(cfg)
    return images(), f"{cfg.DATASETS.TEST[0]} (DATASETS.TEST[0])"


def build_trained_model(cfg) -> torch.nn.Module:
    """The config's model with ``MODEL.WEIGHTS`` (a LazyConfig's ``train.init_checkpoint``) loaded
    as ``train_net.py --eval-only`` loads them."""
    if is_lazy(cfg):
        from gwdet.engine.lazy import build_trained_model as build_lazy_trained_model

        return build_lazy_trained_model(cfg)
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine.trainer import Trainer

    model = Trainer.build_model(cfg)
    if cfg.MODEL.WEIGHTS:
        ResilientCheckpointer(model, save_dir=cfg.OUTPUT_DIR, require_every_weight=True).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=False
        )
    else:
        logger.warning("MODEL.WEIGHTS is empty: exporting a randomly initialized model.")
    return model.eval()


def _scripted_adapter(model: Any) -> torch.nn.Module:  # GeneralizedRCNN, checked below
    from detectron2.modeling import GeneralizedRCNN

    if not isinstance(model, GeneralizedRCNN):
        raise ValueError("--export-method scripting supports detectron2's GeneralizedRCNN models only")

    class ScriptableAdapter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.eval()

        def forward(self, inputs: Tuple[Dict[str, Tensor]]) -> List[Dict[str, Tensor]]:
            instances = self.model.inference(inputs, do_postprocess=False)
            return [i.get_fields() for i in instances]

    return ScriptableAdapter()


def export_scripting(model: torch.nn.Module, path: str) -> torch.jit.ScriptModule:
    """``torch.jit.script`` of an R-CNN (detectron2's ``scripting_with_instances``), saved to ``path``."""
    from detectron2.export import scripting_with_instances
    from detectron2.structures import Boxes

    from gwdet.engine.atomic import path_written_with_checksum

    types = {"Boxes": Boxes, "Tensor": Tensor}
    fields = {name: types[kind] for name, kind in SCRIPTED_FIELDS.items()}
    scripted = scripting_with_instances(_scripted_adapter(model), fields)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with path_written_with_checksum(path) as temporary:  # atomically, SHA-256 in path.sha256
        torch.jit.save(scripted, temporary)
    return scripted


def _scripted_difference(model, scripted, image: Tensor) -> float:
    with torch.no_grad():
        expected = model.inference([{"image": image}], do_postprocess=False)[0].get_fields()
        got = scripted(({"image": image},))[0]
    names = sorted(expected)
    return compared_difference([_tensor_of(expected[n]) for n in names], [_tensor_of(got[n]) for n in names])


def _tensor_of(field):
    """The tensor of an instance field (``Boxes`` hold theirs in ``.tensor``)."""
    return getattr(field, "tensor", field)


def evaluate_traced(cfg, traced, adapter) -> Dict:
    """COCO evaluation of the traced model on ``DATASETS.TEST[0]`` (postprocessed like eager)."""
    from detectron2.data import build_detection_test_loader
    from detectron2.evaluation import inference_on_dataset, print_csv_format
    from detectron2.modeling.postprocessing import detector_postprocess

    from gwdet.data.datasets import prepare_datasets
    from gwdet.engine.trainer import Trainer

    if is_lazy(cfg):  # dataloader.test and dataloader.evaluator
        from gwdet.engine.lazy import build_evaluator, build_test_loader

        loader, evaluator = build_test_loader(cfg), build_evaluator(cfg)
    else:
        prepare_datasets(cfg)
        dataset = cfg.DATASETS.TEST[0]
        loader, evaluator = build_detection_test_loader(cfg, dataset), Trainer.build_evaluator(cfg, dataset)

    def run(inputs):
        # the traced model stops before the resize to the original image size
        sample = inputs[0]
        instances = adapter.outputs_schema(traced(sample["image"]))[0]["instances"]
        return [{"instances": detector_postprocess(instances, sample["height"], sample["width"])}]

    results = inference_on_dataset(run, loader, evaluator)
    print_csv_format(results)
    return results


def count_detections(model: Any, image: Tensor) -> int:  # a detectron2 meta-architecture (inference())
    """The number of detections ``model`` (in evaluation mode) makes on ``image``."""
    with torch.no_grad():
        return len(model.inference([{"image": image}], do_postprocess=False)[0])


def pick_sample(model: torch.nn.Module, images: Iterable[Tensor], source: Optional[str] = None) -> Tuple[Tensor, int]:
    """The first of ``images`` on which ``model`` detects something, and its detection count;
    ``SystemExit`` when there is none (``source`` names where the images came from, ``None`` for
    ``--sample-image``). An export is compared with the eager model on the outputs of this image,
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
    raise SystemExit(
        f"{nothing}, so the export could not be compared with the model (empty outputs always agree); "
        "nothing was written. Give --sample-image an image with objects the model detects (or weights "
        "trained further)."
    )


def compared_difference(expected: Sequence[Tensor], actual: Sequence) -> float:
    """:func:`~gwdet.export.deploy.max_abs_difference` of the exported file's outputs from the
    eager model's, on outputs that hold values only: ``SystemExit`` (nothing is written) when an
    eager output is empty (an agreement on it would say nothing) or when the shapes differ."""
    from gwdet.export.deploy import max_abs_difference

    empty = [index for index, output in enumerate(expected) if torch.as_tensor(output).numel() == 0]
    if empty:
        raise SystemExit(
            f"The eager model's outputs {empty} are empty on the sample image, so the export could not be "
            "compared there; nothing was written."
        )
    try:
        return max_abs_difference(expected, actual)
    except ValueError as error:
        raise SystemExit(f"The exported model's outputs differ from the eager model's ({error}); nothing was written.") from error


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``gwdet-export`` / ``tools/deploy/export_model.py``: the exit status. An error gwdet raises on
    purpose ends it with ``<tool>: error: <message>`` and status 2; ``--verbose`` shows tracebacks
    (:mod:`gwdet.engine.cli_errors`)."""
    argv, verbose = split_verbose(sys.argv[1:] if argv is None else argv)
    with reported_errors(verbose=verbose):
        return _export(argv)


def _export(argv: Sequence[str]) -> int:
    from detectron2.utils.logger import setup_logger

    from gwdet.model_zoo import resolve_config_argument
    from gwdet.engine.atomic import path_written_with_checksum
    from gwdet.export.deploy import ONNX_OPSET, export_model_onnx, export_torchscript, run_onnx

    parser = argument_parser()
    args = parser.parse_args(argv)
    resolve_config_argument(parser, args)
    setup_logger(name="gwdet")
    setup_logger(name="detectron2")
    if args.format == "onnx" and args.export_method != "tracing":
        raise SystemExit("--format onnx needs --export-method tracing")
    if args.run_eval and (args.format != "torchscript" or args.export_method != "tracing"):
        raise SystemExit("--run-eval evaluates a traced TorchScript model: use --format torchscript --export-method tracing")
    path = os.path.join(args.output, "model.onnx" if args.format == "onnx" else "model.ts")
    if os.path.exists(path) and not args.overwrite:
        raise SystemExit(f"{path} already exists; it is left as it is. Pass --overwrite to replace it, or "
                         "choose another --output.")
    cfg = load_config(args.config_file, args.opts)
    model = build_trained_model(cfg)
    image, found = pick_sample(model, *sample_candidates(cfg, args.sample_image))
    logger.info("The sample image gives %d detections to compare the export on.", found)
    created_output = not os.path.isdir(args.output)
    os.makedirs(args.output, exist_ok=True)
    # The export is written under a temporary name and checked there; only a complete, checked file
    # takes the name, so a failed or interrupted export leaves an earlier one as it was; its SHA-256
    # is then recorded in model.ts.sha256 / model.onnx.sha256 (gwdet.export.load_export checks it).
    try:
        with torch.no_grad(), path_written_with_checksum(path) as written:
            if args.format == "torchscript" and args.export_method == "scripting":
                scripted = export_scripting(model, written)
                difference = _scripted_difference(model, scripted, image)
            elif args.format == "torchscript":
                traced, adapter = export_torchscript(model, image, written)
                difference = compared_difference(adapter(image), traced(image))
                logger.info("Inputs schema: %s", adapter.inputs_schema)
                logger.info("Outputs schema: %s", adapter.outputs_schema)
            else:
                adapter = export_model_onnx(model, image, written, args.opset or ONNX_OPSET)
                try:
                    difference = compared_difference(adapter(image), run_onnx(written, [image]))
                except ImportError:
                    difference = None
                    logger.warning("onnxruntime is not installed: the exported file was not run.")
    except BaseException:
        # a folder this call made and left empty goes too
        if created_output and not os.listdir(args.output):
            os.rmdir(args.output)
        raise
    logger.info("Exported %s", path)
    if difference is not None:
        print(f"Exported {path}; largest absolute difference from the eager model on the sample input: {difference:.3g}")
    if args.run_eval:
        evaluate_traced(cfg, traced, adapter)
    return 0
