"""The data of one attention-explorer page, cut out of a batch's model outputs (:func:`explorer_data`).

Two kinds of attention, one page: the paper's DETR and the anchor DETR attend densely (``kind`` "dense": a
map over the feature grid per layer, head and query); Deformable DETR samples a few points per head and
feature level (``kind`` "sampling": the points and their weights per layer, query, head and level).

Dense maps are quantised to 8 bits per map: ``byte = round(255 * value / scale)`` with ``scale`` the map's
maximum, so a value decodes as ``byte / 255 * scale`` with an error of at most ``scale / 510``. Sampling
points are int16 in 1/16384 of the image side (``code = round(16384 * x / width)``; an error of at most
1/32768 of the side, 0.04 px on a 1333 px side), weights uint16 (``code = round(65535 * weight)``).

Embedded data (the JSON block ``<script id="explorer-data">``, format ``detr-attention-explorer/2``):
    kind: "dense" or "sampling" (what follows ``top_classes`` / ``top_probs``),
    image: {src (data URI, JPEG of the resized image the model saw), width, height (that size, pixels),
        original_width, original_height}
    num_queries Q, num_layers L, num_heads, class_names (one per logit: a softmax head's num_classes + 1,
        the last "no object"; a sigmoid head's num_classes), no_object_label (the no-object logit's index,
        null for a sigmoid head),
    threshold, scores [Q], labels [Q] (final layer, as :class:`detr.PostProcess`: max over real classes),
    prediction_layers: 1-based decoder layers with head outputs (1..L with aux outputs, else [L]),
    boxes [P][Q][4] normalised cxcywh per prediction layer, top_classes / top_probs [P][Q][k] (k = 5),
    masks (panoptic models only, absent otherwise): {shape [Q, mh, mw] (the mask head's stride-4 map, cropped
        to the image), stride 4, maps (base64 uint8, byte = round(255 * sigmoid(mask logit)))}.
    tracks (a frame of a tracked video only, absent otherwise): the frame's tracks, their boxes, ids, trails and
        matched queries (:mod:`detr.visualize.explorer.tracks`).
    text (a prompted model's page only, absent otherwise: Grounding DINO's decoder cross-attention over the
        prompt): {prompt (as the model read it), tokens [N] (the tokenizer's strings, [CLS] and [SEP] included),
        phrases [N] (the 0-based phrase each token belongs to, -1 for [CLS], [SEP] and the delimiters),
        phrase_names [phrases], shape [L, Q, heads, N], weights (base64 uint16 little-endian [L, Q, heads, N]:
        each head's softmax weights over the tokens, summing to 1, in 1/65535)}; class_names are then the
        tokens, one per logit column (empty past the prompt).
  kind "dense":
    feature: {height h, width w (unpadded feature region), stride (input pixels per feature cell)}
    decoder: {shape [L, heads + 1, Q, h, w] (head index ``heads`` is the mean over heads), maps (base64
        uint8), scales (base64 float32 little-endian [L, heads + 1, Q])},
    encoder: {shape [h * w, h, w] (row-major reference position, then the map), maps, scales [h * w]}.
  kind "sampling" (Deformable DETR's decoder cross-attention):
    feature: {stride (the finest level's), levels: [{stride, height, width, points} per level, finest first: input
        pixels per cell, the cells that cover the image and the level's own point count, at most P]}
    sampling: {shape [L, Q, heads, levels, P], points (base64 int16 little-endian [L, Q, heads, levels, P, 2]:
        x, y in 1/16384 of the image's width and height, the same for the resized and the original image),
        weights (base64 uint16 little-endian [L, Q, heads, levels, P]: each head's weights, summing to 1
        over levels and points)}.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from detr.inference.postprocess import class_probabilities, scores_and_labels
from detr.inference.prediction import unpadded_feature_size
from detr.models.outputs import AttentionOutput, DetectorOutput, SamplingOutput

#: Version tag of the embedded data; the page's script refuses anything else.
DATA_FORMAT = "detr-attention-explorer/2"
#: How many classes per query the page lists (no-object included).
TOP_K = 5
#: Sampling points are stored in 1/POINT_UNITS of the image side (int16: points within ±2 image sides).
POINT_UNITS = 16384
#: Sampling weights are stored in 1/WEIGHT_UNITS (uint16).
WEIGHT_UNITS = 65535



def quantize_maps(maps: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Quantise non-negative maps ``[..., h, w]`` to 8 bits, one scale per map.

    Returns ``(codes, scales)``: uint8 ``[..., h, w]`` with ``codes = round(255 * maps / scale)`` and
    float32 ``[...]`` with ``scale = max`` of each map (0 for an all-zero map, decoded as zeros).
    ``codes / 255 * scale`` recovers the maps within ``scale / 510``.
    """
    maps = maps.detach().float().cpu()
    if maps.numel() and float(maps.min()) < 0:
        raise ValueError("attention maps must be non-negative (softmax weights); got negative values")
    scales = maps.flatten(-2).amax(dim=-1)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(maps / safe[..., None, None] * 255).clamp_(0, 255).to(torch.uint8)
    return codes.numpy(), scales.numpy().astype("<f4")


