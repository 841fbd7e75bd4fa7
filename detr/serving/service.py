"""The model side of the server: a :class:`~detr.inference.predictor.Predictor` run on batches of decoded
images (:meth:`DetectionService.run_batch`, the :class:`~detr.serving.batching.DynamicBatcher`'s function), its
:class:`~detr.inference.prediction.Prediction` as JSON (:func:`prediction_json`), and the explorer page of one
image (:meth:`DetectionService.explorer_page`).

Results equal the Predictor's for the same image: a batch is split into groups of images of the same size
(and the same task and threshold), and each group is one :meth:`Predictor.predict_arrays` call. Same-size
images need no padding, so an image's outputs do not depend on what it was batched with (mixed sizes would
be padded to the batch's largest, which changes the outputs slightly, as the Predictor's docstring says).
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from detr.categories import CategoryMap
from detr.inference.grounding import prompt_phrases, prompt_text
from detr.inference.postprocess_masks import panoptic_png
from detr.inference.prediction import Prediction
from detr.inference.predictor import NonFiniteOutputError, Predictor
from detr.inference.slicing import SliceSettings
from detr.visualize.explorer import render_explorer_html
from detr.visualize.explorer.pages import explorer_page_data

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One ``/predict`` request, decoded: ``pixels`` uint8 RGB ``[H, W, 3]``, a score ``threshold`` in [0, 1],
    a ``task`` ("detection", "instances" or "panoptic") and its ``slice`` (None: the whole image only); a prompted
    model's ``prompt`` ("a cat. a remote control.") and ``text_threshold`` in [0, 1]."""

    pixels: np.ndarray
    threshold: float
    task: str
    slice: SliceSettings | None = None
    prompt: str | None = None
    text_threshold: float = 0.25


class ModelOutputError(RuntimeError):
    """The model failed on a request that was fine (e.g. outputs not finite): the server answers 500."""


