"""A resume trains with the optimizer values the config gives (gwdet.engine.training.configured_optimizer_values),
not the ones the checkpoint's optimizer and scheduler states carry."""
import pytest
import torch
from detectron2.solver import LRMultiplier, WarmupParamScheduler
from fvcore.common.param_scheduler import MultiStepParamScheduler

from gwdet.engine.training import configured_optimizer_values
from gwdet.errors import GwdetError


def optimizer_and_scheduler(model, lr, weight_decay, momentum, groups=1):
    params = list(model.parameters())
    split = [params] if groups == 1 else [params[:1], params[1:]]
    optimizer = torch.optim.SGD([{"params": p} for p in split], lr=lr, weight_decay=weight_decay, momentum=momentum)
    multiplier = WarmupParamScheduler(MultiStepParamScheduler([1.0, 0.1], milestones=[6], num_updates=10), 0.5, 0.2)
    return optimizer, LRMultiplier(optimizer, multiplier, max_iter=10)


def trained_states(model):
    optimizer, scheduler = optimizer_and_scheduler(model, 0.02, 1e-4, 0.9)
    for _ in range(7):  # past the warm-up and the step at 6
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    return optimizer.state_dict(), scheduler.state_dict()


def test_a_resume_trains_with_the_configs_rate_weight_decay_and_momentum():
    # a changed SOLVER.BASE_LR, WEIGHT_DECAY, MOMENTUM was listed as a difference and trained with the run's values
    model = torch.nn.Linear(3, 2)
    optimizer_state, scheduler_state = trained_states(model)
    optimizer, scheduler = optimizer_and_scheduler(model, 0.01, 0.5, 0.0)
    with configured_optimizer_values(optimizer, scheduler, "the grouping settings", "MODEL.WEIGHTS"):
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
    assert scheduler.last_epoch == 7 and optimizer.state  # the run's iteration and momentum buffers
    [group] = optimizer.param_groups
    assert (group["weight_decay"], group["momentum"], group["initial_lr"]) == (0.5, 0.0, 0.01)
    assert group["lr"] == pytest.approx(0.01 * 0.1)  # the config's rate at the resumed iteration, after the step
    scheduler.step()
    assert group["lr"] == pytest.approx(0.01 * 0.1)


def test_a_resume_cannot_regroup_the_optimizer_state():
    model = torch.nn.Linear(3, 2)
    optimizer_state, _ = trained_states(model)
    optimizer, scheduler = optimizer_and_scheduler(model, 0.02, 1e-4, 0.9, groups=2)
    # a subclass's own optimizer was blamed on settings that had not changed: the optimizer is named, and such a one
    with pytest.raises(GwdetError, match=r"--resume: the run's optimizer state groups the parameters otherwise than "
                                         r"this trainer's SGD of 2 group\(s\) \(torch: .*\); SOLVER.BIAS_LR_FACTOR "
                                         r"split the parameters into groups, as does a build_optimizer of one's own "
                                         r"\(a subclass's builds another optimizer\), and a resume cannot regroup"):
        with configured_optimizer_values(optimizer, scheduler, "SOLVER.BIAS_LR_FACTOR", "MODEL.WEIGHTS"):
            optimizer.load_state_dict(optimizer_state)


def test_a_resume_that_restarts_the_warm_up_names_it(tmp_path):
    # SOLVER.WARMUP_ITERS 1 -> 10 with SOLVER.MAX_ITER 2 -> 3 under WarmupMultiStepLR: the warning blamed MAX_ITER and
    # advised WarmupMultiStepLR, the scheduler in use; a warm-up change alone was not warned of
    from gwdet.engine.output_dir import record_config_checksum
    from gwdet.engine.trainer import warn_of_a_moved_schedule
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, logged_warnings

    opts = ["SOLVER.STEPS", "()", "SOLVER.MAX_ITER", "4"]
    (tmp_path / "config.yaml").write_text(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.WARMUP_ITERS", "1"]).dump())
    record_config_checksum(str(tmp_path))
    torch.save({"model": {}, "iteration": 1}, tmp_path / "model_0000001.pth")
    (tmp_path / "last_checkpoint").write_text("model_0000001.pth")
    with logged_warnings("gwdet.engine.output_dir") as logged:
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.WARMUP_ITERS", "10"]), str(tmp_path))
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.WARMUP_ITERS", "1"]), str(tmp_path))
        # another length too: the advice keeps both (the run's warm-up alone still moved the rate)
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.WARMUP_ITERS", "10",
                                                                 "SOLVER.MAX_ITER", "8"]), str(tmp_path))
    assert len(logged) == 2 and logged[0].startswith("--resume with SOLVER.WARMUP_ITERS 1 -> 10: at the resumed iteration "
                                                     "2 the learning rate becomes ")
    assert logged[0].endswith("Resume with the run's SOLVER.WARMUP_ITERS (its config.yaml) to keep its schedule.")
    assert logged[1].startswith("--resume with SOLVER.MAX_ITER 4 -> 8, SOLVER.WARMUP_ITERS 1 -> 10: ")
    assert logged[1].endswith("Resume with SOLVER.MAX_ITER 4 and the run's SOLVER.WARMUP_ITERS (its config.yaml) to keep "
                              "its schedule.")


