"""The training callbacks of the CPU demo and the step-based learning-rate schedule: the weights' exponential
moving average, throughput, and the training-time budget that leaves validation out and fixes the run's step
count, on which the learning-rate decay depends alone; and the validation images with their boxes drawn."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from PIL import Image

from detr.categories import CategoryMap
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from detr.lightning import DetrSystem
from detr.lightning.callbacks import (
    DrawValidationPredictions,
    ExponentialMovingAverage,
    TimeBudget,
    TrainingThroughput,
    time_budget_of,
)
from detr.lightning.callbacks.validation_images import draw_batch_item
from detr.lightning.schedule import LinearDecayToZero, decay_factor
from detr.models.recipe import OptimizerRecipe
from detr.visualize.drawing import LEGEND_PREDICTED, LEGEND_TRUE


class _Recorder(L.Callback):
    """The weights after every optimizer step."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.weights.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


def _trainer(tmp_path, callbacks, **kwargs) -> L.Trainer:
    return L.Trainer(default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=callbacks, **kwargs)


def test_ema_checkpoint_holds_the_average_of_the_trajectory(tmp_path) -> None:
    torch.manual_seed(0)
    recorder, ema = _Recorder(), ExponentialMovingAverage(decay=0.8, start_step=2)
    saver = ModelCheckpoint(dirpath=tmp_path, filename="step7", every_n_train_steps=7)  # saved during fit
    trainer = _trainer(tmp_path, [recorder, ema, saver], max_steps=7, limit_val_batches=0)
    trainer.fit(BoringModel())
    # by hand: the first update (after step index 2) copies, each later one is avg ← 0.8 avg + 0.2 current
    expected = dict(recorder.weights[2])
    for weights in recorder.weights[3:]:
        expected = {k: 0.8 * expected[k] + 0.2 * weights[k] for k in expected}
    checkpoint = torch.load(tmp_path / "step7.ckpt", weights_only=False)
    for name, value in expected.items():
        torch.testing.assert_close(checkpoint["state_dict"][name], value)  # what inference loads: the average
        torch.testing.assert_close(checkpoint["current_model_state"][name], recorder.weights[-1][name])
    # after fit the module itself holds the average (Lightning's WeightAveraging copies it in)
    torch.testing.assert_close(trainer.lightning_module.state_dict()["layer.weight"], expected["layer.weight"])


def test_ema_warmup_follows_the_early_weights(tmp_path) -> None:
    torch.manual_seed(0)
    recorder, ema = _Recorder(), ExponentialMovingAverage(decay=0.9, warmup_steps=3)
    trainer = _trainer(tmp_path, [recorder, ema], max_steps=5, limit_val_batches=0)
    trainer.fit(BoringModel())
    # by hand: the first update copies, update n (1, 2, ...) then decays by 0.9 · (1 − exp(−n / 3))
    expected = dict(recorder.weights[0])
    for update, weights in enumerate(recorder.weights[1:], start=1):
        decay = 0.9 * (1 - math.exp(-update / 3))
        expected = {k: decay * expected[k] + (1 - decay) * weights[k] for k in expected}
    torch.testing.assert_close(trainer.lightning_module.state_dict()["layer.weight"], expected["layer.weight"])


def test_ema_decay_is_checked() -> None:
    with pytest.raises(ValueError, match="decay"):
        ExponentialMovingAverage(decay=1.0)


