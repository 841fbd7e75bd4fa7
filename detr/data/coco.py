"""COCO-format detection data set: an image folder plus an instances json.

What the model sees (as the authors' datasets/coco.py prepares it; bad inputs fail naming their file):

- crowd annotations (``iscrowd = 1``) are kept out of the targets, as the authors do, but stay in
  :attr:`CocoDetection.coco`, the ground truth the COCO evaluator scores against;
- COCO ``bbox`` [x, y, w, h] → pixel xyxy, clamped to the image; boxes left with no width or height are
  dropped;
- labels come from a :class:`~detr.categories.CategoryMap`: COCO's raw ids for COCO itself (91 classes, so
  the released checkpoints apply unchanged), contiguous labels 0..K-1 for other data sets;
- with ``masks=True``, each kept box's ``segmentation`` (polygons or RLE) as a mask
  (:mod:`detr.data.instance_masks`), moved by the transform with the image and kept or dropped with its box;
- with ``keypoints=True``, each kept box's ``keypoints`` (x, y, v per point; :mod:`detr.data.keypoints`), moved by
  the transform with the image, kept or dropped with its box, left and right swapped by a flip, and a point the
  transform moves out of the image marked not labelled.

The json is validated when the data set is built, so a bad annotation fails the run at start-up with the
file, the annotation id and the fix, not at epoch 40 inside a worker. Image files are checked for
existence at start-up too; decoding errors (truncated, not an image, a size that contradicts the json)
surface as :class:`~detr.data.images.ImageLoadError` naming the file, the json and the data set's fixes, or,
with ``skip_bad_images=True`` or ``skip_unreadable=True``, as a warning (once per file) while another image
takes the place; the sample that took it carries ``"skipped_files"``, so a training loop can count them.

Samples are read from flat numpy arrays (:mod:`detr.data.coco_index`), not from the json's dicts, so that
loader workers forked from the main process share the annotations instead of copying them page by page
over an epoch; pycocotools' ``COCO`` (:attr:`CocoDetection.coco`) is built only where the evaluator asks.
Measured at COCO's size: docs/measurements/scale.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pycocotools.coco import COCO

from detr.categories import CategoryMap
from detr.data.coco_index import CocoIndex
from detr.data.file_names import file_name_problem, join_file_name, normalise_file_name, unsafe_file_name_message
from detr.data.images import ImageLoadError, ReplacesUnreadableSamples, decode_image
from detr.data.instance_masks import decode_segmentations, segmentation_problem
from detr.data.keypoints import (
    CategoryKeypoints,
    annotation_keypoints_problem,
    from_transform_points,
    hide_outside,
    keypoint_categories,
    to_transform_points,
)
from detr.data.transforms import make_normalize_transform

logger = logging.getLogger(__name__)

CategoryIds = Literal["auto", "raw", "contiguous"]

#: How many problems an error message lists before "... and N more".
_MAX_LISTED = 5


class AnnotationFileError(ValueError):
    """The annotation json is missing, not valid JSON, or not a usable COCO instances file."""


#: What a data set adds to an image error: the fixes that need the json or the data set's options.
DATASET_ADVICE = "or remove the image from the annotation json, or pass skip_bad_images=True to skip such images"


class ImageSizeMismatchError(ImageLoadError):
    """A decoded image's size contradicts the width/height its json entry gives (boxes would be wrong)."""


def load_coco_json(path: str | Path) -> dict[str, Any]:
    """Read a COCO json file into a dict.

    Raises:
        AnnotationFileError: the file is missing, or not valid JSON (the message names the file, the
            line, the column and the character offset of the error), or its top level is not an object.
    """
    path = Path(path)
    if not path.is_file():
        raise AnnotationFileError(f"annotation file '{path}' does not exist; pass the path of a COCO instances json")
    try:
        with path.open("rb") as file:
            data = json.load(file)
    except json.JSONDecodeError as error:
        raise AnnotationFileError(
            f"annotation file '{path}' is not valid JSON: {error.msg} at line {error.lineno} column {error.colno} "
            f"(character {error.pos}); fix the file there (a truncated download or a hand edit?)"
        ) from error
    except UnicodeDecodeError as error:
        raise AnnotationFileError(
            f"annotation file '{path}' is not UTF-8 text (byte {error.start}): {error.reason}; is it really a json?"
        ) from error
    if not isinstance(data, dict):
        raise AnnotationFileError(
            f"annotation file '{path}' holds a JSON {type(data).__name__}, not an object with 'images', "
            "'annotations' and 'categories'"
        )
    return data


