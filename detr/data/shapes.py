"""A deterministic synthetic detection data set in COCO format: coloured shapes on noisy backgrounds.

Small enough to train DETR on a CPU in minutes, yet a real detection task: five shape classes that differ
in outline (a circle and an ellipse differ only in aspect ratio), random colours, sizes, rotations and
counts (0..``max_objects``), some images with no object, gradients, noise and unlabelled clutter lines.
The layout is COCO's, so every tool that reads COCO reads it::

    ROOT/train2017/000000000001.jpg ...
    ROOT/val2017/000000000001.jpg ...
    ROOT/annotations/instances_train2017.json
    ROOT/annotations/instances_val2017.json

Boxes are the exact extent of each shape's rendered pixels (COCO [x, y, w, h], pixel edges), ``area`` is
the pixel count, ``segmentation`` the polygon (rounded to 0.01 px: rasterised by pycocotools it differs from the
drawn pixels at a few edge pixels) or, with ``mask_format="rle"``, the drawn pixels themselves as a compressed
COCO RLE (pycocotools' ``encode``), so that instance masks train on exactly what was drawn. With ``keypoints=True``
each shape also has its corners or vertices as COCO ``keypoints`` (some covered, v = 1) and each category their
names, skeleton, ``flip_pairs`` and OKS ``sigmas`` (:mod:`detr.data.shapes_keypoints`). Image ``i`` of a split
depends only on (seed, split, i), so the same parameters always give the same files.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

from detr.atomic_files import write_text_atomically
from detr.data.shapes_keypoints import OCCLUDED_SHARE, keypoint_category_fields, shape_keypoints

logger = logging.getLogger(__name__)

#: The default set's category names; category id = position + 1.
SHAPE_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "ellipse", "star")
#: Every shape the generator draws: the default five, then the ones a second set can add as new classes (a
#: fine-tuning benchmark's target set: ``ShapesConfig(shapes=("circle", "cross", ...))``).
ALL_SHAPES: tuple[str, ...] = SHAPE_NAMES + ("cross", "arrow", "semicircle", "pentagon", "hexagon")

_SPLITS = {"train2017": 0, "val2017": 1}


@dataclass(frozen=True)
class ShapesConfig:
    """Parameters of the synthetic set (defaults: CPU-sized training).

    num_train, num_val: images per split.
    image_size: square images of this many pixels.
    max_objects: most shapes in one image; a non-empty image has randint(1, max_objects).
    empty_fraction: share of images with no shape at all.
    min_object_size, max_object_size: diameter range (pixels) of a shape's circumscribed circle,
        drawn log-uniformly.
    seed: everything follows from it.
    jpeg_quality: quality of the written JPEG files.
    mask_format: each annotation's ``segmentation``: "polygon" (the drawn polygon) or "rle" (the drawn pixels).
    shapes: the classes, in category id order (names from :data:`ALL_SHAPES`; default :data:`SHAPE_NAMES`).
    keypoints: also each shape's corners or vertices as keypoints (:mod:`detr.data.shapes_keypoints`); a quarter of
        the shapes get one of them covered, which changes those images.
    """

    num_train: int = 2000
    num_val: int = 200
    image_size: int = 128
    max_objects: int = 6
    empty_fraction: float = 0.1
    min_object_size: int = 12
    max_object_size: int = 48
    seed: int = 0
    jpeg_quality: int = 92
    mask_format: Literal["polygon", "rle"] = "polygon"
    shapes: tuple[str, ...] = SHAPE_NAMES
    keypoints: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(self.shapes))  # a list from a caller or a json
        unknown = [name for name in self.shapes if name not in ALL_SHAPES]
        if unknown or not self.shapes or len(set(self.shapes)) != len(self.shapes):
            raise ValueError(f"shapes must be distinct names from {','.join(ALL_SHAPES)}, got {list(self.shapes)}"
                             + (f" ({', '.join(unknown)} is not one)" if unknown else ""))
        if self.mask_format not in ("polygon", "rle"):
            raise ValueError(f"mask_format must be 'polygon' or 'rle', got {self.mask_format!r}")
        if self.num_train < 0 or self.num_val < 0:
            raise ValueError(f"num_train and num_val must be >= 0, got {self.num_train}, {self.num_val}")
        if self.image_size < 16:
            raise ValueError(f"image_size must be at least 16 pixels, got {self.image_size}")
        if not 4 <= self.min_object_size <= self.max_object_size <= self.image_size:
            raise ValueError(
                "need 4 <= min_object_size <= max_object_size <= image_size, got "
                f"{self.min_object_size}, {self.max_object_size}, {self.image_size}"
            )
        if self.max_objects < 1 or not 0.0 <= self.empty_fraction <= 1.0:
            raise ValueError(
                f"need max_objects >= 1 and 0 <= empty_fraction <= 1, got {self.max_objects}, {self.empty_fraction}"
            )


@dataclass(frozen=True)
class ShapeObject:
    """One rendered shape: category_id (1-based, see SHAPE_NAMES), bbox_xywh pixel edges, area in pixels,
    polygon [x0, y0, x1, y1, ...] in pixels, keypoints COCO's [x1, y1, v1, ...] (continuous pixels; empty without
    ``ShapesConfig.keypoints``)."""

    category_id: int
    bbox_xywh: tuple[float, float, float, float]
    area: int
    polygon: tuple[float, ...]
    keypoints: tuple[float, ...] = ()


def shape_polygon(name: str, center: tuple[float, float], radius: float, angle: float, aspect: float) -> np.ndarray:
    """Vertices float [N, 2] (x, y) of a shape inscribed in the circle (center, radius), rotated by ``angle``.

    ``aspect`` (0..1] is the ellipse's minor/major axis ratio; other shapes ignore it.
    """
    cx, cy = center
    if name == "circle":
        t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
        xy = np.stack([np.cos(t), np.sin(t)], axis=1) * radius
    elif name == "ellipse":
        t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
        xy = np.stack([np.cos(t), aspect * np.sin(t)], axis=1) * radius
    elif name in ("square", "triangle"):
        corners = 4 if name == "square" else 3
        t = np.arange(corners) * 2 * math.pi / corners + math.pi / corners
        xy = np.stack([np.cos(t), np.sin(t)], axis=1) * radius
    elif name == "star":
        t = np.arange(10) * math.pi / 5 - math.pi / 2
        r = np.where(np.arange(10) % 2 == 0, radius, 0.45 * radius)
        xy = np.stack([np.cos(t) * r, np.sin(t) * r], axis=1)
    elif name in ("pentagon", "hexagon"):
        corners = 5 if name == "pentagon" else 6
        t = np.arange(corners) * 2 * math.pi / corners - math.pi / 2
        xy = np.stack([np.cos(t), np.sin(t)], axis=1) * radius
    elif name == "cross":  # a plus sign: arms a third of the diameter wide
        a, b = 1 / 3, 0.94
        xy = np.array([(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a), (-b, a),
                       (-b, -a), (-a, -a)]) * radius
    elif name == "arrow":  # a shaft and a triangular head, pointing along +x
        xy = np.array([(-0.95, -0.2), (0.2, -0.2), (0.2, -0.6), (0.95, 0.0), (0.2, 0.6), (0.2, 0.2),
                       (-0.95, 0.2)]) * radius
    elif name == "semicircle":  # the half disc, its straight edge through the centre
        t = np.linspace(0, math.pi, 25)
        xy = np.stack([np.cos(t), np.sin(t)], axis=1) * radius
    else:
        raise ValueError(f"unknown shape {name!r}; choose one of {ALL_SHAPES}")
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return xy @ rotation.T + np.array([cx, cy])


def background_gradient(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """float [size, size, 3] gradient between two random colours, and its mean colour."""
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    direction = rng.uniform(0, 2 * math.pi)
    ramp = np.linspace(-0.5, 0.5, size)
    t = math.cos(direction) * ramp[None, :] + math.sin(direction) * ramp[:, None] + 0.5  # [size, size] in 0..1
    image = start + (end - start) * t[:, :, None]
    return image, (start + end) / 2


def object_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A random colour far enough from the background's mean to stay visible under the noise."""
    for _ in range(50):
        colour = rng.uniform(0, 255, 3)
        if np.abs(colour - background).sum() > 150:
            return colour
    return 255.0 - background


