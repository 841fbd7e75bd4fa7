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
image can end with no boxes. A call may add ``keypoints`` (float [P, 3] albumentations "xya" points,
:func:`keypoint_params`): they move with the image, stay in order when they leave it, and come back as
``"keypoints"`` (:mod:`detr.data.keypoints` turns them back into COCO keypoints; :class:`HorizontalFlip` mirrors
them as boxes are mirrored).

RT-DETR and D-FINE train on squares instead (:func:`make_square_transform`: the horizontal flip alone, or
:func:`make_rtdetr_train_transform`: the authors' photometric distortion, zoom-out, IoU crop, flip and resize;
docs/models/rtdetr.md, "The authors' augmentations").

All sizes are parameters so small-image data sets (e.g. the 128 px shapes set) can use small scales.
Randomness comes from albumentations' own generators, not the global ones: call
:func:`reseed_transform` in each DataLoader worker (the data module does) so workers do not repeat each
other's augmentations.
"""

from __future__ import annotations

import random
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
from torchvision.ops import box_iou

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


class HorizontalFlip(A.HorizontalFlip):
    """Albumentations' horizontal flip, with keypoints mirrored as boxes are: x → W − x (continuous pixel
    coordinates, COCO's) rather than albumentations' W − 1 − x (pixel indices). A keypoint's angle turns by
    180°, as albumentations' does (:mod:`detr.data.keypoints` reads it to swap left and right points)."""

    def apply_to_keypoints(self, keypoints: np.ndarray, **params: Any) -> np.ndarray:
        flipped = super().apply_to_keypoints(keypoints, **params)
        flipped[:, 0] += 1.0
        return flipped


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


class RandomZoomOut(A.Pad):
    """Put the image at a random place on a larger canvas of ``fill``: SSD's "expand", as torchvision v2's
    ``RandomZoomOut`` (RT-DETR's and D-FINE's, with its defaults).

    The canvas is ``int(W * r)`` × ``int(H * r)`` with ``r ~ U(side_range)``; the image's top-left corner is at
    ``int((canvas - side) * u)`` on each axis, ``u ~ U(0, 1)``. Boxes and masks move with the image (masks are
    padded with ``fill_mask``); no box changes its size in pixels.
    """

    def __init__(self, side_range: tuple[float, float] = (1.0, 4.0), fill: float = 0, fill_mask: float = 0,
                 p: float = 0.5) -> None:
        super().__init__(padding=0, fill=fill, fill_mask=fill_mask, border_mode=cv2.BORDER_CONSTANT, p=p)
        low, high = (float(v) for v in side_range)
        if not 1.0 <= low <= high:
            raise ValueError(f"RandomZoomOut side_range must be (low, high) with 1 <= low <= high, got {side_range}")
        self.side_range = (low, high)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        ratio = self.py_random.uniform(*self.side_range)
        canvas_width, canvas_height = int(width * ratio), int(height * ratio)
        left = int((canvas_width - width) * self.py_random.random())
        top = int((canvas_height - height) * self.py_random.random())
        return {"pad_top": top, "pad_bottom": canvas_height - height - top,
                "pad_left": left, "pad_right": canvas_width - width - left}

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("side_range", "fill", "fill_mask")


