"""MODEL.GW.* reaches every GW layer on every detectron2 build path, whatever the import order.

Each import order runs tests/build_paths_worker.py (both configs) in a fresh process: ``detectron2-first`` imports
detectron2's ``build_model`` and ``get_norm`` before gwdet, ``gwdet-first`` after.
"""
import json
import subprocess
import sys

import pytest

from conftest import REPO

CHANGED = ["MODEL.GW.NUM_GROUPS", "4", "MODEL.GW.T", "3", "MODEL.GW.EPS", "0.001"]
PATHS = ("build_model", "DefaultTrainer.build_model", "gwdet.Trainer.build_model",
         "build_backbone+build_roi_heads", "from_config")
# Per part: the norm layers expected (type -> count) in each config.
EXPECTED = {
    "configs/mask_rcnn_gw.yaml": {  # X-101-32x8d: GW at the stem + conv2 of 33 blocks
        "bottom_up": {"GroupWhitening": 34, "FrozenBatchNorm2d": 70},
        "fpn": {"GroupWhitening": 8},
        "box_head": {"GroupWhitening": 4},
        "mask_head": {"GroupWhitening": 4},
    },
    "configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml": {  # R-50 layout: stem + 16 blocks; GN(8) elsewhere
        "bottom_up": {"GroupWhitening": 17, "GroupNorm": 36},
        "fpn": {"GroupWhitening": 8},
        "box_head": {"GroupWhitening": 4},
        "mask_head": {"GroupWhitening": 4},
    },
}


def _run(order: str, configs: list[str], opts: list[str]) -> dict:
    result = subprocess.run(
        [sys.executable, "tests/build_paths_worker.py", order, ",".join(configs), *opts],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["detectron2-first", "gwdet-first"])
def test_changed_gw_values_reach_every_gw_layer_on_every_path(order):
    built = _run(order, sorted(EXPECTED), CHANGED)  # one process per import order builds both configs
    assert set(built) == set(EXPECTED)
    for config, found in built.items():
        assert set(found) == set(PATHS), config
        for path, parts in found.items():
            wanted = EXPECTED[config] if path != "from_config" else {
                part: EXPECTED[config][part] for part in ("box_head", "mask_head")}
            assert {part: parts[part]["norms"] for part in wanted} == wanted, (config, path)
            for part in wanted:
                assert parts[part]["gw"] == [[4, 3, 0.001]], (config, path, part)


def test_gn_group_number_of_the_config_reaches_the_backbone():
    # The demo config sets MODEL.GN.NUM_GROUPS 8 for the backbone's GN; detectron2 alone gives 32.
    script = (
        "import gwdet, torch\n"
        "from detectron2.modeling import build_backbone\n"
        "from gwdet.model_zoo import build_config\n"
        "cfg = build_config('configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml', ['MODEL.GN.NUM_GROUPS', '4'])\n"
        "print(sorted({m.num_groups for m in build_backbone(cfg).modules() if type(m) is torch.nn.GroupNorm}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[4]"
