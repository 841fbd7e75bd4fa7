"""RT-DETR's query selection and decoder (Zhao et al. 2024, §4.3; RT-DETRv2, Lv et al. 2024).

Query selection: every cell of the encoder's maps (flattened, finest first) goes through ``enc_output`` (linear +
LayerNorm), a class head and a box head whose output is added to the cell's anchor (its centre, and a size of
0.05 · 2^level, in logits: :mod:`detr.models.layers.cell_anchors`); the ``num_queries`` cells with the best class
score become the decoder's queries: their features as content (detached) and their boxes as the first reference
boxes. Anchors within 1 % of the border are invalid: their cells are zeroed before the heads and their box logits
pushed to the largest float.

Decoder: post-norm layers (:class:`~detr.models.layers.decoder_layer.DecoderLayer`) of self-attention among
queries (positions from an MLP of the reference box, added to queries and keys), multi-scale deformable
cross-attention around the reference box (one reference box for every level), and a ReLU FFN; after layer i,
``dec_bbox_head.i`` refines the box (a delta in logit space) and ``dec_score_head.i`` classifies. The refined box,
detached, is the next layer's reference.

Parameter names are the authors' (``src/zoo/rtdetr/rtdetrv2_decoder.py``): ``input_proj.{l}.{conv,norm}``,
``decoder.layers.{i}.{self_attn,norm1,cross_attn,norm2,linear1,linear2,norm3}``, ``query_pos_head``,
``enc_output.{proj,norm}``, ``enc_score_head``, ``enc_bbox_head``, ``dec_score_head.{i}``,
``dec_bbox_head.{i}``, ``denoising_class_embed``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.config import PRIOR_BIAS
from detr.models.layers.cell_anchors import cell_anchors, gather_cells, select_cells
from detr.models.layers.decoder_layer import DecoderLayer
from detr.models.layers.deformable_attention import SpatialShapes
from detr.models.layers.denoising import DenoisingMeta
from detr.models.layers.mlp import MLP
from detr.models.outputs import DistributionOutput
from detr.models.rtdetr.config import SamplingMethod
from detr.models.rtdetr.denoising import contrastive_denoising_queries
from detr.models.size_constants import SizeConstants

#: The clamp of inverse_sigmoid for reference boxes (the authors' 1e-5).
REFERENCE_EPS = 1e-5


def anchors_for(spatial_shapes: SpatialShapes, *, device: torch.device | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cell's anchor box in logits and whether it is valid → anchors [1, S, 4] (cx, cy, w, h; invalid:
    the dtype's largest value), valid bool [1, S, 1] (:func:`~detr.models.layers.cell_anchors.cell_anchors`)."""
    boxes, valid = cell_anchors(spatial_shapes, device=device, dtype=dtype)
    logits = torch.log(boxes / (1 - boxes))
    largest = torch.full((), torch.finfo(dtype).max, dtype=dtype, device=device)
    return torch.where(valid, logits, largest), valid


