"""Plain, literal re-statements of the authors' panoptic parts, for parity tests.

- :class:`ReferencePanoptic`: the mask head written per head and per query with explicit loops over the
  ResNet stages, on top of :class:`tests.reference_detr.ReferenceDETR`. Same state-dict layout as
  ``detr.models.segmentation.DETRPanoptic``, so one state dict loads into both.
- :func:`reference_panoptic`: the authors' panoptic post-processing step by step, with PIL's nearest
  resize of an RGB-encoded id image, as their evaluation ran it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from tests.reference_detr import ReferenceDETR


class ReferenceAttentionMap(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.q_linear, self.k_linear = nn.Linear(d, d), nn.Linear(d, d)
        self.heads = heads

    def forward(self, hs, memory, mask):
        """hs [B, Q, C], memory [B, C, h, w], mask [B, h, w] → [B, Q, heads, h, w]."""
        batch, queries, d = hs.shape
        head_dim = d // self.heads
        q = self.q_linear(hs)  # [B, Q, C]
        k = torch.einsum("bchw,oc->bohw", memory, self.k_linear.weight) + self.k_linear.bias[None, :, None, None]
        logits = torch.zeros(batch, queries, self.heads, *memory.shape[-2:])
        for n in range(self.heads):
            part = slice(n * head_dim, (n + 1) * head_dim)
            logits[:, :, n] = torch.einsum("bqc,bchw->bqhw", q[..., part], k[:, part]) / head_dim ** 0.5
        logits = logits.masked_fill(mask[:, None, None], float("-inf"))
        weights = logits.reshape(batch, queries, -1).softmax(-1)  # one softmax over heads and positions
        return weights.reshape(logits.shape)


class ReferenceMaskHead(nn.Module):
    def __init__(self, dim: int, skips: list[int], d: int) -> None:
        super().__init__()
        widths = [dim, d // 2, d // 4, d // 8, d // 16]
        for i in range(5):
            setattr(self, f"lay{i + 1}", nn.Conv2d(widths[max(i - 1, 0)], widths[i], 3, padding=1))  # lay1: dim → dim
            setattr(self, f"gn{i + 1}", nn.GroupNorm(8, widths[i]))
        self.out_lay = nn.Conv2d(widths[4], 1, 3, padding=1)
        for i in range(3):
            setattr(self, f"adapter{i + 1}", nn.Conv2d(skips[i], widths[i + 1], 1))

    def one_query(self, features, attention, skips):
        """features [C, h, w], attention [heads, h, w], skips: layer3, layer2, layer1 of one image."""
        x = torch.cat([features, attention])[None]
        x = F.relu(self.gn1(self.lay1(x)))
        x = F.relu(self.gn2(self.lay2(x)))
        x = self.adapter1(skips[0][None]) + F.interpolate(x, size=skips[0].shape[-2:], mode="nearest")
        x = F.relu(self.gn3(self.lay3(x)))
        x = self.adapter2(skips[1][None]) + F.interpolate(x, size=skips[1].shape[-2:], mode="nearest")
        x = F.relu(self.gn4(self.lay4(x)))
        x = self.adapter3(skips[2][None]) + F.interpolate(x, size=skips[2].shape[-2:], mode="nearest")
        x = F.relu(self.gn5(self.lay5(x)))
        return self.out_lay(x)[0, 0]


class ReferencePanoptic(nn.Module):
    """``detr`` (a ReferenceDETR) + ``bbox_attention`` + ``mask_head``, the authors' layout."""

    def __init__(self, detr: ReferenceDETR, skips: list[int], d: int, heads: int) -> None:
        super().__init__()
        self.detr = detr
        self.bbox_attention = ReferenceAttentionMap(d, heads)
        self.mask_head = ReferenceMaskHead(d + heads, skips, d)

    def forward(self, images, padding_mask):
        out = self.detr(images, padding_mask)
        body = self.detr.backbone[0].body
        x = body.maxpool(body.relu(body.bn1(body.conv1(images))))
        layer1 = body.layer1(x)
        layer2 = body.layer2(layer1)
        layer3 = body.layer3(layer2)
        layer4 = body.layer4(layer3)
        src = self.detr.input_proj(layer4)
        mask = F.interpolate(padding_mask[None].float(), size=src.shape[-2:]).to(torch.bool)[0]
        memory = out["memory"].permute(1, 2, 0).reshape(src.shape)  # [HW, B, C] → [B, C, h, w]
        attention = self.bbox_attention(out["hs"][-1], memory, mask)
        masks = torch.stack([
            torch.stack([self.mask_head.one_query(src[b], attention[b, q], [layer3[b], layer2[b], layer1[b]])
                         for q in range(attention.shape[1])])
            for b in range(len(images))])
        return {"pred_logits": out["pred_logits"][-1], "pred_boxes": out["pred_boxes"][-1], "pred_masks": masks}


def reference_panoptic(logits, masks, processed_size, target_size, is_thing, threshold=0.85):
    """The authors' panoptic post-processing for ONE image, literally. logits [Q, K+1], masks [Q, h', w']
    (one image, unpadded batch), sizes (height, width). Returns (index map int64 [H, W] where the value is
    the kept query's position, segments as (position, label, area)); positions of dropped segments
    never appear."""
    scores, labels = logits.softmax(-1).max(-1)
    keep = (labels != logits.shape[-1] - 1) & (scores > threshold)
    classes = labels[keep]
    if keep.any():
        masks = F.interpolate(masks[keep][None], size=processed_size, mode="bilinear", align_corners=False)[0]
    else:  # empty: the authors' interpolate wrapper returns an empty tensor of the output size
        masks = masks.new_zeros(0, *processed_size)
    height, width = masks.shape[-2:]
    masks = masks.flatten(1)
    stuff_groups = {}
    for k, label in enumerate(classes.tolist()):
        if not is_thing[label]:
            stuff_groups.setdefault(label, []).append(k)

    def ids_and_areas(masks, count, dedup):
        if masks.shape[0] == 0:
            ids = torch.zeros(height, width, dtype=torch.long)
        else:
            ids = masks.transpose(0, 1).softmax(-1).argmax(-1).view(height, width)
        if dedup:
            for group in stuff_groups.values():
                for k in group:
                    ids[ids == k] = group[0]
        rgb = np.zeros((height, width, 3), dtype=np.uint8)
        value = ids.numpy().copy()
        for channel in range(3):
            rgb[..., channel] = value % 256
            value //= 256
        image = Image.fromarray(rgb).resize((target_size[1], target_size[0]), resample=Image.NEAREST)
        rgb = np.asarray(image).astype(np.int64)
        ids = torch.from_numpy(rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2])
        return ids, [int((ids == i).sum()) for i in range(count)]

    ids, areas = ids_and_areas(masks, len(classes), dedup=True)
    if len(classes):
        while True:
            small = torch.tensor([area <= 4 for area in areas], dtype=torch.bool)
            if not small.any():
                break
            classes, masks = classes[~small], masks[~small]
            ids, areas = ids_and_areas(masks, len(classes), dedup=False)
    return ids, [(k, int(label), area) for k, (label, area) in enumerate(zip(classes.tolist(), areas))]
