"""The training callbacks of the CPU demo: the weights' exponential moving average and the training-time
budget that leaves validation out."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from detr.lightning.callbacks import ExponentialMovingAverage, TrainingSpeed


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


def test_ema_decay_is_checked() -> None:
    with pytest.raises(ValueError, match="decay"):
        ExponentialMovingAverage(decay=1.0)


class _Clock:
    """A simulated clock for TrainingSpeed: the model advances it, so budgets are exact, not timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _TimedModel(BoringModel):
    """Training steps take 1 s and validation steps 10 s of the simulated clock; the learning rate of
    every step is recorded. Optional warm-up (LinearLR, chainable, per step) before the budget's decay."""

    def __init__(self, clock: _Clock, warmup_steps: int = 0) -> None:
        super().__init__()
        self.clock, self.warmup_steps, self.lrs = clock, warmup_steps, []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.clock.now += 1.0
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.clock.now += 10.0
        return super().validation_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.warmup_steps:
            return optimizer
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=self.warmup_steps)
        return [optimizer], [{"scheduler": warmup, "interval": "step"}]


def _timed_fit(tmp_path, speed: TrainingSpeed, warmup_steps: int = 0) -> tuple[L.Trainer, _TimedModel]:
    clock = _Clock()
    speed._clock = clock
    model = _TimedModel(clock, warmup_steps)
    trainer = _trainer(tmp_path, [speed], max_steps=1000, val_check_interval=4, limit_val_batches=1,
                       num_sanity_val_steps=0, enable_checkpointing=False)
    trainer.fit(model)
    return trainer, model


def test_training_budget_stops_fit_and_does_not_count_validation(tmp_path) -> None:
    speed = TrainingSpeed(max_train_seconds=20)
    trainer, _ = _timed_fit(tmp_path, speed)
    # 20 training steps of 1 s; had the validations (10 s after every 4 steps) counted, fit would have
    # stopped after 8
    assert trainer.global_step == 20
    assert speed.train_seconds == 20


def test_learning_rate_decays_linearly_to_zero_over_the_budgets_end(tmp_path) -> None:
    speed = TrainingSpeed(max_train_seconds=20, lr_decay_fraction=0.5)
    _, model = _timed_fit(tmp_path, speed)
    # step i starts after i seconds of training: factor min(1, (20 - i) / 10); validation time not counted
    expected = [0.1 * min(1.0, (20 - i) / 10) for i in range(20)]
    assert model.lrs == pytest.approx(expected)


def test_learning_rate_decay_multiplies_the_schedulers_learning_rate(tmp_path) -> None:
    speed = TrainingSpeed(max_train_seconds=12, lr_decay_fraction=0.75)  # decay from the 3rd second on
    _, model = _timed_fit(tmp_path, speed, warmup_steps=6)
    warmup = [0.5 + 0.5 * min(i, 6) / 6 for i in range(12)]  # LinearLR 0.5 → 1 over 6 steps
    decay = [min(1.0, (12 - i) / 9) for i in range(12)]
    assert model.lrs == pytest.approx([0.1 * w * d for w, d in zip(warmup, decay)])


def test_training_budget_and_decay_are_saved_and_resumed(tmp_path) -> None:
    speed = TrainingSpeed(max_train_seconds=20, lr_decay_fraction=0.5)
    speed.on_train_epoch_start(None, None)  # a clock running since the epoch started
    speed._clock = lambda: speed._since + 15.0
    speed.lr_factor = 0.5
    resumed = TrainingSpeed(max_train_seconds=20, lr_decay_fraction=0.5)
    resumed.load_state_dict(speed.state_dict())
    assert (resumed.train_seconds, resumed.lr_factor) == (15.0, 0.5)


def test_training_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_train_seconds"):
        TrainingSpeed(max_train_seconds=0)
    with pytest.raises(ValueError, match="needs max_train_seconds"):
        TrainingSpeed(lr_decay_fraction=0.2)
    with pytest.raises(ValueError, match="lr_decay_fraction"):
        TrainingSpeed(max_train_seconds=10, lr_decay_fraction=1.5)
