"""Batching: zero-pad images to the batch's largest height and width, mask the padding, normalise boxes.

A batch is ``(images, padding_mask, targets)``, what the models, the criterion and the training system take:

- ``images`` float [B, 3, H, W], each image at the top-left, zeros bottom and right (as the authors'
  NestedTensor, util/misc.py);
- ``padding_mask`` bool [B, H, W], True on padding;
- ``targets`` list of B dicts: ``boxes`` float [T, 4] normalised cxcywh of the UNPADDED transformed image,
  ``labels`` int64 [T], ``image_id`` int64 scalar, ``orig_size`` int64 [2] (h, w) of the original image,
  ``size`` int64 [2] (h, w) after the transform; with keypoints, ``keypoints`` float [T, K, 3]: x / w, y / h of
  the unpadded transformed image (as the boxes) and the visibility 0/1/2 (a point not labelled is (0, 0, 0)).
  Prediction samples (no annotations) carry ``file_name``
  instead of boxes and labels.

:class:`MultiScaleCollate` then resizes each training batch to a square drawn from a list (RT-DETRv2's and D-FINE's
multi-scale batches, until their stop epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert

from detr.data.training_epoch import SharedEpoch
from detr.models.inputs import pad_images


def normalize_boxes(boxes_xyxy: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Pixel xyxy [T, 4] in an image of ``size`` (h, w) → normalised cxcywh [T, 4] float32."""
    height, width = (float(v) for v in size)
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    return box_convert(boxes_xyxy.to(torch.float32).reshape(-1, 4), in_fmt="xyxy", out_fmt="cxcywh") / scale


def normalize_keypoints(keypoints_pixels: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Pixel (x, y, v) [T, K, 3] in an image of ``size`` (h, w) → (x / w, y / h, v) [T, K, 3] float32."""
    height, width = (float(v) for v in size)
    scale = torch.tensor([width, height, 1.0], dtype=torch.float32)
    return keypoints_pixels.to(torch.float32) / scale


def collate_detection(
    samples: Sequence[tuple[torch.Tensor, dict[str, Any]]],
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """Samples ``(image [3, h, w], target)`` from the data sets in :mod:`detr.data` → a batch (module docstring).

    A target's ``boxes_xyxy`` (pixels of the transformed image) becomes ``boxes`` (normalised cxcywh), its
    ``keypoints_pixels`` become ``keypoints`` (x, y normalised alike); every other entry is passed through.
    """
    images, padding_mask = pad_images([image for image, _ in samples])
    targets = []
    for _, target in samples:
        target = dict(target)
        if "boxes_xyxy" in target:
            target["boxes"] = normalize_boxes(target.pop("boxes_xyxy"), target["size"])
        if "keypoints_pixels" in target:
            target["keypoints"] = normalize_keypoints(target.pop("keypoints_pixels"), target["size"])
        targets.append(target)
    return images, padding_mask, targets


class MultiScaleCollate:
    """:func:`collate_detection`, then the whole batch resized to a square side drawn at random from ``sizes``
    (RT-DETRv2's and D-FINE's ``BatchImageCollateFunction``; docs/models/rtdetr.md, "The authors' augmentations").

    The images are resized with ``F.interpolate``'s default, nearest neighbour, as the authors' collate does
    (``mode="bilinear"``: bilinear without corner alignment, as RF-DETR's training loop resizes its batches); the
    padding mask (and any target ``masks``) by nearest neighbour. Boxes and keypoints are normalised, so they do
    not change;
    each target's ``size`` becomes the new square. From epoch ``stop_epoch`` on (read from ``epoch`` per batch) the
    batch keeps the size its transform gave it.

    The side is drawn from torch's generator: in a DataLoader worker, the one the loader seeds per worker and
    epoch (from the training process's seed); without workers, the training process's.

    Args:
        sizes: square sides (pixels) to draw from, repeats weighting a side (the authors list 640 three times).
        stop_epoch: the first epoch (0-based) without resizing; None: every epoch.
        epoch: where the current epoch is read (needed with ``stop_epoch``).
        mode: the images' filter, "nearest" (RT-DETRv2, D-FINE) or "bilinear" (RF-DETR).
    """

    def __init__(self, sizes: Sequence[int], *, stop_epoch: int | None = None, epoch: SharedEpoch | None = None,
                 mode: Literal["nearest", "bilinear"] = "nearest") -> None:
        if mode not in ("nearest", "bilinear"):
            raise ValueError(f"MultiScaleCollate: mode must be 'nearest' or 'bilinear', got {mode!r}")
        self.mode = mode
        if not sizes or any(int(size) < 1 for size in sizes):
            raise ValueError(f"MultiScaleCollate needs a non-empty list of positive sizes, got {sizes!r}")
        if stop_epoch is not None and epoch is None:
            raise ValueError("MultiScaleCollate: a stop_epoch needs the epoch to compare it with (epoch=SharedEpoch())")
        self.sizes = [int(size) for size in sizes]
        self.stop_epoch = stop_epoch
        self.epoch = epoch

    def __call__(
        self, samples: Sequence[tuple[torch.Tensor, dict[str, Any]]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
        images, padding_mask, targets = collate_detection(samples)
        if self.stop_epoch is not None and self.epoch is not None and self.epoch.get() >= self.stop_epoch:
            return images, padding_mask, targets
        side = self.sizes[int(torch.randint(len(self.sizes), ()))]
        if images.shape[-2:] == (side, side):
            return images, padding_mask, targets
        if self.mode == "bilinear":
            images = F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False)
        else:  # "nearest", as the real-time DETRs' F.interpolate(images, sz)
            images = F.interpolate(images, size=(side, side))
        padding_mask = F.interpolate(padding_mask[:, None].float(), size=(side, side))[:, 0].bool()
        for target in targets:
            target["size"] = torch.tensor([side, side], dtype=torch.int64)
            if "masks" in target:
                target["masks"] = F.interpolate(target["masks"][None].float(), size=(side, side))[0].to(
                    target["masks"].dtype)
        return images, padding_mask, targets

    def __repr__(self) -> str:
        return f"MultiScaleCollate(sizes={self.sizes}, stop_epoch={self.stop_epoch})"
