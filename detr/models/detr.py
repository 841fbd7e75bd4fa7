"""DETR: backbone → transformer → class and box heads (paper §3.2).

``forward`` returns raw predictions only; matching, the loss and post-processing are separate modules.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.backbone import Backbone, BackboneName, BackboneNorm, Joiner, LastStage
from detr.models.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine
from detr.models.transformer import Transformer


class MLP(nn.Module):
    """``num_layers`` linear layers with ReLU between them (the box head: hidden → hidden → hidden → 4)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:] + [output_dim]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x) if index == len(self.layers) - 1 else F.relu(layer(x))
        return x


class DETR(nn.Module):
    """The detector. Build it with :func:`build_detr`.

    Attributes: ``num_classes``, ``num_queries``, ``aux_loss``, ``config`` (the :func:`build_detr`
    keyword arguments that built it; checkpoints store it), ``category_map`` (set by loaders; None here).
    """

    def __init__(self, backbone: Joiner, transformer: Transformer, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True) -> None:
        super().__init__()
        hidden_dim = transformer.d_model
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.transformer = transformer
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)  # last logit: "no object"
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.config: dict[str, Any] = {}
        self.category_map = None

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor,
                return_attention: bool = False) -> dict[str, Any]:
        """Raw predictions for a padded batch.

        Args:
            images: float [B, 3, H, W], ImageNet-normalised, zero-padded at the bottom and right.
            padding_mask: bool [B, H, W], True on padding.
            return_attention: also return attention maps (slower: explicit attention weights).

        Returns a dict:
            pred_logits [B, Q, num_classes + 1] (last = no object); pred_boxes [B, Q, 4] normalised
            cxcywh of each unpadded image; aux_outputs (if aux_loss): a list over decoder layers 1 … L-1
            of {pred_logits, pred_boxes}. With return_attention: decoder_attention [L, B, Q, h, w]
            (cross-attention, mean over heads), decoder_attention_heads [L, B, heads, Q, h, w],
            encoder_attention [B, h·w, h, w] (last encoder layer, mean over heads; row i is where
            feature position i looks), feature_mask bool [B, h, w] (True = padding).
        """
        if images.dim() != 4 or padding_mask.shape != (images.shape[0], *images.shape[-2:]):
            raise ValueError(
                f"expected images [B, 3, H, W] and padding_mask [B, H, W], got {tuple(images.shape)} and "
                f"{tuple(padding_mask.shape)}"
            )
        features, mask, pos = self.backbone(images, padding_mask.bool())
        out = self.transformer(self.input_proj(features), mask, self.query_embed.weight, pos, return_attention)
        hs = out["hs"]  # [L, B, Q, C]
        logits = self.class_embed(hs)
        boxes = self.bbox_embed(hs).sigmoid()
        result: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            result["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        if return_attention:
            batch, height, width = mask.shape
            cross = torch.stack(out["decoder_attention"])  # [L, B, heads, Q, HW]
            result["decoder_attention_heads"] = cross.unflatten(-1, (height, width))
            result["decoder_attention"] = result["decoder_attention_heads"].mean(dim=2)
            result["encoder_attention"] = out["encoder_attention"].mean(dim=1).unflatten(-1, (height, width))
            result["feature_mask"] = mask
        return result


def build_detr(
    *,
    backbone: BackboneName = "resnet50",
    dilation: bool = False,
    position_encoding: Literal["sine", "learned"] = "sine",
    hidden_dim: int = 256,
    num_heads: int = 8,
    num_encoder_layers: int = 6,
    num_decoder_layers: int = 6,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    pre_norm: bool = False,
    num_queries: int = 100,
    num_classes: int = 91,
    aux_loss: bool = True,
    pretrained_backbone: bool | str = False,
    backbone_norm: BackboneNorm = "frozen_batch_norm",
    backbone_trainable_layers: int = 3,
    backbone_last_stage: LastStage = "layer4",
) -> DETR:
    """Build DETR. Defaults are the paper's COCO model (R50, 6+6 layers, 100 queries, 91 classes).

    Args:
        backbone: ResNet depth. dilation: DC5 (layer4 dilated, stride 16; ResNet-50/101 only).
        position_encoding: "sine" (paper) or "learned" (50 × 50 table).
        hidden_dim, num_heads, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout, pre_norm:
            transformer shape (paper: 256, 8, 6, 6, 2048, 0.1, post-norm).
        num_queries: object queries (100). num_classes: model classes; logits are num_classes + 1.
        aux_loss: return every decoder layer's predictions for the auxiliary losses.
        pretrained_backbone: False, True (torchvision ImageNet weights) or a path to a ResNet state dict.
        backbone_norm: "frozen_batch_norm" (paper), "batch_norm" or "group_norm" (training from scratch).
        backbone_trainable_layers: stages that train, from the top (3 = layer2–4, paper; 5 = all).
        backbone_last_stage: "layer4" (stride 32) or "layer3" (stride 16, for small images).
    """
    config = {key: value for key, value in locals().items()}
    if position_encoding not in ("sine", "learned"):
        raise ValueError(f"position_encoding must be 'sine' or 'learned', got {position_encoding!r}")
    if hidden_dim % 2:
        raise ValueError(f"hidden_dim must be even (half of it encodes each axis), got {hidden_dim}")
    if dilation and backbone in ("resnet18", "resnet34"):
        raise ValueError(f"dilation (DC5) needs bottleneck blocks: use resnet50 or resnet101, not {backbone}")
    body = Backbone(backbone, dilation=dilation, pretrained=pretrained_backbone, norm=backbone_norm,
                    trainable_layers=backbone_trainable_layers, last_stage=backbone_last_stage)
    encoding = (PositionEmbeddingSine(hidden_dim // 2) if position_encoding == "sine"
                else PositionEmbeddingLearned(hidden_dim // 2))
    transformer = Transformer(hidden_dim, num_heads, num_encoder_layers, num_decoder_layers, dim_feedforward,
                              dropout, pre_norm)
    model = DETR(Joiner(body, encoding), transformer, num_classes=num_classes, num_queries=num_queries,
                 aux_loss=aux_loss)
    model.config = config
    return model
