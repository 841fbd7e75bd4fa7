"""The training callbacks of the CPU demo: the weights' exponential moving average and the training-time
budget that leaves validation out."""

from __future__ import annotations

import time

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


class _SlowModel(BoringModel):
    """Training steps of 20 ms, validation steps of 200 ms."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        time.sleep(0.2)
        return super().validation_step(batch, batch_idx)


def test_training_budget_stops_fit_and_does_not_count_validation(tmp_path) -> None:
    speed = TrainingSpeed(max_train_seconds=0.4)
    trainer = _trainer(tmp_path, [speed], max_steps=1000, val_check_interval=4, limit_val_batches=1,
                       num_sanity_val_steps=0, enable_checkpointing=False)
    trainer.fit(_SlowModel())
    # ~20 steps fit in 0.4 s of training; had the validations (0.2 s after every 4 steps) counted, fit
    # would have stopped after 8 or fewer
    assert 12 <= trainer.global_step < 1000
    assert 0.4 <= speed.train_seconds < 1.5


def test_training_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_train_seconds"):
        TrainingSpeed(max_train_seconds=0)
