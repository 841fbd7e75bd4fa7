"""Post-processing of a grounding model's outputs (Grounding DINO): boxes, scores and the phrase of the prompt
each box was found for, as transformers' ``GroundingDinoProcessor.post_process_grounded_object_detection``.

A query's score is its best token's sigmoid score; a query is kept above ``threshold``; its phrase is the prompt's
tokens whose score is above ``text_threshold`` (the first token, [CLS], and the last column excluded), decoded by
the tokenizer. Boxes go from normalised cxcywh to pixel xyxy of each image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision.ops import box_convert


@dataclass
class GroundedDetections:
    """One image's detections: boxes float32 [K, 4] pixel xyxy (normalised if no size was given), scores [K],
    phrases: the prompt's words each box was found for (K strings)."""

    boxes: Tensor
    scores: Tensor
    phrases: list[str]


def check_thresholds(threshold: float, text_threshold: float) -> None:
    """Raise ValueError unless both thresholds are scores in [0, 1]."""
    for name, value in (("threshold", threshold), ("text_threshold", text_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} {value} is not a score: pass a value in [0, 1]")


def grounded_detections(logits: Tensor, boxes: Tensor, input_ids: Tensor, decode: Callable[[list[int]], str], *,
                        threshold: float = 0.25, text_threshold: float = 0.25,
                        image_sizes: Sequence[tuple[int, int]] | None = None) -> list[GroundedDetections]:
    """logits [B, Q, T] (per prompt token, −inf at padding), boxes [B, Q, 4] normalised cxcywh, input_ids [B, N]
    (N ≤ T: the tokens the logits were made for), decode: token ids → text (a tokenizer's ``decode``),
    image_sizes: (height, width) per image for pixel boxes → one :class:`GroundedDetections` per image."""
    check_thresholds(threshold, text_threshold)
    if image_sizes is not None and len(image_sizes) != len(logits):
        raise ValueError(f"{len(image_sizes)} image sizes for a batch of {len(logits)} images: pass one per image")
    probabilities = logits.float().sigmoid()  # [B, Q, T]
    scores = probabilities.max(-1).values
    xyxy = box_convert(boxes.float(), "cxcywh", "xyxy")
    results = []
    for index in range(len(logits)):
        keep = scores[index] > threshold
        image_boxes = xyxy[index][keep]
        if image_sizes is not None:
            height, width = image_sizes[index]
            image_boxes = image_boxes * torch.tensor([width, height, width, height], dtype=image_boxes.dtype,
                                                     device=image_boxes.device)
        tokens = probabilities[index][keep] > text_threshold  # [K, T]
        tokens[:, 0] = False  # [CLS]
        tokens[:, -1] = False  # transformers' last column
        ids = input_ids[index].tolist()
        phrases = [decode([ids[position] for position in row.nonzero().flatten().tolist() if position < len(ids)])
                   for row in tokens]
        results.append(GroundedDetections(image_boxes, scores[index][keep], phrases))
    return results
