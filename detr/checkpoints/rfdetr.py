"""RF-DETR weights in (transformers' ``rf_detr`` directories) and out (transformers).

:func:`read_huggingface_rfdetr` reads a directory as ``RfDetrForObjectDetection.save_pretrained`` (or
``RfDetrForInstanceSegmentation``'s) writes it: ``config.json`` (model_type "rf_detr", an ``rf_detr_dinov2``
backbone) + ``model.safetensors`` + optionally ``preprocessor_config.json`` (``RfDetrImageProcessor``: the square
size). Any label count and any ViT size, windows and patch size; ``id2label`` becomes the category map; with a
segmentation head the model predicts masks too. :func:`save_pretrained_rfdetr` writes this project's model back in
that format, so that transformers' ``from_pretrained`` gives the same outputs.

transformers writes the weights in the authors' layout (roboflow/rf-detr; it renames them when it loads), so this
reader reads the authors' keys. Their Group DETR copies (``group_detr`` groups of queries and encoder heads, 13 in
training) are all kept (``query_groups``): inference reads the first, training (a fine-tuning run) all of them; the
writer writes the model's groups (``group_detr`` in config.json).

=====================================================  ==============================================
this project                                           the authors' layout (transformers' files)
=====================================================  ==============================================
``backbone.{patch_embed,cls_token,mask_token,          ``backbone.0.encoder.encoder.embeddings.{patch_embeddings.
position_embeddings}``                                 projection,cls_token,mask_token,position_embeddings}``
``backbone.blocks.{}.attention.{q,k,v,o}_proj``        ``...encoder.layer.{}.attention.{attention.{query,key,value},
                                                       output.dense}``
``backbone.blocks.{}.layer_scale{1,2}``                ``...encoder.layer.{}.layer_scale{1,2}.lambda1``
``backbone.norm``                                      ``backbone.0.encoder.encoder.layernorm``
``projector.0.{conv1,conv2,bottlenecks.{}.conv{1,2}}`` ``backbone.0.projector.stages.0.0.{cv1,cv2,m.{}.cv{1,2}}``
  (``conv``, ``norm``); ``projector.0.norm``             (``conv``, ``bn``); ``backbone.0.projector.stages.0.1``
``decoder.{layers,norm,ref_point_head}``               ``transformer.decoder.{layers,norm,ref_point_head}``
``decoder.{enc_output,enc_output_norm,                 ``transformer.{enc_output,enc_output_norm,enc_out_class_embed,
enc_class_head,enc_box_head}.{}`` (a group each)       enc_out_bbox_embed}.{}``
``decoder.{query_embed,reference_points}``             ``{query_feat,refpoint_embed}`` (num_queries rows a group)
``decoder.{class_head,box_head}``                      ``{class_embed,bbox_embed}``
``mask_head.blocks.{}.{depthwise_conv,norm,            ``segmentation_head.blocks.{}.{dwconv,norm,pwconv1}``
pointwise_conv}``
``mask_head.{spatial_proj,query_block.{norm,fc1,fc2},  ``segmentation_head.{spatial_features_proj,query_features_block.
query_proj,bias}``                                     {norm_in,layers.0,layers.2},query_features_proj,bias}``
=====================================================  ==============================================

transformers is never imported; safetensors only for .safetensors files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from detr.categories import CategoryMap
from detr.checkpoints.formats import CheckpointContents, CheckpointError, ExportError, StatedSize, check_stated_sizes
from detr.checkpoints.huggingface import (
    import_safetensors,
    label_fields,
    processor_square_size,
    read_json,
    read_meta,
    read_weights,
    write_huggingface_directory,
)
from detr.checkpoints.key_map import Fuse, KeyMap, Rename, refuse_unless
from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.models.inputs import IMAGENET_MEAN, IMAGENET_STD
from detr.models.rfdetr.model import EVAL_SIZE, RFDETR

logger = logging.getLogger(__name__)

MODEL_TYPE = "rf_detr"
_VIT = "backbone.0.encoder.encoder."
_C2F = "backbone.0.projector.stages.0.0."

#: (the authors' key start, this project's), ``{}`` an index.
_RULES: tuple[tuple[str, str], ...] = (
    (_VIT + "embeddings.patch_embeddings.projection.", "backbone.patch_embed."),
    *((_VIT + f"embeddings.{name}", f"backbone.{name}") for name in ("cls_token", "mask_token", "position_embeddings")),
    *((_VIT + f"encoder.layer.{{}}.attention.attention.{theirs}.", f"backbone.blocks.{{}}.attention.{ours}_proj.")
      for theirs, ours in (("query", "q"), ("key", "k"), ("value", "v"))),
    (_VIT + "encoder.layer.{}.attention.output.dense.", "backbone.blocks.{}.attention.o_proj."),
    (_VIT + "encoder.layer.{}.layer_scale1.lambda1", "backbone.blocks.{}.layer_scale1"),
    (_VIT + "encoder.layer.{}.layer_scale2.lambda1", "backbone.blocks.{}.layer_scale2"),
    (_VIT + "encoder.layer.{}.", "backbone.blocks.{}."),
    (_VIT + "layernorm.", "backbone.norm."),
    (_C2F + "m.{}.cv{}.bn.", "projector.0.bottlenecks.{}.conv{}.norm."),
    (_C2F + "m.{}.cv{}.conv.", "projector.0.bottlenecks.{}.conv{}.conv."),
    (_C2F + "cv{}.bn.", "projector.0.conv{}.norm."),
    (_C2F + "cv{}.conv.", "projector.0.conv{}.conv."),
    ("backbone.0.projector.stages.0.1.", "projector.0.norm."),
    *((f"transformer.decoder.{part}.", f"decoder.{part}.") for part in ("layers", "norm", "ref_point_head")),
    ("transformer.enc_output.{}.", "decoder.enc_output.{}."),
    ("transformer.enc_output_norm.{}.", "decoder.enc_output_norm.{}."),
    ("transformer.enc_out_class_embed.{}.", "decoder.enc_class_head.{}."),
    ("transformer.enc_out_bbox_embed.{}.", "decoder.enc_box_head.{}."),
    ("query_feat.", "decoder.query_embed."),
    ("refpoint_embed.", "decoder.reference_points."),
    ("class_embed.", "decoder.class_head."),
    ("bbox_embed.", "decoder.box_head."),
    ("segmentation_head.blocks.{}.dwconv.", "mask_head.blocks.{}.depthwise_conv."),
    ("segmentation_head.blocks.{}.pwconv1.", "mask_head.blocks.{}.pointwise_conv."),
    ("segmentation_head.blocks.{}.norm.", "mask_head.blocks.{}.norm."),
    ("segmentation_head.spatial_features_proj.", "mask_head.spatial_proj."),
    ("segmentation_head.query_features_block.norm_in.", "mask_head.query_block.norm."),
    ("segmentation_head.query_features_block.layers.0.", "mask_head.query_block.fc1."),
    ("segmentation_head.query_features_block.layers.2.", "mask_head.query_block.fc2."),
    ("segmentation_head.query_features_proj.", "mask_head.query_proj."),
    ("segmentation_head.bias", "mask_head.bias"),
)


RFDETR_KEYS = KeyMap("RF-DETR", tuple(Rename(theirs, ours) for theirs, ours in _RULES),
                     source="the authors'")


LW_MODEL_TYPE = "lw_detr"
_LW_VIT = "model.backbone.backbone."
#: LW-DETR: (transformers' key, this project's), as :data:`_RULES`; the decoder's q, k, v projections are joined.
_LW_RULES: tuple[tuple[str, str], ...] = (
    (_LW_VIT + "embeddings.projection.", "backbone.patch_embed."),
    (_LW_VIT + "embeddings.position_embeddings", "backbone.position_embeddings"),
    *((_LW_VIT + f"encoder.layer.{{}}.attention.attention.{theirs}.", f"backbone.blocks.{{}}.attention.{ours}_proj.")
      for theirs, ours in (("query", "q"), ("key", "k"), ("value", "v"))),
    (_LW_VIT + "encoder.layer.{}.attention.output.", "backbone.blocks.{}.attention.o_proj."),
    (_LW_VIT + "encoder.layer.{}.gamma_1", "backbone.blocks.{}.layer_scale1"),
    (_LW_VIT + "encoder.layer.{}.gamma_2", "backbone.blocks.{}.layer_scale2"),
    (_LW_VIT + "encoder.layer.{}.layernorm_before.", "backbone.blocks.{}.norm1."),
    (_LW_VIT + "encoder.layer.{}.layernorm_after.", "backbone.blocks.{}.norm2."),
    (_LW_VIT + "encoder.layer.{}.intermediate.", "backbone.blocks.{}.mlp."),
    ("model.backbone.projector.scale_layers.{}.sampling_layers.{}.layers.", "projector.{}.sampling.{}."),
    ("model.backbone.projector.scale_layers.{}.layer_norm.", "projector.{}.norm."),
    ("model.backbone.projector.scale_layers.{}.projector_layer.", "projector.{}."),
    ("model.decoder.layers.{}.self_attn.o_proj.", "decoder.layers.{}.self_attn.out_proj."),
    ("model.decoder.layers.{}.self_attn_layer_norm.", "decoder.layers.{}.norm1."),
    ("model.decoder.layers.{}.cross_attn_layer_norm.", "decoder.layers.{}.norm2."),
    ("model.decoder.layers.{}.mlp.fc1.", "decoder.layers.{}.linear1."),
    ("model.decoder.layers.{}.mlp.fc2.", "decoder.layers.{}.linear2."),
    ("model.decoder.layers.{}.layer_norm.", "decoder.layers.{}.norm3."),
    ("model.decoder.layers.{}.cross_attn.", "decoder.layers.{}.cross_attn."),
    ("model.decoder.layernorm.", "decoder.norm."),
    ("model.decoder.ref_point_head.", "decoder.ref_point_head."),
    ("model.enc_output.{}.", "decoder.enc_output.{}."),
    ("model.enc_output_norm.{}.", "decoder.enc_output_norm.{}."),
    ("model.enc_out_class_embed.{}.", "decoder.enc_class_head.{}."),
    ("model.enc_out_bbox_embed.{}.", "decoder.enc_box_head.{}."),
    ("model.query_feat.", "decoder.query_embed."),
    ("model.reference_point_embed.", "decoder.reference_points."),
    ("class_embed.", "decoder.class_head."),
    ("bbox_embed.", "decoder.box_head."),
)
LWDETR_KEYS = KeyMap("LW-DETR", tuple(Rename(theirs, ours) for theirs, ours in _LW_RULES),
                     fuse=(Fuse("model.decoder.layers.{}.self_attn.", "decoder.layers.{}.self_attn."),))


def _side(value: Any, name: str, config_path: Path) -> int:
    """A size that transformers allows as an int or a pair: one square side."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise CheckpointError(f"{config_path}: backbone_config {name} {list(value)} is not square")
        value = value[0]
    return int(value)


