"""What the torch.hub entry points of hubconf.py return: a released model (:mod:`detr.checkpoints.released`)
as the authors' hubconf builds it, with or without its weights."""

from __future__ import annotations

from typing import Any

from detr.checkpoints import load_checkpoint
from detr.checkpoints.released import PRETRAINED_MODELS
from detr.inference.postprocess import PostProcess
from detr.inference.postprocess_masks import PostProcessPanoptic
from detr.models.build import build_detr
from detr.models.config import ModelMeta
from detr.models.segmentation import build_detr_panoptic


def hub_model(name: str, *, pretrained: bool = False, num_classes: int | None = None,
              return_postprocessor: bool = False, threshold: float = 0.85) -> Any:
    """The released model ``name`` (no auxiliary outputs), with or without its weights.

    pretrained=True: the released weights (eval mode; ``num_classes`` must be the release's: 91 for the
    detectors, 250 for the panoptic models). False: the same architecture with ``num_classes`` classes
    (default: the release's), randomly initialised, ImageNet backbone not loaded (train mode; for training
    from scratch or fine-tuning). return_postprocessor: also return the post-processor:
    :class:`detr.PostProcess` (per-image scores, labels and pixel boxes) for a detector,
    :class:`detr.inference.postprocess_masks.PostProcessPanoptic` (score ``threshold``, COCO panoptic's things
    and stuff) for a panoptic model, as the authors' hubconf does.
    """
    model_info = PRETRAINED_MODELS[name]
    num_classes = model_info.num_classes if num_classes is None else num_classes
    if pretrained:
        if num_classes != model_info.num_classes:
            raise ValueError(f"the released {name} predicts {model_info.num_classes} classes, not num_classes="
                             f"{num_classes}; to fine-tune on other classes, start a training run with "
                             f"init_checkpoint={name!r} (the COCO classes of your data keep their trained rows, new "
                             "ones start fresh)")
        model = load_checkpoint(name, aux_loss=False)
    else:
        config = model_info.config().replace(num_classes=num_classes, aux_loss=False)
        model = build_detr_panoptic(config) if model_info.task == "panoptic" else build_detr(config)
        # the release's categories fit only its own number of classes; an untrained model has no eval size
        model.meta = (model_info.meta.replace(eval_size=None) if num_classes == model_info.num_classes
                      else ModelMeta())
    if not return_postprocessor:
        return model
    if model_info.task == "panoptic":
        if model.meta.is_thing is None:
            raise ValueError(f"a {name} model with num_classes={num_classes} has no things/stuff split for the "
                             "panoptic post-processor; build PostProcessPanoptic(is_thing) yourself")
        return model, PostProcessPanoptic(list(model.meta.is_thing), threshold=threshold)
    return model, PostProcess()
