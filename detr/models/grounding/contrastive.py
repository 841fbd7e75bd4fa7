"""The contrastive class head (Grounding DINO §3.5): a query's logit for each prompt token is the dot product of
their features, so the classes are whatever the prompt names.

Grounding DINO's logit is q · t; MM-Grounding-DINO's (``scaled_bias``) q · t / √C + b, with a learned bias b
(starting at the focal-loss prior). Tokens that are padding get −inf, and the logits are padded with −inf to
``max_text_len`` columns, so every prompt gives the same shape.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from detr.models.grounding.config import ContrastiveHead


class ContrastiveEmbed(nn.Module):
    """Queries × tokens → logits [B, Q, max_text_len]; parameters: ``bias`` for "scaled_bias", none for "dot"."""

    def __init__(self, max_text_len: int, kind: ContrastiveHead = "dot") -> None:
        super().__init__()
        self.max_text_len, self.kind = max_text_len, kind
        if kind == "scaled_bias":
            self.bias = nn.Parameter(torch.tensor(-math.log((1 - 0.01) / 0.01)))

    def forward(self, queries: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        """queries [B, Q, C], text [B, N, C], text_mask bool [B, N] (True = a real token; N ≤ max_text_len) →
        logits [B, Q, max_text_len], −inf at padding tokens and beyond N."""
        logits = queries @ text.transpose(-1, -2)
        if self.kind == "scaled_bias":
            logits = logits / math.sqrt(queries.shape[-1]) + self.bias
        logits = logits.masked_fill(~text_mask[:, None, :], float("-inf"))
        return nn.functional.pad(logits, (0, self.max_text_len - logits.shape[-1]), value=float("-inf"))
