"""Check a COCO-format data set for what would hurt DETR training, before a long run finds it.

:func:`check_dataset` reads an image folder and an instances json and returns every :class:`Problem` it
finds, each named by its image file and annotation id. Errors would break or silently corrupt training or
evaluation; warnings are facts worth knowing (empty images, crowd boxes, category id gaps) that the
pipeline handles. ``detr-check-data`` prints :func:`format_problems` and exits 1 on any error.

Errors: invalid JSON (with line and column) or a json without ``images``/``categories``; duplicate
image, annotation or category ids; an annotation on an unknown image or with a category id missing from
``categories``; a bbox that is not 4 finite numbers, has zero (or negative) width or height, or reaches
outside the image; a ``file_name`` outside the images folder (absolute, or with ``..``:
:mod:`detr.data.file_names`; backslashes are read as separators, which an "info" line says); missing, truncated or
undecodable image files; a file whose size (after EXIF
orientation) contradicts the json; more objects in one image than ``num_queries`` (DETR predicts at most
one object per query, so the rest could never be matched); string image ids; a file without any
(non-crowd) box; boxes that look like [x1, y1, x2, y2] corners (a quarter run past their image as [x, y, width,
height] and nine in ten fit inside it as corners: :data:`XYXY_MIN_OUTSIDE`) or in 0-1 units (nine in ten within
[0, 1] on images of 64 or more pixels a side: YOLO-style), each listed first as the root cause, counting the
mask/box disagreements it explains instead of listing them; a
``segmentation`` that cannot be a mask (a polygon of fewer than 3 points or of odd length, an RLE whose size is
not its image's, a corrupt compressed RLE: :func:`detr.data.instance_masks.segmentation_problem`) or that covers
no pixel; keypoints (:mod:`detr.data.keypoints`) that are not 3K numbers for a category of K named points, have a
visibility other than 0, 1, 2, a ``num_keypoints`` that is not the count of labelled points, or a labelled point
outside the image; a category whose ``keypoints``, ``skeleton`` or ``flip_pairs`` is unusable.

Warnings: images without boxes, crowd annotations (left out of training, kept for evaluation), category
id gaps, categories without annotations, duplicate file names, annotations without ``area``/``iscrowd``,
files with an EXIF orientation that turns or flips their pixels while the json's size fits either frame (a
square image, a 180-degree turn: the sizes cannot tell in which frame its boxes were drawn); a mask whose extent
disagrees with its box (IoU below :data:`MASK_BOX_MIN_IOU`) or whose area exceeds the box's; annotations without
``segmentation`` in a json where others have one (no mask training, no mask AP). Facts about many items (crowd
annotations, images without boxes, unused categories) are one line per kind: the count and the first few.

What makes a fine-tune on a small set end near 0 AP, when asked: categories with boxes on fewer than
``min_images_per_class`` images (a warning), and a ``checkpoint`` whose class head does not fit the json's
categories (:func:`checkpoint_class_problems`: a warning that it starts fresh, an error when the same names sit
on other labels of a head of the same size).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pycocotools import mask as mask_utils

from detr.categories import CategoryMap, ambiguous_class_names, class_name_key
from detr.data.coco import (
    AnnotationFileError,
    all_coco_bboxes,
    coco_structure_problems,
    index_categories,
    is_coco_bbox,
    is_finite_number,
    load_coco_json,
)
from detr.data.converted import ConvertedSplit
from detr.data.file_names import (
    file_name_problem,
    join_file_name,
    normalise_file_name,
    unsafe_file_name_message,
)
from detr.data.image_checks import read_images
from detr.data.instance_masks import segmentation_problem, segmentation_to_rle
from detr.data.keypoints import annotation_keypoints_problem, category_keypoints_problem, points_outside

Severity = Literal["error", "warning", "info"]

#: A box may reach this far (pixels) past the image border before it counts as outside (float rounding).
OUTSIDE_TOLERANCE = 1.0

#: "Boxes written as xyxy" needs this share of boxes to run past their image as [x, y, width, height] while
#: fitting inside it as [x1, y1, x2, y2] (boxes whose corners both lie left of the middle do not run past) ...
XYXY_MIN_OUTSIDE = 0.25
#: ... and this share to fit inside it as corners (a real xywh file: only large boxes near the top left do).
#: The same share of boxes within [0, 1] says "normalised units".
XYXY_MIN_CORNERS = 0.9

#: A mask's extent (the box around its pixels) and its annotation's bbox overlap at least this much (IoU).
MASK_BOX_MIN_IOU = 0.5

#: From this many images on, a full decode with ``workers=None`` uses one process per CPU core: decoding is
#: the slow part of a check, and below this a pool's start-up costs more than it saves.
PARALLEL_DECODE_MIN_IMAGES = 256
#: The same for header reads (~110 µs a file on one core: about 2 s of reading).
PARALLEL_HEADER_MIN_IMAGES = 20_000


@dataclass(frozen=True)
class Problem:
    """One finding.

    severity: "error" (would hurt training or evaluation), "warning", or "info" (the summary counts).
    kind: short machine name, e.g. "missing_image", "unknown_category", "zero_size_box".
    message: what is wrong and how to fix it.
    file_name: the image file concerned (as in the json), if any.
    annotation_id: the annotation concerned, if any.
    """

    severity: Severity
    kind: str
    message: str
    file_name: str | None = None
    annotation_id: int | str | None = None

    def __str__(self) -> str:
        where = []
        if self.file_name is not None:
            where.append(str(self.file_name))
        if self.annotation_id is not None:
            where.append(f"annotation {self.annotation_id}")
        location = f" [{', '.join(where)}]" if where else ""
        return f"{self.severity}: {self.kind}{location}: {self.message}"


def reading_workers(workers: int | None, num_images: int, decode_images: bool) -> int:
    """The processes :func:`check_dataset` reads images with: ``workers`` when given; else one per CPU core for
    a full decode of ``PARALLEL_DECODE_MIN_IMAGES`` or more images or a header read of
    ``PARALLEL_HEADER_MIN_IMAGES`` or more, 0 (this process) otherwise."""
    if workers is not None:
        return workers
    if num_images < (PARALLEL_DECODE_MIN_IMAGES if decode_images else PARALLEL_HEADER_MIN_IMAGES):
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _hashable_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def check_dataset(
    images_dir: str | Path,
    annotations_file: str | Path,
    *,
    num_queries: int = 100,
    decode_images: bool = True,
    workers: int | None = None,
    data: dict[str, Any] | None = None,
    cache_file: str | Path | None = None,
    progress: bool = False,
    min_images_per_class: int = 0,
    checkpoint: CheckpointClasses | None = None,
) -> list[Problem]:
    """Every problem of the data set ``images_dir`` + ``annotations_file`` (module docstring).

    Args:
        images_dir: folder that the json's ``file_name`` entries are relative to.
        annotations_file: COCO instances json.
        num_queries: the model's number of queries; an image with more objects is an error.
        decode_images: decode every image completely (finds truncated files; slow on big sets). False
            reads only the headers (finds missing and non-image files, sizes).
        workers: processes for reading images (0: in this process; None: see :func:`reading_workers`).
        data: the json already loaded (``annotations_file`` is then only named in messages).
        cache_file: remember what each image read found there, and reuse it for files whose size and mtime
            are unchanged (:mod:`detr.data.image_checks`); None reads every file.
        progress: show a progress bar while reading many images.
        min_images_per_class: warn about categories with boxes on fewer images than this (0: no check); a
            fine-tune learns next to nothing about such a class.
        checkpoint: the classes of the checkpoint a fine-tune starts from: warn, naming them, about the
            categories it was not trained on, whose class rows start fresh (:func:`checkpoint_class_problems`).

    Returns:
        Problems: errors, then warnings, each group in json order, then one "info" summary (counts and
        the image with the most objects).
    """
    images_dir, annotations_file = Path(images_dir), Path(annotations_file)
    if data is None:
        try:
            data = load_coco_json(annotations_file)
        except AnnotationFileError as error:
            return [Problem("error", "invalid_json", str(error))]
    problems: list[Problem] = []

    def add(severity: Severity, kind: str, message: str, file_name: Any = None, annotation_id: Any = None) -> None:
        problems.append(Problem(severity, kind, message, None if file_name is None else str(file_name), annotation_id))

    structure = coco_structure_problems(data, annotations_file)
    if structure:
        return [Problem("error", "not_coco", message) for message in structure]
    annotations = data.get("annotations", [])

    # Categories.
    categories, category_problems = index_categories(data["categories"])
    for kind, message in category_problems:
        add("error", kind, message)
    if not categories:
        add("error", "no_categories", "'categories' is empty; list every category as {'id': int, 'name': str}")
    elif sorted(categories) != list(range(min(categories), min(categories) + len(categories))):
        gaps = sorted(set(range(min(categories), max(categories) + 1)) - set(categories))
        shown = ", ".join(map(str, gaps[:20])) + (" ..." if len(gaps) > 20 else "")
        add("warning", "category_id_gap", f"category ids are not contiguous ({len(gaps)} unused ids: {shown}); "
            "fine with contiguous labels (category_ids='auto'/'contiguous'), wasted logits with raw ids")

    keypoint_counts: dict[int, int] = {}  # category id → how many points it names
    for category in data["categories"]:
        if isinstance(category, dict) and category.get("id") in categories and "keypoints" in category:
            problem = category_keypoints_problem(category)
            if problem is not None:
                add("error", "invalid_category_keypoints", f"category {category['id']} ('{category.get('name')}'): "
                    f"{problem}; keypoints are names, skeleton 1-based index pairs, flip_pairs 0-based index pairs")
            elif isinstance(category["keypoints"], list):
                keypoint_counts[category["id"]] = len(category["keypoints"])

    # Images.
    images: dict[Any, dict[str, Any]] = {}
    file_names: Counter[str] = Counter()
    for position, image in enumerate(data["images"]):
        valid = isinstance(image, dict) and _hashable_id(image.get("id")) and isinstance(image.get("file_name"), str)
        if not valid:
            add("error", "invalid_image_entry", f"images[{position}] needs an integer 'id' and a 'file_name' "
                f"({image!r})")
        elif image["id"] in images:
            add("error", "duplicate_image_id", f"image id {image['id']} is used twice (also by "
                f"'{images[image['id']]['file_name']}')", image["file_name"])
        else:
            images[image["id"]] = image
            file_names[normalise_file_name(image["file_name"])] += 1
            if not isinstance(image["id"], int):
                add("error", "non_integer_image_id", f"images[{position}] has id {image['id']!r}, a string; image "
                    "ids must be integers (COCO evaluation and the data set key on them): renumber the images and "
                    "their annotations' image_id", image["file_name"])
    for name, count in file_names.items():
        if count > 1:
            add("warning", "duplicate_file_name", f"{count} image entries share this file_name", name)

    # Image files: only inside the images folder (detr.data.file_names), backslashes read as separators.
    to_read: dict[Any, dict[str, Any]] = {}
    backslashed: list[str] = []
    for image_id, image in images.items():
        unsafe = file_name_problem(image["file_name"])
        if unsafe is not None:
            add("error", "unsafe_file_name", unsafe_file_name_message(
                image["file_name"], unsafe, annotations_file=annotations_file, image_id=image_id, folder=images_dir),
                image["file_name"])
            continue
        if "\\" in image["file_name"]:
            backslashed.append(image["file_name"])
        to_read[image_id] = image
    if backslashed:
        shown = _first_of([f"'{name}'" for name in backslashed], 3)
        add("info", "backslash_file_names", f"{len(backslashed)} file_name(s) use backslashes as separators "
            f"(Windows paths: {shown}); read as '/' (sub\\a.jpg = sub/a.jpg)")
    folder = str(images_dir)  # strings, not Paths: pathlib's parsing costs seconds over 118k files
    paths = [join_file_name(folder, image["file_name"]) for image in to_read.values()]
    readings = read_images(paths, decode=decode_images, annotations_file=annotations_file,
                           workers=reading_workers(workers, len(paths), decode_images),
                           cache_file=None if cache_file is None else Path(cache_file), progress=progress)
    sizes: dict[Any, tuple[int, int]] = {}
    for (image_id, image), reading, path in zip(to_read.items(), readings, paths, strict=True):
        size, error, stored_size, orientation = reading.size, reading.error, reading.stored_size, reading.orientation
        if error is not None:
            kind = "missing_image" if not os.path.isfile(path) else "unreadable_image"
            add("error", kind, error, image["file_name"])
            json_size = (image.get("height"), image.get("width"))
            if is_finite_number(json_size[0]) and is_finite_number(json_size[1]):
                sizes[image_id] = (int(json_size[0]), int(json_size[1]))
            continue
        assert size is not None
        json_size = (image.get("height"), image.get("width"))
        if json_size != (None, None) and tuple(json_size) != tuple(size):
            hint = ""
            if orientation != 1 and stored_size is not None and tuple(json_size) == tuple(stored_size):
                hint = (f"; the file has EXIF orientation {orientation} and the json matches the un-rotated pixels: "
                        "annotations must be in the displayed frame")
            add("error", "image_size_mismatch", f"the file is {size[1]}x{size[0]} (width x height, EXIF applied) but "
                f"the json says {json_size[1]}x{json_size[0]}{hint}", image["file_name"])
        elif orientation != 1:
            # The sizes agree, so they cannot tell the frames apart (a square image, or a 180-degree turn or a
            # flip, which keep width and height): only the tag says that the pixels are turned.
            add("warning", "exif_orientation", f"the file has EXIF orientation {orientation}: the pipeline shows "
                "the model the displayed (turned) image, so its boxes must be drawn on the displayed image, as "
                "labelling tools do; if they were drawn on the stored pixels, apply the tag to the file "
                "(PIL.ImageOps.exif_transpose, then save without it) and turn the boxes with it", image["file_name"])
        sizes[image_id] = (int(size[0]), int(size[1]))

    # Annotations.
    annotation_ids: set[Any] = set()
    boxes_per_image: Counter[Any] = Counter()
    used_categories: set[int] = set()
    missing_fields: list[Any] = []
    without_segmentation: list[Any] = []
    crowds: list[tuple[Any, Any]] = []  # (file name, annotation id)
    mask_box_mismatches: list[Problem] = []
    # for the box-format tests below: boxes with a known image size, those reaching outside it, those that fit
    # inside it read as [x1, y1, x2, y2], both, and those in 0-1 units on an image of at least 64 pixels a side
    sized_boxes = outside_boxes = xyxy_like = outside_xyxy_like = normalised_like = 0
    images_per_category: dict[int, set[Any]] = defaultdict(set)
    bboxes_valid = (all(isinstance(a, dict) for a in annotations)  # a fast yes at COCO's size, else one by one
                    and all_coco_bboxes([a.get("bbox") for a in annotations]))
    for position, annotation in enumerate(annotations):
        if not isinstance(annotation, dict):
            add("error", "invalid_annotation", f"annotations[{position}] is not an object")
            continue
        ann_id = annotation.get("id")
        image = images.get(annotation.get("image_id")) if _hashable_id(annotation.get("image_id")) else None
        file_name = image["file_name"] if image else None
        if not _hashable_id(ann_id):
            add("error", "invalid_annotation", f"annotations[{position}] has no integer 'id'", file_name)
            ann_id = f"at position {position}"
        elif ann_id in annotation_ids:
            add("error", "duplicate_annotation_id", f"annotation id {ann_id} is used twice", file_name, ann_id)
        else:
            annotation_ids.add(ann_id)
        if image is None:
            add("error", "unknown_image_id", f"image_id {annotation.get('image_id')!r} is not in 'images'",
                None, ann_id)
        category_id = annotation.get("category_id")
        if not isinstance(category_id, int) or category_id not in categories:
            add("error", "unknown_category", f"category_id {category_id!r} is not in 'categories' (ids "
                f"{min(categories, default=None)}..{max(categories, default=None)}); add the category or fix the "
                "annotation", file_name, ann_id)
        else:
            used_categories.add(category_id)
        if "area" not in annotation or "iscrowd" not in annotation:
            missing_fields.append(ann_id)
        crowd = bool(annotation.get("iscrowd", 0))
        if crowd:
            crowds.append((file_name, ann_id))
        if annotation.get("segmentation") is None:
            without_segmentation.append(ann_id)
        else:
            size = sizes.get(annotation.get("image_id")) if image is not None else None
            for severity, kind, message in _segmentation_problems(annotation, size):
                if kind == "mask_box_mismatch":  # kept aside: a wrong box format (found below) explains them all
                    mask_box_mismatches.append(Problem(severity, kind, message, file_name, ann_id))
                else:
                    add(severity, kind, message, file_name, ann_id)
        if "keypoints" in annotation:
            size = sizes.get(annotation.get("image_id")) if image is not None else None
            for severity, kind, message in _keypoint_problems(annotation, keypoint_counts.get(category_id), size):
                add(severity, kind, message, file_name, ann_id)
        bbox = annotation.get("bbox")
        if not bboxes_valid and not is_coco_bbox(bbox):
            add("error", "invalid_bbox", f"bbox {bbox!r} is not [x, y, width, height] of 4 finite numbers",
                file_name, ann_id)
            continue
        x, y, w, h = (float(v) for v in bbox)
        if w <= 0 or h <= 0:
            add("error", "zero_size_box", f"bbox {bbox} has zero or negative width/height; the pipeline drops it, "
                "so the object is lost: fix or remove the annotation", file_name, ann_id)
            continue
        size = sizes.get(annotation.get("image_id")) if image is not None else None
        if size is not None:
            height, width = size
            tol = OUTSIDE_TOLERANCE
            sized_boxes += 1
            outside = x < -tol or y < -tol or x + w > width + tol or y + h > height + tol
            corners = 0 <= x < w <= width + tol and 0 <= y < h <= height + tol  # [x1, y1, x2, y2] inside the image
            outside_boxes += outside
            xyxy_like += corners
            outside_xyxy_like += outside and corners
            normalised_like += min(height, width) >= 64 and max(x, y, w, h) <= 1 + 1e-6
            if x >= width or y >= height or x + w <= 0 or y + h <= 0:
                add("error", "box_outside_image", f"bbox {bbox} lies entirely outside the {width}x{height} image; "
                    "the pipeline drops it", file_name, ann_id)
                continue
            if x < -tol or y < -tol or x + w > width + tol or y + h > height + tol:
                add("error", "box_outside_image", f"bbox {bbox} (x1={x + w:g}, y1={y + h:g}) reaches outside the "
                    f"{width}x{height} image; the pipeline clips it, which changes the box: check the annotation",
                    file_name, ann_id)
        if image is not None and not crowd:
            boxes_per_image[annotation["image_id"]] += 1
            if category_id in categories:
                images_per_category[category_id].add(annotation["image_id"])

    # Corners: x2 > x1 and y2 > y1 always, and x1 + x2 runs past the width for every box right of the middle.
    # A wrong box format is the root cause of every mask/box disagreement and box error it brings: it comes
    # first, and the mask warnings it explains are counted in it, not listed.
    root_causes: list[Problem] = []
    explained = f"; it also explains the {len(mask_box_mismatches)} masks that disagree with their boxes" \
        if mask_box_mismatches else ""
    if (sized_boxes >= 4 and outside_xyxy_like >= XYXY_MIN_OUTSIDE * sized_boxes
            and xyxy_like >= XYXY_MIN_CORNERS * sized_boxes):
        root_causes.append(Problem("error", "boxes_look_like_xyxy", (
            f"bbox looks like [x1, y1, x2, y2] in '{annotations_file}': {outside_xyxy_like} of {sized_boxes} boxes "
            f"run past their image as [x, y, width, height] and {xyxy_like} fit inside it as corners; COCO wants "
            f"[x, y, width, height]: convert with width = x2 - x1, height = y2 - y1{explained}")))
    if sized_boxes and normalised_like >= XYXY_MIN_CORNERS * sized_boxes:
        root_causes.append(Problem("error", "boxes_look_normalised", (
            f"bbox looks normalised to 0-1 in '{annotations_file}': {normalised_like} of {sized_boxes} boxes lie "
            "within 1 pixel of the corner of images of 64 or more pixels a side (YOLO-style units), so every box "
            "would train as a dot in the corner; COCO wants pixels: multiply x and width by the image width, y and "
            f"height by its height (from YOLO's centre x, y: x = (cx - w / 2) * width){explained}")))
    if root_causes:
        problems[:0] = root_causes
    else:
        problems += mask_box_mismatches
    few = sorted((len(images_per_category[c]), c) for c in images_per_category
                 if len(images_per_category[c]) < min_images_per_class)
    if few:
        shown = _first_of([f"'{categories[c]}' (id {c}): {n}" for n, c in few], 8)
        add("warning", "few_images_per_class", f"{len(few)} categories have boxes on fewer than "
            f"{min_images_per_class} images in '{annotations_file}': {shown}; a fine-tune learns next to "
            "nothing about them (near 0 AP): label more images of each, or merge or drop the category")
    if checkpoint is not None:
        problems += checkpoint_class_problems(categories, checkpoint, annotations_file)
    if not any(boxes_per_image.values()):
        add("error", "no_annotations", f"'{annotations_file}' has no (non-crowd) box on any of its {len(images)} "
            "images: a model trained on it learns only 'no object' and evaluation has nothing to score; is it the "
            "right file (an image-info or test-dev json)?")
    busiest = max(boxes_per_image.items(), key=lambda item: item[1], default=(None, 0))
    empty_images = [image["file_name"] for image_id, image in images.items() if boxes_per_image[image_id] == 0]
    add("info", "summary", f"{len(images)} images, {len(annotations)} annotations ({len(crowds)} crowd), "
        f"{len(empty_images)} images without boxes, {len(categories)} categories; "
        f"most objects in one image: {busiest[1]} (num_queries={num_queries})",
        images[busiest[0]]["file_name"] if busiest[0] is not None else None)
    for image_id, count in boxes_per_image.items():
        if count > num_queries:
            add("error", "too_many_objects", f"{count} objects but the model has num_queries={num_queries}: at most "
                f"{num_queries} can be matched; raise num_queries", images[image_id]["file_name"])
    # Facts about many items, one line per kind (one item keeps its own line, with its file and annotation).
    if len(crowds) == 1:
        add("warning", "crowd", "crowd annotation: left out of the training targets, kept for evaluation", *crowds[0])
    elif crowds:
        shown = _first_of([f"{a} ({f})" if f is not None else str(a) for f, a in crowds], 5)
        add("warning", "crowd", f"{len(crowds)} crowd annotations (ids {shown}): left out of the training targets, "
            "kept for evaluation")
    if len(empty_images) == 1:
        add("warning", "no_boxes", "image without (non-crowd) boxes: trains only 'no object'", empty_images[0])
    elif empty_images:
        add("warning", "no_boxes", f"{len(empty_images)} of {len(images)} images have no (non-crowd) box: they train "
            f"only 'no object' ({_first_of([repr(n) for n in empty_images], 5)})")
    unused = [f"{c} ('{categories[c]}')" for c in sorted(set(categories) - used_categories)]
    if unused:
        add("warning", "unused_category", f"{len(unused)} of {len(categories)} categories have no annotation: "
            f"{_first_of(unused, 8)}" if len(unused) > 1 else f"category {unused[0]} has no annotation")
    if missing_fields:
        shown = ", ".join(map(str, missing_fields[:10])) + (" ..." if len(missing_fields) > 10 else "")
        add("warning", "missing_field", f"{len(missing_fields)} annotation(s) lack 'area' or 'iscrowd' (ids {shown}); "
            "the data set fills in area = w * h and iscrowd = 0 for evaluation")
    if without_segmentation and len(without_segmentation) < len(annotations):
        shown = ", ".join(map(str, without_segmentation[:10])) + (" ..." if len(without_segmentation) > 10 else "")
        add("warning", "missing_segmentation", f"{len(without_segmentation)} annotation(s) have no 'segmentation' "
            f"while the others have one (ids {shown}): training with masks (--data.masks true) refuses the file and "
            "evaluation reports box AP only")
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(problems, key=lambda p: order[p.severity])  # stable: json order within each group


def check_converted(split: ConvertedSplit, **options: Any) -> list[Problem]:
    """Every problem of a YOLO or VOC split (:mod:`detr.data.converted`): what its reader could not read, each
    an error named by its label file and line (the file and line as the problem's ``file_name``), then
    :func:`check_dataset` of the rest, which takes ``options``."""
    unread = [Problem("error", problem.kind, problem.message,
                      f"{problem.path}:{problem.line}" if problem.line is not None else str(problem.path))
              for problem in split.problems]
    return unread + check_dataset(split.images_dir, split.source, data=split.data, **options)


def _first_of(items: list[str], count: int) -> str:
    """The first ``count`` of ``items`` joined by ", ", then how many more there are."""
    return ", ".join(items[:count]) + (f" and {len(items) - count} more" if len(items) > count else "")


@dataclass(frozen=True)
class CheckpointClasses:
    """The classes of the checkpoint a fine-tune starts from.

    source: the checkpoint as the user named it (for messages).
    num_classes: the classes of its class head (logits without "no object").
    category_map: label → category id and name as the checkpoint records it (None where it records none).
    """

    source: str
    num_classes: int
    category_map: CategoryMap | None = None


def checkpoint_class_problems(categories: dict[int, str], checkpoint: CheckpointClasses,
                              annotations_file: str | Path) -> list[Problem]:
    """What a fine-tune of ``checkpoint`` on a json with ``categories`` (``{id: name}``) should know.

    The training system carries the class rows by name (``--model.init_classes by_name``,
    :mod:`detr.checkpoints.finetune`): a class the checkpoint names keeps its trained row whatever its id here,
    a new class starts fresh. Nothing is said when the checkpoint knows every class; a warning names the classes
    that start fresh; an error names a name that matches no single row (as ``detr fit`` refuses it). A checkpoint that names no classes is matched by label: a head of another size starts
    fresh (a warning, naming ``--data.category_ids`` where the other convention would keep it).
    """
    if not categories:
        return []
    where = f"'{annotations_file}'"
    theirs = checkpoint.category_map
    if theirs is not None:
        ambiguous = ambiguous_class_names([categories[i] for i in sorted(categories)], list(theirs.names))
        if ambiguous is not None:  # detr fit refuses it (detr.checkpoints.finetune.check_class_match)
            return [Problem("error", "checkpoint_class_names", f"{checkpoint.source} and {where}: {ambiguous}")]
        known = {class_name_key(name) for name in theirs.names} - {None}
        new = [f"'{name}'" for name in categories.values() if class_name_key(name) not in known]
        if not new:
            return []
        carried = len(categories) - len(new)
        return [Problem("warning", "checkpoint_class_head", (
            f"{checkpoint.source} was not trained on {len(new)} of the {len(categories)} classes of {where}: "
            f"{_first_of(new, 5)}: their class rows start fresh (fine for new classes; they need more steps and "
            f"images than the {carried} whose rows carry over by name)" if carried else
            f"{checkpoint.source} knows none of the {len(categories)} classes of {where}: the class rows start "
            f"fresh (fine for new classes; the rest of the model carries over)"))]
    listed = [{"id": i, "name": n} for i, n in categories.items()]
    auto = "raw" if CategoryMap.is_coco_like(listed) else "contiguous"
    counts = {"contiguous": CategoryMap.from_coco_categories(listed, contiguous=True).num_classes}
    if min(categories) >= 0:
        counts["raw"] = CategoryMap.from_coco_categories(listed, contiguous=False).num_classes
    if counts[auto] == checkpoint.num_classes:
        return []
    message = (f"{checkpoint.source} has a {checkpoint.num_classes}-class head and names no classes, {where} "
               f"{counts[auto]} classes (--data.category_ids auto: {auto} ids): the class head starts fresh for the "
               "new class count (fine for new classes")
    other = next((name for name, count in counts.items() if name != auto and count == checkpoint.num_classes), None)
    message += f"; pass --data.category_ids {other} to keep its head)" if other is not None else ")"
    return [Problem("warning", "checkpoint_class_head", message)]


def _keypoint_problems(annotation: dict[str, Any], num_keypoints: int | None, size: tuple[int, int] | None
                       ) -> list[tuple[Severity, str, str]]:
    """(severity, kind, message) of what is wrong with ``annotation``'s ``keypoints`` for a category of
    ``num_keypoints`` named points (None: its category names none) in an image of ``size`` (height, width; None
    when unknown: not checked against the image)."""
    problem = annotation_keypoints_problem(annotation, num_keypoints)
    if problem is not None:
        return [("error", "invalid_keypoints", f"{problem}; training with keypoints refuses the file and OKS AP "
                 "cannot be computed: fix the annotation")]
    found: list[tuple[Severity, str, str]] = []
    if num_keypoints is None and annotation["keypoints"]:
        found.append(("error", "unnamed_keypoints", "the annotation has keypoints but its category lists no "
                      "'keypoints' names (nor a 'skeleton'); add them to the category"))
    if size is not None:
        height, width = size
        values = annotation["keypoints"]
        outside = points_outside(values, height, width, tolerance=OUTSIDE_TOLERANCE)
        if outside:
            shown = ", ".join(f"{k} ({values[3 * k]:g}, {values[3 * k + 1]:g})" for k in outside[:5])
            found.append(("error", "keypoint_outside_image", f"labelled keypoint(s) {shown} lie outside the "
                          f"{width}x{height} image (0-based index, x, y); training marks them not labelled: fix "
                          "them, or set their v to 0"))
    return found


def _segmentation_problems(annotation: dict[str, Any], size: tuple[int, int] | None
                           ) -> list[tuple[Severity, str, str]]:
    """(severity, kind, message) of what is wrong with ``annotation``'s ``segmentation`` in an image of ``size``
    (height, width; None when unknown: the mask is then not drawn)."""
    segmentation = annotation["segmentation"]
    height, width = size if size is not None else (-1, -1)
    problem = segmentation_problem(segmentation, height, width)
    if problem is not None:
        return [("error", "invalid_segmentation", f"the segmentation has {problem}; training with masks refuses "
                 "the file and mask AP cannot be computed: fix or redraw it")]
    if size is None:
        return []
    rle = segmentation_to_rle(segmentation, height, width)
    area = float(mask_utils.area(rle))
    if area == 0:
        return [("error", "empty_mask", "the segmentation covers no pixel of the image (a polygon outside it, or "
                 "of no area): fix or remove the annotation")]
    bbox = annotation.get("bbox")
    if not is_coco_bbox(bbox) or bbox[2] <= 0 or bbox[3] <= 0:
        return []
    extent = [float(v) for v in mask_utils.toBbox(rle)]  # xywh around the mask's pixels
    iou = float(mask_utils.iou([extent], [[float(v) for v in bbox]], [0])[0, 0])
    box_area = float(bbox[2]) * float(bbox[3])
    if iou < MASK_BOX_MIN_IOU:
        return [("warning", "mask_box_mismatch", f"the mask's extent {[round(v, 1) for v in extent]} and the bbox "
                 f"{bbox} overlap by IoU {iou:.2f}: one of them is off (shifted, or another object's)")]
    if area > box_area * 1.05 + 2 * (bbox[2] + bbox[3]):  # a rasterised polygon reaches at most a pixel past it
        return [("warning", "mask_box_mismatch", f"the mask covers {area:g} pixels, more than its bbox {bbox} "
                 f"({box_area:g}): one of them is off")]
    return []


def summarize(problems: Iterable[Problem]) -> dict[str, Counter[str]]:
    """Counts per kind, by severity: ``{"error": Counter, "warning": Counter, "info": Counter}``."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for problem in problems:
        counts[problem.severity][problem.kind] += 1
    return {severity: counts[severity] for severity in ("error", "warning", "info")}


def format_problems(problems: list[Problem], *, max_per_kind: int = 20) -> str:
    """A readable report: per severity and kind, a count and the first ``max_per_kind`` problems."""
    if not problems:
        return "no problems found"
    lines: list[str] = []
    counts = summarize(problems)
    for severity in ("error", "warning", "info"):
        if not counts[severity]:
            continue
        lines.append(f"{sum(counts[severity].values())} {severity}(s):")
        for kind, count in counts[severity].items():
            lines.append(f"  {kind} ({count}):")
            shown = [p for p in problems if p.severity == severity and p.kind == kind][:max_per_kind]
            lines.extend(f"    {p}" for p in shown)
            if count > len(shown):
                lines.append(f"    ... and {count - len(shown)} more")
    return "\n".join(lines)


def has_errors(problems: Iterable[Problem]) -> bool:
    """True if any problem would hurt training (the checker's exit code 1)."""
    return any(p.severity == "error" for p in problems)
