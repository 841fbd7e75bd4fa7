"""A GroupPose-style keypoint head (Liu et al., "Group Pose", ICCV 2023), as the rfdetr package's
``RFDETRKeypointPreview`` builds it (its ``models/heads/keypoints.py``, the keypoint parts of
``models/transformer.py`` and ``models/lwdetr.py``): a block any query-based decoder declares beside its layers.

Every object query owns K keypoint queries, K the sum of the classes' keypoint counts (``num_keypoints_per_class``:
class c has its own count, 0 for a class without keypoints; COCO's persons: ``[0, 17]``). The keypoint queries start
from a learned set modulated by the object query (:class:`KeypointQueryInitializer`, AdaLN); after each decoder
layer a :class:`KeypointLayer` lets each object query and its keypoint queries attend to one another (keypoints of
different classes do not see each other), the keypoint queries sample the image around the object's reference box
(deformable attention) and pass an FFN. A shared MLP (``predictor``) reads every keypoint query as 8 channels
(:data:`KEYPOINT_CHANNELS`):

====  ===========  =====================================================================================
0, 1  x, y         normalised to the unpadded image: a delta times the reference box's size plus its centre
2     findable     logit of "the annotator could place it" (COCO v > 0)
3     visible      logit of "it is visible" (v = 2)
4-6   precision    the Cholesky factor of the 2-D precision (inverse covariance) matrix: log l11, l21, log l22
7     class        the keypoint's contribution to its class's logit (summed over the class's keypoints)
====  ===========  =====================================================================================

Outputs are laid out per class, padded (:meth:`KeypointSchema.pad`): ``[..., C_k · K_max, 8]``, class c's keypoints
at slots ``c · K_max … c · K_max + K_c - 1``, zeros elsewhere (C_k = len(num_keypoints_per_class), K_max its largest
count): the layout the losses (:mod:`detr.loss.keypoints`) and post-processing read. Two-stage models also predict
keypoints for the encoder's selected proposals (:meth:`KeypointHead.encoder_keypoints`, one predictor per query
group). Parameter names are the package's (``kp_inst_self_attn``, ``kp_cross_attn``, ``adaLN_modulation`` ...), so a
checkpoint's keys map by prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.attention import MultiheadAttention
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, SpatialShapes
from detr.models.layers.mlp import MLP

#: Channels of one keypoint prediction: x, y, findable, visible, log l11, l21, log l22, class.
KEYPOINT_CHANNELS = 8


@dataclass(frozen=True)
class KeypointSchema:
    """How many keypoints each class has: ``counts[c]`` for class id c (0: none), at least one class with some."""

    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.counts or min(self.counts) < 0 or sum(self.counts) == 0:
            raise ValueError(f"num_keypoints_per_class must list a count >= 0 per class id, at least one above 0 "
                             f"(e.g. [0, 17] for COCO's persons), got {list(self.counts)}")

    @property
    def total(self) -> int:
        """K: keypoint queries per object query (every class's)."""
        return sum(self.counts)

    @property
    def max_count(self) -> int:
        """K_max: slots per class in the padded layout."""
        return max(self.counts)

    @property
    def num_classes(self) -> int:
        """C_k: the class ids the schema covers (0 … C_k - 1)."""
        return len(self.counts)

    def active(self, device: torch.device | None = None) -> torch.Tensor:
        """bool [C_k, K_max]: True where class c has keypoint k (the package's ``_kp_active_mask``)."""
        slots = torch.arange(self.max_count, device=device)
        return slots[None, :] < torch.tensor(self.counts, device=device)[:, None]

    def attention_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """bool [1 + K, 1 + K], True = may attend: the object query (index 0) and its keypoint queries, where a
        class's keypoints do not attend to another class's (the package's ``keypoint_class_mask``, inverted)."""
        owner = torch.repeat_interleave(torch.arange(self.num_classes, device=device),
                                        torch.tensor(self.counts, device=device),
                                        output_size=self.total)  # [K]: each keypoint's class (sized: meta device)
        owner = torch.cat([owner.new_full((1,), -1), owner])  # the object query belongs to no class
        return (owner[:, None] == owner[None, :]) | (owner[:, None] < 0) | (owner[None, :] < 0)

    def pad(self, keypoints: torch.Tensor) -> torch.Tensor:
        """[..., K, D] (classes' keypoints one after another) → [..., C_k · K_max, D], zeros in unused slots."""
        active = self.active(keypoints.device).flatten()
        # slot → compact keypoint (the active slots in order), K = the zero row; no indexing by mask: a GPU does not
        # wait for the host
        index = torch.where(active, active.cumsum(0) - 1, self.total)
        zero = keypoints.new_zeros((*keypoints.shape[:-2], 1, keypoints.shape[-1]))
        return torch.cat([keypoints, zero], -2).index_select(-2, index)

    def class_logits(self, keypoints: torch.Tensor, num_classes: int) -> torch.Tensor:
        """Padded keypoints [..., C_k · K_max, 8] → what they add to the class logits, [..., num_classes]: per
        class the sum of channel 7 over its keypoints (0 for classes beyond the schema)."""
        if self.num_classes > num_classes:
            raise ValueError(f"num_keypoints_per_class lists {self.num_classes} classes but the model has "
                             f"{num_classes}: shorten num_keypoints_per_class or raise num_classes")
        contribution = keypoints[..., 7].unflatten(-1, (self.num_classes, self.max_count))
        boost = (contribution * self.active(keypoints.device).to(contribution.dtype)).sum(-1)  # [..., C_k]
        return F.pad(boost, (0, num_classes - self.num_classes))


class KeypointQueryInitializer(nn.Module):
    """The keypoint queries of each object query: K learned queries, LayerNormed and AdaLN-modulated by the object
    query's features (scale, shift, gate from an MLP that starts at zero, so training starts from the learned ones):
    ``queries + gate · out_proj((1 + scale) · LN(queries) + shift)``.

    features [..., dim] → keypoint queries [..., K, out_dim].
    """

    def __init__(self, dim: int, num_keypoints: int, out_dim: int | None = None) -> None:
        super().__init__()
        out_dim = out_dim or dim
        self.queries = nn.Parameter(torch.randn(num_keypoints, out_dim))
        self.query_norm = nn.LayerNorm(out_dim, elementwise_affine=False)
        self.adaLN_modulation = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, out_dim * 3))
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)
        self.out_proj = nn.Linear(out_dim, out_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        scale, shift, gate = self.adaLN_modulation(features[..., None, :]).chunk(3, dim=-1)  # each [..., 1, D]
        modulated = (scale + 1.0) * self.query_norm(self.queries) + shift
        return self.out_proj(modulated) * gate + self.queries


def _projection(dim: int, out_dim: int) -> nn.Module:
    return nn.Linear(dim, out_dim) if out_dim != dim else nn.Identity()


class KeypointLayer(nn.Module):
    """What one decoder layer adds for keypoints, after the object queries' own update (GroupPose's decoder layer):

    1. object query + its keypoint queries: self-attention among the 1 + K (``attention_mask``); the object query
       takes its part back scaled by ``instance_kp_layer_scale`` (1e-6 at the start), each through a residual and
       a LayerNorm;
    2. optionally (``inter_instance_attention``), each keypoint attends to the same keypoint of every object query;
    3. optionally (``cross_attention``), each keypoint query samples the memory by deformable attention around its
       object's reference box;
    4. a ReLU FFN (4 · hidden / divisor wide) on the keypoint queries.

    With ``keypoint_dim`` below ``hidden_dim`` the object query, its position and the memory are projected into
    the keypoint width (``inst_in_proj``, ``inst_pos_in_proj``, ``memory_in_proj``) and back (``inst_out_proj``).
    """

    def __init__(self, hidden_dim: int, keypoint_dim: int, *, num_heads: int, cross_attention_heads: int,
                 num_levels: int, num_points: int, dim_feedforward: int, dropout: float = 0.0,
                 cross_attention: bool = True, inter_instance_attention: bool = False) -> None:
        super().__init__()
        self.cross_attention, self.inter_instance_attention = cross_attention, inter_instance_attention
        self.inst_in_proj = _projection(hidden_dim, keypoint_dim)
        self.inst_pos_in_proj = _projection(hidden_dim, keypoint_dim)
        self.inst_out_proj = _projection(keypoint_dim, hidden_dim)
        self.memory_in_proj = _projection(hidden_dim, keypoint_dim)
        self.kp_inst_self_attn = MultiheadAttention(keypoint_dim, num_heads, dropout=dropout)
        self.kp_inst_norm = nn.LayerNorm(hidden_dim)
        self.kp_norm = nn.LayerNorm(keypoint_dim)
        if inter_instance_attention:
            self.inter_inst_kp_attn = MultiheadAttention(keypoint_dim, cross_attention_heads, dropout=dropout)
            self.inter_inst_kp_norm = nn.LayerNorm(keypoint_dim)
        if cross_attention:
            self.kp_cross_attn = MultiScaleDeformableAttention(keypoint_dim, cross_attention_heads, num_levels,
                                                               num_points)
            self.kp_cross_attn_norm = nn.LayerNorm(keypoint_dim)
        self.kp_linear1 = nn.Linear(keypoint_dim, dim_feedforward)
        self.kp_linear3 = nn.Linear(dim_feedforward, keypoint_dim)
        self.kp_norm5 = nn.LayerNorm(keypoint_dim)
        self.instance_kp_layer_scale = nn.Parameter(torch.full((1,), 1e-6))
        self.dropout = nn.Dropout(dropout)

    def forward(self, target: torch.Tensor, query_pos: torch.Tensor, keypoints: torch.Tensor,
                keypoint_pos: torch.Tensor, attention_mask: torch.Tensor, reference_boxes: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, padding_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """target, query_pos [B, Q, C]: the object queries after the decoder layer, and their positions;
        keypoints [B, Q, K, D], keypoint_pos [K, D]; attention_mask bool [1 + K, 1 + K] (True = may attend:
        :meth:`KeypointSchema.attention_mask`); reference_boxes [B, Q, L, 4] cxcywh in [0, 1] (one box per level);
        memory [B, S, C] (the levels flattened), padding_mask bool [B, S] (True = padding) →
        (target [B, Q, C], keypoints [B, Q, K, D])."""
        batch, queries, count, dim = keypoints.shape
        instance = self.inst_in_proj(target)  # [B, Q, D]
        instance_pos = self.inst_pos_in_proj(query_pos)
        # 1. the object query (position 0) and its keypoint queries, per object query
        tokens = torch.cat([instance[:, :, None], keypoints], 2).flatten(0, 1)  # [B·Q, 1 + K, D]
        positions = torch.cat([torch.zeros_like(instance[:, :, None]),
                               keypoint_pos.expand(batch, queries, count, dim)], 2).flatten(0, 1)
        attended = self.kp_inst_self_attn(tokens + positions, tokens + positions, tokens, attention_mask)[0]
        attended = attended.view(batch, queries, 1 + count, dim)
        target = self.kp_inst_norm(target + self.dropout(self.inst_out_proj(attended[:, :, 0]))
                                   * self.instance_kp_layer_scale)
        keypoints = self.kp_norm(keypoints + self.dropout(attended[:, :, 1:]))
        if self.inter_instance_attention:  # 2. keypoint k of every object query (all groups together, as the authors)
            swapped = keypoints.transpose(1, 2).reshape(batch * count, queries, dim)
            query = swapped + instance_pos[:, None].expand(batch, count, queries, dim).reshape(batch * count,
                                                                                                queries, dim)
            across = self.inter_inst_kp_attn(query, query, swapped)[0].view(batch, count, queries, dim)
            keypoints = self.inter_inst_kp_norm(keypoints + self.dropout(across.transpose(1, 2)))
        if self.cross_attention:  # 3. sample the memory around the object's box
            query = (keypoints + instance_pos[:, :, None]).reshape(batch, queries * count, dim)
            boxes = reference_boxes[:, :, None].expand(-1, -1, count, -1, -1).flatten(1, 2)  # [B, Q·K, L, 4]
            sampled = self.kp_cross_attn(query, boxes, self.memory_in_proj(memory), spatial_shapes, padding_mask)[0]
            keypoints = self.kp_cross_attn_norm(keypoints + self.dropout(sampled.view(batch, queries, count, dim)))
        ffn = self.kp_linear3(self.dropout(F.relu(self.kp_linear1(keypoints))))  # 4.
        return target, self.kp_norm5(keypoints + self.dropout(ffn))


def place_keypoints(deltas: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """deltas [..., K, 8] from the predictor, boxes [..., 4] cxcywh → keypoints [..., K, 8] with x, y =
    centre + delta · size (LW-DETR's box parameterisation, per keypoint); the other channels as predicted. Non-finite
    deltas become 0 first (the package since 1.9): a NaN times the box size would poison the box's gradient, which the
    box head shares."""
    deltas = torch.nan_to_num(deltas, nan=0.0, posinf=0.0, neginf=0.0)
    xy = deltas[..., :2] * boxes[..., None, 2:] + boxes[..., None, :2]
    return torch.cat([xy, deltas[..., 2:]], -1)


class KeypointHead(nn.Module):
    """Everything a decoder declares for GroupPose keypoints (see the module's docstring): the schema, the keypoint
    queries' start (``query_initializer``) and positions (``keypoint_pos_embed``), one :class:`KeypointLayer` per
    decoder layer (``layers``), the predictor of the 8 channels (``predictor``: MLP K-dim → K-dim → 8, last layer
    zero at the start) and, for a two-stage model, the encoder proposals' (``encoder_query_initializer``, one
    ``encoder_predictors`` per query group).

    Args:
        num_keypoints_per_class: per class id its keypoint count (:class:`KeypointSchema`).
        hidden_dim: C, the decoder's width. num_layers: decoder layers. num_heads, cross_attention_heads: the
            decoder's self- and cross-attention heads (divided by ``dim_divisor``, at least 1).
        num_levels, num_points: the deformable cross-attention's. dim_divisor: keypoint width C / divisor (the
            package's ``grouppose_keypoint_dim_downscale``, 1). dropout: 0.
        cross_attention: keypoint deformable cross-attention (True). inter_instance_attention: keypoint attention
            across object queries (False). num_groups: Group DETR's query groups (encoder predictors). encoder: the
            two-stage proposals' keypoints (True).
    """

    def __init__(self, num_keypoints_per_class: Sequence[int], *, hidden_dim: int, num_layers: int, num_heads: int,
                 cross_attention_heads: int, num_levels: int, num_points: int = 4, dim_divisor: int = 1,
                 dropout: float = 0.0, cross_attention: bool = True, inter_instance_attention: bool = False,
                 num_groups: int = 1, encoder: bool = True) -> None:
        super().__init__()
        self.schema = KeypointSchema(tuple(num_keypoints_per_class))
        dim = hidden_dim // dim_divisor
        self.query_initializer = KeypointQueryInitializer(hidden_dim, self.schema.total, dim)
        self.keypoint_pos_embed = nn.Parameter(torch.randn(self.schema.total, dim))
        self.layers = nn.ModuleList(
            KeypointLayer(hidden_dim, dim, num_heads=max(1, num_heads // dim_divisor),
                          cross_attention_heads=max(1, cross_attention_heads // dim_divisor), num_levels=num_levels,
                          num_points=num_points, dim_feedforward=hidden_dim * 4 // dim_divisor, dropout=dropout,
                          cross_attention=cross_attention, inter_instance_attention=inter_instance_attention)
            for _ in range(num_layers))
        self.predictor = MLP(dim, dim, KEYPOINT_CHANNELS, 3)
        if encoder:
            self.encoder_query_initializer = KeypointQueryInitializer(hidden_dim, self.schema.total, dim)
            self.encoder_predictors = nn.ModuleList(MLP(dim, dim, KEYPOINT_CHANNELS, 3) for _ in range(num_groups))
        self.register_buffer("attention_mask", self.schema.attention_mask(), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The package's start: Xavier-uniform for every matrix of the keypoint queries and layers (its
        transformer's reset), deformable attention's own, the predictors' last layer at zero (keypoints at the
        box centre, precision 1, logits 0)."""
        for module in (self.query_initializer, getattr(self, "encoder_query_initializer", None), self.layers):
            for parameter in module.parameters() if module is not None else ():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        nn.init.xavier_uniform_(self.keypoint_pos_embed)
        for module in self.layers.modules():
            if isinstance(module, MultiScaleDeformableAttention):
                module.reset_parameters()
        for predictor in (self.predictor, *getattr(self, "encoder_predictors", ())):
            nn.init.zeros_(predictor.layers[-1].weight)
            nn.init.zeros_(predictor.layers[-1].bias)

    def start(self, target: torch.Tensor) -> torch.Tensor:
        """The object queries' content [B, Q, C] → their keypoint queries [B, Q, K, C / divisor]."""
        return self.query_initializer(target)

    def layer(self, index: int, target: torch.Tensor, query_pos: torch.Tensor, keypoints: torch.Tensor,
              reference_boxes: torch.Tensor, memory: torch.Tensor, spatial_shapes: SpatialShapes,
              padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer ``index``'s keypoint update (:class:`KeypointLayer`, arguments as its ``forward``)."""
        return self.layers[index](target, query_pos, keypoints, self.keypoint_pos_embed, self.attention_mask,
                                  reference_boxes, memory, spatial_shapes, padding_mask)

    def predict(self, keypoints: torch.Tensor, reference_boxes: torch.Tensor) -> torch.Tensor:
        """Keypoint queries [..., B, Q, K, D] (e.g. every layer's, stacked) and the boxes they are relative to
        [..., B, Q, 4] (cxcywh, normalised; broadcast over layers) → padded keypoints [..., B, Q, C_k · K_max, 8]."""
        return self.schema.pad(place_keypoints(self.predictor(keypoints), reference_boxes))

    def encoder_keypoints(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """The selected proposals' features [B, G · Q, C] and boxes [B, G · Q, 4] (cxcywh, with their gradient)
        → padded keypoints [B, G · Q, C_k · K_max, 8], group g read by ``encoder_predictors[g]`` in training; in
        evaluation (one group) predictor 0 reads them all, as the package since 1.11 (1.8.0 cut the one group's
        proposals into G chunks, one per predictor)."""
        if not hasattr(self, "encoder_predictors"):
            raise ValueError("this KeypointHead was built with encoder=False: it has no encoder predictors")
        queries = self.encoder_query_initializer(features)  # [B, G·Q, K, D]
        count = len(self.encoder_predictors) if self.training else 1
        chunks = zip(queries.chunk(count, 1), boxes.chunk(count, 1), self.encoder_predictors)
        return self.schema.pad(torch.cat([place_keypoints(predictor(q), b) for q, b, predictor in chunks], 1))
