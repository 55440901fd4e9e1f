"""Preparing the datasets a config names, and checking their files before training starts.

detectron2 registers COCO under ``$DETECTRON2_DATASETS`` (default ``./datasets``) at import time,
whether or not the files exist; a missing file would otherwise surface only deep inside data
loading. :func:`check_dataset_files` turns that into an error naming the path and the fix.
Your own COCO-format datasets come from ``--register-coco NAME=JSON:IMAGE_ROOT`` or
``$GWDET_REGISTER_COCO`` (:mod:`gwdet.data.coco_registration`; :func:`register_datasets`).
"""
from __future__ import annotations

import contextlib
import difflib
import logging
import os
from typing import Any, Iterable, Iterator, Sequence

from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog

from gwdet.config import SHAPES_PREFIX
from gwdet.errors import GwdetFileNotFoundError, GwdetKeyError, GwdetValueError, did_you_mean
from gwdet.data.coco_registration import (
    ENVIRONMENT_VARIABLE,
    CocoDataset,
    DatasetError,
    DatasetUse,
    check_config_against_datasets,
    environment_datasets,
    given_on_the_command_line,
    known_class_names,
    register_coco_datasets,
    registered_annotation_file,
    registered_coco_dataset,
    warn_of_test_sets_trained_on,
)
from gwdet.data.shapes import SPLITS, register_shapes

SHAPES_SPLITS = tuple(SHAPES_PREFIX + split for split in SPLITS)  # the shapes dataset's registered names

COCO_LAYOUT_HINT = (
    "For COCO, set DETECTRON2_DATASETS to the folder that holds coco/, laid out as "
    "coco/annotations/instances_{train,val}2017.json and coco/{train,val}2017/*.jpg. "
    "To run without COCO, use the embedded dataset: shapes_train to train on, shapes_val (or shapes_test, its "
    "held-out split) to test on, as DATASETS.TRAIN ('shapes_train',) DATASETS.TEST ('shapes_val',) in a yacs "
    "config, dataloader.train.dataset.names=shapes_train dataloader.test.dataset.names=shapes_val in a LazyConfig "
    "(with its dataloader.evaluator.dataset_name)."
)
logger = logging.getLogger(__name__)


def config_dataset_names(cfg: CfgNode, trains: bool = True, tests: bool = True) -> list[str]:
    """Every dataset name the config trains (where a request ``trains``) or tests on (where it reads
    the test sets: ``tests``), in order, without repeats."""
    return list(dict.fromkeys([*(cfg.DATASETS.TRAIN if trains else ()), *(cfg.DATASETS.TEST if tests else ())]))


def unregistered_message(name: str) -> str:
    """Why dataset ``name`` cannot be used: it is not registered; the registered name it is closest
    to, and how to register one (a name of gwdet's shapes dataset cannot be: its splits are named)."""
    meant = did_you_mean(difflib.get_close_matches(name, DatasetCatalog.list(), n=1))
    if name.startswith(SHAPES_PREFIX):
        return (f"Dataset {name!r} is not registered.{meant} Names starting with {SHAPES_PREFIX!r} are gwdet's shapes "
                f"dataset's: its splits are {', '.join(SHAPES_SPLITS)}; give your own data another name "
                "(--register-coco NAME=path/to/instances.json:path/to/images).")
    return (
        f"Dataset {name!r} is not registered.{meant} Register your own COCO-format data with --register-coco "
        f"{name}=path/to/instances.json:path/to/images (tools/train_net.py, tools/deploy/export_model.py, "
        "tools/compare_norms.py; detectron2.data.datasets.register_coco_instances in code), or pick a registered one. "
        f"{COCO_LAYOUT_HINT}"
    )


