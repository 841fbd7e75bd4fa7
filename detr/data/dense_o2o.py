"""DEIM's dense one-to-one matching (Huang et al., "DEIM: DETR with Improved Matching for Fast Convergence",
CVPR 2025, section 3.2): more targets per training image, so that one-to-one matching finds more positives,
through Mosaic and MixUp, on RT-DETR's and D-FINE's augmentations and by epoch (docs/models/dfine.md, "DEIM's dense
one-to-one"). As the authors' Intellindust/DEIM ``src/data/transforms/mosaic.py`` (``use_cache: False``, the
configs' setting), ``container.py`` (the four-stage ``stop_epoch`` policy) and ``dataloader.py``
(``BatchImageCollateFunction.apply_mixup``):

- :class:`Mosaic`: the sample and three others drawn at random (with replacement) from the data set, each resized
  so its shortest side is ``cell_size`` (320 for 640 squares), pasted at the top-left corners of the four
  quadrants of a canvas of twice the largest resized height and width (fill 0), then one random affine of the
  whole canvas: rotation U(-10°, 10°), translation U(-0.1, 0.1) of each side, scale U(0.5, 1.5), fill 0, nearest
  neighbour (torchvision's ``RandomAffine`` defaults, here albumentations' ``Affine``). A box becomes the
  bounding box of its four moved corners, clipped to the canvas; one narrower or lower than 1 px is dropped.
- :class:`DenseO2OTransform`: the per-sample policy over epochs ``[start, mosaic_end)`` and ``stop``: before
  ``start`` and from ``stop`` on, the flip and the square resize only; in ``[start, mosaic_end)``, with
  probability ``mosaic_prob``, the mosaic, photometric distortion, flip and resize (no zoom-out or IoU crop on a
  mosaic), otherwise RT-DETR's augmentations; in ``[mosaic_end, stop)``, RT-DETR's augmentations.
- :class:`MixUpCollate`: with probability ``mixup_prob`` per batch in epochs ``[start, end)``, each image becomes
  ``β · image_i + (1 − β) · image_{i−1}`` (the previous image of the batch, the first taking the last), β drawn
  once per batch from U(0.45, 0.55), and its targets are its own followed by image ``i − 1``'s.

Albumentations' own ``Mosaic`` (2.0) is another recipe (YOLO's: cells fitted to a fixed shape, a random centre,
a crop to the output size, no affine), so the assembly is written here and only the affine is albumentations'.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

import albumentations as A
import cv2
import numpy as np
import torch

from detr.data.training_epoch import SharedEpoch
from detr.data.transforms import box_params, make_rtdetr_train_transform, reseed_transform

Batch = tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]


class RawSamples(Protocol):
    """What a mosaic draws its other images from (:class:`detr.data.coco.CocoDetection`): a length and
    ``raw_sample(i)`` with ``pixels`` (uint8 [H, W, 3]), ``boxes_xyxy`` (float32 [T, 4] pixels) and ``labels``
    (int64 [T])."""

    def __len__(self) -> int: ...

    def raw_sample(self, index: int) -> Any: ...


def shortest_side_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) with the shortest side ``size`` and the aspect ratio kept: torchvision's ``Resize(size)``
    rounding (the long side truncated)."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


class Mosaic:
    """DEIM's mosaic of four images with a random affine of the whole (module docstring). Called as the other
    transforms (``image`` uint8 [H, W, 3], ``bboxes`` [N, 4] pixel xyxy, ``labels`` [N]); returns ``image``
    uint8 [h, w, 3] (the canvas, twice the largest resized side on each axis), ``bboxes`` float32 [M, 4] pixel
    xyxy and ``labels`` [M]: the sample's boxes first, then the drawn images' in their quadrants' order.

    Args:
        cell_size: the shortest side of each of the four images (the authors' ``output_size``: 320).
        samples: the data set the three other images are drawn from (set later with :meth:`draw_from`).
        rotation: the largest rotation, degrees (10).
        translation: the largest shift, a share of the canvas's side (0.1).
        scale: the range of the scale factor ((0.5, 1.5)).
        seed: seed of the draws (None: fresh entropy); :meth:`set_random_seed` reseeds.
    """

    def __init__(self, cell_size: int, samples: RawSamples | None = None, *, rotation: float = 10.0,
                 translation: float = 0.1, scale: tuple[float, float] = (0.5, 1.5), seed: int | None = None) -> None:
        if cell_size < 1:
            raise ValueError(f"Mosaic: cell_size must be >= 1, got {cell_size}")
        self.cell_size = int(cell_size)
        self.samples = samples
        self.random = random.Random(seed)
        # torchvision's RandomAffine(degrees, translate, scale, fill=0): one scale for both axes, nearest neighbour
        self.affine = A.Compose([A.Affine(rotate=(-rotation, rotation), scale=scale, keep_ratio=True,
                                          translate_percent={"x": (-translation, translation),
                                                             "y": (-translation, translation)},
                                          interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0,
                                          p=1.0)],
                                bbox_params=box_params(min_box_size=1.0))
        if seed is not None:
            reseed_transform(self.affine, seed + 1)

    def draw_from(self, samples: RawSamples) -> None:
        """Draw the other three images of each mosaic from ``samples``."""
        self.samples = samples

    def set_random_seed(self, seed: int) -> None:
        """Reseed the draws and the affine (:func:`detr.data.transforms.reseed_transform`)."""
        self.random.seed(seed)
        reseed_transform(self.affine, seed + 1)

    def __call__(self, **data: Any) -> dict[str, Any]:
        if "masks" in data or "keypoints" in data:
            what = "masks" if "masks" in data else "keypoints"
            raise ValueError(f"Mosaic moves boxes only: train {what} with another --data.augmentation")
        if self.samples is None or len(self.samples) == 0:
            raise ValueError("Mosaic has no data set to draw its other images from: call draw_from(dataset)")
        parts = [(np.asarray(data["image"]), data["bboxes"], data["labels"])]
        for _ in range(3):  # random.choices(range(len(dataset)), k=3): with replacement, the sample itself included
            other = self.samples.raw_sample(self.random.randrange(len(self.samples)))
            parts.append((other.pixels, other.boxes_xyxy, other.labels))
        canvas, boxes, labels = self.assemble(parts)
        return self.affine(image=canvas, bboxes=boxes, labels=labels)

    def assemble(self, parts: Sequence[tuple[np.ndarray, Any, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Four (uint8 [H, W, 3], boxes [N, 4] pixel xyxy, labels [N]) → the canvas before the affine, the boxes
        resized and moved into their quadrants, the labels in the same order."""
        resized, all_boxes, all_labels = [], [], []
        for pixels, boxes, labels in parts:
            height, width = pixels.shape[:2]
            new_height, new_width = shortest_side_shape(height, width, self.cell_size)
            resized.append(cv2.resize(pixels, (new_width, new_height), interpolation=cv2.INTER_LINEAR))
            scale = np.array([new_width / width, new_height / height] * 2, np.float32)
            all_boxes.append(np.asarray(boxes, np.float32).reshape(-1, 4) * scale)
            all_labels.append(np.asarray(labels).reshape(-1))
        cell_height = max(image.shape[0] for image in resized)
        cell_width = max(image.shape[1] for image in resized)
        canvas = np.zeros((2 * cell_height, 2 * cell_width, 3), np.uint8)
        for quadrant, (image, boxes) in enumerate(zip(resized, all_boxes)):
            left, top = (quadrant % 2) * cell_width, (quadrant // 2) * cell_height
            canvas[top:top + image.shape[0], left:left + image.shape[1]] = image
            boxes += np.array([left, top, left, top], np.float32)
        return canvas, np.concatenate(all_boxes), np.concatenate(all_labels)

    def __repr__(self) -> str:
        return f"Mosaic(cell_size={self.cell_size})"


class DenseO2OTransform:
    """DEIM's training transform of square inputs by epoch (module docstring). Same call and output as
    :func:`detr.data.transforms.make_rtdetr_train_transform`: ``image`` float32 [3, size, size], ``bboxes``
    pixel xyxy, ``labels``.

    Args:
        size: the square's side (pixels).
        epoch: where the current epoch (0-based) is read, once per sample.
        mosaic_epochs: ``(start, mosaic_end)``: the strong augmentations start at ``start`` (before it, the flip
            and the resize only: DEIM's data-augmentation warm-up), the mosaic is drawn until ``mosaic_end``.
        stop_epoch: from this epoch on, the flip and the resize only (None: never).
        mosaic_prob: the chance of a mosaic in ``[start, mosaic_end)`` (the authors' ``mosaic_prob``: 0.5).
        cell_size: the mosaic's cell (None: half the square, the authors' 320 for 640).
        normalize: ImageNet's mean and std instead of pixels / 255.
        seed: seed of the draws (None: fresh entropy).
    """

    def __init__(self, size: int, *, epoch: SharedEpoch, mosaic_epochs: Sequence[int] = (4, 29),
                 stop_epoch: int | None = None, mosaic_prob: float = 0.5, cell_size: int | None = None,
                 normalize: bool = False, seed: int | None = None) -> None:
        start, end = (int(value) for value in mosaic_epochs)
        if not 0 <= start <= end or (stop_epoch is not None and stop_epoch < end):
            raise ValueError(f"DenseO2OTransform needs 0 <= start <= mosaic_end <= stop_epoch, got mosaic_epochs="
                             f"{list(mosaic_epochs)} and stop_epoch={stop_epoch}")
        if not 0.0 <= mosaic_prob <= 1.0:
            raise ValueError(f"DenseO2OTransform: mosaic_prob must be in [0, 1], got {mosaic_prob}")
        self.epoch = epoch
        self.start, self.mosaic_end, self.stop_epoch = start, end, stop_epoch
        self.mosaic_prob = float(mosaic_prob)
        self.random = random.Random(seed)
        self.mosaic = Mosaic(cell_size if cell_size is not None else size // 2)
        # after a mosaic: the authors' pipeline less the zoom-out and the IoU crop
        self.after_mosaic = make_rtdetr_train_transform(size, zoom_and_crop=False, normalize=normalize, seed=seed)
        self.augmented = make_rtdetr_train_transform(size, normalize=normalize, seed=seed)
        self.plain = make_rtdetr_train_transform(size, augment=False, normalize=normalize, seed=seed)
        if seed is not None:
            self.set_random_seed(seed)

    def draw_from(self, samples: RawSamples) -> None:
        """Draw the mosaic's other images from ``samples`` (the data set this transform serves)."""
        self.mosaic.draw_from(samples)

    def stage(self, epoch: int) -> str:
        """"plain", "mosaic" (a mosaic may be drawn) or "augmented": what ``epoch`` trains with."""
        if epoch < self.start or (self.stop_epoch is not None and epoch >= self.stop_epoch):
            return "plain"
        return "mosaic" if epoch < self.mosaic_end else "augmented"

    def __call__(self, **data: Any) -> dict[str, Any]:
        stage = self.stage(self.epoch.get())
        if stage == "plain":
            return self.plain(**data)
        if stage == "mosaic" and self.random.random() <= self.mosaic_prob:  # the authors' "<="
            return self.after_mosaic(**self.mosaic(**data))
        return self.augmented(**data)

    def set_random_seed(self, seed: int) -> None:
        """Reseed every draw, each part from its own seed (:func:`detr.data.transforms.reseed_transform`)."""
        self.random.seed(seed)
        for offset, part in enumerate((self.mosaic, self.after_mosaic, self.augmented, self.plain), start=1):
            reseed_transform(part, seed + 7919 * offset)

    def __repr__(self) -> str:
        return (f"DenseO2OTransform(epochs=[{self.start}, {self.mosaic_end}, {self.stop_epoch}], "
                f"mosaic_prob={self.mosaic_prob}, {self.mosaic!r})")


class MixUpCollate:
    """``collate`` (e.g. :func:`detr.data.collate.collate_detection` or a
    :class:`detr.data.collate.MultiScaleCollate`), then DEIM's MixUp of the batch (module docstring).

    The batch's images must share one size (square inputs: ``--data.square_size``). Mixing commutes with the
    multi-scale resize (both act on every pixel alike), so the authors' order (mix, then resize) gives the same
    batch. A target's ``boxes`` (normalised cxcywh), ``labels``, ``masks`` and ``keypoints`` (if any) are
    concatenated, its own first; its ``image_id`` and sizes stay its own. A pixel is padding only where both images
    are. The draws use torch's generator (seeded per loader worker and epoch).

    Args:
        collate: the batch before mixing.
        prob: the chance of mixing a batch (the authors' ``mixup_prob``: 0.5).
        epochs: ``(start, end)``: mix in epochs ``start <= epoch < end`` (the authors' ``mixup_epochs``).
        epoch: where the current epoch is read, once per batch.
    """

    def __init__(self, collate: Any, *, prob: float, epochs: Sequence[int], epoch: SharedEpoch) -> None:
        start, end = (int(value) for value in epochs)
        if not 0 <= start <= end:
            raise ValueError(f"MixUpCollate needs epochs (start, end) with 0 <= start <= end, got {list(epochs)}")
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"MixUpCollate: prob must be in [0, 1], got {prob}")
        self.collate, self.prob, self.start, self.end, self.epoch = collate, float(prob), start, end, epoch

    def __call__(self, samples: Sequence[tuple[torch.Tensor, dict[str, Any]]]) -> Batch:
        images, padding_mask, targets = self.collate(samples)
        if not self.start <= self.epoch.get() < self.end or not float(torch.rand(())) < self.prob:
            return images, padding_mask, targets
        beta = round(0.45 + 0.1 * float(torch.rand(())), 6)  # round(random.uniform(0.45, 0.55), 6)
        return mix_batch(images, padding_mask, targets, beta)

    def __repr__(self) -> str:
        return f"MixUpCollate({self.collate!r}, prob={self.prob}, epochs=[{self.start}, {self.end}])"


def mix_batch(images: torch.Tensor, padding_mask: torch.Tensor, targets: list[dict[str, Any]], beta: float
              ) -> Batch:
    """Image ``i`` → ``beta · image_i + (1 − beta) · image_{i−1}`` (the first mixed with the last), its targets
    its own then image ``i − 1``'s (see :class:`MixUpCollate`)."""
    previous = targets[-1:] + targets[:-1]
    images = images.roll(shifts=1, dims=0) * (1.0 - beta) + images * beta
    padding_mask = padding_mask & padding_mask.roll(shifts=1, dims=0)
    mixed = []
    for own, other in zip(targets, previous):
        target = dict(own)
        for key in ("boxes", "labels", "masks", "keypoints"):
            if key in own:
                target[key] = torch.cat([own[key], other[key]])
        mixed.append(target)
    return images, padding_mask, mixed
