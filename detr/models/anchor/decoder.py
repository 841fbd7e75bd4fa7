"""Anchor-box queries with conditional spatial cross-attention and layer-by-layer box refinement.

DAB-DETR (Liu et al., "DAB-DETR: Dynamic Anchor Boxes are Better Queries for DETR", ICLR 2022), which
builds on Conditional DETR (Meng et al., ICCV 2021). Each object query carries a learned anchor box
(x, y, w, h), stored as logits (inverse sigmoid). In every decoder layer:

- the positional query is ``ref_point_head(sine(anchor))``, an MLP of the anchor's sine embedding;
- self-attention: q = Wqc·content + Wqp·pos_query, k = Wkc·content + Wkp·pos_query, v = Wv·content;
- cross-attention is *conditional*: each head's query is the concatenation [content part, spatial part]
  and each key [memory part, position part], so content and position are matched separately. The
  spatial part is the x/y sine embedding of the anchor, scaled element-wise by ``query_scale(content)``
  (from layer 2 on) and modulated by the anchor size: the x channels by w_ref / w and the y channels by
  h_ref / h, with (w_ref, h_ref) = sigmoid(ref_anchor_head(content)) (DAB-DETR's "modulated attention");
  layer 1 also adds Wqp·pos_query to the content query (Conditional DETR);
- after the layer, the shared box head predicts a delta in inverse-sigmoid space:
  ``box = sigmoid(box_head(norm(out)) + inverse_sigmoid(anchor))``, and that box is the next layer's
  anchor. The anchor fed to the next layer is detached; the anchor *added* to the next delta keeps the
  gradient of one layer ("look forward twice"), exactly as the released DAB-DETR code does.

Tensors are batch-first [B, N, C]. The encoder is DETR's own: :class:`AnchorTransformer` holds it
beside this decoder.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.layers.attention import Dropout, attention_with_weights, fused_attention
from detr.models.layers.mlp import MLP
from detr.models.layers.position_encoding import sine_embedding
from detr.models.transformer import FeatureMapTransformer, TransformerEncoder, xavier_init_


def anchor_sine_embedding(boxes: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """Sine embedding of normalised boxes, DETR's sine encoding applied to each coordinate.

    boxes float [..., 4] normalised cxcywh → float [..., 4 · num_feats], ordered (y, x, w, h) as DAB-DETR
    (y first, like :class:`detr.models.layers.position_encoding.PositionEmbeddingSine`, so the x/y half lines up
    with the key positions). Each coordinate is scaled by 2π; channel i uses frequency
    ``temperature ** (2 ⌊i/2⌋ / num_feats)``, sin on even and cos on odd channels (interleaved).
    """
    embedding = sine_embedding(boxes.float() * (2 * math.pi), num_feats, temperature)  # [..., 4, F]
    x, y, w, h = embedding.unbind(-2)
    return torch.cat((y, x, w, h), dim=-1).to(boxes.dtype)




def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, attn_mask: torch.Tensor | None,
            dropout: float, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention on already projected inputs: q [B, Lq, Dqk], k [B, Lk, Dqk], v [B, Lk, Dv]
    (Dqk may differ from Dv: conditional cross-attention concatenates two parts per head). attn_mask bool
    broadcastable to [B, heads, Lq, Lk], True = may attend. Scale 1 / sqrt(Dqk / heads).
    Returns [B, Lq, Dv] and, if asked, the weights [B, heads, Lq, Lk] (softmax, before dropout)."""
    batch, len_q, _ = q.shape
    q = q.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # [B, h, Lq, dqk]
    k = k.unflatten(-1, (num_heads, -1)).transpose(1, 2)
    v = v.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # [B, h, Lk, dv]
    weights = None
    if need_weights:
        out, weights = attention_with_weights(q, k, v, attn_mask, dropout)
    elif v.shape[-1] < q.shape[-1]:
        # PyTorch's fused CPU kernel wants one head size for q, k and v; otherwise SDPA takes its slower
        # unfused path.
        # Zero columns in v add zero columns to the output, sliced off again: the same numbers.
        dv = v.shape[-1]
        out = fused_attention(q, k, F.pad(v, (0, q.shape[-1] - dv)), attn_mask, dropout)[..., :dv]
    else:
        out = fused_attention(q, k, v, attn_mask, dropout)
    return out.transpose(1, 2).reshape(batch, len_q, -1), weights