def coco_from_dict(data: dict[str, Any]) -> COCO:
    """A pycocotools ``COCO`` over an already loaded dict (pycocotools' index prints are silenced).

    Fills in what pycocotools needs but some jsons lack: ``info`` and ``licenses`` (copied by some versions'
    ``loadRes``), and each annotation's ``iscrowd`` (0) and ``area`` (bbox w * h), which COCOeval reads.
    Expects a dict that passed :func:`validate_coco_dict`.
    """
    data.setdefault("info", {})
    data.setdefault("licenses", [])
    data.setdefault("annotations", [])
    for annotation in data["annotations"]:  # COCOeval reads both fields of every ground-truth box
        annotation.setdefault("iscrowd", 0)
        if "area" not in annotation:
            annotation["area"] = float(annotation["bbox"][2]) * float(annotation["bbox"][3])
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def category_map_from_categories(categories: list[dict[str, Any]], category_ids: CategoryIds = "auto") -> CategoryMap:
    """The label convention for a data set's ``categories``.

    ``"raw"``: labels are the category ids (num_classes = max id + 1), as the authors do for COCO.
    ``"contiguous"``: labels 0..K-1 in order of increasing id. ``"auto"``: raw for COCO's own 80
    categories (so released checkpoints apply), contiguous otherwise.
    """
    if category_ids not in ("auto", "raw", "contiguous"):
        raise ValueError(f"category_ids must be 'auto', 'raw' or 'contiguous', got {category_ids!r}")
    contiguous = category_ids == "contiguous" or (category_ids == "auto" and not CategoryMap.is_coco_like(categories))
    return CategoryMap.from_coco_categories(categories, contiguous=contiguous)


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool, which JSON readers would otherwise take for 0 or 1) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_coco_bbox(bbox: Any) -> bool:
    """Whether ``bbox`` has COCO's form, [x, y, width, height] as 4 finite numbers (sizes not checked)."""
    return isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(is_finite_number(v) for v in bbox)


def all_coco_bboxes(bboxes: list[Any]) -> bool:
    """Whether every entry is a COCO bbox (see :func:`is_coco_bbox`), checked in bulk: a fast yes for a large
    valid json; on no, check the entries one by one to find which."""
    if not bboxes:
        return True
    try:
        types = {type(value) for bbox in bboxes for value in bbox}
        array = np.array(bboxes, dtype=np.float64)
    except (TypeError, ValueError):  # an entry that is not a sequence, or sequences of different lengths
        return False
    return types <= {int, float} and array.shape == (len(bboxes), 4) and bool(np.isfinite(array).all())


def index_categories(categories: list[Any]) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """A json's ``categories`` → ``{id: name}`` of its usable entries, and ``(kind, message)`` for each entry
    without an integer id ("invalid_category") or with an id listed before ("duplicate_category_id")."""
    names: dict[int, str] = {}
    problems: list[tuple[str, str]] = []
    for position, category in enumerate(categories):
        category_id = category.get("id") if isinstance(category, dict) else None
        if not isinstance(category_id, int) or isinstance(category_id, bool):
            problems.append(("invalid_category", f"categories[{position}] has no integer 'id' ({category!r})"))
        elif category_id in names:
            problems.append(("duplicate_category_id", f"category id {category_id} is listed twice in 'categories'"))
        else:
            names[category_id] = str(category.get("name", category_id))
    return names, problems


def coco_structure_problems(data: dict[str, Any], annotations_file: str | Path) -> list[str]:
    """What keeps ``data`` from being a COCO instances json at all: its ``images`` or ``categories`` is not a
    list (one message each), else its ``annotations`` is not a list (optional: image-info jsons have none).
    Empty when the top level is usable."""
    missing = [
        f"'{annotations_file}' has no '{key}' list; a COCO instances json needs 'images', 'annotations' and "
        "'categories'"
        for key in ("images", "categories")
        if not isinstance(data.get(key), list)
    ]
    if missing:
        return missing
    if not isinstance(data.get("annotations", []), list):
        return [f"'{annotations_file}': 'annotations' must be a list"]
    return []


