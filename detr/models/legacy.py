"""The old one-record model config (before each family had its own config class) → a family's config.

Until the families had their own config classes, one record held every family's options (74 fields, the family
named by ``architecture``, "detr" when absent). Checkpoints (``checkpoint["detr"]["model_config"]``, the training
system's ``hyper_parameters["detr"]``), YAML configs (``model.detr:``) and the readers of that time wrote it. They
still load: :func:`migrate_flat_config` turns such a dict into the fields of the family it names (its
:class:`detr.models.family.Family`'s ``flat_names`` say where an option moved) and leaves out the options that family
never read: the one record's checks had accepted the dict, so such an option was inert for it (a YAML chain that
switched families mid-way leaves the first family's values behind, e.g. ``denoising_groups`` under Deformable DETR).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


logger = logging.getLogger(__name__)

#: The one record's fields and their defaults (the last version that wrote it); a field a family's config does
#: not have was inert for that family at this value.
FLAT_DEFAULTS: dict[str, Any] = {
    "backbone": "resnet50", "dilation": False, "position_encoding": "sine", "hidden_dim": 256, "num_heads": 8,
    "num_encoder_layers": 6, "num_decoder_layers": 6, "dim_feedforward": 2048, "dropout": 0.1, "pre_norm": False,
    "num_queries": 100, "num_classes": 91, "aux_loss": True, "pretrained_backbone": False,
    "backbone_norm": "frozen_batch_norm", "backbone_trainable_layers": 3, "backbone_last_stage": "layer4",
    "query_type": "learned", "class_head": "softmax", "denoising": False, "denoising_groups": 5,
    "denoising_label_noise": 0.2, "denoising_box_noise": 0.4, "anchor_local_attention": 0.0, "query_groups": 1,
    "dense_aux_head": False, "architecture": "detr", "num_feature_levels": 4, "num_points": 4, "box_refine": False,
    "two_stage": False, "encoder_hidden_dim": None, "encoder_dim_feedforward": None, "csp_expansion": 1.0,
    "sampling_offset_scale": 0.5, "sampling_method": "bilinear", "backbone_learnable_affine": False,
    "num_points_per_level": None, "csp_depth_multiplier": 1.0, "max_num_bins": 32, "reg_scale": 4.0, "reg_up": 0.5,
    "lqe_top_k": 4, "lqe_hidden_dim": 64, "lqe_layers": 2, "lite_encoder": False, "decoder_gateway": True,
    "decoder_activation": "relu", "decoder_mlp_activation": "relu", "csp_trailing_conv": True, "vit_dim": 384,
    "vit_depth": 12, "vit_heads": 6, "vit_mlp_dim": 1536, "vit_register_tokens": 4, "vit_out_layers": (5, 8, 11),
    "vit_gated_mlp": False, "adapter_channels": 16, "vit_hidden_dim": 384, "vit_num_layers": 12,
    "vit_num_heads": 6, "vit_mlp_ratio": 4, "vit_out_indices": (2, 5, 8, 11), "vit_num_windows": 4,
    "vit_patch_size": 14, "vit_position_size": 518, "cross_attention_heads": 16, "projector_expansion": 0.5,
    "projector_blocks": 3, "instance_masks": False, "mask_dim_feedforward": 1024, "vit_window_blocks": None,
    "projector_scales": (1.0,), "projector_norm": "layer_norm",
}


def is_flat_config(values: Mapping[str, Any]) -> bool:
    """Whether ``values`` is in the old one-record form: no ``family`` key (every name one of its fields)."""
    return "family" not in values


def migrate_flat_config(values: Mapping[str, Any], family: Any, where: str) -> dict[str, Any]:
    """The fields of ``family``'s config (records as nested dicts; ``family`` a :class:`detr.models.family.Family`,
    whose module imports this one) from an old one-record dict ``values`` (any subset of :data:`FLAT_DEFAULTS`'
    fields, ``architecture`` = the family's name). A field missing from ``values`` takes the one record's default, not the family config's (what the old file meant); an option the
    family does not read is left out (logged). A name that the one record did not have raises ValueError naming
    ``where`` and the options."""
    unknown = sorted(set(values) - set(FLAT_DEFAULTS))
    if unknown:
        raise ValueError(f"{where}: unknown model option(s) {unknown}; a {family.title} config's options are "
                         f"{sorted(field for field in family.config_class.__dataclass_fields__)}")
    flat = {**FLAT_DEFAULTS, **values}
    flat.pop("architecture")
    if family.migrate_flat is not None:
        flat = family.migrate_flat(flat)
    own = set(family.config_class.__dataclass_fields__)
    migrated: dict[str, Any] = {}
    for name, value in flat.items():
        target = family.flat_names.get(name, name)
        record, _, field = target.rpartition(".")
        if target.split(".")[0] in own:
            container = migrated
            for part in record.split(".") if record else ():
                container = container.setdefault(part, {})
            container[field] = value
        elif not _same(value, FLAT_DEFAULTS.get(name)):
            logger.debug("%s: %s=%r is not an option of %s: left out (it was inert there)", where, name, value,
                         family.title)
    return migrated


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return [float(item) for item in value] == [float(item) for item in default]
    return value == default
