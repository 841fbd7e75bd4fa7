"""COCO-panoptic-format data set: images, a panoptic json and its PNG folder → images and mask targets.

As the authors' datasets/coco_panoptic.py prepares them: every segment of ``segments_info`` (things and
stuff, crowd included) is a target with its category as label, its binary mask from the PNG (ids are
R + 256·G + 256²·B) and the box around that mask. The transforms of :mod:`detr.data.transforms` move the
masks with the image (nearest-neighbour resizes, the same flips and crops); a crop clamps the boxes (so a
box can be wider than what is left of its mask, as in the authors' crop) and drops the segments it leaves
no mask pixel of.

Layout (COCO's)::

    IMAGES/000000000139.jpg
    ANNOTATIONS/panoptic_val2017.json         images, annotations (file_name, segments_info), categories
    ANNOTATIONS/panoptic_val2017/000000000139.png
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from detr.categories import COCO_PANOPTIC_CATEGORIES, CategoryMap, coco_panoptic_category_map
from detr.data.coco import AnnotationFileError, load_coco_json, unsafe_file_names
from detr.data.file_names import normalise_file_name
from detr.data.images import ImageLoadError, ReplacesUnreadableSamples, decode_image
from detr.data.transforms import make_normalize_transform

logger = logging.getLogger(__name__)


def is_coco_panoptic(categories: list[dict[str, Any]]) -> bool:
    """True if ``categories`` are COCO panoptic's 133 (same ids and names): raw ids then serve as labels."""
    return sorted((int(c["id"]), str(c.get("name"))) for c in categories) == sorted(
        (cid, name) for cid, name, _ in COCO_PANOPTIC_CATEGORIES)


def masks_to_boxes_xyxy(masks: np.ndarray) -> np.ndarray:
    """bool [T, H, W] → float32 [T, 4] pixel xyxy around each mask, pixel edges (x1 = last column + 1)."""
    boxes = np.zeros((len(masks), 4), dtype=np.float32)
    for index, mask in enumerate(masks):
        ys, xs = np.nonzero(mask)
        if len(xs):
            boxes[index] = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    return boxes


def _check_annotation(annotation: Any, index: int, annotations_file: Path) -> None:
    """Raise :class:`AnnotationFileError` naming the entry and the field when a panoptic annotation lacks what
    every sample reads (``image_id``, the PNG's ``file_name``, the list ``segments_info`` with each segment's
    ``id`` and ``category_id``); a missing one was a bare KeyError when the sample was drawn."""
    where = f"'{annotations_file}': annotations[{index}]"
    if not isinstance(annotation, dict):
        raise AnnotationFileError(f"{where} is a {type(annotation).__name__}, not an object")
    where += f" (image_id {annotation['image_id']})" if "image_id" in annotation else ""
    missing = [key for key in ("image_id", "file_name", "segments_info") if key not in annotation]
    if missing:
        raise AnnotationFileError(
            f"{where} has no {', '.join(missing)}: each panoptic annotation needs image_id, file_name (its PNG) and "
            "segments_info (a list of {id, category_id, iscrowd}; [] for an image without segments)")
    segments = annotation["segments_info"]
    if not isinstance(segments, list):
        raise AnnotationFileError(f"{where}: segments_info is a {type(segments).__name__}, not a list of segments")
    for number, segment in enumerate(segments):
        lacking = [key for key in ("id", "category_id") if not isinstance(segment, dict) or key not in segment]
        if lacking:
            raise AnnotationFileError(f"{where}: segments_info[{number}] has no {', '.join(lacking)}")
    first_of: dict[Any, int] = {}
    for number, segment in enumerate(segments):
        if segment["id"] in first_of:  # both would be the same PNG pixels: two targets, or a PQ that cannot pair
            raise AnnotationFileError(
                f"{where}: segments_info lists segment id {segment['id']} twice (segments_info"
                f"[{first_of[segment['id']]}] and [{number}]); the json is at fault, not the PNG: each segment of an image needs its own id (its "
                "pixels' R + 256·G + 256²·B in the PNG): remove the repeated entry or give it its segment's id")
        first_of[segment["id"]] = number