def render_shapes_image(rng: np.random.Generator, config: ShapesConfig,
                        masks: list[np.ndarray] | None = None) -> tuple[np.ndarray, list[ShapeObject]]:
    """One image: uint8 [S, S, 3] RGB and its shapes (non-overlapping, fully inside the image).

    ``masks``: a list that receives each shape's drawn pixels, bool [S, S] (the panoptic annotations use
    them: the stored polygon is rounded, so rasterising it again may differ by a few edge pixels)."""
    size = config.image_size
    canvas, mean_colour = background_gradient(rng, size)
    image = Image.fromarray(canvas.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 4))):  # unlabelled clutter
        points = rng.uniform(0, size, 4).tolist()
        draw.line(points, fill=tuple(int(c) for c in rng.uniform(0, 255, 3)), width=int(rng.integers(1, 3)))
    count = 0 if rng.random() < config.empty_fraction else int(rng.integers(1, config.max_objects + 1))
    occupied = np.zeros((size, size), dtype=bool)
    objects: list[ShapeObject] = []
    for _ in range(count):
        category = int(rng.integers(len(config.shapes)))
        diameter = math.exp(rng.uniform(math.log(config.min_object_size), math.log(config.max_object_size)))
        radius = diameter / 2
        angle = rng.uniform(0, 2 * math.pi)
        aspect = rng.uniform(0.35, 0.6)
        colour = tuple(int(c) for c in object_colour(rng, mean_colour))
        for _attempt in range(20):
            center = (rng.uniform(radius, size - radius), rng.uniform(radius, size - radius))
            polygon = shape_polygon(config.shapes[category], center, radius, angle, aspect)
            mask_image = Image.new("L", (size, size), 0)
            ImageDraw.Draw(mask_image).polygon([tuple(p) for p in polygon.tolist()], fill=255)
            mask = np.asarray(mask_image) > 0
            ys, xs = np.nonzero(mask)
            if len(xs) == 0:
                continue
            x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            if occupied[max(y0 - 2, 0) : y1 + 2, max(x0 - 2, 0) : x1 + 2].any():
                continue
            occupied[y0:y1, x0:x1] = True
            image.paste(colour, mask=mask_image)
            if masks is not None:
                masks.append(mask)
            keypoints: tuple[float, ...] = ()
            if config.keypoints:
                box = (int(x0), int(y0), int(x1), int(y1))
                keypoints = _keypoints_of(rng, draw, config.shapes[category], polygon, center, radius, box)
            objects.append(
                ShapeObject(
                    category_id=category + 1,
                    bbox_xywh=(float(x0), float(y0), float(x1 - x0), float(y1 - y0)),
                    area=int(mask.sum()),
                    polygon=tuple(round(float(v), 2) for v in polygon.reshape(-1)),
                    keypoints=keypoints,
                )
            )
            break
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels + rng.normal(0.0, rng.uniform(3.0, 15.0), pixels.shape)  # sensor-like noise everywhere
    return pixels.clip(0, 255).round().astype(np.uint8), objects


