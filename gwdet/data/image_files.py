"""Image files checked as detectron2 will read them, cheaply enough to check every image of a dataset.

detectron2's ``read_image`` opens a file with PIL, turns it by its EXIF orientation and converts it
to 8-bit RGB; its ``DatasetMapper`` then requires the size the dataset states. :func:`image_file_problem`
finds, before training, the files that would go wrong there: a mode whose conversion to 8 bits
clips the picture (16-bit PNGs; :data:`READABLE_MODES` are those that keep it), a size other than
stated (``SizeMismatchError`` mid-run), a file of several frames or pages (an animated GIF, a
multi-page TIFF: ``read_image`` reads the first alone), a file cut short or damaged, an image larger
than PIL opens (``PIL.Image.MAX_IMAGE_PIXELS``). It reads a PNG's every chunk (CRCs, the image data
inflated, an EXIF chunk after the data), a JPEG's header and end-of-image marker, and decodes other
files in full; a JPEG damaged in its middle decodes without an error and is not found. EXIF
orientations the stated size cannot confirm are recorded for a warning (its ``rotations``).
"""
from __future__ import annotations

import functools
import os
import re
import unicodedata
import zlib

from PIL import Image, UnidentifiedImageError

# PIL modes whose conversion to 8-bit RGB keeps the picture: 1-bit, 8-bit grayscale, palette,
# 8-bit colour with or without alpha (alpha dropped), CMYK and YCbCr.
READABLE_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"})
_MODE_WORDS = {"I;16": "16-bit grayscale", "I;16L": "16-bit grayscale", "I;16B": "16-bit grayscale",
               "I;16N": "16-bit grayscale", "I": "32-bit integer", "F": "32-bit floating-point"}
_EXIF_ORIENTATION = 0x0112
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_TURNED = (2, 3, 4, *_TRANSPOSED)  # EXIF orientations that detectron2's read_image applies (1: as stored)
_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")  # the pixel count in PIL's decompression bomb message
_JPEG_END = b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_INFLATE_STEP = 1 << 20  # bytes of a PNG's image data inflated at a time while checking it
CONVERT_HINT = ("convert it to 8-bit RGB or grayscale (e.g. 16-bit values scaled to 0-255: "
                "Image.fromarray((np.asarray(im) >> 8).astype(np.uint8)))")
# Formats whose first frame is the whole picture: an MPO's later images are previews or other views
# (cameras and phones write them into their JPEGs), a PSD's are the layers its first one composes.
_WHOLE_FIRST_FRAME = frozenset({"MPO", "PSD"})
_NEW_SUBFILE_TYPE = 254  # TIFF tag; bit 1: a reduced-resolution copy of another page, bit 4: a transparency mask
_NOT_A_PAGE = 0b101
_FRAMES_OF = {"GIF": ("frames", "an animated GIF"), "PNG": ("frames", "an animated PNG"),
              "WEBP": ("frames", "an animated WebP"), "AVIF": ("frames", "an animated AVIF"),
              "TIFF": ("pages", "a multi-page TIFF"), "DCX": ("pages", "a multi-page DCX")}
FLOAT_CONVERT_HINT = ("convert it to 8-bit RGB or grayscale (e.g. values of 0 to 1 scaled to 0-255: "
                      "Image.fromarray((np.clip(np.asarray(im), 0, 1) * 255).astype(np.uint8)))")


def mode_problem(mode: str) -> str:
    """Why an image of PIL mode ``mode`` would not reach the model as it is ("" when it would)."""
    if mode in READABLE_MODES:
        return ""
    if mode == "F":  # PIL rounds each value and clips it to 0-255: values of 0 to 1 give 0 or 1
        return (f"is a {_MODE_WORDS[mode]} image (PIL mode 'F'), which detectron2 converts to 8 bits by clipping "
                "every value to 0-255 without a word (values of 0 to 1, as floating-point images often hold, become "
                "a black image; values above 255 white): " + FLOAT_CONVERT_HINT)
    if mode in _MODE_WORDS:
        return (f"is a {_MODE_WORDS[mode]} image (PIL mode {mode!r}), which detectron2 converts to 8 bits by clipping "
                "every value above 255 (a white image, without a word): " + CONVERT_HINT)
    return (f"is an image of PIL mode {mode!r}, which detectron2's conversion to 8-bit RGB does not read as it is: "
            "convert it to 8-bit RGB")


def _pictures(image: Image.Image) -> int:
    """How many pictures the open ``image`` holds as frames or pages (PIL's ``n_frames``), of which
    detectron2's ``read_image`` reads the first alone: 1 for the formats whose first frame is the
    whole picture (:data:`_WHOLE_FIRST_FRAME`), a TIFF's reduced-resolution copies and transparency
    masks of a page not counted. The frame headers are read, no frame decoded; ``image`` is left
    at its first frame."""
    frames = getattr(image, "n_frames", 1)
    if frames <= 1 or image.format in _WHOLE_FIRST_FRAME:
        return 1
    if image.format != "TIFF":
        return frames
    pages = 0
    for frame in range(frames):
        image.seek(frame)
        pages += not (int(getattr(image, "tag_v2", {}).get(_NEW_SUBFILE_TYPE, 0)) & _NOT_A_PAGE)
    image.seek(0)
    return pages


