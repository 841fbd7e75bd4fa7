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
from pathlib import Path
from typing import Any, Literal

from detr.categories import UNUSED_NAME, CategoryMap, coco_panoptic_category_map
from detr.checkpoints import read_checkpoint
from detr.data.coco import coco_from_dict, load_coco_json
from detr.data.coco_panoptic import CocoPanoptic, is_coco_panoptic
from detr.data.panoptic_checks import PngCheck, check_panoptic_split, raise_for_problems
from detr.lightning.datamodule import CocoFormatDataModule, split_paths

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


class PanopticDataModule(CocoFormatDataModule):
    """COCO-panoptic-format data for :class:`detr.lightning.panoptic_system.PanopticSystem`.

    Args:
        root: a folder in COCO panoptic's layout: ROOT/train2017/, ROOT/val2017/ and ROOT/annotations/
            panoptic_{train,val}2017.json beside their PNG folders; optional when the explicit paths are given.
        train_images: folder of the training images (default: ROOT/train2017).
        train_annotations: COCO panoptic json of the training images; its PNGs are in the json's path without
            ``.json`` (default: ROOT/annotations/panoptic_train2017.json).
        val_images: folder of the validation images (default: ROOT/val2017).
        val_annotations: COCO panoptic json of the validation images (default:
            ROOT/annotations/panoptic_val2017.json).
        category_ids: "auto": COCO panoptic's raw ids as labels (250 classes, as the authors' panoptic
            models) when the json's categories are COCO panoptic's, else contiguous labels 0..K-1 in order of
            category id; "contiguous": always the latter.
        check_train: the start-up check of the training split (:func:`check_panoptic_split`): "full" reads
            every PNG, "files" only checks that the images and PNGs exist, "off".
        check_val: the same for the validation split.
        predict_images: a folder (its image files) or a list of image files for ``predict``
            (:class:`detr.lightning.panoptic_writer.PanopticPredictionsWriter` writes the outputs).
        categories_from: a checkpoint of this project's panoptic training whose categories (and things /
            stuff) name the classes when no json is given (``detr-panoptic predict`` on plain images; the CLI
            sets it to ``--ckpt_path``); a json, when given, names them.
        kwargs: the batch sizes, loader settings and transform sizes of
            :class:`detr.lightning.datamodule.CocoFormatDataModule`, as :class:`DetrDataModule`'s.

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
        category_ids: Literal["auto", "contiguous"] = "auto",
        check_train: PngCheck = "full",
        check_val: PngCheck = "full",
        predict_images: str | list[str] | None = None,
        categories_from: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.hparams.update(self.sizes)  # the sizes in use (image_size scales them): a checkpoint's eval size
        self.predict_images = predict_images
        root = self.set_aside_missing_root(root, predict_images)
        explicit = {"train": (train_images, train_annotations), "val": (val_images, val_annotations)}
        self.paths = split_paths(root, explicit, "panoptic_{split}2017.json", layout="train2017/, val2017/ and "
                                 "annotations/panoptic_{train,val}2017.json + PNG folders")
        self.checks = {"train": check_train, "val": check_val}
        self._checked: set[str] = set()
        if not self.paths and predict_images is not None and categories_from is not None:
            self._categories_from_checkpoint(categories_from)
            return
        if not self.paths:
            if root:
                where = f"data root '{Path(root)}' has no annotations/panoptic_{{train,val}}2017.json"
            elif self.missing_root:
                where = f"data root '{self.missing_root}' does not exist"
            else:
                where = "no data"
            raise ValueError(f"PanopticDataModule: {where}; pass root=DIR (COCO panoptic layout) or train_images + "
                             "train_annotations / val_images + val_annotations (python tools/make_shapes.py "
                             "--panoptic writes a small set), or predict_images with --ckpt_path")

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

    def _categories_from_checkpoint(self, path: str) -> None:
        contents = read_checkpoint(path)
        meta = contents.meta
        if meta.category_map is None or meta.is_thing is None:
            raise ValueError(f"checkpoint {path} names no panoptic categories (things and stuff): predict with a "
                             "checkpoint of detr-panoptic's training, or give the data's panoptic json")
        self.category_map, self.is_thing = meta.category_map, list(meta.is_thing)
        self.categories = [{"id": int(category_id), "name": name, "isthing": int(thing)} for category_id, name, thing
                           in zip(meta.category_map.category_ids, meta.category_map.names, self.is_thing)
                           if name != UNUSED_NAME]
        logger.info("%d classes from checkpoint '%s'", self.category_map.num_classes, path)

    # ------------------------------------------------------------------ data sets
    def _build_dataset(self, split: str, images: Path, annotations: Path) -> CocoPanoptic:
        dataset = CocoPanoptic(images, annotations, transform=self.train_transform if split == "train"
                               else self.eval_transform, category_map=self.category_map,
                               skip_unreadable=split == "train")  # a file that fails mid-run must not end it
        if split != "train":
            dataset.coco = box_ground_truth(dataset)  # box AP; ``.ground_truth(i)``: the PNG ids for PQ
        return dataset

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
