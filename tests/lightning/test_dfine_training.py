"""D-FINE through `detr fit`: configs/dfine_shapes_cpu.yaml with a tiny model trains (the loss falls on a few
images), logs the FGL and DDF terms of the selected and the denoising queries, and its checkpoint loads with
detr.load_checkpoint and predicts under the family's input contract."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from detr import Predictor, load_checkpoint
from detr.lightning.cli import main
from tests.helpers import tiny_square_fit_args, write_tiny_shapes

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "dfine_shapes_cpu.yaml"
TINY_DFINE = ["--model.detr.hidden_dim=32", "--model.detr.num_heads=2", "--model.detr.num_decoder_layers=2",
              "--model.detr.dim_feedforward=64", "--model.detr.num_queries=10",
              "--model.detr.num_points_per_level=[2, 2, 2]"]

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=3)


def test_fit_trains_and_the_checkpoint_predicts(tiny_shapes: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    main(tiny_square_fit_args(CONFIG, TINY_DFINE, tiny_shapes, run, "--trainer.max_steps=30",
                              "--trainer.check_val_every_n_epoch=30", "--model.optimizer.warmup_steps=0",
                              "--model.optimizer.lr_decay_fraction=0", "--model.optimizer.lr=1e-3",
                              "--model.optimizer.lr_backbone=1e-3"))
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 30
    assert sum(losses[-5:]) < sum(losses[:5])  # the same 4 images (flipped or not) 30 times: it learns them
    for name in ("train/loss_fgl", "train/loss_fgl_0", "train/loss_ddf_0", "train/loss_fgl_dn", "train/loss_ddf_dn_0",
                 "train/loss_ce_pre", "train/loss_ce_dn", "train/loss_ce_enc"):
        values = [float(row[name]) for row in rows if row.get(name)]
        # DDF starts at 0: the box heads start at zero, so every layer's distributions are the last one's
        assert len(values) == 30 and all(value >= 0 for value in values) and values[-1] > 0, name

    model = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert model.config.family == "dfine" and model.config.denoising
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean) == ("square", 64, None)
    image = sorted((tiny_shapes / "val2017").iterdir())[0]
    (prediction,) = Predictor(model, threshold=0.0).predict([image])
    assert len(prediction.scores) == model.num_queries
    assert torch.isfinite(torch.as_tensor(prediction.boxes)).all()


def test_fit_with_deim_dense_one_to_one_and_a_loader_worker(tiny_shapes: Path, tmp_path: Path) -> None:
    """DEIM's recipe on the shapes config: mosaic and MixUp on every sample and batch, multi-scale batches, MAL, one
    loader worker; two steps train with finite losses."""
    run = tmp_path / "run"
    main(tiny_square_fit_args(CONFIG, TINY_DFINE, tiny_shapes, run, "--trainer.max_steps=2",
                              "--trainer.limit_val_batches=0", "--data.batch_size=2", "--data.num_workers=1",
                              "--data.persistent_workers=true", "--data.augmentation=deim",
                              "--data.mosaic_epochs=[0, 1]", "--data.mosaic_prob=1", "--data.mixup_prob=1",
                              "--data.mixup_epochs=[0, 1]", "--data.augmentation_stop_epoch=2",
                              "--data.multi_scale=[64, 96]", "--model.loss.matchability=true"))
    with (run / "metrics.csv").open() as file:
        losses = [float(row["train/loss"]) for row in csv.DictReader(file) if row.get("train/loss")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
