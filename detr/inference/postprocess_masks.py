"""Mask predictions → instance masks and COCO-format panoptic segmentations (paper §4.4).

- :class:`PostProcessMasks`: one binary mask per query at the original image size (sigmoid > 0.5), to go
  with :class:`detr.inference.postprocess.PostProcess`'s scores, labels and boxes (COCO "segm" results).
- :class:`PostProcessPanoptic`: one id map per image, every pixel given to one confident query, and the
  segments list of COCO's panoptic format (``id``, ``category_id``, ``isthing``, ``area``, ``bbox``).
- :func:`id_map_to_rgb`, :func:`rgb_to_id_map`, :func:`panoptic_png`: the format's PNG encoding,
  id = R + 256·G + 256²·B, 0 = void (unlabelled).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.config import ClassHead
from detr.models.outputs import DetectorOutput


def _sizes(sizes: torch.Tensor | Sequence[Sequence[int]], batch: int, name: str) -> list[tuple[int, int]]:
    sizes = torch.as_tensor(sizes)
    if sizes.shape != (batch, 2):
        raise ValueError(f"{name} must be [B, 2] (height, width) with B = {batch}, got {tuple(sizes.shape)}")
    return [(int(h), int(w)) for h, w in sizes.tolist()]


def upsample_masks(masks: torch.Tensor, size: tuple[int, int], padded_size: tuple[int, int] | None) -> torch.Tensor:
    """One image's mask logits [K, h', w'] at stride 4 of the padded batch → float [K, height, width] at the
    image's processed (model input, unpadded) ``size``, by bilinear interpolation.

    With ``padded_size`` (the batch's padded input size: the largest processed size, since batches are
    padded at the bottom and right to it) the maps are upsampled to it and the image's region is cropped.
    None resizes the whole map to ``size``, as the authors' panoptic evaluation did: the same when nothing is
    padded (batch size 1, or the largest image), a stretched mask for the smaller images of a batch.
    """
    if len(masks) == 0:
        return masks.new_zeros(0, *size, dtype=torch.float32)
    if padded_size is None:
        return F.interpolate(masks[None].float(), size=size, mode="bilinear", align_corners=False)[0]
    full = F.interpolate(masks[None].float(), size=padded_size, mode="bilinear", align_corners=False)[0]
    return full[:, :size[0], :size[1]]


def _nearest_source(in_size: int, out_size: int, device: torch.device) -> torch.Tensor:
    # PIL's scaling loop: the source coordinate of output pixel i is scale/2 + scale + … (i times), summed in
    # double precision one step at a time and truncated; the sum's rounding decides exact pixel borders.
    scale = in_size / out_size
    coordinates = itertools.accumulate(itertools.repeat(scale, out_size - 1), initial=scale * 0.5)
    source = torch.tensor([int(value) for value in coordinates], dtype=torch.int64, device=device)
    return source.clamp_(max=in_size - 1)


def resize_nearest(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest-neighbour resize of an [h, w] map (e.g. segment ids) to ``size``, pixel for pixel as PIL's
    ``Image.resize(..., NEAREST)``, which the authors used for their panoptic PNGs: pixel centres are sampled
    as PIL computes them (it differs from ``F.interpolate(mode="nearest-exact")`` where a centre falls
    exactly on a source pixel border, e.g. 50 → 101 pixels)."""
    rows = _nearest_source(image.shape[0], size[0], image.device)
    cols = _nearest_source(image.shape[1], size[1], image.device)
    return image[rows][:, cols]


def _masks_of(outputs: DetectorOutput) -> torch.Tensor:
    if outputs.masks is None:
        raise ValueError("the outputs hold no masks: masks come from a panoptic model (detr.DETRPanoptic)")
    return outputs.masks


def _padded_size(sizes: list[tuple[int, int]]) -> tuple[int, int]:
    return max(h for h, _ in sizes), max(w for _, w in sizes)


