"""Refusing a training image whose pixels are not all finite, before the model sees it.

An ``inf`` or NaN pixel makes the first loss non-finite, which detectron2 reports like a diverging
training. :class:`FiniteImageBatches` wraps a train loader (gwdet's
:class:`~gwdet.engine.trainer.Trainer` wraps whatever its ``build_train_loader`` returns) and raises
:class:`NonFiniteImageError` naming the image. Only floating-point images (a custom mapper's) are
scanned: detectron2's ``DatasetMapper`` reads 8-bit integers.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from gwdet.errors import GwdetError


class NonFiniteImageError(GwdetError, ValueError):
    """An input image holds ``inf`` or NaN pixels."""


def _image_name(record: Mapping[str, Any], position: int) -> str:
    """How the error names an image: its file and id when the dataset dict has them."""
    parts = [f"{key} {record[key]!r}" for key in ("file_name", "image_id") if key in record]
    return ", ".join(parts) if parts else f"number {position} of its batch (no file_name or image_id)"


def check_finite_images(batch: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`NonFiniteImageError` if the ``"image"`` of a dataset dict in ``batch`` has a
    pixel that is ``inf`` or NaN (integer images are finite by construction and are not scanned)."""
    for position, record in enumerate(batch):
        image = record.get("image")
        if not isinstance(image, torch.Tensor) or not image.is_floating_point():
            continue
        finite = torch.isfinite(image)
        if bool(finite.all()):
            continue
        bad = (~finite).nonzero()
        first = ", ".join(str(int(index)) for index in bad[0])
        raise NonFiniteImageError(
            f"The input image {_image_name(record, position)} has pixels that are not finite: "
            f"{len(bad)} of {image.numel()} values are inf or NaN (the first at index ({first}) of its "
            f"{tuple(image.shape)} tensor). The image, not the model, is broken: fix or drop the "
            "file, or the mapper that produced it, before training or evaluating on it."
        )


class FiniteImageBatches:
    """The batches of ``loader``, each checked by :func:`check_finite_images` before it is handed
    on; every other attribute is ``loader``'s (e.g. what :mod:`gwdet.data.resumable` sets on it)."""

    def __init__(self, loader: Iterable[Sequence[Mapping[str, Any]]]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Sequence[Mapping[str, Any]]]:
        for batch in self.loader:
            check_finite_images(batch)
            yield batch

    def __len__(self) -> int:
        """``len(loader)``: a test loader's number of batches (detectron2's ``inference_on_dataset``
        reads it)."""
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # called only for names the wrapper itself lacks
        loader = self.__dict__.get("loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)