def _base64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _jpeg_data_uri(image: np.ndarray, quality: int) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def feature_stride(input_size: tuple[int, int], feature_size: tuple[int, int]) -> int:
    """Input pixels per feature cell: the power of two ``s`` with ``ceil(H / s) == h`` (ResNet rounds up).

    Only for outputs that come without their model; with the model at hand, its ``model.stride`` is exact
    (an image of at most one cell is ambiguous here).

    Args:
        input_size: ``(H, W)`` of the unpadded resized image.
        feature_size: ``(h, w)`` of its unpadded feature region.
    """
    height, width = input_size
    h, w = feature_size
    for exponent in range(9):
        stride = 2**exponent
        if math.ceil(height / stride) <= h and math.ceil(width / stride) <= w:
            return stride
    raise ValueError(f"no power-of-two stride maps input size {input_size} to feature size {feature_size}")


def explorer_data(
    outputs: DetectorOutput,
    *,
    index: int,
    image: np.ndarray,
    original_size: tuple[int, int],
    class_names: Sequence[str],
    title: str,
    threshold: float = 0.7,
    model_description: str = "",
    jpeg_quality: int = 88,
    class_head: str = "softmax",
    stride: int | None = None,
    prompt: PromptTokens | None = None,
) -> dict[str, Any]:
    """The JSON-ready data of one image's page, cut out of a batch's model outputs.

    Args:
        outputs: ``model(images, padding_mask, return_attention=True)`` for a batch (a
            :class:`~detr.models.outputs.DetectorOutput`): logits [B, Q, C (+ 1)], boxes [B, Q, 4] normalised
            cxcywh, the aux layers if kept, and either the dense attention (the paper's DETR, the anchor DETR:
            :class:`~detr.models.outputs.AttentionOutput`) or Deformable DETR's sampling points
            (:class:`~detr.models.outputs.SamplingOutput`).
        index: which image of the batch.
        image: uint8 RGB ``[H, W, 3]``, the resized image the model saw, unpadded (shown by the page).
        original_size: ``(height, width)`` of the original image (the page reports boxes in it).
        class_names: one name per logit; a softmax head's last one for the no-object logit.
        title: shown in the page header (usually the file name).
        threshold: initial score threshold of the page's box display.
        model_description: one line about the model for the header.
        jpeg_quality: quality of the embedded JPEG.
        class_head: "softmax" (the last logit is "no object") or "sigmoid".
        stride: the model's ``model.stride`` (input pixels per feature cell; Deformable DETR: of the finest
            level); None derives it from the image and feature sizes (:func:`feature_stride`), which sampling
            points cannot (a Deformable DETR's outputs need it).
        prompt: a prompted model's prompt as tokens and phrases; its outputs' ``text_attention`` is then kept.

    With ``outputs.masks`` (a :class:`detr.DETRPanoptic`: mask logits [B, Q, h', w'] at stride 4)
    the data also holds every query's mask probability (key ``masks``), which the page shows beside the
    query's attention.

    Returns:
        a dict in the format described in the module docstring.
    """
    sampling = outputs.sampling is not None
    if outputs.attention is None and not sampling:
        raise ValueError("the model outputs hold no attention maps or sampling points; call the model with "
                         "return_attention=True")
    logits = outputs.logits[index].detach().float().cpu()  # [Q, C (+ 1)]
    num_queries, num_logits = logits.shape
    if len(class_names) != num_logits:
        raise ValueError(
            f"class_names has {len(class_names)} names but the model has {num_logits} logits "
            f"(num_classes + 1 for a softmax head, the last one 'no object'; num_classes for a sigmoid head); "
            f"pass one name per logit"
        )
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3] (the resized RGB image), got {image.dtype} {image.shape}")
    height, width = int(image.shape[0]), int(image.shape[1])
    if sampling:
        if stride is None:
            raise ValueError("a Deformable DETR's sampling points need stride=model.stride (its finest level's)")
        attention = _sampling_data(outputs.sampling, index, (height, width), stride)
    else:
        attention = _dense_data(outputs.attention, index, (height, width), stride)
    num_layers = attention.pop("num_layers")

    # Head outputs per decoder layer: every layer's when the outputs keep the aux layers, else the last one.
    layer_outputs = outputs.layers
    if len(layer_outputs) != num_layers:
        layer_outputs = layer_outputs[-1:]
    prediction_layers = list(range(num_layers - len(layer_outputs) + 1, num_layers + 1))
    boxes, top_classes, top_probs = [], [], []
    for layer in layer_outputs:
        probabilities = class_probabilities(layer.logits[index].detach().cpu(), class_head)
        top = probabilities.topk(min(TOP_K, num_logits), dim=-1)
        top_classes.append(top.indices.tolist())
        top_probs.append(np.round(top.values.numpy().astype(float), 5).tolist())
        boxes.append(np.round(layer.boxes[index].detach().float().cpu().numpy().astype(float), 6).tolist())
    scores, labels = scores_and_labels(logits, class_head)  # as detr.PostProcess scores them

    return {
        "format": DATA_FORMAT,
        "kind": "sampling" if sampling else "dense",
        "title": title,
        "model": model_description,
        "image": {
            "src": _jpeg_data_uri(image, jpeg_quality),
            "width": width,
            "height": height,
            "original_width": int(original_size[1]),
            "original_height": int(original_size[0]),
        },
        "num_queries": int(num_queries),
        "num_layers": num_layers,
        "class_names": list(class_names),
        # A softmax head's last logit is "no object"; a sigmoid head has none (every logit is a real class).
        "no_object_label": num_logits - 1 if class_head == "softmax" else None,
        "threshold": float(threshold),
        "scores": np.round(scores.numpy().astype(float), 5).tolist(),
        "labels": labels.tolist(),
        "prediction_layers": prediction_layers,
        "boxes": boxes,
        "top_classes": top_classes,
        "top_probs": top_probs,
        **attention,
        **({"masks": _mask_data(outputs.masks[index], height, width)} if outputs.masks is not None else {}),
        **({"text": _text_data(outputs.text_attention, index, prompt)} if prompt is not None else {}),
    }


