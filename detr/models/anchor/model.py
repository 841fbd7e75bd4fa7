"""The anchor-query detector: DETR with learned anchor boxes for queries, for training from scratch on a
short budget (docs/measurements/convergence.md).

- DAB-DETR (Liu et al., ICLR 2022): every query is a learned anchor box (``refpoint_embed`` [Q, 4], logits
  of cxcywh), decoded by :class:`detr.models.anchor.decoder.AnchorDecoder`, which refines it layer by layer.
- DN-DETR (Li et al., CVPR 2022), optional: in training, noised ground-truth boxes enter the decoder as
  extra queries that learn to reconstruct their targets (:mod:`detr.models.anchor.denoising`).
- Group DETR (Chen et al., ICCV 2023), optional: in training, ``query_groups`` groups of anchors are
  decoded, each blind to the others and matched one-to-one on its own; inference decodes group 1 only.
- Co-DETR's dense auxiliary head (Zong et al., ICCV 2023), optional, as for :class:`detr.models.detr.DETR`.

The backbone, heads and input checks are the shared :class:`detr.models.single_scale.SingleScaleDetector`'s;
this model is its anchor query source. The output is :class:`DETR`'s, plus the training-only fields of these
variants.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.models.anchor.decoder import AnchorTransformer
from detr.models.anchor.denoising import DenoisingQueries
from detr.models.backbone import Joiner
from detr.models.config import ClassHead, QueryType
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.detector import Targets
from detr.models.layers.denoising import DenoisingMeta
from detr.models.single_scale import DecodedQueries, SingleScaleDetector


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


class AnchorDETR(SingleScaleDetector):
    """DAB-DETR's anchor queries, with DN-DETR's denoising queries and Group DETR's query groups in training.
    Build it with :func:`detr.models.build.build_detr` (``query_type="anchor"``).

    Args:
        backbone, num_classes, num_queries, aux_loss, class_head, dense_head: as :class:`SingleScaleDetector`'s.
        transformer: DETR's encoder and the anchor decoder.
        denoising: the denoising queries (the forward then needs ``targets`` in training), or None.
        query_groups: anchor groups decoded in training (1 = the paper's one-to-one assignment).

    ``forward`` returns :meth:`SingleScaleDetector.forward`'s :class:`~detr.models.outputs.DetectorOutput`,
    with in training:

    - with query groups G > 1: logits and boxes (and every aux layer's) hold G · Q queries, group by group
      (a matcher built with ``group_size=Q`` matches each group on its own);
    - with denoising (``targets`` required: labels int64 [T], boxes float [T, 4] normalised cxcywh per
      image): ``denoising``, the denoising queries' predictions (logits [B, D, ·], boxes [B, D, 4], their
      aux layers; D = meta.num_queries) and their layout (:class:`detr.models.layers.denoising.DenoisingMeta`).

    Attention maps cover the matching queries only. Attributes as :class:`SingleScaleDetector`'s
    (``query_type`` is "anchor"), plus ``query_groups`` and ``denoising``.
    """

    query_type: QueryType = "anchor"

    def __init__(self, backbone: Joiner, transformer: AnchorTransformer, *, num_classes: int, num_queries: int,
                 aux_loss: bool = True, class_head: ClassHead = "softmax", denoising: DenoisingQueries | None = None,
                 query_groups: int = 1, dense_head: DenseAuxiliaryHead | None = None) -> None:
        self.query_groups = query_groups  # a plain int (allowed before Module.__init__): init_queries reads it
        super().__init__(backbone, transformer, num_classes=num_classes, num_queries=num_queries, aux_loss=aux_loss,
                         class_head=class_head)
        # denoising registered before the dense head: the state dict's and the optimizer's parameter order
        self.denoising = denoising
        self.dense_head = dense_head

    def init_queries(self, hidden_dim: int) -> None:
        # the first boxes are the anchors themselves (DAB-DETR's init)
        nn.init.zeros_(self.bbox_embed.layers[-1].weight)
        nn.init.zeros_(self.bbox_embed.layers[-1].bias)
        # anchors (DAB-DETR's name and init); Group DETR: one set per group, group 1 first
        self.refpoint_embed = nn.Embedding(self.num_queries * self.query_groups, 4)

    def decode_queries(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, targets: Targets | None,
                       return_attention: bool) -> DecodedQueries:
        """The encoder, then the anchor decoder on the denoising queries (training only) and G groups of
        anchors (G = query_groups in training, 1 in inference)."""
        if self.denoising is not None and self.training and targets is None:
            raise ValueError("a model built with denoising=True needs the targets in training mode: call "
                             "model(images, padding_mask, targets=targets), or model.eval() for inference")
        memory, pos, memory_mask, encoder_attention = self.transformer.encode(src, mask, pos, return_attention)
        tgt, anchors, self_attn_mask, dn_meta = self.initial_queries(memory, targets)
        hs, boxes, decoder_attention = self.transformer.decoder(
            tgt, anchors, memory, memory_mask, pos, self.bbox_embed, self_attn_mask, return_attention)
        return DecodedQueries(hs, boxes, memory, encoder_attention,
                              torch.stack(decoder_attention) if return_attention else None, dn_meta)

    def initial_queries(self, memory: torch.Tensor, targets: Targets | None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DenoisingMeta | None]:
        """The decoder's queries for a batch with encoder output ``memory`` [B, HW, C]: content tgt
        [B, D + G·Q, C] (zeros, or DN-DETR's matching and denoising label embeddings), anchors [B, D + G·Q, 4]
        as logits of cxcywh, the self-attention mask bool [N, N] (True = may attend) or None, and dn_meta
        (None outside training with denoising). G = query_groups in training, 1 in inference."""
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
        return tgt, anchors, self_attn_mask, dn_meta
