"""The authors' train and eval transforms, built with albumentations (paper section 4 and appendix A.4; the authors'
datasets/coco.py and datasets/transforms.py).

Train: horizontal flip (p = 0.5); then, with equal probability, either (a) resize the shortest side to one
of ``scales`` with the long side at most ``max_size``, or (b) resize the shortest side to one of
``crop_resize_scales``, crop a random region whose width and height are random integers in
``[crop_min_size, min(side, crop_max_size)]``, then (a). Eval: shortest side ``min_size``, long side at
most ``max_size``. Both end with ImageNet normalisation and a CHW float tensor.

Every transform is called as ``t(image=uint8 [H, W, 3] RGB, bboxes=float32 [N, 4] pixel xyxy, labels=[N])``
and returns ``{"image": float32 tensor [3, h, w], "bboxes": [M, 4] pixel xyxy in the output image,
"labels": [M]}``. Boxes go through albumentations' bbox support (``pascal_voc`` format = pixel xyxy):
after every step they are clipped to the image, and a box the crop leaves with no width or height is
dropped together with its label (the authors keep a box iff x1 > x0 and y1 > y0 after clamping), so an
image can end with no boxes.

All sizes are parameters so small-image data sets (e.g. the 128 px shapes set) can use small scales.
Randomness comes from albumentations' own generators, not the global ones: call
:func:`reseed_transform` in each DataLoader worker (the data module does) so workers do not repeat each
other's augmentations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.augmentations.geometric import functional as fgeometric
from albumentations.core.type_definitions import Targets
from albumentations.pytorch import ToTensorV2

from detr.models.inputs import EVAL_MAX_SIZE, EVAL_MIN_SIZE, IMAGENET_MEAN, IMAGENET_STD, InputSpec, resize_shape

#: Authors' defaults.
TRAIN_SCALES: tuple[int, ...] = tuple(range(480, 801, 32))  # 480, 512, ..., 800
TRAIN_MAX_SIZE = 1333
CROP_RESIZE_SCALES: tuple[int, ...] = (400, 500, 600)
CROP_MIN_SIZE = 384
CROP_MAX_SIZE = 600

# A box narrower or lower than this (pixels) after clipping counts as emptied by the crop. Albumentations
# keeps zero-width boxes when the threshold is 0, so it must be positive; 1e-3 px is "> 0" in float32.
_MIN_BOX_SIDE = 1e-3


class ShortestSideResize(A.DualTransform):
    """Resize so the shortest side is one of ``sizes`` (chosen at random) and the long side <= ``max_size``.

    Output size from :func:`resize_shape` (the authors' rounding). Boxes are stored normalised inside
    albumentations, so a resize leaves them unchanged there.
    """

    _targets = (Targets.IMAGE, Targets.MASK, Targets.BBOXES, Targets.KEYPOINTS)

    def __init__(
        self,
        sizes: Sequence[int],
        max_size: int | None = None,
        interpolation: int = cv2.INTER_LINEAR,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        sizes = [int(s) for s in sizes]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"ShortestSideResize sizes must be a non-empty list of positive ints, got {sizes}")
        if max_size is not None and max_size < max(sizes):
            raise ValueError(
                f"ShortestSideResize max_size={max_size} is below the largest shortest-side size {max(sizes)}; "
                "raise max_size or lower the sizes"
            )
        self.sizes = sizes
        self.max_size = max_size
        self.interpolation = interpolation

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        size = self.py_random.choice(self.sizes)
        # the authors' rounding (resize_shape), refusing an image so thin that a side would be 0 px
        return {"target_shape": InputSpec(size=size, max_size=self.max_size).resized_shape(height, width)}

    def apply(self, img: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return fgeometric.resize(img, target_shape, interpolation=self.interpolation)

    def apply_to_mask(self, mask: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return fgeometric.resize(mask, target_shape, interpolation=cv2.INTER_NEAREST)

    def apply_to_bboxes(self, bboxes: np.ndarray, **params: Any) -> np.ndarray:
        return bboxes  # normalised coordinates are scale invariant

    def apply_to_keypoints(self, keypoints: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        height, width = params["shape"][:2]
        return fgeometric.keypoints_scale(keypoints, target_shape[1] / width, target_shape[0] / height)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("sizes", "max_size", "interpolation")


class RandomSizeCrop(BaseCrop):
    """Crop a random region of random size: width ~ randint(min_size, min(W, max_size)), same for height.

    The authors' ``RandomSizeCrop``. An image side below ``min_size`` (possible with custom scales) is kept
    whole on that axis instead of failing.
    """

    def __init__(self, min_size: int, max_size: int, p: float = 1.0) -> None:
        super().__init__(p=p)
        if min_size < 1 or max_size < min_size:
            raise ValueError(
                f"RandomSizeCrop needs 1 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}"
            )
        self.min_size = min_size
        self.max_size = max_size

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        crop_width = self.py_random.randint(min(self.min_size, width), min(width, self.max_size))
        crop_height = self.py_random.randint(min(self.min_size, height), min(height, self.max_size))
        x0 = self.py_random.randint(0, width - crop_width)
        y0 = self.py_random.randint(0, height - crop_height)
        return {"crop_coords": (x0, y0, x0 + crop_width, y0 + crop_height)}

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("min_size", "max_size")


def _bbox_params() -> A.BboxParams:
    return A.BboxParams(
        format="pascal_voc",  # pixel xyxy
        label_fields=["labels"],
        clip=True,  # clip input boxes to the image before the first step
        min_width=_MIN_BOX_SIDE,
        min_height=_MIN_BOX_SIDE,
    )


def _to_tensor(normalize: bool = True) -> list[A.BasicTransform]:
    """ImageNet normalisation (or, ``normalize=False``, pixels / 255: the real-time DETRs') and a CHW tensor."""
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    return [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]


def make_square_transform(size: int, *, train: bool, normalize: bool = False, seed: int | None = None
                          ) -> A.Compose:
    """RT-DETR's input contract for training and evaluation: every image resized to ``size`` × ``size`` (the
    aspect ratio not kept; OpenCV's bilinear filter), pixels / 255 (ImageNet's mean and std with
    ``normalize``); ``train`` adds the horizontal flip (p = 0.5). Same call and output as
    :func:`make_train_transform`. (The authors' photometric distortion, zoom-out, IoU crop and multi-scale
    batches are not here: docs/rtdetr.md.)"""
    flip = [A.HorizontalFlip(p=0.5)] if train else []
    return A.Compose([*flip, A.Resize(size, size, interpolation=cv2.INTER_LINEAR), *_to_tensor(normalize)],
                     bbox_params=_bbox_params(), seed=seed)


def make_train_transform(
    *,
    scales: Sequence[int] = TRAIN_SCALES,
    max_size: int = TRAIN_MAX_SIZE,
    crop_resize_scales: Sequence[int] = CROP_RESIZE_SCALES,
    crop_min_size: int = CROP_MIN_SIZE,
    crop_max_size: int = CROP_MAX_SIZE,
    seed: int | None = None,
    normalize: bool = True,
) -> A.Compose:
    """The authors' train augmentation (defaults) or the same recipe at other sizes.

    Args:
        scales: shortest-side sizes for the multi-scale resize (authors: 480, 512, ..., 800).
        max_size: cap on the long side after that resize (authors: 1333).
        crop_resize_scales: shortest-side sizes before the random crop (authors: 400, 500, 600); these
            resizes have no long-side cap, as in the authors' code.
        crop_min_size, crop_max_size: range of the crop's width and height (authors: 384, 600).
        seed: seed of albumentations' generators (None: fresh entropy).
        normalize: ImageNet's mean and std (False: pixels / 255).

    Returns:
        albumentations Compose: ``t(image=uint8 [H, W, 3], bboxes=float32 [N, 4] pixel xyxy, labels=[N])``
        → ``{"image": float32 [3, h, w] normalised, "bboxes": [M, 4] pixel xyxy, "labels": [M]}``.
    """
    multi_scale = ShortestSideResize(scales, max_size=max_size)
    return A.Compose(
        [
            A.HorizontalFlip(p=0.5),
            A.OneOf(
                [
                    ShortestSideResize(scales, max_size=max_size, p=0.5),
                    A.Sequential(
                        [
                            ShortestSideResize(crop_resize_scales, max_size=None),
                            RandomSizeCrop(crop_min_size, crop_max_size),
                            multi_scale,
                        ],
                        p=0.5,
                    ),
                ],
                p=1.0,
            ),
            *_to_tensor(normalize),
        ],
        bbox_params=_bbox_params(),
        seed=seed,
    )


def make_eval_transform(*, min_size: int = EVAL_MIN_SIZE, max_size: int = EVAL_MAX_SIZE, normalize: bool = True
                        ) -> A.Compose:
    """The authors' eval transform: shortest side ``min_size``, long side at most ``max_size``, normalise.

    Same call and output as :func:`make_train_transform`; deterministic.
    """
    return A.Compose(
        [ShortestSideResize([min_size], max_size=max_size), *_to_tensor(normalize)], bbox_params=_bbox_params()
    )


def make_normalize_transform() -> A.Compose:
    """No resize: ImageNet normalisation and CHW tensor only (same call and output as the others)."""
    return A.Compose([A.NoOp(), *_to_tensor()], bbox_params=_bbox_params())  # NoOp: a step that carries the boxes


def denormalize(image: torch.Tensor) -> torch.Tensor:
    """Undo the ImageNet normalisation: float ``[3, H, W]`` → uint8 ``[3, H, W]`` (0..255) on the same device,
    the pixels the model saw (after resizing; :meth:`detr.models.inputs.InputSpec.denormalize`)."""
    return InputSpec().denormalize(image)


def reseed_transform(transform: Any, seed: int) -> None:
    """Give ``transform`` (an albumentations Compose or transform) new generators from ``seed``.

    DataLoader workers start with copies of one generator state, so without this every worker draws the
    same flips, scales and crops. A no-op for objects without ``set_random_seed``.
    """
    if hasattr(transform, "set_random_seed"):
        transform.set_random_seed(seed % 2**32)


__all__ = [
    "CROP_MAX_SIZE",
    "CROP_MIN_SIZE",
    "CROP_RESIZE_SCALES",
    "EVAL_MAX_SIZE",
    "EVAL_MIN_SIZE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RandomSizeCrop",
    "ShortestSideResize",
    "TRAIN_MAX_SIZE",
    "TRAIN_SCALES",
    "denormalize",
    "make_eval_transform",
    "make_normalize_transform",
    "make_square_transform",
    "make_train_transform",
    "reseed_transform",
    "resize_shape",
]
