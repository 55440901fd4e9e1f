"""The checks of image files and masks behind --register-coco and the tools' single images
(gwdet.data.image_files, gwdet.data.masks), on files written here and masks pycocotools encodes."""
from __future__ import annotations

import zlib

import numpy as np
import torch
import pycocotools.mask as mask_util
import pytest
from PIL import Image

from gwdet.data.image_files import image_file_problem
from gwdet.data.masks import compressed_counts, segmentation_problem
from gwdet.data.test_images import read_test_image
from gwdet.model_zoo import build_config

from conftest import DEMO_CONFIG, TINY_OPTS


def _runs(mask: np.ndarray) -> list[int]:
    """Run lengths of a mask in column-major order, starting with a run of zeros (COCO's RLE)."""
    flat = mask.flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    edges = np.concatenate(([0], changes, [flat.size]))
    runs = [int(run) for run in np.diff(edges)]
    return ([0] + runs) if flat[0] else runs


def test_compressed_rle_strings_read_back_to_the_runs_pycocotools_encoded():
    rng = np.random.default_rng(0)
    for trial in range(200):
        height, width = (int(v) for v in rng.integers(1, 80, size=2))
        mask = (rng.random((height, width)) < rng.random()).astype(np.uint8)
        if trial % 4 == 0:  # long runs: counts of several 5-bit groups, negative differences
            mask[:] = 0
            mask[rng.integers(0, height):, rng.integers(0, width):] = 1
        encoded = mask_util.encode(np.asfortranarray(mask))
        assert compressed_counts(encoded["counts"].decode("ascii")).tolist() == _runs(mask), trial
        assert segmentation_problem({"size": [height, width], "counts": encoded["counts"].decode("ascii")},
                                    width, height) in ("", "is RLE of no pixel (an empty mask)")
    assert compressed_counts("a") is None, "a count whose last group says more follow"
    assert compressed_counts("0 ") is None, "a character below '0'"


def test_uncompressed_and_crowd_rle_that_fit_pass_and_empty_or_misfit_rle_is_named():
    mask = np.zeros((20, 30), dtype=np.uint8)
    mask[5:10, 8:20] = 1
    runs = _runs(mask)
    assert segmentation_problem({"size": [20, 30], "counts": runs}, 30, 20, [8, 5, 12, 5]) == ""
    assert segmentation_problem({"size": [20, 30], "counts": runs}, 30, 20) == ""  # a crowd region: no box
    assert segmentation_problem({"size": [20, 30], "counts": [600]}, 30, 20) == "is RLE of no pixel (an empty mask)"
    assert segmentation_problem({"size": [30, 20], "counts": runs}, 30, 20) == (
        "is RLE of size [30, 20] (height, width), but its image is 20x30")
    assert "negative run length" in segmentation_problem({"size": [20, 30], "counts": [700, -100]}, 30, 20)
    assert "not all integers" in segmentation_problem({"size": [20, 30], "counts": [600.0]}, 30, 20)
    assert segmentation_problem([[0, 0, 5, 5, 10, 10]], 30, 20) == "has polygons of no area (all points on one line)"
    # a self-intersecting "figure eight", whose lobes' signed areas cancel and which pycocotools fills: refused as
    # "all points on one line"
    assert segmentation_problem([[2, 2, 12, 12, 12, 2, 2, 12]], 30, 20, [2, 2, 10, 10]) == ""
    assert segmentation_problem([], 30, 20) == "", "no mask: the mask check of MODEL.MASK_ON names it"
    # a mask a little larger than its box (a loose annotation tool) is no problem
    assert segmentation_problem([[8, 5, 21, 5, 21, 11, 8, 11]], 30, 20, [8, 5, 12, 5]) == ""