def frames_problem(frames: int, image_format: str | None) -> str:
    """Why a file of ``frames`` frames or pages would not reach the model as it is ("" for one)."""
    if frames <= 1:
        return ""
    noun, kind = _FRAMES_OF.get(image_format or "", ("frames", f"a {image_format or 'multi-frame'} file"))
    one = noun[:-1]
    return (f"holds {frames} {noun} ({kind}), of which detectron2's read_image reads only the first, without a "
            f"word: save the {one} meant as a single-frame PNG or JPEG (PIL: im.seek(N), N the {one}'s index from 0, "
            "then im.convert('RGB').save(...))")


def _ends_completely(path: str, image_format: str | None) -> bool:
    """Whether a JPEG file ends with its end-of-image marker (else it may be cut short)."""
    if image_format != "JPEG":
        return False
    with open(path, "rb") as file:
        file.seek(max(0, os.path.getsize(path) - len(_JPEG_END)))
        return file.read() == _JPEG_END


def _scan_png(path: str) -> tuple[bytes | None, str]:
    """One pass over the chunks of the PNG at ``path``: each checked against its CRC and the image
    data inflated (a stream damaged under valid CRCs, which detectron2 reads as a black image). Returns
    the EXIF chunk when it comes after the image data (PIL's header read stops before it, while
    detectron2's read of the whole image finds it), and why the file is damaged ("" when it is not)."""
    exif, inflater, seen_data = None, zlib.decompressobj(), False
    with open(path, "rb") as file:
        file.seek(len(_PNG_SIGNATURE))
        while True:
            header = file.read(8)
            length, kind = int.from_bytes(header[:4], "big"), header[4:]
            data, crc = file.read(length), file.read(4)
            if len(header) < 8 or len(data) < length or len(crc) < 4:
                return exif, "it ends before its last chunk"
            if zlib.crc32(kind + data) != int.from_bytes(crc, "big"):
                return exif, f"its {kind.decode('latin-1')!r} chunk fails its CRC"
            if kind == b"IEND":
                break
            if kind == b"IDAT":
                seen_data = True
                try:
                    while data:  # inflated a megabyte at a time, and dropped
                        inflater.decompress(data, _INFLATE_STEP)
                        data = inflater.unconsumed_tail
                except zlib.error as error:
                    return exif, f"its image data cannot be inflated: {error}"
            elif kind == b"eXIf" and seen_data:
                exif = data
    return exif, "" if inflater.eof else "its image data ends early"


def _orientation(exif: bytes) -> int:
    """The EXIF orientation held in a PNG's ``eXIf`` chunk (1 when it holds none)."""
    record = Image.Exif()
    record.load(exif)
    return int(record.get(_EXIF_ORIENTATION, 1))


def _record_rotation(rotations: dict[str, int], path: str, orientation: int, size: tuple[int, int]) -> None:
    """Add ``path`` to ``rotations`` if its EXIF ``orientation`` turns it without changing its
    ``size`` (a flip or half turn, or a quarter turn of a square image), which the check of the size
    a JSON states cannot see."""
    if orientation in _TURNED and (orientation not in _TRANSPOSED or size[0] == size[1]):
        rotations[path] = orientation


def _too_many_pixels(error: Exception, width: int | None, height: int | None) -> str:
    """Why an image PIL refuses as a possible decompression bomb (its ``DecompressionBombError``, or
    its ``DecompressionBombWarning`` raised by a warnings filter) cannot be read; ``width`` and
    ``height``: the size stated for it, named when they give PIL's pixel count."""
    found = _BOMB_PIXELS.search(str(error))
    pixels = int(found.group(1)) if found else None
    if pixels is None:
        size = "is"
    elif width is not None and height is not None and width * height == pixels:
        size = f"is {width}x{height} = {pixels} pixels,"
    else:
        size = f"is {pixels} pixels,"
    refused = ("refuses more than twice that" if isinstance(error, Image.DecompressionBombError)
               else "warns above it, and a warnings filter made the warning an error")
    return (f"{size} more than PIL opens (PIL.Image.MAX_IMAGE_PIXELS is {Image.MAX_IMAGE_PIXELS}; PIL {refused}, "
            "as a possible decompression bomb), so detectron2 cannot read it: resize it (detectron2 scales images to "
            "at most INPUT.MAX_SIZE_TRAIN / MAX_SIZE_TEST pixels on their longer side anyway), or, if you mean to use "
            "images that large, raise PIL.Image.MAX_IMAGE_PIXELS in your own code before the images are read")


