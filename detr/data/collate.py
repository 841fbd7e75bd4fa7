"""Batching: zero-pad images to the batch's largest height and width, mask the padding, normalise boxes.

A batch is ``(images, padding_mask, targets)``, what the models, the criterion and the training system take:

- ``images`` float [B, 3, H, W], each image at the top-left, zeros bottom and right (as the authors'
  NestedTensor, util/misc.py);
- ``padding_mask`` bool [B, H, W], True on padding;
- ``targets`` list of B dicts: ``boxes`` float [T, 4] normalised cxcywh of the UNPADDED transformed image,
  ``labels`` int64 [T], ``image_id`` int64 scalar, ``orig_size`` int64 [2] (h, w) of the original image,
  ``size`` int64 [2] (h, w) after the transform. Prediction samples (no annotations) carry ``file_name``
  instead of boxes and labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision.ops import box_convert

from detr.models.inputs import pad_images


def normalize_boxes(boxes_xyxy: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Pixel xyxy [T, 4] in an image of ``size`` (h, w) → normalised cxcywh [T, 4] float32."""
    height, width = (float(v) for v in size)
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    return box_convert(boxes_xyxy.to(torch.float32).reshape(-1, 4), in_fmt="xyxy", out_fmt="cxcywh") / scale


def collate_detection(
    samples: Sequence[tuple[torch.Tensor, dict[str, Any]]],
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """Samples ``(image [3, h, w], target)`` from the data sets in :mod:`detr.data` → a batch (module docstring).

    A target's ``boxes_xyxy`` (pixels of the transformed image) becomes ``boxes`` (normalised cxcywh);
    every other entry is passed through.
    """
    images, padding_mask = pad_images([image for image, _ in samples])
    targets = []
    for _, target in samples:
        target = dict(target)
        if "boxes_xyxy" in target:
            target["boxes"] = normalize_boxes(target.pop("boxes_xyxy"), target["size"])
        targets.append(target)
    return images, padding_mask, targets