def _keypoints_of(rng: np.random.Generator, draw: ImageDraw.ImageDraw, shape: str, polygon: np.ndarray,
                  center: tuple[float, float], radius: float, box: tuple[int, int, int, int]) -> tuple[float, ...]:
    """A drawn shape's points as COCO's flat [x, y, v, ...], after covering one of them, with
    :data:`~detr.data.shapes_keypoints.OCCLUDED_SHARE`, by a patch of random colour clipped to the shape's ``box``
    (pixel edges x0, y0, x1, y1): that point's v is 1."""
    points = shape_keypoints(shape, polygon, center)
    visibility = np.full(len(points), 2)
    if rng.random() < OCCLUDED_SHARE:
        hidden = int(rng.integers(len(points)))
        half = max(1.5, 0.3 * radius)
        x, y = points[hidden]
        left, top = max(x - half, box[0]), max(y - half, box[1])
        right, bottom = min(x + half, box[2]) - 1, min(y + half, box[3]) - 1
        fill = tuple(int(c) for c in rng.uniform(0, 255, 3))
        if right >= left and bottom >= top:  # else the point lies on the box's edge: nothing to cover it with
            draw.rectangle((left, top, right, bottom), fill=fill)
            visibility[hidden] = 1
    return tuple(v for (x, y), visible in zip(points.tolist(), visibility.tolist())
                 for v in (round(x, 2), round(y, 2), int(visible)))


