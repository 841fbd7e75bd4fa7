"""Check a COCO-panoptic-format split before training: every image and PNG is there and every PNG agrees
with its image's size and its ``segments_info``.

:class:`detr.data.coco_panoptic.CocoPanoptic` reads a sample's PNG only when the sample is drawn, and a
segment whose id is not in its PNG silently becomes no target at all. A long run should learn about both
before its first step, with the file to fix: :func:`check_panoptic_split` lists the problems and
:func:`raise_for_problems` turns them into one :class:`PanopticDataError`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from detr.data.images import ImageLoadError, read_image_header

PngCheck = Literal["full", "files", "off"]


class PanopticDataError(ValueError):
    """A panoptic split whose files are missing or whose PNGs contradict the json."""


def _check_png(dataset: Any, index: int) -> list[str]:
    annotation, png_path = dataset.annotations[index], dataset.png_path(index)
    try:
        ids, segments = dataset.ground_truth(index)
    except (OSError, ValueError) as error:
        return [f"panoptic PNG '{png_path}' cannot be read ({error})"]
    problems = []
    try:  # the header: the size the image is read at (EXIF orientation applied), as the training sample sees it
        height, width = read_image_header(dataset.image_path(index)).size
    except ImageLoadError as error:
        problems.append(str(error))
    else:
        if ids.shape != (height, width):  # the sample would fail at this image, mid-run
            problems.append(f"panoptic PNG '{png_path}' is {ids.shape[1]}x{ids.shape[0]} but its image "
                            f"'{dataset.image_path(index)}' is {width}x{height} (width x height)")
    present = set(np.unique(ids).tolist()) - {0}
    listed = {int(segment["id"]) for segment in segments}
    absent = sorted(listed - present)
    if absent:
        problems.append(f"segment ids {absent[:5]} of image {annotation['image_id']} in the json are not in its PNG "
                        f"'{png_path}' (ids are R + 256·G + 256²·B)")
    unlisted = sorted(present - listed)
    if unlisted:
        problems.append(f"PNG '{png_path}' has segment ids {unlisted[:5]} that image {annotation['image_id']}'s "
                        f"segments_info does not list")
    return problems


def check_panoptic_split(dataset: Any, mode: PngCheck = "full", *, workers: int = 1) -> list[str]:
    """Problems of one :class:`detr.data.coco_panoptic.CocoPanoptic` split, each naming its file.

    ``mode``: "files" checks that every image and PNG exists and every segment's category is one of the json's;
    "full" also reads every PNG (with ``workers`` threads), compares its size with its image's (from the image's
    header) and its ids with ``segments_info`` both ways; "off" checks nothing.
    """
    if mode == "off":
        return []
    if mode not in ("full", "files"):
        raise ValueError(f"panoptic data check must be 'full', 'files' or 'off', got {mode!r}")
    problems = []
    category_ids = {int(category["id"]) for category in dataset.categories}
    for index, annotation in enumerate(dataset.annotations):
        image_path, png_path = dataset.image_path(index), dataset.png_path(index)
        if not image_path.is_file():
            problems.append(f"image '{image_path}' (image {annotation['image_id']}) does not exist")
        if not png_path.is_file():
            problems.append(f"panoptic PNG '{png_path}' (image {annotation['image_id']}) does not exist")
        unknown = sorted({int(s["category_id"]) for s in annotation["segments_info"]} - category_ids)
        if unknown:
            problems.append(f"image {annotation['image_id']} has segments of categories {unknown} that "
                            f"'{dataset.annotations_file}' does not list in 'categories'")
    if mode == "full" and not problems:
        with ThreadPoolExecutor(max(1, workers)) as pool:  # PIL decodes outside the GIL
            for found in pool.map(lambda index: _check_png(dataset, index), range(len(dataset))):
                problems.extend(found)
    return problems


def raise_for_problems(split: str, dataset: Any, problems: list[str], *, max_listed: int = 10) -> None:
    """Raise :class:`PanopticDataError` listing ``problems`` of ``split`` (no-op without any)."""
    if not problems:
        return
    listed = "\n".join(f"  - {problem}" for problem in problems[:max_listed])
    more = f"\n  … and {len(problems) - max_listed} more" if len(problems) > max_listed else ""
    raise PanopticDataError(
        f"the {split} split ('{dataset.annotations_file}', images in '{dataset.images_dir}', PNGs in "
        f"'{dataset.panoptic_dir}') has {len(problems)} problem(s):\n{listed}{more}\n"
        "Each PNG must be the one written with this json (COCO: unzip panoptic_train2017.zip and "
        "panoptic_val2017.zip from panoptic_annotations_trainval2017.zip into annotations/; the shapes set: "
        "python tools/make_shapes.py --panoptic --force), and each image must be in the images folder; "
        "remove the annotations of images you do not have."
    )
