"""Keypoint predictions → pixels of the original image, per kept detection (the keypoint half of
:class:`detr.PostProcess`, as :mod:`detr.inference.postprocess_masks` is the masks').

A keypoint model predicts, per query, K points as normalised (x, y) in [0, 1] of the
unpadded input image, as its boxes are, and a third channel per point (a visibility score). These functions scale
them as :func:`detr.inference.postprocess.boxes_to_pixels` scales the boxes, and pick each kept detection's
points by the query it came from.

GroupPose heads (:mod:`detr.models.layers.keypoint_head`, the rfdetr package's keypoint model) predict 8 channels per
point slot of each class; :func:`grouppose_keypoints` decodes them for each kept detection as the package's
``PostProcess`` does (below).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from detr.models.detector import Detector
from detr.models.layers.keypoint_head import KeypointSchema


def keypoints_to_pixels(keypoints: torch.Tensor, target_sizes: torch.Tensor, *, clip: bool = False) -> torch.Tensor:
    """Normalised keypoints float [B, Q, K, 3] (x, y in [0, 1], a score) → float [B, Q, K, 3]: pixel x, y in images
    of ``target_sizes`` int [B, 2] (height, width), the score unchanged. ``clip``: points past an edge end at it
    (predictions files and drawings)."""
    if keypoints.ndim != 4 or keypoints.shape[-1] != 3:
        raise ValueError(f"keypoints must be [batch, queries, keypoints, 3] (x, y, score), got "
                         f"{tuple(keypoints.shape)}")
    height, width = target_sizes.to(keypoints.device).float().unbind(1)
    scale = torch.stack([width, height], dim=1)[:, None, None, :]  # [B, 1, 1, 2]
    points = keypoints[..., :2].float() * scale
    if clip:
        points = torch.minimum(torch.maximum(points, torch.zeros_like(scale)), scale)
    return torch.cat([points, keypoints[..., 2:].float()], dim=-1)


def add_keypoints(results: list[dict[str, torch.Tensor]], keypoints_pixels: torch.Tensor
                  ) -> list[dict[str, torch.Tensor]]:
    """Each image's post-processed ``results`` (:class:`detr.PostProcess`: ``queries`` int64 [N] among them) with
    ``keypoints`` float [N, K, 3] added: the points of the query each detection came from (``keypoints_pixels``
    [B, Q, K, 3], :func:`keypoints_to_pixels`). Returns new dicts, in order."""
    if len(results) != len(keypoints_pixels):
        raise ValueError(f"{len(results)} images' results but keypoints for {len(keypoints_pixels)} images")
    return [{**result, "keypoints": points[result["queries"].to(points.device)]}
            for result, points in zip(results, keypoints_pixels)]


# GroupPose: each detection reads its class's slots (label · K_max ...) of its query: x, y in pixels and the
# findable probability; the precision's Cholesky factor (log l11, l21, log l22) as predicted. With trace_alpha > 0
# the score s becomes sigmoid(log s − α · log t̄), t̄ the findability-weighted mean covariance trace of its
# keypoints (the rfdetr package's rule since 1.11; 1.8.0 multiplied s by t̄^−α, which ranks alike).

def log_mean_trace(keypoints: torch.Tensor) -> torch.Tensor:
    """keypoints [..., K, ≥ 7] of one class → [...]: log of the findability-weighted mean trace of each keypoint's
    covariance, from the precision's Cholesky factor (channels 4-6) and the findable logit (channel 2)."""
    log_l11, l21, log_l22 = keypoints[..., 4], keypoints[..., 5], keypoints[..., 6]
    log_t1, log_t2 = -2.0 * log_l11, -2.0 * log_l22
    log_t3 = 2.0 * torch.log(l21.abs().clamp(min=1e-12)) + log_t1 + log_t2
    log_trace = torch.logsumexp(torch.stack([log_t1, log_t2, log_t3], dim=-1), dim=-1)
    log_weight = torch.log(keypoints[..., 2].sigmoid().clamp(min=1e-12))
    return torch.logsumexp(log_trace + log_weight, dim=-1) - torch.logsumexp(log_weight, dim=-1)