def _dense_data(attention: AttentionOutput, index: int, input_size: tuple[int, int],
                stride: int | None) -> dict[str, Any]:
    """The dense kind's keys (feature, num_heads, decoder, encoder) and num_layers, cropped to the image."""
    mask = attention.feature_mask[index].detach().cpu().bool()  # [h_pad, w_pad]
    padded_h, padded_w = mask.shape
    h, w = unpadded_feature_size(mask)
    heads = attention.decoder_heads[:, index, :, :, :h, :w]  # [L, heads, Q, h, w]
    mean = attention.decoder[:, index, None, :, :h, :w]  # [L, 1, Q, h, w]
    decoder_codes, decoder_scales = quantize_maps(torch.cat([heads, mean], dim=1))
    encoder = attention.encoder[index].reshape(padded_h, padded_w, padded_h, padded_w)
    encoder_codes, encoder_scales = quantize_maps(encoder[:h, :w, :h, :w].reshape(h * w, h, w))
    if stride is None:
        stride = feature_stride(input_size, (h, w))
    return {
        "num_layers": int(heads.shape[0]),
        "num_heads": int(heads.shape[1]),
        "feature": {"height": h, "width": w, "stride": int(stride)},
        "decoder": {
            "shape": list(decoder_codes.shape),
            "maps": _base64(decoder_codes),
            "scales": _base64(decoder_scales),
        },
        "encoder": {
            "shape": list(encoder_codes.shape),
            "maps": _base64(encoder_codes),
            "scales": _base64(encoder_scales),
        },
    }


def quantize_points(points: Tensor) -> np.ndarray:
    """Points ``[..., 2]`` as fractions of the image's width and height → int16 codes in 1/:data:`POINT_UNITS`,
    clipped to ±2 image sides (a point further out samples zeros, and no page could show it)."""
    codes = torch.round(points.detach().float().cpu() * POINT_UNITS).clamp_(-32768, 32767)
    return codes.to(torch.int16).numpy().astype("<i2")


