"""Datasets: the embedded synthetic shapes dataset and checks on registered dataset paths."""
from gwdet.data.datasets import check_dataset_files, prepare_datasets
from gwdet.data.shapes import CLASSES, ShapesSpec, ensure_generated, register_shapes

__all__ = ["CLASSES", "ShapesSpec", "check_dataset_files", "ensure_generated", "prepare_datasets", "register_shapes"]
