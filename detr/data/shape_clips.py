"""Synthetic tracking clips with known ground truth: the shapes of :mod:`detr.data.shapes` moving over a gradient
background, crossing each other and passing behind an occluder.

Each object keeps its shape, colour and size for the whole clip, moves at a constant speed (1 to ``max_speed`` px a
frame), turns slowly, and bounces off the frame's edges; the first ``2 * crossing_pairs`` objects start in pairs at
the two sides of one row, heading for each other, so that every clip has head-on crossings, where the object drawn
first is hidden by the other. A vertical bar in the middle of the frame (``occluder_width`` px) is drawn over
everything: objects pass behind it. Every frame gets fresh sensor-like noise. Clip ``seed`` is the same every time.

Ground truth per frame (:class:`ClipObject`): every object's id (1-based, stable), class, full box (the extent of its
drawn shape, hidden parts included, pixel ``xyxy``) and visibility (the share of its pixels not covered by a later
object or the occluder), as MOTChallenge's ``gt.txt`` records them (:func:`mot_ground_truth_lines`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from detr.atomic_files import write_text_atomically
from detr.data.shapes import SHAPE_NAMES, background_gradient, object_colour, shape_polygon, split_is_complete
from detr.data.video import write_video


@dataclass(frozen=True)
class ClipConfig:
    """Parameters of a synthetic clip.

    num_frames: frames in the clip. height, width: frame size in pixels.
    num_objects: objects in every frame; the first ``2 * crossing_pairs`` cross head-on.
    min_object_size, max_object_size: diameter range (pixels) of a shape's circumscribed circle.
    max_speed: pixels per frame, at most. occluder_width: width in pixels of the bar in the middle (0: none).
    frame_rate: frames per second (what a written video records). seed: everything follows from it.
    shapes: the classes, in category id order (:data:`detr.data.shapes.SHAPE_NAMES` by default).
    """

    num_frames: int = 90
    height: int = 128
    width: int = 192
    num_objects: int = 5
    crossing_pairs: int = 1
    min_object_size: int = 20
    max_object_size: int = 32
    max_speed: float = 3.0
    occluder_width: int = 14
    frame_rate: float = 25.0
    seed: int = 0
    shapes: tuple[str, ...] = SHAPE_NAMES

    def __post_init__(self) -> None:
        if self.num_frames < 1 or self.num_objects < 0 or not 0 <= 2 * self.crossing_pairs <= self.num_objects:
            raise ValueError(f"need num_frames >= 1 and 0 <= 2 * crossing_pairs <= num_objects, got {self.num_frames}, "
                             f"{self.crossing_pairs}, {self.num_objects}")
        if not 4 <= self.min_object_size <= self.max_object_size < min(self.height, self.width) / 2:
            raise ValueError("need 4 <= min_object_size <= max_object_size < half the frame's short side, got "
                             f"{self.min_object_size}, {self.max_object_size} for {self.height}x{self.width}")


@dataclass(frozen=True)
class ClipObject:
    """One object in one frame: ``track_id`` (1-based, the same in every frame), ``category_id`` (1-based, as the
    shapes sets' categories), ``box_xyxy`` pixel edges of the whole shape, ``visibility`` in [0, 1]."""

    track_id: int
    category_id: int
    box_xyxy: tuple[float, float, float, float]
    visibility: float


@dataclass
class _Mover:
    category: int
    radius: float
    colour: tuple[int, int, int]
    position: np.ndarray  # (x, y) centre
    velocity: np.ndarray  # px a frame
    angle: float
    turn: float  # radians a frame
    aspect: float


def _movers(rng: np.random.Generator, config: ClipConfig, background_mean: np.ndarray) -> list[_Mover]:
    movers = []
    width, height = config.width, config.height
    for index in range(config.num_objects):
        radius = math.exp(rng.uniform(math.log(config.min_object_size), math.log(config.max_object_size))) / 2
        speed = rng.uniform(1.0, config.max_speed)
        if index < 2 * config.crossing_pairs:  # a pair on one row, from the two sides towards each other
            row = (index // 2 + 1) * height / (config.crossing_pairs + 1)
            left = index % 2 == 0
            position = np.array([radius + 1 if left else width - radius - 1, row])
            velocity = np.array([speed if left else -speed, rng.uniform(-0.2, 0.2)])
        else:
            position = np.array([rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)])
            direction = rng.uniform(0, 2 * math.pi)
            velocity = speed * np.array([math.cos(direction), math.sin(direction)])
        movers.append(_Mover(category=int(rng.integers(len(config.shapes))), radius=radius,
                             colour=tuple(int(c) for c in object_colour(rng, background_mean)),
                             position=position, velocity=velocity, angle=rng.uniform(0, 2 * math.pi),
                             turn=rng.uniform(-0.05, 0.05), aspect=rng.uniform(0.4, 0.6)))
    return movers


def _step(mover: _Mover, width: int, height: int) -> None:
    mover.position = mover.position + mover.velocity
    mover.angle += mover.turn
    for axis, extent in ((0, width), (1, height)):  # bounce off the edges
        low, high = mover.radius, extent - mover.radius
        if mover.position[axis] < low or mover.position[axis] > high:
            mover.velocity[axis] = -mover.velocity[axis]
            mover.position[axis] = min(max(mover.position[axis], low), high)


def render_clip(config: ClipConfig = ClipConfig()) -> tuple[list[np.ndarray], list[list[ClipObject]]]:
    """The frames (``uint8`` RGB ``[H, W, 3]``) of a clip and each frame's ground truth (objects with any pixel
    inside the frame; the fully hidden ones have visibility 0)."""
    rng = np.random.default_rng([config.seed, 7])
    height, width = config.height, config.width
    background, mean_colour = background_gradient(rng, max(height, width))
    background = background[:height, :width]
    movers = _movers(rng, config, mean_colour)
    occluder = np.zeros((height, width), dtype=bool)
    if config.occluder_width:
        left = (width - config.occluder_width) // 2
        occluder[:, left : left + config.occluder_width] = True
    frames, truth = [], []
    for _ in range(config.num_frames):
        image = Image.fromarray(background.clip(0, 255).astype(np.uint8))
        masks = []
        for mover in movers:
            polygon = shape_polygon(config.shapes[mover.category], tuple(mover.position), mover.radius, mover.angle,
                                    mover.aspect)
            mask_image = Image.new("L", (width, height), 0)
            ImageDraw.Draw(mask_image).polygon([tuple(p) for p in polygon.tolist()], fill=255)
            image.paste(mover.colour, mask=mask_image)
            masks.append(np.asarray(mask_image) > 0)
        pixels = np.asarray(image, dtype=np.float32).copy()
        pixels[occluder] = (pixels[occluder] * 0.2 + 90.0)  # a dark grey bar, the background's texture faintly
        pixels = pixels + rng.normal(0.0, 6.0, pixels.shape)
        frames.append(pixels.clip(0, 255).round().astype(np.uint8))
        covered = occluder.copy()
        objects: list[ClipObject] = []
        for index in reversed(range(len(movers))):  # the last drawn is on top
            mask = masks[index]
            ys, xs = np.nonzero(mask)
            if len(xs):
                visible = float((mask & ~covered).sum()) / len(xs)
                box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
                objects.append(ClipObject(index + 1, movers[index].category + 1, box, visible))
            covered |= mask
        truth.append(sorted(objects, key=lambda o: o.track_id))
        for mover in movers:
            _step(mover, width, height)
    return frames, truth


def mot_ground_truth_lines(truth: list[list[ClipObject]]) -> list[str]:
    """MOTChallenge ``gt.txt`` lines of a clip's ground truth: ``frame, id, x, y, w, h, 1, class, visibility``,
    frames 1-based, boxes pixel ``xywh``."""
    lines = []
    for frame, objects in enumerate(truth, start=1):
        for o in objects:
            x0, y0, x1, y1 = o.box_xyxy
            lines.append(f"{frame},{o.track_id},{x0:.2f},{y0:.2f},{x1 - x0:.2f},{y1 - y0:.2f},1,{o.category_id},"
                         f"{o.visibility:.3f}")
    return lines


def write_clip(path: str | Path, config: ClipConfig = ClipConfig()) -> list[list[ClipObject]]:
    """Render a clip and write it to the video file ``path`` (:func:`detr.data.video.write_video`: H.264 for .mp4
    and .mkv) or, for a path without a suffix, to a folder of PNG frames ``000001.png`` ...; returns its ground
    truth."""
    frames, truth = render_clip(config)
    path = Path(path)
    if path.suffix:
        write_video(path, frames, frame_rate=config.frame_rate)
    else:
        path.mkdir(parents=True, exist_ok=True)
        for index, frame in enumerate(frames, start=1):
            Image.fromarray(frame).save(path / f"{index:06d}.png")
    return truth


@dataclass(frozen=True)
class ClipFramesConfig:
    """A detection set of clip frames (:func:`write_clip_frames_dataset`): what a detector for the clips trains on.

    clip: every clip's parameters (its ``seed`` is replaced: training clip ``i`` has seed ``first_seed + i``, the
    validation clips follow, so none is a clip the tests or the tracking benchmark make with seeds 0, 1, ...).
    num_train_clips, num_val_clips: clips per split. every: every ``every``-th frame becomes an image (neighbouring
    frames are nearly the same). min_visibility: objects less visible than this are not annotated (a detector is
    not asked to find what it cannot see; MOTChallenge's evaluation ignores them below 0.5).
    """

    clip: ClipConfig = ClipConfig(num_objects=6, crossing_pairs=2)
    num_train_clips: int = 40
    num_val_clips: int = 4
    every: int = 3
    min_visibility: float = 0.25
    first_seed: int = 1000

    def __post_init__(self) -> None:
        if self.num_train_clips < 0 or self.num_val_clips < 0 or self.every < 1 or not 0 <= self.min_visibility <= 1:
            raise ValueError("need clip counts >= 0, every >= 1 and 0 <= min_visibility <= 1, got "
                             f"{self.num_train_clips}, {self.num_val_clips}, {self.every}, {self.min_visibility}")


def clip_frame_annotations(objects: list[ClipObject], *, image_id: int, first_id: int,
                           min_visibility: float) -> list[dict[str, Any]]:
    """COCO annotations of one frame's ground truth: each object at least ``min_visibility`` visible, its whole box
    (hidden parts included, as MOTChallenge's ground truth) clipped to the frame by construction."""
    annotations = []
    for o in objects:
        if o.visibility < min_visibility:
            continue
        x0, y0, x1, y1 = o.box_xyxy
        annotations.append({"id": first_id + len(annotations), "image_id": image_id, "category_id": o.category_id,
                            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    return annotations


def write_clip_frames_dataset(root: str | Path, config: ClipFramesConfig = ClipFramesConfig(), *,
                              overwrite: bool = False) -> bool:
    """Write frames of synthetic clips as a COCO-layout detection set under ``root`` (``train2017/``,
    ``val2017/``, ``annotations/instances_{split}.json``), for training a detector that ``detr-track`` then tracks
    the clips with. Idempotent as :func:`detr.data.shapes.write_shapes_dataset`: a complete set written with the
    same ``config`` is kept (True: files were written)."""
    root = Path(root)
    parameters = json.loads(json.dumps(asdict(config)))
    splits = {"train2017": range(config.num_train_clips),
              "val2017": range(config.num_train_clips, config.num_train_clips + config.num_val_clips)}
    if not overwrite and all(split_is_complete(root, split, parameters) for split in splits):
        return False
    for split, clips in splits.items():
        target = root / "annotations" / f"instances_{split}.json"
        target.unlink(missing_ok=True)  # an interrupted rewrite must not look complete
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        images: list[dict[str, Any]] = []
        annotations: list[dict[str, Any]] = []
        for clip in clips:
            frames, truth = render_clip(replace(config.clip, seed=config.first_seed + clip))
            for frame in range(0, len(frames), config.every):
                image_id = len(images) + 1
                file_name = f"{image_id:012d}.jpg"
                Image.fromarray(frames[frame]).save(folder / file_name, quality=95)
                images.append({"id": image_id, "file_name": file_name, "width": config.clip.width,
                               "height": config.clip.height})
                annotations += clip_frame_annotations(truth[frame], image_id=image_id, first_id=len(annotations) + 1,
                                                      min_visibility=config.min_visibility)
        data = {"info": {"description": "detr synthetic clip frames (detr.data.shape_clips)",
                         "parameters": parameters},
                "images": images, "annotations": annotations,
                "categories": [{"id": i + 1, "name": name, "supercategory": "shape"}
                               for i, name in enumerate(config.clip.shapes)]}
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(target, json.dumps(data))
    return True
