"""The shapes dataset's content against a committed digest (tests/shapes_digest.json), so that a
library upgrade that changes the generated data (numpy's random streams or float arithmetic,
Pillow's drawing, pycocotools' mask encoding) fails here, loudly, instead of silently changing
every number trained on the dataset.

The digest is of what a model sees, not of the files' bytes: each PNG's decoded pixels, and each
split's COCO json parsed (its sections, and each annotation field over all annotations). The PNG
files' bytes depend on the zlib that Pillow was built with (Pillow 13.0.0's wheel: zlib-ng 2.3.3)
while their pixels do not; the bytes are checked within one environment only (generating twice
gives the same files).

To accept a change of the data on purpose: bump ``GENERATOR_VERSION`` in gwdet/data/shapes.py
(caches drawn before are then not reused), record the digest again with
``python tests/test_shapes_digest.py --update``, and train again what depends on the data
(docs/demo.md's numbers, the study).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from gwdet.data.shapes import GENERATOR_VERSION, SPLITS, ShapesSpec, ensure_generated
from gwdet.engine.run_environment import package_version

DIGEST_FILE = Path(__file__).with_name("shapes_digest.json")
SPEC = ShapesSpec(image_size=64, num_train=3, num_val=2, num_test=2, seed=0)
LIBRARIES = (("numpy", "numpy"), ("Pillow", "PIL"), ("pycocotools", "pycocotools"))
ANNOTATION_FIELDS = ("image_id", "category_id", "segmentation", "area", "bbox", "iscrowd")
UPDATE = "python tests/test_shapes_digest.py --update"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def pixels_digest(path: Path) -> str:
    """SHA-256 of a PNG's decoded RGB pixels and their shape."""
    with Image.open(path) as png:
        pixels = np.asarray(png.convert("RGB"))
    return _sha256(repr(pixels.shape).encode() + pixels.tobytes())


def annotations_digest(path: Path) -> dict[str, str]:
    """SHA-256 of each section of a COCO json (``images``, ``categories``, ``info``) and of each
    annotation field over all annotations, in order (``annotations.bbox``, ...)."""
    coco = json.loads(path.read_text())
    digest = {section: _sha256(_canonical(coco[section])) for section in ("info", "images", "categories")}
    digest["annotations.count"] = str(len(coco["annotations"]))
    for field in ANNOTATION_FIELDS:
        digest[f"annotations.{field}"] = _sha256(_canonical([a[field] for a in coco["annotations"]]))
    return digest


def dataset_digest(folder: Path) -> dict[str, dict[str, str]]:
    """``{"<split>.json": annotations_digest, "<split>/<image>.png": {"pixels": ...}}`` of a generated folder."""
    digest = {}
    for split in SPLITS:
        digest[f"{split}.json"] = annotations_digest(folder / f"{split}.json")
        for png in sorted((folder / split).glob("*.png")):
            digest[f"{split}/{png.name}"] = {"pixels": pixels_digest(png)}
    return digest


def environment() -> dict[str, str]:
    return {"python": platform.python_version(), **{name: package_version(name, module) for name, module in LIBRARIES}}


def record(folder: Path) -> dict:
    """What tests/shapes_digest.json holds: the spec, the generator's version, the libraries that
    drew the data, and its digest."""
    return {"spec": SPEC.parameters(), "generator_version": GENERATOR_VERSION, "recorded_with": environment(),
            "digest": dataset_digest(folder)}


def changes(recorded: dict, generated: dict) -> list[str]:
    """One line per file whose content differs from the recorded digest."""
    lines = []
    for name in sorted(set(recorded) | set(generated)):
        old, new = recorded.get(name), generated.get(name)
        if old is None or new is None:
            lines.append(f"{name}: {'not generated now' if new is None else 'not in the record'}")
            continue
        differing = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
        if differing:
            lines.append(f"{name}: {', '.join(differing)} differ")
    return lines