def image_file_problem(path: str, width: int | None = None, height: int | None = None,
                       rotations: dict[str, int] | None = None) -> str:
    """What is wrong with the image file at ``path`` for detectron2 ("" when nothing): missing,
    not an image, larger than PIL opens, a mode that does not convert to 8 bits (:func:`mode_problem`),
    several frames or pages (:func:`frames_problem`; their headers read, no frame decoded), another size than ``width`` x ``height`` after its EXIF rotation (not checked without them), cut
    short or damaged. An EXIF orientation the size cannot confirm is added to ``rotations`` (path:
    orientation) when given, read where the size check opens the file anyway.
    The words follow the file's name in a message ("... 003.png is ...")."""
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        return "is not a regular file (a named pipe or a device), which PIL would wait on: give the image file"
    try:
        with Image.open(path) as image:
            mode, size, image_format = image.mode, image.size, image.format
            late_exif, damage = _scan_png(path) if image_format == "PNG" else (None, "")
            if damage:
                return f"cannot be decoded ({damage}): it is cut short or damaged; copy it again"
            # a PNG's EXIF comes with its header or after the image data, which only the scan reaches
            if late_exif is not None and "exif" not in image.info:
                orientation = _orientation(late_exif)
            elif image_format != "PNG" or "exif" in image.info:
                orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
            else:
                orientation = 1
            problem = mode_problem(mode) or frames_problem(_pictures(image), image_format)
            if problem:
                return problem
            if rotations is not None:
                _record_rotation(rotations, path, orientation, size)
            if orientation in _TRANSPOSED:
                size = (size[1], size[0])
            if width is not None and height is not None and size != (width, height):
                if orientation in _TRANSPOSED and (size[1], size[0]) == (width, height):
                    return (f"is stored {width}x{height} pixels, as the JSON states, with an EXIF orientation "
                            f"({orientation}) that turns it to {size[0]}x{size[1]}, as detectron2 reads it: if your "
                            "annotation tool ignored the orientation (the boxes fit the stored image), remove it from "
                            "the file (e.g. PIL: save the image without its exif); if the boxes fit the turned image, "
                            f"state width {size[0]} and height {size[1]} in the JSON")
                turned = " after the rotation its EXIF orientation asks for" if orientation in _TRANSPOSED else ""
                return (f"is {size[0]}x{size[1]} pixels (width x height{turned}), but the JSON states {width}x{height}: "
                        "correct the image's width and height in the JSON (or the file)")
            if image_format != "PNG" and not _ends_completely(path, image_format):
                image.load()
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a link to {os.readlink(path)}, which does not exist: restore that file, or link to the image"
        return "does not exist" + name_twin_note(path)
    except IsADirectoryError:
        return "is a folder, not an image file"
    except UnidentifiedImageError:
        return "is not an image file PIL can read"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        return _too_many_pixels(error, width, height)
    except (OSError, SyntaxError, ValueError, EOFError) as error:  # PIL's words for cut or damaged data
        reason = str(error).strip() or type(error).__name__
        if "Ghostscript" in reason:  # EPS: PIL needs a program this machine lacks, the file is not at fault
            return (f"cannot be decoded here ({reason}): PIL reads this format with Ghostscript, which this machine "
                    "lacks (detectron2 could not read it either); convert the image to PNG or JPEG")
        return f"cannot be decoded ({reason}): it is cut short or damaged; copy it again"
    return ""


def _folded(name: str) -> str:
    """``name`` in Unicode's composed form (NFC) and without letter case: how a macOS or Windows
    file system compares names."""
    return unicodedata.normalize("NFC", name).casefold()


@functools.lru_cache(maxsize=8)
def _folded_names(folder: str, modified_ns: int) -> dict[str, tuple[str, ...]]:
    """The names in ``folder`` by their :func:`_folded` form; cached per folder and modification
    time (``modified_ns``), which changes when a name is added, removed or renamed."""
    names: dict[str, tuple[str, ...]] = {}
    for entry in os.listdir(folder):
        names[_folded(entry)] = (*names.get(_folded(entry), ()), entry)
    return names


def name_twin_note(path: str) -> str:
    """A note naming the file beside the missing ``path`` whose name differs from its own only in
    Unicode normalization (NFC / NFD) or letter case, as a dataset made on macOS or Windows has it
    ("" when there is none): this system compares file names byte by byte."""
    folder, name = os.path.split(path)
    folder = folder or "."
    try:
        entries = _folded_names(folder, os.stat(folder).st_mtime_ns).get(_folded(name), ())
    except OSError:
        return ""
    twin = next((entry for entry in entries if entry != name), None)
    if twin is None:
        return ""
    if unicodedata.normalize("NFC", twin) == unicodedata.normalize("NFC", name):
        how = ("in the Unicode form of its accented letters (composed NFC in one, decomposed NFD in the other, as "
               "macOS writes names): they look alike but differ")
    else:
        how = "in letter case (a dataset made on a case-insensitive file system, macOS's or Windows's)"
    return (f"; the folder holds {twin!r}, the same name but {how}, and this system compares names byte by byte: "
            "write the JSON's file_name as the file is named (or rename the file)")
