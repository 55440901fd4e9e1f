"""Whether an exported detector finds what the eager model finds: detections matched, then compared.

An exported file and the eager model round differently (reference formulas against the fused op),
so detections of nearly equal scores can swap places and a position-by-position comparison would
compare different objects. :func:`compare_detections` matches each eager detection to the exported
one of the same class whose box is closest (within :data:`MATCH_FRACTION` of the image's longer
side, or the box tolerance where that is larger), and compares the pairs within ``tolerance``
(``--tolerance``, default :data:`TOLERANCE`): boxes within ``tolerance`` x the image's longer side,
scores and mask probabilities within ``tolerance``. A detection only one side finds is allowed where
rounding decides whether it is kept (its score within ``tolerance`` of the score threshold, or of
the lowest score kept when a side holds the most detections per image). The result,
:class:`DetectionComparison`, lists the differences beyond the tolerance and the largest ones within.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from gwdet.errors import listed

TOLERANCE = 1e-3
SHOWN = 3  # differences quoted in one message


@dataclass(frozen=True)
class Detections:
    """One image's detections as float64 tensors: boxes ``(N, 4)`` (x0, y0, x1, y1 in pixels),
    scores ``(N,)``, classes ``(N,)``, masks ``(N, ...)`` or ``None``."""

    boxes: Tensor
    scores: Tensor
    classes: Tensor
    masks: Optional[Tensor] = None

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Optional["Detections"]:
        """Detections from detectron2's instance fields (``pred_boxes``, ``scores``,
        ``pred_classes``, ``pred_masks``; ``Boxes`` or tensors or arrays), or a proposal network's
        (``proposal_boxes`` scored by ``objectness_logits``, all of one class); ``None`` without them."""
        def tensor(value: Any) -> Tensor:
            return torch.as_tensor(getattr(value, "tensor", value)).detach().cpu().double()

        if {"proposal_boxes", "objectness_logits"} <= set(fields):
            scores = tensor(fields["objectness_logits"]).reshape(-1)
            return cls(tensor(fields["proposal_boxes"]).reshape(-1, 4), scores, torch.zeros_like(scores))
        if not {"pred_boxes", "scores", "pred_classes"} <= set(fields):
            return None
        masks = fields.get("pred_masks")
        return cls(tensor(fields["pred_boxes"]).reshape(-1, 4), tensor(fields["scores"]).reshape(-1),
                   tensor(fields["pred_classes"]).reshape(-1), None if masks is None else tensor(masks))

    def __len__(self) -> int:
        return int(self.scores.numel())

    def describe(self, index: int) -> str:
        box = ", ".join(f"{v:.1f}" for v in self.boxes[index].tolist())
        return f"class {int(self.classes[index])} score {float(self.scores[index]):.4f} box [{box}]"


@dataclass
class DetectionComparison:
    """What :func:`compare_detections` found."""

    tolerance: float
    box_tolerance: float
    matched: int = 0
    box: float = 0.0  # largest differences over the matched pairs
    score: float = 0.0
    mask: float = 0.0
    masks_compared: bool = False  # whether the detections carry masks (a Faster R-CNN's do not)
    problems: list[str] = field(default_factory=list)

    @property
    def largest(self) -> float:
        return max(self.box, self.score, self.mask)

    def summary(self) -> str:
        masks, and_masks = (f", mask probabilities {self.mask:.3g}", " and mask probabilities") if self.masks_compared \
            else ("", "")
        return (f"{self.matched} detection(s) matched by class and box; largest differences: boxes {self.box:.3g} px, "
                f"scores {self.score:.3g}{masks} (tolerance {self.tolerance:g}: boxes {self.box_tolerance:.3g} px, "
                f"scores{and_masks} {self.tolerance:g})")

    def refusal(self) -> str:
        shown = listed(self.problems, SHOWN, "; ")
        return (f"The exported model's detections differ from the eager model's on the sample image beyond the "
                f"tolerance ({len(self.problems)} difference(s): {shown}); nothing was written. {self.summary()}. An "
                "export that computes another function than the model is wrong: check the config and weights it was "
                "built from; a larger --tolerance accepts larger rounding differences.")


# Detections of one class whose boxes are this close (x the image's longer side) are paired, whatever
# the tolerance; a pair's differences are then compared with the tolerance, so that a tolerance below
# the rounding does not turn every pair into two unmatched detections.
MATCH_FRACTION = 0.02


def _closest(expected: Detections, index: int, actual: Detections, free: list[bool]) -> tuple[int, float]:
    """The unmatched detection of ``actual`` of ``expected``'s class ``index`` with the closest box,
    and that box's largest coordinate difference (``-1, inf`` when there is none)."""
    best, distance = -1, float("inf")
    for other in range(len(actual)):
        if free[other] and actual.classes[other] == expected.classes[index]:
            gap = float((actual.boxes[other] - expected.boxes[index]).abs().max())
            if gap < distance:
                best, distance = other, gap
    return best, distance


