"""DETR: backbone → transformer → class and box heads (paper §3.2; the authors' models/detr.py).

``forward`` returns raw predictions only; matching, the loss and post-processing are separate modules.
The anchor-query family (DAB-DETR anchors, DN-DETR denoising, Group DETR query groups) is its own model,
:class:`detr.models.anchor.model.AnchorDETR`, with the same output contract; :func:`build_detr` builds
either from a :class:`detr.models.config.DetrConfig`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from detr.models.config import PRIOR_BIAS, ClassHead
from detr.models.backbone import Joiner
from detr.models.config import DetrConfig, ModelMeta, QueryType
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.mlp import MLP
from detr.models.transformer import Transformer

__all__ = ["DETR", "MLP", "ClassHead", "DetrConfig", "QueryType", "attention_maps", "build_detr", "check_inputs",
           "class_embedding", "predictions"]


def check_inputs(images: torch.Tensor, padding_mask: torch.Tensor) -> None:
    """Raise ValueError unless ``images`` is [B, 3, H, W] and ``padding_mask`` [B, H, W]."""
    if images.dim() != 4 or padding_mask.shape != (images.shape[0], *images.shape[-2:]):
        raise ValueError(
            f"expected images [B, 3, H, W] and padding_mask [B, H, W], got {tuple(images.shape)} and "
            f"{tuple(padding_mask.shape)}"
        )


def class_embedding(hidden_dim: int, num_classes: int, class_head: ClassHead) -> nn.Linear:
    """The class head. softmax: num_classes + 1 logits, the last = "no object"; sigmoid: one logit per
    real class, no "no object", each starting at p = 0.01 (the focal-loss prior, Lin et al. §4.1)."""
    layer = nn.Linear(hidden_dim, num_classes + 1 if class_head == "softmax" else num_classes)
    if class_head == "sigmoid":
        nn.init.constant_(layer.bias, PRIOR_BIAS)
    return layer


def predictions(logits: torch.Tensor, boxes: torch.Tensor, aux_loss: bool, **extra: Any) -> dict[str, Any]:
    """Every decoder layer's logits [L, B, Q, K] and boxes [L, B, Q, 4] → {pred_logits, pred_boxes} of the
    last layer, ``extra`` keys, and (if aux_loss) aux_outputs: the same for layers 1 … L-1."""
    result: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1], **extra}
    if aux_loss:
        result["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b, **extra} for a, b in zip(logits[:-1], boxes[:-1])]
    return result


def attention_maps(encoder_attention: torch.Tensor, decoder_attention: torch.Tensor, mask: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """The ``return_attention`` outputs: encoder_attention [B, heads, hw, hw] (last encoder layer),
    decoder_attention [L, B, heads, Q, hw] (cross-attention), mask bool [B, h, w] (True = padding) →
    decoder_attention_heads [L, B, heads, Q, h, w], decoder_attention [L, B, Q, h, w] (mean over heads),
    encoder_attention [B, hw, h, w] (mean over heads; row i is where feature position i looks),
    feature_mask = mask."""
    height, width = mask.shape[-2:]
    heads = decoder_attention.unflatten(-1, (height, width))
    return {"decoder_attention_heads": heads, "decoder_attention": heads.mean(dim=2),
            "encoder_attention": encoder_attention.mean(dim=1).unflatten(-1, (height, width)), "feature_mask": mask}


class DETR(nn.Module):
    """The paper's detector: learned object queries decoded by the transformer. Build it with :func:`build_detr`.

    Args:
        backbone: the ResNet and its position encoding. transformer: encoder and decoder.
        num_classes: the model's classes. num_queries: object queries (paper: 100).
        aux_loss: also return every earlier decoder layer's predictions (paper §3.2, auxiliary losses).
        class_head: "softmax" (paper: num_classes + 1 logits, the last = no object) or "sigmoid"
            (num_classes logits scored by independent sigmoids; focal loss).
        dense_head: a training-only head on the encoder output (:mod:`detr.models.dense_head`), or None.

    Attributes besides those: ``query_type`` ("learned"), ``config`` (the :class:`DetrConfig` that built it,
    None when built by hand; checkpoints store it), ``meta`` (:class:`ModelMeta`: categories, eval size; set
    by loaders, empty here).
    """

    query_type: QueryType = "learned"

    def __init__(self, backbone: Joiner, transformer: Transformer, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True, class_head: ClassHead = "softmax",
                 dense_head: DenseAuxiliaryHead | None = None) -> None:
        super().__init__()
        hidden_dim = transformer.d_model
        self.num_classes, self.num_queries = num_classes, num_queries
        self.aux_loss, self.class_head = aux_loss, class_head
        self.transformer = transformer
        self.class_embed = class_embedding(hidden_dim, num_classes, class_head)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.dense_head = dense_head
        self.config: DetrConfig | None = None
        self.meta = ModelMeta()  # categories, eval size: set by loaders

    @property
    def stride(self) -> int:
        """Input pixels per feature cell, the backbone's output stride: 32; 16 for DC5 or a layer3
        backbone; 8 for layer2. Feature cell ``(y, x)`` covers input pixels ``[y * stride, (y + 1) * stride)``."""
        return self.backbone[0].stride

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> DETR:
        """Make this model faster for inference, in place; returns it in eval mode.

        fold_batch_norm: fold the frozen BatchNorms into the backbone's convolutions (outputs equal to
        float rounding; the state dict no longer has the authors' layout, so save checkpoints before).
        channels_last: run the backbone in NHWC, which oneDNN (CPU) and cuDNN (tensor cores) prefer.
        Measured with benchmarks/model_speed.py.
        """
        self.eval()
        if fold_batch_norm:
            self.backbone[0].fold_frozen_batch_norm()
        if channels_last:
            self.backbone[0].use_channels_last()
        return self

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor,
                return_attention: bool = False, targets: list[dict[str, torch.Tensor]] | None = None
                ) -> dict[str, Any]:
        """Raw predictions for a padded batch.

        Args:
            images: float [B, 3, H, W], ImageNet-normalised, zero-padded at the bottom and right.
            padding_mask: bool [B, H, W], True on padding.
            return_attention: also return attention maps (slower: explicit attention weights).
            targets: ignored (the signature of :meth:`AnchorDETR.forward`, whose denoising queries need them).

        Returns a dict:
            pred_logits [B, Q, num_classes + 1] (softmax head: last = no object) or [B, Q, num_classes]
            (sigmoid head: independent per-class scores); pred_boxes [B, Q, 4] normalised
            cxcywh of each unpadded image; aux_outputs (if aux_loss): a list over decoder layers 1 … L-1
            of {pred_logits, pred_boxes}. With return_attention: decoder_attention [L, B, Q, h, w]
            (cross-attention, mean over heads), decoder_attention_heads [L, B, heads, Q, h, w],
            encoder_attention [B, h·w, h, w] (last encoder layer, mean over heads; row i is where
            feature position i looks), feature_mask bool [B, h, w] (True = padding). With a dense head in
            training: dense_outputs (:class:`detr.models.dense_head.DenseAuxiliaryHead`).
        """
        check_inputs(images, padding_mask)
        features, mask, pos = self.backbone(images, padding_mask.bool())
        outputs = self.decode(self.input_proj(features), mask, pos, targets, return_attention)
        del outputs["hidden"], outputs["memory"]
        return outputs

    def decode(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
               targets: list[dict[str, torch.Tensor]] | None = None, return_attention: bool = False
               ) -> dict[str, Any]:
        """Transformer and heads on a projected feature map: src [B, C, h, w] (after ``input_proj``), mask
        bool [B, h, w] (True = padding), pos [B, C, h, w]; ``targets`` is ignored.

        Returns :meth:`forward`'s dict plus hidden [B, Q, C] (the last decoder layer's output, what the
        heads read) and memory [B, h·w, C] (the encoder output): what the panoptic mask head needs.
        """
        out = self.transformer(src, mask, self.query_embed.weight, pos, return_attention)
        hs = out["hs"]  # [L, B, Q, C]
        outputs = predictions(self.class_embed(hs), self.bbox_embed(hs).sigmoid(), self.aux_loss)
        if self.dense_head is not None and self.training:
            outputs["dense_outputs"] = self.dense_head(out["memory"], mask)
        if return_attention:
            outputs.update(attention_maps(out["encoder_attention"], torch.stack(out["decoder_attention"]), mask))
        return {**outputs, "hidden": hs[-1], "memory": out["memory"]}
