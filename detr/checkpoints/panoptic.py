"""Load the authors' panoptic release files (detr-r50-panoptic-00ce5173.pth, detr-r50-dc5-panoptic-da08f1b1.pth,
detr-r101-panoptic-40021d53.pth) and state dicts in their layout as :class:`DETRPanoptic`.

Their layout wraps the detector under ``detr.`` beside ``bbox_attention.*`` and ``mask_head.*``; the
detector's part is inferred exactly as for detection files (:func:`detr.checkpoints.formats.infer_model_config`:
DC5 from the file name). :func:`detr.load_checkpoint` sends such files here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from detr.categories import COCO_PANOPTIC_NUM_CLASSES, coco_panoptic_category_map, coco_panoptic_is_thing
from detr.checkpoints.formats import CheckpointContents, CheckpointError, infer_model_config, load_strict
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic

logger = logging.getLogger(__name__)

DETECTOR_PREFIX = "detr."


def is_panoptic_state_dict(state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether ``state_dict`` has the authors' panoptic layout (a mask head beside the detector under ``detr.``)."""
    return any(key.startswith("mask_head.") for key in state_dict) and any(
        key.startswith(DETECTOR_PREFIX) for key in state_dict)


def load_panoptic(path: str | Path, contents: CheckpointContents, **overrides: Any) -> DETRPanoptic:
    """Build the :class:`DETRPanoptic` that ``contents`` (read from ``path``) describes and load it; eval mode.

    ``overrides`` are :class:`detr.DetrConfig` fields that win over what is inferred (e.g. ``dilation=True``
    for a renamed DC5 file). The model's ``meta`` is the checkpoint's; a 250-class file that records no
    category map gets COCO panoptic's map and things/stuff split (for
    :class:`detr.inference.postprocess_masks.PostProcessPanoptic`).
    """
    path = Path(path)
    detector_state = {key[len(DETECTOR_PREFIX):]: value for key, value in contents.state_dict.items()
                      if key.startswith(DETECTOR_PREFIX)}
    config = contents.config or infer_model_config(detector_state, path.name, class_head=overrides.get("class_head"))
    config = config.replace(pretrained_backbone=False, **overrides)
    where = f"{path} does not fit the panoptic model built from {config}"
    try:
        model = build_detr_panoptic(config)
    except ValueError as error:  # a detector the mask head cannot use
        raise CheckpointError(f"{where}: {error}") from error
    load_strict(model, contents.state_dict, where)
    meta = contents.meta
    if meta.category_map is None and model.num_classes == COCO_PANOPTIC_NUM_CLASSES:
        meta = meta.replace(category_map=coco_panoptic_category_map(),
                            is_thing=meta.is_thing or tuple(coco_panoptic_is_thing()))
    model.meta = meta
    logger.info("loaded %s (panoptic, %s, %d classes)", path, config.backbone, model.num_classes)
    return model.eval()
