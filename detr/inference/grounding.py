"""Post-processing of a grounding model's outputs (Grounding DINO): boxes, scores and the phrase of the prompt
each box was found for, as transformers' ``GroundingDinoProcessor.post_process_grounded_object_detection``.

A query's score is its best token's sigmoid score; a query is kept above ``threshold``; its phrase is the prompt's
tokens whose score is above ``text_threshold`` (the first token, [CLS], and the last column excluded), decoded by
the tokenizer. Boxes go from normalised cxcywh to pixel xyxy of each image. Its label is the prompt's phrase
(0-based, phrases separated by "." or "?") that holds its best word, so that a prompt's phrases can be categories.

:func:`prompt_text` writes a prompt as the models were trained to read it, :func:`prompt_phrases` lists its
phrases; :func:`grounded_predictions` turns a batch's outputs into the
:class:`~detr.inference.prediction.Prediction` every command reads, with the phrases as label names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision.ops import box_convert

from detr.inference.prediction import Prediction
from detr.models.grounding.text import DELIMITER_TOKEN_IDS


@dataclass
class GroundedDetections:
    """One image's detections: boxes float32 [K, 4] pixel xyxy (normalised if no size was given), scores [K],
    phrases: the prompt's words each box was found for (K strings), labels int64 [K]: the prompt's phrase that
    holds each box's best word, query_indices int64 [K]: the queries kept."""

    boxes: Tensor
    scores: Tensor
    phrases: list[str]
    labels: Tensor
    query_indices: Tensor


def prompt_text(prompt: str | Sequence[str]) -> str:
    """A prompt as the models read it: a list of phrases joined as "a cat. a remote control." (lower case, as
    transformers' processor joins them), a string kept with a final "." added when it has none."""
    if isinstance(prompt, str):
        text = prompt.strip()
    else:
        if any(not isinstance(phrase, str) or not phrase.strip() for phrase in prompt):
            raise ValueError(f"prompt phrases must be non-empty strings, got {list(prompt)!r}")
        text = ". ".join(phrase.strip().lower() for phrase in prompt)
    if not text:
        raise ValueError("the prompt is empty: name what to detect, e.g. 'a cat. a remote control.'")
    return text if text.endswith((".", "?")) else text + "."


def prompt_phrases(prompt: str | Sequence[str]) -> list[str]:
    """The phrases of a prompt in order, as its detections' labels number them (0-based): "a cat. a remote
    control." → ["a cat", "a remote control"]. Raises ValueError for an empty phrase ("a cat.. a dog.") or one
    named twice: each phrase becomes a category of its own."""
    text = prompt_text(prompt)
    phrases = [phrase.strip() for phrase in re.split(r"[.?]", text)[:-1]]  # the text ends with a delimiter
    if any(not phrase for phrase in phrases):
        raise ValueError(f"the prompt {text!r} has an empty phrase between two delimiters ('.' or '?'): write one "
                         "phrase between each, e.g. 'a cat. a remote control.'")
    repeated = sorted({phrase for phrase in phrases if phrases.count(phrase) > 1})
    if repeated:
        raise ValueError(f"the prompt {text!r} names {repeated[0]!r} twice: name each phrase once")
    return phrases


def token_phrases(input_ids: Tensor) -> Tensor:
    """input_ids int64 [N] → int64 [N]: each token's phrase (0-based, as :func:`phrase_labels` numbers them), -1 for
    the delimiters ([CLS], [SEP], ".", "?")."""
    delimiter = torch.isin(input_ids, torch.tensor(DELIMITER_TOKEN_IDS, device=input_ids.device))
    phrase = torch.cumsum(delimiter.long(), 0) - delimiter.long() - 1
    return phrase.masked_fill(delimiter, -1)


def phrase_labels(probabilities: Tensor, input_ids: Tensor) -> Tensor:
    """probabilities [Q, T], input_ids [N] → int64 [Q]: the phrase (0-based) of each query's best word; words
    are the tokens between delimiters ([CLS], [SEP], ".", "?")."""
    delimiter = torch.isin(input_ids, torch.tensor(DELIMITER_TOKEN_IDS, device=input_ids.device))
    phrase = torch.cumsum(delimiter.long(), 0) - delimiter.long() - 1  # [N]: delimiters before it, less [CLS]
    scores = probabilities[:, :len(input_ids)].masked_fill(delimiter[None], -1.0)
    return phrase.clamp(min=0)[scores.argmax(-1)]


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
        labels = phrase_labels(probabilities[index][keep], input_ids[index])
        results.append(GroundedDetections(image_boxes, scores[index][keep], phrases, labels,
                                          keep.nonzero().flatten()))
    return results


def grounded_predictions(logits: Tensor, boxes: Tensor, input_ids: Tensor, decode: Callable[[list[int]], str], *,
                         image_sizes: Sequence[tuple[int, int]], threshold: float | None, text_threshold: float,
                         file_names: Sequence[str | None] | None = None) -> list[Prediction]:
    """A batch's outputs (as :func:`grounded_detections` reads them) → one :class:`Prediction` per image, boxes in
    pixels of the original ``image_sizes``, the phrases as ``label_names``; ``threshold=None`` keeps every query."""
    detections = grounded_detections(logits, boxes, input_ids, decode, threshold=threshold or 0.0,
                                     text_threshold=text_threshold, image_sizes=image_sizes)
    file_names = list(file_names) if file_names is not None else [None] * len(detections)
    return [Prediction(boxes=found.boxes, scores=found.scores, labels=found.labels, label_names=found.phrases,
                       query_indices=found.query_indices, image_size=tuple(size), file_name=name, cut_at=threshold)
            for found, size, name in zip(detections, image_sizes, file_names)]