class _Clock:
    """A simulated clock for the budget: the model advances it, so budgets are exact, not timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _TimedModel(BoringModel):
    """Training steps take ``step_seconds`` and validation steps 10 s of the simulated clock; the learning
    rate of every step is recorded. SGD at lr 0.1 with the training system's per-step schedulers: an
    optional LinearLR warm-up and :class:`LinearDecayToZero` over the last ``decay_fraction`` of the run."""

    def __init__(self, clock: _Clock, *, warmup_steps: int = 0, decay_fraction: float = 0.0,
                 step_seconds: float = 1.0) -> None:
        super().__init__()
        self.clock, self.step_seconds = clock, step_seconds
        self.warmup_steps, self.decay_fraction = warmup_steps, decay_fraction
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.clock.now += self.step_seconds
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.clock.now += 10.0
        return super().validation_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedulers = []
        if self.warmup_steps:
            warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=self.warmup_steps)
            schedulers.append({"scheduler": warmup, "interval": "step"})
        if self.decay_fraction:
            max_steps = self.trainer.max_steps
            decay = LinearDecayToZero(optimizer, self.decay_fraction, total_steps=max_steps if max_steps > 0 else None)
            schedulers.append({"scheduler": decay, "interval": "step"})
        return [optimizer], schedulers


def _timed_fit(tmp_path, budget: TimeBudget | None, *, max_steps: int = -1, callbacks=(), ckpt_path=None,
               **model_options) -> tuple[L.Trainer, _TimedModel]:
    clock = _Clock()
    if budget is not None:
        budget.clock.now = clock
    model = _TimedModel(clock, **model_options)
    trainer = _trainer(tmp_path, [c for c in (budget, *callbacks) if c is not None], max_steps=max_steps,
                       max_epochs=-1, val_check_interval=4, limit_val_batches=1, num_sanity_val_steps=0,
                       enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks))
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def test_decay_factor_is_one_then_linear_to_zero() -> None:
    assert [decay_factor(step, 10, 0.4) for step in range(12)] == pytest.approx(
        [1, 1, 1, 1, 1, 1, 1.0, 0.75, 0.5, 0.25, 0, 0])
    assert decay_factor(5, None, 0.4) == 1.0  # no decay while the run's length is unknown


def test_schedule_per_step_warmup_plateau_decay_and_step_decay() -> None:
    """DetrSystem's schedulers, stepped as Lightning steps them: the learning rate is a function of the step
    (and the epoch): warm-up from 1/1000, a plateau, a linear decay to zero, times the epoch step decay."""
    system = DetrSystem(optimizer=OptimizerRecipe(lr=1e-4, lr_backbone=1e-5, warmup_steps=4, lr_decay_fraction=0.5,
                                                 lr_drop_epochs=[1]))
    (optimizer,), configs = system.configure_optimizers()
    assert [(c["name"], c["interval"]) for c in configs] == [("step_decay", "epoch"), ("warmup", "step"),
                                                             ("decay", "step")]
    step_decay, warmup, decay = (c["scheduler"] for c in configs)
    decay.set_total_steps(12)  # what the trainer's max_steps or TimeBudget gives
    lrs = []
    for step in range(12):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        warmup.step()
        decay.step()
        if step == 5:  # an epoch of 6 steps ends: the step decay's milestone is epoch 1
            step_decay.step()
    warm = [1e-3 + (1 - 1e-3) * min(step, 4) / 4 for step in range(12)]
    expected = [1e-4 * w * min(1.0, (12 - step) / 6) * (0.1 if step >= 6 else 1.0) for step, w in enumerate(warm)]
    assert lrs == pytest.approx(expected, rel=1e-6)
    assert lrs[0] == pytest.approx(1e-7) and lrs[4] == lrs[5] == pytest.approx(1e-4)  # warm-up, then the plateau
    optimizer.step()
    decay.step()
    assert optimizer.param_groups[0]["lr"] == 0.0 and optimizer.param_groups[1]["lr"] == 0.0  # the end: zero


def test_decay_without_a_run_length_is_an_error(tmp_path) -> None:
    system = DetrSystem(optimizer=OptimizerRecipe(lr_decay_fraction=0.3))
    trainer = _trainer(tmp_path, [], max_epochs=-1)
    system.trainer = trainer
    with pytest.raises(ValueError, match="TimeBudget"):
        system.configure_optimizers()


def test_budget_stops_fit_and_does_not_count_validation(tmp_path) -> None:
    budget = TimeBudget(max_train_seconds=20)
    trainer, _ = _timed_fit(tmp_path, budget)
    # 20 training steps of 1 s; had the validations (10 s after every 4 steps) counted, fit would have
    # stopped after 8. The step count was fixed halfway (10 steps in 10 s: 10 more fit).
    assert trainer.global_step == 20 and budget.total_steps == 20
    assert budget.clock.spent() == 20


def test_budget_fixes_the_step_count_once_and_the_decay_follows_steps(tmp_path) -> None:
    budget = TimeBudget(max_train_seconds=40, calibration_fraction=0.9)
    # steps of 2 s: the count is fixed when the decay starts (1 - 0.5 of the budget, before 0.9): at
    # step 10 (20 s), 10 more steps fit
    trainer, model = _timed_fit(tmp_path, budget, decay_fraction=0.5, step_seconds=2.0)
    assert budget.total_steps == 20 and trainer.global_step == 20
    assert model.lrs == pytest.approx([0.1 * min(1.0, (20 - i) / 10) for i in range(20)])


def test_two_runs_of_one_step_count_train_with_the_same_learning_rates(tmp_path) -> None:
    """The budget's run (count fixed from the simulated step rate, with a warm-up) and a run bounded by
    max_steps, on a machine twice as slow: the same learning rate at every step."""
    budgeted, by_budget = _timed_fit(tmp_path / "a", TimeBudget(max_train_seconds=20), decay_fraction=0.5,
                                     warmup_steps=6)
    by_steps = _timed_fit(tmp_path / "b", None, max_steps=20, decay_fraction=0.5, warmup_steps=6,
                          step_seconds=2.0)[1]
    assert budgeted.global_step == 20 and len(by_steps.lrs) == 20
    assert by_budget.lrs == by_steps.lrs
    warmup = [0.5 + 0.5 * min(i, 6) / 6 for i in range(20)]
    assert by_steps.lrs == pytest.approx([0.1 * w * min(1.0, (20 - i) / 10) for i, w in enumerate(warmup)])


def test_an_explicit_max_steps_is_honoured_over_the_budget(tmp_path) -> None:
    """The demo config's budget stopped a --trainer.max_steps 500 run at step 330: the
    trainer's max_steps is the user's word, the clock does not cut it short."""
    budget = TimeBudget(max_train_seconds=8, time_tolerance=0.0)
    trainer, model = _timed_fit(tmp_path / "exact", budget, max_steps=20, decay_fraction=0.5)
    assert budget.total_steps == 20  # from max_steps: nothing to estimate
    assert trainer.global_step == 20  # 20 s of training on the simulated clock, past the 8 s budget
    assert len(model.lrs) == 20 and model.lrs[:10] == pytest.approx([0.1] * 10)
    assert model.lrs[-1] == pytest.approx(0.1 / 10)  # the decay over the last 10 of the 20 steps


def test_the_budget_stops_on_time_once_its_step_count_is_fixed(tmp_path) -> None:
    """Without max_steps the fixed count ends the run; the time limit (with its tolerance) stays a safety."""
    trainer, _ = _timed_fit(tmp_path / "tolerant", TimeBudget(max_train_seconds=8, time_tolerance=0.0),
                            decay_fraction=0.5)
    assert trainer.global_step <= 9


def test_resumed_run_continues_the_budget_and_its_step_count(tmp_path) -> None:
    _, whole = _timed_fit(tmp_path / "whole", TimeBudget(max_train_seconds=20), decay_fraction=0.5)

    class StopAt(L.Callback):  # an interrupted run: it stops after 14 steps, a checkpoint was saved at 12
        def on_train_batch_end(self, trainer, *args) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step >= 14

    saver = ModelCheckpoint(dirpath=tmp_path, filename="step12", every_n_train_steps=12, save_top_k=-1)
    first = TimeBudget(max_train_seconds=20)
    _timed_fit(tmp_path / "first", first, decay_fraction=0.5, callbacks=[StopAt(), saver])
    assert first.total_steps == 20
    resumed = TimeBudget(max_train_seconds=20)
    trainer, model = _timed_fit(tmp_path / "resumed", resumed, decay_fraction=0.5, ckpt_path=tmp_path / "step12.ckpt")
    assert resumed.total_steps == 20 and trainer.global_step == 20
    assert resumed.clock.spent() == pytest.approx(20)  # 12 s before the checkpoint, 8 after
    assert model.lrs == pytest.approx(whole.lrs[12:])


def test_a_finished_budget_run_resumed_with_more_steps_keeps_learning(tmp_path) -> None:
    """A resume of a finished 20 s run with --trainer.max_steps 30 trained exactly one step, the budget being
    spent; docs/guides/train-on-your-data.md says a resume with a larger max_steps keeps learning."""
    saver = ModelCheckpoint(dirpath=tmp_path, filename="end", save_last=False, every_n_train_steps=20, save_top_k=-1)
    first = TimeBudget(max_train_seconds=20)
    trainer, _ = _timed_fit(tmp_path / "first", first, decay_fraction=0.5, callbacks=[saver])
    assert trainer.global_step == 20 and first.total_steps == 20
    resumed = TimeBudget(max_train_seconds=20)
    trainer, model = _timed_fit(tmp_path / "resumed", resumed, max_steps=30, decay_fraction=0.5,
                                ckpt_path=tmp_path / "end.ckpt")
    assert trainer.global_step == 30 and len(model.lrs) == 10


def test_throughput_logs_images_per_second_and_training_seconds(tmp_path) -> None:
    throughput = TrainingThroughput()
    clock = _Clock()
    throughput.clock.now = clock
    trainer = _trainer(tmp_path, [throughput], max_epochs=2, limit_train_batches=5, limit_val_batches=1,
                       num_sanity_val_steps=0, enable_checkpointing=False)
    trainer.fit(_TimedModel(clock))
    metrics = trainer.callback_metrics
    # images = batch[0].shape[0]: a detection batch's images; BoringModel's batch is a [2, 32] tensor, so 32
    # "images" a step; 5 steps of 1 s an epoch, validation (10 s) not counted
    assert metrics["time/train_images_per_second"] == pytest.approx(32.0)
    assert metrics["time/train_seconds"] == pytest.approx(10.0)


def test_time_budget_of_finds_the_budget_among_the_callbacks() -> None:
    budget = TimeBudget(max_train_seconds=20)
    assert time_budget_of([TrainingThroughput(), budget]) is budget
    assert time_budget_of([TrainingThroughput()]) is None


def test_budget_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_train_seconds"):
        TimeBudget(max_train_seconds=0)
    with pytest.raises(ValueError, match="calibration_fraction"):
        TimeBudget(max_train_seconds=10, calibration_fraction=0)
    with pytest.raises(ValueError, match="time_tolerance"):
        TimeBudget(max_train_seconds=10, time_tolerance=-0.1)
    with pytest.raises(ValueError, match="decay_fraction"):
        LinearDecayToZero(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), decay_fraction=1.5)


def _validation_batch() -> tuple[torch.Tensor, list[dict], list[dict]]:
    """One gray 40 x 60 image (padded to 48 x 64) from an 80 x 120 original, one true box, two detections."""
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    images = torch.zeros(1, 3, 48, 64)
    images[0, :, :40, :60] = (torch.full((3, 40, 60), 128 / 255) - mean) / std
    target = {"image_id": torch.tensor(7), "size": torch.tensor([40, 60]), "orig_size": torch.tensor([80, 120]),
              "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.5]]), "labels": torch.tensor([1])}  # true box: normalised cxcywh
    detection = {"scores": torch.tensor([0.9, 0.1]), "labels": torch.tensor([0, 1]),
                 "boxes": torch.tensor([[10.0, 10.0, 50.0, 50.0], [0.0, 0.0, 5.0, 5.0]])}  # original-image xyxy
    return images, [target], [detection]


def test_validation_drawing_shows_true_and_predicted_boxes_and_a_legend() -> None:
    """The drawing is the unpadded image the model saw, with a legend band below it: which colour is the
    ground truth and which the predictions above which score (validation drawings had none)."""
    images, targets, detections = _validation_batch()
    drawn = draw_batch_item(images, 0, targets[0], detections[0], score_threshold=0.5, category_map=None)
    assert drawn.dtype == torch.uint8 and drawn.shape[0] == 3 and drawn.shape[2] == 60 and drawn.shape[1] > 40
    band = drawn[:, 40:].permute(1, 2, 0).reshape(-1, 3).tolist()
    assert list(LEGEND_TRUE) in band and list(LEGEND_PREDICTED) in band
    assert drawn[:, 20, 44].tolist() == [0, 255, 0]  # true box (15, 10, 45, 30): green, right edge
    assert drawn[:, 22, 5].tolist() == [255, 0, 0]  # detection (5, 5, 25, 25) at half the original size: red
    assert drawn[:, 2, 2].tolist() == [128, 128, 128]  # the detection below the threshold is not drawn
    enlarged = draw_batch_item(images, 0, targets[0], detections[0], score_threshold=0.5, category_map=None,
                               min_size=80)
    assert enlarged.shape[2] == 120 and enlarged.shape[1] > 80


def test_draw_validation_predictions_writes_the_first_images(tmp_path) -> None:
    images, targets, detections = _validation_batch()
    callback = DrawValidationPredictions(num_images=1, output_dir=str(tmp_path / "val"))
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, loggers=[], global_step=3, log_dir=None)
    system = SimpleNamespace(category_map=CategoryMap((1, 2), ("cat", "dog")))
    callback.on_validation_epoch_start(trainer, system)
    for batch_idx in range(2):  # the second batch is beyond num_images
        callback.on_validation_batch_end(trainer, system, {"detections": detections}, (images, None, targets),
                                         batch_idx)
    callback.on_validation_epoch_end(trainer, system)
    assert sorted(path.name for path in (tmp_path / "val").iterdir()) == ["7.png"]
    with Image.open(tmp_path / "val" / "7.png") as png:
        # enlarged to a short side of min_size (384) so that labels stay readable, the legend below
        assert png.size[0] == 576 and png.size[1] > 384
