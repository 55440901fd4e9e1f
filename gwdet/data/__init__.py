"""Datasets: the embedded synthetic shapes dataset, checks on registered dataset paths, and the
refusal of training images with non-finite pixels."""
from gwdet.data.datasets import check_dataset_files, prepare_datasets
from gwdet.data.finite_images import NonFiniteImageError, check_finite_images
from gwdet.data.shapes import CLASSES, CacheNotWritableError, ShapesSpec, ensure_generated, register_shapes

__all__ = [
    "CLASSES", "CacheNotWritableError", "NonFiniteImageError", "ShapesSpec", "check_dataset_files",
    "check_finite_images", "ensure_generated", "prepare_datasets", "register_shapes",
]