@torch.no_grad()
def grouppose_keypoints(keypoints: torch.Tensor, detections: list[dict[str, torch.Tensor]],
                        target_sizes: torch.Tensor, num_keypoints_per_class: tuple[int, ...] | list[int], *,
                        trace_alpha: float = 0.2) -> list[dict[str, torch.Tensor]]:
    """keypoints [B, Q, C_k · K_max, 8]: a model's raw keypoints (``DetectorOutput.keypoints``); detections: per
    image what :class:`~detr.inference.postprocess.PostProcess` returns (``scores``, ``labels``, ``queries`` [N]);
    target_sizes [B, 2] (height, width) of the original images; num_keypoints_per_class: the head's schema.

    Returns per image the detection's dict with ``keypoints`` float [N, K_max, 3] (x, y in pixels of the original
    image, score in [0, 1]), ``keypoint_precision`` float [N, K_max, 3] (log l11, l21, log l22; NaN where the
    class has no such keypoint) and, with ``trace_alpha`` > 0, ``scores`` fused with the keypoints' uncertainty.
    """
    schema = KeypointSchema(tuple(num_keypoints_per_class))
    if len(detections) != len(keypoints) or target_sizes.shape != (len(keypoints), 2):
        raise ValueError(f"keypoints_to_pixels: {len(keypoints)} images of keypoints need as many detections and "
                         f"target_sizes [B, 2], got {len(detections)} and {tuple(target_sizes.shape)}")
    results = []
    for image, detection in enumerate(detections):
        labels, queries = detection["labels"], detection["queries"]
        per_class = keypoints[image, queries].unflatten(-2, (schema.num_classes, schema.max_count))  # [N, C_k, Km, 8]
        height, width = target_sizes[image].to(keypoints.dtype).unbind()
        pixels = per_class.new_zeros(len(labels), schema.max_count, 3)
        precision = per_class.new_full((len(labels), schema.max_count, 3), float("nan"))
        scores = detection["scores"]
        penalty = scores.new_zeros(len(labels))  # log t̄ per detection, 0 where the class has no keypoints
        for label, count in enumerate(schema.counts):
            rows = (labels == label).nonzero().squeeze(1)
            if count == 0 or rows.numel() == 0:
                continue
            chosen = per_class[rows, label, :count]  # [n, K_c, 8]
            pixels[rows, :count] = torch.stack([chosen[..., 0] * width, chosen[..., 1] * height,
                                                chosen[..., 2].sigmoid()], -1)
            precision[rows, :count] = chosen[..., 4:7]
            penalty[rows] = log_mean_trace(chosen).to(penalty.dtype)
        if trace_alpha > 0:
            listed = labels < schema.num_classes
            fused = torch.sigmoid(torch.log(scores) - trace_alpha * penalty)
            fused = torch.minimum(fused, torch.nextafter(torch.ones_like(fused), torch.zeros_like(fused)))
            scores = torch.where(listed, fused, scores)
        results.append({**detection, "scores": scores, "keypoints": pixels, "keypoint_precision": precision})
    return results


@dataclass(frozen=True)
class PostProcessKeypoints:
    """A GroupPose keypoint model's post-processing (:func:`grouppose_keypoints` with its schema and trace α), as
    the prediction path applies it to :class:`~detr.inference.postprocess.PostProcess`'s detections."""

    num_keypoints_per_class: tuple[int, ...]
    trace_alpha: float = 0.2

    @classmethod
    def for_model(cls, model: Detector) -> PostProcessKeypoints | None:
        """The model's (its ``keypoint_schema`` and ``keypoint_trace_alpha``), or None for a model without
        keypoints."""
        schema = model.keypoint_schema
        return None if schema is None else cls(schema.counts, model.keypoint_trace_alpha)

    def __call__(self, keypoints: torch.Tensor, detections: list[dict[str, torch.Tensor]],
                 target_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """:func:`grouppose_keypoints` of ``keypoints`` [B, Q, C_k · K_max, 8] for ``detections`` in images of
        ``target_sizes`` [B, 2] (height, width)."""
        return grouppose_keypoints(keypoints, detections, target_sizes, self.num_keypoints_per_class,
                                   trace_alpha=self.trace_alpha)