def quantize_weights(weights: Tensor) -> np.ndarray:
    """Attention weights in [0, 1] → uint16 codes in 1/:data:`WEIGHT_UNITS` (an error of at most 7.7e-6)."""
    codes = torch.round(weights.detach().float().cpu().clamp(0, 1) * WEIGHT_UNITS)
    return codes.to(torch.int32).numpy().astype("<u2")


def _sampling_data(sampling: SamplingOutput, index: int, input_size: tuple[int, int],
                   stride: int) -> dict[str, Any]:
    """The sampling kind's keys (feature, num_heads, sampling) and num_layers: one image's points of every
    decoder layer, query, head, level and point, with their weights."""
    points = sampling.points[:, index]  # [L, Q, heads, levels, P, 2], [0, 1] of the unpadded image
    weights = sampling.weights[:, index]  # [L, Q, heads, levels, P]
    num_levels = int(sampling.spatial_shapes.shape[0])
    if tuple(points.shape[:-1]) != tuple(weights.shape) or int(points.shape[3]) != num_levels:
        raise ValueError(f"sampling points {tuple(points.shape)} and weights {tuple(weights.shape)} do not "
                         f"match ([L, Q, heads, {num_levels} levels, P] for one image)")
    height, width = input_size
    # A level's own point count: with a count per level (D-FINE's 3, 6, 3) the missing slots up to P have weight
    # exactly 0 everywhere, while a real point's softmax weight is positive.
    counts = (weights > 0).flatten(0, 2).any(0).sum(-1).tolist()  # [levels]
    levels = [{"stride": level_stride, "height": math.ceil(height / level_stride),
               "width": math.ceil(width / level_stride), "points": int(count)}
              for level_stride, count in zip(sampling.strides, counts, strict=True)]
    return {
        "num_layers": int(points.shape[0]),
        "num_heads": int(points.shape[2]),
        "feature": {"stride": int(stride), "levels": levels},
        "sampling": {
            "shape": list(weights.shape),
            "points": _base64(quantize_points(points)),
            "weights": _base64(quantize_weights(weights)),
        },
    }


@dataclass(frozen=True)
class PromptTokens:
    """A prompt as a prompted model read it: ``text`` (the prompt), ``tokens`` (the tokenizer's strings, one per
    input id), ``phrases`` (per token its 0-based phrase, -1 for [CLS], [SEP] and the delimiters) and
    ``phrase_names`` (each phrase's words)."""

    text: str
    tokens: tuple[str, ...]
    phrases: tuple[int, ...]
    phrase_names: tuple[str, ...]


def _text_data(text_attention: Tensor | None, index: int, prompt: PromptTokens) -> dict[str, Any]:
    """One image's attention over the prompt's tokens, [L, heads, Q, N] of the batch's → [L, Q, heads, N]."""
    if text_attention is None:
        raise ValueError("the model outputs hold no text_attention: call a prompted model with return_attention=True")
    weights = text_attention[:, index].transpose(1, 2)  # [L, Q, heads, N]
    if int(weights.shape[-1]) != len(prompt.tokens):
        raise ValueError(f"the text attention covers {int(weights.shape[-1])} tokens, the prompt has "
                         f"{len(prompt.tokens)}: pass the tokens the model read")
    return {"prompt": prompt.text, "tokens": list(prompt.tokens), "phrases": list(prompt.phrases),
            "phrase_names": list(prompt.phrase_names), "shape": list(weights.shape),
            "weights": _base64(quantize_weights(weights))}


#: Input pixels per cell of the mask head's output (the ResNet stem's stride).
MASK_STRIDE = 4


def _mask_data(mask_logits: Tensor, height: int, width: int) -> dict[str, Any]:
    """One image's mask logits [Q, h', w'] of the padded batch → its region's probabilities as 8-bit codes."""
    rows = min(math.ceil(height / MASK_STRIDE), int(mask_logits.shape[-2]))
    cols = min(math.ceil(width / MASK_STRIDE), int(mask_logits.shape[-1]))
    probabilities = mask_logits[:, :rows, :cols].detach().float().cpu().sigmoid()
    codes = torch.round(probabilities * 255).to(torch.uint8).numpy()  # fixed scale 1: probabilities
    return {"shape": list(codes.shape), "stride": MASK_STRIDE, "maps": _base64(codes)}
