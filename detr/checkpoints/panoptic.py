"""Load the authors' panoptic release files (detr-r50-panoptic-00ce5173.pth, detr-r50-dc5-panoptic-da08f1b1.pth,
detr-r101-panoptic-40021d53.pth) and state dicts in their layout as :class:`DETRPanoptic`.

Their layout wraps the detector under ``detr.`` beside ``bbox_attention.*`` and ``mask_head.*``; the
detector's part is inferred exactly as for detection files (:func:`detr.checkpoints.infer_model_config`:
DC5 from the file name). :func:`detr.load_checkpoint` sends such files here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from detr.checkpoints import CheckpointContents, CheckpointError, infer_model_config
from detr.models.build import build_detr
from detr.models.segmentation import DETRPanoptic
from detr.categories import COCO_PANOPTIC_NUM_CLASSES, coco_panoptic_category_map, coco_panoptic_is_thing

logger = logging.getLogger(__name__)

DETECTOR_PREFIX = "detr."


def is_panoptic_state_dict(state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether ``state_dict`` has the authors' panoptic layout (a mask head beside the detector under ``detr.``)."""
    return any(key.startswith("mask_head.") for key in state_dict) and any(
        key.startswith(DETECTOR_PREFIX) for key in state_dict)


def load_panoptic(path: str | Path, contents: CheckpointContents, **overrides: Any) -> DETRPanoptic:
    """Build the :class:`DETRPanoptic` that ``contents`` (read from ``path``) describes and load it; eval mode.

    ``overrides`` are :func:`detr.build_detr` arguments that win over what is inferred (e.g. ``dilation=True``
    for a renamed DC5 file). The model carries ``category_map`` (the checkpoint's own, or COCO panoptic's for
    250 classes), ``is_thing`` (per label, for :class:`detr.inference.postprocess_masks.PostProcessPanoptic`;
    the checkpoint's own, or COCO panoptic's for 250 classes, else None), ``eval_size`` and
    ``panoptic_postprocess`` (this project's checkpoints: the ``threshold`` and ``overlap_threshold`` of
    :class:`detr.inference.postprocess_masks.PostProcessPanoptic` their run validated with; else None).
    """
    path = Path(path)
    detector_state = {key[len(DETECTOR_PREFIX):]: value for key, value in contents.state_dict.items()
                      if key.startswith(DETECTOR_PREFIX)}
    config = contents.model_config or infer_model_config(detector_state, path.name,
                                                         class_head=overrides.get("class_head"))
    config = {**config, "pretrained_backbone": False, **overrides}
    try:
        model = DETRPanoptic(build_detr(**config))
        missing, unexpected = model.load_state_dict(contents.state_dict, strict=False)
    except (RuntimeError, ValueError) as error:  # shape mismatches, or a detector the mask head cannot use
        raise CheckpointError(f"{path} does not fit the panoptic model built from {config}: {error}") from error
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not fit the panoptic model built from {config}: missing keys {missing[:10]}"
            f"{' …' if len(missing) > 10 else ''} ({len(missing)}), unexpected keys {unexpected[:10]}"
            f"{' …' if len(unexpected) > 10 else ''} ({len(unexpected)})"
        )
    coco = model.num_classes == COCO_PANOPTIC_NUM_CLASSES
    model.category_map = contents.category_map or (coco_panoptic_category_map() if coco else None)
    model.is_thing = contents.is_thing or (coco_panoptic_is_thing() if coco and contents.category_map is None
                                           else None)
    model.eval_size = contents.eval_size
    model.panoptic_postprocess = contents.panoptic_postprocess
    logger.info("loaded %s (panoptic, %s, %d classes)", path, config["backbone"], model.num_classes)
    return model.eval()
