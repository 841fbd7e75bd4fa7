"""Every family besides the paper's DETR as a tiny model, with a batch, targets and a criterion for it: shared by
the tests that run each family's training path (tests/test_cuda_families.py on a GPU, tests/loss/test_host_syncs.py
on the CPU)."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.loss.build import build_criterion
from tests.helpers import TINY_GROUNDING, randomise, tiny_config_with
from tests.helpers_realtime import tiny_model

FAMILIES = ("deformable", "rtdetr", "dfine", "deimv2", "rfdetr", "grounding")
#: The families whose training forward adds denoising queries (from the targets).
DENOISING = ("rtdetr", "dfine", "deimv2")
#: Square inputs without padding for the real-time families (strides up to 32; RF-DETR's patch 14 × 2 windows);
#: None: a zero-padded batch of 96 × 128.
SIDES = {"rtdetr": 128, "dfine": 128, "deimv2": 128, "rfdetr": 112}
NUM_CLASSES = 5

DEFORMABLE = tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, num_feature_levels=2,
                              box_refine=True, two_stage=True, num_classes=NUM_CLASSES, dropout=0.0)
#: "[CLS] a cat . remote control ? [SEP]" (tests/helpers_grounding.py's vocabulary): two phrases, labels 0 and 1.
PROMPT = torch.tensor([[101, 1030, 1031, 1012, 1032, 1033, 1029, 102]])
PHRASES = 2


def tiny(family: str, **changes) -> torch.nn.Module:
    """The family's tiny model (tests/helpers_realtime.py's for the real-time families) with seeded random
    weights, in eval mode; ``changes``: config fields."""
    if family == "deformable":
        torch.manual_seed(0)
        model = build_detr(DEFORMABLE.replace(**changes)).eval()
        randomise(model, 1)
        return model
    if family == "grounding":
        pytest.importorskip("transformers")  # its BERT
        from detr.models.grounding.build import build_grounding

        torch.manual_seed(0)
        model = build_grounding(TINY_GROUNDING.replace(**changes)).eval()
        randomise(model, 1)
        return model
    return tiny_model(family, **changes)


def batch(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images and their padding mask (True = padding): squares for the real-time families, else two sizes
    zero-padded to 96 × 128."""
    torch.manual_seed(1)
    side = SIDES.get(family)
    if side is not None:
        return torch.randn(2, 3, side, side), torch.zeros(2, side, side, dtype=torch.bool)
    images, mask = torch.zeros(2, 3, 96, 128), torch.ones(2, 96, 128, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, 96, 128), False
    images[1, :, :64, :96], mask[1, :64, :96] = torch.randn(3, 64, 96), False
    return images, mask


def forward(model: torch.nn.Module, family: str, images: torch.Tensor, mask: torch.Tensor, **options):
    """The model's outputs for the batch (the grounding model's for :data:`PROMPT`, on every image)."""
    if family == "grounding":
        input_ids = PROMPT.expand(len(images), -1).to(images.device)
        return model(images, mask, input_ids, torch.ones_like(input_ids))
    return model(images, mask, **options)


def targets_for(family: str, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """One and two objects in the two images (labels: classes, the grounding prompt's phrases), with box-shaped
    masks at the image size for RF-DETR's instance masks."""
    generator = torch.Generator().manual_seed(3)
    classes = PHRASES if family == "grounding" else NUM_CLASSES
    height, width = images.shape[-2:]
    targets = []
    for n in (1, 2):
        boxes = torch.cat([torch.rand(n, 2, generator=generator) * 0.5 + 0.25,
                           torch.rand(n, 2, generator=generator) * 0.3 + 0.1], 1)
        target = {"boxes": boxes, "labels": torch.randint(0, classes, (n,), generator=generator)}
        if family == "rfdetr":
            ys, xs = (torch.arange(height) + 0.5) / height, (torch.arange(width) + 0.5) / width
            x0, y0 = (boxes[:, :2] - boxes[:, 2:] / 2).unbind(1)
            x1, y1 = (boxes[:, :2] + boxes[:, 2:] / 2).unbind(1)
            target["masks"] = (((ys[None, :, None] >= y0[:, None, None]) & (ys[None, :, None] < y1[:, None, None]))
                               & ((xs[None, None, :] >= x0[:, None, None]) & (xs[None, None, :] < x1[:, None, None])))
        targets.append(target)
    return targets


def criterion_for(model: torch.nn.Module, family: str):
    """build_criterion of the model's config (the grounding family's own set loss for a grounding model), and what
    makes the targets its own (the grounding criterion reads each target's phrase tokens)."""
    if family == "grounding":
        from detr.loss.grounding import build_grounding_criterion, phrase_token_maps, with_token_maps

        token_maps = phrase_token_maps(PROMPT[0], model.max_text_len)
        return build_grounding_criterion(model.config), lambda t: with_token_maps(t, token_maps.to(t[0]["boxes"]))
    return build_criterion(model.config), lambda t: t
