"""Label a folder of images with a prompted model (Grounding DINO): a COCO instances data set whose categories are
the prompt's phrases, for ``detr-check-data``, a review, and a fine-tune (``detr fit``) as it is.

The data set (:func:`autolabel_dataset`):

- ``categories``: one per phrase of the prompt, in prompt order, ids 1..K
  (:func:`detr.inference.grounding.prompt_phrases`);
- ``images``: ``id``, ``file_name`` (relative to the image folder), ``width`` and ``height`` in pixels;
- ``annotations``: ``id``, ``image_id``, ``category_id`` (the phrase that holds the box's best word), ``bbox`` COCO
  ``[x, y, width, height]`` in pixels clipped to the image, ``area`` (the box's, px²), ``iscrowd`` 0, and ``score``:
  the model's score in [0, 1], kept for review (COCO's readers ignore a field they do not know);
- ``info``: the prompt, the checkpoint and the thresholds it was made with.

:func:`autolabel_files` runs the predictor over the files, skipping (and reporting) those that cannot be read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detr.data.images import ImageLoadError
from detr.inference.grounding import prompt_phrases, prompt_text
from detr.inference.images import to_rgb_array
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor

logger = logging.getLogger(__name__)


@dataclass
class AutolabelRun:
    """What :func:`autolabel_files` did: ``data`` the COCO instances dict; ``skipped`` ``(path, reason)`` for each
    file that could not be read or predicted."""

    data: dict[str, Any]
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def autolabel_dataset(predictions: Sequence[Prediction], file_names: Sequence[str], phrases: Sequence[str], *,
                      info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The COCO instances dict (see the module's docstring) of ``predictions`` (pixel xyxy boxes, labels = the
    prompt's phrase, 0-based), one per image named ``file_names``; ``phrases``: the prompt's, in order. A box that
    keeps no area once clipped to its image is left out."""
    if len(predictions) != len(file_names):
        raise ValueError(f"{len(predictions)} predictions for {len(file_names)} file names: pass one per image")
    images, annotations = [], []
    for image_id, (prediction, file_name) in enumerate(zip(predictions, file_names), start=1):
        height, width = prediction.image_size
        images.append({"id": image_id, "file_name": file_name, "width": int(width), "height": int(height)})
        boxes = prediction.boxes.float().clone()
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        for box, score, label in zip(boxes.tolist(), prediction.scores.tolist(), prediction.labels.tolist()):
            if not 0 <= label < len(phrases):
                raise ValueError(f"label {label} of {file_name} is not one of the prompt's {len(phrases)} phrases")
            x1, y1, x2, y2 = (round(value, 2) for value in box)
            if x2 <= x1 or y2 <= y1:
                continue
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": label + 1,
                                "bbox": [x1, y1, round(x2 - x1, 2), round(y2 - y1, 2)],
                                "area": round((x2 - x1) * (y2 - y1), 2), "iscrowd": 0, "score": round(score, 4)})
    return {"info": dict(info or {}), "licenses": [], "images": images, "annotations": annotations,
            "categories": [{"id": index, "name": phrase} for index, phrase in enumerate(phrases, start=1)]}


def autolabel_files(predictor: Predictor, images_dir: str | Path, paths: Sequence[str | Path],
                    prompt: str | Sequence[str], *, threshold: float | None = None, text_threshold: float = 0.25,
                    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
                    info: dict[str, Any] | None = None) -> AutolabelRun:
    """Predict ``prompt`` on each of ``paths`` (files under ``images_dir``, whose ``file_name`` entries are
    relative to it), ``predictor.batch_size`` at a time, keeping boxes scored above ``threshold`` (default the
    predictor's), and make the COCO data set (:func:`autolabel_dataset`). ``progress`` wraps the per-batch
    iteration (e.g. ``functools.partial(tqdm, total=...)``). A file that cannot be read or predicted is logged at
    WARNING and skipped.

    Raises:
        ValueError: the predictor's model reads no prompt, or the prompt has an empty or repeated phrase.
    """
    phrases = prompt_phrases(prompt)
    predictor.check_prompt(prompt)
    threshold = predictor.threshold if threshold is None else threshold
    root = Path(images_dir)
    paths = [Path(path) for path in paths]
    size = predictor.batch_size
    batches = [paths[start:start + size] for start in range(0, len(paths), size)]
    predictions: list[Prediction] = []
    names: list[str] = []
    skipped: list[tuple[Path, str]] = []
    for batch in progress(batches) if progress is not None else batches:
        loaded = []
        for path in batch:
            try:
                loaded.append((path, to_rgb_array(path)))
            except ImageLoadError as error:  # missing, truncated, not an image
                skipped.append((path, str(error.__cause__ or error)))
        for path, prediction in _predict_each(predictor, loaded, prompt, threshold, text_threshold, skipped):
            predictions.append(prediction)
            names.append(path.resolve().relative_to(root.resolve()).as_posix())
    for path, reason in skipped:
        logger.warning("skipping %s: %s", path, reason)
    details = {"description": f"detr-autolabel: {prompt_text(prompt)!r}", "prompt": prompt_text(prompt),
               "threshold": threshold, "text_threshold": text_threshold, **(info or {})}
    return AutolabelRun(autolabel_dataset(predictions, names, phrases, info=details), skipped)


def _predict_each(predictor: Predictor, loaded: list[tuple[Path, Any]], prompt: str | Sequence[str], threshold: float,
                  text_threshold: float, skipped: list[tuple[Path, str]]) -> list[tuple[Path, Prediction]]:
    """Predict a batch of loaded images; when the batch fails, each image on its own, so that one image that
    cannot be predicted (too thin to resize) is skipped into ``skipped`` and costs only itself."""
    if not loaded:
        return []
    try:
        found = predictor.predict_arrays([array for _, array in loaded], threshold=threshold, prompt=prompt,
                                         text_threshold=text_threshold)
    except (RuntimeError, ValueError) as error:
        if len(loaded) > 1:
            return [pair for item in loaded
                    for pair in _predict_each(predictor, [item], prompt, threshold, text_threshold, skipped)]
        skipped.append((loaded[0][0], f"cannot predict: {type(error).__name__}: {error}"))
        return []
    return [(path, prediction) for (path, _), prediction in zip(loaded, found)]


def labelled_images(data: dict[str, Any]) -> int:
    """How many of a data set's images have at least one box."""
    return len({annotation["image_id"] for annotation in data["annotations"]})

