"""DETR's encoder–decoder transformer (paper §3.2 and Fig. 10; the authors' models/transformer.py).

Tensors are batch-first inside this module: sequences are [B, N, C]. Parameter names match
``torch.nn.MultiheadAttention`` and the authors' layers, so released checkpoints load unchanged.
Attention runs through ``scaled_dot_product_attention`` (:class:`detr.models.layers.attention.MultiheadAttention`);
explicit attention weights are computed only for the layers whose maps a caller asked for.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.attention import Dropout, MultiheadAttention


def _with_pos(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    return x if pos is None else x + pos


class TransformerEncoderLayer(nn.Module):
    """Self-attention (q = k = src + pos, v = src) and FFN, post-norm (paper) or pre-norm; the FFN's
    ``activation`` is ReLU (the paper's) or another (RT-DETR's encoder: GELU)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 pre_norm: bool = False, activation: Callable[[torch.Tensor], torch.Tensor] = F.relu) -> None:
        super().__init__()
        self.activation = activation
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout, self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.pre_norm = pre_norm

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(self, src: torch.Tensor, pos: torch.Tensor, attn_mask: torch.Tensor | None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """src, pos [B, HW, C]; attn_mask bool [B, 1, 1, HW] (True = real pixel) → src [B, HW, C], weights."""
        if self.pre_norm:
            x = self.norm1(src)
            q = k = _with_pos(x, pos)
            out, weights = self.self_attn(q, k, x, attn_mask, need_weights)
            src = src + self.dropout1(out)
            return src + self.dropout2(self._ffn(self.norm2(src))), weights
        q = k = _with_pos(src, pos)
        out, weights = self.self_attn(q, k, src, attn_mask, need_weights)
        src = self.norm1(src + self.dropout1(out))
        return self.norm2(src + self.dropout2(self._ffn(src))), weights


class TransformerDecoderLayer(nn.Module):
    """Self-attention among queries, cross-attention to the encoder memory, FFN."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 pre_norm: bool = False) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.pre_norm = pre_norm

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None,
                pos: torch.Tensor, query_pos: torch.Tensor, self_attn_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tgt, query_pos [B, Q, C]; memory, pos [B, HW, C]; memory_mask bool [B, 1, 1, HW] (True = real);
        self_attn_mask bool [Q, Q] (True = may attend) or None → tgt [B, Q, C], cross-attention
        weights [B, heads, Q, HW] if need_weights."""
        if self.pre_norm:
            x = self.norm1(tgt)
            q = k = _with_pos(x, query_pos)
            tgt = tgt + self.dropout1(self.self_attn(q, k, x, self_attn_mask)[0])
            x = self.norm2(tgt)
            out, weights = self.multihead_attn(_with_pos(x, query_pos), _with_pos(memory, pos), memory,
                                               memory_mask, need_weights)
            tgt = tgt + self.dropout2(out)
            return tgt + self.dropout3(self._ffn(self.norm3(tgt))), weights
        q = k = _with_pos(tgt, query_pos)
        tgt = self.norm1(tgt + self.dropout1(self.self_attn(q, k, tgt, self_attn_mask)[0]))
        out, weights = self.multihead_attn(_with_pos(tgt, query_pos), _with_pos(memory, pos), memory,
                                           memory_mask, need_weights)
        tgt = self.norm2(tgt + self.dropout2(out))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt))), weights


def _clones(module: nn.Module, n: int) -> nn.ModuleList:
    return nn.ModuleList(copy.deepcopy(module) for _ in range(n))


class TransformerEncoder(nn.Module):
    def __init__(self, layer: TransformerEncoderLayer, num_layers: int, norm: nn.Module | None) -> None:
        super().__init__()
        self.layers = _clones(layer, num_layers)
        self.norm = norm  # only with pre-norm (the authors' layout)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, attn_mask: torch.Tensor | None,
                return_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """→ memory [B, HW, C] and the last layer's self-attention [B, heads, HW, HW] if asked."""
        weights = None
        for index, layer in enumerate(self.layers):
            last = index == len(self.layers) - 1
            src, layer_weights = layer(src, pos, attn_mask, need_weights=return_attention and last)
            if layer_weights is not None:
                weights = layer_weights
        if self.norm is not None:
            src = self.norm(src)
        return src, weights


