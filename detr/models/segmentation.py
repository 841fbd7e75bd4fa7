"""DETR for panoptic segmentation: the detector plus a mask head (paper §4.4 and Fig. 8).

The mask head predicts one binary-mask logit map per object query, at stride 4:

1. :class:`AttentionMap` — a multi-head attention map (8 heads, no dropout) between each query's last
   decoder output and the encoder memory: only the softmax weights, no values. They say where in the
   feature map each object lies.
2. :class:`MaskHead` — a small FPN-like convolutional head: the projected backbone features with every
   query's attention maps appended as channels, upsampled ×2 three times with the backbone's layer3,
   layer2 and layer1 features added back, GroupNorm throughout, one output channel.

:class:`DETRPanoptic` composes a :class:`detr.models.detr.DETR` (unchanged, under ``detr.``) with the
two heads (``bbox_attention.*``, ``mask_head.*``): the authors' state-dict layout, so their panoptic
release files load unchanged. The forward runs the detector's :meth:`SingleScaleDetector.embed` keeping the
backbone's intermediate stages, then its :meth:`SingleScaleDetector.decode`, which returns the encoder memory and the
last decoder output beside the predictions; the detector's own ``forward`` (and its fast path) is not touched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from detr.categories import COCO_PANOPTIC_NUM_CLASSES
from detr.models.anchor.decoder import anchor_sine_embedding, local_attention_selection
from detr.models.anchor.model import AnchorDETR
from detr.models.backbone import Backbone
from detr.models.build import build_detr
from detr.models.config import ModelConfig, ModelMeta
from detr.models.detr_family import DetrConfig
from detr.models.layers.conv_norm import fresh_activation
from detr.models.detector import Detector
from detr.models.outputs import DetectorOutput
from detr.models.single_scale import SingleScaleDetector

#: Backbone stages whose outputs the mask head adds back while upsampling, coarse to fine.
SKIP_STAGES = ("layer3", "layer2", "layer1")


class AttentionMap(nn.Module):
    """Multi-head attention weights of queries over a feature map (the authors' ``MHAttentionMap``).

    ``q_linear`` projects the queries and ``k_linear`` (applied as a 1×1 convolution) the feature map;
    per head the scaled dot product gives a logit per position. As in the authors' model, one softmax
    runs over every head and position of a query jointly (the maps of all heads together sum to 1),
    padded positions get zero weight, and there is no dropout.
    """

    def __init__(self, query_dim: int, hidden_dim: int, num_heads: int) -> None:
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.hidden_dim = num_heads, hidden_dim
        self.q_linear = nn.Linear(query_dim, hidden_dim)
        self.k_linear = nn.Linear(query_dim, hidden_dim)
        for linear in (self.q_linear, self.k_linear):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        self.scale = (hidden_dim / num_heads) ** -0.5
        # anchor detectors only (:class:`DETRPanoptic` sets it; the authors' layout has no such keys)
        self.position: QueryPosition | None = None

    def forward(self, queries: torch.Tensor, memory: torch.Tensor, padding_mask: torch.Tensor | None,
                spatial_logits: torch.Tensor | None = None) -> torch.Tensor:
        """queries [B, Q, C]; memory [B, C, h, w]; padding_mask bool [B, h, w] (True = padding) or None;
        spatial_logits [B, Q, heads, h, w] added to the content logits (anchor detectors:
        :class:`QueryPosition`) or None → weights [B, Q, heads, h, w], summing to 1 over (heads, h, w) for
        each query."""
        batch, num_queries, _ = queries.shape
        height, width = memory.shape[-2:]
        heads, head_dim = self.num_heads, self.hidden_dim // self.num_heads
        q = self.q_linear(queries).view(batch, num_queries, heads, head_dim) * self.scale
        k = F.conv2d(memory, self.k_linear.weight[:, :, None, None], self.k_linear.bias)  # [B, C, h, w]
        k = k.view(batch, heads, head_dim, height, width)
        logits = torch.einsum("bqnc,bnchw->bqnhw", q, k)
        if spatial_logits is not None:
            logits = logits + spatial_logits
        if padding_mask is not None:
            logits = logits.masked_fill(padding_mask[:, None, None], float("-inf"))
        return logits.flatten(2).softmax(-1).view_as(logits)


class QueryPosition(nn.Module):
    """Positions on both sides of the attention map, for anchor detectors (Conditional DETR's spatial query).

    A DAB-DETR query's box is its anchor plus a delta predicted from its content, so the last decoder output
    carries little absolute position, and the memory none: the content-only :class:`AttentionMap` cannot
    say where a query's object is (every query of an image then attends to the same cells). This adds,
    per head, a spatial logit ``(P_q sine(box centre)) · (P_k pos(key))`` to the content logit, as the
    spatial half of the anchor decoder's conditional cross-attention: the query side is the (y, x) half of
    :func:`detr.models.anchor.decoder.anchor_sine_embedding` of the query's predicted box, the key side the
    feature map's sine positional encoding. Both projections start as the same channel selection (× ``scale``)
    of the ``num_frequencies`` highest frequencies of y and x, as
    :meth:`detr.models.anchor.decoder.AnchorDecoder.init_local_spatial_attention` starts the decoder's, so
    each head's map starts as a kernel centred on the box centre. As in DAB-DETR, the query side's y channels
    are scaled by h_ref / h and its x channels by w_ref / w (``size_ref`` = (w_ref, h_ref), learned), so the
    kernel is sharper for small boxes. :class:`DETRPanoptic` puts it under ``bbox_attention.position``.
    """

    def __init__(self, hidden_dim: int, num_heads: int, scale: float = 4.0, num_frequencies: int | None = None
                 ) -> None:
        super().__init__()
        self.num_heads, self.hidden_dim = num_heads, hidden_dim
        self.q_proj = nn.Linear(hidden_dim, hidden_dim)  # sine (y, x) of the box centre → spatial query
        self.k_proj = nn.Linear(hidden_dim, hidden_dim)  # positional encoding → spatial key
        selection = local_attention_selection(hidden_dim, num_heads, scale, num_frequencies)
        with torch.no_grad():
            for projection in (self.q_proj, self.k_proj):
                projection.weight.copy_(selection)
                projection.bias.zero_()
        self.size_ref = nn.Parameter(torch.full((2,), 0.2))  # (w_ref, h_ref) of the modulation
        self.scale = (hidden_dim // num_heads) ** -0.5

    def forward(self, boxes: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """boxes [B, Q, 4] normalised cxcywh; pos [B, C, h, w] → spatial logits [B, Q, heads, h, w]."""
        batch, num_queries = boxes.shape[:2]
        height, width = pos.shape[-2:]
        heads, head_dim = self.num_heads, self.hidden_dim // self.num_heads
        half = self.hidden_dim // 2
        sine = anchor_sine_embedding(boxes, half)[..., : self.hidden_dim].to(pos.dtype)  # (y, x)
        # DAB-DETR's modulation: the y channels × h_ref / h, the x channels × w_ref / w (sharper for small boxes)
        size = boxes[..., 2:].to(pos.dtype).clamp(min=0.02)
        sine = torch.cat([sine[..., :half] * (self.size_ref[1] / size[..., 1]).unsqueeze(-1),
                          sine[..., half:] * (self.size_ref[0] / size[..., 0]).unsqueeze(-1)], dim=-1)
        q = self.q_proj(sine).view(batch, num_queries, heads, head_dim) * self.scale
        k = F.conv2d(pos, self.k_proj.weight[:, :, None, None], self.k_proj.bias)
        return torch.einsum("bqnc,bnchw->bqnhw", q, k.view(batch, heads, head_dim, height, width))


def attention_density(attention: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """Attention maps [B, Q, heads, h, w] (summing to 1 over heads and positions) × heads × each image's
    number of unpadded cells: 1 where a query attends uniformly, whatever the map's and the batch's size.

    The mask head gets the maps of anchor detectors this way (not the authors' layout, which keeps the
    authors' function). As weights summing to 1 they are ~1/(heads·h·w) (0.002 on the shapes demo's 8 × 8
    maps), against projected features of standard deviation ~1.4 in the same convolution: the only
    per-query input started ~100× weaker than the features every query shares, and the mask stage sat on
    blank masks for 300-500+ steps before its weights on them had grown (docs/measurements/panoptic.md)."""
    cells = (~padding_mask).flatten(1).sum(1).clamp(min=1)  # [B]
    return attention * (attention.shape[2] * cells).to(attention.dtype).view(-1, 1, 1, 1, 1)


class MaskHead(nn.Module):
    """The authors' ``MaskHeadSmallConv``: per query, features + attention maps → mask logits at stride 4.

    Channels: ``in_channels`` (hidden_dim + heads) → hidden/2 → hidden/4 → hidden/8 → hidden/16 → 1,
    each 3×3 convolution followed by GroupNorm(8) and ReLU (except the last). After the first two, the
    map is upsampled (nearest) three times to the size of the next backbone stage, whose features enter
    through a 1×1 ``adapter`` convolution and are added.

    Args:
        in_channels: hidden_dim + num_heads (the projected features and one attention map per head).
        skip_channels: channels of the backbone's layer3, layer2, layer1 outputs
            (1024, 512, 256 for ResNet-50/101; 256, 128, 64 for ResNet-18/34).
        hidden_dim: the transformer width; sets the inner widths.
    """

    def __init__(self, in_channels: int, skip_channels: tuple[int, int, int] | list[int], hidden_dim: int) -> None:
        super().__init__()
        widths = [in_channels, hidden_dim // 2, hidden_dim // 4, hidden_dim // 8, hidden_dim // 16]
        if any(width < 8 or width % 8 for width in widths):
            raise ValueError(
                f"the mask head's GroupNorm(8) needs widths divisible by 8: hidden_dim + num_heads = {in_channels} "
                f"and hidden_dim / 16 = {hidden_dim / 16:g} must be; use a hidden_dim that is a multiple of 128")
        self.lay1 = nn.Conv2d(widths[0], widths[0], 3, padding=1)
        self.gn1 = nn.GroupNorm(8, widths[0])
        self.lay2 = nn.Conv2d(widths[0], widths[1], 3, padding=1)
        self.gn2 = nn.GroupNorm(8, widths[1])
        self.lay3 = nn.Conv2d(widths[1], widths[2], 3, padding=1)
        self.gn3 = nn.GroupNorm(8, widths[2])
        self.lay4 = nn.Conv2d(widths[2], widths[3], 3, padding=1)
        self.gn4 = nn.GroupNorm(8, widths[3])
        self.lay5 = nn.Conv2d(widths[3], widths[4], 3, padding=1)
        self.gn5 = nn.GroupNorm(8, widths[4])
        self.out_lay = nn.Conv2d(widths[4], 1, 3, padding=1)
        self.adapter1 = nn.Conv2d(skip_channels[0], widths[1], 1)
        self.adapter2 = nn.Conv2d(skip_channels[1], widths[2], 1)
        self.adapter3 = nn.Conv2d(skip_channels[2], widths[3], 1)
        for module in self.modules():  # the authors' init
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_uniform_(module.weight, a=1)
                nn.init.zeros_(module.bias)

    def forward(self, features: torch.Tensor, attention: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        """features [B, C, h, w] (projected backbone output); attention [B, Q, heads, h, w]; skips: the
        backbone's layer3, layer2, layer1 outputs [B, C_i, H_i, W_i] → mask logits [B, Q, H_1, W_1]."""
        batch, num_queries = attention.shape[:2]
        x = torch.cat([features.unsqueeze(1).expand(-1, num_queries, -1, -1, -1), attention], dim=2)
        x = x.flatten(0, 1)  # [B·Q, C + heads, h, w]: every query runs through the head on its own
        x = fresh_activation(F.relu, self.gn1(self.lay1(x)))
        x = fresh_activation(F.relu, self.gn2(self.lay2(x)))
        stages = ((self.adapter1, self.lay3, self.gn3), (self.adapter2, self.lay4, self.gn4),
                  (self.adapter3, self.lay5, self.gn5))
        for (adapter, conv, norm), skip in zip(stages, skips):
            skip = adapter(skip)  # once per image, shared by its queries
            x = F.interpolate(x, size=skip.shape[-2:], mode="nearest")
            x = (x.unflatten(0, (batch, num_queries)) + skip.unsqueeze(1)).flatten(0, 1)
            x = fresh_activation(F.relu, norm(conv(x)))
        return self.out_lay(x).view(batch, num_queries, *x.shape[-2:])


def _stage_channels(backbone: Backbone, stage: str) -> int:
    last_block = getattr(backbone.body, stage)[-1]
    return (last_block.conv3 if hasattr(last_block, "conv3") else last_block.conv2).out_channels


class DETRPanoptic(Detector):
    """DETR with the mask head: boxes, classes and one mask per query (paper §4.4).

    Build it with :func:`build_detr_panoptic`, or load the authors' panoptic release files with
    :func:`detr.load_checkpoint`. The state dict is the authors': the detector under ``detr.``, the
    heads under ``bbox_attention.`` and ``mask_head.``. With an anchor detector the attention map also gets
    positions on both sides (:class:`QueryPosition`, ``bbox_attention.position.*``; not in the authors' layout).

    Args:
        detr: the detector: the authors' :class:`DETR` (learned queries, softmax class head) or
            :class:`detr.models.anchor.model.AnchorDETR` (anchor queries, either class head; its denoising
            queries and extra query groups get no masks: :meth:`decode`'s ``hidden`` holds the Q queries
            that inference decodes).
        freeze_detr: stop gradients to every detector weight: the second stage of the authors' two-stage
            recipe trains only the mask head on a converged box model (paper §4.4).

    Attributes: the :class:`Detector` contract's, the detector's where they describe it (``num_classes``,
    ``num_queries``, ``class_head``, ``config``, ``stride``, ...); ``meta`` (:class:`detr.models.config.ModelMeta`: categories, things and stuff for
    :class:`detr.inference.postprocess_masks.PostProcessPanoptic` and the settings the training run validated
    with) is set by loaders (empty here).
    """

    def __init__(self, detr: SingleScaleDetector, *, freeze_detr: bool = False) -> None:
        super().__init__()
        backbone = detr.backbone[0]
        missing = [stage for stage in SKIP_STAGES if not hasattr(backbone.body, stage)]
        if missing:
            raise ValueError(f"the mask head needs the backbone's {', '.join(SKIP_STAGES)} outputs; this backbone "
                             f"stops before {missing[0]}: use backbone_last_stage='layer4' or 'layer3'")
        self.detr = detr
        if freeze_detr:
            detr.requires_grad_(False)
        hidden_dim, num_heads = detr.transformer.d_model, detr.transformer.nhead
        self.bbox_attention = AttentionMap(hidden_dim, hidden_dim, num_heads)
        if isinstance(detr, AnchorDETR):  # positions for the attention map (bbox_attention.position.*)
            self.bbox_attention.position = QueryPosition(hidden_dim, num_heads)
        self.mask_head = MaskHead(hidden_dim + num_heads, [_stage_channels(backbone, s) for s in SKIP_STAGES],
                                  hidden_dim)
        self.meta = ModelMeta()  # categories, things/stuff, post-processing settings: set by loaders

    predicts_masks = True
    exportable = False  # the export covers the detector (detr-export writes boxes and classes only)

    @property
    def num_classes(self) -> int:
        return self.detr.num_classes

    @property
    def query_type(self) -> str:
        return self.detr.query_type

    @property
    def attention_kind(self) -> str | None:
        return self.detr.attention_kind

    @property
    def box_detector(self) -> Detector:
        return self.detr

    @property
    def min_image_size(self) -> int:
        return self.detr.min_image_size

    @property
    def max_image_size(self) -> int | None:
        return self.detr.max_image_size

    def describe(self) -> str:
        return self.detr.describe() + (", mask head" if self.detr.describe() else "")

    @property
    def num_queries(self) -> int:
        return self.detr.num_queries

    @property
    def class_head(self) -> str:
        return self.detr.class_head

    @property
    def aux_loss(self) -> bool:
        return self.detr.aux_loss

    @property
    def config(self) -> ModelConfig | None:
        return self.detr.config

    @property
    def stride(self) -> int:
        """The detector's feature stride (its attention maps' cells)."""
        return self.detr.stride

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> DETRPanoptic:
        """The detector's :meth:`DETR.optimize_for_inference` (the mask head keeps its layout); eval mode."""
        self.detr.optimize_for_inference(fold_batch_norm=fold_batch_norm, channels_last=channels_last)
        return self.eval()

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DetectorOutput:
        """Raw predictions for a padded batch.

        Args:
            images: float [B, 3, H, W], ImageNet-normalised, zero-padded at the bottom and right.
            padding_mask: bool [B, H, W], True on padding.
            return_attention: also return the detector's attention maps (:attr:`DetectorOutput.attention`).
            targets: passed to the detector's :meth:`SingleScaleDetector.decode` (its denoising queries read them).

        Returns the detector's :class:`DetectorOutput` (equal to ``model.detr(images, padding_mask)``) with
        masks float [B, Q, H', W']: mask logits at stride 4 of the padded batch (H' = H / 4 rounded up as the
        ResNet stem rounds), for the last decoder layer's Q matching queries only (with query groups in
        training: group 1's).
        """
        detr = self.detr
        src, mask, pos, stages = detr.embed(images, padding_mask, keep_stages=SKIP_STAGES)  # src [B, C, h, w]
        decoded = detr.decode(src, mask, pos, targets, return_attention)
        output, hidden = decoded.output, decoded.hidden  # hidden [B, Q, C]
        memory = decoded.memory.transpose(1, 2).unflatten(-1, src.shape[-2:])  # [B, C, h, w]
        spatial = None
        if self.bbox_attention.position is not None:  # the Q queries of hidden: the first of the boxes
            spatial = self.bbox_attention.position(output.boxes[:, : hidden.shape[1]].detach(), pos)
        attention = self.bbox_attention(hidden, memory, mask, spatial)  # [B, Q, heads, h, w]
        if spatial is not None:
            attention = attention_density(attention, mask)
        output.masks = self.mask_head(src, attention, [stages[name] for name in SKIP_STAGES])
        return output


def build_detr_panoptic(config: DetrConfig | None = None, /, *, freeze_detr: bool = False,
                        **options: Any) -> DETRPanoptic:
    """Build :class:`DETRPanoptic` around the detector ``config`` describes, as :func:`detr.build_detr` does
    (``options`` are :class:`DetrConfig` fields that replace the config's). The default is the authors' COCO
    panoptic model: R50, 250 classes (COCO panoptic category ids 1–200 are the labels; 251 logits with
    no-object), 100 queries. freeze_detr: see :class:`DETRPanoptic`. The mask head needs a hidden_dim that is
    a multiple of 128.
    """
    if config is None:
        config = DetrConfig(num_classes=COCO_PANOPTIC_NUM_CLASSES)
    if options:
        config = config.replace(**options)
    return DETRPanoptic(build_detr(config), freeze_detr=freeze_detr)
