"""Keypoint predictions → pixels of the original image, per kept detection (the keypoint half of
:class:`detr.PostProcess`, as :mod:`detr.inference.postprocess_masks` is the masks').

A keypoint model (issue 61's heads, to come) predicts, per query, K points as normalised (x, y) in [0, 1] of the
unpadded input image, as its boxes are, and a third channel per point (a visibility score). These functions scale
them as :func:`detr.inference.postprocess.boxes_to_pixels` scales the boxes, and pick each kept detection's
points by the query it came from.
"""

from __future__ import annotations

import torch


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
