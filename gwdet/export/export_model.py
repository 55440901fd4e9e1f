"""``tools/deploy/export_model.py``: export a gwdet model from a config and its weights to
TorchScript or ONNX, with detectron2's flags (``tools/deploy/export_model.py`` of detectron2)::

    python tools/deploy/export_model.py --config-file configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml \\
        --format torchscript --export-method tracing --output output/deploy \\
        MODEL.WEIGHTS output/demo/model_final.pth

``--format torchscript`` writes ``model.ts`` (``--export-method tracing`` or ``scripting``),
``--format onnx`` writes ``model.onnx`` (tracing, opset ``--opset``). The sample input is
``--sample-image`` resized as detectron2's ``DefaultPredictor`` does, or else the first image of
``DATASETS.TEST[0]``. After exporting, the tool runs the file (TorchScript in this process, ONNX in
onnxruntime) on the sample input and prints the largest absolute difference from the eager model.
``--run-eval`` (TorchScript, tracing) evaluates the exported model on ``DATASETS.TEST[0]`` with the
config's evaluator, as detectron2's tool does.
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

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
    return parser


def add_opts(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The trailing ``KEY VALUE`` config overrides, as in detectron2's tools."""
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE pairs overriding the config")
    return parser


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


def sample_inputs(cfg, sample_image: Optional[str]) -> List[Dict]:
    """``[{"image": (3, H, W) float tensor, "height", "width"}]`` from ``sample_image`` resized like
    detectron2's ``DefaultPredictor``, or the first batch of ``DATASETS.TEST[0]``."""
    from detectron2.data import build_detection_test_loader
    from detectron2.data import detection_utils
    from detectron2.data import transforms as T

    if sample_image is None:
        from gwdet.data.datasets import prepare_datasets

        prepare_datasets(cfg)
        return next(iter(build_detection_test_loader(cfg, cfg.DATASETS.TEST[0])))
    original = detection_utils.read_image(sample_image, format=cfg.INPUT.FORMAT)
    height, width = original.shape[:2]
    resize = T.ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST], cfg.INPUT.MAX_SIZE_TEST)
    image = resize.get_transform(original).apply_image(original)
    return [{"image": torch.as_tensor(image.astype("float32").transpose(2, 0, 1)), "height": height, "width": width}]


def build_trained_model(cfg) -> torch.nn.Module:
    """The config's model with ``MODEL.WEIGHTS`` loaded as ``train_net.py --eval-only`` loads them."""
    from gwdet.checkpoint.resilient import ResilientCheckpointer
    from gwdet.engine import Trainer

    model = Trainer.build_model(cfg)
    if cfg.MODEL.WEIGHTS:
        ResilientCheckpointer(model, save_dir=cfg.OUTPUT_DIR, require_every_weight=True).resume_or_load(
            cfg.MODEL.WEIGHTS, resume=False
        )
    else:
        logger.warning("MODEL.WEIGHTS is empty: exporting a randomly initialized model.")
    return model.eval()


def _scripted_adapter(model: torch.nn.Module) -> torch.nn.Module:
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

    types = {"Boxes": Boxes, "Tensor": Tensor}
    fields = {name: types[kind] for name, kind in SCRIPTED_FIELDS.items()}
    scripted = scripting_with_instances(_scripted_adapter(model), fields)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.jit.save(scripted, path)
    return scripted


def _scripted_difference(model, scripted, image: Tensor) -> float:
    from gwdet.export.deploy import max_abs_difference

    with torch.no_grad():
        expected = model.inference([{"image": image}], do_postprocess=False)[0].get_fields()
        got = scripted(({"image": image},))[0]
    names = sorted(expected)
    return max_abs_difference([_tensor_of(expected[n]) for n in names], [_tensor_of(got[n]) for n in names])


def _tensor_of(field):
    """The tensor of an instance field (``Boxes`` hold theirs in ``.tensor``)."""
    return getattr(field, "tensor", field)


def evaluate_traced(cfg, traced, adapter) -> Dict:
    """COCO evaluation of the traced model on ``DATASETS.TEST[0]`` (postprocessed like eager)."""
    from detectron2.data import build_detection_test_loader
    from detectron2.evaluation import inference_on_dataset, print_csv_format
    from detectron2.modeling.postprocessing import detector_postprocess

    from gwdet.data.datasets import prepare_datasets
    from gwdet.engine import Trainer

    prepare_datasets(cfg)
    dataset = cfg.DATASETS.TEST[0]

    def run(inputs):
        # the traced model stops before the resize to the original image size
        sample = inputs[0]
        instances = adapter.outputs_schema(traced(sample["image"]))[0]["instances"]
        return [{"instances": detector_postprocess(instances, sample["height"], sample["width"])}]

    results = inference_on_dataset(run, build_detection_test_loader(cfg, dataset), Trainer.build_evaluator(cfg, dataset))
    print_csv_format(results)
    return results


def require_detections(model: torch.nn.Module, image: Tensor) -> int:
    """The number of detections ``model`` makes on ``image``; ``SystemExit`` when there are none:
    an exported model is compared with the eager one on the sample image's outputs, and empty
    outputs agree whatever the exported file computes."""
    with torch.no_grad():
        found = len(model.inference([{"image": image}], do_postprocess=False)[0])
    if not found:
        raise SystemExit("The sample image gave no detection, so the export could not be compared with the "
                         "model (empty outputs always agree); nothing was written. Give --sample-image an image "
                         "with objects the model detects (or weights trained further).")
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    from detectron2.utils.logger import setup_logger

    from gwdet.engine import build_config
    from gwdet.model_zoo import resolve_config_argument
    from gwdet.atomic import path_written_atomically
    from gwdet.export.deploy import ONNX_OPSET, export_model_onnx, export_torchscript, max_abs_difference, run_onnx

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
    cfg = build_config(args.config_file, ["DATALOADER.NUM_WORKERS", "0"] + list(args.opts))
    model = build_trained_model(cfg)
    image = sample_inputs(cfg, args.sample_image)[0]["image"]
    logger.info("The sample image gives %d detections to compare the export on.", require_detections(model, image))
    os.makedirs(args.output, exist_ok=True)
    # The export is written under a temporary name and checked there; only a complete, checked file
    # takes the name, so a failed or interrupted export leaves an earlier one as it was.
    with torch.no_grad(), path_written_atomically(path) as written:
        if args.format == "torchscript" and args.export_method == "scripting":
            scripted = export_scripting(model, written)
            difference = _scripted_difference(model, scripted, image)
        elif args.format == "torchscript":
            traced, adapter = export_torchscript(model, image, written)
            difference = max_abs_difference(adapter(image), traced(image))
            logger.info("Inputs schema: %s", adapter.inputs_schema)
            logger.info("Outputs schema: %s", adapter.outputs_schema)
        else:
            adapter = export_model_onnx(model, image, written, args.opset or ONNX_OPSET)
            try:
                difference = max_abs_difference(adapter(image), run_onnx(written, [image]))
            except ImportError:
                difference = None
                logger.warning("onnxruntime is not installed: the exported file was not run.")
    logger.info("Exported %s", path)
    if difference is not None:
        print(f"Exported {path}; largest absolute difference from the eager model on the sample input: {difference:.3g}")
    if args.run_eval:
        evaluate_traced(cfg, traced, adapter)
    return 0
