"""RF-DETR weights as the authors' ``rfdetr`` package saves them (roboflow/rf-detr): ``rf-detr-base.pth``,
``rf-detr-seg-small.pt``, a fine-tuning run's ``checkpoint_best_total.pth``.

The file is ``{"model": state_dict, "args": ...}``: the state dict in the authors' keys (the layout that transformers'
RF-DETR files keep, so :data:`detr.checkpoints.rfdetr.RFDETR_KEYS` maps it, every Group DETR group included),
``args`` the run's settings (an ``argparse.Namespace`` from ``populate_args`` in the package's engine, a plain dict in
its Lightning-based releases, which also store ``model_config``, the ``ModelConfig`` fields, and ``model_name``).
Released files may carry no settings at all.

The configuration comes from three places, each filling what the one before leaves open:

1. the weights: the ViT's width, blocks, patch size and position table, the decoder's width, layers, FFN width and
   points × heads, the projector's blocks, Group DETR's groups (one encoder head each) and so the queries per group,
   the class count (``num_classes`` + 1 logits: label k is the data set's category k) and the mask head;
2. ``model_config`` and ``args``: ``out_feature_indexes``, ``num_windows``, ``sa_nheads``, ``ca_nheads``,
   ``resolution`` (the square the model was trained at), ``encoder``, ``projector_scale``, ``class_names``;
3. the released model of the file's name (or ``model_name``): the family's preset of that release
   (:data:`detr.models.rfdetr.presets.RELEASES`, the package's ``rfdetr/config.py``: Nano, Small, Medium, Base,
   Large, Seg Preview, Seg Nano ... Seg 2XLarge).

A setting that none gives is refused with one line naming the file and the setting. Not read: LW-DETR's files (their
ViT is another), the ``dinov2_registers_*`` encoders, several projector scales (``P3``, ``P5``), LoRA adapters.

Keypoint models (``RFDETRKeypointPreview``, GroupPose): the schema (keypoints per class) is the file's
``_kp_active_mask``; the keypoint width, cross-attention, inter-instance attention and second projector are read off
the weights (the keypoint head's keys are renamed into :class:`~detr.models.layers.keypoint_head.KeypointHead`'s,
``backbone.0.cross_attn_projector`` into ``keypoint_projector``), ``postprocess_trace_alpha`` off the settings (0.2).
Refused: decoder register tokens (``num_decoder_registers`` > 0) and a second projector that the whole decoder reads
(``dual_projector`` without ``dual_projector_kp_only``). A detection file's empty schema buffer is dropped.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from detr.categories import UNUSED_NAME, CategoryMap
from detr.checkpoints.formats import CheckpointContents, CheckpointError
from detr.checkpoints.key_map import Drop, Rename
from detr.checkpoints.rfdetr import RFDETR_KEYS
from detr.checkpoints.rtdetr import count_numbered
from detr.models.config import ModelMeta
from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.models.rfdetr.presets import RELEASES, Release, release_of_package_name

logger = logging.getLogger(__name__)

_HEAD = "decoder.keypoint_head."
#: The package's GroupPose keypoint keys → :class:`KeypointHead`'s (before the authors' blanket decoder-layer rule).
_KEYPOINT_RENAMES = (
    *(Rename(f"transformer.decoder.layers.{{}}.{part}", f"{_HEAD}layers.{{}}.{part}")
      for part in ("inst_", "memory_in_proj", "kp_", "inter_inst_kp_", "instance_kp_layer_scale")),
    Rename("transformer.decoder.keypoint_pos_embed", f"{_HEAD}keypoint_pos_embed"),
    Rename("transformer.keypoint_query_initializer_enc.", f"{_HEAD}encoder_query_initializer."),
    Rename("transformer.keypoint_query_initializer.", f"{_HEAD}query_initializer."),
    Rename("transformer.enc_out_keypoint_embed.{}.", f"{_HEAD}encoder_predictors.{{}}."),
    Rename("keypoint_embed.", f"{_HEAD}predictor."),
    # the second projector (dual_projector): the first's rules, on its own keys
    *(Rename(rule.theirs.replace("backbone.0.projector.", "backbone.0.cross_attn_projector.", 1),
             "keypoint_" + rule.ours)
      for rule in RFDETR_KEYS.renames if rule.theirs.startswith("backbone.0.projector.")),
)
#: The package's keys: the authors' (those of transformers' RF-DETR files) and its keypoint model's.
PACKAGE_KEYS = replace(RFDETR_KEYS, renames=(*_KEYPOINT_RENAMES, *RFDETR_KEYS.renames), drop=(
    Drop(r"_kp_active_mask$", "the package's keypoint schema, read into num_keypoints_per_class"),
    Drop(r"transformer\.decoder\.keypoint_class_mask$", "the keypoint attention mask, computed from the schema")))
#: The key that marks the authors' RF-DETR state dict (the DINOv2 patch embedding of ``backbone.0``).
PATCH_KEY = "backbone.0.encoder.encoder.embeddings.patch_embeddings.projection.weight"
def release_settings(release: Release) -> dict[str, Any]:
    """What the weights do not show of a released model, as the package's settings, from its preset
    (:data:`detr.models.rfdetr.presets.RELEASES`, the family's one table of sizes)."""
    config = release.config
    return {"sa_nheads": config.num_heads, "ca_nheads": config.cross_attention_heads, "projector_scale": ["P4"],
            "encoder": "dinov2_windowed_small", "out_feature_indexes": list(config.vit.out_indices),
            "num_windows": config.vit.num_windows, "resolution": release.resolution, **release.package_settings}


#: The released models' file stems (``pretrain_weights``), for messages.
RELEASED_FILES = tuple(release.package_file for release in RELEASES.values() if release.package_file)

#: The settings this reader needs besides the weights.
NEEDED = ("out_feature_indexes", "num_windows", "sa_nheads", "ca_nheads", "resolution")


def is_rfdetr_package_file(obj: Any) -> bool:
    """Whether a loaded ``torch.save`` object is the package's ``{"model": <RF-DETR state dict>, ...}``."""
    return isinstance(obj, dict) and isinstance(obj.get("model"), dict) and (
        PATCH_KEY in obj["model"] or any(key.startswith("backbone.0.encoder.base_model.") for key in obj["model"]))


def _fields(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (argparse.Namespace, SimpleNamespace)):
        return vars(value)
    return {}


def _settings(obj: dict[str, Any], path: Path) -> tuple[dict[str, Any], str | None]:
    """The run's settings: the preset of the file's (or model_name's) released model, then ``args``, then
    ``model_config`` over it (None values skipped) → (settings, the preset's name or None)."""
    model_name = obj.get("model_name")
    names = [str(model_name)] if model_name else []
    release = next(filter(None, (release_of_package_name(name) for name in (*names, path.stem))), None)
    settings = release_settings(release) if release else {}
    for source in (_fields(obj.get("args")), _fields(obj.get("model_config"))):
        settings.update({key: value for key, value in source.items() if value is not None})
    return settings, release.package_file if release else None


def _category_map(settings: dict[str, Any], num_classes: int, path: Path) -> CategoryMap | None:
    """Label k is the data set's category k (the package's ``num_classes + 1`` logits): ``class_names`` name labels
    1..N (label 0 the unused background id); without names, 91 logits are COCO's ids."""
    names = settings.get("class_names")
    if names:
        names = [str(name) for name in names]
        if len(names) == num_classes - 1:
            return CategoryMap(tuple(range(num_classes)), (UNUSED_NAME, *names))
        if len(names) == num_classes:
            return CategoryMap(tuple(range(num_classes)), tuple(names))
        logger.warning("%s: %d class_names for %d class logits; the labels are left unnamed", path, len(names),
                       num_classes)
        return None
    return CategoryMap.coco() if num_classes == 91 else None


def _keypoint_fields(weights: dict[str, torch.Tensor], state_dict: dict[str, torch.Tensor],
                     settings: dict[str, Any], hidden: int, path: Path) -> dict[str, Any]:
    """A keypoint model's :class:`RFDETRConfig` fields: the schema from ``_kp_active_mask`` (bool [C_k, K_max]),
    the rest off the renamed weights and the settings; {} for a detection model (no active slot)."""
    active = weights.get("_kp_active_mask")
    if active is None or not bool(active.any()):
        return {}
    if "transformer.register_tokens" in weights:
        raise CheckpointError(f"{path}: the decoder holds register tokens (num_decoder_registers > 0), which this "
                              "project's RF-DETR does not have")
    second = any(key.startswith("backbone.0.cross_attn_projector.") for key in weights)
    if second and settings.get("dual_projector_kp_only") is not True:
        raise CheckpointError(f"{path}: a second projector (dual_projector) that the whole decoder reads: this project "
                              "reads it only with dual_projector_kp_only=True (the keypoints' cross-attention alone), "
                              "which the file does not record")
    width = int(state_dict[f"{_HEAD}keypoint_pos_embed"].shape[1])
    return {"num_keypoints_per_class": tuple(int(n) for n in active.sum(1).tolist()),
            "keypoint_dim_divisor": hidden // width,
            "keypoint_cross_attention": f"{_HEAD}layers.0.kp_cross_attn.value_proj.weight" in state_dict,
            "keypoint_inter_instance_attention": f"{_HEAD}layers.0.inter_inst_kp_attn.in_proj_weight" in state_dict,
            "keypoint_projector": second,
            "keypoint_trace_alpha": float(settings.get("postprocess_trace_alpha", 0.2))}


def read_rfdetr_package_file(obj: dict[str, Any], path: str | Path) -> CheckpointContents:
    """The package's loaded file (:func:`is_rfdetr_package_file`) → this project's state dict, config and meta.

    Raises:
        CheckpointError: a setting neither the weights, ``args``/``model_config`` nor a released preset give, or one
            this project's RF-DETR cannot reproduce (registers, several projector scales, LoRA adapters).
    """
    path = Path(path)
    weights: dict[str, torch.Tensor] = obj["model"]
    if any(key.startswith("backbone.0.encoder.base_model.") for key in weights):
        raise CheckpointError(f"{path}: the ViT holds LoRA adapters (backbone_lora): merge them into the encoder's "
                              "weights with the rfdetr package and save again")
    settings, preset = _settings(obj, path)
    encoder = str(settings.get("encoder", "dinov2_windowed_small"))
    scales = list(settings.get("projector_scale") or ["P4"])
    if "registers" in encoder or not encoder.startswith("dinov2_windowed"):
        raise CheckpointError(f"{path}: encoder {encoder!r} is not read (this project's RF-DETR has DINOv2's windowed "
                              "ViT without register tokens: dinov2_windowed_small or dinov2_windowed_base)")
    if scales != ["P4"]:
        raise CheckpointError(f"{path}: projector_scale {scales} is not read (this project's RF-DETR has one level, "
                              "['P4'], as every current release)")
    missing = [name for name in NEEDED if name not in settings]
    if missing:
        raise CheckpointError(f"{path}: the file records no {missing} (its 'args' lack them and its name is no "
                              f"released model's: {', '.join(RELEASED_FILES)}); rename it to the released model it was "
                              "fine-tuned from")
    state_dict = PACKAGE_KEYS.to_ours(weights, path)
    patch = state_dict["backbone.patch_embed.weight"]
    vit_dim, patch_size = int(patch.shape[0]), int(patch.shape[-1])
    table = int(round((state_dict["backbone.position_embeddings"].shape[1] - 1) ** 0.5))
    groups = count_numbered(state_dict, "decoder.enc_output.")
    rows, hidden = state_dict["decoder.query_embed.weight"].shape
    cross_heads, levels = int(settings["ca_nheads"]), 1
    points = state_dict["decoder.layers.0.cross_attn.attention_weights.weight"].shape[0] // (cross_heads * levels)
    masks = "mask_head.bias" in state_dict
    keypoints = _keypoint_fields(weights, state_dict, settings, int(hidden), path)
    num_classes = int(state_dict["decoder.class_head.weight"].shape[0])
    try:
        vit = WindowedViTSize(
            width=vit_dim, depth=count_numbered(state_dict, "backbone.blocks."),
            heads=vit_dim // 64,  # DINOv2's 64-wide heads (ViT-S 6, ViT-B 12)
            mlp_dim=int(state_dict["backbone.blocks.0.mlp.fc1.weight"].shape[0]) // vit_dim * vit_dim,
            out_indices=tuple(int(i) for i in settings["out_feature_indexes"]),
            num_windows=int(settings["num_windows"]), patch_size=patch_size, position_size=table * patch_size)
        config = RFDETRConfig(
            backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=levels, vit=vit,
            hidden_dim=int(hidden), num_heads=int(settings["sa_nheads"]),
            cross_attention_heads=cross_heads, num_points=int(points),
            dim_feedforward=int(state_dict["decoder.layers.0.linear1.weight"].shape[0]),
            num_decoder_layers=count_numbered(state_dict, "decoder.layers."), num_queries=int(rows) // groups,
            query_groups=groups, dropout=0.0,
            projector_blocks=count_numbered(state_dict, "projector.0.bottlenecks."),
            instance_masks=masks,
            mask_dim_feedforward=int(state_dict["mask_head.query_block.fc1.weight"].shape[0]) if masks else 1024,
            num_classes=num_classes, pretrained_backbone=False, **keypoints)
    except ValueError as error:
        raise CheckpointError(f"{path}: its settings do not describe an RF-DETR this project builds: {error}"
                              ) from error
    size = int(settings["resolution"])
    meta = ModelMeta(category_map=_category_map(settings, num_classes, path), eval_size=(size, size))
    logger.info("%s: the rfdetr package's file%s, %d classes, %d × %d", path,
                f" ({preset}'s settings where the file has none)" if preset else "", num_classes, size, size)
    return CheckpointContents(state_dict, config, meta)