class DetectionService:
    """A Predictor behind a server.

    Args:
        predictor: the model, its post-processing and its label names.
        model_name: what responses and ``/health`` call the model (e.g. the checkpoint's file name).
    """

    def __init__(self, predictor: Predictor, *, model_name: str) -> None:
        self.predictor = predictor
        self.model_name = model_name
        self.description = predictor.model.describe()

    def check_task(self, task: str) -> None:
        """Raise ``ValueError`` (naming the fix) when the model cannot do ``task``: see :meth:`Predictor.check_task`."""
        self.predictor.check_task(task)

    def check_image(self, pixels: np.ndarray) -> None:
        """Raise ``ValueError`` when the eval resize cannot take the image (so thin that a side would be 0 px:
        :meth:`detr.models.inputs.InputSpec.resized_shape`)."""
        self.predictor.input_spec.resized_shape(*pixels.shape[:2])

    def run_batch(self, jobs: Sequence[Job]) -> list[dict[str, Any] | Exception]:
        """One JSON response (:func:`prediction_json`) per job, or the exception that failed it."""
        results: list[dict[str, Any] | Exception | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        for index, job in enumerate(jobs):
            key = (job.pixels.shape, job.task, job.threshold, job.slice, job.prompt, job.text_threshold)
            groups.setdefault(key, []).append(index)
        for (_, task, threshold, tiles, prompt, text_threshold), indices in groups.items():
            group = [jobs[i] for i in indices]
            for index, outcome in zip(indices, self._run_group(group, task, threshold, tiles, prompt, text_threshold)):
                results[index] = outcome
        return results  # type: ignore[return-value]

    def _run_group(self, jobs: Sequence[Job], task: str, threshold: float, tiles: SliceSettings | None = None,
                   prompt: str | None = None, text_threshold: float = 0.25) -> list[dict[str, Any] | Exception]:
        try:
            predictions = self.predictor.predict_arrays([job.pixels for job in jobs], threshold=threshold,
                                                        task=task, check_finite=True,  # type: ignore[arg-type]
                                                        slice=tiles, prompt=prompt, text_threshold=text_threshold)
        except NonFiniteOutputError as error:
            if len(error.indices) == len(jobs):
                return [ModelOutputError(str(error)) for _ in jobs]
            # Only some images: run the others again (their outputs do not depend on the failed ones).
            outcomes: list[dict[str, Any] | Exception] = []
            for i, job in enumerate(jobs):
                outcomes.extend([ModelOutputError(str(error))] if i in error.indices
                                else self._run_group([job], task, threshold, tiles, prompt, text_threshold))
            return outcomes
        except Exception as error:  # one group's failure must not cost the other groups
            logger.exception("prediction failed for a group of %d images", len(jobs))
            return [ModelOutputError(f"{type(error).__name__}: {error}") for _ in jobs]
        return [prediction_json(prediction, category_map=self.predictor.category_map, model_name=self.model_name,
                                task=task, threshold=threshold, tiles=tiles, prompt=prompt)
                for prediction in predictions]

    def explorer_page(self, pixels: np.ndarray, *, title: str, threshold: float) -> str:
        """The attention explorer's HTML page (:mod:`detr.visualize.explorer`) for one image, self-contained.

        Raises:
            ModelOutputError: the model's outputs are not finite.
        """
        try:
            data = explorer_page_data(self.predictor, pixels, title=title, threshold=threshold,
                                      model_description=f"{self.model_name}: {self.description}")
        except ValueError as error:
            raise ModelOutputError(str(error)) from error
        return render_explorer_html(data)


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def prediction_json(prediction: Prediction, *, category_map: CategoryMap | None, model_name: str, task: str,
                    threshold: float, tiles: SliceSettings | None = None, prompt: str | None = None
                    ) -> dict[str, Any]:
    """A :class:`Prediction` as the ``/predict`` response.

    ``{"model", "task", "threshold", "image": {"width", "height"}, "detections": [{"query", "label",
    "category_id", "category_name", "score", "box_xyxy" (pixels in the original image)}]}``; with a panoptic
    model's masks, each detection also has ``mask`` (a PNG data URL, white = the instance); with a keypoint
    model's, ``keypoints``: ``[[x, y, score], ...]``, its category's points in pixels of the original image and
    each point's score (:meth:`Prediction.detection_keypoints`: as many as the model gives its class); with
    ``task="panoptic"``, ``panoptic: {"segments": [COCO panoptic segments_info + score, label, label_name],
    "png": data URL of COCO panoptic's PNG (segment id = R + 256·G + 256²·B, 0 = void)}``.
    Category ids are the data set's (the checkpoint's category map); without a map, the model's labels.
    A tracked frame (:attr:`Prediction.track_ids` set) also has ``frame`` (its number in the stream, 1-based), and
    each detection ``track_id`` (1, 2, ...; -1: not in a track yet).
    A sliced request (``tiles``) also has ``slice: {"size", "overlap", "inputs"}`` (the model inputs: tiles and
    the whole image), and each detection's ``query`` is a query of the input that found it.
    A prompted request (``prompt``) also has ``prompt`` (as the model read it) and ``phrases`` (the prompt's
    phrases); each detection's ``label`` and ``category_id`` are its phrase (0-based) and ``category_name`` the
    prompt's words it was found for.
    """
    detections = []
    for i in range(len(prediction)):
        label = int(prediction.labels[i])
        detection = {
            "query": int(prediction.query_indices[i]),
            "label": label,
            "category_id": int(category_map.label_to_category_id(label)) if category_map is not None else label,
            "category_name": prediction.label_names[i],
            "score": float(prediction.scores[i]),
            "box_xyxy": [float(v) for v in prediction.boxes[i]],
        }
        if prediction.track_ids is not None:
            detection["track_id"] = int(prediction.track_ids[i])
        if prediction.masks is not None:
            detection["mask"] = _data_url(_mask_png(prediction.masks[i].numpy()))
        if prediction.keypoints is not None:
            detection["keypoints"] = prediction.detection_keypoints(i).float().tolist()  # type: ignore[union-attr]
        detections.append(detection)
    height, width = prediction.image_size
    response: dict[str, Any] = {"model": model_name, "task": task, "threshold": threshold,
                                "image": {"width": width, "height": height}, "detections": detections}
    if prediction.track_ids is not None:
        response["frame"] = prediction.image_id
    if prompt is not None:
        response["prompt"], response["phrases"] = prompt_text(prompt), prompt_phrases(prompt)
    if tiles is not None:
        response["slice"] = {"size": tiles.size, "overlap": tiles.overlap, "inputs": tiles.count(height, width)}
    if prediction.panoptic is not None:
        segments = [{key: (float(value) if key == "score" else value) for key, value in segment.items()}
                    for segment in prediction.panoptic.segments_info]
        response["panoptic"] = {"segments": segments, "png": _data_url(panoptic_png(prediction.panoptic.id_map))}
    return response


def _mask_png(mask: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8) * 255).save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()