class CocoPanoptic(ReplacesUnreadableSamples, torch.utils.data.Dataset):
    """COCO panoptic data set.

    Sample ``i`` is ``(image, target)``: ``image`` float32 [3, h, w] (ImageNet-normalised by ``transform``);
    ``target`` = ``{"boxes_xyxy": float32 [T, 4] pixel xyxy, "labels": int64 [T], "masks": bool [T, h, w],
    "iscrowd": int64 [T], "image_id": int64 scalar, "orig_size": int64 [2], "size": int64 [2]}``, like
    :class:`detr.data.coco.CocoDetection` plus the masks (and crowd flags; crowd segments are targets, as the
    authors train). :func:`detr.data.collate.collate_detection` batches it.

    Args:
        images_dir: folder of the images (the PNG's name with ``.jpg``, or the ``images`` entry's file_name).
        annotations_file: the panoptic json.
        panoptic_dir: folder of the PNGs; default: the json's path without ``.json``.
        transform: albumentations-style callable (see :mod:`detr.data.transforms`); None normalises only.
        category_map: the label convention; None: COCO panoptic's raw ids in 250 classes (the authors'
            models) when the json's categories are COCO panoptic's, else contiguous labels 0..K-1.
        skip_unreadable: when a sample's image or PNG fails to load (missing, undecodable, or a PNG whose size
            is not its image's), warn once per file and use the next sample instead of raising, as
            :class:`detr.data.coco.CocoDetection` does (:class:`~detr.data.images.ReplacesUnreadableSamples`).
            The training data module sets it.

    Attributes: ``category_map``; ``is_thing`` (per label, for
    :class:`detr.inference.postprocess_masks.PostProcessPanoptic`); ``categories`` (the json's, for PQ).
    :meth:`index_of_image` finds a sample by image id (evaluation reads :meth:`ground_truth` by it).
    """

    def __init__(self, images_dir: str | Path, annotations_file: str | Path, panoptic_dir: str | Path | None = None,
                 *, transform: Callable[..., dict[str, Any]] | None = None,
                 category_map: CategoryMap | None = None, skip_unreadable: bool = False) -> None:
        self.images_dir, self.annotations_file = Path(images_dir), Path(annotations_file)
        self.skip_unreadable, self.num_skipped, self.warned_files = skip_unreadable, 0, set()
        self.panoptic_dir = Path(panoptic_dir) if panoptic_dir else self.annotations_file.with_suffix("")
        self.transform = transform if transform is not None else make_normalize_transform()
        data = load_coco_json(self.annotations_file)
        for field in ("annotations", "categories"):
            if not isinstance(data.get(field), list):
                raise AnnotationFileError(f"'{self.annotations_file}' has no '{field}' list: not a COCO panoptic json")
        for directory, what in ((self.images_dir, "image"), (self.panoptic_dir, "panoptic PNG")):
            if not directory.is_dir():
                raise ValueError(f"{what} folder '{directory}' (for '{self.annotations_file}') does not exist")
        self.categories = data["categories"]
        if category_map is None:
            category_map = (coco_panoptic_category_map() if is_coco_panoptic(self.categories) else
                            CategoryMap.from_coco_categories(self.categories, contiguous=True))
        self.category_map = category_map
        thing_ids = {int(c["id"]) for c in self.categories if c.get("isthing")}
        self.is_thing = [category_id in thing_ids for category_id in category_map.category_ids]
        self._label_of = {int(c["id"]): category_map.category_id_to_label(int(c["id"])) for c in self.categories}
        for index, annotation in enumerate(data["annotations"]):
            _check_annotation(annotation, index, self.annotations_file)
        unsafe_file_names(data.get("images", []), self.annotations_file)
        unsafe_file_names(data["annotations"], self.annotations_file, what="panoptic PNG")
        self.annotations = sorted(data["annotations"], key=lambda a: a["image_id"])
        self._index_of_image = {int(a["image_id"]): index for index, a in enumerate(self.annotations)}
        file_names = {image["id"]: image["file_name"] for image in data.get("images", [])}
        unannotated = sorted(set(file_names) - set(self._index_of_image))
        if unannotated:  # no PNG to learn or score them by: they are left out, and that is said
            logger.warning("%d of the %d images of '%s' have no panoptic annotation (segments and PNG) and are left "
                           "out (image ids %s%s); annotate them, or remove them from its 'images'", len(unannotated),
                           len(file_names), self.annotations_file, unannotated[:5], " ..." if len(unannotated) > 5 else "")
        self._image_files = [
            normalise_file_name(file_names.get(a["image_id"], Path(a["file_name"]).with_suffix(".jpg").name))
            for a in self.annotations]

    def __len__(self) -> int:
        return len(self.annotations)

    def index_of_image(self, image_id: int) -> int:
        """The sample index of the image with COCO id ``image_id`` (a target's ``image_id``)."""
        try:
            return self._index_of_image[int(image_id)]
        except KeyError:
            raise KeyError(f"image id {image_id} has no annotation in '{self.annotations_file}'") from None

    def image_path(self, index: int) -> Path:
        """The image file of sample ``index``."""
        return self.images_dir / self._image_files[index]

    def png_path(self, index: int) -> Path:
        """The panoptic PNG of sample ``index``."""
        return self.panoptic_dir / normalise_file_name(self.annotations[index]["file_name"])

    def ground_truth(self, index: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Sample ``index``'s ground truth for :class:`detr.evaluation.panoptic.PanopticQuality`: the segment
        id map int64 [H, W] at the original size and the json's segments_info."""
        annotation = self.annotations[index]
        path = self.png_path(index)
        try:
            with Image.open(path) as png:
                rgb = np.asarray(png.convert("RGB"), dtype=np.int64)
        except Exception as error:  # PIL raises OSError, SyntaxError, ValueError ... by format
            raise ImageLoadError(f"panoptic PNG '{path}' (listed in '{self.annotations_file}') cannot be read: "
                                 f"{type(error).__name__}: {error}; restore or replace it",
                                 path=path, annotations_file=self.annotations_file) from error
        return rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2], annotation["segments_info"]

    def raw_sample(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pixels uint8 [H, W, 3], masks bool [T, H, W], labels int64 [T], iscrowd int64 [T]) before the transform."""
        pixels = decode_image(self.image_path(index), annotations_file=self.annotations_file).pixels
        png_path = self.png_path(index)
        ids, segments = self.ground_truth(index)
        if ids.shape != pixels.shape[:2]:
            raise ImageLoadError(f"panoptic PNG '{png_path}' is {ids.shape[1]}x{ids.shape[0]} but its image is "
                                 f"{pixels.shape[1]}x{pixels.shape[0]} (width x height)", path=png_path,
                                 annotations_file=self.annotations_file)
        masks = ids[None] == np.array([s["id"] for s in segments], dtype=np.int64).reshape(-1, 1, 1)
        labels = np.array([self._label_of[int(s["category_id"])] for s in segments], dtype=np.int64)
        iscrowd = np.array([int(s.get("iscrowd", 0)) for s in segments], dtype=np.int64)
        return pixels, masks, labels, iscrowd

    def _skip_advice(self, path: Path) -> str:
        return f"remove its image from '{self.annotations_file}'"

    def _load(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        pixels, masks, labels, iscrowd = self.raw_sample(index)
        boxes = masks_to_boxes_xyxy(masks)
        present = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])  # a segment absent from the PNG
        masks, boxes, labels, iscrowd = masks[present], boxes[present], labels[present], iscrowd[present]
        # the transform keeps or drops boxes with their "labels": pass positions, to drop the masks alike
        inputs = {"image": pixels, "bboxes": boxes, "labels": np.arange(len(boxes))}
        if len(masks):
            inputs["masks"] = masks.astype(np.uint8)
        out = self.transform(**inputs)
        image = out["image"]
        kept = np.asarray(out["labels"], dtype=np.int64).reshape(-1)
        if len(masks):
            out_masks = torch.as_tensor(np.asarray(out["masks"]))[torch.from_numpy(kept)].bool()
        else:
            out_masks = torch.zeros(0, *image.shape[-2:], dtype=torch.bool)
        out_boxes = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        visible = out_masks.flatten(1).any(1)  # a crop can leave a box corner but none of the mask: drop it
        target = {
            "boxes_xyxy": out_boxes[visible],
            "labels": torch.from_numpy(labels[kept])[visible],
            "masks": out_masks[visible],
            "iscrowd": torch.from_numpy(iscrowd[kept])[visible],
            "image_id": torch.tensor(int(self.annotations[index]["image_id"]), dtype=torch.int64),
            "orig_size": torch.tensor(pixels.shape[:2], dtype=torch.int64),
            "size": torch.tensor(tuple(image.shape[-2:]), dtype=torch.int64),
        }
        return image, target