def _anchors_and_mask(spatial_shapes: tuple[tuple[int, int], ...], *, device: torch.device, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`anchors_for`, the valid mask in ``dtype`` (1.0 valid, 0.0 not): what query selection multiplies by."""
    anchors, valid = anchors_for(list(spatial_shapes), device=device, dtype=dtype)
    return anchors, valid.to(dtype)


class TransformerDecoder(nn.Module):
    """The stack of :class:`DecoderLayer` (``layers``): the authors' ``decoder.decoder``."""

    def __init__(self, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


@dataclass
class DecoderOutput:
    """logits [L, B, Q, K] and boxes [L, B, Q, 4] (cxcywh in [0, 1]) of each decoder layer run;
    proposal_logits [B, Q, K], proposal_boxes [B, Q, 4]: the selected encoder proposals; sampling: per layer
    (locations [B, Q, H, levels, P, 2], weights [B, Q, H, levels, P]) when asked for, else None;
    spatial_shapes: the levels' (h, w), finest first."""

    logits: torch.Tensor
    boxes: torch.Tensor
    proposal_logits: torch.Tensor
    proposal_boxes: torch.Tensor
    sampling: list[tuple[torch.Tensor, torch.Tensor]] | None
    spatial_shapes: SpatialShapes
    #: training with targets: the denoising queries' logits [L, B, D, K] and boxes [L, B, D, 4], and where they are
    denoising_logits: torch.Tensor | None = None
    denoising_boxes: torch.Tensor | None = None
    denoising_meta: DenoisingMeta | None = None
    #: a decoder that refines boxes as distributions (D-FINE), in training: the selected queries' and the
    #: denoising queries' edge distributions
    distributions: DistributionOutput | None = None
    denoising_distributions: DistributionOutput | None = None


class QueryStart(NamedTuple):
    """What the decoder's layers start from (:meth:`RTDETRDecoder.start_queries`): memory [B, S, C] and its levels'
    spatial_shapes; the queries' content target [B, D + Q, C] and boxes [B, D + Q, 4] (cxcywh in [0, 1], detached),
    the D denoising queries (training only) ahead of the Q selected; the encoder's proposal_logits [B, Q, K] and
    proposal_boxes [B, Q, 4]; the self-attention mask that keeps the denoising groups apart and their meta (None
    without denoising)."""

    memory: torch.Tensor
    spatial_shapes: SpatialShapes
    target: torch.Tensor
    boxes: torch.Tensor
    proposal_logits: torch.Tensor
    proposal_boxes: torch.Tensor
    self_attn_mask: torch.Tensor | None
    meta: DenoisingMeta | None


class RTDETRDecoder(nn.Module):
    """Input projection of the encoder's maps, query selection, the decoder and its per-layer heads.

    Args:
        in_channels: channels of the encoder's maps (finest first); ``num_levels`` more than their number adds
            coarser levels by 3×3 stride-2 convs. hidden_dim, num_heads, dim_feedforward, dropout: the decoder's.
        num_classes: sigmoid logits per query. num_queries: selected per image (300).
        num_layers: decoder layers (6; 3 for the released R18). num_levels, num_points: deformable sampling.
        offset_scale, sampling_method: RT-DETRv2's attention options. denoising: the contrastive denoising
            groups in training (:mod:`detr.models.rtdetr.denoising`), with their label embedding
            (``denoising_class_embed``, num_classes + 1 rows, as in the authors' models); num_denoising,
            label_noise_ratio, box_noise_scale: theirs (100, 0.5, 1.0).
    """

    def __init__(self, in_channels: list[int], *, num_classes: int, hidden_dim: int = 256, num_queries: int = 300,
                 num_layers: int = 6, num_heads: int = 8, num_levels: int = 3, num_points: int = 4,
                 dim_feedforward: int = 1024, dropout: float = 0.0, offset_scale: float = 0.5,
                 sampling_method: SamplingMethod = "bilinear", denoising: bool = True, num_denoising: int = 100,
                 label_noise_ratio: float = 0.5, box_noise_scale: float = 1.0) -> None:
        super().__init__()
        self.num_classes, self.denoising = num_classes, denoising
        self.num_denoising = num_denoising
        self.label_noise_ratio, self.box_noise_scale = label_noise_ratio, box_noise_scale
        if num_levels < len(in_channels):
            raise ValueError(f"num_levels ({num_levels}) must be at least the encoder's {len(in_channels)} maps")
        self.num_queries, self.num_levels = num_queries, num_levels
        projections, channels = [], in_channels[-1]
        for level in range(num_levels):
            extra = level >= len(in_channels)
            conv = (nn.Conv2d(channels, hidden_dim, 3, 2, padding=1, bias=False) if extra
                    else nn.Conv2d(in_channels[level], hidden_dim, 1, bias=False))
            projections.append(nn.Sequential(OrderedDict(conv=conv, norm=nn.BatchNorm2d(hidden_dim))))
            channels = hidden_dim if extra else channels
        self.input_proj = nn.ModuleList(projections)
        self.anchors = SizeConstants(_anchors_and_mask)
        self.decoder = TransformerDecoder([
            DecoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout,
                         offset_scale=offset_scale, sampling_method=sampling_method) for _ in range(num_layers)])
        if denoising:
            self.denoising_class_embed = nn.Embedding(num_classes + 1, hidden_dim, padding_idx=num_classes)
        self.query_pos_head = MLP(4, 2 * hidden_dim, hidden_dim, 2)
        self.enc_output = nn.Sequential(OrderedDict(proj=nn.Linear(hidden_dim, hidden_dim),
                                                    norm=nn.LayerNorm(hidden_dim)))
        self.enc_score_head = nn.Linear(hidden_dim, num_classes)
        self.enc_bbox_head = MLP(hidden_dim, hidden_dim, 4, 3)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_layers))
        self.dec_bbox_head = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(num_layers))
        self._reset_parameters()

    @torch.no_grad()
    def _reset_parameters(self) -> None:
        """The authors' initialisation: class biases at the focal prior, box heads' last layer at zero."""
        for score, box in [(self.enc_score_head, self.enc_bbox_head),
                           *zip(self.dec_score_head, self.dec_bbox_head)]:
            nn.init.constant_(score.bias, PRIOR_BIAS)
            nn.init.zeros_(box.layers[-1].weight)
            nn.init.zeros_(box.layers[-1].bias)
        nn.init.xavier_uniform_(self.enc_output.proj.weight)
        for layer in self.query_pos_head.layers:
            nn.init.xavier_uniform_(layer.weight)

    def flatten_levels(self, features: list[torch.Tensor]) -> tuple[torch.Tensor, SpatialShapes]:
        """The encoder's maps → memory [B, S, C] (every level's cells, finest first) and the levels' (h, w).

        With gradients the memory is channel-first in memory (a transposed view of [B, C, S]): the layers'
        deformable sampling reads each head's values as [D, S] maps (``grid_sample``, whose backward a training
        step needs), which are then views of it, not a copy per layer; without, it is contiguous [B, S, C], as
        the inference kernel reads it (``embedding_bag`` rows). The same values either way."""
        sources = [projection(feature) for projection, feature in zip(self.input_proj, features)]
        for level in range(len(features), self.num_levels):
            sources.append(self.input_proj[level](features[-1] if level == len(features) else sources[-1]))
        shapes = [(int(source.shape[-2]), int(source.shape[-1])) for source in sources]
        if torch.is_grad_enabled():
            return torch.cat([source.flatten(2) for source in sources], 2).transpose(1, 2), shapes
        return torch.cat([source.flatten(2).transpose(1, 2) for source in sources], 1), shapes

    def select_queries(self, memory: torch.Tensor, spatial_shapes: SpatialShapes
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """memory [B, S, C] → content [B, Q, C] (detached), reference box logits [B, Q, 4] and the proposals'
        class logits [B, Q, K] (the top ``num_queries`` cells by their best class logit). The box logits keep
        their gradient (the proposals' box loss trains the encoder's box head); the decoder detaches them."""
        anchors, valid = self.anchors(tuple(spatial_shapes), device=memory.device, dtype=memory.dtype)

        def score(cells: torch.Tensor, cells_valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.enc_output(cells_valid * cells)
            return features, self.enc_score_head(features)

        index, selected, selected_logits = select_cells(score, memory, self.num_queries, valid=valid,
                                                        trained=self.training and torch.is_grad_enabled())
        # the box head runs on the selected cells only (Q of S rows: the same values, and only those are trained)
        box_logits = self.enc_bbox_head(selected) + gather_cells(anchors.expand(memory.shape[0], -1, -1), index)
        return selected.detach(), box_logits, selected_logits

    def forward(self, features: list[torch.Tensor], num_layers: int | None = None, return_sampling: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DecoderOutput:
        """The encoder's maps → every run layer's predictions (:class:`DecoderOutput`); ``num_layers`` runs only
        the first that many layers (the paper's speed knob: the heads of every layer are trained). In training,
        ``targets`` (per image labels int64 [T] and boxes [T, 4] normalised cxcywh) add the contrastive
        denoising queries ahead of the selected ones; their predictions come apart in ``denoising_*``."""
        start = self.start_queries(features, targets)
        memory, shapes, target, mask = start.memory, start.spatial_shapes, start.target, start.self_attn_mask
        boxes = start.boxes
        # The authors' training path: each layer's box is refined from the previous layer's undetached box (so
        # its loss reaches the earlier heads), while the next layer reads the detached one; same values.
        previous = boxes
        logits_per_layer, boxes_per_layer, sampling = [], [], []
        layers = self.decoder.layers[:num_layers] if num_layers is not None else self.decoder.layers
        for index, layer in enumerate(layers):
            target, layer_sampling = layer(target, self.query_pos_head(boxes), boxes[:, :, None], memory, shapes,
                                           self_attn_mask=mask, return_sampling=return_sampling)
            refined = (self.dec_bbox_head[index](target) + inverse_sigmoid(previous, eps=REFERENCE_EPS)).sigmoid()
            logits_per_layer.append(self.dec_score_head[index](target))
            boxes_per_layer.append(refined)
            sampling.append(layer_sampling)
            boxes = refined.detach()
            previous = refined if self.training else boxes
        logits, boxes = torch.stack(logits_per_layer), torch.stack(boxes_per_layer)
        output = DecoderOutput(logits, boxes, start.proposal_logits, start.proposal_boxes,
                               sampling if return_sampling else None, shapes)
        return self.split_denoising(output, start.meta)

    def start_queries(self, features: list[torch.Tensor], targets: list[dict[str, torch.Tensor]] | None
                      ) -> QueryStart:
        """What every layer starts from (:class:`QueryStart`): the flattened maps, the selected queries (their
        boxes detached) and, in training with ``targets`` and denoising on, the contrastive denoising queries
        ahead of them with the attention mask that keeps the groups apart."""
        memory, shapes = self.flatten_levels(features)
        target, reference_logits, proposal_logits = self.select_queries(memory, shapes)
        proposal_boxes = reference_logits.sigmoid()
        reference_logits = reference_logits.detach()
        mask, meta = None, None
        if self.training and self.denoising and targets is not None:
            denoising_content, denoising_logits, mask, meta = contrastive_denoising_queries(
                targets, self.denoising_class_embed, num_classes=self.num_classes, num_queries=self.num_queries,
                num_denoising=self.num_denoising, label_noise_ratio=self.label_noise_ratio,
                box_noise_scale=self.box_noise_scale)
            target = torch.cat([denoising_content.to(target.dtype), target], 1)
            reference_logits = torch.cat([denoising_logits.to(reference_logits.dtype), reference_logits], 1)
        return QueryStart(memory, shapes, target, reference_logits.sigmoid(), proposal_logits, proposal_boxes, mask,
                          meta)

    def split_denoising(self, output: DecoderOutput, meta: DenoisingMeta | None) -> DecoderOutput:
        """``output`` with the denoising queries' rows (ahead of the selected ones, as :meth:`start_queries`
        put them) moved to its ``denoising_*`` fields; unchanged without denoising (``meta`` None)."""
        if meta is not None:
            split = [meta.num_queries, self.num_queries]
            output.denoising_logits, output.logits = output.logits.split(split, dim=2)
            output.denoising_boxes, output.boxes = output.boxes.split(split, dim=2)
            output.denoising_meta = meta
        return output
