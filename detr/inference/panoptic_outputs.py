"""Panoptic prediction outputs: COCO panoptic PNGs, the panoptic results json, images with drawn segments.

COCO's panoptic format (the format of panoptic_val2017.json and of the panopticapi evaluation) stores one
PNG per image whose pixels encode the segment id as id = R + 256·G + 256²·B (0 = void), and one json:

- :func:`panoptic_annotation`: one image's ``{"image_id", "file_name" (the PNG), "segments_info"}``;
- :func:`write_panoptic_json`: ``{"annotations": [...], "categories": [{"id", "name", "isthing"}]}``, atomically;
- :func:`write_panoptic_png`: the PNG (:func:`detr.inference.postprocess_masks.panoptic_png`), atomically;
- :func:`draw_panoptic`: segments alpha-blended over the photo (``torchvision.utils.draw_segmentation_masks``)
  with their category names.

:func:`detr.inference.outputs.predict_files` with ``task="panoptic"`` writes all three for a set of files;
:func:`write_panoptic_predictions` writes the PNGs and the json of finished predictions (``detr-panoptic
predict``'s :class:`detr.lightning.panoptic_writer.PanopticPredictionsWriter`), in the same layout.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor
from torchvision.utils import draw_segmentation_masks

from detr.checkpoints.atomic import write_atomically, write_text_atomically
from detr.categories import UNUSED_NAME, CategoryMap
from detr.inference.postprocess_masks import panoptic_png
from detr.inference.outputs import _font_path, label_color
from detr.inference.predictor import PanopticSegmentation, Prediction, to_rgb_array

logger = logging.getLogger(__name__)

#: segments_info fields written to the json (COCO panoptic's, plus the score)
SEGMENT_FIELDS = ("id", "category_id", "isthing", "area", "bbox", "iscrowd", "score")


def panoptic_annotation(prediction: Prediction, png_name: str) -> dict[str, Any]:
    """COCO panoptic annotation of one prediction (``image_id`` and ``panoptic`` set): the PNG's file name
    relative to the panoptic folder, the image's ``image_id``, and its segments (json-ready values)."""
    if prediction.panoptic is None or prediction.image_id is None:
        raise ValueError(f"prediction for {prediction.file_name or 'an image'} needs panoptic (predict with "
                         "task='panoptic') and image_id set before it can be written as a panoptic annotation")
    segments = [{key: segment[key] for key in SEGMENT_FIELDS if key in segment}
                for segment in prediction.panoptic.segments_info]
    for segment in segments:
        if "score" in segment:
            segment["score"] = round(float(segment["score"]), 4)
    annotation = {"image_id": prediction.image_id, "file_name": png_name, "segments_info": segments}
    if prediction.file_name is not None:
        annotation["image_file_name"] = prediction.file_name
    return annotation


def panoptic_categories(category_map: CategoryMap | None, is_thing: Sequence[bool] | None,
                        labels: Sequence[int] = ()) -> list[dict[str, Any]]:
    """The json's ``categories``: ``{"id", "name", "isthing"}`` per category of ``category_map`` (named
    categories only: the unused ids of a raw-id label space are left out), or per label in ``labels``
    without a map."""
    if category_map is None:
        return [{"id": int(label), "name": f"class {label}",
                 "isthing": int(bool(is_thing[label])) if is_thing is not None else 1}
                for label in sorted(set(int(label) for label in labels))]
    categories = []
    for label, (category_id, name) in enumerate(zip(category_map.category_ids, category_map.names)):
        if name == UNUSED_NAME:
            continue
        thing = bool(is_thing[label]) if is_thing is not None and label < len(is_thing) else True
        categories.append({"id": int(category_id), "name": name, "isthing": int(thing)})
    return categories


def write_panoptic_json(path: str | Path, annotations: Sequence[dict[str, Any]],
                        categories: Sequence[dict[str, Any]]) -> Path:
    """Write ``{"annotations", "categories"}`` to ``path`` atomically (parents created)."""
    path = Path(path)
    write_text_atomically(path, json.dumps({"annotations": list(annotations), "categories": list(categories)}))
    logger.info("wrote %d panoptic annotations to %s", len(annotations), path)
    return path


def write_panoptic_png(path: str | Path, panoptic: PanopticSegmentation) -> Path:
    """Write the id map as COCO panoptic's PNG (id = R + 256·G + 256²·B) to ``path``, atomically."""
    data = panoptic_png(panoptic.id_map)
    return write_atomically(path, lambda file: file.write(data))