class RandomIoUCrop(BaseCrop):
    """SSD's crop with a minimum IoU, as torchvision v2's ``RandomIoUCrop`` (RT-DETR's and D-FINE's, p = 0.8).

    Draw a minimum IoU from ``min_ious``; a value >= 1 leaves the image as it is. Otherwise try ``trials`` crops:
    width and height ``int(side * U(min_scale, max_scale))`` each, the width / height ratio within
    ``aspect_ratio_range``, the top-left corner ``int((side - crop) * U(0, 1))``; a crop is taken when some box's
    centre lies strictly inside it and one of those boxes has IoU >= the minimum with it. After ``trials``
    failures a new minimum is drawn. Boxes whose centre lies outside the crop are dropped with their labels; the
    others are clipped to it. An image without boxes is left as it is (torchvision's search only ends there by
    drawing the "as it is" value).
    """

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        aspect_ratio_range: tuple[float, float] = (0.5, 2.0),
        min_ious: Sequence[float] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0),
        trials: int = 40,
        p: float = 0.8,
    ) -> None:
        super().__init__(p=p)
        if not 0 < min_scale <= max_scale <= 1:
            raise ValueError(f"RandomIoUCrop needs 0 < min_scale <= max_scale <= 1, got {min_scale}, {max_scale}")
        if max(min_ious, default=0.0) < 1.0:
            # the value that ends the search: without it an image no crop can satisfy would loop for ever
            raise ValueError(f"RandomIoUCrop min_ious must include 1.0 (leave the image as it is), got {min_ious}")
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.aspect_ratio_range = (float(aspect_ratio_range[0]), float(aspect_ratio_range[1]))
        self.min_ious = tuple(float(v) for v in min_ious)
        self.trials = int(trials)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        normalized = data.get("bboxes", ())  # [N, 4 + label columns]: xyxy in [0, 1]
        whole = {"crop_coords": (0, 0, width, height), "outside": np.zeros(len(normalized), bool)}
        if len(normalized) == 0:
            return whole
        scale = np.array([width, height, width, height], np.float32)
        boxes = torch.from_numpy(np.asarray(normalized, np.float32)[:, :4] * scale)  # pixel xyxy
        centre_x, centre_y = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        low_ratio, high_ratio = self.aspect_ratio_range
        while True:
            min_iou = self.py_random.choice(self.min_ious)
            if min_iou >= 1.0:
                return whole
            for _ in range(self.trials):
                crop_width = int(width * self.py_random.uniform(self.min_scale, self.max_scale))
                crop_height = int(height * self.py_random.uniform(self.min_scale, self.max_scale))
                if crop_width == 0 or crop_height == 0 or not low_ratio <= crop_width / crop_height <= high_ratio:
                    continue
                left = int((width - crop_width) * self.py_random.random())
                top = int((height - crop_height) * self.py_random.random())
                right, bottom = left + crop_width, top + crop_height
                inside = (left < centre_x) & (centre_x < right) & (top < centre_y) & (centre_y < bottom)
                if not inside.any():
                    continue
                crop = torch.tensor([[left, top, right, bottom]], dtype=boxes.dtype)
                if box_iou(boxes[inside], crop).max() < min_iou:
                    continue
                return {"crop_coords": (left, top, right, bottom), "outside": (~inside).numpy()}

    def apply_to_bboxes(self, bboxes: np.ndarray, crop_coords: tuple[int, int, int, int], outside: np.ndarray,
                        **params: Any) -> np.ndarray:
        cropped = super().apply_to_bboxes(bboxes, crop_coords, **params)
        cropped[outside, :4] = 0.0  # degenerate: the box filter drops them with their labels (torchvision's mark)
        return cropped

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("min_scale", "max_scale", "aspect_ratio_range", "min_ious", "trials")


def photometric_distort(p: float = 0.5) -> A.Sequential:
    """SSD's photometric distortion, as torchvision v2's ``RandomPhotometricDistort`` (RT-DETR's and D-FINE's,
    with its ranges): brightness × U(0.875, 1.125), contrast × U(0.5, 1.5), saturation × U(0.5, 1.5) and hue
    + U(-0.05, 0.05), each applied with probability ``p``, in that order but with contrast first or last (even
    odds); then the channels permuted at random with probability ``p``.

    Each adjustment is albumentations' ``ColorJitter`` with one range (torchvision's formulas; hue through
    OpenCV's HSV rather than Pillow's), the permutation its ``ChannelShuffle``. uint8 RGB in, uint8 out.
    """
    def jitter(**ranges: tuple[float, float]) -> A.ColorJitter:
        unchanged = {"brightness": (1.0, 1.0), "contrast": (1.0, 1.0), "saturation": (1.0, 1.0), "hue": (0.0, 0.0)}
        return A.ColorJitter(**{**unchanged, **ranges}, p=p)

    def contrast() -> A.ColorJitter:
        return jitter(contrast=(0.5, 1.5))

    def saturation_and_hue() -> list[A.ColorJitter]:
        return [jitter(saturation=(0.5, 1.5)), jitter(hue=(-0.05, 0.05))]

    contrast_first = A.Sequential([contrast(), *saturation_and_hue()], p=1.0)
    contrast_last = A.Sequential([*saturation_and_hue(), contrast()], p=1.0)
    # albumentations' Sequential and OneOf default to p = 0.5: each is set to always run
    return A.Sequential([jitter(brightness=(0.875, 1.125)), A.OneOf([contrast_first, contrast_last], p=1.0),
                         A.ChannelShuffle(p=p)], p=1.0)