class TransformerDecoder(nn.Module):
    def __init__(self, layer: TransformerDecoderLayer, num_layers: int, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.layers = _clones(layer, num_layers)
        self.norm = norm

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None,
                pos: torch.Tensor, query_pos: torch.Tensor, self_attn_mask: torch.Tensor | None = None,
                return_attention: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """→ hs [L, B, Q, C], every layer's output through the shared final norm, and (if asked) each
        layer's cross-attention weights [B, heads, Q, HW]."""
        outputs, weights = [], []
        for layer in self.layers:
            tgt, layer_weights = layer(tgt, memory, memory_mask, pos, query_pos, self_attn_mask, return_attention)
            outputs.append(self.norm(tgt))
            if layer_weights is not None:
                weights.append(layer_weights)
        return torch.stack(outputs), weights


def xavier_init_(module: nn.Module) -> None:
    """The authors' transformer init: Xavier-uniform for every weight matrix, in registration order."""
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)


def flatten_feature_map(src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The encoder's inputs from a feature map: src [B, C, h, w] projected features, mask bool [B, h, w]
    (True = padding), pos [B, C, h, w] → src [B, HW, C], pos [B, HW, C] and the key mask bool [B, 1, 1, HW]
    (True = real pixel; None when nothing is padded), which every attention over the memory takes."""
    src = src.flatten(2).transpose(1, 2)  # [B, HW, C]
    pos = pos.flatten(2).transpose(1, 2).to(src.dtype)
    key_padding = mask.flatten(1)  # [B, HW]
    # One mask for every layer; None when nothing is padded lets SDPA pick its fastest kernel. An
    # exported graph (ONNX, torch.export) always keeps the mask: that branch depends on the data, and
    # one graph must serve padded and unpadded batches alike (an all-real mask changes nothing).
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.6
    exporting = (is_exporting is not None and is_exporting()) or torch.jit.is_tracing()
    attn_mask = None if not exporting and not key_padding.any() else ~key_padding[:, None, None, :]
    return src, pos, attn_mask


class FeatureMapTransformer(nn.Module):
    """What the single-scale transformers share (:class:`Transformer`, DAB-DETR's
    :class:`detr.models.anchor.decoder.AnchorTransformer`): an ``encoder`` (:class:`TransformerEncoder`) over the
    flattened feature map, run by :meth:`encode`, and a ``decoder``."""

    encoder: TransformerEncoder

    def encode(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, return_attention: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """src [B, C, h, w] projected features, mask bool [B, h, w] (True = padding), pos [B, C, h, w] →
        memory [B, HW, C], pos [B, HW, C], the key mask bool [B, 1, 1, HW] (True = real pixel; None when
        nothing is padded) and, if asked, the last encoder layer's attention [B, heads, HW, HW]."""
        src, pos, attn_mask = flatten_feature_map(src, mask, pos)
        memory, encoder_attention = self.encoder(src, pos, attn_mask, return_attention)
        return memory, pos, attn_mask, encoder_attention


class Transformer(FeatureMapTransformer):
    """Encoder over the flattened feature map, decoder over the object queries (paper Fig. 10)."""

    def __init__(self, d_model: int = 256, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 pre_norm: bool = False) -> None:
        super().__init__()
        if num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers must be at least 1, got {num_decoder_layers}")
        encoder_layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, pre_norm)
        self.encoder = TransformerEncoder(encoder_layer, num_encoder_layers, nn.LayerNorm(d_model) if pre_norm else None)
        decoder_layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, pre_norm)
        self.decoder = TransformerDecoder(decoder_layer, num_decoder_layers, nn.LayerNorm(d_model))
        self.d_model, self.nhead = d_model, nhead
        xavier_init_(self)

    def forward(self, src: torch.Tensor, mask: torch.Tensor, query_embed: torch.Tensor, pos: torch.Tensor,
                return_attention: bool = False) -> dict[str, torch.Tensor | list[torch.Tensor] | None]:
        """src [B, C, h, w] projected features, mask bool [B, h, w] (True = padding), query_embed [Q, C],
        pos [B, C, h, w]. Returns hs [L, B, Q, C], memory [B, HW, C], and when asked
        encoder_attention [B, heads, HW, HW] and decoder_attention (list of L [B, heads, Q, HW])."""
        batch = src.shape[0]
        memory, pos, attn_mask, encoder_attention = self.encode(src, mask, pos, return_attention)
        query_pos = query_embed.unsqueeze(0).expand(batch, -1, -1).to(src.dtype)
        tgt = torch.zeros_like(query_pos)
        hs, decoder_attention = self.decoder(tgt, memory, attn_mask, pos, query_pos, None, return_attention)
        return {"hs": hs, "memory": memory, "encoder_attention": encoder_attention,
                "decoder_attention": decoder_attention}
