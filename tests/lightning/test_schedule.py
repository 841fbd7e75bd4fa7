"""DEIM's FlatCosine learning-rate schedule: the factor against the authors' formula (Intellindust/DEIM
``engine/optim/lr_scheduler.py`` ``flat_cosine_schedule``) at hand-computed points, the rates a Trainer sets at
each step of a tiny run, its settings' checks and a resume that changes them."""

from __future__ import annotations

import math
import shutil

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions
from detr.lightning.schedule import FlatCosine, fit_saved_schedulers, flat_cosine_factor, learning_rate_schedulers
from detr.lightning.system import SettingError
from detr.models.recipe import OptimizerRecipe
from tests.helpers import InMemoryData, tiny_config_with

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_factor_is_the_authors_formula_over_the_initial_rate() -> None:
    """DEIM-D-FINE S with 100 iterations an epoch: flat_iter 64 · 100, total 132 · 100, no_aug 12 · 100, so the
    cosine runs from step 6400 to 12000; lr_gamma 0.5."""
    def factor(step: int) -> float:
        return flat_cosine_factor(step, 6400, 12000, 0.5)

    assert factor(0) == factor(6400) == 1.0
    assert factor(6400 + 1400) == pytest.approx(0.5 + 0.25 * (1 + math.sqrt(0.5)))  # a quarter in: cos(π/4)
    assert factor(9200) == pytest.approx(0.75)  # halfway
    assert factor(12000) == factor(13199) == 0.5  # the no-augmentation epochs at lr_gamma × lr


class _RecordRates(L.Callback):
    def __init__(self) -> None:
        self.rates: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rates.append([group["lr"] for group in trainer.optimizers[0].param_groups])


def _samples(count: int = 6, size: int = 48) -> list[tuple[torch.Tensor, dict]]:
    generator = torch.Generator().manual_seed(0)
    target = {"boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]]), "labels": torch.tensor([1]),
              "orig_size": torch.tensor([size, size]), "size": torch.tensor([size, size])}
    return [(torch.randn(3, size, size, generator=generator), {**target, "image_id": torch.tensor(index + 1)})
            for index in range(count)]


def _fit(tmp_path, max_epochs: int, ckpt_path: str | None = None, **options) -> list[list[float]]:
    """The rates of each step of a tiny run (6 images in batches of 2: 3 steps an epoch), last.ckpt kept."""
    system = DetrSystem(detr=tiny_config_with(num_classes=3, backbone_last_stage="layer3"),
                        optimizer=OptimizerRecipe(lr=1e-3, lr_backbone=1e-4, lr_drop_epochs=[], **options),
                        evaluation=EvaluationOptions(evaluation_dir=""))
    record = _RecordRates()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, limit_val_batches=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[record, ModelCheckpoint(dirpath=tmp_path, save_last=True)],
                        default_root_dir=tmp_path)
    trainer.fit(system, datamodule=InMemoryData(_samples()), ckpt_path=ckpt_path)
    return record.rates


def test_a_trainer_sets_the_flat_cosine_rates_step_by_step(tmp_path) -> None:
    """3 steps an epoch, so [1, 3] is flat to step 3 and a cosine to half the rates at step 9; both parameter
    groups (lr, lr_backbone) follow it; a run resumed at epoch 2 continues the same rates."""
    rates = _fit(tmp_path / "full", 4, lr_flat_cosine_epochs=[1, 3])
    cosine = [0.5 + 0.25 * (1 + math.cos(math.pi * k / 6)) for k in range(1, 6)]  # steps 4 … 8
    expected = [1.0] * 4 + cosine + [0.5] * 3
    assert len(rates) == 12
    assert [main for main, _ in rates] == pytest.approx([1e-3 * f for f in expected], rel=1e-6)
    assert [backbone for _, backbone in rates] == pytest.approx([1e-4 * f for f in expected], rel=1e-6)
    first = _fit(tmp_path / "part", 2, lr_flat_cosine_epochs=[1, 3])
    epoch_2 = tmp_path / "epoch_2.ckpt"
    shutil.copy(tmp_path / "part" / "last.ckpt", epoch_2)
    resumed = _fit(tmp_path / "part", 4, str(epoch_2), lr_flat_cosine_epochs=[1, 3])
    assert len(first) == 6 and len(resumed) == 6
    assert [rate for step in first + resumed for rate in step] == pytest.approx(
        [rate for step in rates for rate in step], rel=1e-6)
    # resumed with another end (epoch 2: step 6, reached): this run's schedule from the step reached on
    shorter = _fit(tmp_path / "other", 4, str(epoch_2), lr_flat_cosine_epochs=[1, 2])
    assert [main for main, _ in shorter] == pytest.approx([0.5e-3] * 6, rel=1e-6)