class PostProcessMasks(nn.Module):
    """Instance masks: per query, mask logits upsampled (bilinear) to the processed size, thresholded
    (sigmoid > ``threshold``, 0.5 in the paper), then resized (nearest) to the original image size."""

    def __init__(self, threshold: float = 0.5) -> None:
        super().__init__()
        self.threshold = threshold

    @torch.no_grad()
    def forward(self, outputs: DetectorOutput, processed_sizes: torch.Tensor,
                target_sizes: torch.Tensor) -> list[torch.Tensor]:
        """outputs.masks [B, Q, h', w'] (a panoptic model's output); processed_sizes [B, 2] (height, width) of
        each image as it
        entered the model (before padding); target_sizes [B, 2] of the original images → per image bool
        masks [Q, H, W], in query order (index them like :class:`detr.inference.postprocess.PostProcess`'s results)."""
        pred_masks = _masks_of(outputs)
        processed = _sizes(processed_sizes, len(pred_masks), "processed_sizes")
        targets = _sizes(target_sizes, len(pred_masks), "target_sizes")
        padded = _padded_size(processed)
        return [self.image_masks(masks, size, padded, target)  # one image at a time: Q full-size maps
                for masks, size, target in zip(pred_masks, processed, targets)]

    @torch.no_grad()
    def image_masks(self, masks: torch.Tensor, processed_size: tuple[int, int], padded_size: tuple[int, int],
                    target_size: tuple[int, int]) -> torch.Tensor:
        """One image's mask logits [K, h', w'] (any subset of its queries) → bool [K, H, W] at ``target_size``;
        ``padded_size`` is the batch's padded input size (see :func:`upsample_masks`)."""
        if len(masks) == 0:
            return torch.zeros(0, *target_size, dtype=torch.bool, device=masks.device)
        binary = (upsample_masks(masks, processed_size, padded_size).sigmoid() > self.threshold).float()
        return F.interpolate(binary[None], size=target_size, mode="nearest")[0].bool()