def test_a_resume_that_moves_a_cosine_schedule_is_warned_of(tmp_path):
    # the LazyConfig twin warned; a yacs WarmupCosineLR run resumed at its end with a larger SOLVER.MAX_ITER
    # jumped from the end rate back to half the base rate without a word
    from gwdet.engine.output_dir import record_config_checksum
    from gwdet.engine.trainer import warn_of_a_moved_schedule
    from gwdet.model_zoo import build_config

    from conftest import DEMO_CONFIG, logged_warnings

    opts = ["SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR", "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "()"]
    run = build_config(str(DEMO_CONFIG), [*opts, "SOLVER.MAX_ITER", "4"])
    (tmp_path / "config.yaml").write_text(run.dump())
    record_config_checksum(str(tmp_path))
    torch.save({"model": {}, "iteration": 3}, tmp_path / "model_0000003.pth")
    (tmp_path / "last_checkpoint").write_text("model_0000003.pth")
    with logged_warnings("gwdet.engine.output_dir") as logged:
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.MAX_ITER", "4"]), str(tmp_path))
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.MAX_ITER", "8"]), str(tmp_path))
        torch.save({"model": {}, "iteration": 1}, tmp_path / "model_0000001.pth")  # resumed within the schedule
        (tmp_path / "last_checkpoint").write_text("model_0000001.pth")
        warn_of_a_moved_schedule(build_config(str(DEMO_CONFIG), [*opts, "SOLVER.MAX_ITER", "8"]), str(tmp_path))
    assert logged == [
        "--resume with SOLVER.MAX_ITER 4 -> 8: WarmupCosineLR is in fractions of SOLVER.MAX_ITER, so at the resumed "
        "iteration 4 the learning rate becomes 0.5 x SOLVER.BASE_LR, where the run had 0 x. The run had finished its "
        "schedule; to go on from where it ended, use WarmupMultiStepLR, whose SOLVER.STEPS are iterations.",
        "--resume with SOLVER.MAX_ITER 4 -> 8: WarmupCosineLR is in fractions of SOLVER.MAX_ITER, so at the resumed "
        "iteration 2 the learning rate becomes 0.853553 x SOLVER.BASE_LR, where the run had 0.5 x. Resume with "
        "SOLVER.MAX_ITER 4 to keep the schedule, or use WarmupMultiStepLR, whose SOLVER.STEPS are iterations."]


def test_precise_bn_passes_leave_the_training_random_streams_as_they_were():
    # PreciseBN at TEST.EVAL_PERIOD changed the trained weights (0.118): its batches drew from the training's streams
    from detectron2.engine.hooks import PreciseBN

    from gwdet.engine.training import precise_bn_streams_kept

    def batches():
        while True:
            yield torch.randn(4, 3, 2, 2)  # as a loader's sampling draws

    model = torch.nn.Sequential(torch.nn.BatchNorm2d(3)).train()
    torch.manual_seed(0)
    expected = torch.rand(3)
    for kept in (False, True):
        hook = PreciseBN(1, model, batches(), 2)
        if kept:
            [hook] = precise_bn_streams_kept([hook])
        model[0].reset_running_stats()
        torch.manual_seed(0)
        hook.update_stats()
        assert torch.equal(torch.rand(3), expected) is kept and model[0].running_mean.abs().sum() > 0


def test_a_resume_cannot_change_the_optimizer():
    # SGD's state loaded into AdamW: "KeyError: 'step'" at the first step, named as a config value detectron2 cannot use
    model = torch.nn.Linear(3, 2)
    optimizer_state, _ = trained_states(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    with pytest.raises(GwdetError, match=r"--resume: the run's optimizer state is another optimizer's than this "
                                         r"config's AdamW \(it has no 'step'\), and a resume cannot change the "
                                         r"optimizer"):
        with configured_optimizer_values(optimizer, None, "the grouping settings", "train.init_checkpoint"):
            optimizer.load_state_dict(optimizer_state)


def test_precise_bn_passes_after_a_resume_average_the_batches_of_an_uninterrupted_run():
    # PreciseBN's loader restarted its stream in a resumed process: the last pass averaged other batches (running
    # statistics up to 12.8 apart), though the trained weights were bit-identical
    from detectron2.data.samplers import TrainingSampler
    from detectron2.engine.hooks import PreciseBN

    from gwdet.data.resumable import resumable_train_loader
    from gwdet.engine.training import continue_precise_bn

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)

        def forward(self, batch):
            return self.norm(torch.stack(batch))

    def hook(model):
        images = [{"x": torch.randn(3) * (i + 1)} for i in range(40)]  # one value per image, every image another
        loader = resumable_train_loader(dict(dataset=images, mapper=lambda record: record["x"], total_batch_size=2,
                                             aspect_ratio_grouping=False, num_workers=0,
                                             sampler=TrainingSampler(len(images), seed=3)), seed=3)
        return PreciseBN(2, model, loader, 3)  # every 2 iterations, 3 batches

    torch.manual_seed(0)
    model = Model().train()
    uninterrupted = hook(model)
    means = []
    for _ in range(3):  # the passes after iterations 2, 4 and 6
        uninterrupted.update_stats()
        means.append(model.norm.running_mean.clone())
    torch.manual_seed(0)
    resumed = hook(Model().train())  # a process resumed at iteration 4, whose next pass is after iteration 6
    continue_precise_bn([resumed], start_iter=4, images_per_process=2)
    resumed.update_stats()
    assert torch.equal(resumed._model.norm.running_mean, means[2])
    assert not torch.equal(means[0], means[2])  # the passes average other batches: the check can fail


def test_a_batch_larger_than_the_training_set_is_warned_of():
    # a batch-sweep cell of 8 images per batch on 4 training images: every batch held each image twice, no word
    from detectron2.data.samplers import TrainingSampler

    from gwdet.data.resumable import resumable_train_loader

    from conftest import logged_warnings

    for batch, warned_of in ((8, True), (4, False)):
        images = [{"x": torch.randn(3)} for _ in range(4)]
        with logged_warnings("gwdet.data.resumable") as warned:
            resumable_train_loader(dict(dataset=images, mapper=lambda record: record["x"], total_batch_size=batch,
                                        aspect_ratio_grouping=False, num_workers=0,
                                        sampler=TrainingSampler(len(images), seed=3)), seed=3)
        assert any(line.startswith(f"Each process trains on batches of {batch} images, more than the 4 training "
                                   "images: every batch holds images twice or more") for line in warned) == warned_of


def test_a_checkpointer_that_loads_an_optimizer_state_names_the_group_values_it_replaced(tmp_path):
    # ResilientCheckpointer(model, optimizer=...).resume_or_load / load put the checkpoint's weight decay and rate over
    # the optimizer's without a word
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    from conftest import logged_warnings

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    saved = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}], lr=0.01,
                            momentum=0.9, weight_decay=1e-4)
    ResilientCheckpointer(model, save_dir=str(tmp_path), optimizer=saved).save("model_0000003", iteration=3)
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.3}], lr=0.05,
                                momentum=0.9, weight_decay=1e-4)
    with logged_warnings("gwdet.checkpoint") as logged:
        ResilientCheckpointer(model, save_dir=str(tmp_path), optimizer=optimizer).resume_or_load("", resume=True)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [1e-4, 0.0]  # torch's semantics kept
    assert [group["lr"] for group in optimizer.param_groups] == [0.01, 0.01]
    assert len(logged) == 1 and logged[0].startswith(
        f"ResilientCheckpointer.load: the 'optimizer' state of {tmp_path / 'model_0000003.pth'} replaced the "
        "optimizer's parameter-group values by the checkpoint's, as torch's Optimizer.load_state_dict loads an "
        "optimizer state: lr of 2 parameter group(s) 0.05 -> 0.01, weight_decay of 1 parameter group(s) 0.3 -> 0.0. ")
    assert "set them on optimizer.param_groups after the load" in logged[0]
    assert "resume with gwdet's Trainer / tools/train_net.py" in logged[0]
    # the same values, or a checkpointer told that its caller sets them again, load without a word
    with logged_warnings("gwdet.checkpoint") as logged:
        ResilientCheckpointer(model, optimizer=optimizer).load(str(tmp_path / "model_0000003.pth"))
        optimizer.param_groups[1]["weight_decay"] = 0.3
        ResilientCheckpointer(model, optimizer=optimizer, compare_optimizer_values=False).load(
            str(tmp_path / "model_0000003.pth"))
    assert logged == []
    assert optimizer.param_groups[1]["weight_decay"] == 0.0


def test_a_checkpointer_loading_an_optimizer_under_a_scheduler_names_the_rate_as_the_schedulers(tmp_path):
    # the rate a scheduler had set was replaced without a word; the warning says whose rate it is
    from gwdet.checkpoint.resilient import ResilientCheckpointer

    from conftest import logged_warnings

    model = torch.nn.Linear(3, 2)
    optimizer_state, scheduler_state = trained_states(model)
    optimizer, scheduler = optimizer_and_scheduler(model, 0.02, 1e-4, 0.9)
    path = tmp_path / "model_0000006.pth"
    torch.save({"model": model.state_dict(), "optimizer": optimizer_state, "scheduler": scheduler_state}, path)
    with logged_warnings("gwdet.checkpoint") as logged:
        ResilientCheckpointer(model, optimizer=optimizer, scheduler=scheduler).load(path)
    assert len(logged) == 1 and ": lr of 1 parameter group(s) 0.01 -> 0.002 (lr: the rate the run's LR scheduler had " \
        "set when the checkpoint was saved; the scheduler sets the next ones from its base_lrs). " in logged[0]
    assert "initial_lr" not in logged[0] and "momentum of" not in logged[0]
