"""Multi-head attention and dropout, the transformer layers' parts every family shares.

:class:`MultiheadAttention` has ``torch.nn.MultiheadAttention``'s parameters and semantics, batch-first, through
``scaled_dot_product_attention``; the explicit attention weights (:func:`attention_with_weights`) are computed only
when a caller asks for attention maps. :class:`Dropout` is ``nn.Dropout`` with the faster CPU draw of
:func:`detr.models.layers.cpu_kernels.dropout`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from detr.models.layers.cpu_kernels import dropout

#: The fused attention kernels a training step on a GPU may use: all but cuDNN's, whose backward returns NaN
#: gradients for masked attention on Hopper GPUs (H100 / H200) since torch 2.11 (pytorch/pytorch#196678):
#: bf16-mixed training of DETR-R50 diverged within 30 steps on an H200 with it (docs/measurements/gpu.md).
TRAINING_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Dropout(nn.Dropout):
    """``nn.Dropout`` through :func:`dropout` (the same module in a state dict or a printout)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return dropout(input, self.p, self.training)


def attention_with_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                           dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention that also returns its weights, which the fused
    ``F.scaled_dot_product_attention`` cannot (its path for callers that asked for attention maps).

    q [B, heads, Lq, d], k [B, heads, Lk, d], v [B, heads, Lk, dv]; attn_mask bool broadcastable to
    [B, heads, Lq, Lk] with True = may attend, or None; ``dropout_p`` 0 outside training. Scale 1 / sqrt(d).
    Returns the output [B, heads, Lq, dv] and the weights [B, heads, Lq, Lk] (softmax, before dropout).
    """
    logits = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # [B, h, Lq, Lk]
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, float("-inf"))
    weights = logits.softmax(dim=-1)
    return dropout(weights, dropout_p) @ v, weights


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                    dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (arguments as :func:`attention_with_weights`); a GPU training step
    keeps to :data:`TRAINING_SDPA_BACKENDS`. With dropout on the CPU, the explicit attention of
    :func:`attention_with_weights` and its faster :func:`dropout` (SDPA's CPU kernels do not drop, so it would
    run the same explicit attention with torch's Bernoulli draw)."""
    if dropout_p > 0.0 and q.device.type == "cpu":
        return attention_with_weights(q, k, v, attn_mask, dropout_p)[0]
    if q.is_cuda and q.requires_grad:
        with sdpa_kernel(TRAINING_SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


class MultiheadAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters (in_proj_weight [3C, C],
    in_proj_bias [3C], out_proj) and semantics (dropout on the attention weights), batch-first."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"hidden_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, need_weights: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query [B, Lq, C], key/value [B, Lk, C]; attn_mask bool broadcastable to [B, heads, Lq, Lk] with
        True = may attend (SDPA's convention), or None. Returns output [B, Lq, C] and, if need_weights,
        the attention weights [B, heads, Lq, Lk] (softmax, before dropout)."""
        batch, len_q, dim = query.shape
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        heads, head_dim = self.num_heads, dim // self.num_heads
        q = F.linear(query, w_q, b_q).view(batch, len_q, heads, head_dim).transpose(1, 2)  # [B, h, Lq, d]
        k = F.linear(key, w_k, b_k).view(batch, -1, heads, head_dim).transpose(1, 2)  # [B, h, Lk, d]
        v = F.linear(value, w_v, b_v).view(batch, -1, heads, head_dim).transpose(1, 2)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            out, weights = attention_with_weights(q, k, v, attn_mask, dropout_p)
        else:
            out = fused_attention(q, k, v, attn_mask, dropout_p)
        out = out.transpose(1, 2).reshape(batch, len_q, dim)
        return self.out_proj(out), weights
