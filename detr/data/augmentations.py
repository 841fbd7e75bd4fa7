"""The training augmentations by name (``--data.augmentation``): what each needs, the pipeline it builds, and what
it does with multi-scale batches, mosaics, MixUp and the stop epoch. The data module looks a name up here
(:func:`augmentation_named`) and asks the record, never the name.

- "default": the paper's DETR (flip, random resizes and crop: :func:`detr.data.transforms.make_train_transform`),
  or with a square size the flip and the square resize alone.
- "rtdetr": RT-DETR's and D-FINE's (photometric distortion, zoom-out, IoU crop, flip, the square resize:
  :func:`detr.data.transforms.make_rtdetr_train_transform`; from the stop epoch on, the flip and the resize only).
- "rfdetr": RF-DETR's and LW-DETR's (flip, then the square resize or DETR's crop and the square resize:
  :func:`detr.data.transforms.make_rfdetr_train_transform`), trained at the largest multi-scale side, batches
  resized bilinearly; from the stop epoch on, the flip and the square resize.
- "deim": DEIM's dense one-to-one over RT-DETR's (Mosaic in its epochs: :class:`detr.data.dense_o2o.
  DenseO2OTransform`, drawn from the training set, boxes only; MixUp of batches: :class:`detr.data.dense_o2o.
  MixUpCollate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from detr.data.dense_o2o import DenseO2OTransform
from detr.data.training_epoch import SharedEpoch, StopAtEpoch
from detr.data.transforms import (
    make_rfdetr_train_transform,
    make_rtdetr_train_transform,
    make_square_transform,
    make_train_transform,
)

#: ``--data.augmentation``'s values (the names of :data:`AUGMENTATIONS`).
AugmentationName = Literal["default", "rtdetr", "rfdetr", "deim"]


@dataclass(frozen=True)
class TrainingInput:
    """What a training pipeline is built from: the data module's checked settings.

    square_size: the square side in pixels, or None (DETR's aspect-preserving resizes); normalize: ImageNet's mean
    and std (else pixels / 255); sizes: the transforms' sizes (``train_scales``, ``train_max_size``,
    ``crop_resize_scales``, ``crop_min_size``, ``crop_max_size``, in pixels); multi_scale: the batches' square
    sides, or None; stop_epoch: the first epoch (0-based) without the strong augmentations, or None; epoch: the
    training epoch as the loader's workers see it; mosaic_epochs (start, end) and mosaic_prob: DEIM's mosaic.
    """

    square_size: int | None
    normalize: bool
    sizes: dict[str, Any]
    multi_scale: Sequence[int] | None
    stop_epoch: int | None
    epoch: SharedEpoch
    mosaic_epochs: tuple[int, int]
    mosaic_prob: float


@dataclass(frozen=True)
class Augmentation:
    """One training augmentation.

    Attributes:
        name: its ``--data.augmentation`` value.
        train_transform: its training pipeline, built from the data module's :class:`TrainingInput` (the same call
            and output as :func:`detr.data.transforms.make_train_transform`; it follows the stop epoch itself).
        authors_square_size: the square side its authors train at (pixels), the example of the error when
            ``--data.square_size`` is missing; None: it needs no square.
        multi_scale_mode: how a multi-scale batch is resized to its side ("nearest" or "bilinear", the authors').
        mosaic: its pipeline draws mosaics from the training set (:meth:`DenseO2OTransform.draw_from`): a detection
            set of boxes only (no masks), and the mosaic's epochs end at the stop epoch.
        mixup: training batches are mixed (:class:`detr.data.dense_o2o.MixUpCollate`).
    """

    name: str
    train_transform: Callable[[TrainingInput], Any]
    authors_square_size: int | None = None
    multi_scale_mode: Literal["nearest", "bilinear"] = "nearest"
    mosaic: bool = False
    mixup: bool = False

    @property
    def needs_square_size(self) -> bool:
        """Whether it resizes to a square (``--data.square_size`` required)."""
        return self.authors_square_size is not None


def _default(settings: TrainingInput) -> Any:
    if settings.square_size is not None:
        return make_square_transform(settings.square_size, train=True, normalize=settings.normalize)
    sizes = settings.sizes
    return make_train_transform(scales=sizes["train_scales"], max_size=sizes["train_max_size"],
                                crop_resize_scales=sizes["crop_resize_scales"], crop_min_size=sizes["crop_min_size"],
                                crop_max_size=sizes["crop_max_size"], normalize=settings.normalize)


def _square_size(settings: TrainingInput) -> int:
    assert settings.square_size is not None, "checked by augmentation_named's caller (needs_square_size)"
    return settings.square_size


def _stopping(augmented: Any, plain: Callable[[], Any], settings: TrainingInput) -> Any:
    """``augmented`` until the stop epoch, then ``plain()``; ``augmented`` alone without a stop epoch."""
    if settings.stop_epoch is None:
        return augmented
    return StopAtEpoch(augmented, plain(), stop_epoch=settings.stop_epoch, epoch=settings.epoch)


def _rtdetr(settings: TrainingInput) -> Any:
    size = _square_size(settings)
    return _stopping(make_rtdetr_train_transform(size, normalize=settings.normalize),
                     lambda: make_rtdetr_train_transform(size, augment=False, normalize=settings.normalize), settings)


def _rfdetr(settings: TrainingInput) -> Any:
    size, sizes = _square_size(settings), settings.sizes
    # the authors resize to their largest scale, then every batch to one of the scales (engine.py)
    train_size = max(settings.multi_scale) if settings.multi_scale is not None else size
    augmented = make_rfdetr_train_transform(train_size, normalize=settings.normalize,
                                            crop_resize_scales=sizes["crop_resize_scales"],
                                            crop_min_size=sizes["crop_min_size"], crop_max_size=sizes["crop_max_size"])
    return _stopping(augmented, lambda: make_square_transform(size, train=True, normalize=settings.normalize),
                     settings)


def _deim(settings: TrainingInput) -> Any:
    # the mosaic draws its other images from the training set: bound to it when the data set is built
    return DenseO2OTransform(_square_size(settings), epoch=settings.epoch, mosaic_epochs=settings.mosaic_epochs,
                             stop_epoch=settings.stop_epoch, mosaic_prob=settings.mosaic_prob,
                             normalize=settings.normalize)


#: Every training augmentation, by name: the one table ``--data.augmentation`` reads.
AUGMENTATIONS: dict[str, Augmentation] = {augmentation.name: augmentation for augmentation in (
    Augmentation("default", _default),
    Augmentation("rtdetr", _rtdetr, authors_square_size=640),
    Augmentation("rfdetr", _rfdetr, authors_square_size=560, multi_scale_mode="bilinear"),
    Augmentation("deim", _deim, authors_square_size=640, mosaic=True, mixup=True),
)}


def augmentation_named(name: str) -> Augmentation:
    """The :class:`Augmentation` called ``name``; a ValueError naming ``--data.augmentation``'s values otherwise."""
    if not isinstance(name, str) or name not in AUGMENTATIONS:
        names = list(AUGMENTATIONS)
        choices = ", ".join(repr(known) for known in names[:-1]) + f" or {names[-1]!r}"
        raise ValueError(f"--data.augmentation must be {choices}, got {name!r}")
    return AUGMENTATIONS[name]
