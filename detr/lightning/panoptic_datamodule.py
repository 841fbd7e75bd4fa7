"""LightningDataModule over COCO-panoptic-format data: images with mask targets for both stages of the
authors' panoptic recipe (paper §4.4).

Data comes from ``root`` in COCO's layout::

    ROOT/train2017/  ROOT/val2017/
    ROOT/annotations/panoptic_{train,val}2017.json  ROOT/annotations/panoptic_{train,val}2017/*.png

or from explicit image folders and jsons (the PNG folder is the json's path without ``.json``). Every
segment, thing or stuff, is a target with its box and mask (:class:`detr.data.coco_panoptic.CocoPanoptic`),
so the same module feeds the box stage (boxes of things and stuff) and the mask stage.

The category map is read from the json in ``__init__`` (COCO panoptic: the raw ids 1–200 as labels in
250 classes, as the authors' panoptic models; other sets: contiguous labels), with ``is_thing`` per label
and the json's ``categories`` for PQ; the CLI links them into the model. At setup every split is checked
(:mod:`detr.data.panoptic_checks`): a missing image or PNG and a segment id its PNG lacks stop the run
with the file named, before the first step.

``val_dataset.coco`` is the box ground truth COCOeval scores box AP against: every segment's box from
``segments_info`` (things and stuff, crowd marked).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning
import torch
from torch.utils.data import DataLoader

from detr.categories import CategoryMap
from detr.data.coco import coco_from_dict, load_coco_json
from detr.data.coco_panoptic import CocoPanoptic, is_coco_panoptic
from detr.data.collate import collate_detection
from detr.data.panoptic_checks import PngCheck, check_panoptic_split, raise_for_problems
from detr.data.transforms import (
    CROP_MAX_SIZE,
    CROP_MIN_SIZE,
    CROP_RESIZE_SCALES,
    EVAL_MAX_SIZE,
    EVAL_MIN_SIZE,
    TRAIN_MAX_SIZE,
    TRAIN_SCALES,
    make_eval_transform,
    make_train_transform,
    reseed_transform,
)
from detr.lightning.datamodule import seed_worker_transform
from detr.panoptic_categories import coco_panoptic_category_map

logger = logging.getLogger(__name__)


def box_ground_truth(dataset: CocoPanoptic) -> Any:
    """A pycocotools ``COCO`` of every segment's box (``segments_info`` bbox, area, iscrowd, category) for box
    AP; images from the json's ``images`` (their sizes are what COCOeval needs)."""
    data = load_coco_json(dataset.annotations_file)
    annotations = []
    for annotation in dataset.annotations:
        for segment in annotation["segments_info"]:
            annotations.append({"id": len(annotations) + 1, "image_id": annotation["image_id"],
                                "category_id": int(segment["category_id"]), "bbox": list(segment["bbox"]),
                                "area": float(segment["area"]), "iscrowd": int(segment.get("iscrowd", 0))})
    return coco_from_dict({"images": data.get("images", []), "annotations": annotations,
                           "categories": dataset.categories})


