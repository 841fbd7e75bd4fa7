"""The training augmentations as records (detr.data.augmentations): one table, looked up by name; each record
builds the pipeline its builder functions build, and says what the data module does around it."""

from __future__ import annotations

from typing import get_args

import pytest

from detr.data.augmentations import AUGMENTATIONS, AugmentationName, TrainingInput, augmentation_named
from detr.data.dense_o2o import DenseO2OTransform
from detr.data.training_epoch import SharedEpoch, StopAtEpoch
from detr.data.transforms import (
    CROP_MAX_SIZE,
    CROP_MIN_SIZE,
    CROP_RESIZE_SCALES,
    TRAIN_MAX_SIZE,
    TRAIN_SCALES,
    make_rfdetr_train_transform,
    make_rtdetr_train_transform,
    make_square_transform,
    make_train_transform,
)

#: the transforms' sizes as the data module hands them over (its defaults: the authors')
SIZES = {"train_scales": list(TRAIN_SCALES), "train_max_size": TRAIN_MAX_SIZE,
         "crop_resize_scales": list(CROP_RESIZE_SCALES), "crop_min_size": CROP_MIN_SIZE, "crop_max_size": CROP_MAX_SIZE}


def settings(**changes: object) -> TrainingInput:
    values = {"square_size": 64, "normalize": False, "sizes": dict(SIZES), "multi_scale": None,
              "stop_epoch": None, "epoch": SharedEpoch(), "mosaic_epochs": (4, 29), "mosaic_prob": 0.5}
    return TrainingInput(**{**values, **changes})


def test_the_cli_values_are_the_table() -> None:
    assert list(get_args(AugmentationName)) == list(AUGMENTATIONS) == ["default", "rtdetr", "rfdetr", "deim"]
    assert all(name == record.name for name, record in AUGMENTATIONS.items())


def test_an_unknown_name_is_one_line_naming_the_choices() -> None:
    for name in ("rt-detr", ["rtdetr"], None):
        with pytest.raises(ValueError, match=r"^--data.augmentation must be 'default', 'rtdetr', 'rfdetr' or "
                                             r"'deim', got") as error:
            augmentation_named(name)
        assert "\n" not in str(error.value)


def test_what_each_augmentation_needs_and_does() -> None:
    default, rtdetr, rfdetr, deim = (augmentation_named(name) for name in ("default", "rtdetr", "rfdetr", "deim"))
    assert not default.needs_square_size and default.authors_square_size is None
    assert (rtdetr.authors_square_size, rfdetr.authors_square_size, deim.authors_square_size) == (640, 560, 640)
    assert [record.multi_scale_mode for record in (default, rtdetr, rfdetr, deim)] == [
        "nearest", "nearest", "bilinear", "nearest"]
    assert [(record.mosaic, record.mixup) for record in (default, rtdetr, rfdetr, deim)] == [
        (False, False), (False, False), (False, False), (True, True)]


def test_each_record_builds_its_builders_pipeline() -> None:
    sizes = SIZES
    crop = {"crop_resize_scales": sizes["crop_resize_scales"], "crop_min_size": sizes["crop_min_size"],
            "crop_max_size": sizes["crop_max_size"]}
    expected = {
        ("default", None): make_train_transform(scales=sizes["train_scales"], max_size=sizes["train_max_size"],
                                                normalize=False, **crop),
        ("default", 64): make_square_transform(64, train=True, normalize=False),
        ("rtdetr", 64): make_rtdetr_train_transform(64, normalize=False),
        ("rfdetr", 64): make_rfdetr_train_transform(64, normalize=False, **crop),
    }
    for (name, square), pipeline in expected.items():
        built = augmentation_named(name).train_transform(settings(square_size=square))
        assert repr(built) == repr(pipeline), name
    # RF-DETR trains at the largest multi-scale side; every stop epoch switches to the plain flip and resize
    built = augmentation_named("rfdetr").train_transform(settings(multi_scale=[64, 96], stop_epoch=3))
    assert isinstance(built, StopAtEpoch) and built.stop_epoch == 3
    assert repr(built.augmented) == repr(make_rfdetr_train_transform(96, normalize=False, **crop))
    assert repr(built.plain) == repr(make_square_transform(64, train=True, normalize=False))
    built = augmentation_named("rtdetr").train_transform(settings(stop_epoch=3))
    assert repr(built.plain) == repr(make_rtdetr_train_transform(64, augment=False, normalize=False))
    built = augmentation_named("deim").train_transform(settings(stop_epoch=50))
    assert isinstance(built, DenseO2OTransform)