def test_it_chains_after_the_warm_up() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    configs = learning_rate_schedulers(optimizer, lr_drop_epochs=[], lr_drop_gamma=0.1, warmup_steps=2,
                                       flat_cosine_epochs=[1, 2], steps_per_epoch=2)
    assert [c["name"] for c in configs] == ["step_decay", "warmup", "flat_cosine"]
    rates = []
    for _ in range(5):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        for config in configs[1:]:
            config["scheduler"].step()
    assert rates == pytest.approx([1e-3, 0.5005, 1.0, 0.75, 0.5])


@pytest.mark.parametrize("options, message", [
    ({"lr_flat_cosine_epochs": [64]}, "lr_flat_cosine_epochs"),
    ({"lr_flat_cosine_epochs": [120, 64]}, "lr_flat_cosine_epochs"),
    ({"lr_flat_cosine_gamma": 1.5}, "lr_flat_cosine_gamma"),
])
def test_settings_are_checked_in_one_line(options, message) -> None:
    with pytest.raises(SettingError, match=message) as raised:
        DetrSystem(optimizer=OptimizerRecipe(**options))
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="FlatCosine"):
        FlatCosine(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 3, 3, 10)


def test_a_resume_keeps_an_unchanged_flat_cosine_and_rebuilds_a_changed_one() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    saved = [c["scheduler"].state_dict() for c in learning_rate_schedulers(
        optimizer, lr_drop_epochs=[], lr_drop_gamma=0.1, flat_cosine_epochs=[64, 120], steps_per_epoch=10)]
    same = {"lr_drop_epochs": [], "lr_drop_gamma": 0.1, "warmup_steps": 0, "decay_fraction": 0.0,
            "global_step": 700}
    states, changes = fit_saved_schedulers(saved, **same, flat_cosine_epochs=[64, 120])
    assert states is saved and changes == []
    states, changes = fit_saved_schedulers(saved, **same, flat_cosine_epochs=[50, 120])
    assert changes == ["lr_flat_cosine_epochs [64, 120] (checkpoint) -> [50, 120]"]
    assert states[1] == {"last_epoch": 700, "_step_count": 701}  # the progress only: this run's settings
    states, changes = fit_saved_schedulers(saved, **same)
    assert changes == ["lr_flat_cosine_epochs [64, 120] (checkpoint) -> None"]
    assert len(states) == 1


@pytest.mark.parametrize("max_epochs", [2, 4])
def test_a_warm_up_given_as_a_share_of_the_run_ends_inside_it(tmp_path, max_epochs) -> None:
    """warmup_fraction 0.5 of a 6- or 12-step run (3 steps an epoch) warms up over 3 or 6 steps and then trains at
    the full rate: a short run is never all warm-up, whatever its length (2,000 fixed steps would be)."""
    rates = _fit(tmp_path, max_epochs, warmup_steps=2000, warmup_fraction=0.5)
    warmup = 3 * max_epochs // 2
    assert len(rates) == 3 * max_epochs
    assert rates[0][0] == pytest.approx(1e-6) and all(main < 1e-3 for main, _ in rates[:warmup])
    assert [main for main, _ in rates[warmup:]] == pytest.approx([1e-3] * (len(rates) - warmup), rel=1e-6)


def test_a_warm_up_share_needs_a_run_length(tmp_path) -> None:
    system = DetrSystem(detr=tiny_config_with(num_classes=3, backbone_last_stage="layer3"),
                        optimizer=OptimizerRecipe(warmup_fraction=0.1), evaluation=EvaluationOptions(evaluation_dir=""))
    system.trainer = L.Trainer(accelerator="cpu", max_epochs=-1, logger=False, enable_progress_bar=False,
                               default_root_dir=tmp_path)
    with pytest.raises(SettingError, match="--model.optimizer.warmup_fraction=0.1 is a share of the run's steps"):
        system.warmup_steps()
