"""A GW Mask R-CNN (the demo config, tiny) trains on empty and half-empty batches and evaluates."""
import pytest
import torch
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS

SIZE = 64


def instances(num: int) -> Instances:
    result = Instances((SIZE, SIZE))
    boxes = torch.tensor([[4.0, 4.0, 30.0, 30.0], [20.0, 10.0, 60.0, 50.0]])[:num]
    masks = torch.zeros(num, SIZE, SIZE, dtype=torch.bool)
    for i, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
        masks[i, y0:y1, x0:x1] = True
    result.gt_boxes, result.gt_classes, result.gt_masks = Boxes(boxes), torch.arange(num) % 4, BitMasks(masks)
    return result


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(build_config(str(DEMO_CONFIG), TINY_OPTS))


@pytest.mark.parametrize("counts", [(0, 0), (2, 0), (1, 2)], ids=["empty", "half-empty", "full"])
def test_training_step_is_finite(model, counts):
    model.train()
    batch = [{"image": torch.rand(3, SIZE, SIZE) * 255, "instances": instances(n)} for n in counts]
    with EventStorage(0):
        losses = model(batch)
    total = sum(losses.values())
    assert torch.isfinite(total), losses
    total.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad()


def test_inference_returns_instances_with_masks(model):
    model.eval()
    with torch.no_grad():
        outputs = model([{"image": torch.rand(3, SIZE, SIZE) * 255, "height": SIZE, "width": SIZE}])
    predicted = outputs[0]["instances"]
    assert predicted.has("pred_masks") and predicted.pred_masks.shape[0] == len(predicted)
    assert predicted.pred_masks.shape[-2:] == (SIZE, SIZE)
