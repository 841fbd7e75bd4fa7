"""The feature enhancer's image-text fusion (Grounding DINO §3.2, Fig. 3): bi-directional cross-attention, in
which every image position attends to the prompt's tokens and every token to the image, with one set of
attention logits read both ways.

Names are the authors' (IDEA-Research/GroundingDINO ``BiMultiHeadAttention``, ``BiAttentionBlock``): ``v`` the
vision side, ``l`` the language side.
"""

from __future__ import annotations

import torch
from torch import nn

#: The authors clamp the attention logits to ±this before the softmax (their half-precision guard).
_LOGIT_CLAMP = 50000.0


def drop_path(x: torch.Tensor, probability: float, training: bool) -> torch.Tensor:
    """Stochastic depth: each sample's branch dropped with ``probability`` in training, the rest scaled up."""
    if probability == 0.0 or not training:
        return x
    keep = 1.0 - probability
    mask = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device).add_(keep).floor_()
    return x / keep * mask


class BiMultiHeadAttention(nn.Module):
    """Image → text and text → image attention from one product of image queries and text keys.

    Args:
        vision_dim, text_dim: the two sides' widths (both C). embed_dim: the attention's width E (the released
            models: the encoder's FFN width / 2). num_heads: H (E must divide by it).
    """

    def __init__(self, vision_dim: int, text_dim: int, embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"the fusion's width {embed_dim} must divide by its heads {num_heads}")
        self.num_heads, self.head_dim, self.dropout = num_heads, embed_dim // num_heads, dropout
        self.v_proj = nn.Linear(vision_dim, embed_dim)
        self.l_proj = nn.Linear(text_dim, embed_dim)
        self.values_v_proj = nn.Linear(vision_dim, embed_dim)
        self.values_l_proj = nn.Linear(text_dim, embed_dim)
        self.out_v_proj = nn.Linear(embed_dim, vision_dim)
        self.out_l_proj = nn.Linear(embed_dim, text_dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, E] → [B·H, N, E / H]."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2).reshape(
            batch * self.num_heads, length, self.head_dim)

    def _merge(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """[B·H, N, E / H] → [B, N, E]."""
        return x.view(batch, self.num_heads, -1, self.head_dim).transpose(1, 2).flatten(2)

    def forward(self, vision: torch.Tensor, text: torch.Tensor, vision_padding: torch.Tensor | None = None,
                text_padding: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """vision [B, S, C], text [B, N, C]; vision_padding bool [B, S], text_padding bool [B, N] (True = padding,
        never attended to) → the updates of vision [B, S, C] and of text [B, N, C]."""
        batch = vision.shape[0]
        query = self._heads(self.v_proj(vision) * self.head_dim ** -0.5)
        key = self._heads(self.l_proj(text))
        vision_values = self._heads(self.values_v_proj(vision))
        text_values = self._heads(self.values_l_proj(text))
        logits = torch.bmm(query, key.transpose(1, 2))  # [B·H, S, N]
        # the authors subtract the largest logit of the whole batch (a constant to each softmax), then clamp
        logits = (logits - logits.max()).clamp(-_LOGIT_CLAMP, _LOGIT_CLAMP)
        text_logits = logits.transpose(1, 2)
        text_logits = (text_logits - text_logits.max(-1, keepdim=True).values).clamp(-_LOGIT_CLAMP, _LOGIT_CLAMP)
        if vision_padding is not None:
            text_logits = text_logits.masked_fill(vision_padding.repeat_interleave(self.num_heads, 0)[:, None, :],
                                                  float("-inf"))
        if text_padding is not None:
            logits = logits.masked_fill(text_padding.repeat_interleave(self.num_heads, 0)[:, None, :], float("-inf"))
        vision_weights = nn.functional.dropout(logits.softmax(-1), self.dropout, self.training)
        text_weights = nn.functional.dropout(text_logits.softmax(-1), self.dropout, self.training)
        vision_update = self.out_v_proj(self._merge(torch.bmm(vision_weights, text_values), batch))
        text_update = self.out_l_proj(self._merge(torch.bmm(text_weights, vision_values), batch))
        return vision_update, text_update


class BiAttentionBlock(nn.Module):
    """Layer-normalise both sides, attend both ways, add each update scaled by a learned per-channel gain
    (``gamma_v``, ``gamma_l``, starting at 1e-4) through stochastic depth."""

    def __init__(self, hidden_dim: int, embed_dim: int, num_heads: int, *, dropout: float = 0.0,
                 drop_path: float = 0.1, layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.layer_norm_v = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.layer_norm_l = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.attn = BiMultiHeadAttention(hidden_dim, hidden_dim, embed_dim, num_heads, dropout)
        self.drop_path = drop_path
        self.gamma_v = nn.Parameter(torch.full((hidden_dim,), 1e-4))
        self.gamma_l = nn.Parameter(torch.full((hidden_dim,), 1e-4))

    def forward(self, vision: torch.Tensor, text: torch.Tensor, vision_padding: torch.Tensor | None = None,
                text_padding: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """vision [B, S, C], text [B, N, C], paddings bool (True = padding) → fused vision [B, S, C], text [B, N, C]
        (both layer-normalised, then updated)."""
        vision, text = self.layer_norm_v(vision), self.layer_norm_l(text)
        vision_update, text_update = self.attn(vision, text, vision_padding, text_padding)
        vision = vision + drop_path(self.gamma_v * vision_update, self.drop_path, self.training)
        text = text + drop_path(self.gamma_l * text_update, self.drop_path, self.training)
        return vision, text