def check_dataset_files(names: Iterable[str]) -> None:
    """Raise FileNotFoundError / KeyError, naming the path and the fix, for any missing dataset."""
    registered = set(DatasetCatalog.list())
    for name in names:
        if name not in registered:
            raise GwdetKeyError(unregistered_message(name))
        metadata = MetadataCatalog.get(name)
        for field in ("json_file", "image_root"):
            path = metadata.get(field)
            if path is not None and not os.path.exists(path):
                raise GwdetFileNotFoundError(
                    f"Dataset {name!r}: its {field} {path!r} does not exist. {COCO_LAYOUT_HINT}"
                )


def register_datasets(cfg: CfgNode, coco: Sequence[CocoDataset] = (), *, trains: bool = True,
                      evaluates: bool = True, reads_tests: bool = True) -> None:
    """Register the ``--register-coco`` datasets ``coco``, and those of ``$GWDET_REGISTER_COCO``
    that the config names and ``coco`` does not (onto the files the variable names now, replacing
    an earlier registration of this process onto others); then check the config against them
    (:func:`gwdet.data.coco_registration.check_config_against_datasets`: the training sets where the
    request ``trains``, the test sets where it ``evaluates``) and that every dataset it reads, other
    than the shapes splits (generated later), is registered (the test sets where it ``reads_tests``:
    a tool given its own image reads none). :class:`DatasetError` names the file or key and the fix."""
    names = config_dataset_names(cfg, trains, reads_tests)
    register_coco_datasets(coco, command_line=True)
    try:
        register_coco_datasets([dataset for dataset in environment_datasets()
                                if dataset.name in names and not given_on_the_command_line(dataset.name)])
    except DatasetError as error:
        message = str(error)
        raise DatasetError(message if message.startswith(ENVIRONMENT_VARIABLE) else
                           f"{ENVIRONMENT_VARIABLE}: {message}") from None
    registered = set(DatasetCatalog.list())
    for name in names:
        if name not in registered and not name.startswith(SHAPES_PREFIX):
            raise DatasetError(unregistered_message(name))
    check_config_against_datasets(cfg, trains=trains, evaluates=evaluates)


def prepare_datasets(cfg: CfgNode, coco: Sequence[CocoDataset] = (), *, trains: bool = True,
                     evaluates: bool = True, shapes: bool = True) -> None:
    """Register the datasets given on the command line (:func:`register_datasets`), generate and
    register the shapes dataset if the request reads it (unless not ``shapes``: a listing that
    reads no image leaves the shapes splits out), then check the files of every dataset it reads:
    the training sets where it ``trains``, the test sets always."""
    register_datasets(cfg, coco, trains=trains, evaluates=evaluates)
    names = config_dataset_names(cfg, trains)
    if shapes:
        register_configured_shapes(cfg, names)
    else:
        names = [name for name in names if not name.startswith(SHAPES_PREFIX)]
    check_dataset_files(names)
    if trains:
        check_distinct_training_files(cfg.DATASETS.TRAIN)
        warn_of_test_sets_trained_on(DatasetUse.of_config(cfg, evaluates=evaluates))


def register_configured_shapes(cfg: CfgNode, names: Sequence[str]) -> None:
    """Register the shapes dataset ``cfg.DATASETS.SHAPES`` describes where ``names`` read it: the
    names are registered once per process, so a config of another shapes spec registered since
    (another model prepared in the same process) would otherwise be read in its place."""
    if any(name.startswith(SHAPES_PREFIX) for name in names):
        register_shapes(cfg)


def check_distinct_training_files(names: Sequence[str]) -> None:
    """Refuse training datasets registered from one annotation file under two names: detectron2
    would join them and draw their images twice as often as the others' (as it would a name given
    twice, which the config check refuses)."""
    seen: dict[str, str] = {}
    for name in names:
        json_file = registered_annotation_file(name)
        if not json_file:
            continue
        path = os.path.realpath(json_file)
        if path in seen:
            raise GwdetValueError(
                f"DATASETS.TRAIN names {seen[path]!r} and {name!r}, registered from one annotation file ({json_file}): "
                "detectron2 would join them and draw their images twice as often as the others'. Give it once (to "
                "weigh images, set DATALOADER.SAMPLER_TRAIN RepeatFactorTrainingSampler).")
        seen[path] = name


