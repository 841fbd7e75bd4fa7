"""The optimizer's parameter groups: which of a model's parameters train at which learning rate and weight decay.

The model declares which parameters are which (:class:`detr.models.detector.Detector`'s hooks: its
``backbone_parameters``, ``slow_modules``, ``no_weight_decay_parameters``, ``backbone_layer_depths`` and
``decoder_parameters``); the recipe's rates and decays (:class:`detr.models.recipe.OptimizerRecipe`) make the
groups here, in the training layer.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from detr.models.detector import Detector


def parameter_groups(model: Detector, *, lr: float, lr_backbone: float, lr_layer_decay: float = 1.0,
                     lr_component_decay: float = 1.0) -> list[dict[str, Any]]:
    """AdamW's parameter groups of ``model``'s trainable parameters, chosen by its box detector's hooks:
    "transformer" (every one outside the others) at ``lr``, "norms" (its ``no_weight_decay_parameters`` outside
    the backbone, where it has any) at ``lr`` without weight decay, "sampling_offsets" (its ``slow_modules``, where
    it has any) at ``lr`` × 0.1, "decoder" (its ``decoder_parameters``, where it has any) at ``lr`` ×
    ``lr_component_decay``, and "backbone" (its ``backbone_parameters``, when any of them trains) at
    ``lr_backbone`` × ``lr_component_decay``², split by ``backbone_layer_depths`` into "backbone.depth{k}" groups at
    × ``lr_layer_decay``^k where the detector has depths, and into "...no_decay" groups (weight decay 0) for its
    no-decay parameters in the backbone. Each group keeps ``model.parameters()``'s order; a group without
    ``weight_decay`` takes the optimizer's.

    Raises ValueError for a ``lr_layer_decay`` or ``lr_component_decay`` other than 1 that the detector has
    nothing to apply to."""
    detector = model.box_detector
    depths = detector.backbone_layer_depths() if lr_layer_decay != 1.0 else {}
    decoder = {id(parameter) for parameter in detector.decoder_parameters()} if lr_component_decay != 1.0 else set()
    for name, value, present, needs in (("lr_layer_decay", lr_layer_decay, depths, "backbone layer depths"),
                                        ("lr_component_decay", lr_component_decay, decoder, "decoder parameters")):
        if value != 1.0 and not present:
            raise ValueError(f"{name}={value}: {type(detector).__name__} has no {needs} to apply it to (RF-DETR's "
                             f"recipe); set {name} to 1")
    in_backbone = {id(parameter) for parameter in detector.backbone_parameters()}
    slow_modules = detector.slow_modules()
    slow = {id(parameter) for module in slow_modules for parameter in module.parameters()}
    no_decay = {id(parameter) for parameter in detector.no_weight_decay_parameters()} - slow
    decoder -= in_backbone | slow | no_decay
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    others = in_backbone | slow | no_decay | decoder
    groups = [{"params": [p for p in trainable if id(p) not in others], "lr": lr, "name": "transformer"}]
    if any(id(p) in no_decay and id(p) not in in_backbone for p in trainable):
        groups.append({"params": [p for p in trainable if id(p) in no_decay and id(p) not in in_backbone],
                       "lr": lr, "weight_decay": 0.0, "name": "norms"})
    if slow_modules:
        groups.append({"params": [p for p in trainable if id(p) in slow], "lr": lr * 0.1, "name": "sampling_offsets"})
    if decoder:
        groups.append({"params": [p for p in trainable if id(p) in decoder], "lr": lr * lr_component_decay,
                       "name": "decoder"})
    backbone: dict[tuple[int | None, bool], list[nn.Parameter]] = {}
    for parameter in trainable:
        if id(parameter) in in_backbone:
            key = (depths.get(id(parameter), 0) if depths else None, id(parameter) in no_decay)
            backbone.setdefault(key, []).append(parameter)
    for (depth, decay_free), params in sorted(backbone.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        rate = lr_backbone * lr_component_decay ** 2 * (lr_layer_decay ** depth if depth is not None else 1.0)
        name = "backbone" + (f".depth{depth}" if depth is not None else "") + (".no_decay" if decay_free else "")
        groups.append({"params": params, "lr": rate, "name": name, **({"weight_decay": 0.0} if decay_free else {})})
    return groups


__all__ = ["parameter_groups"]
