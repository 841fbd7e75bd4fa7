"""An independent, deliberately plain DETR written from the paper and the authors' code for parity tests.

It follows the authors' structure literally: sequence-first tensors, ``torch.nn.MultiheadAttention``
(the module the released checkpoints were trained with), positions re-added in every layer, the decoder
norm applied to every intermediate output. It shares the state-dict layout, so the same weights load
into both and the fast implementation in ``detr.models`` must reproduce its outputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sine_position_encoding(mask: torch.Tensor, num_pos_feats: int) -> torch.Tensor:
    """The authors' sine encoding (models/layers/position_encoding.py), written out with loops over channels
    (slow, obviously right)."""
    batch, height, width = mask.shape
    not_mask = (~mask).float()
    y = not_mask.cumsum(1)
    x = not_mask.cumsum(2)
    y = y / (y[:, -1:, :] + 1e-6) * 2 * math.pi
    x = x / (x[:, :, -1:] + 1e-6) * 2 * math.pi
    out = torch.zeros(batch, 2 * num_pos_feats, height, width)
    for i in range(num_pos_feats):
        frequency = 10000 ** (2 * (i // 2) / num_pos_feats)
        trig = torch.sin if i % 2 == 0 else torch.cos
        out[:, i] = trig(y / frequency)
        out[:, num_pos_feats + i] = trig(x / frequency)
    return out


class RefEncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, src, key_padding_mask, pos):
        q = k = src + pos
        src = self.norm1(src + self.self_attn(q, k, value=src, key_padding_mask=key_padding_mask)[0])
        return self.norm2(src + self.linear2(F.relu(self.linear1(src))))


class RefDecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads)
        self.multihead_attn = nn.MultiheadAttention(d, heads)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, tgt, memory, key_padding_mask, pos, query_pos):
        q = k = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(q, k, value=tgt)[0])
        attended, weights = self.multihead_attn(tgt + query_pos, memory + pos, value=memory,
                                                key_padding_mask=key_padding_mask)
        tgt = self.norm2(tgt + attended)
        return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt)))), weights


class RefTransformer(nn.Module):
    def __init__(self, d: int, heads: int, enc: int, dec: int, ffn: int) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(RefEncoderLayer(d, heads, ffn) for _ in range(enc))
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(RefDecoderLayer(d, heads, ffn) for _ in range(dec))
        self.decoder.norm = nn.LayerNorm(d)


class ReferenceDETR(nn.Module):
    """Post-norm DETR, sine encoding; the backbone is borrowed (``backbone``: our Joiner's body)."""

    def __init__(self, body: nn.Module, num_channels: int, d: int, heads: int, enc: int, dec: int, ffn: int,
                 num_queries: int, num_classes: int) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Module())
        self.backbone[0].body = body
        self.transformer = RefTransformer(d, heads, enc, dec, ffn)
        self.class_embed = nn.Linear(d, num_classes + 1)
        self.bbox_embed = nn.Module()
        self.bbox_embed.layers = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)])
        self.query_embed = nn.Embedding(num_queries, d)
        self.input_proj = nn.Conv2d(num_channels, d, 1)
        self.d = d

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor):
        features = images
        for stage in self.backbone[0].body.values():  # the ResNet's stages in order (the authors' body)
            features = stage(features)
        mask = F.interpolate(padding_mask[None].float(), size=features.shape[-2:]).to(torch.bool)[0]
        pos = sine_position_encoding(mask, self.d // 2)
        src = self.input_proj(features)
        batch, channels, height, width = src.shape
        src = src.flatten(2).permute(2, 0, 1)  # [HW, B, C]
        pos = pos.flatten(2).permute(2, 0, 1)
        key_padding_mask = mask.flatten(1)
        query_pos = self.query_embed.weight.unsqueeze(1).repeat(1, batch, 1)  # [Q, B, C]
        memory = src
        for layer in self.transformer.encoder.layers:
            memory = layer(memory, key_padding_mask, pos)
        tgt = torch.zeros_like(query_pos)
        outputs, attention = [], []
        for layer in self.transformer.decoder.layers:
            tgt, weights = layer(tgt, memory, key_padding_mask, pos, query_pos)
            outputs.append(self.transformer.decoder.norm(tgt))
            attention.append(weights)  # [B, Q, HW], averaged over heads by nn.MultiheadAttention
        hs = torch.stack(outputs).transpose(1, 2)  # [L, B, Q, C]
        x = hs
        for index, linear in enumerate(self.bbox_embed.layers):
            x = linear(x) if index == 2 else F.relu(linear(x))
        return {"pred_logits": self.class_embed(hs), "pred_boxes": x.sigmoid(),
                "decoder_attention": torch.stack(attention).unflatten(-1, (height, width)),
                "hs": hs, "memory": memory}  # memory [HW, B, C], for the mask head's reference