def validate_coco_dict(data: dict[str, Any], annotations_file: str | Path) -> None:
    """Raise :class:`AnnotationFileError` listing what makes ``data`` unusable for training.

    Checked: the three lists exist; images have unique ids and a file_name; categories have unique ids;
    annotations have unique ids, an image id that exists, a category id listed in ``categories`` and a
    bbox of four finite numbers. (``detr-check-data`` reports these and more, without stopping.)
    """
    where = f"annotation file '{annotations_file}'"
    structure = coco_structure_problems(data, annotations_file)
    if structure:
        raise AnnotationFileError(f"annotation file {structure[0]}")
    unsafe_file_names(data["images"], annotations_file)
    problems: list[str] = []
    file_names: dict[Any, str] = {}
    for position, image in enumerate(data["images"]):
        if not isinstance(image, dict) or "id" not in image or "file_name" not in image:
            problems.append(f"images[{position}] needs 'id' and 'file_name'")
        elif isinstance(image["id"], bool) or not isinstance(image["id"], int):
            problems.append(f"images[{position}] has id {image['id']!r}; image ids must be integers (renumber the "
                            "images and their annotations' image_id)")
        elif image["id"] in file_names:
            problems.append(
                f"image id {image['id']} is used twice ('{file_names[image['id']]}' and '{image['file_name']}')"
            )
        else:
            file_names[image["id"]] = image["file_name"]
    category_ids, category_problems = index_categories(data["categories"])
    problems += [message for _, message in category_problems]
    annotation_ids: set[Any] = set()
    annotations = data.get("annotations", [])
    bboxes_valid = (all(isinstance(a, dict) for a in annotations)  # a fast yes at COCO's size, else one by one
                    and all_coco_bboxes([a.get("bbox") for a in annotations]))
    for position, annotation in enumerate(annotations):
        if not isinstance(annotation, dict):
            problems.append(f"annotations[{position}] is not an object")
            continue
        ann_id = annotation.get("id", f"at position {position}")
        image_id = annotation.get("image_id")
        image_name = file_names.get(image_id) if isinstance(image_id, (int, str)) else None
        label = f"annotation {ann_id}" + (f" (image '{image_name}')" if image_name else "")
        if "id" not in annotation:
            problems.append(f"annotations[{position}] has no 'id'")
        elif not isinstance(ann_id, (int, str)):
            problems.append(f"annotations[{position}] has id {ann_id!r}; ids must be integers")
        elif ann_id in annotation_ids:
            problems.append(f"annotation id {ann_id} is used twice")
        else:
            annotation_ids.add(ann_id)
        if image_name is None:
            problems.append(f"{label} refers to image id {image_id!r}, which is not in 'images'")
        category_id = annotation.get("category_id")
        if not isinstance(category_id, int) or category_id not in category_ids:
            problems.append(
                f"{label} has category_id {annotation.get('category_id')!r}, which is not in 'categories' "
                "(add the category or remove the annotation)"
            )
        bbox = annotation.get("bbox")
        if not bboxes_valid and not is_coco_bbox(bbox):
            problems.append(f"{label} has bbox {bbox!r}; COCO needs [x, y, width, height] as 4 finite numbers")
    if problems:
        raise AnnotationFileError(
            f"{where} has {len(problems)} problem(s): {_first_listed(problems)}. "
            f"Run `detr-check-data IMAGES_DIR {annotations_file}` for the full list."
        )


def unsafe_file_names(images: list[Any], annotations_file: str | Path, *, what: str = "image") -> None:
    """Raise :class:`AnnotationFileError` (one sentence: the json, the image id, the fix) when an entry of
    ``images`` (dicts with ``file_name``) names a file outside its folder (:mod:`detr.data.file_names`)."""
    named = [entry for entry in images if isinstance(entry, dict) and isinstance(entry.get("file_name"), str)]
    unsafe = [(entry, problem) for entry in named if (problem := file_name_problem(entry["file_name"])) is not None]
    if unsafe:
        (entry, problem), more = unsafe[0], len(unsafe) - 1
        message = unsafe_file_name_message(entry["file_name"], problem, annotations_file=annotations_file,
                                           image_id=entry.get("image_id", entry.get("id")), what=what)
        raise AnnotationFileError(message + (f" ({more} more such file name(s))" if more else ""))


