"""One prediction path: a detector's output for a padded batch → one :class:`Prediction` per image.

:func:`predictions_from_outputs` is what every prediction command runs after the model: ``detr predict`` (the
Lightning system's ``predict_step``), ``detr-predict`` and the :class:`detr.Predictor`, ``detr-serve`` and the
attention explorer. It post-processes with the model's class head, keeps the queries above a threshold,
adds each detection's mask (a panoptic model), the image's panoptic segmentation (``task="panoptic"``) and
its attention (``return_attention``), and applies one rule to images it cannot predict: an image that could
not be read (``errors``) or whose logits or boxes are not finite gets a :class:`Prediction` with no
detections and :attr:`Prediction.error` saying why, so that every caller skips and reports the same images.
Sliced inference (:mod:`detr.inference.slicing`) runs it on each tile and merges the tiles' predictions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from detr.categories import CategoryMap
from detr.inference.postprocess import PostProcess
from detr.inference.postprocess_keypoints import PostProcessKeypoints
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic
from detr.inference.prediction import (
    AttentionMaps,
    PanopticSegmentation,
    Prediction,
    SamplingPoints,
    label_name,
    select_detections,
)
from detr.models.outputs import DetectorOutput

#: :attr:`Prediction.error` of an image whose outputs hold NaN or inf.
NOT_FINITE = "the model's outputs are not finite (NaN or inf weights?)"


def finite_images(outputs: DetectorOutput) -> torch.Tensor:
    """bool [B]: which images' logits and boxes are all finite."""
    return (torch.isfinite(outputs.logits).flatten(1).all(1) & torch.isfinite(outputs.boxes).flatten(1).all(1))


def predictions_from_outputs(
    outputs: DetectorOutput,
    *,
    image_sizes: Sequence[tuple[int, int]],
    input_sizes: Sequence[tuple[int, int]],
    class_head: str,
    category_map: CategoryMap | None,
    threshold: float | None = None,
    file_names: Sequence[str | None] | None = None,
    image_ids: Sequence[int | None] | None = None,
    errors: Sequence[str | None] | None = None,
    masks: PostProcessMasks | None = None,
    panoptic: PostProcessPanoptic | None = None,
    stride: int | None = None,
    top_k: int | None = None,
    keypoints: PostProcessKeypoints | None = None,
) -> list[Prediction]:
    """The :class:`Prediction` of every image of a batch.

    Args:
        outputs: the model's output for the padded batch (any device; results come back on the CPU).
        image_sizes: ``(height, width)`` of each original image: the boxes, masks and segmentation are in it.
        input_sizes: ``(height, width)`` of each image as it entered the model (resized, before padding).
        class_head: the model's class head ("softmax" or "sigmoid"), which decides the scores.
        category_map: names the labels (None: "class <label>").
        threshold: keep the queries scoring strictly above it; None keeps every query.
        file_names, image_ids: recorded in each prediction (None: not recorded).
        errors: per image, why it could not be read (None: it was); such an image's entry in the batch is a
            placeholder, and its prediction carries the error.
        masks: a panoptic model's mask post-processing: each kept detection's mask at the original size.
        panoptic: also segment each image (:attr:`Prediction.panoptic`).
        stride: the model's stride: with it, the attention in ``outputs`` (``model(..., return_attention=True)``)
            goes into each prediction (:class:`AttentionMaps` or :class:`SamplingPoints`); without it, none.
        top_k: the model's ``detections_per_image``: None, one detection per query; k, the k best (query,
            class) pairs (see :class:`detr.inference.postprocess.PostProcess`).
        keypoints: a keypoint model's post-processing (:class:`PostProcessKeypoints`, ``for_model``): each
            detection's keypoints in :attr:`Prediction.keypoints`, its score fused with their uncertainty before
            the threshold; None, or outputs without keypoints: no keypoints.

    Returns one prediction per image, in batch order; a failed image's has no detections and
    :attr:`Prediction.error` set.
    """
    count = len(image_sizes)
    file_names = list(file_names) if file_names is not None else [None] * count
    image_ids = list(image_ids) if image_ids is not None else [None] * count
    reasons = list(errors) if errors is not None else [None] * count
    finite = finite_images(outputs).tolist()
    reasons = [reason if reason is not None else (None if ok else NOT_FINITE) for reason, ok in zip(reasons, finite)]
    # a failed image is post-processed at its input size (an unreadable image's original size is unknown)
    sizes = [input_size if reason is not None else image_size
             for image_size, input_size, reason in zip(image_sizes, input_sizes, reasons)]
    target_sizes = torch.tensor(sizes, dtype=torch.int64)
    # clipped to the image: these predictions are written to files, drawn and served
    sizes_on_device = target_sizes.to(outputs.logits.device)
    results = PostProcess(class_head=class_head, clip=True, top_k=top_k)(outputs, sizes_on_device)
    if keypoints is not None and outputs.keypoints is not None:
        results = keypoints(outputs.keypoints, results, sizes_on_device)
    # the sampling points' per-query scores are one per query, whatever the detections are
    per_query = (results if top_k is None or stride is None or outputs.sampling is None else
                 PostProcess(class_head=class_head, clip=True)(outputs, sizes_on_device))
    segmentations = None
    if panoptic is not None:
        segmentations = panoptic(outputs, torch.tensor(list(input_sizes), dtype=torch.int64), target_sizes)
    padded_size = (max(h for h, _ in input_sizes), max(w for _, w in input_sizes))
    predictions = []
    for i, result in enumerate(results):
        if reasons[i] is not None:
            predictions.append(_failed(image_sizes[i], file_names[i], image_ids[i], reasons[i]))
            continue
        result = {key: value.cpu() for key, value in result.items()}
        prediction = select_detections(result, image_size=image_sizes[i], category_map=category_map,
                                       threshold=threshold, file_name=file_names[i], image_id=image_ids[i],
                                       keypoint_counts=None if keypoints is None else keypoints.num_keypoints_per_class)
        if masks is not None and outputs.masks is not None:  # the kept detections only: one full-size map each
            prediction.masks = masks.image_masks(outputs.masks[i, prediction.query_indices.to(outputs.masks.device)],
                                                 input_sizes[i], padded_size, image_sizes[i]).cpu()
        if segmentations is not None:
            segments = [{**segment, "label_name": label_name(category_map, segment["label"])}
                        for segment in segmentations[i]["segments_info"]]
            prediction.panoptic = PanopticSegmentation(segmentations[i]["id_map"].cpu(), segments)
        if stride is not None and outputs.sampling is not None:  # Deformable DETR: sampling points, no maps
            prediction.sampling = SamplingPoints.from_outputs(outputs, per_query[i], index=i,
                                                              image_size=image_sizes[i])
        elif stride is not None and outputs.attention is not None:
            prediction.attention = AttentionMaps.from_outputs(
                outputs, result, index=i, input_size=tuple(input_sizes[i]), image_size=image_sizes[i],
                stride=stride, category_map=category_map, class_head=class_head)
        predictions.append(prediction)
    return predictions


def _failed(image_size: tuple[int, int], file_name: str | None, image_id: int | None, error: str) -> Prediction:
    return Prediction(boxes=torch.zeros(0, 4), scores=torch.zeros(0), labels=torch.zeros(0, dtype=torch.int64),
                      label_names=[], query_indices=torch.zeros(0, dtype=torch.int64),
                      image_size=(int(image_size[0]), int(image_size[1])), file_name=file_name, image_id=image_id,
                      error=error)
