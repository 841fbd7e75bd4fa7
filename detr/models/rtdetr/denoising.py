"""RT-DETR's contrastive denoising groups (training only; Zhao et al. 2024, after DINO's contrastive denoising:
Zhang et al., "DINO: DETR with Improved DeNoising Anchor Boxes", ICLR 2023, §3.3).

In training, noised copies of every ground-truth box and label go to the decoder as extra queries ahead of the
selected ones. Each group holds a *positive* and a *negative* copy of every target of the batch (padded to the
batch's largest target count, ``T``): positives move each box corner by less than half the box's width or
height (× ``box_noise_scale``), and must reconstruct it; negatives by between one and two halves, and must be
classified as background. As many groups as fit in ``num_denoising`` queries: ``G = max(1, num_denoising // T)``
of ``2 T`` queries each. Labels are replaced by a random class with probability ``label_noise_ratio / 2``
(padding slots keep the "no class" label ``num_classes``, whose embedding row is zero).

The decoder's queries in training: the ``G · 2T`` denoising queries, group by group (in each group the ``T``
positives, then the ``T`` negatives), then the ``num_queries`` selected ones. The self-attention mask keeps the
selected queries from seeing any denoising query and each group from seeing the others.

The operations and the order of their random draws are those of the authors' ``get_contrastive_denoising_
training_group`` (``src/zoo/rtdetr/denoising.py``), which transformers copies, so a seed gives the same noise.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.box_ops import cxcywh_to_xyxy, inverse_sigmoid, xyxy_to_cxcywh
from detr.models.layers.denoising import DenoisingMeta, denoising_attention_mask


def contrastive_denoising_queries(targets: list[dict[str, torch.Tensor]], class_embed: nn.Embedding, *,
                                  num_classes: int, num_queries: int, num_denoising: int = 100,
                                  label_noise_ratio: float = 0.5, box_noise_scale: float = 1.0
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DenoisingMeta] | None:
    """The denoising queries for a batch, or None when no image has a target (or ``num_denoising`` is 0).

    Args:
        targets: per image labels int64 [T_b] and boxes float [T_b, 4] normalised cxcywh.
        class_embed: the label embedding (``num_classes + 1`` rows, the last the padding's).
        num_classes, num_queries: the model's classes and selected queries.
        num_denoising, label_noise_ratio, box_noise_scale: the authors' 100, 0.5, 1.0.

    Returns content float [B, D, C] (the noised labels' embeddings), reference box logits float [B, D, 4]
    (inverse sigmoid of the noised cxcywh boxes), the self-attention mask bool [D + Q, D + Q] (True = may
    attend) and the :class:`DenoisingMeta` (``num_groups`` G, ``group_size`` 2T: query ``g · 2T + t`` of image
    b is the positive copy of its target t), with D = G · 2T.
    """
    counts = [len(target["labels"]) for target in targets]
    largest = max(counts, default=0)
    if num_denoising <= 0 or largest == 0:
        return None
    device = class_embed.weight.device
    num_groups = max(num_denoising // largest, 1)
    batch = len(targets)
    labels = torch.full([batch, largest], num_classes, dtype=torch.int32, device=device)
    boxes = torch.zeros([batch, largest, 4], device=device)
    real = torch.zeros([batch, largest], dtype=torch.bool, device=device)  # False: a padding slot
    for index, (target, count) in enumerate(zip(targets, counts)):
        if count:
            labels[index, :count] = target["labels"].to(device)
            boxes[index, :count] = target["boxes"].to(device=device, dtype=torch.float32)
            real[index, :count] = True
    labels = labels.tile([1, 2 * num_groups])  # [B, D]
    boxes = boxes.tile([1, 2 * num_groups, 1])  # [B, D, 4]
    real = real.tile([1, 2 * num_groups])
    negative = torch.zeros([batch, largest * 2, 1], device=device)
    negative[:, largest:] = 1
    negative = negative.tile([1, num_groups, 1])  # [B, D, 1]: 1 for a negative copy

    if label_noise_ratio > 0:
        flip = torch.rand_like(labels, dtype=torch.float) < (label_noise_ratio * 0.5)
        random_labels = torch.randint_like(flip, 0, num_classes, dtype=labels.dtype)
        labels = torch.where(flip & real, random_labels, labels)
    if box_noise_scale > 0:
        corners = cxcywh_to_xyxy(boxes)
        half_size = torch.tile(boxes[..., 2:] * 0.5, [1, 1, 2]) * box_noise_scale  # [B, D, 4]
        sign = torch.randint_like(boxes, 0, 2) * 2.0 - 1.0
        magnitude = torch.rand_like(boxes)  # [0, 1) of a half size for positives, [1, 2) for negatives
        magnitude = (magnitude + 1.0) * negative + magnitude * (1 - negative)
        corners = (corners + magnitude * sign * half_size).clip(min=0.0, max=1.0)
        boxes = xyxy_to_cxcywh(corners)
    reference_logits = inverse_sigmoid(boxes, eps=1e-5)
    content = class_embed(labels)
    meta = DenoisingMeta(num_groups=num_groups, group_size=2 * largest)
    mask = denoising_attention_mask(num_groups, 2 * largest, num_queries, device)
    return content, reference_logits, mask, meta
