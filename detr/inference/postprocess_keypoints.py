"""GroupPose keypoints (:mod:`detr.models.layers.keypoint_head`) → pixel keypoints of each detection, as the rfdetr
package's ``PostProcess`` (1.8.0) decodes them after its top-k (query, class) selection
(:class:`detr.inference.postprocess.PostProcess` with ``top_k``).

Each detection reads the keypoints of its class (the padded slots ``label · K_max …``) of its query: x, y times the
original image's width and height, and a score, the sigmoid of the findable logit; the precision's Cholesky factor
(log l11, l21, log l22, normalised units) is handed on as predicted. A detection whose class has no keypoints (or lies
beyond the schema) gets zeros, and NaN for the precision. With ``trace_alpha`` > 0 the score s of a detection whose
class the schema lists becomes sigmoid(log s − α · log t̄), below 1, t̄ the findability-weighted mean of its
keypoints' covariance traces (Σ = (L Lᵀ)⁻¹, in log space; 0 for a class without keypoints), so that detections with
uncertain keypoints rank lower: the package's rule since 1.11 (1.8.0 multiplied s by t̄^−α, which could pass 1; the
two rank detections alike, so AP is the same).
"""

from __future__ import annotations

import torch

from detr.models.layers.keypoint_head import KeypointSchema


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
def keypoints_to_pixels(keypoints: torch.Tensor, detections: list[dict[str, torch.Tensor]],
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