def _crowd_regions_only(datasets: str) -> int:
    """The number of crowd regions (iscrowd 1) of the training ``datasets`` (names joined by ", ")
    when they are all ``--register-coco`` datasets whose annotations are all crowd regions, else 0."""
    registered = [registered_coco_dataset(name.strip()) for name in datasets.split(",")]
    if not registered or any(dataset is None for dataset in registered):
        return 0
    contents = [dataset.read for dataset in registered if dataset is not None]
    return 0 if any(content.instances for content in contents) else sum(content.crowd for content in contents)


@contextlib.contextmanager
def named_empty_training_set(datasets: str, keep_empty: str, keypoints: str | None = None) -> Iterator[None]:
    """detectron2's bare ``AssertionError: No valid data found`` (every training image filtered out
    for want of annotations) raised as an error naming the training ``datasets`` (names joined by
    ", ", or the setting that names them), the cause where it is known (annotations that are all
    crowd regions, which detectron2 does not train on; with ``keypoints``, the setting that trains
    a keypoint head, images without enough keypoints) and the setting ``keep_empty`` that trains on
    images without annotations."""
    try:
        yield
    except AssertionError as err:
        if "No valid data" not in str(err):
            raise
        if keypoints:  # detectron2 drops every image with fewer keypoints than the head needs, whatever keep_empty
            raise GwdetValueError(
                f"None of the images of {datasets} has the keypoints {keypoints} trains on (detectron2 drops the "
                "images with fewer than MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE visible keypoints): give "
                "annotations with 'keypoints' (and the dataset's keypoint names), or train without a keypoint head."
            ) from err
        crowd = _crowd_regions_only(datasets)
        cause = (f"all {crowd} of the annotations are crowd regions (iscrowd 1), which detectron2 does not train on. "
                 "Set iscrowd 0 on the annotations of single objects" if crowd else
                 "check that the json's 'annotations' list is there and refers to its 'images' ids")
        raise GwdetValueError(f"None of the images of {datasets} has an annotation to train on: {cause} (or set "
                              f"{keep_empty} to train on empty images).") from err


def _class_names(name: str) -> list[str] | None:
    """Dataset ``name``'s class names: its metadata's ``thing_classes``, or, where detectron2 sets
    them only when the data is loaded (``register_coco_instances``), what is known before
    (:func:`~gwdet.data.coco_registration.known_class_names`: its file's categories)."""
    classes = MetadataCatalog.get(name).get("thing_classes", None)
    return list(classes) if classes else known_class_names(name)


def dataset_classes(names: Sequence[str]) -> list[str] | None:
    """The class names of the first of the datasets ``names`` whose classes are known
    (:func:`_class_names`; detectron2 trains only on datasets with the same class names), or None."""
    for name in names:
        classes = _class_names(name)
        if classes:
            return list(classes)
    return None


def check_evaluated_classes(trained: Any, datasets: Sequence[str], weights: str) -> None:
    """Refuse evaluating ``weights``, trained on the class names ``trained`` (the model's outputs in
    order, as the checkpoint records them; nothing is checked without a record), on a dataset whose
    categories are the same names in another order: each prediction would be scored as another
    class. A dataset of other names is only logged (a model evaluated on another dataset)."""
    if not isinstance(trained, list) or not all(isinstance(name, str) for name in trained):
        return
    for name in datasets:
        classes = _class_names(name)
        if not classes or list(classes) == trained:
            continue
        if sorted(classes) == sorted(trained):
            raise GwdetValueError(
                f"{weights} was trained on the classes {trained} (the order of its outputs), but dataset {name!r} "
                f"has them in the order {list(classes)} (by category id): each prediction would be scored as another "
                "class. Give the test json the category ids of the training json (the same id for each name).")
        logger.warning(f"{weights} was trained on the classes {trained}, dataset {name!r} has {list(classes)}: "
                       "the evaluation scores the model's outputs, in order, as that dataset's classes.")