def _first_listed(problems: list[str]) -> str:
    """The first :data:`_MAX_LISTED` problems joined by "; ", then how many more there are."""
    more = f"; ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    return "; ".join(problems[:_MAX_LISTED]) + more


def check_segmentations(data: dict[str, Any], annotations_file: str | Path) -> None:
    """Raise :class:`AnnotationFileError` listing the non-crowd annotations of ``data`` (a json that passed
    :func:`validate_coco_dict`) whose ``segmentation`` is missing or unusable
    (:func:`detr.data.instance_masks.segmentation_problem`): what training with masks needs."""
    sizes = {image["id"]: (int(image.get("height", -1)), int(image.get("width", -1))) for image in data["images"]}
    problems = []
    for annotation in data.get("annotations", []):
        if annotation.get("iscrowd", 0):
            continue  # crowd regions are no targets
        problem = segmentation_problem(annotation.get("segmentation"), *sizes[annotation["image_id"]])
        if problem is not None:
            problems.append(f"annotation {annotation.get('id')} has {problem}")
    if problems:
        raise AnnotationFileError(
            f"annotation file '{annotations_file}' cannot give masks: {len(problems)} annotation(s) without a usable "
            f"segmentation: {_first_listed(problems)}. Fix them (`detr-check-data` lists every one), or train without "
            "masks (--data.masks false)"
        )


def check_keypoints(data: dict[str, Any], annotations_file: str | Path) -> dict[int, CategoryKeypoints]:
    """The categories' keypoints (``{category id: CategoryKeypoints}``) of ``data`` (a json that passed
    :func:`validate_coco_dict`), after checking what training with keypoints needs: some category names its
    keypoints, their fields are usable, and every non-crowd annotation's ``keypoints`` (where given) has 3K numbers
    with v in {0, 1, 2} (:func:`detr.data.keypoints.annotation_keypoints_problem`).

    Raises:
        AnnotationFileError: naming the file, the category or annotation ids and the fix.
    """
    try:
        categories = keypoint_categories(data["categories"])
    except ValueError as error:
        raise AnnotationFileError(f"annotation file '{annotations_file}': {error}") from None
    if not categories:
        raise AnnotationFileError(
            f"annotation file '{annotations_file}' has no category with 'keypoints' (its point names), so it cannot "
            "give keypoints: add them to the categories (COCO's person_keypoints json has them), or train without "
            "keypoints (--data.keypoints false)")
    problems = []
    for annotation in data.get("annotations", []):
        if annotation.get("iscrowd", 0) or "keypoints" not in annotation:
            continue  # crowd regions are no targets; an annotation without keypoints has none labelled
        spec = categories.get(annotation["category_id"])
        problem = annotation_keypoints_problem(annotation, spec.num_keypoints if spec else None)
        if problem is not None:
            problems.append(f"annotation {annotation.get('id')}: {problem}")
    if problems:
        raise AnnotationFileError(
            f"annotation file '{annotations_file}' cannot give keypoints: {len(problems)} annotation(s) with unusable "
            f"keypoints: {_first_listed(problems)}. Fix them (`detr-check-data` lists every one), or train without "
            "keypoints (--data.keypoints false)"
        )
    return categories


