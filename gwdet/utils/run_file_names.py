"""The names of what a run leaves in its ``OUTPUT_DIR``: detectron2's files (its config record,
log, metrics, checkpoints and the evaluators' folders) and gwdet's (results, records, lock, the
files set aside while a run replaces or resumes another). The rules of what a run may do to them
live in :mod:`gwdet.engine.output_dir`; the config loaders read the names too (a run's
``config.yaml`` given as a config), so they sit here, below both."""
from __future__ import annotations

import re

from gwdet.utils.atomic import CHECKSUM_SUFFIX

LAST_CHECKPOINT = "last_checkpoint"  # detectron2's Checkpointer names the latest checkpoint in it
LOCK_NAME = ".gwdet.lock"
FINAL_WEIGHTS = "model_final.pth"  # what detectron2's periodic checkpointer saves at the end
CONFIG_NAME = "config.yaml"  # detectron2's default_setup writes the run's config here
METRICS_JSON = "metrics.json"  # detectron2's JSONWriter appends the training metrics here
RUN_ID = "run_id"  # the identity of the run whose checkpoints the folder holds (gwdet.checkpoint.run_identity)
# Files and folders of a run that a new run would replace or append to (config.yaml and
# results.json with the SHA-256 recorded beside them, gwdet.utils.atomic).
RESULTS_MARKDOWN = "results.md"  # the run's results, written by gwdet.engine.run
RESULTS_JSON = "results.json"
# What detectron2's COCOEvaluator writes into its output folder
EVALUATOR_FILES = ("coco_instances_results.json", "instances_predictions.pth")
# The run's config, its record and (config.yaml.pkl) the pickle detectron2's LazyConfig.save writes of
# a config that YAML cannot hold (a function, say): what a run leaves before its first step
CONFIG_FILES = (CONFIG_NAME, CONFIG_NAME + CHECKSUM_SUFFIX, CONFIG_NAME + ".pkl")
RUN_FILES = (LAST_CHECKPOINT, RUN_ID, METRICS_JSON, RESULTS_MARKDOWN, RESULTS_JSON, *CONFIG_FILES,
             RESULTS_JSON + CHECKSUM_SUFFIX)
# A run resumed past its results keeps them as results<SET_ASIDE_INFIX><iteration>[_<n>].md / .json
# (set_aside_results), with its files, and a run resumed with other config values keeps the config of
# its earlier iterations as config<SET_ASIDE_INFIX><iteration>[_<n>].yaml; EARLIER_RESULTS matches those
# names (and their SHA-256 records).
SET_ASIDE_INFIX = "_before_resuming_at_"
EARLIER_RESULTS = re.compile(rf"^(results{SET_ASIDE_INFIX}\d+(_\d+)?\.(md|json)"
                             rf"|config{SET_ASIDE_INFIX}\d+(_\d+)?\.yaml)(\.sha256)?$")
EVAL_FOLDER = "eval"  # --eval-only of a folder that holds a run writes to eval/<checkpoint>/
INFERENCE_FOLDER = "inference"  # detectron2's evaluators write their files in inference/<dataset>/
VIS_FOLDER = "vis"  # the prediction drawings
RUN_FOLDERS = (INFERENCE_FOLDER, VIS_FOLDER, EVAL_FOLDER)
# While detectron2 rewrites config.yaml in place, a copy of it and of its record is kept in this folder
# (complete once renamed from CONFIG_KEEPING): config_rewrite, restore_config.
CONFIG_KEPT = ".gwdet-config-before"
CONFIG_KEEPING = CONFIG_KEPT + ".new"
# --overwrite: the earlier run's files until the new run has started (put back if it stops before)
SET_ASIDE = ".gwdet-overwritten"
LOG_NAME = "log.txt"  # detectron2's log of a run, appended to by every run in the folder
RANK_LOG = re.compile(r"^log\.txt\.rank\d+$")  # the logs of a run's other processes (detectron2's setup_logger)
CONFIG_PAIR = (CONFIG_NAME + CHECKSUM_SUFFIX, CONFIG_NAME)  # put back in this order: the record first