def shapes_parameters(config: ShapesConfig) -> dict[str, Any]:
    """``config`` as the jsons' ``info.parameters`` record it: every field, except ``mask_format``, ``shapes`` and
    ``keypoints`` at their defaults (so that the sets written before they existed stay byte for byte what they
    were, and complete)."""
    parameters = asdict(config)
    if not parameters["keypoints"]:
        del parameters["keypoints"]
    if parameters["mask_format"] == "polygon":
        del parameters["mask_format"]
    if config.shapes == SHAPE_NAMES:
        del parameters["shapes"]
    else:
        parameters["shapes"] = list(config.shapes)  # as json reads it back
    return parameters


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    """bool [H, W] → a compressed COCO RLE for json (``{"size": [H, W], "counts": str}``)."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _split_json(root: Path, split: str) -> Path:
    return root / "annotations" / f"instances_{split}.json"


def _write_split(root: Path, split: str, count: int, config: ShapesConfig) -> None:
    folder = root / split
    folder.mkdir(parents=True, exist_ok=True)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for index in range(count):
        rng = np.random.default_rng([config.seed, _SPLITS[split], index])
        drawn: list[np.ndarray] = []
        pixels, objects = render_shapes_image(rng, config, masks=drawn)
        image_id = index + 1
        file_name = f"{image_id:012d}.jpg"
        Image.fromarray(pixels).save(folder / file_name, quality=config.jpeg_quality)
        images.append({"id": image_id, "file_name": file_name, "width": config.image_size,
                       "height": config.image_size, "license": 1})
        for shape, mask in zip(objects, drawn):
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": shape.category_id,
                "bbox": list(shape.bbox_xywh),
                "area": shape.area,
                "iscrowd": 0,
                "segmentation": mask_to_rle(mask) if config.mask_format == "rle" else [list(shape.polygon)],
            })
            if config.keypoints:
                annotations[-1].update(keypoints=list(shape.keypoints),
                                       num_keypoints=sum(1 for v in shape.keypoints[2::3] if v > 0))
    data = {
        "info": {
            "description": "detr synthetic shapes (detr.data.shapes)",
            "version": "1.0",
            "parameters": shapes_parameters(config),
        },
        "licenses": [{"id": 1, "name": "CC0 1.0 (generated data)", "url": "https://creativecommons.org/publicdomain/zero/1.0/"}],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape",
                        **(keypoint_category_fields(name) if config.keypoints else {})}
                       for i, name in enumerate(config.shapes)],
    }
    target = _split_json(root, split)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(target, json.dumps(data))  # the json appears last and at once: the split is complete


def read_json_written_with(path: Path, config: ShapesConfig) -> dict[str, Any] | None:
    """The annotation json at ``path`` if it exists, parses and was written with exactly ``config``, else None."""
    return read_json_with_parameters(path, shapes_parameters(config))


def read_json_with_parameters(path: Path, parameters: dict[str, Any]) -> dict[str, Any] | None:
    """The json at ``path`` if it exists, parses and records exactly ``parameters`` (its ``info.parameters``: what
    a generator of this package wrote it with), else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("info", {}).get("parameters") == parameters else None


def split_is_complete(root: Path, split: str, parameters: dict[str, Any]) -> bool:
    """True if ``root``'s ``annotations/instances_{split}.json`` was written with exactly ``parameters`` and every
    image file it names is in ``root/split``: a generated split that need not be written again."""
    data = read_json_with_parameters(_split_json(root, split), parameters)
    return data is not None and all((root / split / image["file_name"]).is_file() for image in data.get("images", []))


def shapes_dataset_is_complete(root: str | Path, config: ShapesConfig = ShapesConfig()) -> bool:
    """True if ``root`` holds both splits written with exactly ``config`` and every image file exists."""
    return all(split_is_complete(Path(root), split, shapes_parameters(config)) for split in _SPLITS)


def write_shapes_dataset(
    root: str | Path, config: ShapesConfig = ShapesConfig(), *, overwrite: bool = False
) -> bool:
    """Write the synthetic set under ``root`` (COCO layout, module docstring).

    Idempotent: when ``root`` already holds a complete set made with ``config``, nothing is written
    (unless ``overwrite``). Returns True if files were written, False if the existing set was kept.
    """
    root = Path(root)
    if not overwrite and shapes_dataset_is_complete(root, config):
        logger.info("shapes data set in '%s' is complete; nothing to do", root)
        return False
    for split, count in (("train2017", config.num_train), ("val2017", config.num_val)):
        _split_json(root, split).unlink(missing_ok=True)  # an interrupted rewrite must not look complete
        _write_split(root, split, count, config)
        logger.info("wrote %d %s images to '%s'", count, split, root / split)
    return True