def coco_boxes_to_xyxy(
    bboxes_xywh: np.ndarray, height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """COCO [x, y, w, h] pixel boxes → pixel xyxy clamped to the image, and which boxes survive.

    Args:
        bboxes_xywh: float [N, 4].
        height, width: the image size in pixels.

    Returns:
        (boxes_xyxy float32 [N, 4] clamped to [0, width] x [0, height], keep bool [N]: x1 > x0 and y1 > y0).
    """
    boxes = np.asarray(bboxes_xywh, dtype=np.float64).reshape(-1, 4).copy()
    boxes[:, 2:] += boxes[:, :2]
    boxes[:, 0::2] = boxes[:, 0::2].clip(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clip(0, height)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes.astype(np.float32), keep


@dataclass(frozen=True)
class RawSample:
    """One image and its training boxes before any transform.

    pixels: uint8 [H, W, 3] RGB, EXIF orientation applied.
    boxes_xyxy: float32 [T, 4] pixel xyxy, clamped, no crowd, no zero-size box.
    labels: int64 [T] model labels (see the data set's category_map).
    image_id: the json's image id.
    path: the image file.
    masks: uint8 [T, H, W] each box's mask (1 inside), or None (a data set without ``masks``).
    keypoints: float32 [T, K, 3] each box's keypoints (pixel x, y, v; a point outside the image or not labelled is
        (0, 0, 0)), or None (a data set without ``keypoints``).
    """

    pixels: np.ndarray
    boxes_xyxy: np.ndarray
    labels: np.ndarray
    image_id: int
    path: Path
    masks: np.ndarray | None = None
    keypoints: np.ndarray | None = None


class CocoDetection(ReplacesUnreadableSamples, torch.utils.data.Dataset):
    """COCO-format detection data set.

    Sample ``i`` is ``(image, target)``: ``image`` float32 [3, h, w] (ImageNet-normalised by ``transform``);
    ``target`` = ``{"boxes_xyxy": float32 [T, 4] pixel xyxy in the transformed image, "labels": int64 [T],
    "image_id": int64 scalar, "orig_size": int64 [2] (h, w) of the decoded image, "size": int64 [2] (h, w)
    after the transform}``, and with ``masks`` also ``"masks": bool [T, h, w]`` (each box's, at the transformed
    size; unpadded, as the panoptic targets: the mask losses pad them), and with ``keypoints`` also
    ``"keypoints_pixels": float32 [T, K, 3]`` (each box's points: x, y pixels in the transformed image, visibility
    0/1/2; a point not labelled, or moved out of the image, is (0, 0, 0)). :func:`detr.data.collate.collate_detection`
    turns the boxes into normalised cxcywh and the keypoints' x, y into fractions of the image.

    Args:
        images_dir: folder the json's ``file_name`` entries are relative to.
        annotations_file: COCO instances json.
        transform: albumentations-style callable (see :mod:`detr.data.transforms`); None normalises only.
        category_map: the label convention; None derives it from the json (see ``category_ids``). Pass the
            training set's map to a validation set so both agree.
        category_ids: how to derive the map when ``category_map`` is None: "auto", "raw" or "contiguous"
            (see :func:`category_map_from_categories`).
        skip_bad_images: leave images whose file is missing at construction out (with a warning) instead of
            raising; implies ``skip_unreadable``.
        skip_unreadable: when a sample's image fails to load (missing, undecodable or mis-sized), warn once
            per file and use the next image instead of raising. The training data module sets it: a file
            that passed the start-up check but fails mid-run must not end a long run.
        coco_data: the already loaded json dict (avoids reading a large file twice); ``annotations_file``
            is still used in messages.
        read_annotations: how to read the annotations (the COCO dict) when they are not a COCO json: a YOLO or
            VOC split's reader (:func:`detr.data.formats.load_split`), called when ``coco_data`` is None and for
            :attr:`coco`; ``annotations_file`` is then the file or folder that lists the split, named in messages.
            None: read ``annotations_file`` as a COCO json.
        masks: also read each annotation's ``segmentation`` into the targets' ``masks`` (every non-crowd
            annotation needs a usable one, checked at construction); False leaves them out, and box training
            reads and transforms nothing more.
        keypoints: also read each annotation's ``keypoints`` into the targets' ``keypoints_pixels`` (checked at
            construction: :func:`check_keypoints`); K is the most points any category names.

    Attributes:
        index: the json's images and annotations as flat arrays (:class:`~detr.data.coco_index.CocoIndex`):
            what ``__getitem__`` reads, so that forked loader workers and ranks share it instead of copying it.
        coco: pycocotools ``COCO`` of the full json (crowd included): the evaluator's ground truth, built
            from ``annotations_file`` on first use.
        ids: the image ids, sorted, that the data set serves.
        num_skipped: images skipped so far in this process (with ``skip_unreadable``), each time counted.
        warned_files: the skipped files already named in a warning. DataLoader workers load copies of the data
            set made each epoch, so a loop that reads the batches' ``skipped_files`` adds them here to keep the
            next epoch's workers from naming them again.
    """

    def __init__(
        self,
        images_dir: str | Path,
        annotations_file: str | Path,
        *,
        transform: Callable[..., dict[str, Any]] | None = None,
        category_map: CategoryMap | None = None,
        category_ids: CategoryIds = "auto",
        skip_bad_images: bool = False,
        skip_unreadable: bool = False,
        coco_data: dict[str, Any] | None = None,
        masks: bool = False,
        read_annotations: Callable[[], dict[str, Any]] | None = None,
        keypoints: bool = False,
    ) -> None:
        self.images_dir = Path(images_dir)
        self.read_annotations = read_annotations
        self.masks = masks
        self.annotations_file = Path(annotations_file)
        self.transform = transform if transform is not None else make_normalize_transform()
        self.skip_bad_images = skip_bad_images
        self.skip_unreadable = skip_unreadable or skip_bad_images
        self.num_skipped = 0
        self.warned_files: set[Path] = set()
        if not self.images_dir.is_dir():
            raise ValueError(
                f"image folder '{self.images_dir}' (for annotation file '{self.annotations_file}') does not exist"
            )
        data = coco_data if coco_data is not None else self._read_annotations()
        validate_coco_dict(data, self.annotations_file)
        if category_map is None:
            category_map = category_map_from_categories(data["categories"], category_ids)
        self.category_map = category_map
        label_of: dict[int, int] = {}
        for category in data["categories"]:
            try:
                label_of[category["id"]] = category_map.category_id_to_label(category["id"])
            except KeyError:
                raise ValueError(
                    f"category id {category['id']} ('{category.get('name')}') of annotation file "
                    f"'{self.annotations_file}' is not in the category map given ({category_map.num_classes} "
                    "classes); use the same categories as the training json, or build the map from this file"
                ) from None
        # Flat arrays, not the json's dicts: forked loader workers read them without copying (coco_index).
        if masks:
            check_segmentations(data, self.annotations_file)
        #: category id → its keypoint names, skeleton and mirror (empty without ``keypoints``)
        self.keypoint_categories = check_keypoints(data, self.annotations_file) if keypoints else {}
        self.num_keypoints = max((spec.num_keypoints for spec in self.keypoint_categories.values()), default=0)
        self.index = CocoIndex.from_coco_dict(data, segmentations=masks,
                                              num_keypoints=self.num_keypoints if keypoints else None)
        category_ids = np.array(sorted(label_of), dtype=np.int64)
        labels_by_id = np.array([label_of[int(i)] for i in category_ids], dtype=np.int64)
        # int64 [num_classes, K]: each label's mirror permutation, the identity for the padding and other classes
        self._flip_index = np.tile(np.arange(self.num_keypoints), (max(category_map.num_classes, 1), 1))
        for category_id, spec in self.keypoint_categories.items():
            self._flip_index[label_of[category_id], :spec.num_keypoints] = spec.flip_index
        self._labels = labels_by_id[np.searchsorted(category_ids, self.index.category_ids)]  # int64 [A]
        self._coco: COCO | None = None
        self._positions = self._existing_positions(np.arange(len(self.index)))  # int64 [n] served images

    @property
    def coco(self) -> COCO:
        """pycocotools ``COCO`` of the full json (crowd included): the evaluator's ground truth.

        Built on first use, from ``annotations_file`` (or ``read_annotations``), in the process that asks (the evaluating main process;
        loader workers never need it), and kept.
        """
        if self._coco is None:
            self._coco = coco_from_dict(self._read_annotations())
        return self._coco

    def _read_annotations(self) -> dict[str, Any]:
        if self.read_annotations is not None:
            return self.read_annotations()
        return load_coco_json(self.annotations_file)

    @coco.setter
    def coco(self, value: COCO) -> None:
        self._coco = value

    @property
    def ids(self) -> list[int]:
        """The image ids, increasing, that the data set serves (a new list on each read)."""
        return self.index.image_ids[self._positions].tolist()

    @ids.setter
    def ids(self, image_ids: list[int]) -> None:
        self._positions = np.sort(self.index.positions_of(image_ids))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_coco"] = None  # a worker started by spawn rebuilds nothing it does not need
        return state

    def leave_out(self, file_names: set[str]) -> int:
        """Stop serving the images whose json ``file_name`` is in ``file_names``; return how many were left out."""
        keep = np.array([self.index.file_name(int(p)) not in file_names for p in self._positions], dtype=bool)
        self._positions = self._positions[keep]
        return int((~keep).sum())

    def _existing_positions(self, positions: np.ndarray) -> np.ndarray:
        """The positions whose file exists; missing files raise (or, with skip_bad_images, are dropped with a
        warning)."""
        folder = str(self.images_dir)  # os.path on strings: a third of pathlib's time over 118k files
        file_names = [self.index.file_name(int(p)) for p in positions]
        exists = np.array([os.path.isfile(join_file_name(folder, name)) for name in file_names], dtype=bool)
        if exists.all():
            return positions
        missing = [self.images_dir / normalise_file_name(name) for name, found in zip(file_names, exists) if not found]
        names = ", ".join(f"'{path}'" for path in missing[:_MAX_LISTED])
        more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
        if not self.skip_bad_images:
            raise ImageLoadError(
                f"{len(missing)} image file(s) listed in annotation file '{self.annotations_file}' do not exist: "
                f"{names}{more}; restore them, remove them from the json, or pass skip_bad_images=True",
                path=missing[0],
                annotations_file=self.annotations_file,
            )
        logger.warning(
            "skipping %d image(s) listed in '%s' whose file does not exist: %s%s",
            len(missing), self.annotations_file, names, more,
        )
        if not exists.any():
            raise ImageLoadError(
                f"none of the images listed in annotation file '{self.annotations_file}' exists in '{self.images_dir}'",
                annotations_file=self.annotations_file,
            )
        return positions[exists]

    def __len__(self) -> int:
        return len(self._positions)

    def image_path(self, index: int) -> Path:
        """The file of sample ``index``."""
        return self.images_dir / normalise_file_name(self.index.file_name(int(self._positions[index])))

    def raw_sample(self, index: int) -> RawSample:
        """Sample ``index`` decoded, with its training boxes, before the transform.

        Raises:
            ImageLoadError: the file is missing or undecodable, or its size contradicts the json's
                width/height (:class:`ImageSizeMismatchError`); the message names the file and the json.
        """
        position = int(self._positions[index])
        image_id = int(self.index.image_ids[position])
        path = self.images_dir / normalise_file_name(self.index.file_name(position))
        try:
            decoded = decode_image(path, annotations_file=self.annotations_file)
        except ImageLoadError as error:
            raise ImageLoadError(f"{error}, {DATASET_ADVICE}", path=path,
                                 annotations_file=self.annotations_file) from error.__cause__
        height, width = decoded.pixels.shape[:2]
        json_size = (int(self.index.heights[position]), int(self.index.widths[position]))
        if json_size != (-1, -1) and json_size != (height, width):
            raise ImageSizeMismatchError(self._size_message(path, json_size, decoded.stored_size,
                                                            decoded.exif_orientation, (height, width)),
                                         path=path, annotations_file=self.annotations_file)
        rows = self.index.annotation_rows(position)
        not_crowd = ~self.index.iscrowd[rows]
        boxes, keep = coco_boxes_to_xyxy(self.index.boxes_xywh[rows][not_crowd], height, width)
        labels = self._labels[rows][not_crowd]
        masks = None
        if self.masks:
            kept_rows = np.arange(rows.start, rows.stop)[not_crowd][keep]
            masks = self._decode_masks(kept_rows, path, height, width)
        keypoints = None
        if self.index.keypoints is not None:
            keypoints = hide_outside(self.index.keypoints[rows][not_crowd][keep], height, width)
        return RawSample(pixels=decoded.pixels, boxes_xyxy=boxes[keep], labels=labels[keep], image_id=image_id,
                         path=path, masks=masks, keypoints=keypoints)

    def _decode_masks(self, rows: np.ndarray, path: Path, height: int, width: int) -> np.ndarray:
        """uint8 [T, height, width] masks of annotation ``rows``; a segmentation that cannot be decoded (the
        start-up check refuses the ones it can tell) raises :class:`AnnotationFileError` naming the annotation
        and the image."""
        segmentations = [self.index.segmentation(int(row)) for row in rows]
        try:
            return decode_segmentations(segmentations, height, width)
        except Exception as error:  # pycocotools' own errors name nothing
            culprit = next((int(row) for row, segmentation in zip(rows, segmentations)
                            if segmentation_problem(segmentation, height, width) is not None), None)
            raise AnnotationFileError(self._annotation_message(
                culprit, path, f"cannot be decoded as a mask ({type(error).__name__}: {error})")) from error

    def _annotation_message(self, row: int | None, path: Path, problem: str) -> str:
        annotation_ids = self.index.annotation_ids
        which = (f"annotation {int(annotation_ids[row])}" if row is not None and annotation_ids is not None
                 else "a segmentation")
        return (f"{which} of image file '{path}' in '{self.annotations_file}' {problem}: fix or remove it "
                f"(`detr-check-data {self.images_dir} {self.annotations_file}` lists every such annotation), or "
                "train without masks (--data.masks false)")

    def _size_message(
        self,
        path: Path,
        json_size: tuple[Any, Any],
        stored_size: tuple[int, int],
        orientation: int,
        displayed_size: tuple[int, int],
    ) -> str:
        message = (
            f"image file '{path}' is {displayed_size[1]}x{displayed_size[0]} (width x height) as displayed, but "
            f"annotation file '{self.annotations_file}' says {json_size[1]}x{json_size[0]}, so its boxes would "
            "land in the wrong place"
        )
        if orientation != 1 and tuple(json_size) == stored_size:
            message += (
                f"; the file has EXIF orientation {orientation} and the json matches the un-rotated pixels: "
                "annotate the image as displayed, or strip the EXIF orientation tag (e.g. re-save the image "
                "rotated) and convert the boxes"
            )
        else:
            message += "; fix 'width'/'height' in the json or re-annotate the image"
        return message

    def _skip_advice(self, path: Path) -> str:
        return (f"remove it from '{self.annotations_file}' (`detr-check-data {self.images_dir} "
                f"{self.annotations_file}` lists every such file)")

    def _load(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        sample = self.raw_sample(index)
        inputs: dict[str, Any] = {"image": sample.pixels, "bboxes": sample.boxes_xyxy, "labels": sample.labels}
        tracked = sample.masks is not None or sample.keypoints is not None
        if tracked:
            # the transform keeps or drops boxes with their "labels": pass positions, to keep masks and keypoints alike
            inputs["labels"] = np.arange(len(sample.labels))
        if sample.masks is not None and len(sample.masks):
            inputs["masks"] = sample.masks
        if sample.keypoints is not None:
            inputs["keypoints"] = to_transform_points(sample.keypoints)
        try:
            out = self.transform(**inputs)
        except ImageLoadError:
            raise  # another image a transform read (DEIM's mosaic): skipped or raised as any unreadable file
        except Exception as error:  # name the file: a bare albumentations traceback from a worker helps no one
            raise RuntimeError(
                f"transform failed on image file '{sample.path}' (image id {sample.image_id}, annotation file "
                f"'{self.annotations_file}'): {type(error).__name__}: {error}"
            ) from error
        image = out["image"]
        boxes = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        labels = torch.as_tensor(np.asarray(out["labels"], dtype=np.int64).reshape(-1))
        target = {
            "boxes_xyxy": boxes,
            "labels": labels,
            "image_id": torch.tensor(sample.image_id, dtype=torch.int64),
            "orig_size": torch.tensor(sample.pixels.shape[:2], dtype=torch.int64),
            "size": torch.tensor(tuple(image.shape[-2:]), dtype=torch.int64),
        }
        kept = labels.numpy()
        if tracked:
            target["labels"] = torch.from_numpy(sample.labels[kept])
        if sample.keypoints is not None:
            keypoints = from_transform_points(out["keypoints"], sample.keypoints[..., 2], kept,
                                              self._flip_index[sample.labels], *image.shape[-2:])
            target["keypoints_pixels"] = torch.from_numpy(keypoints)
        if sample.masks is not None:
            masks = np.asarray(out["masks"]) if len(kept) else np.zeros((0, *image.shape[-2:]), dtype=np.uint8)
            if len(kept) != len(masks) or (kept != np.arange(len(kept))).any():
                masks = masks[kept]
            # 0/1 bytes, as decoded and moved (nearest resizes, zero padding): read as bool without a copy
            target["masks"] = torch.from_numpy(np.ascontiguousarray(masks)).view(torch.bool)
        return image, target
