"""Run by tests/test_distributed.py through gwdet's ``launch`` (CPU processes, gloo, on every
supported detectron2): train, then save this rank's parameters and its local rank so the test can
compare ranks. (Not a test module: spawned processes import it.)"""
import sys

import torch
from detectron2.utils import comm

from gwdet.data import prepare_datasets
from gwdet.engine.trainer import Trainer
from gwdet.model_zoo import build_config
from gwdet.engine.launch import launch


def train_and_save_parameters(config_file: str, opts: list, out_dir: str) -> None:
    cfg = build_config(config_file, opts + ["OUTPUT_DIR", out_dir])
    prepare_datasets(cfg)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    model = trainer.model.module if hasattr(trainer.model, "module") else trainer.model
    parameters = {name: p.detach().clone() for name, p in model.named_parameters()}
    record = {"world_size": comm.get_world_size(), "local_rank": comm.get_local_rank(),
              "local_size": comm.get_local_size(), "parameters": parameters}
    torch.save(record, f"{out_dir}/rank{comm.get_rank()}.pth")


if __name__ == "__main__":
    config_file, out_dir, *opts = sys.argv[1:]
    launch(train_and_save_parameters, 2, dist_url="auto", args=(config_file, opts, out_dir))