class PostProcessPanoptic(nn.Module):
    """Panoptic segmentation following the authors' rules (paper §4.4).

    Per image:
    1. keep the queries whose most probable class (softmax over every logit) is not "no object" and
       whose probability is above ``threshold`` (0.85); with a sigmoid class head (no "no object"
       logit) the score is the highest class sigmoid, and the query is kept when it is above ``threshold``;
    2. upsample their mask logits (bilinear) to the processed size and give every pixel to the kept
       query with the highest logit there;
    3. pixels of a stuff class predicted by several queries all go to the first of those queries;
    4. resize that id map to the original size (nearest neighbour, as PIL resizes: :func:`resize_nearest`);
    5. while some segment has ``max_small_area`` pixels or fewer (4), drop those queries and redo
       steps 2 and 4 without them (step 3 is the authors' first pass only). A stuff class's extra
       queries own nothing after step 3, so they are dropped here and their pixels go to the
       best remaining query.

    With ``overlap_threshold`` (not the authors' rule; off by default), a filter runs before step 2, as
    Mask2Former's panoptic inference does (Cheng et al., 2022): every pixel goes to the kept query with the
    highest score × mask probability, and a thing query that then owns less than ``overlap_threshold`` of
    its own mask (its pixels of mask probability ≥ 0.5) is dropped. Two queries on one object (a detector
    short of training, or a sigmoid head, which no "no object" class pushes apart) have nearly the same
    mask: the authors' argmax splits its pixels between them, and neither segment then matches the
    object; the filter keeps the higher-scoring one whole.

    Args:
        is_thing: per label, whether the class is a thing (True) or stuff (False); for COCO panoptic:
            :func:`detr.categories.coco_panoptic_is_thing`.
        threshold: class probability a query needs to be kept.
        max_small_area: segments of at most this many pixels (at the original size) are removed.
        category_ids: per label, the data set's category id for ``category_id``; None = the label itself
            (the authors' COCO models use the raw ids as labels). Take it from ``model.meta.category_map``.
        overlap_threshold: None (the authors' rules) or the share of its own mask a thing query must keep
            (Mask2Former: 0.8); see above.
        crop_padding: True crops each image's region from the padded batch's masks; False resizes the
            whole padded map (see :func:`upsample_masks`), which reproduces the authors' evaluation at batch
            sizes above 1.
        class_head: "softmax" (the authors': num_classes + 1 logits, the last = no object) or "sigmoid"
            (num_classes logits scored by independent sigmoids, :class:`detr.loss.focal`'s head). Focal-loss
            scores run lower than softmax probabilities: 0.85 keeps few sigmoid queries (pick the threshold
            on validation PQ; benchmarks/panoptic_shapes.py).

    Results per image: ``id_map`` int64 [H, W] (segment ids from 1 in query order; 0 = void, only when
    no query is kept) and ``segments_info``: a list of {id, category_id, isthing, area, bbox [x, y, w, h]
    in pixels, iscrowd 0, score, label}. :func:`panoptic_png` encodes ``id_map`` as the PNG of COCO's
    panoptic format.
    """

    def __init__(self, is_thing: Sequence[bool], *, threshold: float = 0.85, max_small_area: int = 4,
                 category_ids: Sequence[int] | None = None, crop_padding: bool = True,
                 class_head: ClassHead = "softmax", overlap_threshold: float | None = None) -> None:
        super().__init__()
        if class_head not in ("softmax", "sigmoid"):
            raise ValueError(f"class_head must be 'softmax' or 'sigmoid', got {class_head!r}")
        if overlap_threshold is not None and not 0.0 <= overlap_threshold <= 1.0:
            raise ValueError(f"overlap_threshold must be None or in [0, 1], got {overlap_threshold}")
        self.overlap_threshold = overlap_threshold
        self.class_head = class_head
        self.is_thing = [bool(flag) for flag in is_thing]
        if category_ids is not None and len(category_ids) != len(self.is_thing):
            raise ValueError(f"category_ids ({len(category_ids)}) and is_thing ({len(self.is_thing)}) must both "
                             f"have one entry per label")
        self.category_ids = None if category_ids is None else [int(i) for i in category_ids]
        self.threshold, self.max_small_area, self.crop_padding = threshold, max_small_area, crop_padding

    @torch.no_grad()
    def forward(self, outputs: DetectorOutput, processed_sizes: torch.Tensor,
                target_sizes: torch.Tensor | None = None) -> list[dict[str, Any]]:
        """outputs: a panoptic model's output: logits [B, Q, K + 1] (softmax head) or [B, Q, K] (sigmoid head),
        masks [B, Q, h', w']; processed_sizes [B, 2] (height, width) of each image as it entered the model;
        target_sizes [B, 2] of the original images (default: the processed sizes)."""
        logits, pred_masks = outputs.logits, _masks_of(outputs)
        num_logits = len(self.is_thing) + (1 if self.class_head == "softmax" else 0)
        if logits.shape[-1] != num_logits:
            expected = ("num_classes + 1 (the no-object logit last)" if self.class_head == "softmax"
                        else "num_classes (sigmoid head: no no-object logit)")
            raise ValueError(f"the outputs have {logits.shape[-1]} logits but is_thing covers {len(self.is_thing)} "
                             f"labels: expected {expected}; is class_head={self.class_head!r} the model's?")
        processed = _sizes(processed_sizes, len(logits), "processed_sizes")
        targets = processed if target_sizes is None else _sizes(target_sizes, len(logits), "target_sizes")
        if self.class_head == "softmax":
            probabilities = logits.float().softmax(-1)
            scores, labels = probabilities.max(-1)
            keep = (labels != logits.shape[-1] - 1) & (scores > self.threshold)
        else:
            scores, labels = logits.float().sigmoid().max(-1)
            keep = scores > self.threshold
        results = []
        for image in range(len(logits)):
            kept = keep[image].nonzero().flatten()
            padded = _padded_size(processed) if self.crop_padding else None
            masks = upsample_masks(pred_masks[image, kept], processed[image], padded)  # kept queries only
            results.append(self._segment(masks, labels[image, kept], scores[image, kept], targets[image]))
        return results

    def _segment(self, masks: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor,
                 target_size: tuple[int, int]) -> dict[str, Any]:
        """masks [K, h, w] logits of the kept queries at the processed size → id map and segments."""
        if self.overlap_threshold is not None and len(labels):
            kept = self._not_overlapped(masks, labels, scores)
            masks, labels, scores = masks[kept], labels[kept], scores[kept]
        stuff_first = torch.arange(len(labels), device=masks.device)  # query → query that owns its pixels
        for position, label in enumerate(labels.tolist()):
            if not self.is_thing[label]:
                stuff_first[position] = (labels == label).nonzero()[0, 0]
        index_map = self._index_map(masks, target_size, stuff_first)
        areas = torch.bincount(index_map.flatten(), minlength=len(labels))
        while len(labels):
            small = areas <= self.max_small_area
            if not small.any():
                break
            masks, labels, scores = masks[~small], labels[~small], scores[~small]
            index_map = self._index_map(masks, target_size, None)
            areas = torch.bincount(index_map.flatten(), minlength=len(labels))
        if not len(labels):  # nothing confident: all void
            return {"id_map": torch.zeros(target_size, dtype=torch.int64, device=masks.device), "segments_info": []}
        return {"id_map": index_map + 1, "segments_info": self._segments_info(index_map, labels, scores, areas)}

    def _not_overlapped(self, masks: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """bool [K]: the queries that Mask2Former's overlap filter keeps (class docstring)."""
        probabilities = masks.float().sigmoid()
        owner = (probabilities * scores[:, None, None]).argmax(0)
        own = probabilities >= 0.5
        own_area = own.flatten(1).sum(1)
        owned_area = (own & (owner[None] == torch.arange(len(labels), device=masks.device)[:, None, None])).flatten(1).sum(1)
        is_thing = torch.tensor([self.is_thing[label] for label in labels.tolist()], device=masks.device)
        return ~is_thing | ((own_area > 0) & (owned_area >= self.overlap_threshold * own_area))

    @staticmethod
    def _index_map(masks: torch.Tensor, target_size: tuple[int, int], owner: torch.Tensor | None) -> torch.Tensor:
        """Per pixel of the original image, the position (among the kept queries) of its segment."""
        if len(masks) == 0:
            return torch.zeros(target_size, dtype=torch.int64, device=masks.device)
        index = masks.argmax(0)  # [h, w]
        if owner is not None:
            index = owner[index]
        return resize_nearest(index, target_size)

    def _segments_info(self, index_map: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor,
                       areas: torch.Tensor) -> list[dict[str, Any]]:
        count, (height, width) = len(labels), index_map.shape
        flat = index_map.flatten()
        ys = torch.arange(height, device=flat.device).repeat_interleave(width)
        xs = torch.arange(width, device=flat.device).repeat(height)
        boxes = []
        for coordinate, reduce, start in ((xs, "amin", width), (ys, "amin", height), (xs, "amax", -1),
                                          (ys, "amax", -1)):
            boxes.append(torch.full((count,), start, device=flat.device).scatter_reduce(0, flat, coordinate, reduce))
        x0, y0, x1, y1 = (box.tolist() for box in boxes)
        segments = []
        for position, (label, score, area) in enumerate(zip(labels.tolist(), scores.tolist(), areas.tolist())):
            segments.append({
                "id": position + 1,
                "category_id": label if self.category_ids is None else self.category_ids[label],
                "isthing": self.is_thing[label],
                "area": int(area),
                "bbox": [x0[position], y0[position], x1[position] - x0[position] + 1, y1[position] - y0[position] + 1],
                "iscrowd": 0,
                "score": float(score),
                "label": int(label),
            })
        return segments


def id_map_to_rgb(id_map: torch.Tensor) -> torch.Tensor:
    """int [H, W] segment ids → uint8 [H, W, 3] with id = R + 256·G + 256²·B (COCO panoptic PNG)."""
    id_map = id_map.long()
    if id_map.min() < 0 or id_map.max() >= 256 ** 3:
        raise ValueError("panoptic segment ids must be in [0, 256³)")
    return torch.stack([id_map % 256, id_map // 256 % 256, id_map // 65536], dim=-1).to(torch.uint8)


def rgb_to_id_map(rgb: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W, 3] → int64 [H, W] segment ids (inverse of :func:`id_map_to_rgb`)."""
    rgb = torch.as_tensor(rgb).long()
    return rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]


def panoptic_png(id_map: torch.Tensor) -> bytes:
    """The PNG file (bytes) of COCO's panoptic format for an id map [H, W]."""
    from PIL import Image  # pillow is a dependency; imported here so `import detr` stays light

    buffer = io.BytesIO()
    Image.fromarray(id_map_to_rgb(id_map.cpu()).numpy()).save(buffer, format="PNG")
    return buffer.getvalue()

