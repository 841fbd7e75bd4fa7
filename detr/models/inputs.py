"""The input contract: what a detector takes, beside the model, without the training image pipeline.

Every :class:`detr.models.Detector` states its :class:`InputSpec` (``model.input_spec``): how an image is
resized (the authors' shortest side with a longest-side cap, or a fixed square), normalised (ImageNet mean
and std, or pixels / 255 alone) and batched (zero padding at the bottom and right with a padding mask,
True = padding: the authors' NestedTensor). The Predictor, ``detr-serve``, the explorer and the data
pipeline's collate all use it, so a new family with another contract (the real-time DETRs: a 640 square,
no mean and std) states it once, here, and everything that feeds a model follows.

Resizing uses OpenCV's bilinear filter (the one albumentations' training and evaluation transforms run), so
:meth:`InputSpec.prepare` gives exactly the tensor the evaluation transform gives (tests/models/test_inputs.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

#: ImageNet's per-channel mean and standard deviation (RGB, pixels in [0, 1]), which the ResNet backbones expect.
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
#: The authors' evaluation resize: shortest side 800, longest at most 1333.
EVAL_MIN_SIZE, EVAL_MAX_SIZE = 800, 1333

Resize = Literal["shortest_side", "square"]
#: The resize filter: "opencv" (OpenCV's bilinear, what albumentations' transforms run) or "antialiased"
#: (torchvision's antialiased bilinear on uint8, PIL's filter: what transformers' image processors run) or
#: "float_bilinear" (bilinear without antialiasing on pixels / 255, before the normalisation: transformers'
#: ``RfDetrImageProcessor``, which rescales, then resizes, then normalises).
Interpolation = Literal["opencv", "antialiased", "float_bilinear"]


def resize_shape(height: int, width: int, min_size: int, max_size: int | None) -> tuple[int, int]:
    """Output (height, width) of the authors' shortest-side resize, with their rounding.

    The shortest side becomes ``min_size`` unless the long side would then exceed ``max_size``; in that
    case the short side becomes ``round(max_size * short / long)``. The long side is truncated
    (``int(size * long / short)``), as in the authors' ``get_size_with_aspect_ratio``.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got height={height}, width={width}")
    size = min_size
    if max_size is not None:
        short, long = float(min(height, width)), float(max(height, width))
        if long / short * size > max_size:
            size = int(round(max_size * short / long))
    if (width <= height and width == size) or (height <= width and height == size):
        return height, width
    if width < height:
        return int(size * height / width), size
    return size, int(size * width / height)


