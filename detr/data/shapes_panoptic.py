"""Panoptic annotations for the synthetic shapes (:mod:`detr.data.shapes`), in COCO's panoptic format.

The images are the detection set's, pixel for pixel (same seed → same renderer calls), so both annotation
kinds can live under one root::

    ROOT/train2017/000000000001.jpg ...                      (as written by write_shapes_dataset)
    ROOT/annotations/panoptic_train2017.json                 images, annotations (segments_info), categories
    ROOT/annotations/panoptic_train2017/000000000001.png     ids as R + 256·G + 256²·B

Categories: the five shapes are things (ids 1–5, as in the detection set); every other pixel, clutter
lines included, is the stuff class "background" (id 6), so nothing is void. A shape's mask is the pixels
the renderer drew it with, so ``area`` and ``bbox`` (pixel edges, [x, y, w, h]) equal the detection
annotations'.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from detr.atomic_files import write_text_atomically
from detr.data.shapes import (
    _SPLITS,
    ShapesConfig,
    read_json_written_with,
    render_shapes_image,
    shapes_parameters,
)

logger = logging.getLogger(__name__)

def background_id(config: ShapesConfig) -> int:
    """The one stuff class's category id (everything that is not a shape): the one after the shapes'."""
    return len(config.shapes) + 1


#: The default set's background id.
BACKGROUND_ID = background_id(ShapesConfig())


def shapes_panoptic_categories(config: ShapesConfig = ShapesConfig()) -> list[dict[str, Any]]:
    """The ``categories`` of the panoptic json: the shapes (things) 1..K, the background (stuff) K + 1."""
    things = [{"id": i + 1, "name": name, "supercategory": "shape", "isthing": 1}
              for i, name in enumerate(config.shapes)]
    return things + [{"id": background_id(config), "name": "background", "supercategory": "background",
                      "isthing": 0}]


def _segments(id_map: np.ndarray, categories: dict[int, int]) -> list[dict[str, Any]]:
    segments = []
    for segment_id, category_id in categories.items():
        ys, xs = np.nonzero(id_map == segment_id)
        if len(xs) == 0:
            continue
        x0, y0 = int(xs.min()), int(ys.min())
        segments.append({"id": segment_id, "category_id": category_id, "iscrowd": 0, "area": int(len(xs)),
                         "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0]})
    return segments


def render_panoptic(config: ShapesConfig, split: str, index: int
                    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Image ``index`` of ``split``: (RGB uint8 [S, S, 3], segment id map int32 [S, S], segments_info)."""
    rng = np.random.default_rng([config.seed, _SPLITS[split], index])
    masks: list[np.ndarray] = []
    pixels, objects = render_shapes_image(rng, config, masks)
    size = config.image_size
    id_map = np.zeros((size, size), dtype=np.int32)
    categories = {}
    for position, (shape, mask) in enumerate(zip(objects, masks)):  # shapes never overlap
        id_map[mask] = position + 1
        categories[position + 1] = shape.category_id
    background = len(objects) + 1
    id_map[id_map == 0] = background
    categories[background] = background_id(config)
    return pixels, id_map, _segments(id_map, categories)


def _panoptic_json(root: Path, split: str) -> Path:
    return root / "annotations" / f"panoptic_{split}.json"


def write_shapes_panoptic(root: str | Path, config: ShapesConfig = ShapesConfig(), *, overwrite: bool = False) -> bool:
    """Write the panoptic annotations (and the images, where missing) of both splits under ``root``.

    Idempotent like :func:`detr.data.shapes.write_shapes_dataset`: a root whose panoptic jsons were written
    with ``config`` is kept (unless ``overwrite``). Returns True if files were written.
    """
    root = Path(root)
    if not overwrite and all(_is_complete(root, split, config) for split in _SPLITS):
        logger.info("panoptic shapes annotations in '%s' are complete; nothing to do", root)
        return False
    for split, count in (("train2017", config.num_train), ("val2017", config.num_val)):
        target = _panoptic_json(root, split)
        target.unlink(missing_ok=True)  # an interrupted rewrite must not look complete
        png_folder, image_folder = target.with_suffix(""), root / split
        png_folder.mkdir(parents=True, exist_ok=True)
        image_folder.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            pixels, id_map, segments = render_panoptic(config, split, index)
            image_id = index + 1
            file_name = f"{image_id:012d}.jpg"
            if not (image_folder / file_name).is_file():
                Image.fromarray(pixels).save(image_folder / file_name, quality=config.jpeg_quality)
            rgb = np.stack([id_map % 256, id_map // 256 % 256, id_map // 65536], axis=-1).astype(np.uint8)
            Image.fromarray(rgb).save(png_folder / f"{image_id:012d}.png")
            images.append({"id": image_id, "file_name": file_name, "width": config.image_size,
                           "height": config.image_size})
            annotations.append({"image_id": image_id, "file_name": f"{image_id:012d}.png", "segments_info": segments})
        data = {"info": {"description": "detr synthetic shapes, panoptic (detr.data.shapes_panoptic)",
                         "parameters": shapes_parameters(config)},
                "images": images, "annotations": annotations, "categories": shapes_panoptic_categories(config)}
        write_text_atomically(target, json.dumps(data))  # the json appears last: the split is complete
        logger.info("wrote panoptic annotations of %d %s images to '%s'", count, split, target)
    return True


def _is_complete(root: Path, split: str, config: ShapesConfig) -> bool:
    path = _panoptic_json(root, split)
    data = read_json_written_with(path, config)
    if data is None:
        return False
    png_folder = path.with_suffix("")
    return all((png_folder / a["file_name"]).is_file() for a in data.get("annotations", [])) and all(
        (root / split / image["file_name"]).is_file() for image in data.get("images", []))
