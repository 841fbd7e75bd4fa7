"""The anchor-query detector: DETR with learned anchor boxes for queries, for training from scratch on a
short budget (docs/convergence.md).

- DAB-DETR (Liu et al., ICLR 2022): every query is a learned anchor box (``refpoint_embed`` [Q, 4], logits
  of cxcywh), decoded by :class:`detr.models.anchor.decoder.AnchorDecoder`, which refines it layer by layer.
- DN-DETR (Li et al., CVPR 2022), optional: in training, noised ground-truth boxes enter the decoder as
  extra queries that learn to reconstruct their targets (:mod:`detr.models.anchor.denoising`).
- Group DETR (Chen et al., ICCV 2023), optional: in training, ``query_groups`` groups of anchors are
  decoded, each blind to the others and matched one-to-one on its own; inference decodes group 1 only.
- Co-DETR's dense auxiliary head (Zong et al., ICCV 2023), optional, as for :class:`detr.models.detr.DETR`.

The output dict is :class:`DETR`'s, plus the training-only keys of these variants.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from detr.models.config import ClassHead
from detr.models.anchor.decoder import AnchorTransformer
from detr.models.backbone import Joiner
from detr.models.config import DetrConfig, ModelMeta, QueryType
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.anchor.denoising import DenoisingMeta, DenoisingQueries
from detr.models.detr import DETR, attention_maps, check_inputs, class_embedding, predictions
from detr.models.mlp import MLP


def query_group_attention_mask(num_groups: int, group_size: int, num_before: int = 0,
                               mask: torch.Tensor | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Self-attention mask bool [N, N] (True = may attend) for Group DETR's query groups.

    The last ``num_groups · group_size`` of the N = num_before + num_groups · group_size queries are the
    matching queries, group by group: each sees only its own group among them. ``mask`` (the denoising
    mask for all N queries, or None = everything visible) is narrowed accordingly; the first
    ``num_before`` queries (denoising) keep what ``mask`` gave them.
    """
    total = num_before + num_groups * group_size
    allowed = (torch.ones(total, total, dtype=torch.bool, device=device) if mask is None else mask.clone())
    group = torch.arange(num_groups * group_size, device=device) // group_size
    allowed[num_before:, num_before:] &= group[:, None] == group[None, :]
    return allowed


