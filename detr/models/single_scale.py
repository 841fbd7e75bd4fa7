"""The skeleton of the single-scale detectors: backbone → input_proj → transformer → class and box heads.

:class:`SingleScaleDetector` holds what the paper's DETR and the anchor detector share: the backbone with its
position encoding, the 1×1 ``input_proj`` to the transformer's width, the class head (``class_embed``), the box head
(``bbox_embed``), the auxiliary outputs of earlier decoder layers, the training-only dense head, the
attention maps, and the input checks. A detector adds its query source:
:meth:`SingleScaleDetector.init_queries` makes its parameters and :meth:`SingleScaleDetector.decode_queries`
runs the transformer on them. The paper's
learned queries are :class:`detr.models.detr.DETR`; DAB-DETR's anchors with DN-DETR's denoising and Group
DETR's query groups are :class:`detr.models.anchor.model.AnchorDETR`.

``forward`` returns raw predictions only; matching, the loss and post-processing are separate modules.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

from detr.models.backbone import Joiner
from detr.models.config import PRIOR_BIAS, ClassHead
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.detector import Detector, Targets, check_inputs
from detr.models.layers.denoising import DenoisingMeta
from detr.models.layers.mlp import MLP
from detr.models.layers.position_encoding import PositionEmbeddingLearned
from detr.models.outputs import AttentionOutput, DenoisingOutput, DetectorOutput, stack_layers


def class_embedding(hidden_dim: int, num_classes: int, class_head: ClassHead) -> nn.Linear:
    """The class head. softmax: num_classes + 1 logits, the last = "no object"; sigmoid: one logit per
    real class, no "no object", each starting at p = 0.01 (the focal-loss prior, Lin et al. §4.1)."""
    layer = nn.Linear(hidden_dim, num_classes + 1 if class_head == "softmax" else num_classes)
    if class_head == "sigmoid":
        nn.init.constant_(layer.bias, PRIOR_BIAS)
    return layer


def attention_output(encoder_attention: torch.Tensor, decoder_attention: torch.Tensor, mask: torch.Tensor
                     ) -> AttentionOutput:
    """The ``return_attention`` maps: encoder_attention [B, heads, hw, hw] (last encoder layer),
    decoder_attention [L, B, heads, Q, hw] (cross-attention), mask bool [B, h, w] (True = padding) →
    :class:`AttentionOutput` (per-head and mean decoder maps on the feature grid, the encoder's mean over heads)."""
    height, width = mask.shape[-2:]
    heads = decoder_attention.unflatten(-1, (height, width))
    return AttentionOutput(decoder=heads.mean(dim=2), decoder_heads=heads,
                           encoder=encoder_attention.mean(dim=1).unflatten(-1, (height, width)), feature_mask=mask)


@dataclass
class DecodedQueries:
    """What a query source's decoder returns to the shared heads.

    hidden: every decoder layer's output [L, B, N, C]; boxes: [L, B, N, 4] normalised cxcywh when the decoder
    predicts them itself (the anchor decoder refines its boxes layer by layer), None to have the detector's
    box head read them from ``hidden`` (the paper); memory: the encoder output [B, hw, C]; encoder_attention
    [B, heads, hw, hw] and decoder_attention [L, B, heads, N, hw] when asked for, else None; dn_meta: the
    layout of the denoising queries (DN-DETR, training only), which come first among the N queries, or None.
    """

    hidden: torch.Tensor
    boxes: torch.Tensor | None
    memory: torch.Tensor
    encoder_attention: torch.Tensor | None = None
    decoder_attention: torch.Tensor | None = None
    dn_meta: DenoisingMeta | None = None


class SingleScaleDetector(Detector):
    """Backbone, input projection, class and box heads around a transformer; the query source is the subclass's.

    Args:
        backbone: the ResNet and its position encoding. transformer: its ``d_model`` sets the heads' width.
        num_classes: the model's classes. num_queries: object queries (paper: 100).
        aux_loss: also return every earlier decoder layer's predictions (paper §3.2, auxiliary losses).
        class_head: "softmax" (paper: num_classes + 1 logits, the last = no object) or "sigmoid"
            (num_classes logits scored by independent sigmoids; focal loss).
        dense_head: a training-only head on the encoder output (:mod:`detr.models.dense_head`), or None.

    Attributes: those of the :class:`Detector` contract.
    """

    def __init__(self, backbone: Joiner, transformer: nn.Module, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True, class_head: ClassHead = "softmax",
                 dense_head: DenseAuxiliaryHead | None = None) -> None:
        super().__init__()
        hidden_dim = transformer.d_model
        self.num_classes, self.num_queries = num_classes, num_queries
        self.aux_loss, self.class_head = aux_loss, class_head
        self.transformer = transformer
        self.class_embed = class_embedding(hidden_dim, num_classes, class_head)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        # the authors' order (their models/detr.py): heads, queries, input_proj
        self.init_queries(hidden_dim)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.dense_head = dense_head

    def describe(self) -> str:
        """"resnet50-DC5, 6 encoder layers, 256 hidden, 91 classes", read off the model and its config's shared
        fields."""
        config = self.config
        if config is None:
            return ""
        body = self.backbone[0]
        dilated = "-DC5" if "layer4" in body.body and body.stride == 16 else ""
        return (f"{config.backbone}{dilated}, {len(self.transformer.encoder.layers)} encoder layers, "
                f"{config.hidden_dim} hidden, {config.num_classes} classes")

    def init_queries(self, hidden_dim: int) -> None:
        """Make the query source's parameters (called by ``__init__``)."""
        raise NotImplementedError

    def decode_queries(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, targets: Targets | None,
                       return_attention: bool) -> DecodedQueries:
        """Run the transformer on the query source's queries: src [B, C, h, w] (after ``input_proj``), mask
        bool [B, h, w] (True = padding), pos [B, C, h, w]; ``targets`` (training only) for denoising queries."""
        raise NotImplementedError

    @property
    def stride(self) -> int:
        """Input pixels per feature cell, the backbone's output stride: 32; 16 for DC5 or a layer3
        backbone; 8 for layer2."""
        return self.backbone[0].stride

    @property
    def max_image_size(self) -> int | None:
        """The learned position encoding has a table of 50 rows and columns: no feature map may exceed it."""
        encoding = self.backbone[1]
        if isinstance(encoding, PositionEmbeddingLearned):
            return encoding.row_embed.num_embeddings * self.stride
        return None

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: Targets | None = None) -> DetectorOutput:
        """Raw predictions for a padded batch.

        Args:
            images: float [B, 3, H, W], ImageNet-normalised, zero-padded at the bottom and right.
            padding_mask: bool [B, H, W], True on padding.
            return_attention: also return attention maps (slower: explicit attention weights).
            targets: the batch's targets, read in training by a query source that learns from them
                (DN-DETR's denoising queries); every detector takes them, so that one training step fits all.

        Returns a :class:`DetectorOutput`: logits [B, Q, num_classes + 1] (softmax head: last = no object) or
        [B, Q, num_classes] (sigmoid head), boxes [B, Q, 4] normalised cxcywh of each unpadded image, aux (if
        aux_loss) the earlier decoder layers; attention with return_attention; dense with a dense head in
        training; denoising with denoising queries in training (:class:`detr.models.anchor.model.AnchorDETR`).
        """
        src, mask, pos, _ = self.embed(images, padding_mask)
        return self.decode(src, mask, pos, targets, return_attention).output

    def embed(self, images: torch.Tensor, padding_mask: torch.Tensor, keep_stages: Collection[str] = ()
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Checked inputs through the backbone and ``input_proj``: src [B, C, h, w], mask bool [B, h, w]
        (True = padding), pos [B, C, h, w], and the outputs of the backbone stages named in ``keep_stages``
        (the panoptic mask head's skip connections)."""
        check_inputs(images, padding_mask)
        features, mask, stages = self.backbone[0].forward_with_stages(images, padding_mask.bool(), keep_stages)
        pos = self.backbone[1](mask)
        return self.input_proj(features), mask, pos, stages

    def decode(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, targets: Targets | None = None,
               return_attention: bool = False) -> Decoded:
        """Transformer and heads on a projected feature map (:meth:`embed`'s src, mask, pos): the
        :class:`DetectorOutput` with what the panoptic mask head reads beside it (:class:`Decoded`)."""
        decoded = self.decode_queries(src, mask, pos, targets, return_attention)
        hidden = decoded.hidden
        logits = self.class_embed(hidden)  # [L, B, D + M, K]: D denoising queries first, then M matching queries
        # the class head runs before the box head: the order autograd sums their gradients in (same numbers)
        boxes = decoded.boxes if decoded.boxes is not None else self.bbox_embed(hidden).sigmoid()  # [L, B, D + M, 4]
        num_dn = decoded.dn_meta.num_queries if decoded.dn_meta is not None else 0
        output = stack_layers(logits[:, :, num_dn:], boxes[:, :, num_dn:], self.aux_loss, self.class_head)
        if decoded.dn_meta is not None:
            denoising = stack_layers(logits[:, :, :num_dn], boxes[:, :, :num_dn], self.aux_loss)
            output.denoising = DenoisingOutput(denoising.logits, denoising.boxes, denoising.aux, decoded.dn_meta)
        if self.dense_head is not None and self.training:
            output.dense = self.dense_head(decoded.memory, mask)
        if return_attention:
            output.attention = attention_output(decoded.encoder_attention,
                                                decoded.decoder_attention[:, :, :, num_dn:], mask)
        return Decoded(output, hidden[-1, :, num_dn:num_dn + self.num_queries], decoded.memory)


@dataclass
class Decoded:
    """:meth:`SingleScaleDetector.decode`'s result: the output, and hidden [B, Q, C] (the last decoder layer's
    output for the Q matching queries that inference decodes, what the heads read) and memory [B, h·w, C] (the encoder
    output): what the panoptic mask head needs."""

    output: DetectorOutput
    hidden: torch.Tensor
    memory: torch.Tensor