def box_params(min_box_size: float = _MIN_BOX_SIDE) -> A.BboxParams:
    """Boxes as every transform here takes them: pixel xyxy with a "labels" field, clipped to the image, and
    dropped with their label once narrower or lower than ``min_box_size`` pixels after any step."""
    return A.BboxParams(
        format="pascal_voc",  # pixel xyxy
        label_fields=["labels"],
        clip=True,  # clip input boxes to the image before the first step
        # checked after every step (check_each_transform), in that step's pixels: a box clipped below
        # min_box_size on a side is dropped with its label
        min_width=min_box_size,
        min_height=min_box_size,
    )


def keypoint_params() -> A.KeypointParams:
    """Keypoints as every transform here takes them (optional: a call without ``keypoints`` moves none): "xya"
    pixel points, angle in degrees, kept in order when they leave the image (:mod:`detr.data.keypoints` marks
    those not labelled after the transform and reads the angle for the flips)."""
    return A.KeypointParams(format="xya", remove_invisible=False, angle_in_degrees=True)


def _to_tensor(normalize: bool = True) -> list[A.BasicTransform]:
    """ImageNet normalisation (or, ``normalize=False``, pixels / 255: the real-time DETRs') and a CHW tensor."""
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    return [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]


def make_square_transform(size: int, *, train: bool, normalize: bool = False, seed: int | None = None
                          ) -> A.Compose:
    """RT-DETR's input contract for training and evaluation: every image resized to ``size`` × ``size`` (the
    aspect ratio not kept; OpenCV's bilinear filter), pixels / 255 (ImageNet's mean and std with
    ``normalize``); ``train`` adds the horizontal flip (p = 0.5). Same call and output as
    :func:`make_train_transform`. The authors' training augmentations: :func:`make_rtdetr_train_transform`."""
    flip = [HorizontalFlip(p=0.5)] if train else []
    return _seeded(A.Compose([*flip, A.Resize(size, size, interpolation=cv2.INTER_LINEAR), *_to_tensor(normalize)],
                             bbox_params=box_params(), keypoint_params=keypoint_params()), seed)


def make_rtdetr_train_transform(size: int, *, augment: bool = True, zoom_and_crop: bool = True, normalize: bool = False,
                                seed: int | None = None) -> A.Compose:
    """RT-DETR's and D-FINE's training pipeline (the authors' ``include/dataloader.yml``; docs/models/rtdetr.md):
    :func:`photometric_distort` (p = 0.5), :class:`RandomZoomOut` (fill 0, p = 0.5), :class:`RandomIoUCrop`
    (p = 0.8), the horizontal flip (p = 0.5), the resize to ``size`` × ``size`` (OpenCV's bilinear filter, as
    :func:`make_square_transform`), pixels / 255 (ImageNet's mean and std with ``normalize``). Boxes smaller than
    1 px on a side after any step are dropped with their labels (the authors' ``SanitizeBoundingBoxes(min_size=1)``
    after the crop and after the resize).

    Args:
        size: the square's side (pixels).
        augment: False leaves out the three random operations (the authors' policy for the last epochs: flip and
            resize only; :class:`detr.data.training_epoch.StopAtEpoch` switches to it).
        zoom_and_crop: False leaves out the zoom-out and the IoU crop (DEIM's steps after a mosaic:
            :class:`detr.data.dense_o2o.DenseO2OTransform`).
        normalize: ImageNet's mean and std instead of pixels / 255.
        seed: seed of albumentations' generators (None: fresh entropy).

    Returns:
        the same call and output as :func:`make_train_transform`, images ``[3, size, size]``.
    """
    geometric = [RandomZoomOut(fill=0, p=0.5), RandomIoUCrop(p=0.8)] if zoom_and_crop else []
    random_ops = [photometric_distort(p=0.5), *geometric] if augment else []
    steps = [*random_ops, HorizontalFlip(p=0.5), A.Resize(size, size, interpolation=cv2.INTER_LINEAR)]
    return _seeded(A.Compose([*steps, *_to_tensor(normalize)], bbox_params=box_params(min_box_size=1.0),
                             keypoint_params=keypoint_params()), seed)