class AnchorDETR(nn.Module):
    """DAB-DETR's anchor queries, with DN-DETR's denoising queries and Group DETR's query groups in training.
    Build it with :func:`detr.models.build.build_detr` (``query_type="anchor"``).

    Args:
        backbone, num_classes, num_queries, aux_loss, class_head, dense_head: as :class:`DETR`'s.
        transformer: DETR's encoder and the anchor decoder.
        denoising: the denoising queries (the forward then needs ``targets`` in training), or None.
        query_groups: anchor groups decoded in training (1 = the paper's one-to-one assignment).

    Attributes as :class:`DETR`'s (``query_type`` is "anchor"), plus ``query_groups``.
    """

    query_type: QueryType = "anchor"

    def __init__(self, backbone: Joiner, transformer: AnchorTransformer, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True, class_head: ClassHead = "softmax", denoising: DenoisingQueries | None = None,
                 query_groups: int = 1, dense_head: DenseAuxiliaryHead | None = None) -> None:
        super().__init__()
        hidden_dim = transformer.d_model
        self.num_classes, self.num_queries = num_classes, num_queries
        self.aux_loss, self.class_head = aux_loss, class_head
        self.query_groups = query_groups
        self.transformer = transformer
        self.class_embed = class_embedding(hidden_dim, num_classes, class_head)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        # the first boxes are the anchors themselves (DAB-DETR's init)
        nn.init.zeros_(self.bbox_embed.layers[-1].weight)
        nn.init.zeros_(self.bbox_embed.layers[-1].bias)
        # anchors (DAB-DETR's name and init); Group DETR: one set per group, group 1 first
        self.refpoint_embed = nn.Embedding(num_queries * query_groups, 4)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.denoising = denoising
        self.dense_head = dense_head
        self.config: DetrConfig | None = None
        self.meta = ModelMeta()  # categories, eval size: set by loaders

    stride = DETR.stride  # same backbone, same inference preparation
    optimize_for_inference = DETR.optimize_for_inference

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor,
                return_attention: bool = False, targets: list[dict[str, torch.Tensor]] | None = None
                ) -> dict[str, Any]:
        """Raw predictions for a padded batch: :meth:`DETR.forward`'s dict, plus in training:

        - with query groups G > 1: query_groups = G in the dict and in each aux_outputs entry; pred_logits
          and pred_boxes then hold G · Q queries, group by group (the matcher matches each group on its own);
        - with denoising (``targets`` required: labels int64 [T], boxes float [T, 4] normalised cxcywh per
          image): dn_outputs, the denoising queries' {pred_logits [B, D, ·], pred_boxes [B, D, 4],
          aux_outputs} (D = dn_meta.num_queries), and dn_meta (:class:`detr.models.anchor.denoising.DenoisingMeta`:
          which query reconstructs which target).

        Attention maps cover the matching queries only.
        """
        check_inputs(images, padding_mask)
        features, mask, pos = self.backbone(images, padding_mask.bool())
        outputs = self.decode(self.input_proj(features), mask, pos, targets, return_attention)
        del outputs["hidden"], outputs["memory"]
        return outputs

    def decode(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
               targets: list[dict[str, torch.Tensor]] | None = None, return_attention: bool = False
               ) -> dict[str, Any]:
        """Transformer and heads on a projected feature map, as :meth:`DETR.decode`: src [B, C, h, w], mask
        bool [B, h, w] (True = padding), pos [B, C, h, w] → :meth:`forward`'s dict plus hidden [B, Q, C] (the
        last decoder layer's output for group 1's matching queries) and memory [B, h·w, C] (encoder output)."""
        if self.denoising is not None and self.training and targets is None:
            raise ValueError("a model built with denoising=True needs the targets in training mode: call "
                             "model(images, padding_mask, targets=targets), or model.eval() for inference")
        memory, pos, memory_mask, encoder_attention = self.transformer.encode(src, mask, pos, return_attention)
        tgt, anchors, self_attn_mask, dn_meta, groups = self.initial_queries(memory, targets)
        hs, boxes, decoder_attention = self.transformer.decoder(
            tgt, anchors, memory, memory_mask, pos, self.bbox_embed, self_attn_mask, return_attention)
        logits = self.class_embed(hs)  # [L, B, D + G·Q, K]: the denoising queries first
        num_dn = dn_meta.num_queries if dn_meta is not None else 0
        outputs = predictions(logits[:, :, num_dn:], boxes[:, :, num_dn:], self.aux_loss,
                              **({"query_groups": groups} if groups > 1 else {}))
        if dn_meta is not None:
            outputs["dn_outputs"] = predictions(logits[:, :, :num_dn], boxes[:, :, :num_dn], self.aux_loss)
            outputs["dn_meta"] = dn_meta
        if self.dense_head is not None and self.training:
            outputs["dense_outputs"] = self.dense_head(memory, mask)
        if return_attention:
            outputs.update(attention_maps(encoder_attention, torch.stack(decoder_attention)[:, :, :, num_dn:], mask))
        return {**outputs, "hidden": hs[-1, :, num_dn:num_dn + self.num_queries], "memory": memory}

    def initial_queries(self, memory: torch.Tensor, targets: list[dict[str, torch.Tensor]] | None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DenoisingMeta | None, int]:
        """The decoder's queries for a batch with encoder output ``memory`` [B, HW, C]: content tgt
        [B, D + G·Q, C] (zeros, or DN-DETR's matching and denoising label embeddings), anchors [B, D + G·Q, 4]
        as logits of cxcywh, the self-attention mask bool [N, N] (True = may attend) or None, dn_meta (None
        outside training with denoising) and the number G of query groups decoded."""
        batch = memory.shape[0]
        groups = self.query_groups if self.training else 1  # Group DETR: extra groups in training only
        num_matching = self.num_queries * groups
        anchors = self.refpoint_embed.weight[:num_matching].unsqueeze(0).expand(batch, -1, -1)  # [B, G·Q, 4] logits
        self_attn_mask, dn_meta = None, None
        if self.denoising is None:
            tgt = memory.new_zeros(batch, num_matching, self.transformer.d_model)
        else:
            tgt = self.denoising.matching_content(batch, num_matching).to(memory.dtype)
            if self.training:
                tgt, anchors, self_attn_mask, dn_meta = self.denoising(tgt, anchors, targets)
        if groups > 1:
            self_attn_mask = query_group_attention_mask(groups, self.num_queries, tgt.shape[1] - num_matching,
                                                        self_attn_mask, tgt.device)
        return tgt, anchors, self_attn_mask, dn_meta, groups
