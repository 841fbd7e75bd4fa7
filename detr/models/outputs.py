"""What every detector returns: one typed :class:`DetectorOutput` instead of a dict of optional keys.

Every model of this package (the paper's DETR, the anchor detector, Deformable DETR, the panoptic model)
returns a :class:`DetectorOutput` from ``forward``: the last decoder layer's class logits and boxes, and
typed optional fields for what some models or modes add (earlier decoder layers, denoising queries, the
dense head, two-stage proposals, masks, keypoints, attention maps, sampling points, edge distributions). A
field a model does not fill is ``None`` (or an empty list for :attr:`DetectorOutput.aux`), so readers test
``output.masks is not None`` rather than a key. Exports see plain tensors:
:class:`detr.checkpoints.export.DeployModel` flattens at the boundary, and the file formats keep their own names
(``pred_logits``, ``pred_boxes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch
from torch import Tensor

from detr.models.layers.denoising import DenoisingMeta


@dataclass
class MaskFeatures:
    """A layer's masks as the two factors of their logits, for training (RF-DETR's segmentation head, as the
    authors' ``sparse_forward``): the mask logit of query q at a point is ``queries[b, q] · pixels[b, :, point]
    + bias``, so the loss builds full maps for the matched queries only and the matcher reads every query at a
    few points (:mod:`detr.loss.point_sampling`), never [B, Q, H', W'] for all G · Q queries of every layer.

    pixels: ``[B, C, H', W']`` at stride 4 of the padded batch; queries: ``[B, Q, C]``; bias: ``[1]``.
    """

    pixels: Tensor
    queries: Tensor
    bias: Tensor


@dataclass
class LayerOutput:
    """Per-query predictions of one decoder layer (or of the denoising queries, or of the encoder proposals).

    logits: ``[B, Q, K]``: K = num_classes + 1 for the softmax head (the last = "no object"), num_classes
    for the sigmoid head. boxes: ``[B, Q, 4]``, normalised ``cxcywh`` of each unpadded image.
    mask_features: the layer's masks as :class:`MaskFeatures` (a model with an instance-mask head, in training).
    keypoints: ``[B, Q, C_k · K_max, 8]``, a keypoint model's raw keypoints, padded per class
    (:mod:`detr.models.layers.keypoint_head`: x, y normalised as the boxes; findable and visible logits; the
    precision's Cholesky factor log l11, l21, log l22; a class-logit share); None for a model without keypoints.
    """

    logits: Tensor
    boxes: Tensor
    mask_features: MaskFeatures | None = field(default=None, kw_only=True)
    keypoints: Tensor | None = field(default=None, kw_only=True)


@dataclass
class DistributionOutput:
    """Boxes refined as edge distributions (D-FINE's fine-grained distribution refinement, training only): what
    the fine-grained localisation and self-distillation losses read (:mod:`detr.loss.distribution`).

    corners: every decoder layer's edge logits, first to last, ``[L, B, Q, 4 · (N + 1)]`` (edges left, top,
    right, bottom; N + 1 bins each). initial: the initial boxes b⁰ ``[B, Q, 4]`` (normalised cxcywh, detached)
    that every layer's distances move. project: the weighting function W(n) ``[N + 1]`` (a distance in units of
    b⁰'s size over ``reg_scale`` per bin). reg_scale: ``[1]``. pre: the first layer's plain-head predictions
    (class logits without the quality term, b⁰ with its gradient), trained as one more layer.
    """

    corners: Tensor
    initial: Tensor
    project: Tensor
    reg_scale: Tensor
    pre: LayerOutput


@dataclass
class DenoisingOutput(LayerOutput):
    """The denoising queries' predictions (DN-DETR, training only): the last layer's (``logits``, ``boxes``),
    the earlier layers' (``aux``, layers 1 … L-1), how the queries were made (``meta``) and, for a model that
    refines boxes as distributions, theirs (``distributions``)."""

    aux: list[LayerOutput]
    meta: DenoisingMeta
    distributions: DistributionOutput | None = None


@dataclass
class DenseOutput:
    """The training-only dense head's predictions for every encoder cell (:mod:`detr.models.dense_head`):
    logits ``[B, HW, K]``, boxes ``[B, HW, 4]``, centers ``[B, HW, 2]`` (cell centres, normalised x, y),
    valid bool ``[B, HW]`` (False = padding cell)."""

    logits: Tensor
    boxes: Tensor
    centers: Tensor
    valid: Tensor


@dataclass
class AttentionOutput:
    """A dense-attention detector's maps (``return_attention=True``).

    decoder: ``[L, B, Q, h, w]`` cross-attention, mean over heads; decoder_heads: ``[L, B, heads, Q, h, w]``;
    encoder: ``[B, h·w, h, w]``, the last encoder layer's self-attention, mean over heads (row i is where
    feature position i looks); feature_mask: bool ``[B, h, w]`` (True = padding).
    """

    decoder: Tensor
    decoder_heads: Tensor
    encoder: Tensor
    feature_mask: Tensor


@dataclass
class SamplingOutput:
    """Where a Deformable DETR's decoder cross-attention looked (``return_attention=True``).

    locations: ``[L, B, Q, heads, levels, P, 2]``, (x, y) in [0, 1] of each level's padded map, as the
    attention reads them; points: the same in [0, 1] of the unpadded image (up to the rounding of the
    padding to whole cells of each level); weights: ``[L, B, Q, heads, levels, P]`` (summing to 1 per head
    over levels and points; with a point count per level, P is the largest and a level's missing points have
    weight 0); spatial_shapes: int64 ``[levels, 2]`` (h, w); strides: input pixels per cell of each level, finest
    first (doubling from level to level for most families; RF-DETR's and LW-DETR's are its patch over each
    projector's scale, e.g. 7 and 28).
    """

    locations: Tensor
    points: Tensor
    weights: Tensor
    spatial_shapes: Tensor
    strides: tuple[int, ...]


@dataclass
class DetectorOutput(LayerOutput):
    """A detector's raw predictions for a padded batch: ``logits`` and ``boxes`` of the last decoder layer
    (:class:`LayerOutput`), and:

    aux: the earlier decoder layers' predictions, layers 1 … L-1 (empty without auxiliary outputs).
    denoising: the denoising queries' predictions (anchor detector with DN, training only).
    dense: the dense head's predictions (training only).
    proposals: the encoder's proposals (Deformable DETR's two-stage: ``[B, S, K]``, ``[B, S, 4]``).
    masks: mask logits ``[B, Q, H', W']`` at stride 4 of the padded batch (a panoptic model; RF-DETR with
        instance masks in evaluation: in training its layers' ``mask_features`` hold them instead).
    attention: the attention maps of a dense-attention detector (``return_attention=True``).
    sampling: a Deformable DETR's sampling points (``return_attention=True``).
    text_attention: a prompted model's decoder cross-attention over the prompt's tokens ``[L, B, heads, Q, N]``
        (softmax weights over the N tokens; ``return_attention=True``).
    distributions: the edge distributions of a model that refines boxes as distributions (D-FINE, training only).
    class_head: the head that made ``logits`` ("softmax" or "sigmoid"), so that post-processing reads them
        as they were made (None: not stated, e.g. outputs built by hand).
    """

    aux: list[LayerOutput] = field(default_factory=list)
    denoising: DenoisingOutput | None = None
    dense: DenseOutput | None = None
    proposals: LayerOutput | None = None
    masks: Tensor | None = None
    attention: AttentionOutput | None = None
    sampling: SamplingOutput | None = None
    text_attention: Tensor | None = None
    distributions: DistributionOutput | None = None
    class_head: str | None = None

    @property
    def layers(self) -> list[LayerOutput]:
        """Every decoder layer's predictions, first to last (the last is this output's own)."""
        return [*self.aux, LayerOutput(self.logits, self.boxes, mask_features=self.mask_features,
                                       keypoints=self.keypoints)]

    def apply(self, fn: Callable[[Tensor], Tensor]) -> DetectorOutput:
        """A copy with ``fn`` applied to every tensor (e.g. ``lambda t: t.float().cpu()``); other values kept."""
        return _apply(self, fn)


def _apply(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, list):
        return [_apply(item, fn) for item in value]
    if is_dataclass(value) and not isinstance(value, type) and not isinstance(value, DenoisingMeta):
        return replace(value, **{f.name: _apply(getattr(value, f.name), fn) for f in fields(value) if f.init})
    return value


def stack_layers(logits: torch.Tensor, boxes: torch.Tensor, aux_loss: bool, class_head: str | None = None
                 ) -> DetectorOutput:
    """Every decoder layer's logits ``[L, B, Q, K]`` and boxes ``[L, B, Q, 4]`` → the last layer's, with
    layers 1 … L-1 in ``aux`` when ``aux_loss``, stating the ``class_head`` that made them."""
    aux = [LayerOutput(a, b) for a, b in zip(logits[:-1], boxes[:-1])] if aux_loss else []
    return DetectorOutput(logits[-1], boxes[-1], aux=aux, class_head=class_head)
