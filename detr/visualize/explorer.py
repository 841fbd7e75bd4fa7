"""An interactive, offline attention explorer: one self-contained HTML page per image.

The page shows the image with every query's predicted box. Selecting a box (or a row of the query list)
shows that query's decoder cross-attention for any decoder layer and head (or the mean over heads), its
top-5 classes with probabilities (no-object included) and its box after every decoder layer; clicking any
other pixel shows the last encoder layer's self-attention of that feature position (paper Fig. 3 and 6,
for every query, layer and head instead of the figures' selection).

Everything is inline in one file (HTML, CSS, JavaScript from ``explorer_template.html``, ``explorer.css``
and ``explorer.js`` beside this module; the image as JPEG; the maps as base64), so the page opens from the
file system with no server and no network. Maps are quantised to 8 bits per map: ``byte = round(255 *
value / scale)`` with ``scale`` the map's maximum, so a value decodes as ``byte / 255 * scale`` with an
error of at most ``scale / 510``. Measured page sizes for an 800 × 1066 input (100 queries, 6 decoder
layers, 8 heads; random-init weights): R50 (25 × 34 feature map) 7,482,889 bytes (7.1 MiB), of which
6.1 MB decoder maps, 1.0 MB encoder maps, 0.3 MB JPEG; R50-DC5 (50 × 67) about 39.5 MB, above the
20 MB goal (pages above 20 MiB log a warning).

Embedded data (the JSON block ``<script id="explorer-data">``, format ``detr-attention-explorer/1``):
    image: {src (data URI, JPEG of the resized image the model saw), width, height (that size, pixels),
        original_width, original_height}
    feature: {height h, width w (unpadded feature region), stride (input pixels per feature cell)}
    num_queries Q, num_layers L, num_heads, class_names (one per logit: a softmax head's num_classes + 1,
        the last "no object"; a sigmoid head's num_classes), no_object_label (the no-object logit's index,
        null for a sigmoid head),
    threshold, scores [Q], labels [Q] (final layer, as :class:`detr.PostProcess`: max over real classes),
    prediction_layers: 1-based decoder layers with head outputs (1..L with aux outputs, else [L]),
    boxes [P][Q][4] normalised cxcywh per prediction layer, top_classes / top_probs [P][Q][k] (k = 5),
    decoder: {shape [L, heads + 1, Q, h, w] (head index ``heads`` is the mean over heads), maps (base64
        uint8), scales (base64 float32 little-endian [L, heads + 1, Q])},
    encoder: {shape [h * w, h, w] (row-major reference position, then the map), maps, scales [h * w]}.
    masks (panoptic models only, absent otherwise): {shape [Q, mh, mw] (the mask head's stride-4 map, cropped
        to the image), stride 4, maps (base64 uint8, byte = round(255 * sigmoid(mask logit)))}.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from detr.categories import CategoryMap
from detr.data.transforms import denormalize
from detr.data.collate import pad_images
from detr.inference.postprocess import class_probabilities, scores_and_labels
from detr.inference.predictor import ImageInput, Predictor, label_name, to_rgb_array

logger = logging.getLogger(__name__)

#: Version tag of the embedded data; the page's script refuses anything else.
DATA_FORMAT = "detr-attention-explorer/1"
#: How many classes per query the page lists (no-object included).
TOP_K = 5
#: Pages above this size get a warning: a page must stay small enough to e-mail and open quickly (an R50 page,
#: 100 queries, 6 layers, 8 heads, stays below it).
PAGE_SIZE_WARNING_BYTES = 20 * 1024 * 1024

_ATTENTION_KEYS = ("decoder_attention", "decoder_attention_heads", "encoder_attention", "feature_mask")
_TEMPLATE_FIELDS = re.compile(r"__EXPLORER_(TITLE|STYLE|SCRIPT|DATA)__")


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


def denormalize_image(image: Tensor) -> np.ndarray:
    """ImageNet-normalised float ``[3, H, W]`` → uint8 RGB ``[H, W, 3]`` (what the model saw)."""
    return denormalize(image.cpu()).permute(1, 2, 0).contiguous().numpy()


def explorer_data(
    outputs: Mapping[str, Any],
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
) -> dict[str, Any]:
    """The JSON-ready data of one image's page, cut out of a batch's model outputs.

    Args:
        outputs: ``model(images, padding_mask, return_attention=True)`` for a batch (see the module
            docstring of :mod:`detr.models.detr`): pred_logits [B, Q, C + 1], pred_boxes [B, Q, 4]
            normalised cxcywh, optional aux_outputs, decoder_attention [L, B, Q, h, w],
            decoder_attention_heads [L, B, heads, Q, h, w], encoder_attention [B, h*w, h, w],
            feature_mask bool [B, h, w] (True = padding).
        index: which image of the batch.
        image: uint8 RGB ``[H, W, 3]``, the resized image the model saw, unpadded (shown by the page).
        original_size: ``(height, width)`` of the original image (the page reports boxes in it).
        class_names: ``C + 1`` names, the last one for the no-object logit.
        title: shown in the page header (usually the file name).
        threshold: initial score threshold of the page's box display.
        model_description: one line about the model for the header.
        jpeg_quality: quality of the embedded JPEG.
        stride: the model's ``model.stride`` (input pixels per feature cell); None derives it from the image
            and feature sizes (:func:`feature_stride`).

    With ``outputs["pred_masks"]`` (a :class:`detr.DETRPanoptic`: mask logits [B, Q, h', w'] at stride 4)
    the data also holds every query's mask probability (key ``masks``), which the page shows beside the
    query's attention.

    Returns:
        a dict in the format described in the module docstring.
    """
    missing = [key for key in _ATTENTION_KEYS if key not in outputs]
    if missing:
        raise ValueError(f"model outputs lack {missing}; call the model with return_attention=True")
    logits = outputs["pred_logits"][index].detach().float().cpu()  # [Q, C + 1]
    num_queries, num_logits = logits.shape
    if len(class_names) != num_logits:
        raise ValueError(
            f"class_names has {len(class_names)} names but the model has {num_logits} logits "
            f"(num_classes + 1 for a softmax head, the last one 'no object'; num_classes for a sigmoid head); "
            f"pass one name per logit"
        )
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3] (the resized RGB image), got {image.dtype} {image.shape}")

    mask = outputs["feature_mask"][index].detach().cpu().bool()  # [h_pad, w_pad]
    padded_h, padded_w = mask.shape
    h, w = int((~mask[:, 0]).sum()), int((~mask[0, :]).sum())  # padding is at the bottom and right
    heads = outputs["decoder_attention_heads"][:, index, :, :, :h, :w]  # [L, heads, Q, h, w]
    mean = outputs["decoder_attention"][:, index, None, :, :h, :w]  # [L, 1, Q, h, w]
    decoder_codes, decoder_scales = quantize_maps(torch.cat([heads, mean], dim=1))
    encoder = outputs["encoder_attention"][index].reshape(padded_h, padded_w, padded_h, padded_w)
    encoder_codes, encoder_scales = quantize_maps(encoder[:h, :w, :h, :w].reshape(h * w, h, w))
    num_layers, num_heads = int(heads.shape[0]), int(heads.shape[1])

    # Head outputs per decoder layer: aux_outputs are layers 1 .. L-1, pred_* the last one.
    layer_outputs = list(outputs.get("aux_outputs") or []) + [outputs]
    if len(layer_outputs) != num_layers:
        layer_outputs = [outputs]
    prediction_layers = list(range(num_layers - len(layer_outputs) + 1, num_layers + 1))
    boxes, top_classes, top_probs = [], [], []
    for layer in layer_outputs:
        probabilities = class_probabilities(layer["pred_logits"][index].detach().cpu(), class_head)
        top = probabilities.topk(min(TOP_K, num_logits), dim=-1)
        top_classes.append(top.indices.tolist())
        top_probs.append(np.round(top.values.numpy().astype(float), 5).tolist())
        boxes.append(np.round(layer["pred_boxes"][index].detach().float().cpu().numpy().astype(float), 6).tolist())
    scores, labels = scores_and_labels(logits, class_head)  # as detr.PostProcess scores them

    height, width = int(image.shape[0]), int(image.shape[1])
    if stride is None:
        stride = feature_stride((height, width), (h, w))
    return {
        "format": DATA_FORMAT,
        "title": title,
        "model": model_description,
        "image": {
            "src": _jpeg_data_uri(image, jpeg_quality),
            "width": width,
            "height": height,
            "original_width": int(original_size[1]),
            "original_height": int(original_size[0]),
        },
        "feature": {"height": h, "width": w, "stride": int(stride)},
        "num_queries": int(num_queries),
        "num_layers": num_layers,
        "num_heads": num_heads,
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
        **({"masks": _mask_data(outputs["pred_masks"][index], height, width)} if "pred_masks" in outputs else {}),
    }


#: Input pixels per cell of the mask head's output (the ResNet stem's stride).
MASK_STRIDE = 4


def _mask_data(mask_logits: Tensor, height: int, width: int) -> dict[str, Any]:
    """One image's mask logits [Q, h', w'] of the padded batch → its region's probabilities as 8-bit codes."""
    rows = min(math.ceil(height / MASK_STRIDE), int(mask_logits.shape[-2]))
    cols = min(math.ceil(width / MASK_STRIDE), int(mask_logits.shape[-1]))
    probabilities = mask_logits[:, :rows, :cols].detach().float().cpu().sigmoid()
    codes = torch.round(probabilities * 255).to(torch.uint8).numpy()  # fixed scale 1: probabilities
    return {"shape": list(codes.shape), "stride": MASK_STRIDE, "maps": _base64(codes)}


def _asset(name: str) -> str:
    return resources.files("detr.visualize").joinpath(name).read_text(encoding="utf-8")


def _script_safe_json(data: Mapping[str, Any]) -> str:
    # "<", ">" and "&" only occur inside JSON strings, where \u escapes are equivalent; this keeps a
    # title like "</script>" from ending the data block.
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_explorer_html(data: Mapping[str, Any]) -> str:
    """One self-contained HTML page (template, CSS, script and ``data`` inline) for :func:`explorer_data`."""
    if data.get("format") != DATA_FORMAT:
        raise ValueError(
            f"data['format'] must be {DATA_FORMAT!r} (build it with explorer_data), got {data.get('format')!r}"
        )
    values = {
        "TITLE": html.escape(str(data["title"])),
        "STYLE": _asset("explorer.css"),
        "SCRIPT": _asset("explorer.js"),
        "DATA": _script_safe_json(data),
    }
    # One pass, so text inside the data can never be taken for a placeholder.
    return _TEMPLATE_FIELDS.sub(lambda match: values[match.group(1)], _asset("explorer_template.html"))


def render_index_html(pages: Sequence[tuple[str, Mapping[str, Any]]], *, title: str = "DETR attention explorer") -> str:
    """An index page linking to several explorer pages.

    Args:
        pages: ``(relative link, explorer data)`` per page; the data gives the thumbnail and detections.
    """
    cards = []
    for link, data in pages:
        threshold = float(data["threshold"])
        detected = [
            f"{html.escape(data['class_names'][label])} {score:.2f}"
            for score, label in sorted(zip(data["scores"], data["labels"]), reverse=True)
            if score >= threshold
        ]
        summary = ", ".join(detected) if detected else f"no query scores ≥ {threshold:g}"
        cards.append(
            f'<a class="card" href="{html.escape(link, quote=True)}">'
            f'<img src="{_thumbnail(data["image"]["src"])}" alt="">'
            f'<span class="name">{html.escape(str(data["title"]))}</span>'
            f'<span class="detail">{len(detected)} detections: {summary}</span></a>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n"
        "body{font-family:system-ui,sans-serif;margin:16px;background:#f7f7f5;color:#1d1d1f}"
        "h1{font-size:18px}.cards{display:flex;flex-wrap:wrap;gap:12px}"
        ".card{display:flex;flex-direction:column;width:240px;text-decoration:none;color:inherit;"
        "background:#fff;border:1px solid #d7d7d2;border-radius:4px;padding:6px}"
        ".card:hover{border-color:#e8590c}.card img{width:100%;height:auto}.name{font-weight:600;margin-top:4px}"
        ".detail{color:#6b6b70;font-size:12px}\n</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<div class=\"cards\">\n" + "\n".join(cards) + "\n</div>\n</body>\n</html>\n"
    )


def _thumbnail(data_uri: str, *, width: int = 240) -> str:
    payload = base64.b64decode(data_uri.split(",", 1)[1])
    with Image.open(io.BytesIO(payload)) as image:
        image = image.convert("RGB")
        image.thumbnail((width, width * 4))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _class_names(category_map: CategoryMap | None, num_classes: int, with_no_object: bool = True) -> list[str]:
    names = [label_name(category_map, label) for label in range(num_classes)]
    return names + ["no object"] if with_no_object else names


def _model_description(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None:  # a detector built by hand
        return ""
    parts = [config.backbone + ("-DC5" if config.dilation else ""), f"{config.num_encoder_layers} encoder layers",
             f"{config.hidden_dim} hidden", f"{config.num_classes} classes"]
    return ", ".join(parts)


def _page_names(images: Sequence[ImageInput]) -> list[tuple[str, str]]:
    """(title, file stem) per image; stems made unique."""
    names, seen = [], set()
    for i, image in enumerate(images):
        title = Path(image).name if isinstance(image, (str, Path)) else f"image {i}"
        stem = Path(image).stem if isinstance(image, (str, Path)) else f"image_{i:03d}"
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)
        unique, k = stem, 1
        while unique.lower() in seen or unique.lower() == "index":
            unique, k = f"{stem}_{k}", k + 1
        seen.add(unique.lower())
        names.append((title, unique))
    return names


def write_attention_explorer(
    model: nn.Module,
    images: Sequence[ImageInput],
    out_dir: str | Path,
    *,
    category_map: CategoryMap | None = None,
    threshold: float = 0.7,
    min_size: int | None = None,
    max_size: int | None = None,
    device: str | torch.device | None = None,
    errors: list[tuple[str, str]] | None = None,
) -> list[Path]:
    """Write one explorer page per image, plus ``index.html`` linking them when there are several.

    Each image is resized as :class:`detr.inference.predictor.Predictor` does (shortest side ``min_size``, longest
    at most ``max_size``; None: the model's training size, else 800 and 1333; ImageNet normalisation)
    and run alone, so its feature map has no padding.

    Args:
        model: a DETR (moved to ``device`` and put in eval mode, as the Predictor does).
        images: paths, PIL images, or uint8 arrays/tensors (anything :data:`detr.inference.predictor.ImageInput` takes).
        out_dir: created if missing; pages are named after the image files (``<stem>.html``).
        category_map: label names; default ``model.meta.category_map``, else "class <i>".
        threshold: initial score threshold of the pages' box display (the page has a slider).
        device: where the model runs; default CUDA when available.
        errors: when given, an image that cannot be read or run (missing, undecodable, too thin to resize,
            outputs not finite) is logged, appended as ``(title, reason)`` and skipped, and the other pages
            are written; when None, it raises.

    Returns:
        the written pages in the order of ``images``, then ``index.html`` if written.
    """
    if isinstance(images, (str, Path)) or not isinstance(images, Sequence) or not images:
        raise ValueError(
            "images must be a non-empty sequence of images (paths, PIL images or arrays); wrap one image in a list"
        )
    predictor = Predictor(model, category_map=category_map, device=device, threshold=threshold,
                          min_size=min_size, max_size=max_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    description = _model_description(model)
    written: list[tuple[Path, dict[str, Any]]] = []
    for image, (title, stem) in zip(images, _page_names(images)):
        try:
            pixels = to_rgb_array(image)
            tensor = predictor.preprocess(pixels)
            batch, padding_mask = pad_images([tensor])
            # The Predictor's forward drops aux_outputs, which hold the boxes of layers 1 .. L-1.
            with torch.inference_mode():
                outputs = predictor.model(
                    batch.to(predictor.device), padding_mask.to(predictor.device), return_attention=True
                )
            if not all(bool(torch.isfinite(outputs[key]).all()) for key in ("pred_logits", "pred_boxes")):
                raise ValueError("the model's outputs are not finite (NaN or inf weights?)")
        except Exception as error:  # one bad image must not cost the other pages
            if errors is None:
                raise
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
            logger.warning("skipping %s: %s", title, reason)
            errors.append((title, reason))
            continue
        class_head = predictor.class_head
        num_classes = int(outputs["pred_logits"].shape[-1]) - (1 if class_head == "softmax" else 0)
        class_names = _class_names(predictor.category_map, num_classes, with_no_object=class_head == "softmax")
        data = explorer_data(
            outputs, index=0, image=denormalize_image(tensor), original_size=pixels.shape[:2],
            class_names=class_names, title=title, threshold=threshold, model_description=description,
            class_head=class_head, stride=getattr(predictor.model, "stride", None),
        )
        page = out_dir / f"{stem}.html"
        text = render_explorer_html(data)
        page.write_text(text, encoding="utf-8")
        size = len(text.encode("utf-8"))
        if size > PAGE_SIZE_WARNING_BYTES:
            logger.warning(
                "explorer page %s weighs %.1f MiB (more than %.0f MiB)", page, size / 2**20,
                PAGE_SIZE_WARNING_BYTES / 2**20,
            )
        logger.info("wrote %s (%.1f MiB)", page, size / 2**20)
        del data["decoder"], data["encoder"]  # the index needs only the image and the detections
        data.pop("masks", None)
        written.append((page, data))
    paths = [page for page, _ in written]
    if len(written) > 1:
        index = out_dir / "index.html"
        index.write_text(render_index_html([(page.name, data) for page, data in written]), encoding="utf-8")
        paths.append(index)
    return paths


__all__ = [
    "DATA_FORMAT",
    "denormalize_image",
    "explorer_data",
    "feature_stride",
    "quantize_maps",
    "render_explorer_html",
    "render_index_html",
    "write_attention_explorer",
]