def _lw_vit_options(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    vit = config.get("backbone_config") or {}
    if vit.get("model_type") != "lw_detr_vit":
        raise CheckpointError(f"{config_path}: the backbone must be transformers' LwDetrViT (backbone_config "
                              f"model_type 'lw_detr_vit'), got {vit.get('model_type')!r}")
    refuse_unless(vit, {"hidden_act": "gelu", "layer_norm_eps": 1e-6, "qkv_bias": True, "num_channels": 3,
                        "use_absolute_position_embeddings": True}, config_path, "RF-DETR", "a backbone with")
    windows = int(vit.get("num_windows", 16))
    side = round(windows ** 0.5)
    if side * side != windows:
        raise CheckpointError(f"{config_path}: backbone_config num_windows {windows} is not a square number")
    layers = int(vit.get("num_hidden_layers", 12))
    out_indices = vit.get("out_indices") or [int(name.removeprefix("stage")) for name in vit.get("out_features", ())]
    width = int(vit.get("hidden_size", 768))
    return {"backbone": "lwdetr_vit", "vit": WindowedViTSize(
        width=width, depth=layers, heads=int(vit.get("num_attention_heads", 12)),
        mlp_dim=int(vit.get("mlp_ratio", 4)) * width, out_indices=tuple(int(i) for i in out_indices) or (layers,),
        num_windows=side, window_blocks=tuple(int(i) for i in vit.get("window_block_indices", ())),
        patch_size=_side(vit.get("patch_size", 16), "patch_size", config_path),
        position_size=_side(vit.get("pretrain_image_size", 224), "pretrain_image_size", config_path))}


def _vit_options(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    vit = config.get("backbone_config") or {}
    if vit.get("model_type") != "rf_detr_dinov2":
        raise CheckpointError(f"{config_path}: the backbone must be transformers' RfDetrDinov2 (backbone_config "
                              f"model_type 'rf_detr_dinov2'), got {vit.get('model_type')!r}")
    refuse_unless(vit, {"hidden_act": "gelu", "layer_norm_eps": 1e-6, "qkv_bias": True, "use_swiglu_ffn": False,
                        "apply_layernorm": True, "reshape_hidden_states": True, "num_channels": 3},
                  config_path, "RF-DETR", "a backbone with")
    layers = int(vit.get("num_hidden_layers", 12))
    out_indices = vit.get("out_indices") or [int(name.removeprefix("stage")) for name in vit.get("out_features", ())]
    width = int(vit.get("hidden_size", 768))
    return {"backbone": "dinov2_windowed", "vit": WindowedViTSize(
        width=width, depth=layers, heads=int(vit.get("num_attention_heads", 12)),
        mlp_dim=int(vit.get("mlp_ratio", 4)) * width, out_indices=tuple(int(i) for i in out_indices) or (layers,),
        num_windows=int(vit.get("num_windows", 4)), patch_size=_side(vit.get("patch_size", 14), "patch_size", config_path),
        position_size=_side(vit.get("image_size", 224), "image_size", config_path))}


def to_our_state_dict(weights: dict[str, torch.Tensor], where: str, *, lw: bool = False) -> dict[str, torch.Tensor]:
    """The authors' keys (RF-DETR's transformers files: :data:`RFDETR_KEYS`) or transformers' (LW-DETR's, ``lw``:
    :data:`LWDETR_KEYS`, the decoder's q, k, v joined) → this project's, every query group."""
    return (LWDETR_KEYS if lw else RFDETR_KEYS).to_ours(weights, where)


#: The sizes config.json states that the weights show (this project's keys): checked by
#: :func:`detr.checkpoints.formats.check_stated_sizes`.
STATED_SIZES: tuple[StatedSize, ...] = (
    ("d_model", lambda config: config.hidden_dim, "decoder.class_head.weight", 1),
    ("decoder_ffn_dim", lambda config: config.dim_feedforward, "decoder.layers.0.linear1.weight", 0),
    ("decoder_layers", lambda config: config.num_decoder_layers, "decoder.layers.", None),
    ("decoder_cross_attention_heads x decoder_n_points x levels",
     lambda config: config.cross_attention_heads * config.num_points * config.num_feature_levels,
     "decoder.layers.0.cross_attn.attention_weights.weight", 0),
    ("backbone_config hidden_size", lambda config: config.vit.width, "backbone.patch_embed.weight", 0),
)


def read_huggingface_rfdetr(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``RfDetrForObjectDetection`` (or ``RfDetrForInstanceSegmentation``) directory into this
    project's layout + config.

    Raises:
        CheckpointError: settings this project's RF-DETR lacks (other activations, SwiGLU, several feature levels, a
            non-square resize, ...), keys without a counterpart.
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    config = read_json(config_path)
    lw = config.get("model_type") == LW_MODEL_TYPE
    vit = _lw_vit_options(config, config_path) if lw else _vit_options(config, config_path)
    scales = tuple(float(scale) for scale in config.get("projector_scale_factors") or ()) if lw else (1.0,)
    refuse_unless(config, {"activation_function": "silu", "decoder_activation_function": "relu",
                           "num_feature_levels": len(scales), "attention_bias": True,
                           **({"batch_norm_eps": 1e-5} if lw else {
                               "layer_norm_eps": 1e-5, "segmentation_head_activation_function": "gelu",
                               "mask_downsample_ratio": 4})}, config_path, "RF-DETR")
    num_queries, groups = int(config.get("num_queries", 300)), int(config.get("group_detr", 13))
    state_dict = to_our_state_dict(read_weights(directory), str(directory), lw=lw)
    if "decoder.class_head.weight" not in state_dict:
        raise CheckpointError(f"{directory}: no class head (class_embed): an RfDetrModel without the detection heads?")
    rows = state_dict["decoder.query_embed.weight"].shape[0] if "decoder.query_embed.weight" in state_dict else None
    if rows is not None and rows != num_queries * groups:
        raise CheckpointError(f"{directory}: {rows} query rows (query_feat) are not num_queries {num_queries} × "
                              f"group_detr {groups} of config.json")
    model_config = RFDETRConfig(
        class_head="sigmoid", num_feature_levels=len(scales), projector_scales=scales,
        projector_norm="batch_norm" if lw else "layer_norm", **vit,
        hidden_dim=int(config.get("d_model", 256)), num_heads=int(config.get("decoder_self_attention_heads", 8)),
        cross_attention_heads=int(config.get("decoder_cross_attention_heads", 16)),
        num_points=int(config.get("decoder_n_points", 4)), dim_feedforward=int(config.get("decoder_ffn_dim", 2048)),
        num_decoder_layers=int(config.get("decoder_layers", 3)), num_queries=num_queries, query_groups=groups,
        dropout=float(config.get("dropout", 0.0 if lw else 0.1)), projector_expansion=float(config.get("hidden_expansion", 0.5)),
        projector_blocks=int(config.get("c2f_num_blocks", 3)),
        instance_masks="mask_head.bias" in state_dict,
        mask_dim_feedforward=int(config.get("intermediate_size", 1024)) if "mask_head.bias" in state_dict else 1024,
        num_classes=int(state_dict["decoder.class_head.weight"].shape[0]), pretrained_backbone=False)
    check_stated_sizes(model_config, state_dict, STATED_SIZES, config_path, str(directory))
    size = processor_square_size(directory, default=EVAL_SIZE)
    meta = read_meta(config, model_config.num_classes, config_path, (size, size) if size is not None else None)
    return CheckpointContents(state_dict, model_config, meta)


def to_huggingface_state_dict(model: RFDETR) -> dict[str, torch.Tensor]:
    """This project's RF-DETR → the authors' keys (as transformers writes them, every query group; LW-DETR:
    transformers' keys), every tensor a contiguous copy, in the order of the model's state dict."""
    lw = model.config is not None and model.config.backbone == "lwdetr_vit"
    return (LWDETR_KEYS if lw else RFDETR_KEYS).to_theirs(model.state_dict())


def huggingface_rfdetr_config(model: RFDETR, *, category_map: CategoryMap | None = None) -> dict[str, Any]:
    """config.json of :func:`save_pretrained_rfdetr`."""
    config = model.config
    if not isinstance(config, RFDETRConfig):
        raise ExportError("save_pretrained_rfdetr needs an RF-DETR built by build_detr (model.config)")
    labels = label_fields(category_map or model.meta.category_map, model.num_classes, model.meta.score_threshold)
    vit = config.vit
    layers = vit.depth
    decoder = {"d_model": config.hidden_dim, "hidden_expansion": config.projector_expansion,
               "c2f_num_blocks": config.projector_blocks, "activation_function": "silu",
               "num_feature_levels": config.num_feature_levels, "decoder_layers": config.num_decoder_layers,
               "decoder_self_attention_heads": config.num_heads,
               "decoder_cross_attention_heads": config.cross_attention_heads, "decoder_n_points": config.num_points,
               "decoder_ffn_dim": config.dim_feedforward, "decoder_activation_function": "relu",
               "num_queries": config.num_queries, "group_detr": config.query_groups, "dropout": config.dropout, "attention_bias": True}
    if config.backbone == "lwdetr_vit":
        return {
            "architectures": ["LwDetrForObjectDetection"], "model_type": LW_MODEL_TYPE,
            "backbone_config": {
                "model_type": "lw_detr_vit", "hidden_size": vit.width, "num_hidden_layers": layers,
                "num_attention_heads": vit.heads, "mlp_ratio": vit.mlp_dim // vit.width, "hidden_act": "gelu",
                "layer_norm_eps": 1e-6, "pretrain_image_size": vit.position_size,
                "patch_size": vit.patch_size, "num_channels": 3, "qkv_bias": True,
                "use_absolute_position_embeddings": True, "num_windows": vit.num_windows ** 2,
                "window_block_indices": list(vit.window_blocks or ()),
                "out_indices": list(vit.out_indices),
                "out_features": [f"stage{i}" for i in vit.out_indices],
                "stage_names": ["stem"] + [f"stage{i}" for i in range(1, layers + 1)]},
            "projector_scale_factors": list(config.projector_scales), "batch_norm_eps": 1e-5, **decoder, **labels}
    return {
        "architectures": ["RfDetrForInstanceSegmentation" if config.instance_masks else "RfDetrForObjectDetection"],
        "model_type": MODEL_TYPE,
        "backbone_config": {
            "model_type": "rf_detr_dinov2", "hidden_size": vit.width, "num_hidden_layers": layers,
            "num_attention_heads": vit.heads, "mlp_ratio": vit.mlp_dim // vit.width, "hidden_act": "gelu",
            "layer_norm_eps": 1e-6, "image_size": vit.position_size, "patch_size": vit.patch_size,
            "num_channels": 3, "qkv_bias": True, "layerscale_value": 1.0, "use_swiglu_ffn": False,
            "num_windows": vit.num_windows, "out_indices": list(vit.out_indices),
            "out_features": [f"stage{i}" for i in vit.out_indices],
            "stage_names": ["stem"] + [f"stage{i}" for i in range(1, layers + 1)]},
        **decoder, "layer_norm_eps": 1e-5, "intermediate_size": config.mask_dim_feedforward,
        "mask_downsample_ratio": 4, "segmentation_head_activation_function": "gelu", **labels,
    }


def preprocessor_config(size: int, *, lw: bool = False) -> dict[str, Any]:
    """preprocessor_config.json of ``RfDetrImageProcessor`` (LW-DETR: ``DeformableDetrImageProcessor``) at a ``size``
    square with ImageNet's mean and std."""
    processor_type = "DeformableDetrImageProcessor" if lw else "RfDetrImageProcessor"
    return {"image_processor_type": processor_type, "format": "coco_detection", "do_resize": True,
            "size": {"height": size, "width": size}, "resample": 2, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(IMAGENET_MEAN),
            "image_std": list(IMAGENET_STD), "do_pad": False}


def save_pretrained_rfdetr(model: RFDETR, directory: str | Path, *, category_map: CategoryMap | None = None,
                           backbone_format: str | None = None) -> Path:
    """Write ``model`` as ``RfDetrForObjectDetection.save_pretrained`` (``RfDetrForInstanceSegmentation``'s with a
    mask head, ``LwDetrForObjectDetection``'s for LW-DETR) would: config.json, model.safetensors and preprocessor_config.json (``RfDetrImageProcessor`` at
    the model's square size). ``backbone_format`` (the DETR writers' choice) is not read: RF-DETR has one
    backbone."""
    config = huggingface_rfdetr_config(model, category_map=category_map)
    tensors = to_huggingface_state_dict(model)
    directory = Path(directory)
    write_huggingface_directory(directory, config, import_safetensors().save(tensors, metadata={"format": "pt"}),
                                preprocessor_config(model.input_spec.size, lw=config["model_type"] == LW_MODEL_TYPE))
    logger.info("wrote %s (%s, %d classes)", directory, config["model_type"], model.num_classes)
    return directory