def test_a_sixteen_bit_or_broken_sample_image_is_refused_before_it_reaches_the_model(tmp_path):
    cfg = build_config(str(DEMO_CONFIG), TINY_OPTS)
    deep = tmp_path / "deep.png"
    Image.fromarray((np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16)).save(deep)
    with pytest.raises(ValueError) as refused:
        read_test_image(cfg, str(deep))
    assert str(refused.value).startswith(f"{deep} is a 16-bit grayscale image (PIL mode 'I;16'), which detectron2 "
                                         "converts to 8 bits by clipping every value above 255")
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(ValueError, match="notes.png is not an image file PIL can read"):
        read_test_image(cfg, str(text))
    with pytest.raises(ValueError, match="missing.png does not exist"):
        read_test_image(cfg, str(tmp_path / "missing.png"))
    wide = tmp_path / "wide.png"  # the test resize (64 a side at most) would make it 0.43 pixels high
    Image.fromarray(np.zeros((20, 3000, 3), dtype=np.uint8)).save(wide)
    with pytest.raises(ValueError, match=r"wide.png \(3000x20 pixels\) cannot be resized as the test loader resizes "
                                         r"images .*one side would keep no pixel"):
        read_test_image(cfg, str(wide))  # was PIL's "height and width must be > 0"
    plain = tmp_path / "plain.png"
    Image.fromarray(np.full((64, 48, 3), 7, dtype=np.uint8)).save(plain)
    read = read_test_image(cfg, str(plain))
    assert (read["height"], read["width"]) == (64, 48) and read["image"].max() == 7
    assert read["image"].dtype == torch.uint8, "the test loader's dtype: an ONNX export traced on it takes uint8"


def test_image_files_of_other_formats_are_decoded_in_full(tmp_path):
    bmp = tmp_path / "image.bmp"
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(bmp)
    assert image_file_problem(str(bmp), 16, 16) == ""
    bmp.write_bytes(bmp.read_bytes()[:-100])
    assert image_file_problem(str(bmp), 16, 16).startswith("cannot be decoded (")
    assert image_file_problem(str(tmp_path)) == "is a folder, not an image file"
    floats = tmp_path / "floats.tif"
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(floats)
    problem = image_file_problem(str(floats))
    # before: "clipping every value above 255 (a white image)", and a fix (>> 8) that raises on floats
    assert problem.startswith("is a 32-bit floating-point image (PIL mode 'F')") and "become a black image" in problem
    im = Image.open(floats)
    converted = eval(problem.split("e.g. values of 0 to 1 scaled to 0-255: ")[1][:-1], {"Image": Image, "np": np, "im": im})
    assert converted.mode == "L" and np.asarray(converted).tolist() == [[127] * 8] * 8
    assert np.asarray(im.convert("L")).max() <= 1, "what detectron2 reads: black"


def _png_chunks(path) -> list[tuple[bytes, bytes]]:
    """The (type, data) chunks of a PNG file."""
    raw, chunks, at = path.read_bytes(), [], 8
    while at < len(raw):
        length = int.from_bytes(raw[at:at + 4], "big")
        chunks.append((raw[at + 4:at + 8], raw[at + 8:at + 8 + length]))
        at += 12 + length
    return chunks


def _write_png_chunks(path, chunks) -> None:
    """A PNG of ``chunks``, each with its CRC computed anew (so only the content can be wrong)."""
    body = b"".join(len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
                    for kind, data in chunks)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def test_a_png_is_checked_to_its_end_its_image_data_and_an_exif_chunk_after_it(tmp_path):
    """detectron2 reads the whole PNG: an EXIF orientation after the image data turns the image (PIL's
    header read misses it), and image data damaged under valid CRCs reads as a black image."""
    path = tmp_path / "wide.png"
    Image.fromarray(np.zeros((48, 64, 3), dtype=np.uint8)).save(path)  # 64 wide, 48 high
    exif = Image.Exif()
    exif[0x0112] = 6  # a quarter turn: detectron2 reads it 48 wide, 64 high
    chunks = _png_chunks(path)
    _write_png_chunks(path, chunks[:-1] + [(b"eXIf", exif.tobytes()), chunks[-1]])
    rotations: dict = {}
    assert image_file_problem(str(path), 48, 64, rotations) == ""
    assert image_file_problem(str(path), 64, 48).startswith(
        "is stored 64x48 pixels, as the JSON states, with an EXIF orientation (6) that turns it to 48x64, as "
        "detectron2 reads it")
    exif[0x0112] = 3  # a half turn, which the size does not show
    _write_png_chunks(path, chunks[:-1] + [(b"eXIf", exif.tobytes()), chunks[-1]])
    assert image_file_problem(str(path), 64, 48, rotations) == "" and rotations == {str(path): 3}
    damaged = [(kind, data[:4] + b"\xff" * 8 + data[12:]) if kind == b"IDAT" else (kind, data) for kind, data in chunks]
    _write_png_chunks(path, damaged)
    assert image_file_problem(str(path), 64, 48).startswith(
        "cannot be decoded (its image data cannot be inflated: Error -3 while decompressing data")