class AnchorDecoderLayer(nn.Module):
    """One DAB-DETR decoder layer (post-norm): self-attention with separate content and position
    projections, conditional cross-attention, FFN. ``first`` layers also add the positional query to the
    cross-attention content query (``ca_qpos_proj``; Conditional DETR keeps it in layer 1 only)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, *,
                 first: bool = False) -> None:
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"hidden_dim ({d_model}) must be divisible by num_heads ({nhead})")
        self.nhead, self.attention_dropout = nhead, dropout
        self.sa_qcontent_proj, self.sa_qpos_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.sa_kcontent_proj, self.sa_kpos_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.sa_v_proj, self.sa_out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.ca_qcontent_proj = nn.Linear(d_model, d_model)
        self.ca_qpos_proj = nn.Linear(d_model, d_model) if first else None
        self.ca_kcontent_proj, self.ca_kpos_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.ca_v_proj, self.ca_qpos_sine_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.ca_out_proj = nn.Linear(d_model, d_model)
        self.linear1, self.linear2 = nn.Linear(d_model, dim_feedforward), nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None, pos: torch.Tensor,
                query_pos: torch.Tensor, query_spatial: torch.Tensor, self_attn_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tgt, query_pos, query_spatial [B, Q, C]; memory, pos [B, HW, C]; memory_mask bool [B, 1, 1, HW]
        (True = real pixel) or None; self_attn_mask bool [Q, Q] (True = may attend) or None.
        Returns tgt [B, Q, C] and, if need_weights, cross-attention weights [B, heads, Q, HW]."""
        dropout = self.attention_dropout if self.training else 0.0
        # Self-attention: content and position projected separately, then summed.
        q = self.sa_qcontent_proj(tgt) + self.sa_qpos_proj(query_pos)
        k = self.sa_kcontent_proj(tgt) + self.sa_kpos_proj(query_pos)
        out, _ = _attend(q, k, self.sa_v_proj(tgt), self.nhead, self_attn_mask, dropout, False)
        tgt = self.norm1(tgt + self.dropout1(self.sa_out_proj(out)))
        # Conditional cross-attention: per head, [content | spatial] against [memory | key position].
        q_content = self.ca_qcontent_proj(tgt)
        k_content, k_pos = self.ca_kcontent_proj(memory), self.ca_kpos_proj(pos)
        if self.ca_qpos_proj is not None:
            q_content = q_content + self.ca_qpos_proj(query_pos)
            k_content = k_content + k_pos
        heads = self.nhead
        q = torch.cat([q_content.unflatten(-1, (heads, -1)),
                       self.ca_qpos_sine_proj(query_spatial).unflatten(-1, (heads, -1))], dim=-1).flatten(-2)
        k = torch.cat([k_content.unflatten(-1, (heads, -1)), k_pos.unflatten(-1, (heads, -1))], dim=-1).flatten(-2)
        out, weights = _attend(q, k, self.ca_v_proj(memory), heads, memory_mask, dropout, need_weights)
        tgt = self.norm2(tgt + self.dropout2(self.ca_out_proj(out)))
        ffn = self.linear2(self.dropout(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(ffn)), weights


def local_attention_selection(hidden_dim: int, num_heads: int, scale: float, num_frequencies: int | None = None
                              ) -> torch.Tensor:
    """The initial weight [C, C] of a projection that starts every attention head as a kernel centred on a box.

    Row ``head · head_dim + i`` selects (× ``scale``) channel i of that head's list: the sin/cos pairs of the
    ``num_frequencies`` highest frequencies of y and then of x in :func:`anchor_sine_embedding`'s and the
    sine position encoding's layout (default: as many as fit in a head); the other rows stay zero. Projecting
    both the query's box and the key's position with it makes each head's logit
    ``scale² Σ_f [cos(ω_f Δy) + cos(ω_f Δx)] / sqrt(head dim)``, largest at the box centre.
    """
    head_dim, half = hidden_dim // num_heads, hidden_dim // 2
    per_head = num_frequencies if num_frequencies is not None else head_dim // 4
    if hidden_dim % num_heads or head_dim < 4 * per_head or per_head > half // 2:
        raise ValueError(f"cannot fit {per_head} frequencies (4 channels each) in a head of {head_dim} channels")
    channels = [c for f in range(per_head) for c in (2 * f, 2 * f + 1, half + 2 * f, half + 2 * f + 1)]
    selection = torch.zeros(hidden_dim, hidden_dim)
    for head in range(num_heads):
        for index, channel in enumerate(channels):
            selection[head * head_dim + index, channel] = scale
    return selection


class AnchorDecoder(nn.Module):
    """DAB-DETR's decoder: anchors in, one refined box per layer out.

    Args:
        d_model, nhead, num_layers, dim_feedforward, dropout: decoder shape.

    Parameters besides the layers: ``ref_point_head`` (MLP 2·C → C → C: anchor sine embedding →
    positional query), ``query_scale`` (MLP C → C → C: content → element-wise scale of the spatial
    query), ``ref_anchor_head`` (MLP C → C → 2: content → reference width and height), ``norm`` (shared
    final LayerNorm, applied to every layer's output before the heads). Weights with more than one
    dimension get Xavier-uniform init (the :class:`AnchorTransformer` that holds this decoder does it).
    """

    def __init__(self, d_model: int, nhead: int, num_layers: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_decoder_layers must be at least 1, got {num_layers}")
        if d_model % 2:
            raise ValueError(f"hidden_dim must be even (half of it encodes each anchor coordinate), got {d_model}")
        layer = AnchorDecoderLayer(d_model, nhead, dim_feedforward, dropout)
        self.layers = nn.ModuleList(
            [AnchorDecoderLayer(d_model, nhead, dim_feedforward, dropout, first=True)]
            + [copy.deepcopy(layer) for _ in range(num_layers - 1)]
        )
        self.ref_point_head = MLP(2 * d_model, d_model, d_model, 2)
        self.query_scale = MLP(d_model, d_model, d_model, 2)
        self.ref_anchor_head = MLP(d_model, d_model, 2, 2)
        self.norm = nn.LayerNorm(d_model)
        self.d_model = d_model

    @torch.no_grad()
    def init_local_spatial_attention(self, scale: float = 4.0, num_frequencies: int | None = None) -> None:
        """Start the spatial half of every cross-attention head as a kernel centred on the query's anchor.

        With Xavier-initialised ``ca_qpos_sine_proj`` and ``ca_kpos_proj`` the spatial logit
        ``(P_q sine(anchor)) · (P_k pos(key))`` is a random bilinear form, so the first cross-attention
        maps are uniform over the image and the queries must first learn where to look. Here both
        projections start as the same channel selection (× ``scale``): each head receives the sin/cos
        pairs of the ``num_frequencies`` highest frequencies of y and of x (default: as many as fit in a
        head), so its spatial logit is ``scale² Σ_f [cos(ω_f Δy) + cos(ω_f Δx)] / sqrt(head dim)``,
        largest where the key position equals the anchor centre; DAB-DETR's w/h modulation then sharpens
        it for small anchors. ``query_scale`` starts at 1 (its last layer: weight 0, bias 1) so later
        layers keep the kernel. Only the initial values change, not the architecture.
        """
        selection = local_attention_selection(self.d_model, self.layers[0].nhead, scale, num_frequencies)
        for layer in self.layers:
            for projection in (layer.ca_qpos_sine_proj, layer.ca_kpos_proj):
                projection.weight.copy_(selection)
                projection.bias.zero_()
        self.query_scale.layers[-1].weight.zero_()
        self.query_scale.layers[-1].bias.fill_(1.0)

    def forward(self, tgt: torch.Tensor, anchors: torch.Tensor, memory: torch.Tensor,
                memory_mask: torch.Tensor | None, pos: torch.Tensor, box_head: nn.Module,
                self_attn_mask: torch.Tensor | None = None, return_attention: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Decode ``Q`` queries.

        Args:
            tgt: float [B, Q, C] initial content queries (zeros, or label embeddings with denoising).
            anchors: float [B, Q, 4] initial anchors as logits of normalised cxcywh.
            memory, pos: float [B, HW, C] encoder output and key positions.
            memory_mask: bool [B, 1, 1, HW], True = real pixel, or None (no padding).
            box_head: module C → 4 (the model's shared box MLP) predicting the inverse-sigmoid delta.
            self_attn_mask: bool [Q, Q], True = may attend (denoising groups), or None.
            return_attention: also return each layer's cross-attention weights.

        Returns hs float [L, B, Q, C] (every layer's output through ``norm``), boxes float [L, B, Q, 4]
        normalised cxcywh (layer l's refined box), and a list of L cross-attention weights
        [B, heads, Q, HW] (empty unless asked).
        """
        half = self.d_model // 2
        anchor = anchors.sigmoid()  # layer 1's anchor: gradient reaches the learned anchors
        reference = anchor  # what the layer sees (detached from layer 2 on)
        output, hs, boxes, weights = tgt, [], [], []
        for index, layer in enumerate(self.layers):
            sine = anchor_sine_embedding(reference, half)  # [B, Q, 2C]: (y, x, w, h)
            query_pos = self.ref_point_head(sine)
            spatial = sine[..., : self.d_model]  # the (y, x) half: conditional spatial query
            if index > 0:
                spatial = spatial * self.query_scale(output)
            size_ref = self.ref_anchor_head(output).sigmoid()  # [B, Q, 2] = (w_ref, h_ref)
            spatial = torch.cat([spatial[..., :half] * (size_ref[..., 1] / reference[..., 3]).unsqueeze(-1),
                                 spatial[..., half:] * (size_ref[..., 0] / reference[..., 2]).unsqueeze(-1)], dim=-1)
            output, layer_weights = layer(output, memory, memory_mask, pos, query_pos, spatial, self_attn_mask,
                                          return_attention)
            normed = self.norm(output)
            delta = box_head(normed)  # [B, Q, 4] in inverse-sigmoid space
            boxes.append((delta + inverse_sigmoid(anchor)).sigmoid())
            hs.append(normed)
            if layer_weights is not None:
                weights.append(layer_weights)
            anchor = (delta + inverse_sigmoid(reference.detach())).sigmoid()
            reference = anchor.detach()
        return torch.stack(hs), torch.stack(boxes), weights


class AnchorTransformer(FeatureMapTransformer):
    """DETR's encoder (``encoder``, :class:`detr.models.transformer.TransformerEncoder`, post-norm) and
    DAB-DETR's :class:`AnchorDecoder` (``decoder``): the state-dict layout of the paper's transformer.

    The model runs the two halves itself (:meth:`~detr.models.transformer.FeatureMapTransformer.encode`,
    then ``decoder``): the decoder's queries (the
    denoising queries in training) are made between them. Every weight matrix gets the authors'
    Xavier-uniform init, the encoder's first.
    """

    def __init__(self, encoder: TransformerEncoder, decoder: AnchorDecoder) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.d_model, self.nhead = decoder.d_model, decoder.layers[0].nhead
        xavier_init_(self)
