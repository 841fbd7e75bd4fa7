"""D-FINE's decoder: Fine-grained Distribution Refinement (Peng et al., "D-FINE", ICLR 2025, §3.2-3.3).

Query selection is RT-DETR's (:meth:`~detr.models.rtdetr.decoder.RTDETRDecoder.select_queries`). The boxes are
then refined as distributions: after the first layer a plain head (``pre_bbox_head``: a delta in logit space)
gives the initial box b⁰; from then on every layer l predicts, for each of the four edges, logits over
``max_num_bins + 1`` bins, added to the previous layer's logits (residual refinement), and the edge's distance is
the expectation ``Σ softmax(logits)_n · W(n)`` under the non-uniform weighting function W
(:func:`weighting_function`: fine bins near 0, coarse towards ±2 · up · reg_scale). The distances move b⁰'s edges
in units of its width and height over ``reg_scale`` (:func:`distance_to_box`). Each layer's class logits get a
localisation-quality term (:class:`LocalizationQuality`) from the top probabilities of its edge distributions.

The layers differ from RT-DETR's in two places: the cross-attention has no value or output projection and a point
count per level, and a gate (:class:`Gate`) replaces its residual and LayerNorm. The reference box of each layer
is the previous layer's refined box (detached); the positions (an MLP of it) are clamped to ±10.

Parameter names are the authors' (Peterande/D-FINE, ``src/zoo/dfine/dfine_decoder.py``): RT-DETR's plus
``decoder.layers.{i}.gateway.{gate,norm}``, ``decoder.lqe_layers.{i}.reg_conf``, ``decoder.up``,
``decoder.reg_scale`` and ``pre_bbox_head``.

DEIMv2 (Huang et al. 2025) keeps this decoder and changes its layers (``norm="rms_norm"``,
``feedforward="swiglu"``): RMSNorm in place of every LayerNorm (the gate's too), a SwiGLU feed-forward network
(:class:`SwiGLU`, half the width, transformers' names ``ffn.{gate,up,down}_proj``), optionally no gate
(``gateway=False``: a residual and RMSNorm ``norm2``), and its query positions are a 3-layer MLP of the
decoder's width (injected as ``query_pos_head``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from detr.box_ops import inverse_sigmoid, xyxy_to_cxcywh
from detr.models.config import PRIOR_BIAS
from detr.models.layers.decoder_layer import DecoderLayer
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, SpatialShapes
from detr.models.layers.mlp import MLP
from detr.models.outputs import DistributionOutput, LayerOutput
from detr.models.rtdetr.config import SamplingMethod
from detr.models.rtdetr.decoder import REFERENCE_EPS, DecoderOutput, RTDETRDecoder

#: The clamp of the query positions (the authors').
POSITION_CLAMP = 10.0


def weighting_function(max_num_bins: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """W(n), n = 0 … max_num_bins → [max_num_bins + 1] (§3.2, eq. 3): 0 in the middle, ``±(stepⁱ - 1)`` around
    it with ``step = (a + 1)^(2 / (N - 2))``, ``a = |up| · |reg_scale|``, and ±2a at the ends."""
    bound = up.abs() * reg_scale.abs()  # [1]
    step = (bound + 1) ** (2 / (max_num_bins - 2))
    half = max_num_bins // 2
    left = [-(step ** index) + 1 for index in range(half - 1, 0, -1)]
    right = [step ** index - 1 for index in range(1, half)]
    return torch.cat([-2 * bound, *left, torch.zeros_like(bound), *right, 2 * bound])


def distance_to_box(initial: torch.Tensor, distances: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """initial boxes [B, Q, 4] (cxcywh) and edge distances [B, Q, 4] (left, top, right, bottom) → boxes [B, Q, 4]
    (cxcywh): each edge at ``centre ∓ (reg_scale / 2 + d) · size / reg_scale``."""
    scale = reg_scale.abs()
    centre, size = initial[..., :2], initial[..., 2:]
    top_left = centre - (0.5 * scale + distances[..., :2]) * (size / scale)
    bottom_right = centre + (0.5 * scale + distances[..., 2:]) * (size / scale)
    return xyxy_to_cxcywh(torch.cat([top_left, bottom_right], -1))


def edge_distances(corner_logits: torch.Tensor, project: torch.Tensor) -> torch.Tensor:
    """corner logits [B, Q, 4 · (N + 1)] → expected distances [B, Q, 4] under W (``project``, [N + 1])."""
    batch, queries, _ = corner_logits.shape
    probabilities = corner_logits.reshape(-1, project.shape[0]).softmax(-1)
    return F.linear(probabilities, project).reshape(batch, queries, 4)


class LocalizationQuality(nn.Module):
    """LQE (§3.3): the ``top_k`` largest probabilities of each edge's distribution and their mean, through
    ``reg_conf`` (an MLP to one value), added to the class logits: a peaked distribution is a confident box."""

    def __init__(self, num_bins: int, top_k: int = 4, hidden_dim: int = 64, num_layers: int = 2, *,
                 activation: Activation = F.relu) -> None:
        super().__init__()
        self.num_bins, self.top_k = num_bins, top_k
        self.reg_conf = MLP(4 * (top_k + 1), hidden_dim, 1, num_layers, activation=activation)

    def forward(self, logits: torch.Tensor, corner_logits: torch.Tensor) -> torch.Tensor:
        """logits [B, Q, K], corner logits [B, Q, 4 · (N + 1)] → logits [B, Q, K]."""
        batch, queries, _ = corner_logits.shape
        probabilities = corner_logits.reshape(batch, queries, 4, self.num_bins + 1).softmax(-1)
        top = probabilities.topk(self.top_k, dim=-1).values
        statistics = torch.cat([top, top.mean(-1, keepdim=True)], -1).reshape(batch, queries, -1)
        return logits + self.reg_conf(statistics)


#: An activation between linear layers: ReLU (D-FINE) or SiLU (DEIM).
Activation = Callable[[torch.Tensor], torch.Tensor]
#: The decoder layers' normalisation: D-FINE's LayerNorm or DEIMv2's RMSNorm.
DecoderNorm = Literal["layer_norm", "rms_norm"]
#: The decoder layers' feed-forward network: D-FINE's two linear layers (ReLU, or DEIM's SiLU: ``activation``) or
#: DEIMv2's SwiGLU.
FeedForward = Literal["relu", "swiglu"]


class RMSNorm(nn.RMSNorm):
    """DEIMv2's RMSNorm, transformers' Llama one: eps 1e-6, a scale and no bias, computed in the scale's dtype.

    Under an autocast (bf16-mixed) the input arrives in bfloat16 beside a float32 scale, which torch's fused kernel
    refuses (a warning, and a slower composite path); computed in the scale's dtype it runs fused in float32
    (transformers normalises in float32 too, then rounds to the input's dtype before the scale). Equal to
    ``nn.RMSNorm`` when the two dtypes agree."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.to(self.weight.dtype), self.normalized_shape, self.weight, self.eps)


def _norm(kind: DecoderNorm, hidden_dim: int) -> nn.Module:
    return nn.LayerNorm(hidden_dim) if kind == "layer_norm" else RMSNorm(hidden_dim, eps=1e-6)


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) · up_proj(x))`` (Shazeer 2020), ``hidden_dim`` → ``inner_dim`` →
    ``hidden_dim``, with biases."""

    def __init__(self, hidden_dim: int, inner_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_dim, inner_dim)
        self.up_proj = nn.Linear(hidden_dim, inner_dim)
        self.down_proj = nn.Linear(inner_dim, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """``norm(g₁ · residual + g₂ · attended)``, (g₁, g₂) = sigmoid(``gate``([residual, attended])): ``gate``,
    ``norm`` (LayerNorm, or DEIMv2's RMSNorm)."""

    def __init__(self, hidden_dim: int, norm: DecoderNorm = "layer_norm") -> None:
        super().__init__()
        self.gate = nn.Linear(2 * hidden_dim, 2 * hidden_dim)
        self.norm = _norm(norm, hidden_dim)

    def forward(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        first, second = self.gate(torch.cat([residual, attended], -1)).sigmoid().chunk(2, dim=-1)
        return self.norm(first * residual + second * attended)


class DFineDecoderLayer(DecoderLayer):
    """RT-DETR's layer with D-FINE's cross-attention (no projections, points per level) and the gate in place of
    its residual and ``norm2``; ``activation`` between ``linear1`` and ``linear2`` (ReLU; DEIM: SiLU); DEIMv2's
    options: ``norm`` "rms_norm" for every norm, ``feedforward`` "swiglu" (``ffn``, inner width
    dim_feedforward // 2, in place of ``linear1`` / ``linear2``), ``gateway`` False (the cross-attention's
    residual and ``norm2`` back)."""

    def __init__(self, hidden_dim: int, num_heads: int, num_levels: int, points_per_level: Sequence[int],
                 dim_feedforward: int, dropout: float = 0.0, *, offset_scale: float = 0.5,
                 sampling_method: SamplingMethod = "bilinear", norm: DecoderNorm = "layer_norm",
                 feedforward: FeedForward = "relu", gateway: bool = True, activation: Activation = F.relu) -> None:
        super().__init__(hidden_dim, num_heads, num_levels, 1, dim_feedforward, dropout)
        self.activation = activation
        if norm not in ("layer_norm", "rms_norm") or feedforward not in ("relu", "swiglu"):
            raise ValueError(f"norm must be 'layer_norm' or 'rms_norm' and feedforward 'relu' or 'swiglu', got "
                             f"{norm!r} and {feedforward!r}")
        self.cross_attn = MultiScaleDeformableAttention(hidden_dim, num_heads, num_levels, points_per_level,
                                                        offset_scale=offset_scale, sampling_method=sampling_method,
                                                        projections=False)
        if norm == "rms_norm":
            self.norm1, self.norm3 = _norm(norm, hidden_dim), _norm(norm, hidden_dim)
        self.gateway: Gate | None = None
        if gateway:
            del self.norm2
            self.gateway = Gate(hidden_dim, norm)
        else:
            self.norm2 = _norm(norm, hidden_dim)
        self.ffn: SwiGLU | None = None
        if feedforward == "swiglu":
            del self.linear1, self.linear2
            self.ffn = SwiGLU(hidden_dim, dim_feedforward // 2)

    def forward(self, target: torch.Tensor, query_pos: torch.Tensor, reference_boxes: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, self_attn_mask: torch.Tensor | None = None,
                return_sampling: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """As :meth:`DecoderLayer.forward`."""
        q = k = target + query_pos
        target = self.norm1(target + self.dropout(self.self_attn(q, k, target, self_attn_mask)[0]))
        attended, sampling = self.cross_attn(target + query_pos, reference_boxes, memory, spatial_shapes,
                                             return_sampling=return_sampling)
        attended = self.dropout(attended)
        target = self.gateway(target, attended) if self.gateway is not None else self.norm2(target + attended)
        if self.ffn is not None:
            ffn = self.ffn(target)
        else:
            ffn = self.linear2(self.dropout(self.activation(self.linear1(target))))
        return self.norm3((target + self.dropout(ffn)).clamp(min=-65504, max=65504)), sampling


class DFineTransformerDecoder(nn.Module):
    """The layers, their quality heads (``lqe_layers``) and W's two constants (``up``, ``reg_scale``, kept as
    buffers where the authors keep them): the authors' ``decoder.decoder``."""

    def __init__(self, layers: list[DFineDecoderLayer], quality: list[LocalizationQuality], *, up: float,
                 reg_scale: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.lqe_layers = nn.ModuleList(quality)
        self.register_buffer("up", torch.tensor([up]))
        self.register_buffer("reg_scale", torch.tensor([reg_scale]))


class DFineDecoder(RTDETRDecoder):
    """RT-DETR's input projection and query selection, D-FINE's layers and distribution heads.

    Args: as :class:`RTDETRDecoder`, with ``num_points`` one count per level, and
        max_num_bins: N, the bins of each edge's distribution are N + 1 (32). reg_scale, up: W's curvature
            and range (4, 0.5). lqe_top_k, lqe_hidden_dim, lqe_layers: the quality head's (4, 64, 2).
        norm, feedforward, gateway: the layers' (:class:`DFineDecoderLayer`; DEIMv2: "rms_norm", "swiglu").
        query_pos_head: the MLP of the reference boxes [.., 4] → positions [.., hidden_dim]; None: RT-DETR's
            (4 → 2 · hidden → hidden, ``mlp_activation``); DEIMv2's is ``MLP(4, hidden, hidden, 3)``.
        activation: in the layers' feed-forward networks (ReLU; DEIM: SiLU; transformers'
            ``decoder_activation_function``).
        mlp_activation: in every MLP: the query positions (unless given), the encoder's box head (query
            selection), ``pre_bbox_head``, the distribution heads and the quality heads (ReLU; DEIM: SiLU, its
            ``mlp_act`` and, for the quality heads, ``activation``; transformers' D-FINE: ReLU only).
    The input projection is the identity where the encoder's width is the decoder's (as the authors').
    """

    def __init__(self, in_channels: list[int], *, num_classes: int, hidden_dim: int = 256, num_queries: int = 300,
                 num_layers: int = 6, num_heads: int = 8, num_levels: int = 3,
                 num_points: Sequence[int] = (3, 6, 3), dim_feedforward: int = 1024, dropout: float = 0.0,
                 offset_scale: float = 0.5, sampling_method: SamplingMethod = "bilinear", denoising: bool = True,
                 max_num_bins: int = 32, reg_scale: float = 4.0, up: float = 0.5, lqe_top_k: int = 4,
                 lqe_hidden_dim: int = 64, lqe_layers: int = 2, norm: DecoderNorm = "layer_norm",
                 feedforward: FeedForward = "relu", gateway: bool = True, query_pos_head: MLP | None = None,
                 activation: Activation = F.relu, mlp_activation: Activation = F.relu) -> None:
        if num_levels != len(in_channels):
            raise ValueError(f"D-FINE's decoder reads the encoder's {len(in_channels)} maps: num_levels must equal "
                             f"it, got {num_levels}")
        # RT-DETR's parts with its layers of one point, which D-FINE's layers and box heads then replace
        super().__init__(in_channels, num_classes=num_classes, hidden_dim=hidden_dim, num_queries=num_queries,
                         num_layers=0, num_heads=num_heads, num_levels=num_levels, num_points=1,
                         dim_feedforward=dim_feedforward, dropout=dropout, denoising=denoising)
        self.max_num_bins = max_num_bins
        if in_channels[-1] == hidden_dim:
            self.input_proj = nn.ModuleList(nn.Identity() for _ in in_channels)
        self.decoder = DFineTransformerDecoder(
            [DFineDecoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout,
                               offset_scale=offset_scale, sampling_method=sampling_method, norm=norm,
                               feedforward=feedforward, gateway=gateway, activation=activation)
             for _ in range(num_layers)],
            [LocalizationQuality(max_num_bins, lqe_top_k, lqe_hidden_dim, lqe_layers, activation=mlp_activation)
             for _ in range(num_layers)],
            up=up, reg_scale=reg_scale)
        # RT-DETR's query positions and encoder box head, kept with their initialisation
        self.query_pos_head.activation = self.enc_bbox_head.activation = mlp_activation
        if query_pos_head is not None:
            self.query_pos_head = query_pos_head
        self.pre_bbox_head = MLP(hidden_dim, hidden_dim, 4, 3, activation=mlp_activation)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_layers))
        self.dec_bbox_head = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4 * (max_num_bins + 1), 3,
                                               activation=mlp_activation) for _ in range(num_layers))
        self._reset_heads()

    @torch.no_grad()
    def _reset_heads(self) -> None:
        """The authors' initialisation of D-FINE's heads: class biases at the focal prior, the last layers of the
        box heads and the quality heads at zero."""
        for score in self.dec_score_head:
            nn.init.constant_(score.bias, PRIOR_BIAS)
        for head in [self.pre_bbox_head, *self.dec_bbox_head, *(q.reg_conf for q in self.decoder.lqe_layers)]:
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)

    def forward(self, features: list[torch.Tensor], num_layers: int | None = None, return_sampling: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DecoderOutput:
        """The encoder's maps → every run layer's predictions (:class:`DecoderOutput`; each layer's logits with
        its quality term); ``num_layers`` runs only the first that many layers. In training, ``targets`` (per
        image labels int64 [T] and boxes [T, 4] normalised cxcywh) add RT-DETR's contrastive denoising queries
        ahead of the selected ones, and the output holds what the losses of the distributions read (every
        layer's edge logits, b⁰, W, the first layer's plain-head predictions: ``distributions`` and
        ``denoising_distributions``)."""
        start = self.start_queries(features, targets)
        memory, shapes, target, mask, meta = (start.memory, start.spatial_shapes, start.target, start.self_attn_mask,
                                              start.meta)
        boxes = start.boxes
        up, reg_scale = self.decoder.up, self.decoder.reg_scale
        project = weighting_function(self.max_num_bins, up, reg_scale)
        logits_per_layer, boxes_per_layer, corners_per_layer, sampling = [], [], [], []
        corner_logits = previous_target = torch.zeros((), dtype=memory.dtype, device=memory.device)
        layers = self.decoder.layers[:num_layers] if num_layers is not None else self.decoder.layers
        for index, layer in enumerate(layers):
            query_pos = self.query_pos_head(boxes).clamp(min=-POSITION_CLAMP, max=POSITION_CLAMP)
            target, layer_sampling = layer(target, query_pos, boxes[:, :, None], memory, shapes,
                                           self_attn_mask=mask, return_sampling=return_sampling)
            if index == 0:  # the initial box b⁰, which every later layer's distances move
                pre_boxes = (self.pre_bbox_head(target) + inverse_sigmoid(boxes, eps=REFERENCE_EPS)).sigmoid()
                pre_logits = self.dec_score_head[0](target) if self.training else None
                initial = pre_boxes.detach()
            corner_logits = self.dec_bbox_head[index](target + previous_target) + corner_logits
            refined = distance_to_box(initial, edge_distances(corner_logits, project), reg_scale)
            logits = self.decoder.lqe_layers[index](self.dec_score_head[index](target), corner_logits)
            logits_per_layer.append(logits)
            boxes_per_layer.append(refined)
            corners_per_layer.append(corner_logits)
            sampling.append(layer_sampling)
            boxes, previous_target = refined.detach(), target.detach()
        logits, boxes = torch.stack(logits_per_layer), torch.stack(boxes_per_layer)
        output = DecoderOutput(logits, boxes, start.proposal_logits, start.proposal_boxes,
                               sampling if return_sampling else None, shapes)
        if not self.training:
            return output
        split = [meta.num_queries if meta is not None else 0, self.num_queries]
        corners = torch.stack(corners_per_layer)
        distributions = [DistributionOutput(corners_part, initial_part, project.detach(), reg_scale,
                                            LayerOutput(pre_logits_part, pre_boxes_part))
                         for corners_part, initial_part, pre_logits_part, pre_boxes_part in zip(
                             corners.split(split, 2), initial.split(split, 1), pre_logits.split(split, 1),
                             pre_boxes.split(split, 1))]
        output.denoising_distributions, output.distributions = distributions
        if meta is None:
            output.denoising_distributions = None
        return self.split_denoising(output, meta)
