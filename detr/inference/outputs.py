"""Prediction outputs: the COCO results json, images with drawn boxes, and predicting a set of files.

Shared by ``detr-predict`` and the Lightning ``detr predict`` writer so both write the same files:

- :func:`write_predictions_json`: one COCO results json, a list of ``{"image_id", "file_name",
  "category_id", "bbox": [x, y, w, h] pixels, "score"}`` with the data set's own category ids, so
  ``pycocotools.COCO.loadRes`` reads it as is; predictions with instance masks add ``segmentation``
  (COCO RLE, "segm" results), predictions with keypoints add ``keypoints`` ([x1, y1, s1, ...]: COCO's
  keypoint results, s the point's score).
- the images with their boxes, names and scores drawn (:func:`detr.visualize.drawing.draw_prediction`);
- :func:`collect_image_paths` and :func:`predict_files`: files, folders and glob patterns in, the two
  outputs above out; a file that cannot be read is logged, skipped and reported, the rest goes on. With
  ``task="panoptic"`` also the COCO panoptic PNGs and json of :mod:`detr.inference.panoptic_outputs`.

A prediction run owns its output folder (:func:`detr.output_folder.claim_output_folder`): another run is
refused while this one writes, and a later run refused unless it overwrites, which removes this run's files,
drawings included, so that no folder ever mixes two runs' outputs.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detr.categories import CategoryMap
from detr.data.images import ImageLoadError, list_image_files
from detr.evaluation.coco_evaluator import detections_to_coco_results, masks_to_rle, write_coco_results
from detr.evaluation.keypoints import flat_keypoints
from detr.inference.images import to_rgb_array
from detr.inference.panoptic_outputs import (
    panoptic_annotation,
    panoptic_categories,
    write_panoptic_json,
    write_panoptic_png,
)
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor, Task
from detr.inference.slicing import SliceSettings
from detr.output_folder import OutputFolderError, claim_output_folder
from detr.visualize.drawing import draw_panoptic, draw_prediction, save_image

logger = logging.getLogger(__name__)

#: The files every prediction run writes: a folder holding one holds a previous run's outputs.
PREDICTION_FILES = ("predictions.json", "panoptic.json")

def predictions_to_coco_results(
    predictions: Sequence[Prediction], *, category_map: CategoryMap | None,
) -> list[dict[str, Any]]:
    """COCO results entries for every detection of every prediction.

    Each prediction needs ``image_id`` set. Category ids come from ``category_map`` (label == id
    without one). Boxes go from pixel ``xyxy`` to COCO's pixel ``xywh``; ``file_name`` is added when known;
    ``segmentation`` (COCO RLE, :func:`detr.evaluation.coco_evaluator.masks_to_rle`) when the prediction has masks;
    ``keypoints`` (flat [x1, y1, s1, ...], pixels, 0.01 px) when it has keypoints: each detection's own points
    (:meth:`Prediction.detection_keypoints`: as many as the model gives its class; none for a class without). An
    entry carries its ``bbox`` too, so ``loadRes`` takes the object's area from the box.
    """
    results: list[dict[str, Any]] = []
    for prediction in predictions:
        if prediction.image_id is None:
            raise ValueError(
                f"prediction for {prediction.file_name or 'an image'} has no image_id; set "
                "prediction.image_id (e.g. with assign_image_ids) before writing a COCO results json"
            )
        if len(prediction) == 0:
            continue
        detection = {"scores": prediction.scores, "labels": prediction.labels, "boxes": prediction.boxes}
        entries = detections_to_coco_results(
            prediction.image_id, detection, category_map, file_name=prediction.file_name, rounded=True
        )
        if prediction.masks is not None:
            for entry, rle in zip(entries, masks_to_rle(prediction.masks)):
                entry["segmentation"] = rle
        if prediction.keypoints is not None:
            for index, entry in enumerate(entries):
                points = prediction.detection_keypoints(index)
                if points is not None and len(points):  # a class without keypoints gets none
                    entry["keypoints"] = flat_keypoints(points, rounded=True)
        results += entries
    return results


def write_predictions_json(
    path: str | Path, predictions: Sequence[Prediction], *, category_map: CategoryMap | None,
) -> Path:
    """Write :func:`predictions_to_coco_results` of ``predictions`` to ``path`` (parents created)."""
    path = Path(path)
    results = predictions_to_coco_results(predictions, category_map=category_map)
    write_coco_results(path, results)  # NaN is not JSON: callers leave out predictions that are not finite
    logger.info("wrote %d detections of %d images to %s", len(results), len(predictions), path)
    return path


def assign_image_ids(predictions: Sequence[Prediction]) -> None:
    """Number predictions in place: COCO's ids when every file name is a distinct number
    (``000000039769.jpg`` → 39769, so results match COCO ground truth), else 1, 2, ... in order."""
    stems = [Path(p.file_name).stem if p.file_name else "" for p in predictions]
    if stems and all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems):
        ids = [int(s) for s in stems]
    else:
        ids = list(range(1, len(predictions) + 1))
    for prediction, image_id in zip(predictions, ids):
        prediction.image_id = image_id


def collect_image_paths(inputs: Iterable[str | Path]) -> list[Path]:
    """Files, folders (their image files by suffix, not recursive) and glob patterns → a list of files in
    input order (each folder and pattern sorted), without duplicates. A named file is kept whatever its suffix.

    Raises:
        ValueError: when an input matches nothing, naming it.
    """
    paths: list[Path] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            found = list_image_files(path)  # sorted, not recursive; ValueError naming an empty folder
        elif path.is_file():
            found = [path]
        elif glob.has_magic(text):
            found = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        else:
            found = []
        if not found:
            url = " (a URL: download the image first; inputs are local files)" if "://" in text else ""
            raise ValueError(
                f"input {text!r} is not an image file, a folder with images or a glob pattern that matches files"
                f"{url}"
            )
        paths.extend(found)
    unique: dict[Path, None] = {}
    for path in paths:
        unique.setdefault(path, None)
    return list(unique)


@dataclass
class PredictionRun:
    """What :func:`predict_files` did.

    predictions: one per image that was read, with ``image_id`` and ``file_name`` set, in input order.
    skipped: ``(path, reason)`` for every file that could not be read.
    predictions_json: the written results json.
    drawn: the written images (empty with ``draw=False``).
    panoptic_pngs: ``task="panoptic"``: the PNG of each prediction, in the same order.
    panoptic_json: ``task="panoptic"``: the written panoptic json.
    """

    predictions: list[Prediction]
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    predictions_json: Path | None = None
    drawn: list[Path] = field(default_factory=list)
    panoptic_pngs: list[Path] = field(default_factory=list)
    panoptic_json: Path | None = None


def predict_files(
    predictor: Predictor,
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    threshold: float | None = None,
    all_queries: bool = False,
    draw: bool = True,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    task: Task = "detection",
    overwrite: bool = False,
    overwrite_flag: str = "overwrite=True",
    elsewhere: str = "another out_dir",
    slice: SliceSettings | int | None = None,
    prompt: str | Sequence[str] | None = None,
    text_threshold: float = 0.25,
) -> PredictionRun:
    """Run ``predictor`` on image files and write ``out_dir/predictions.json`` and drawn images.

    Files are read and batched ``predictor.batch_size`` at a time; one that cannot be read or predicted
    (too thin to resize, outputs not finite) is logged at WARNING and skipped, and predictions.json is
    written even if the run stops early. ``file_name`` is the path relative to the inputs' common folder
    (:func:`unique_file_names`). ``threshold`` defaults to the predictor's; ``all_queries`` keeps every query
    (as COCO evaluation wants) and then draws only those above the threshold. Drawn images go to
    ``out_dir/<stem>.jpg`` (``<stem>_1.jpg``... on name clashes).
    ``progress`` wraps the per-batch iteration (e.g. ``functools.partial(tqdm, total=...)``).

    ``task="instances"`` (a panoptic model) adds each detection's mask to predictions.json as COCO RLE
    ``segmentation`` (with ``all_queries``, one full-size mask per query of a batch is held at once).
    ``task="panoptic"`` (a panoptic model) also writes each image's COCO panoptic PNG to
    ``out_dir/panoptic/<stem>.png`` and ``out_dir/panoptic.json`` (:mod:`detr.inference.panoptic_outputs`), and draws the
    segments instead of the boxes.

    ``out_dir`` is claimed for the run (:func:`detr.output_folder.claim_output_folder`): a folder that another
    live run writes is refused, and so is one that holds a previous run's outputs unless ``overwrite``, which
    deletes them (its drawings too) first. ``overwrite_flag`` and ``elsewhere`` name the caller's options for
    these in the error (``--overwrite``, ``--out``).

    ``slice`` predicts each image's tiles and the whole image and merges them (:meth:`Predictor.predict`'s
    ``slice``; :mod:`detr.inference.slicing`). ``prompt`` and ``text_threshold``: a prompted model's
    (:meth:`Predictor.predict`); the drawings name each box by its phrase, and predictions.json's ``category_id``
    is the prompt's phrase (0-based).

    Raises:
        detr.output_folder.OutputFolderError: ``out_dir`` is another run's (above), or holds input images.
    """
    predictor.check_task(task)  # before any file is read: a detection model cannot segment
    predictor.check_slice(slice, task=task)
    predictor.check_prompt(prompt, task=task, slice=slice)
    _refuse_inputs_in(out_dir, paths, elsewhere)
    with claim_output_folder(out_dir, overwrite=overwrite, overwrite_flag=overwrite_flag, elsewhere=elsewhere,
                             markers=PREDICTION_FILES) as folder:
        return _predict_into(predictor, [Path(p) for p in paths], folder.folder, folder.record, threshold=threshold,
                             all_queries=all_queries, draw=draw, progress=progress, task=task, slice=slice,
                             prompt=prompt, text_threshold=text_threshold)


def _refuse_inputs_in(out_dir: str | Path, paths: Sequence[str | Path], elsewhere: str) -> None:
    """Raise OutputFolderError when an input image lies in ``out_dir`` (or in its ``panoptic/``), where the run
    writes (``<stem>.jpg``, ``panoptic/<stem>.png``): it would overwrite inputs of those names, and a later
    ``--overwrite`` would delete them. Inputs in other subfolders are safe."""
    written = {Path(out_dir).resolve(), Path(out_dir).resolve() / "panoptic"}
    inside = [Path(p) for p in paths if Path(p).resolve().parent in written]
    if inside:
        raise OutputFolderError(f"{out_dir} holds input images ({inside[0]}{' and more' if len(inside) > 1 else ''}): "
                                f"the run's drawings would overwrite them; write into {elsewhere}")


def _predict_into(
    predictor: Predictor, paths: list[Path], out_dir: Path, record: Callable[[Path], Path], *,
    threshold: float | None, all_queries: bool, draw: bool, progress: Callable[[Iterable[Any]], Iterable[Any]] | None,
    task: Task, slice: SliceSettings | int | None = None, prompt: str | Sequence[str] | None = None,
    text_threshold: float = 0.25,
) -> PredictionRun:
    """:func:`predict_files` in its claimed folder; ``record`` notes each file before it is written."""
    names = unique_file_names(paths)
    run = PredictionRun(predictions=[])
    threshold_value = predictor.threshold if threshold is None else threshold
    size = predictor.batch_size
    batches = [list(range(start, min(start + size, len(paths)))) for start in range(0, len(paths), size)]
    used_names: set[str] = set()
    try:
        for batch in progress(batches) if progress is not None else batches:
            loaded = []
            for index in batch:
                try:
                    loaded.append((paths[index], names[index], to_rgb_array(paths[index])))
                except ImageLoadError as error:  # missing, truncated, not an image
                    # The decoder's own error says what is wrong; _skip names the file itself.
                    cause = error.__cause__
                    _skip(run, paths[index], f"{type(cause).__name__}: {cause}" if cause is not None else str(error))
            for path, array, prediction in _predict_each(predictor, loaded, None if all_queries else threshold_value,
                                                         run, task, slice, prompt, text_threshold):
                run.predictions.append(prediction)
                name = _unique_name(prediction.file_name, used_names)
                if task == "panoptic":
                    assert prediction.panoptic is not None
                    run.panoptic_pngs.append(write_panoptic_png(record(out_dir / "panoptic" / f"{Path(name).stem}.png"),
                                                                prediction.panoptic))
                    if draw:
                        run.drawn.append(save_image(record(out_dir / name), draw_panoptic(array, prediction.panoptic)))
                elif draw:
                    shown = prediction.above(threshold_value) if all_queries else prediction
                    drawing = draw_prediction(array, shown)  # keypoints joined by the prediction's skeletons
                    run.drawn.append(save_image(record(out_dir / name), drawing))
    finally:  # whatever stops the run, the images done so far are written
        assign_image_ids(run.predictions)
        run.predictions_json = write_predictions_json(
            record(out_dir / "predictions.json"), run.predictions, category_map=predictor.category_map
        )
        if task == "panoptic":
            annotations = [panoptic_annotation(prediction, png.name)
                           for prediction, png in zip(run.predictions, run.panoptic_pngs)]
            labels = [s["label"] for p in run.predictions for s in (p.panoptic.segments_info if p.panoptic else [])]
            categories = panoptic_categories(predictor.category_map, predictor.is_thing, labels)
            run.panoptic_json = write_panoptic_json(record(out_dir / "panoptic.json"), annotations, categories)
    return run


def unique_file_names(paths: Sequence[Path]) -> list[str]:
    """The ``file_name`` of each path in outputs: its path relative to the inputs' common folder (the bare
    name when all come from one folder), so that ``a/1.jpg`` and ``b/1.jpg`` stay apart."""
    if not paths:
        return []
    resolved = [path.resolve() for path in paths]
    root = Path(os.path.commonpath([str(path.parent) for path in resolved]))
    return [path.relative_to(root).as_posix() for path in resolved]


def _skip(run: PredictionRun, path: Path, reason: str) -> None:
    logger.warning("skipping %s: %s", path, reason)
    run.skipped.append((path, reason))


def _predict_each(
    predictor: Predictor, loaded: list[tuple[Path, str, np.ndarray]], threshold: float | None, run: PredictionRun,
    task: Task = "detection", slice: SliceSettings | int | None = None, prompt: str | Sequence[str] | None = None,
    text_threshold: float = 0.25,
) -> list[tuple[Path, np.ndarray, Prediction]]:
    """Predict a batch of loaded images; an image that fails (too thin to resize, ...) or whose output is
    not finite (NaN weights) is skipped into ``run.skipped``, and a failed batch is retried image by image."""
    if not loaded:
        return []
    arrays = [array for _, _, array in loaded]
    try:
        # every query, the threshold applied below (instance masks only for "instances": one full-size mask per
        # query costs memory)
        predictions = predictor.predict_arrays(arrays, file_names=[name for _, name, _ in loaded], threshold=None,
                                               task=task, masks=task == "instances", slice=slice, prompt=prompt,
                                               text_threshold=text_threshold)
    except Exception as error:  # one bad image must not cost the others
        if len(loaded) > 1:
            return [result for item in loaded
                    for result in _predict_each(predictor, [item], threshold, run, task, slice, prompt,
                                                text_threshold)]
        path, _, array = loaded[0]
        _skip(run, path, f"cannot predict on its {array.shape[1]}x{array.shape[0]} pixels: {type(error).__name__}: "
                         f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''}")
        return []
    results = []
    for (path, _, array), prediction in zip(loaded, predictions):
        if prediction.error is not None:  # outputs not finite (the one rule: detr.inference.predict)
            _skip(run, path, prediction.error)
            continue
        results.append((path, array, prediction if threshold is None else prediction.above(threshold)))
    return results


def _unique_name(file_name: str | None, used: set[str]) -> str:
    stem = Path(file_name).stem if file_name else "image"
    name, index = f"{stem}.jpg", 0
    while name in used or name == "predictions.json":
        index += 1
        name = f"{stem}_{index}.jpg"
    used.add(name)
    return name
