"""DEIMv2 weights in and out of transformers' ``deimv2`` directories (``Deimv2ForObjectDetection``), HGNetV2
backbones only.

A directory as ``Deimv2ForObjectDetection.save_pretrained`` writes it (``config.json`` of model_type "deimv2",
``model.safetensors``, ``preprocessor_config.json``) reads into this project's D-FINE class with DEIMv2's parts
(``architecture="deimv2"``): the hybrid encoder (the N model) or the lite encoder (``encoder_type`` "lite"), the gate
or not (``use_gateway``), ReLU or SiLU query positions (``decoder_activation_function``), and the S-X models' DINOv3 ViT with its spatial tuning
adapter (backbone_config model_type "dinov3_vit": ``backbone="dinov3_vit"``, the ``vit_*`` options). The renames
are D-FINE's (:mod:`detr.checkpoints.dfine`) but for the backbone and input projections under
``model.conv_encoder``, the fusion blocks (transformers' names here too) and the SwiGLU ``mlp`` (``ffn`` here):
``DEIMV2_KEYS``, ``DEIMV2_LITE_KEYS``, ``DEIMV2_DINOV3_KEYS``. Refused with one line naming config.json: a shared box
head, DINOv3 settings other than the released models' kind (biases, RoPE base, patch size, ...), and D-FINE's own
refusals. transformers is never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detr.categories import CategoryMap
from detr.checkpoints.dfine import (
    DEIMV2_DINOV3_KEYS,
    DEIMV2_KEYS,
    DEIMV2_LITE_KEYS,
    read_huggingface_family,
    write_huggingface_family,
)
from detr.checkpoints.formats import CheckpointContents, CheckpointError, ExportError
from detr.checkpoints.huggingface import read_json
from detr.models.deimv2.config import DEIMv2Config, DINOv3Size
from detr.models.dfine.model import DFINE

MODEL_TYPE = "deimv2"


def read_huggingface_deimv2(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``Deimv2ForObjectDetection`` directory (HGNetV2 backbone) into this project's layout and
    a :class:`detr.models.deimv2.config.DEIMv2Config`.

    Raises:
        CheckpointError: a DINOv3 backbone or other settings this project does not build, keys without a
            counterpart.
    """
    preprocessor = Path(directory) / "preprocessor_config.json"
    if preprocessor.is_file() and read_json(preprocessor).get("do_normalize"):
        raise CheckpointError(f"{preprocessor}: do_normalize (mean / std) is not supported: this project's DEIMv2 "
                              f"takes pixels / 255 without mean and std (RTDetrImageProcessor's default)")
    return read_huggingface_family(directory, "deimv2", vit_backbone=_dinov3_options)


#: DINOv3ViTConfig fields this project's ViT has fixed (transformers' defaults, the released models' values).
_DINOV3_FIXED = {"patch_size": 16, "num_channels": 3, "rope_theta": 100.0, "layer_norm_eps": 1e-5,
                 "query_bias": True, "key_bias": False, "value_bias": True, "proj_bias": True, "mlp_bias": True,
                 "apply_layernorm": True, "reshape_hidden_states": True}


def _dinov3_options(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """DEIMv2Config options of config.json's DINOv3 backbone_config and adapter."""
    vit = config["backbone_config"]
    gated = bool(vit.get("use_gated_mlp", False))
    expected = {**_DINOV3_FIXED, "hidden_act": "silu" if gated else "gelu"}
    wrong = {key: vit[key] for key, value in expected.items() if key in vit and vit[key] != value}
    out_layers = [int(index) for index in vit.get("out_indices") or ()]
    if wrong or len(out_layers) != 3:
        raise CheckpointError(f"{config_path}: this project's DINOv3 ViT has {expected} and three out_indices; the "
                              f"backbone_config sets {wrong or {'out_indices': out_layers}}, which it cannot reproduce")
    # absent fields take DINOv3ViTConfig's defaults (ViT-S/16)
    size = DINOv3Size(width=int(vit.get("hidden_size", 384)), depth=int(vit.get("num_hidden_layers", 12)),
                      heads=int(vit.get("num_attention_heads", 6)), mlp_dim=int(vit.get("intermediate_size", 1536)),
                      register_tokens=int(vit.get("num_register_tokens", 0)), out_layers=tuple(out_layers),
                      gated_mlp=gated)
    return {"vit": size, "adapter_channels": int(config.get("spatial_tuning_adapter_inplanes", 16))}


def _dinov3_backbone_fields(model: DFINE) -> dict[str, Any]:
    """config.json's backbone fields for a DINOv3 model (the inverse of :func:`_dinov3_options`)."""
    config = model.config
    assert isinstance(config, DEIMv2Config)
    size = config.vit
    vit = {"model_type": "dinov3_vit", **_DINOV3_FIXED, "hidden_size": size.width,
           "num_hidden_layers": size.depth, "num_attention_heads": size.heads,
           "intermediate_size": size.mlp_dim, "num_register_tokens": size.register_tokens,
           "use_gated_mlp": size.gated_mlp, "hidden_act": "silu" if size.gated_mlp else "gelu",
           "out_indices": list(size.out_layers), "layerscale_value": 1.0, "drop_path_rate": 0.0}
    return {"backbone_config": vit, "encoder_in_channels": list(model.backbone.out_channels),
            "spatial_tuning_adapter_inplanes": config.adapter_channels}


def save_pretrained_deimv2(model: DFINE, directory: str | Path, *, category_map: CategoryMap | None = None,
                           backbone_format: str | None = None) -> Path:
    """Write ``model`` (``architecture="deimv2"``) as ``Deimv2ForObjectDetection.save_pretrained`` would.
    ``backbone_format`` is not read (the backbone is HGNetV2)."""
    if not isinstance(model.config, DEIMv2Config):
        raise ExportError("save_pretrained_deimv2 needs a DEIMv2 built by build_detr (a DEIMv2Config)")
    if model.config.backbone == "dinov3_vit":
        return write_huggingface_family(model, directory, category_map=category_map, keys=DEIMV2_DINOV3_KEYS,
                                        backbone=_dinov3_backbone_fields(model))
    keys = DEIMV2_LITE_KEYS if model.config.lite_encoder else DEIMV2_KEYS
    return write_huggingface_family(model, directory, category_map=category_map, keys=keys)