class PanopticDataModule(lightning.LightningDataModule):
    """COCO-panoptic-format data for :class:`detr.lightning.panoptic_system.PanopticSystem`.

    Args:
        root: COCO-layout folder (module docstring); optional when the explicit paths are given.
        train_images, train_annotations, val_images, val_annotations: explicit image folders and panoptic
            jsons (override ``root``'s; the PNGs are in the json's path without ``.json``).
        batch_size, val_batch_size, num_workers, pin_memory, persistent_workers, drop_last: as
            :class:`detr.lightning.datamodule.DetrDataModule`'s.
        train_scales, train_max_size, crop_resize_scales, crop_min_size, crop_max_size, eval_min_size,
            eval_max_size: the transforms' sizes, as DetrDataModule's (masks move with the image).
        category_ids: "auto": COCO panoptic's raw ids as labels (250 classes, as the authors' panoptic
            models) when the json's categories are COCO panoptic's, else contiguous labels 0..K-1 in order of
            category id; "contiguous": always the latter.
        check_train, check_val: the start-up check of each split (:func:`check_panoptic_split`): "full" reads
            every PNG, "files" only checks that the images and PNGs exist, "off".
        categories_from: accepted for the CLI (which passes ``--ckpt_path``); the json names the classes.

    Attributes: ``category_map``, ``num_classes``, ``category_names``, ``is_thing`` (per label),
    ``categories`` (the json's, with ``isthing``, for PQ).
    """

    def __init__(
        self,
        root: str | None = None,
        train_images: str | None = None,
        train_annotations: str | None = None,
        val_images: str | None = None,
        val_annotations: str | None = None,
        batch_size: int = 2,
        val_batch_size: int | None = None,
        num_workers: int = 2,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        drop_last: bool = True,
        train_scales: Sequence[int] = TRAIN_SCALES,
        train_max_size: int = TRAIN_MAX_SIZE,
        crop_resize_scales: Sequence[int] = CROP_RESIZE_SCALES,
        crop_min_size: int = CROP_MIN_SIZE,
        crop_max_size: int = CROP_MAX_SIZE,
        eval_min_size: int = EVAL_MIN_SIZE,
        eval_max_size: int = EVAL_MAX_SIZE,
        category_ids: Literal["auto", "contiguous"] = "auto",
        check_train: PngCheck = "full",
        check_val: PngCheck = "full",
        categories_from: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1 or (val_batch_size is not None and val_batch_size < 1) or num_workers < 0:
            raise ValueError(f"need batch_size >= 1, val_batch_size >= 1 (or None) and num_workers >= 0; got "
                             f"{batch_size}, {val_batch_size}, {num_workers}")
        self.save_hyperparameters()
        base = Path(root) if root is not None else None
        if base is not None and not base.is_dir():
            raise ValueError(f"data root '{base}' does not exist; pass a folder with train2017/, val2017/ and "
                             "annotations/panoptic_{train,val}2017.json + PNG folders")
        self.paths: dict[str, tuple[Path, Path]] = {}
        for split, (images, json_file) in {"train": (train_images, train_annotations),
                                           "val": (val_images, val_annotations)}.items():
            if (images is None) != (json_file is None):
                raise ValueError(f"{split}: give both {split}_images and {split}_annotations, not only one of them")
            if images is not None:
                self.paths[split] = (Path(images), Path(json_file))
            elif base is not None:
                from_root = (base / f"{split}2017", base / "annotations" / f"panoptic_{split}2017.json")
                if from_root[1].is_file():
                    self.paths[split] = from_root
                else:
                    logger.info("no %s split under '%s' (%s does not exist)", split, base, from_root[1])
        if not self.paths:
            where = f"data root '{base}' has no annotations/panoptic_{{train,val}}2017.json" if base else "no data"
            raise ValueError(f"PanopticDataModule: {where}; pass root=DIR (COCO panoptic layout) or train_images + "
                             "train_annotations / val_images + val_annotations (python tools/make_shapes.py "
                             "--panoptic writes a small set)")
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size if val_batch_size is not None else batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers, self.drop_last = persistent_workers, drop_last
        self.checks = {"train": check_train, "val": check_val}
        self.train_transform = make_train_transform(
            scales=train_scales, max_size=train_max_size, crop_resize_scales=crop_resize_scales,
            crop_min_size=crop_min_size, crop_max_size=crop_max_size)
        self.eval_transform = make_eval_transform(min_size=eval_min_size, max_size=eval_max_size)

        first_json = next(iter(self.paths.values()))[1]
        categories = load_coco_json(first_json).get("categories")
        if not isinstance(categories, list) or not categories:
            raise ValueError(f"panoptic json '{first_json}' has no 'categories' list (id, name, isthing)")
        self.categories: list[dict[str, Any]] = categories
        if category_ids not in ("auto", "contiguous"):
            raise ValueError(f"category_ids must be 'auto' or 'contiguous', got {category_ids!r}")
        self.category_map = (coco_panoptic_category_map() if category_ids == "auto" and is_coco_panoptic(categories)
                             else CategoryMap.from_coco_categories(categories, contiguous=True))
        thing_ids = {int(c["id"]) for c in categories if c.get("isthing")}
        self.is_thing = [category_id in thing_ids for category_id in self.category_map.category_ids]
        logger.info("%d classes (%d things, %d stuff categories) from '%s'", self.category_map.num_classes,
                    len(thing_ids), len(categories) - len(thing_ids), first_json)
        self._datasets: dict[str, CocoPanoptic] = {}
        self._checked: set[str] = set()

    # ------------------------------------------------------------------ what the data decides
    @property
    def num_classes(self) -> int:
        return self.category_map.num_classes

    @property
    def category_names(self) -> list[str]:
        return list(self.category_map.names)

    # ------------------------------------------------------------------ data sets
    def _dataset(self, split: str) -> CocoPanoptic | None:
        if split in self._datasets:
            return self._datasets[split]
        if split not in self.paths:
            return None
        images, annotations = self.paths[split]
        dataset = CocoPanoptic(images, annotations, transform=self.train_transform if split == "train"
                               else self.eval_transform, category_map=self.category_map)
        if split != "train":
            dataset.coco = box_ground_truth(dataset)
        self._datasets[split] = dataset
        return dataset

    @property
    def train_dataset(self) -> CocoPanoptic | None:
        return self._dataset("train")

    @property
    def val_dataset(self) -> CocoPanoptic | None:
        """Validation set; ``.coco``: every segment's box (box AP), ``.ground_truth(i)``: PNG ids (PQ)."""
        return self._dataset("val")

    @property
    def test_dataset(self) -> CocoPanoptic | None:
        return self._dataset("val")

    def check(self, split: str) -> None:
        """Check ``split`` once (:func:`check_panoptic_split` with this module's mode); raise on problems."""
        dataset = self._dataset(split)
        if dataset is None or split in self._checked:
            return
        raise_for_problems(split, dataset, check_panoptic_split(dataset, self.checks[split],
                                                                workers=max(1, self.num_workers)))
        self._checked.add(split)

    def setup(self, stage: str) -> None:
        """Build and check the splits the stage needs ("fit": train and val; "validate", "test": val)."""
        for split in {"fit": ("train", "val"), "validate": ("val",), "test": ("val",)}.get(stage, ()):
            self.check(split)

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset: Any, *, batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader:
        return DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=self.num_workers,
            collate_fn=collate_detection, pin_memory=self.pin_memory and torch.cuda.is_available(),
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            worker_init_fn=seed_worker_transform if self.num_workers > 0 else None,
        )

    def _require(self, split: str) -> CocoPanoptic:
        dataset = self._dataset(split)
        if dataset is None:
            raise ValueError(f"no {split} data configured: pass root=DIR or {split}_images + {split}_annotations")
        return dataset

    def train_dataloader(self) -> DataLoader:
        dataset = self._require("train")
        if self.num_workers == 0:  # in-process augmentation: seed it from the (seed_everything) torch generator
            reseed_transform(dataset.transform, int(torch.randint(0, 2**31 - 1, ()).item()))
        if self.drop_last and len(dataset) < self.batch_size:
            raise ValueError(f"the training set has {len(dataset)} images, fewer than batch_size={self.batch_size}, "
                             "so drop_last leaves no batch; lower batch_size or set drop_last=False")
        return self._loader(dataset, batch_size=self.batch_size, shuffle=True, drop_last=self.drop_last)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._require("val"), batch_size=self.val_batch_size, shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
