"""DETR: backbone → transformer → class and box heads (paper §3.2).

``forward`` returns raw predictions only; matching, the loss and post-processing are separate modules.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from detr.focal import PRIOR_BIAS, ClassHead
from detr.models.anchor_decoder import AnchorDecoder
from detr.models.backbone import Backbone, BackboneName, BackboneNorm, Joiner, LastStage
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.denoising import DenoisingMeta, DenoisingQueries
from detr.models.mlp import MLP
from detr.models.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine
from detr.models.transformer import Transformer

QueryType = Literal["learned", "anchor"]


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


class DETR(nn.Module):
    """The detector. Build it with :func:`build_detr`.

    Attributes: ``num_classes``, ``num_queries``, ``aux_loss``, ``query_type``, ``class_head``, ``config``
    (the :func:`build_detr` keyword arguments that built it; checkpoints store it), ``category_map`` (set
    by loaders; None here).

    Variants for training from scratch on a short budget (docs/convergence.md; the defaults are the paper's):
    ``query_type="anchor"`` replaces the learned query embedding by learned anchor boxes (``refpoint_embed``
    [Q, 4], logits of cxcywh) and the transformer's decoder by
    :class:`detr.models.anchor_decoder.AnchorDecoder` (DAB-DETR); ``class_head="sigmoid"`` has ``num_classes``
    logits scored by independent sigmoids (focal loss) instead of ``num_classes + 1`` with a softmax;
    ``denoising`` (anchor queries only) adds DN-DETR's denoising queries in training; ``query_groups`` > 1
    decodes that many groups of anchor queries in training (Group DETR; output ``query_groups`` tells the
    matcher); ``dense_head`` adds ``dense_outputs`` in training (the one-to-many head of
    :mod:`detr.models.dense_head`).
    """

    def __init__(self, backbone: Joiner, transformer: Transformer, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True, query_type: QueryType = "learned", class_head: ClassHead = "softmax",
                 denoising: DenoisingQueries | None = None, query_groups: int = 1,
                 dense_head: DenseAuxiliaryHead | None = None) -> None:
        super().__init__()
        hidden_dim = transformer.d_model
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.query_type, self.class_head, self.query_groups = query_type, class_head, query_groups
        self.transformer = transformer
        # softmax: the last logit is "no object"; sigmoid: one logit per real class, no "no object".
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1 if class_head == "softmax" else num_classes)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        if query_type == "learned":
            self.query_embed = nn.Embedding(num_queries, hidden_dim)
        else:
            # anchors (DAB-DETR's name and init); Group DETR: one set per group, group 1 first
            self.refpoint_embed = nn.Embedding(num_queries * query_groups, 4)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.denoising = denoising
        self.dense_head = dense_head
        if class_head == "sigmoid":  # focal-loss prior: every class starts at p = 0.01 (Lin et al. §4.1)
            nn.init.constant_(self.class_embed.bias, PRIOR_BIAS)
        if query_type == "anchor":  # the first boxes are the anchors themselves (DAB-DETR's init)
            nn.init.zeros_(self.bbox_embed.layers[-1].weight)
            nn.init.zeros_(self.bbox_embed.layers[-1].bias)
        self.config: dict[str, Any] = {}
        self.category_map = None

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
            targets: the batch's targets (labels int64 [T], boxes float [T, 4] normalised cxcywh). Used
                only by a model built with ``denoising=True`` in training mode, which requires them (the
                denoising queries are noised ground truth); ignored otherwise.

        Returns a dict:
            pred_logits [B, Q, num_classes + 1] (softmax head: last = no object) or [B, Q, num_classes]
            (sigmoid head: independent per-class scores); pred_boxes [B, Q, 4] normalised
            cxcywh of each unpadded image; aux_outputs (if aux_loss): a list over decoder layers 1 … L-1
            of {pred_logits, pred_boxes}. With return_attention: decoder_attention [L, B, Q, h, w]
            (cross-attention, mean over heads), decoder_attention_heads [L, B, heads, Q, h, w],
            encoder_attention [B, h·w, h, w] (last encoder layer, mean over heads; row i is where
            feature position i looks), feature_mask bool [B, h, w] (True = padding).
            With denoising in training: dn_outputs, the denoising queries' {pred_logits [B, D, ·],
            pred_boxes [B, D, 4], aux_outputs} (D = dn_meta.num_queries), and dn_meta
            (:class:`detr.models.denoising.DenoisingMeta`: which query reconstructs which target).
        """
        if images.dim() != 4 or padding_mask.shape != (images.shape[0], *images.shape[-2:]):
            raise ValueError(
                f"expected images [B, 3, H, W] and padding_mask [B, H, W], got {tuple(images.shape)} and "
                f"{tuple(padding_mask.shape)}"
            )
        if self.denoising is not None and self.training and targets is None:
            raise ValueError("a model built with denoising=True needs the targets in training mode: call "
                             "model(images, padding_mask, targets=targets), or model.eval() for inference")
        features, mask, pos = self.backbone(images, padding_mask.bool())
        dn_meta: DenoisingMeta | None = None
        if self.query_type == "learned":
            out = self.transformer(self.input_proj(features), mask, self.query_embed.weight, pos, return_attention)
            hs = out["hs"]  # [L, B, Q, C]
            logits = self.class_embed(hs)
            boxes = self.bbox_embed(hs).sigmoid()
        else:
            out = self._decode_anchors(self.input_proj(features), mask, pos, targets, return_attention)
            hs, boxes, dn_meta = out["hs"], out["boxes"], out["dn_meta"]
            logits = self.class_embed(hs)
        if dn_meta is not None:  # the denoising queries come first: split them off
            num_dn = dn_meta.num_queries
            dn_logits, dn_boxes = logits[:, :, :num_dn], boxes[:, :, :num_dn]
            logits, boxes = logits[:, :, num_dn:], boxes[:, :, num_dn:]
        groups = {"query_groups": out["query_groups"]} if out.get("query_groups", 1) > 1 else {}
        result: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1], **groups}
        if self.aux_loss:
            result["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b, **groups}
                                     for a, b in zip(logits[:-1], boxes[:-1])]
        if dn_meta is not None:
            result["dn_outputs"] = {"pred_logits": dn_logits[-1], "pred_boxes": dn_boxes[-1]}
            if self.aux_loss:
                result["dn_outputs"]["aux_outputs"] = [
                    {"pred_logits": a, "pred_boxes": b} for a, b in zip(dn_logits[:-1], dn_boxes[:-1])]
            result["dn_meta"] = dn_meta
        if self.dense_head is not None and self.training:
            result["dense_outputs"] = self.dense_head(out["memory"], mask)
        if return_attention:
            batch, height, width = mask.shape
            cross = torch.stack(out["decoder_attention"])  # [L, B, heads, Q, HW]
            if dn_meta is not None:
                cross = cross[:, :, :, dn_meta.num_queries:]
            result["decoder_attention_heads"] = cross.unflatten(-1, (height, width))
            result["decoder_attention"] = result["decoder_attention_heads"].mean(dim=2)
            result["encoder_attention"] = out["encoder_attention"].mean(dim=1).unflatten(-1, (height, width))
            result["feature_mask"] = mask
        return result

    def _decode_anchors(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                        targets: list[dict[str, torch.Tensor]] | None, return_attention: bool) -> dict[str, Any]:
        """Encoder, then the anchor decoder (with the denoising queries first in training).
        → hs [L, B, D + Q, C], boxes [L, B, D + Q, 4], dn_meta, encoder/decoder attention."""
        memory, pos, memory_mask, encoder_attention = self.transformer.encode(src, mask, pos, return_attention)
        batch = src.shape[0]
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
        hs, boxes, decoder_attention = self.transformer.decoder(
            tgt, anchors, memory, memory_mask, pos, self.bbox_embed, self_attn_mask, return_attention)
        return {"hs": hs, "boxes": boxes, "dn_meta": dn_meta, "encoder_attention": encoder_attention,
                "decoder_attention": decoder_attention, "query_groups": groups, "memory": memory}


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
    query_type: QueryType = "learned",
    class_head: ClassHead = "softmax",
    denoising: bool = False,
    denoising_groups: int = 5,
    denoising_label_noise: float = 0.2,
    denoising_box_noise: float = 0.4,
    anchor_local_attention: float = 0.0,
    query_groups: int = 1,
    dense_aux_head: bool = False,
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
        backbone_last_stage: "layer4" (stride 32), "layer3" (stride 16) or "layer2" (stride 8), for small images.
        query_type: "learned" (paper: a learned embedding per query) or "anchor" (DAB-DETR: a learned
            anchor box per query, conditional spatial cross-attention, box refinement in every layer).
        class_head: "softmax" (paper: num_classes + 1 logits, last = no object; train with
            ``SetCriterion(class_head="softmax")``) or "sigmoid" (num_classes logits, independent
            sigmoids; train with ``SetCriterion(class_head="sigmoid")``, score with ``PostProcess(class_head="sigmoid")``).
        denoising: DN-DETR denoising queries in training (needs query_type="anchor"; the forward then
            needs ``targets``). denoising_groups, denoising_label_noise, denoising_box_noise: DN-DETR's
            5 groups, label flip probability 0.2, box noise scale 0.4.
        anchor_local_attention: > 0 starts every anchor-decoder cross-attention head as a kernel centred
            on its query's anchor, with this scale (an initialisation only; see
            :meth:`AnchorDecoder.init_local_spatial_attention`). 0 keeps DAB-DETR's Xavier init.
        query_groups: one-to-many assignment in training (Group DETR: Chen et al., ICCV 2023; anchor
            queries only). ``query_groups`` groups of ``num_queries`` anchors are decoded, each group
            blind to the others in self-attention and matched one-to-one to the targets on its own, so
            every target supervises ``query_groups`` queries per step. Inference decodes group 1 only:
            same outputs, same speed as a model without groups. 1 (default) = the paper's assignment.
        dense_aux_head: a training-only FCOS-like head on the encoder output with one-to-many assignment
            (every cell inside a box is positive for it; Co-DETR's collaborative auxiliary heads,
            Zong et al., ICCV 2023): :class:`detr.models.dense_head.DenseAuxiliaryHead`. Train with
            ``SetCriterion(dense_aux=True)``. Inference does not run it.
    """
    config = {key: value for key, value in locals().items()}
    if position_encoding not in ("sine", "learned"):
        raise ValueError(f"position_encoding must be 'sine' or 'learned', got {position_encoding!r}")
    if hidden_dim % 2:
        raise ValueError(f"hidden_dim must be even (half of it encodes each axis), got {hidden_dim}")
    if query_type not in ("learned", "anchor"):
        raise ValueError(f"query_type must be 'learned' or 'anchor', got {query_type!r}")
    if class_head not in ("softmax", "sigmoid"):
        raise ValueError(f"class_head must be 'softmax' or 'sigmoid', got {class_head!r}")
    if denoising and query_type != "anchor":
        raise ValueError("denoising=True feeds noised boxes as anchors: it needs query_type='anchor'")
    if anchor_local_attention and query_type != "anchor":
        raise ValueError("anchor_local_attention initialises the anchor decoder: it needs query_type='anchor'")
    if isinstance(num_queries, bool) or not isinstance(num_queries, int) or num_queries < 1:
        raise ValueError(f"num_queries must be an integer >= 1 (one query per detectable object; the paper uses "
                         f"100), got {num_queries!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}; with the detr CLI it comes "
                         "from the data's annotation json (or, for predict, from the checkpoint)")
    if query_groups < 1:
        raise ValueError(f"query_groups must be at least 1, got {query_groups}")
    if query_groups > 1 and query_type != "anchor":
        raise ValueError("query_groups > 1 (Group DETR) is built on the anchor decoder: it needs query_type='anchor'")
    if pre_norm and query_type == "anchor":
        raise ValueError("query_type='anchor' has DAB-DETR's post-norm decoder: set pre_norm=False")
    if dilation and backbone in ("resnet18", "resnet34"):
        raise ValueError(f"dilation (DC5) needs bottleneck blocks: use resnet50 or resnet101, not {backbone}")
    body = Backbone(backbone, dilation=dilation, pretrained=pretrained_backbone, norm=backbone_norm,
                    trainable_layers=backbone_trainable_layers, last_stage=backbone_last_stage)
    encoding = (PositionEmbeddingSine(hidden_dim // 2) if position_encoding == "sine"
                else PositionEmbeddingLearned(hidden_dim // 2))
    decoder = (AnchorDecoder(hidden_dim, num_heads, num_decoder_layers, dim_feedforward, dropout)
               if query_type == "anchor" else None)
    transformer = Transformer(hidden_dim, num_heads, num_encoder_layers, num_decoder_layers, dim_feedforward,
                              dropout, pre_norm, decoder=decoder)
    denoiser = (DenoisingQueries(num_classes, hidden_dim, num_groups=denoising_groups,
                                 label_noise=denoising_label_noise, box_noise=denoising_box_noise)
                if denoising else None)
    model = DETR(Joiner(body, encoding), transformer, num_classes=num_classes, num_queries=num_queries,
                 aux_loss=aux_loss, query_type=query_type, class_head=class_head, denoising=denoiser,
                 query_groups=query_groups,
                 dense_head=DenseAuxiliaryHead(hidden_dim, num_classes) if dense_aux_head else None)
    if anchor_local_attention > 0:
        model.transformer.decoder.init_local_spatial_attention(anchor_local_attention)
    model.config = config
    return model
