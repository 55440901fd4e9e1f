"""``import gwdet`` changes nothing of detectron2: no function rebound, stock models bit-identical."""
import subprocess
import sys
import textwrap

from conftest import REPO

SNAPSHOT = textwrap.dedent("""
    import sys, detectron2.engine, detectron2.modeling, detectron2.layers, detectron2.config
    def snapshot():
        return {(name, attr): id(value) for name, module in list(sys.modules.items())
                if name.startswith("detectron2") and module is not None
                for attr, value in vars(module).items() if callable(value)}
    before = snapshot()
    import gwdet, gwdet.engine.trainer
    after = snapshot()
    changed = sorted(f"{m}.{a}" for (m, a) in before if after.get((m, a)) != before[(m, a)])
    print(len(before), changed)
""")

STOCK_MODEL_HASH = textwrap.dedent("""
    import hashlib, sys, torch
    if sys.argv[1] == "with-gwdet":
        import gwdet  # noqa
    from detectron2 import model_zoo
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    digests = []
    for norm in ("FrozenBN", "GN"):
        cfg = get_cfg()
        cfg.merge_from_file(model_zoo.get_config_file("Base-RCNN-FPN.yaml"))
        cfg.MODEL.DEVICE = "cpu"
        cfg.MODEL.MASK_ON = True
        cfg.MODEL.RESNETS.NORM = cfg.MODEL.FPN.NORM = norm
        cfg.MODEL.ROI_BOX_HEAD.NORM = cfg.MODEL.ROI_MASK_HEAD.NORM = norm if norm == "GN" else ""
        torch.manual_seed(0)
        model = build_model(cfg)
        digest = hashlib.sha256()
        for key, value in model.state_dict().items():
            digest.update(key.encode()); digest.update(value.detach().contiguous().numpy().tobytes())
        groups = sorted({m.num_groups for m in model.modules() if isinstance(m, torch.nn.GroupNorm)})
        digests.append(f"{norm}:{digest.hexdigest()}:{groups}")
    print(" ".join(digests))
""")


def _python(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_importing_gwdet_rebinds_no_detectron2_function():
    count, changed = _python("-c", SNAPSHOT).split(" ", 1)
    assert int(count) > 500, "the snapshot saw detectron2's modules"
    assert changed == "[]"


def test_stock_configs_build_bit_identical_models_with_gwdet_imported():
    without = _python("-c", STOCK_MODEL_HASH, "without-gwdet")
    with_gwdet = _python("-c", STOCK_MODEL_HASH, "with-gwdet")
    assert with_gwdet == without
    assert without.endswith(":[32]"), "GN keeps detectron2's 32 groups"


def test_importing_gwdet_prints_no_warning_and_leaves_the_warning_filters_alone():
    script = ("import warnings; before = list(warnings.filters); import gwdet, gwdet.engine.trainer; "
              "print(warnings.filters == before)")
    result = subprocess.run([sys.executable, "-W", "default", "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-2000:]
    assert "Warning" not in result.stderr, result.stderr[-2000:]
