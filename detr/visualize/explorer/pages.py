"""Write explorer pages for a model and a set of images: each image through the
:class:`~detr.inference.predictor.Predictor`, then :func:`~detr.visualize.explorer.data.explorer_data` and
:func:`~detr.visualize.explorer.render.render_explorer_html`."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detr.categories import CategoryMap
from detr.data.transforms import denormalize
from detr.inference.grounding import prompt_text, token_phrases
from detr.inference.images import ImageInput, to_rgb_array
from detr.inference.predict import predictions_from_outputs
from detr.inference.prediction import label_name
from detr.inference.predictor import Predictor
from detr.models.detector import Detector
from detr.models.inputs import pad_images
from detr.visualize.explorer.data import PromptTokens, explorer_data
from detr.visualize.explorer.render import render_explorer_html, render_index_html

logger = logging.getLogger(__name__)

#: Pages above this size get a warning: a page must stay small enough to e-mail and open quickly (an R50 page,
#: 100 queries, 6 layers, 8 heads, stays below it; sizes: docs/guides/explore.md).
PAGE_SIZE_WARNING_BYTES = 20 * 1024 * 1024


def _class_names(category_map: CategoryMap | None, num_classes: int, with_no_object: bool = True) -> list[str]:
    names = [label_name(category_map, label) for label in range(num_classes)]
    return names + ["no object"] if with_no_object else names


def prompt_tokens(tokenizer: Any, prompt: str | Sequence[str], max_tokens: int) -> tuple[dict[str, torch.Tensor],
                                                                                     PromptTokens]:
    """A prompt through a prompted model's tokenizer → (its inputs for one image: input_ids, attention_mask,
    token_type_ids int64 [1, N]; the tokens and phrases the page shows, the first ``max_tokens`` (the model's
    ``max_text_len``: it reads no more))."""
    text = prompt_text(prompt)
    inputs = tokenizer([text], return_tensors="pt")
    ids = inputs["input_ids"][0, :max_tokens]
    phrases = token_phrases(ids).tolist()
    names = [tokenizer.decode([int(token) for token, phrase in zip(ids, phrases) if phrase == k])
             for k in range(max(phrases, default=-1) + 1)]
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    return ({key: inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids")},
            PromptTokens(text=text, tokens=tuple(tokens), phrases=tuple(phrases), phrase_names=tuple(names)))


def explorer_page_data(predictor: Predictor, pixels: np.ndarray, *, title: str, threshold: float,
                       model_description: str = "", prompt: str | Sequence[str] | None = None) -> dict[str, Any]:
    """One image's explorer data (:func:`explorer_data`): the image alone through ``predictor`` (its eval
    resize, no padding) with its attention (dense maps, or a Deformable DETR's sampling points) and the boxes
    after every decoder layer; for a prompted model (``prompt``: "a cat. a remote control."), also each query's
    attention over the prompt's tokens, whose strings are then the class names.

    Args:
        pixels: uint8 RGB ``[H, W, 3]``, the original image.
        title, threshold, model_description: shown by the page (see :func:`explorer_data`).
        prompt: what a prompted model detects (:meth:`Predictor.check_prompt`: given exactly for such a model).

    Raises:
        ValueError: the image cannot be predicted (its outputs are not finite), as every prediction command
            decides (:func:`detr.inference.predict.predictions_from_outputs`).
    """
    predictor.check_prompt(prompt)
    tensor = predictor.preprocess(pixels)
    class_head = predictor.class_head
    if prompt is None:
        tokens = None
        # aux_outputs: the boxes and classes after decoder layers 1 .. L-1, which the page steps through
        outputs = predictor.forward(*pad_images([tensor]), return_attention=True, aux_outputs=True)
        prediction, = predictions_from_outputs(outputs, image_sizes=[pixels.shape[:2]],
                                               input_sizes=[tuple(tensor.shape[1:])], class_head=class_head,
                                               category_map=predictor.category_map,
                                               top_k=predictor.model.detections_per_image,
                                               keypoints=predictor.postprocess_keypoints)
        if prediction.error is not None:
            raise ValueError(prediction.error)
        num_classes = int(outputs.logits.shape[-1]) - (1 if class_head == "softmax" else 0)
        class_names = _class_names(predictor.category_map, num_classes, with_no_object=class_head == "softmax")
    else:
        text, tokens = prompt_tokens(predictor.model.tokenizer, prompt, predictor.model.num_classes)
        outputs = predictor.forward(*pad_images([tensor]), return_attention=True, aux_outputs=True, text=text)
        if not bool(torch.isfinite(outputs.boxes).all()):  # the logits are -inf past the prompt's tokens
            raise ValueError("the model's boxes are not finite for this image")
        class_names = [*tokens.tokens, *[""] * (int(outputs.logits.shape[-1]) - len(tokens.tokens))]
    return explorer_data(
        outputs, index=0, image=denormalize(tensor).permute(1, 2, 0).numpy(), original_size=pixels.shape[:2],
        class_names=class_names, title=title, threshold=threshold, model_description=model_description,
        class_head=class_head, stride=predictor.model.stride, prompt=tokens,
    )


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
    model: Detector,
    images: Sequence[ImageInput],
    out_dir: str | Path,
    *,
    category_map: CategoryMap | None = None,
    threshold: float | None = None,
    min_size: int | None = None,
    max_size: int | None = None,
    device: str | torch.device | None = None,
    errors: list[tuple[str, str]] | None = None,
    prompt: str | Sequence[str] | None = None,
) -> list[Path]:
    """Write one explorer page per image, plus ``index.html`` linking them when there are several.

    Each image is resized as :class:`detr.inference.predictor.Predictor` does (shortest side ``min_size``, longest
    at most ``max_size``; None: the model's training size, else 800 and 1333; ImageNet normalisation)
    and run alone, so its feature map has no padding.

    Args:
        model: any detector that returns attention (moved to ``device`` and put in eval mode, as the Predictor
            does); the pages of one with sampling points (Deformable DETR, the real-time families) show each
            query's points instead of maps.
        images: paths, PIL images, or uint8 arrays/tensors (anything :data:`detr.inference.images.ImageInput` takes).
        out_dir: created if missing; pages are named after the image files (``<stem>.html``).
        category_map: label names; default ``model.meta.category_map``, else "class <i>".
        threshold: initial score threshold of the pages' box display (the page has a slider); None: the
            Predictor's default (the model's validated threshold, else 0.7).
        device: where the model runs; default CUDA when available.
        errors: when given, an image that cannot be read or run (missing, undecodable, too thin to resize,
            outputs not finite) is logged, appended as ``(title, reason)`` and skipped, and the other pages
            are written; when None, it raises.
        prompt: what a prompted model (Grounding DINO) detects, "a cat. a remote control."; its pages also show
            each query's attention over the prompt's tokens. Needed by such a model, refused by any other.

    Returns:
        the written pages in the order of ``images``, then ``index.html`` if written.

    Raises:
        ValueError: the model returns no attention (``model.attention_kind`` None: an exported file's backend).
    """
    if isinstance(images, (str, Path)) or not isinstance(images, Sequence) or not images:
        raise ValueError(
            "images must be a non-empty sequence of images (paths, PIL images or arrays); wrap one image in a list"
        )
    if model.attention_kind is None:  # the contract says so before any image is run
        raise ValueError(f"{type(model).__name__} ({model.backend}) returns no attention maps or sampling points "
                         "(attention_kind None), which the explorer shows; use the PyTorch model it came from")
    predictor = Predictor(model, category_map=category_map, device=device, threshold=threshold,
                          min_size=min_size, max_size=max_size)
    predictor.check_prompt(prompt)  # before any image is run
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    description = model.describe()
    written: list[tuple[Path, dict[str, Any]]] = []
    for image, (title, stem) in zip(images, _page_names(images)):
        try:
            data = explorer_page_data(predictor, to_rgb_array(image), title=title, threshold=predictor.threshold,
                                      model_description=description, prompt=prompt)
        except Exception as error:  # one bad image must not cost the other pages
            if errors is None:
                raise
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
            logger.warning("skipping %s: %s", title, reason)
            errors.append((title, reason))
            continue
        page = out_dir / f"{stem}.html"
        text = render_explorer_html(data)
        page.write_text(text, encoding="utf-8")
        size = len(text.encode("utf-8"))
        if size > PAGE_SIZE_WARNING_BYTES:
            logger.warning(
                "explorer page %s weighs %.1f MiB (more than %.0f MiB)", page, size / 2**20,
                PAGE_SIZE_WARNING_BYTES / 2**20,
            )
        logger.debug("wrote %s (%.1f MiB)", page, size / 2**20)  # the caller lists the paths it gets back
        for key in ("decoder", "encoder", "sampling", "masks", "text"):  # the index needs only the image and detections
            data.pop(key, None)
        written.append((page, data))
    paths = [page for page, _ in written]
    if len(written) > 1:
        index = out_dir / "index.html"
        index.write_text(render_index_html([(page.name, data) for page, data in written]), encoding="utf-8")
        paths.append(index)
    return paths