def diagnosis(lines: list[str]) -> str:
    """What a pattern of changes points at."""
    pixels = any(line.endswith("pixels differ") for line in lines)
    masks = any("segmentation" in line or "bbox" in line or "area" in line or "count" in line for line in lines)
    if pixels and masks:
        return ("Pixels and masks both changed: the shapes are drawn differently (Pillow's ImageDraw polygon "
                "or ellipse filling) or numpy's random streams give other values.")
    if pixels:
        return ("Only pixels changed, the masks did not: the background, noise or colours differ (numpy's "
                "random streams, or its float arithmetic: np.sin and the float-to-uint8 conversion).")
    if masks:
        return "Only the annotations changed, not the pixels: pycocotools encodes masks or computes areas/boxes differently."
    return "The record and the generated files name different files or sections."


def mismatch_message(recorded: dict, generated: dict) -> str:
    lines = changes(recorded["digest"], generated["digest"])
    then, now = recorded["recorded_with"], generated["recorded_with"]
    versions = ", ".join(f"{name} {then.get(name)} -> {now[name]}" if then.get(name) != now[name] else f"{name} {now[name]}"
                         for name in now)
    shown = lines[:12] + ([f"... and {len(lines) - 12} more"] if len(lines) > 12 else [])
    return "\n".join([
        f"The shapes dataset generated now differs from the one recorded in {DIGEST_FILE.name} "
        f"({len(lines)} file(s)):", *(f"  {line}" for line in shown),
        diagnosis(lines),
        f"Recorded with / now: {versions}.",
        "Every number trained on this dataset (docs/demo.md, the study) changes with it. If a library upgrade did "
        "this, install the versions of the lock file; to accept the new data on purpose, bump GENERATOR_VERSION in "
        f"gwdet/data/shapes.py, run `{UPDATE}` and train again what depends on the data.",
    ])


def generate(root: Path) -> Path:
    return ensure_generated(SPEC, root)


def test_the_generated_dataset_matches_its_committed_digest(tmp_path):
    recorded = json.loads(DIGEST_FILE.read_text())
    assert recorded["spec"] == SPEC.parameters() and recorded["generator_version"] == GENERATOR_VERSION, (
        f"{DIGEST_FILE.name} was recorded for another spec or GENERATOR_VERSION "
        f"({recorded['generator_version']}, now {GENERATOR_VERSION}): run `{UPDATE}`")
    generated = record(generate(tmp_path))
    assert generated["digest"] == recorded["digest"], mismatch_message(recorded, generated)


def test_a_changed_pixel_or_mask_is_named_with_what_it_points_at(tmp_path):
    """The check itself: one changed pixel of one image, then one changed annotation field."""
    folder = generate(tmp_path)
    recorded = record(folder)
    png = folder / "val" / "000001.png"
    pixels = np.array(Image.open(png).convert("RGB"))
    pixels[3, 5, 1] ^= 1
    Image.fromarray(pixels).save(png)
    changed = record(folder)
    assert changes(recorded["digest"], changed["digest"]) == ["val/000001.png: pixels differ"]
    message = mismatch_message(recorded, changed)
    assert "Only pixels changed, the masks did not" in message and UPDATE in message
    assert "numpy " + recorded["recorded_with"]["numpy"] in message
    coco = json.loads((folder / "test.json").read_text())
    coco["annotations"][0]["bbox"][0] += 1.0
    (folder / "test.json").write_text(json.dumps(coco))
    lines = changes(recorded["digest"], record(folder)["digest"])
    assert lines == ["test.json: annotations.bbox differ", "val/000001.png: pixels differ"]
    assert diagnosis(lines).startswith("Pixels and masks both changed")


def test_generating_twice_gives_the_same_files(tmp_path):
    """Within one environment the PNG encoder is deterministic: byte for byte the same files
    (shapes.py's checksums.json records every file's SHA-256)."""
    first, second = generate(tmp_path / "a"), generate(tmp_path / "b")
    assert (first / "checksums.json").read_text() == (second / "checksums.json").read_text()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=f"Record the shapes dataset's digest into {DIGEST_FILE}.")
    parser.add_argument("--update", action="store_true", help="generate the dataset and write the digest")
    if not parser.parse_args().update:
        parser.print_help()
        sys.exit(2)
    with tempfile.TemporaryDirectory() as root:
        DIGEST_FILE.write_text(json.dumps(record(generate(Path(root))), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGEST_FILE}")