def make_rfdetr_train_transform(size: int, *, normalize: bool = True,
                                crop_resize_scales: Sequence[int] = CROP_RESIZE_SCALES,
                                crop_min_size: int = CROP_MIN_SIZE, crop_max_size: int = CROP_MAX_SIZE,
                                seed: int | None = None) -> A.Compose:
    """RF-DETR's and LW-DETR's training pipeline (roboflow/rf-detr ``datasets/coco.py``,
    ``make_coco_transforms_square_div_64``; docs/models/rfdetr.md): the horizontal flip (p = 0.5), then with p = 0.5
    either the resize to ``size`` × ``size``, or DETR's crop (shortest side to one of ``crop_resize_scales``, no
    long-side cap; a random crop whose width and height lie in [``crop_min_size``, ``crop_max_size``]) and that
    resize; ImageNet's mean and std (pixels / 255 without ``normalize``). The square resize is OpenCV's bilinear
    filter, as :func:`make_square_transform`.

    Returns the same call and output as :func:`make_train_transform`, images ``[3, size, size]``.
    """
    square = A.Resize(size, size, interpolation=cv2.INTER_LINEAR)
    return _seeded(A.Compose(
        [
            HorizontalFlip(p=0.5),
            A.OneOf(
                [
                    A.Resize(size, size, interpolation=cv2.INTER_LINEAR, p=0.5),
                    A.Sequential([ShortestSideResize(crop_resize_scales, max_size=None),
                                  RandomSizeCrop(crop_min_size, crop_max_size), square], p=0.5),
                ],
                p=1.0,
            ),
            *_to_tensor(normalize),
        ],
        bbox_params=box_params(), keypoint_params=keypoint_params(),
    ), seed)


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
    return _seeded(A.Compose(
        [
            HorizontalFlip(p=0.5),
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
        bbox_params=box_params(), keypoint_params=keypoint_params(),
    ), seed)


def make_eval_transform(*, min_size: int = EVAL_MIN_SIZE, max_size: int = EVAL_MAX_SIZE, normalize: bool = True
                        ) -> A.Compose:
    """The authors' eval transform: shortest side ``min_size``, long side at most ``max_size``, normalise.

    Same call and output as :func:`make_train_transform`; deterministic.
    """
    return A.Compose(
        [ShortestSideResize([min_size], max_size=max_size), *_to_tensor(normalize)], bbox_params=box_params(),
        keypoint_params=keypoint_params(),
    )


def make_normalize_transform() -> A.Compose:
    """No resize: ImageNet normalisation and CHW tensor only (same call and output as the others)."""
    # NoOp: a step that carries the boxes and keypoints
    return A.Compose([A.NoOp(), *_to_tensor()], bbox_params=box_params(), keypoint_params=keypoint_params())


def denormalize(image: torch.Tensor) -> torch.Tensor:
    """Undo the ImageNet normalisation: float ``[3, H, W]`` → uint8 ``[3, H, W]`` (0..255) on the same device,
    the pixels the model saw (after resizing; :meth:`detr.models.inputs.InputSpec.denormalize`)."""
    return InputSpec().denormalize(image)


def reseed_transform(transform: Any, seed: int) -> None:
    """Give ``transform`` (an albumentations Compose or transform) new generators from ``seed``.

    DataLoader workers start with copies of one generator state, so without this every worker draws the
    same flips, scales and crops. Every transform in the tree gets the same two generator objects (numpy's and
    Python's), one stream that they draw from in turn: albumentations' own ``set_random_seed`` gives each
    transform a generator of the same seed, so transforms that draw alike decide alike (two p = 0.5 steps
    always both run or both skip). Other objects: their ``set_random_seed``, if any.
    """
    seed %= 2**32
    if isinstance(transform, (A.BaseCompose, A.BasicTransform)):
        transform.set_random_state(np.random.default_rng(seed), random.Random(seed))
    elif hasattr(transform, "set_random_seed"):
        transform.set_random_seed(seed)


def _seeded(transform: A.Compose, seed: int | None) -> A.Compose:
    """``transform`` on one stream from ``seed`` (:func:`reseed_transform`); None keeps its fresh entropy."""
    if seed is not None:
        reseed_transform(transform, seed)
    return transform


__all__ = [
    "CROP_MAX_SIZE",
    "CROP_MIN_SIZE",
    "CROP_RESIZE_SCALES",
    "EVAL_MAX_SIZE",
    "EVAL_MIN_SIZE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RandomIoUCrop",
    "RandomSizeCrop",
    "RandomZoomOut",
    "ShortestSideResize",
    "TRAIN_MAX_SIZE",
    "TRAIN_SCALES",
    "box_params",
    "keypoint_params",
    "HorizontalFlip",
    "denormalize",
    "photometric_distort",
    "make_eval_transform",
    "make_normalize_transform",
    "make_rtdetr_train_transform",
    "make_square_transform",
    "make_train_transform",
    "reseed_transform",
    "resize_shape",
]
