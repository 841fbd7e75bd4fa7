"""The CUDA path: the same model, loss, training step and Predictor on a GPU as on the CPU.

Skipped where no GPU is at hand (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from detr import build_detr
from detr.inference.predictor import Predictor
from detr.lightning.options import EvaluationOptions
from detr.lightning.system import DetrSystem
from detr.loss.matcher import HungarianMatcher
from tests.helpers import TINY, InMemoryData
from tests.helpers_cuda import CUDA, needs_cuda, no_tf32, relative_error  # noqa: F401 (no_tf32: autouse)

pytestmark = needs_cuda

PHOTOS = Path(__file__).parents[1] / "data" / "photos"


def targets_for(batch_size: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    targets = []
    for n in range(1, batch_size + 1):
        boxes = torch.cat([torch.rand(n, 2, generator=generator) * 0.5 + 0.25,
                           torch.rand(n, 2, generator=generator) * 0.3 + 0.1], 1)
        targets.append({"boxes": boxes.to(device),
                        "labels": torch.randint(0, TINY.num_classes, (n,), generator=generator).to(device)})
    return targets


def test_forward_on_cuda_equals_cpu(tiny_model, padded_batch):
    images, mask = padded_batch
    with torch.no_grad():
        expected = tiny_model(images, mask)
        outputs = tiny_model.to(CUDA)(images.to(CUDA), mask.to(CUDA))
    for key in ("logits", "boxes"):
        assert getattr(outputs, key).device.type == "cuda"
        assert relative_error(getattr(outputs, key), getattr(expected, key)) < 1e-4, key


def test_bf16_autocast_forward_is_close_to_fp32(tiny_model, padded_batch):
    model = tiny_model.to(CUDA)
    images, mask = (t.to(CUDA) for t in padded_batch)
    with torch.no_grad():
        expected = model(images, mask)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outputs = model(images, mask)
    assert torch.isfinite(outputs.boxes).all()
    assert relative_error(outputs.boxes, expected.boxes) < 3e-2
    assert relative_error(outputs.logits, expected.logits) < 5e-2


def test_matching_and_loss_on_cuda_equal_cpu(padded_batch):
    torch.manual_seed(0)
    system = DetrSystem(detr=TINY.replace(dropout=0.0))
    images, mask = padded_batch
    targets = targets_for(2, torch.device("cpu"))
    with torch.no_grad():
        outputs = system.model(images, mask)
        expected_losses = system.compute_losses(outputs, targets)
        expected_indices = HungarianMatcher()(outputs, targets)
        system = system.to(CUDA)
        cuda_targets = [{k: v.to(CUDA) for k, v in t.items()} for t in targets]
        cuda_outputs = system.model(images.to(CUDA), mask.to(CUDA))
        losses = system.compute_losses(cuda_outputs, cuda_targets)
        indices = HungarianMatcher()(cuda_outputs, cuda_targets)
    for (rows, columns), (expected_rows, expected_columns) in zip(indices, expected_indices):
        assert torch.equal(rows.cpu(), expected_rows) and torch.equal(columns.cpu(), expected_columns)
    for name, value in expected_losses.items():
        torch.testing.assert_close(losses[name].cpu(), value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_fit_on_one_gpu(tmp_path, padded_batch, precision):
    torch.manual_seed(0)
    system = DetrSystem(detr=TINY, evaluation=EvaluationOptions(evaluation_dir=""))
    images, mask = padded_batch
    samples = [(images[i], target) for i, target in enumerate(targets_for(2, torch.device("cpu")))]
    for i, (_, target) in enumerate(samples):
        target.update(image_id=torch.tensor(i + 1), orig_size=torch.tensor([96, 128]), size=torch.tensor([96, 128]))
    before = {k: v.clone() for k, v in system.model.state_dict().items()}
    trainer = L.Trainer(accelerator="gpu", devices=1, precision=precision, max_steps=6, limit_val_batches=0,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        logger=False, default_root_dir=tmp_path)
    trainer.fit(system, datamodule=InMemoryData(samples, batch_size=2, train_repeats=3))
    assert trainer.global_step == 6
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.strategy.root_device.type == "cuda"  # (fit's teardown moves the module back to the CPU)
    after = system.model.state_dict()
    assert any(not torch.equal(after[k].cpu(), v) for k, v in before.items() if v.is_floating_point())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_predictor_on_cuda_matches_cpu(tmp_path, tiny_model, precision):
    path = tmp_path / "tiny.pth"
    torch.save({"model": tiny_model.state_dict()}, path)
    photos = [np.asarray(Image.open(PHOTOS / name).convert("RGB")) for name in ("chelsea.png", "coffee.png")]
    options = dict(num_heads=TINY.num_heads, batch_size=2, min_size=200, max_size=333)
    on_cpu = Predictor.from_checkpoint(str(path), device="cpu", **options).predict(photos, all_queries=True)
    on_gpu = Predictor.from_checkpoint(str(path), device="cuda", precision=precision, **options)
    assert on_gpu.model.class_embed.weight.device.type == "cuda"
    tolerance = 1e-4 if precision == "fp32" else 5e-2
    for gpu, cpu in zip(on_gpu.predict(photos, all_queries=True), on_cpu):
        assert gpu.boxes.device.type == "cpu"  # results come back to the host
        assert relative_error(gpu.scores, cpu.scores) < tolerance
        assert relative_error(gpu.boxes, cpu.boxes) < tolerance


def test_panoptic_model_runs_on_cuda(padded_batch):
    from detr.models.segmentation import build_detr_panoptic

    torch.manual_seed(0)
    model = build_detr_panoptic(TINY.replace(hidden_dim=128, num_heads=8, dropout=0.0)).eval()
    images, mask = padded_batch
    with torch.no_grad():
        expected = model(images, mask)
        outputs = model.to(CUDA)(images.to(CUDA), mask.to(CUDA))
    assert outputs.masks.device.type == "cuda"
    assert relative_error(outputs.masks, expected.masks) < 1e-4


def test_build_detr_places_nothing_on_the_host():
    """Every parameter and buffer moves with ``.to('cuda')`` (nothing held as a plain tensor attribute)."""
    model = build_detr(TINY).to(CUDA)
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert all(b.device.type == "cuda" for b in model.buffers())
