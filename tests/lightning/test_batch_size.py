"""``--data.batch_size auto`` (detr/lightning/batch_size.py): a fit chooses the batch from the memory available and
says which; the rule's bounds; the probe leaves the model as it was; a data module used without a training system
says how to give a number."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

import detr.lightning.batch_size as batch_size_module
from detr.lightning.batch_size import MAX_BATCH, MEMORY_FRACTION, saved_bytes
from detr.lightning.cli import make_cli
from detr.lightning.datamodule import DetrDataModule
from tests.helpers import tiny_fit_args

pytestmark = pytest.mark.usefixtures("one_thread")

CHOSEN = re.compile(r"--data\.batch_size auto: (\d+) images per batch \((\d+) MiB")


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["detr"])


def _fit(root: Path, out: Path, caplog) -> tuple[int, int]:
    """A one-step ``detr fit --data.batch_size auto`` → the batch its loader used and the batch its line logged."""
    with caplog.at_level(logging.INFO, logger="detr"):
        cli = make_cli(tiny_fit_args(root, out, "--data.batch_size=auto", "--trainer.max_steps=1"))
    lines = [match for record in caplog.records if (match := CHOSEN.search(record.getMessage()))]
    assert len(lines) == 1, [record.getMessage() for record in caplog.records]
    return cli.trainer.train_dataloader.batch_size, int(lines[0].group(1))


def test_fit_with_batch_size_auto_trains_at_the_batch_it_logs(tiny_shapes_root: Path, tmp_path: Path, caplog) -> None:
    used, logged = _fit(tiny_shapes_root, tmp_path / "run", caplog)
    assert used == logged
    assert 1 <= used <= min(MAX_BATCH, 8)  # the tiny set has 8 training images


def test_the_batch_follows_the_memory_available(tiny_shapes_root: Path, tmp_path: Path, caplog, monkeypatch) -> None:
    """No memory to spare: one image; plenty: the training set's size (8)."""
    monkeypatch.setattr(batch_size_module, "available_memory", lambda device: 0)
    assert _fit(tiny_shapes_root, tmp_path / "none", caplog) == (1, 1)
    caplog.clear()
    monkeypatch.setattr(batch_size_module, "available_memory", lambda device: 2**50)
    assert _fit(tiny_shapes_root, tmp_path / "plenty", caplog) == (8, 8)


def test_the_batch_is_the_memory_share_over_one_images_bytes(tiny_shapes_root, tmp_path, caplog, monkeypatch) -> None:
    """With room for 5.5 images' saved activations in the share, 5."""
    per_image: list[int] = []
    original = batch_size_module.saved_bytes

    def recording(run) -> int:
        per_image.append(original(run))
        return per_image[-1]

    monkeypatch.setattr(batch_size_module, "saved_bytes", recording)
    monkeypatch.setattr(batch_size_module, "available_memory",
                        lambda device: int(5.5 * (per_image[1] - per_image[0]) / MEMORY_FRACTION))
    assert _fit(tiny_shapes_root, tmp_path / "run", caplog) == (5, 5)


def test_saved_bytes_counts_a_storage_once() -> None:
    a, b = torch.ones(1000, requires_grad=True), torch.ones(1000, requires_grad=True)
    assert saved_bytes(lambda: (a * b).sum()) == 8000  # a product saves both factors
    assert saved_bytes(lambda: (a * a).sum()) == 4000  # the same storage twice


def test_batch_size_auto_without_a_training_system_says_to_give_a_number(tiny_shapes_root: Path) -> None:
    data = DetrDataModule(root=str(tiny_shapes_root), batch_size="auto", num_workers=0)
    data.setup("fit")
    with pytest.raises(ValueError, match="--data.batch_size auto is chosen by the training system"):
        data.train_dataloader()
    with pytest.raises(ValueError, match=r"--data.batch_size must be an integer >= 1 or auto, got 'big'"):
        DetrDataModule(root=str(tiny_shapes_root), batch_size="big")
