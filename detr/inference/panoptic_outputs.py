"""Panoptic prediction outputs: COCO panoptic PNGs and the panoptic results json.

COCO's panoptic format (the format of panoptic_val2017.json and of the panopticapi evaluation) stores one
PNG per image whose pixels encode the segment id as id = R + 256·G + 256²·B (0 = void), and one json:

- :func:`panoptic_annotation`: one image's ``{"image_id", "file_name" (the PNG), "segments_info"}``;
- :func:`write_panoptic_json`: ``{"annotations": [...], "categories": [{"id", "name", "isthing"}]}``, atomically;
- :func:`write_panoptic_png`: the PNG (:func:`detr.inference.postprocess_masks.panoptic_png`), atomically.

:func:`detr.inference.outputs.predict_files` with ``task="panoptic"`` writes both for a set of files, and the
images with their segments drawn (:func:`detr.visualize.drawing.draw_panoptic`);
:func:`write_panoptic_predictions` writes the PNGs and the json of finished predictions (``detr-panoptic
predict``'s :class:`detr.lightning.panoptic_writer.PanopticPredictionsWriter`), in the same layout.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from detr.atomic_files import write_atomically, write_text_atomically
from detr.categories import UNUSED_NAME, CategoryMap
from detr.inference.postprocess_masks import panoptic_png
from detr.inference.prediction import PanopticSegmentation, Prediction

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
                               category_map: CategoryMap | None, is_thing: Sequence[bool] | None, *,
                               record: Callable[[Path], Path] = Path) -> Path:
    """Write each prediction's PNG as ``out_dir/panoptic/<png name>`` and their annotations as
    ``out_dir/panoptic.json`` (the layout of ``detr-predict --task panoptic``). Every prediction needs
    ``panoptic`` and ``image_id``. ``record`` is called on each path before it is written (a claimed
    folder's :meth:`detr.output_folder.OutputFolder.record`). Returns the json's path."""
    out_dir = Path(out_dir)
    if len(png_names) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions but {len(png_names)} PNG names")
    annotations = []
    for prediction, png_name in zip(predictions, png_names):
        annotation = panoptic_annotation(prediction, png_name)  # checks panoptic and image_id first
        write_panoptic_png(record(out_dir / "panoptic" / png_name), prediction.panoptic)  # type: ignore[arg-type]
        annotations.append(annotation)
    labels = [s["label"] for p in predictions for s in p.panoptic.segments_info]  # type: ignore[union-attr]
    return write_panoptic_json(record(out_dir / "panoptic.json"), annotations,
                               panoptic_categories(category_map, is_thing, labels))
