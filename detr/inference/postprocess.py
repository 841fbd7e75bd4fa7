"""Raw predictions → per-image scores, labels and pixel boxes (the authors' PostProcess, models/detr.py; the
real-time DETRs' top-k over queries × classes, lyuwenyu/RT-DETR's RTDETRPostProcessor)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from detr.box_ops import cxcywh_to_xyxy
from detr.models.outputs import LayerOutput


def head_of_outputs(outputs: LayerOutput, class_head: str | None) -> str:
    """The class head to read ``outputs``' logits with: the one they state, which must agree with
    ``class_head`` where both are given; ``class_head`` (or softmax) where they do not state one."""
    stated = getattr(outputs, "class_head", None)
    if stated is not None and class_head is not None and stated != class_head:
        raise ValueError(f"post-processing built for the {class_head} class head was given outputs of a {stated} "
                         f"head; build it with class_head={stated!r} (model.class_head), or leave class_head "
                         "unset to follow the outputs")
    return stated or class_head or "softmax"


def _check_class_head(class_head: str) -> None:
    if class_head not in ("softmax", "sigmoid"):
        raise ValueError(f"class_head must be 'softmax' or 'sigmoid' (the model's model.class_head), got {class_head!r}")


def class_probabilities(logits: torch.Tensor, class_head: Literal["softmax", "sigmoid"]) -> torch.Tensor:
    """[..., K] logits → float per-class probabilities: a softmax over every logit (the paper's head; the
    last column is "no object") or independent sigmoids (``class_head="sigmoid"``, no such column)."""
    _check_class_head(class_head)
    return logits.float().sigmoid() if class_head == "sigmoid" else logits.float().softmax(-1)


def scores_and_labels(logits: torch.Tensor, class_head: Literal["softmax", "sigmoid"]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's score and label: its most probable real class ("no object" excluded)."""
    probabilities = class_probabilities(logits, class_head)
    return (probabilities[..., :-1] if class_head == "softmax" else probabilities).max(-1)


def top_k_pairs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` best (query, class) pairs of sigmoid logits [B, Q, K] by score, best first → scores [B, k'],
    labels int64 [B, k'] and queries int64 [B, k'], k' = min(k, Q · K): the real-time DETRs' post-processing,
    a query possibly picked as several classes (written with tensor ops only, so an exported graph holds it)."""
    num_classes = logits.shape[-1]
    probabilities = class_probabilities(logits, "sigmoid").flatten(1)  # [B, Q·K], query-major
    scores, index = probabilities.topk(min(k, probabilities.shape[1]), dim=1)
    return scores, index % num_classes, index // num_classes


def boxes_to_pixels(boxes: torch.Tensor, target_sizes: torch.Tensor, *, clip: bool = False) -> torch.Tensor:
    """Normalised cxcywh [B, Q, 4] → float pixel xyxy [B, Q, 4] in images of target_sizes [B, 2] (height, width),
    as the authors' PostProcess (the model's cxcywh is a sigmoid in [0, 1], but its extent is not bounded, so
    a corner may lie outside the image). ``clip``: a box that reaches past an edge ends at it, so that no
    corner is negative or beyond the image in a predictions file or a drawing."""
    height, width = target_sizes.to(boxes.device).float().unbind(1)
    scale = torch.stack([width, height, width, height], dim=1)[:, None, :]  # [B, 1, 4]
    pixels = cxcywh_to_xyxy(boxes.float()) * scale
    if not clip:
        return pixels
    # min/max against tensors (not clamp with Python numbers): the sizes differ per image and stay graph inputs
    # in an exported model
    return torch.minimum(torch.maximum(pixels, torch.zeros_like(scale)), scale)


class PostProcess(nn.Module):
    """Softmax over all logits; score and label = max over the real classes (no-object excluded);
    boxes cxcywh → xyxy scaled to each ORIGINAL image, not clipped (the authors' PostProcess and transformers'
    ``post_process_object_detection``; their published AP was measured so). No threshold and no top-k: all
    queries are kept. ``clip=True`` ends every box at the image's edges, as predictions files and drawings
    want them (:func:`detr.inference.predict.predictions_from_outputs` does).

    ``class_head="sigmoid"`` (a model built with ``build_detr(class_head="sigmoid")``, trained with the
    focal loss: the demo's, Deformable DETR): independent sigmoids over the ``num_classes`` logits, score
    and label = their max. The default (None) reads the outputs as the model that made them says
    (:attr:`DetectorOutput.class_head`; softmax where they do not say); a head given here that differs from
    the outputs' raises ValueError instead of scoring them wrongly.

    ``top_k`` (a sigmoid head only): instead of one detection per query, the ``top_k`` best (query, class)
    pairs by score, best first, so that a query may be detected as several classes: the real-time DETRs'
    post-processing (``Detector.detections_per_image``; transformers' ``RTDetrImageProcessor``).
    """

    def __init__(self, class_head: Literal["softmax", "sigmoid"] | None = None, *, clip: bool = False,
                 top_k: int | None = None) -> None:
        super().__init__()
        if class_head is not None:
            _check_class_head(class_head)
        if top_k is not None and (top_k < 1 or class_head == "softmax"):
            raise ValueError(f"top_k must be at least 1 and needs the sigmoid head, got {top_k} for {class_head}")
        self.class_head, self.clip, self.top_k = class_head, clip, top_k

    @torch.no_grad()
    def forward(self, outputs: LayerOutput, target_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """outputs: the model's :class:`~detr.models.outputs.DetectorOutput` (or any layer's predictions):
        logits [B, Q, C+1] (softmax head; [B, Q, C] sigmoid head), boxes [B, Q, 4] normalised cxcywh;
        target_sizes [B, 2] as (height, width) of the original images. Returns per image {scores float [N],
        labels int64 [N], boxes float [N, 4] pixel xyxy, queries int64 [N]: the query of each detection}, N = Q
        (in query order) or ``top_k`` (best first)."""
        logits, boxes = outputs.logits, outputs.boxes
        if len(logits) != len(target_sizes) or target_sizes.shape[-1] != 2:
            raise ValueError(f"target_sizes must be [B, 2] (height, width) with B = {len(logits)}, "
                             f"got {tuple(target_sizes.shape)}")
        class_head = head_of_outputs(outputs, self.class_head)
        boxes = boxes_to_pixels(boxes, target_sizes, clip=self.clip)
        if self.top_k is None:
            scores, labels = scores_and_labels(logits, class_head)
            queries = torch.arange(logits.shape[1], device=logits.device).expand(len(logits), -1)
        else:
            if class_head != "sigmoid":
                raise ValueError(f"top_k post-processing needs the sigmoid head, got outputs of a {class_head} head")
            scores, labels, queries = top_k_pairs(logits, self.top_k)
            boxes = boxes.gather(1, queries[..., None].expand(-1, -1, 4))
        return [{"scores": s, "labels": l, "boxes": b, "queries": q}
                for s, l, b, q in zip(scores, labels, boxes, queries)]
