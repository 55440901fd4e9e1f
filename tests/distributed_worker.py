"""Run by tests/test_distributed.py through gwdet's ``launch`` (CPU processes, gloo, on every
supported detectron2): train, then save this rank's parameters and its local rank so the test can
compare ranks, and what resuming the run logs; or check what the ranks agree on (configs, the
folder of an evaluation). (Not a test module: spawned processes import it.)"""
import argparse
import logging
import sys
import time

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
    # what --resume of this run says: every process continues with process 0's random generators
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("gwdet.checkpoint.resilient").addHandler(handler)
    Trainer(cfg).resume_or_load(resume=True)
    with open(f"{out_dir}/resume{comm.get_rank()}.txt", "w", encoding="utf-8") as f:
        f.write("\n".join(said))


def check_rank_configs(config_file: str, out_dir: str) -> None:
    """Rank 1 holds another group count than rank 0, then another request, then another thread count;
    each rank writes what the config check said."""
    from gwdet.engine.run import check_same_config, load_run_config

    opts = ["MODEL.GW.NUM_GROUPS", "8"] if comm.get_rank() == 1 else []
    said = []
    # another config on rank 1; then the same config, but --resume on rank 1 only (the processes hung)
    for run, resume in ((load_run_config(config_file, opts), False), (load_run_config(config_file), comm.get_rank() == 1)):
        try:
            check_same_config(run, argparse.Namespace(resume=resume, eval_only=False))
            said.append("accepted")
        except ValueError as error:
            said.append(str(error))
    # the same config and requests, but one more CPU thread in rank 1 (machines started with other --threads)
    with open(f"{out_dir}/threads{comm.get_rank()}.txt", "w", encoding="utf-8") as f:
        f.write(str(torch.get_num_threads()))
    torch.set_num_threads(torch.get_num_threads() + comm.get_rank())
    try:
        check_same_config(load_run_config(config_file), argparse.Namespace(resume=False, eval_only=False))
        said.append("accepted")
    except ValueError as error:
        said.append(str(error))
    with open(f"{out_dir}/rank{comm.get_rank()}.txt", "w", encoding="utf-8") as f:
        f.write("\n".join(said))


def choose_evaluation_folders(run_folder: str, out_dir: str) -> None:
    """--eval-only of a run's weights in its folder, where rank 1 finds the evaluation folder rank 0
    chose taken (by rank 0's lock, as when it looks later): each rank writes the folder it was given."""
    from gwdet.engine import output_dir, run as run_module
    from gwdet.engine.arguments import parse_args

    if comm.get_rank() == 1:
        chosen = output_dir.evaluation_folder
        run_module.evaluation_folder = lambda *args: chosen(*args) + "-2"  # type: ignore[attr-defined]
    args = parse_args(["--config-file", f"{run_folder}/config.yaml", "--eval-only", "--resume"])
    run = run_module.load_run_config(args.config_file, args.opts)
    with open(f"{out_dir}/rank{comm.get_rank()}.txt", "w", encoding="utf-8") as f:
        f.write(run_module.evaluation_request(run, args)[0].output_dir)


def wait_for_stop(out_dir: str) -> None:
    """Wait for a stop signal, with the signals' default action (a process told to stop before its
    training's checkpoint hook is installed)."""
    open(f"{out_dir}/ready{comm.get_rank()}", "w").close()
    time.sleep(120)


def save_on_stop(out_dir: str) -> None:
    """Wait for a stop signal; on SIGTERM write saved<rank> half a second later and end with status
    143, as a trainer's checkpoint hook does."""
    import signal

    rank = comm.get_rank()

    def stop(signum, frame):
        time.sleep(0.5)
        open(f"{out_dir}/saved{rank}", "w").close()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    open(f"{out_dir}/ready{rank}", "w").close()
    time.sleep(120)


if __name__ == "__main__":
    if sys.argv[1] == "--check-rank-configs":
        launch(check_rank_configs, 2, dist_url="auto", args=tuple(sys.argv[2:4]))
    elif sys.argv[1] == "--stop-signal":
        launch(save_on_stop, 2, dist_url="auto", args=(sys.argv[2],))
    elif sys.argv[1] == "--stop-unprotected":
        launch(wait_for_stop, 2, dist_url="auto", args=(sys.argv[2],))
    elif sys.argv[1] == "--evaluation-folders":
        launch(choose_evaluation_folders, 2, dist_url="auto", args=tuple(sys.argv[2:4]))
    else:
        config_file, out_dir, *opts = sys.argv[1:]
        launch(train_and_save_parameters, 2, dist_url="auto", args=(config_file, opts, out_dir))
