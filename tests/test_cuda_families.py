"""The CUDA path of every family besides the paper's DETR (tests/test_cuda.py): a tiny model of each gives the same
predictions on the GPU as on the CPU, close ones under bf16 autocast, the same loss terms from its criterion, and
trains a few steps on one GPU in bf16-mixed precision.

Skipped where no GPU is at hand (CI has none); run on a GPU machine with ``pytest tests/test_cuda_families.py``.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

from detr.lightning.options import EvaluationOptions
from detr.lightning.system import DetrSystem
from detr.models.recipe import OptimizerRecipe
from tests.helpers import InMemoryData
from tests.helpers_cuda import CUDA, needs_cuda, no_tf32, relative_error  # noqa: F401 (no_tf32: autouse)
from tests.helpers_families import DENOISING, FAMILIES, batch, criterion_for, forward, targets_for, tiny

pytestmark = needs_cuda

#: The device compared with the CPU (set to the CPU to check this module's logic on a machine without a GPU).
DEVICE = CUDA


def assert_close_where_finite(value: torch.Tensor, reference: torch.Tensor, tolerance: float, name: str) -> None:
    """The same non-finite entries (the grounding logits' -inf beyond the prompt), the rest within a relative
    error of ``tolerance``."""
    value, reference = value.float().cpu(), reference.float().cpu()
    finite = reference.isfinite()
    assert torch.equal(value.isfinite(), finite), name
    error = relative_error(value[finite], reference[finite])
    assert error < tolerance, f"{name}: relative error {error:.2e}"


def assert_close_as_query_sets(outputs, expected) -> None:
    """bf16 outputs against fp32: each query paired with the fp32 query of the nearest box, since under bf16 the
    encoder's top-k may select near-equal proposals in another order, or swap one at the cut. Three in four queries
    find theirs within 0.05 (the median within 0.01); the logits, every column sorted over the queries (the
    queries as a set), within 25 % (random weights of tiny models, the selection's reordering)."""
    boxes = outputs.boxes.float()
    assert torch.isfinite(boxes).all()
    distance = (boxes[:, :, None] - expected.boxes[:, None]).abs().amax(-1).amin(-1)  # [B, Q]
    assert (distance < 0.05).float().mean() >= 0.75 and distance.median() < 0.01, distance
    sorted_logits = [logits.float().sort(dim=1).values for logits in (outputs.logits, expected.logits)]
    assert_close_where_finite(*sorted_logits, 0.25, "logits")


def on(device: torch.device, targets: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    return [{k: v.to(device) for k, v in target.items()} for target in targets]


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_on_cuda_equals_cpu(family):
    model = tiny(family)
    images, mask = batch(family)
    with torch.no_grad():
        expected = forward(model, family, images, mask)
        outputs = forward(model.to(DEVICE), family, images.to(DEVICE), mask.to(DEVICE))
    names = ["logits", "boxes"] + (["masks"] if expected.masks is not None else [])
    assert (family != "rfdetr") or "masks" in names  # RF-DETR with its instance masks
    for name in names:
        assert getattr(outputs, name).device.type == DEVICE.type
        assert_close_where_finite(getattr(outputs, name), getattr(expected, name), 1e-4, name)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_autocast_forward_is_close_to_fp32(family):
    model = tiny(family).to(DEVICE)
    images, mask = (t.to(DEVICE) for t in batch(family))
    with torch.no_grad():
        expected = forward(model, family, images, mask)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            outputs = forward(model, family, images, mask)
    assert_close_as_query_sets(outputs, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_criterion_on_cuda_equals_cpu(family, monkeypatch):
    """The training outputs (with denoising queries where the family has them) of one CPU forward, scored on both
    devices; the random points of RF-DETR's mask terms drawn on the host, so that both devices read the same."""
    changes = {"denoising": True} if family in DENOISING else {}
    model = tiny(family, **changes).train()
    images, mask = batch(family)
    targets = targets_for(family, images)
    torch.manual_seed(4)
    with torch.no_grad():
        outputs = forward(model, family, images, mask, targets=targets)
    assert (family not in DENOISING) or outputs.denoising is not None
    criterion, own = criterion_for(model, family)
    rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *size, device=None, **options: rand(*size, **options).to(device))
    torch.manual_seed(5)
    expected = criterion(outputs, own(targets))
    torch.manual_seed(5)
    losses = criterion.to(DEVICE)(outputs.apply(lambda t: t.to(DEVICE)), own(on(DEVICE, targets)))
    assert set(losses) == set(expected)
    for name, value in expected.items():
        assert losses[name].device.type == DEVICE.type, name
        torch.testing.assert_close(losses[name].cpu(), value, rtol=1e-4, atol=1e-5, msg=name)


def grounding_system():
    """A GroundingSystem over the tiny grounding model, its tokenizer from tests/helpers_grounding.py's vocabulary,
    the categories "cat" and "dog"."""
    transformers = pytest.importorskip("transformers")
    from detr.lightning.grounding_system import GroundingSystem
    from tests.helpers_grounding import vocabulary

    model = tiny("grounding")
    model.tokenizer = transformers.BertTokenizerFast(vocab=vocabulary(), do_lower_case=True)
    return GroundingSystem(model, ["cat", "dog"])


@pytest.mark.parametrize("family", FAMILIES)
def test_lightning_fit_in_bf16_on_one_gpu(tmp_path, family):
    torch.manual_seed(0)
    if family == "grounding":
        system = grounding_system()
    else:
        config = tiny(family, **({"denoising": True} if family in DENOISING else {})).config
        system = DetrSystem(detr=config, evaluation=EvaluationOptions(evaluation_dir=""),
                            optimizer=OptimizerRecipe(lr_flat_cosine_epochs=[]))  # (DEIMv2's counts epochs)
    images, _ = batch(family)
    height, width = images.shape[-2:]
    samples = [(images[i], target) for i, target in enumerate(targets_for(family, images))]
    for i, (_, target) in enumerate(samples):
        target.update(image_id=torch.tensor(i + 1), orig_size=torch.tensor([height, width]),
                      size=torch.tensor([height, width]))
    before = {k: v.clone() for k, v in system.model.state_dict().items()}
    trainer = L.Trainer(accelerator="gpu" if DEVICE.type == "cuda" else "cpu", devices=1, precision="bf16-mixed",
                        max_steps=4, limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, logger=False, default_root_dir=tmp_path)
    trainer.fit(system, datamodule=InMemoryData(samples, batch_size=2, train_repeats=2))
    assert trainer.global_step == 4
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.strategy.root_device.type == DEVICE.type  # (fit's teardown moves the module back to the CPU)
    after = system.model.state_dict()
    assert any(not torch.equal(after[k].cpu(), v) for k, v in before.items() if v.is_floating_point())