def pad_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad CHW images at the bottom and right to a common size.

    Args:
        images: B tensors [C, h_i, w_i] (same C and dtype).

    Returns:
        (batch [B, C, max h, max w] with the images' dtype, padding_mask bool [B, max h, max w], True = padding).
    """
    if len(images) == 0:
        raise ValueError("cannot batch zero images")
    channels = {image.shape[0] for image in images}
    if len(channels) != 1 or any(image.dim() != 3 for image in images):
        raise ValueError(f"images must all be [C, H, W] with the same C, got shapes {[tuple(i.shape) for i in images]}")
    height = max(image.shape[1] for image in images)
    width = max(image.shape[2] for image in images)
    batch = images[0].new_zeros((len(images), images[0].shape[0], height, width))
    mask = torch.ones((len(images), height, width), dtype=torch.bool, device=images[0].device)
    for i, image in enumerate(images):
        h, w = image.shape[1:]
        batch[i, :, :h, :w] = image
        mask[i, :h, :w] = False
    return batch, mask


@dataclass(frozen=True)
class InputSpec:
    """How images become a detector's input batch.

    resize: "shortest_side" (shortest side ``size``, longest at most ``max_size``: the paper's DETR and
        Deformable DETR) or "square" (``size`` × ``size``, the aspect ratio not kept: the real-time DETRs).
    size, max_size: the resize's sizes (800, 1333); ``max_size`` is unused by "square".
    mean, std: per-channel RGB normalisation of pixels in [0, 1] (ImageNet's); None for both: pixels / 255.
    interpolation: the resize filter, "opencv" (bilinear, as the training pipeline), "antialiased" (as
        transformers' image processors: a model converted from there sees the pixels it was validated on) or
        "float_bilinear" (as ``RfDetrImageProcessor``: bilinear on floats, not antialiased, not rounded).
    """

    resize: Resize = "shortest_side"
    size: int = EVAL_MIN_SIZE
    max_size: int | None = EVAL_MAX_SIZE
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    interpolation: Interpolation = "opencv"

    def __post_init__(self) -> None:
        if self.resize not in ("shortest_side", "square"):
            raise ValueError(f"InputSpec resize must be 'shortest_side' or 'square', got {self.resize!r}")
        if int(self.size) < 1 or (self.max_size is not None and int(self.max_size) < int(self.size)):
            raise ValueError(f"InputSpec needs 1 <= size <= max_size, got size={self.size}, max_size={self.max_size}")
        if self.interpolation not in ("opencv", "antialiased", "float_bilinear"):
            raise ValueError(f"InputSpec interpolation must be 'opencv', 'antialiased' or 'float_bilinear', got "
                             f"{self.interpolation!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("InputSpec takes mean and std together (both None: pixels / 255)")

    def replace(self, **changes: object) -> InputSpec:
        return dataclasses.replace(self, **changes)

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of ``height`` × ``width`` pixels is resized to.

        Raises:
            ValueError: the image is so thin that a side would be 0 px (OpenCV would fail with a message that
                names neither the image nor the size).
        """
        if self.resize == "square":
            if height < 1 or width < 1:
                raise ValueError(f"image size must be positive, got height={height}, width={width}")
            return self.size, self.size
        shape = resize_shape(height, width, self.size, self.max_size)
        if min(shape) < 1:
            raise ValueError(f"a {width}×{height} image is too thin to resize: with the long side at most "
                             f"{self.max_size} px its short side would be 0 px; crop or pad it to a less extreme "
                             "aspect ratio")
        return shape

    def normalize(self, image: np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 RGB [H, W, 3] (array or tensor) → float32 [3, H, W]: ``(pixel - 255 mean) / (255 std)`` in
        float32, as albumentations' Normalize computes it (a per-channel table of the 256 values), or pixels
        / 255 without mean and std."""
        # np.asarray(PIL image) is read-only, which torch warns about: such an array is copied
        pixels = torch.as_tensor(np.require(image, requirements=["C", "W"]) if isinstance(image, np.ndarray) else image)
        if pixels.dtype != torch.uint8 or pixels.dim() != 3 or pixels.shape[-1] != 3:
            raise ValueError(f"expected a uint8 RGB image [H, W, 3], got {pixels.dtype} {tuple(pixels.shape)}")
        values = torch.arange(256, dtype=torch.float32)
        if self.mean is None:
            tables = (values / 255.0).expand(3, 256)
        else:
            mean = torch.tensor(self.mean, dtype=torch.float32) * 255.0
            denominator = torch.reciprocal(torch.tensor(self.std, dtype=torch.float32) * 255.0)
            tables = (values[None] - mean[:, None]) * denominator[:, None]
        return torch.stack([tables[c][pixels[..., c].long()] for c in range(3)])

    def prepare(self, image: np.ndarray) -> torch.Tensor:
        """uint8 RGB [H, W, 3] → the model's float32 [3, h, w]: resized (the :attr:`interpolation` filter), then
        normalised."""
        height, width = int(image.shape[0]), int(image.shape[1])
        target = self.resized_shape(height, width)
        if self.interpolation == "float_bilinear":
            return self._prepare_floats(image, target)
        if target != (height, width) and self.interpolation == "antialiased":
            from torchvision.transforms.v2 import InterpolationMode
            from torchvision.transforms.v2.functional import resize

            pixels = torch.from_numpy(np.require(image, requirements=["C", "W"])).permute(2, 0, 1)
            image = resize(pixels, list(target), interpolation=InterpolationMode.BILINEAR, antialias=True)
            image = image.permute(1, 2, 0)
        elif target != (height, width):
            import cv2  # OpenCV comes with albumentations; imported here so that `import detr` stays light

            image = cv2.resize(np.ascontiguousarray(image), (target[1], target[0]), interpolation=cv2.INTER_LINEAR)
        return self.normalize(image)

    def _prepare_floats(self, image: np.ndarray, target: tuple[int, int]) -> torch.Tensor:
        """"float_bilinear": pixels / 255, resized (bilinear, no antialiasing), then normalised, all in float32."""
        from torchvision.transforms.v2.functional import resize

        pixels = torch.from_numpy(np.require(image, requirements=["C", "W"])).permute(2, 0, 1).float() * (1 / 255)
        if target != tuple(pixels.shape[-2:]):
            pixels = resize(pixels, list(target), antialias=False)
        if self.mean is None:
            return pixels.contiguous()
        mean, std = torch.tensor(self.mean)[:, None, None], torch.tensor(self.std)[:, None, None]
        return ((pixels - mean) / std).contiguous()

    def batch(self, images: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
        """uint8 RGB arrays → (images [B, 3, H, W], padding_mask [B, H, W], each image's (h, w) after resizing)."""
        tensors = [self.prepare(image) for image in images]
        batch, padding_mask = pad_images(tensors)
        return batch, padding_mask, [(int(t.shape[1]), int(t.shape[2])) for t in tensors]

    def denormalize(self, image: torch.Tensor) -> torch.Tensor:
        """Undo the normalisation: float [3, H, W] → uint8 [3, H, W] (0..255) on the same device, the pixels the
        model saw (after resizing)."""
        image = image.detach().float()
        if self.mean is not None:
            mean = torch.tensor(self.mean, device=image.device).view(3, 1, 1)
            std = torch.tensor(self.std, device=image.device).view(3, 1, 1)
            image = image * std + mean
        return image.mul(255).round().clamp(0, 255).to(torch.uint8)


__all__ = ["EVAL_MAX_SIZE", "EVAL_MIN_SIZE", "IMAGENET_MEAN", "IMAGENET_STD", "InputSpec", "pad_images",
           "resize_shape"]
