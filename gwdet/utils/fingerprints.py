"""Fingerprints of files: a few bytes that tell a file's contents apart from other files' without
reading all of it, for the checks that look for the same image under two names (a test image that
is a copy of a training image) or for images changed under their names (a resumed run's)."""
from __future__ import annotations

import hashlib
import os


FINGERPRINT_ENDS = 4096  # bytes read at each end of a file for its fingerprint
FINGERPRINT_BYTES = 8  # the length of a fingerprint


def file_fingerprint(path: str) -> bytes:
    """:data:`FINGERPRINT_BYTES` bytes of a SHA-256 of the file's size and of its first and last
    :data:`FINGERPRINT_ENDS` bytes (the whole of a smaller file): copies and links of one file have
    the same fingerprint under any name; an image encoded again or edited under the same name (its
    compressed data changes at both ends) has another. Two reads per file."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(FINGERPRINT_ENDS)
        tail = b""
        if size > 2 * FINGERPRINT_ENDS:
            file.seek(size - FINGERPRINT_ENDS)
            tail = file.read(FINGERPRINT_ENDS)
        elif size > FINGERPRINT_ENDS:
            tail = file.read()
    return hashlib.sha256(size.to_bytes(8, "little") + head + tail).digest()[:FINGERPRINT_BYTES]


def split_fingerprints(joined: bytes) -> list[bytes]:
    """The fingerprints of ``joined`` (:data:`FINGERPRINT_BYTES` each, one after the other), in order."""
    return [joined[start:start + FINGERPRINT_BYTES] for start in range(0, len(joined), FINGERPRINT_BYTES)]