def write_panoptic_predictions(out_dir: str | Path, predictions: Sequence[Prediction], png_names: Sequence[str],
                               category_map: CategoryMap | None, is_thing: Sequence[bool] | None) -> Path:
    """Write each prediction's PNG as ``out_dir/panoptic/<png name>`` and their annotations as
    ``out_dir/panoptic.json`` (the layout of ``tools/predict.py --task panoptic``). Every prediction needs
    ``panoptic`` and ``image_id``. Returns the json's path."""
    out_dir = Path(out_dir)
    if len(png_names) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions but {len(png_names)} PNG names")
    annotations = []
    for prediction, png_name in zip(predictions, png_names):
        annotation = panoptic_annotation(prediction, png_name)  # checks panoptic and image_id first
        write_panoptic_png(out_dir / "panoptic" / png_name, prediction.panoptic)  # type: ignore[arg-type]
        annotations.append(annotation)
    labels = [s["label"] for p in predictions for s in p.panoptic.segments_info]  # type: ignore[union-attr]
    return write_panoptic_json(out_dir / "panoptic.json", annotations, panoptic_categories(category_map, is_thing,
                                                                                           labels))


def segment_color(segment: dict[str, Any]) -> tuple[int, int, int]:
    """RGB of a segment: its label's colour for stuff; things of one class get shades of it, so that two
    instances side by side stay apart."""
    red, green, blue = label_color(int(segment["label"]))
    if not segment.get("isthing", True):
        return red, green, blue
    shift = (int(segment["id"]) * 37) % 96 - 48
    return tuple(int(min(255, max(0, channel + shift))) for channel in (red, green, blue))  # type: ignore[return-value]


def draw_panoptic(image: np.ndarray | Tensor | Image.Image, panoptic: PanopticSegmentation, *,
                  alpha: float = 0.5, font_size: int | None = None) -> Tensor:
    """Segments alpha-blended over ``image`` (the original image), each named at its centroid:
    ``uint8`` ``[3, H, W]``. Void pixels (id 0) stay as they are."""
    array = to_rgb_array(image)
    id_map = panoptic.id_map.cpu()
    if tuple(array.shape[:2]) != tuple(id_map.shape):
        raise ValueError(f"image is {array.shape[0]}x{array.shape[1]} but the segmentation is "
                         f"{id_map.shape[0]}x{id_map.shape[1]}; draw on the image that was predicted")
    canvas = torch.from_numpy(array).permute(2, 0, 1).contiguous()
    segments = panoptic.segments_info
    if not segments:
        return canvas
    masks = torch.stack([id_map == segment["id"] for segment in segments])  # [S, H, W]
    colors = [segment_color(segment) for segment in segments]
    blended = draw_segmentation_masks(canvas, masks, alpha=alpha, colors=colors)
    picture = Image.fromarray(blended.permute(1, 2, 0).numpy())
    draw = ImageDraw.Draw(picture)
    size = font_size if font_size is not None else max(11, round(min(id_map.shape) / 32))
    font_file = _font_path()
    font = ImageFont.truetype(font_file, size) if font_file else ImageFont.load_default()
    height, width = id_map.shape
    for mask, segment, color in zip(masks, segments, colors):
        text = segment.get("label_name") or f"class {segment['label']}"
        ys, xs = mask.nonzero(as_tuple=True)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        # centred on the segment's centroid, kept inside the image
        x = min(max(int(xs.float().mean()) - (right - left) // 2, 0), max(width - (right - left) - 2, 0))
        y = min(max(int(ys.float().mean()) - (bottom - top) // 2, 0), max(height - (bottom - top) - 2, 0))
        left, top, right, bottom = draw.textbbox((x + 1, y + 1), text, font=font)
        draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=color)
        draw.text((x + 1, y + 1), text, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)


def save_drawn_panoptic(path: str | Path, image: np.ndarray | Tensor | Image.Image,
                        panoptic: PanopticSegmentation) -> Path:
    """Draw with :func:`draw_panoptic` and save to ``path`` atomically (format from its suffix)."""
    path = Path(path)
    drawn = Image.fromarray(draw_panoptic(image, panoptic).permute(1, 2, 0).numpy())
    options = {"quality": 90} if path.suffix.lower() in (".jpg", ".jpeg") else {}
    image_format = "JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG"
    return write_atomically(path, lambda file: drawn.save(file, format=image_format, **options))
