"""A training step waits for the GPU only where it must. On a GPU, every operation that reads a device value back
to the host (``.item()``, ``bool(t)``, ``int(t)``, a boolean mask's indexing, ``nonzero``, ``unique``, ...) stops the
host until every kernel queued before it has run; a step that does this in its loss runs at the pace of its kernel
launches (docs/measurements/gpu.md: the real-time families' steps were host-bound there). Every family's training
forward (with its denoising queries) and criterion here reads nothing back but the matcher's one copy of its costs,
and the few reads listed in tests/helpers_cuda.py's ``BY_DESIGN``.

The check runs on the CPU (CI has no GPU): a dispatch mode (tests/helpers_cuda.py's :class:`DeviceReads`) sees every
operation of the forward and the loss and records those that would wait on a GPU, with the place in the package they
come from.
"""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.lightning.system import DetrSystem
from detr.loss.build import build_criterion
from detr.loss.grounding import with_token_maps
from tests.helpers import TINY
from tests.helpers_cuda import DeviceReads
from tests.helpers_families import DENOISING, FAMILIES, batch, criterion_for, forward, targets_for, tiny
from tests.helpers_rfdetr import KEYPOINT_COUNTS, TINY_KEYPOINT_RFDETR


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_s_training_forward_and_loss_read_nothing_back_but_the_matching(family):
    model = tiny(family, **({"denoising": True} if family in DENOISING else {})).train()
    images, mask = batch(family)
    targets = targets_for(family, images)
    criterion, own = criterion_for(model, family)
    targets = own(targets)
    with DeviceReads() as reads:
        outputs = forward(model, family, images, mask, targets=targets)
        losses = criterion(outputs, targets)
    assert (family not in DENOISING) or outputs.denoising is not None
    assert losses and not reads.found, reads.found


def test_the_paper_s_detr_and_rf_detr_keypoints_read_nothing_back_but_the_matching():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    for config, side in ((TINY.replace(dropout=0.0), 64), (TINY_KEYPOINT_RFDETR, 64)):
        model = build_detr(config).train()
        criterion = build_criterion(config)
        targets = []
        for labels in ([1, 2], [0, 1, 2]):
            boxes = torch.tensor([[0.5, 0.5, 0.4, 0.3]]).repeat(len(labels), 1)
            target = {"labels": torch.tensor(labels), "boxes": boxes}
            if getattr(config, "num_keypoints_per_class", ()):
                keypoints = torch.rand(len(labels), max(KEYPOINT_COUNTS), 3, generator=generator)
                keypoints[..., 2] = torch.randint(0, 3, keypoints.shape[:2], generator=generator).float()
                target["keypoints"] = keypoints
            targets.append(target)
        images, mask = torch.randn(2, 3, side, side), torch.zeros(2, side, side, dtype=torch.bool)
        mask[1, :, side // 2:] = True  # one padded image: DETR keeps its mask (no read back)
        with DeviceReads() as reads:
            losses = criterion(model(images, mask), targets)
        assert losses and not reads.found, (type(model).__name__, reads.found)


def test_the_training_system_divides_by_the_box_count_without_reading_it():
    system = DetrSystem(detr=TINY.replace(num_classes=3))
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.rand(2, 4)}, {"labels": torch.tensor([1])}]
    with DeviceReads() as reads:
        num_boxes = system.reduced_num_boxes(targets)
    assert isinstance(num_boxes, torch.Tensor) and float(num_boxes) == 3.0 and not reads.found
    assert float(system.reduced_num_boxes([{"labels": torch.zeros(0, dtype=torch.int64)}])) == 1.0  # at least 1


def test_the_grounding_labels_are_checked_where_they_are_on_the_host():
    token_maps = torch.eye(2, 4)
    targets = [{"labels": torch.tensor([1, 0]), "boxes": torch.rand(2, 4)}]
    assert torch.equal(with_token_maps(targets, token_maps)[0]["token_map"], token_maps[[1, 0]])
    with pytest.raises(ValueError, match="label 2 but the prompt has 2 phrases"):
        with_token_maps([{"labels": torch.tensor([2]), "boxes": torch.rand(1, 4)}], token_maps)


def test_the_keypoint_labels_are_checked_on_the_host_before_the_batch_moves():
    system = DetrSystem(detr=TINY_KEYPOINT_RFDETR)
    images, mask = torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool)
    good = [{"labels": torch.tensor([0, 2]), "boxes": torch.rand(2, 4)}]
    assert system.on_before_batch_transfer((images, mask, good), 0)[2] is good
    bad = [{"labels": torch.tensor([len(KEYPOINT_COUNTS)]), "boxes": torch.rand(1, 4)}]
    with pytest.raises(ValueError, match="has no keypoint count"):
        system.on_before_batch_transfer((images, mask, bad), 0)