def _may_be_missing(score: float, tolerance: float, threshold: Optional[float], lowest_kept: Optional[float]) -> bool:
    """Whether a detection of ``score`` found by one side only may be a rounding decision."""
    near_threshold = threshold is not None and abs(score - threshold) <= tolerance
    near_cut = lowest_kept is not None and score <= lowest_kept + tolerance
    return near_threshold or near_cut


def compare_detections(expected: Detections, actual: Detections, image_size: tuple[int, int], tolerance: float = TOLERANCE,
                       score_threshold: Optional[float] = None, max_detections: Optional[int] = None) -> DetectionComparison:
    """Match ``actual`` (the export's) to ``expected`` (the eager model's) detections on one image of
    ``image_size`` (height, width) and compare them (see the module's description)."""
    box_tolerance = tolerance * max(image_size)
    match_radius = max(box_tolerance, MATCH_FRACTION * max(image_size))  # pairs first, then their differences
    result = DetectionComparison(tolerance, box_tolerance)
    for side, detections in (("eager model", expected), ("export", actual)):
        for name in ("boxes", "scores", "masks"):
            values = getattr(detections, name)
            if values is not None and not bool(torch.isfinite(values).all()):  # NaN compares as no difference
                result.problems.append(f"the {side}'s {name} hold values that are not finite (NaN or inf)")
    free = [True] * len(actual)
    unmatched_expected = []
    for index in sorted(range(len(expected)), key=lambda i: -float(expected.scores[i])):
        other, distance = _closest(expected, index, actual, free)
        if other < 0 or distance > match_radius:
            unmatched_expected.append(index)
            continue
        free[other] = False
        result.matched += 1
        result.box = max(result.box, distance)
        result.score = max(result.score, abs(float(expected.scores[index] - actual.scores[other])))
        if expected.masks is not None and actual.masks is not None:
            result.masks_compared = True
            if expected.masks[index].shape != actual.masks[other].shape:
                result.problems.append(f"the mask of {expected.describe(index)} has shape "
                                       f"{tuple(actual.masks[other].shape)} in the export, {tuple(expected.masks[index].shape)} in eager")
                continue
            result.mask = max(result.mask, float((expected.masks[index] - actual.masks[other]).abs().max()))
    for side, detections, indices in (("eager model", expected, unmatched_expected),
                                      ("export", actual, [i for i in range(len(actual)) if free[i]])):
        full = max_detections is not None and len(detections) >= max_detections
        lowest = float(detections.scores.min()) if full and len(detections) else None
        for index in indices:
            if not _may_be_missing(float(detections.scores[index]), tolerance, score_threshold, lowest):
                result.problems.append(f"only the {side} finds {detections.describe(index)}")
    if result.box > box_tolerance:
        result.problems.append(f"a matched detection's box differs by {result.box:.3g} px")
    if result.score > tolerance:
        result.problems.append(f"a matched detection's score differs by {result.score:.3g}")
    if result.mask > tolerance:
        result.problems.append(f"a matched detection's mask probabilities differ by up to {result.mask:.3g}")
    return result


def detection_limits(model: torch.nn.Module) -> tuple[Optional[float], Optional[int]]:
    """The score threshold and the most detections per image of a detectron2 detector (R-CNN:
    ``roi_heads.box_predictor``; a proposal network: its proposal generator's count at test time;
    RetinaNet and others: the model's own), ``None`` where it has none."""
    predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
    owner = predictor if predictor is not None else model
    threshold = getattr(owner, "test_score_thresh", None)
    most = getattr(owner, "test_topk_per_image", getattr(owner, "max_detections_per_image", None))
    proposals = getattr(getattr(model, "proposal_generator", None), "post_nms_topk", None)
    if predictor is None and most is None and isinstance(proposals, dict):
        most = proposals.get(False)  # detectron2's RPN: {training: count, test: count}
    return (float(threshold) if threshold is not None else None, int(most) if most is not None and most > 0 else None)
