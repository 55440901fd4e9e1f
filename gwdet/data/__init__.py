"""Datasets: the embedded synthetic shapes dataset, your own COCO-format data registered from the
command line (``--register-coco``), checks on registered dataset paths, and the refusal of training
images with non-finite pixels."""
from gwdet.data.coco_registration import (
    CocoDataset,
    DatasetError,
    add_register_coco_argument,
    check_config_against_datasets,
    datasets_in_environment,
    register_coco_datasets,
)
from gwdet.data.datasets import check_dataset_files, prepare_datasets, register_datasets
from gwdet.data.finite_images import NonFiniteImageError, check_finite_images
from gwdet.data.shapes import (
    CLASSES,
    CacheNotWritableError,
    ShapesSpec,
    ensure_generated,
    register_shapes,
    register_shapes_spec,
    shapes_dataset,
)

__all__ = [
    "CLASSES", "CacheNotWritableError", "CocoDataset", "DatasetError", "NonFiniteImageError", "ShapesSpec",
    "add_register_coco_argument", "check_config_against_datasets", "check_dataset_files", "check_finite_images",
    "datasets_in_environment", "ensure_generated", "prepare_datasets", "register_coco_datasets", "register_datasets",
    "register_shapes", "register_shapes_spec", "shapes_dataset",
]
