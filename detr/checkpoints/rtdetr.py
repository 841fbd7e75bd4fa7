"""RT-DETR and RT-DETRv2 weights in (transformers' directories, the authors' release files) and out (transformers).

transformers: :func:`read_huggingface_rtdetr` reads a directory as ``RTDetrForObjectDetection`` and
``RTDetrV2ForObjectDetection.save_pretrained`` write it and as the hub serves the converted models
(PekingU/rtdetr_r18vd ... _r101vd, PekingU/rtdetr_v2_r18vd ...): ``config.json`` (model_type "rt_detr" or
"rt_detr_v2", transformers' RTDetrResNet backbone) + ``model.safetensors`` or ``pytorch_model.bin`` +
``preprocessor_config.json`` (the square size). Any label count; ``id2label`` becomes the category map.

:func:`save_pretrained_rtdetr` writes this project's model in that format, so that transformers'
``from_pretrained`` gives the same outputs.

The authors' files (lyuwenyu/RT-DETR: ``{"ema": {"module": state_dict}}`` or ``{"model": state_dict}``) hold
this project's own key layout but for a few spellings of RT-DETR (v1) and buffers this project recomputes;
:func:`read_rtdetr_state_dict` reads them, with the configuration read off the weights.

This project keeps the authors' parameter names (RT-DETRv2's spelling); transformers renames them:

=====================================================  ==============================================
this project (the authors' layout)                     transformers (as written to disk)
=====================================================  ==============================================
``backbone.conv1.conv1_{1,2,3}.{conv,norm}``           ``model.backbone.model.embedder.embedder.{0,1,2}.
                                                       {convolution,normalization}``
``backbone.res_layers.{s}.blocks.{b}.branch2{a,b,c}``  ``...encoder.stages.{s}.layers.{b}.layer.{0,1,2}``
``...short.{conv,norm}``, ``...short.conv.{conv,norm}``  ``...shortcut.*``, ``...shortcut.1.*`` (after pooling)
``encoder.input_proj.{l}.{conv,norm}``                 ``model.encoder_input_proj.{l}.{0,1}``
``encoder.encoder.0.layers.{i}``: ``self_attn``        ``model.encoder.encoder.0.layers.{i}``: ``self_attn.
(in_proj), ``norm1``, ``linear1/2``, ``norm2``         {q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1/2``,
                                                       ``final_layer_norm``
``encoder.{lateral_convs,fpn_blocks,...}``             ``model.encoder.{lateral_convs,fpn_blocks,...}``
``decoder.input_proj.{l}.{conv,norm}``                 ``model.decoder_input_proj.{l}.{0,1}``
``decoder.decoder.layers.{i}``: ``self_attn``,         ``model.decoder.layers.{i}``: ``self_attn.{q,k,v,out}_proj``,
``norm1``, ``cross_attn``, ``norm2``, ``linear1/2``,   ``self_attn_layer_norm``, ``encoder_attn``,
``norm3``                                              ``encoder_attn_layer_norm``, ``fc1/2``, ``final_layer_norm``
``decoder.{query_pos_head,enc_score_head,              ``model.decoder.query_pos_head``, ``model.{enc_score_head,
enc_bbox_head,denoising_class_embed}``                 enc_bbox_head,denoising_class_embed}``
``decoder.enc_output.{proj,norm}``                     ``model.enc_output.{0,1}``
``decoder.dec_score_head.{i}``, ``dec_bbox_head.{i}``  ``model.decoder.class_embed.{i}``, ``.bbox_embed.{i}``
=====================================================  ==============================================

transformers 5 spells some keys otherwise in memory (``encoder.aifi``, ``o_proj``, ``mlp.fc1``): every spelling
is read. RT-DETRv2's files also hold ``encoder_attn.n_points_scale`` (1 / points, recomputed here) and copies of
the heads at ``class_embed.{i}`` / ``bbox_embed.{i}``, which its forward does not read; the decoder's copies are
the ones used. transformers and timm are never imported; safetensors only for .safetensors files.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from detr.categories import COCO_CATEGORIES, CategoryMap
from detr.checkpoints.formats import CheckpointContents, CheckpointError, ExportError, StatedSize, check_stated_sizes
from detr.checkpoints.huggingface import (
    import_safetensors,
    label_fields,
    processor_square_size,
    read_json,
    read_meta,
    read_weights,
    resnet_block_flags,
    write_huggingface_directory,
)
from detr.checkpoints.key_map import Buffer, Drop, Field, Fuse, KeyMap, Rename, refuse_unless
from detr.models.config import ModelMeta
from detr.models.dfine.config import DFINEConfig
from detr.models.rtdetr.config import RTDETRConfig
from detr.models.rtdetr.model import EVAL_SIZE, RTDETR
from detr.models.rtdetr.resnet_vd import DEPTHS

logger = logging.getLogger(__name__)

MODEL_TYPES = ("rt_detr", "rt_detr_v2")

_DECODER = "model.decoder.layers.{}.", "decoder.decoder.layers.{}."
#: transformers' names of what RT-DETR, D-FINE and DEIMv2 share (their key start, this project's; ``{}`` an
#: index): the input projections, AIFI, the decoder layers' attention and FFN, query selection and the heads.
REALTIME_RENAMES: tuple[Rename, ...] = (
    Rename("model.encoder_input_proj.{}.0.", "encoder.input_proj.{}.conv."),
    Rename("model.encoder_input_proj.{}.1.", "encoder.input_proj.{}.norm."),
    Rename("model.encoder.encoder.{}.layers.{}.self_attn.out_proj.",
           "encoder.encoder.{}.layers.{}.self_attn.out_proj."),
    Rename("model.encoder.encoder.{}.layers.{}.self_attn_layer_norm.", "encoder.encoder.{}.layers.{}.norm1."),
    Rename("model.encoder.encoder.{}.layers.{}.fc{}.", "encoder.encoder.{}.layers.{}.linear{}."),
    Rename("model.encoder.encoder.{}.layers.{}.final_layer_norm.", "encoder.encoder.{}.layers.{}.norm2."),
    Rename("model.decoder_input_proj.{}.0.", "decoder.input_proj.{}.conv."),
    Rename("model.decoder_input_proj.{}.1.", "decoder.input_proj.{}.norm."),
    Rename(_DECODER[0] + "self_attn.out_proj.", _DECODER[1] + "self_attn.out_proj."),
    Rename(_DECODER[0] + "self_attn_layer_norm.", _DECODER[1] + "norm1."),
    Rename(_DECODER[0] + "encoder_attn.", _DECODER[1] + "cross_attn."),
    Rename(_DECODER[0] + "fc{}.", _DECODER[1] + "linear{}."),
    Rename(_DECODER[0] + "final_layer_norm.", _DECODER[1] + "norm3."),
    Rename("model.decoder.query_pos_head.", "decoder.query_pos_head."),
    Rename("model.decoder.class_embed.{}.", "decoder.dec_score_head.{}."),
    Rename("model.decoder.bbox_embed.{}.", "decoder.dec_bbox_head.{}."),
    Rename("model.enc_output.0.", "decoder.enc_output.proj."),
    Rename("model.enc_output.1.", "decoder.enc_output.norm."),
    Rename("model.{selection}.", "decoder.{selection}."),
)
REALTIME_FIELDS: dict[str, Field] = {
    "selection": Field.choice("enc_score_head", "enc_bbox_head", "denoising_class_embed")}
#: The self-attention of AIFI and of the decoder layers (q, k, v ↔ in_proj).
REALTIME_FUSE = (Fuse("model.encoder.encoder.{}.layers.{}.self_attn.", "encoder.encoder.{}.layers.{}.self_attn."),
                 Fuse(_DECODER[0] + "self_attn.", _DECODER[1] + "self_attn."))
#: transformers 5's in-memory names → the names it writes to disk.
REALTIME_SPELLING = ((r"^model\.encoder\.aifi\.", "model.encoder.encoder."), (r"\.o_proj\.", ".out_proj."),
                     (r"\.mlp\.(fc[12])\.", r".\1."))
_RESNET_VD = "model.backbone.model."
#: RT-DETR (v1) in transformers: the shared renames, RTDetrResNet and RT-DETR's own encoder blocks and decoder norm.
RTDETR_KEYS = KeyMap(
    "RT-DETR",
    (Rename(_RESNET_VD + "embedder.embedder.{stem}.{cn}.", "backbone.conv1.conv1_{stem}.{cn}."),
     Rename(_RESNET_VD + "encoder.stages.{}.layers.{}.layer.{branch}.{cn}.",
            "backbone.res_layers.{}.blocks.{}.branch2{branch}.{cn}."),
     Rename(_RESNET_VD + "encoder.stages.{}.layers.{}.shortcut.1.{cn}.",
            "backbone.res_layers.{}.blocks.{}.short.conv.{cn}."),
     Rename(_RESNET_VD + "encoder.stages.{}.layers.{}.shortcut.{cn}.", "backbone.res_layers.{}.blocks.{}.short.{cn}."),
     *REALTIME_RENAMES,
     Rename(_DECODER[0] + "encoder_attn_layer_norm.", _DECODER[1] + "norm2."),
     Rename("model.encoder.{blocks}.", "encoder.{blocks}.")),
    fields={**REALTIME_FIELDS, "stem": Field.shifted(1), "branch": Field.named({"0": "a", "1": "b", "2": "c"}),
            "cn": Field.named({"convolution": "conv", "normalization": "norm"}),
            "blocks": Field.choice("lateral_convs", "fpn_blocks", "downsample_convs", "pan_blocks")},
    fuse=REALTIME_FUSE, read_spelling=REALTIME_SPELLING,
    drop=(Drop(r"(class|bbox)_embed\.\d+\.", "RT-DETRv2's copies of the decoder's heads, which its forward does not "
                                            "read (the decoder's are the ones used)"),))
#: RT-DETRv2: RT-DETR's, with the cross-attention's 1 / points per sampling point (context: (levels, points)).
RTDETR_V2_KEYS = replace(RTDETR_KEYS, buffers=(Buffer(
    _DECODER[0] + "encoder_attn.n_points_scale", _DECODER[1] + "cross_attn.attention_weights.weight",
    lambda levels_points: torch.full((levels_points[0] * levels_points[1],), 1.0 / levels_points[1]),
    "1 / points per point for (levels, decoder_n_points) {context}; per-level point counts are not supported"),))


def to_official_state_dict(state_dict: dict[str, torch.Tensor], where: str = "the state dict", *,
                           num_points: int = 4, num_levels: int = 3) -> dict[str, torch.Tensor]:
    """A transformers ``RTDetr(V2)ForObjectDetection`` state dict → this project's (the authors') keys
    (:data:`RTDETR_V2_KEYS`).

    q, k and v become one ``in_proj``; floats become float32; RT-DETRv2's unused head copies are dropped, and
    its points scale too once checked to be 1 / ``num_points`` (the decoder's points per level) at each of
    ``num_levels``; unknown keys raise :class:`CheckpointError`."""
    return RTDETR_V2_KEYS.to_ours(state_dict, where, context=(num_levels, num_points))


def _backbone_name(config: dict[str, Any], config_path: Path) -> str:
    backbone = config.get("backbone_config") or {}
    if config.get("use_timm_backbone") or config.get("backbone") or backbone.get("model_type") != "rt_detr_resnet":
        raise CheckpointError(f"{config_path}: the backbone must be transformers' RTDetrResNet (ResNet-vd), got "
                              f"{backbone.get('model_type') or config.get('backbone')!r}")
    layer_type, depths = backbone.get("layer_type", "bottleneck"), list(backbone.get("depths", (3, 4, 6, 3)))
    name = next((n for n, (counts, bottleneck) in DEPTHS.items()
                 if list(counts) == depths and bottleneck == (layer_type == "bottleneck")), None)
    if name is None:
        raise CheckpointError(f"{config_path}: a ResNet-vd of {layer_type} blocks {depths} is none of "
                              f"{', '.join(DEPTHS)}, the depths this project builds")
    widths = [64, 128, 256, 512] if layer_type == "basic" else [256, 512, 1024, 2048]
    refuse_unless(backbone, {"embedding_size": 64, "hidden_sizes": widths, "hidden_act": "relu",
                              "downsample_in_first_stage": False, **resnet_block_flags(layer_type),
                              "num_channels": 3, "out_indices": [2, 3, 4]}, config_path, "RT-DETR")
    return name


def read_huggingface_rtdetr(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``RTDetr(V2)ForObjectDetection`` directory into this project's layout + config.

    Raises:
        CheckpointError: settings this project's RT-DETR lacks (another backbone, activations, learned initial
            queries, different head counts for the encoder and the decoder, ...), keys without a counterpart.
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    config = read_json(config_path)
    version_2 = config.get("model_type") == "rt_detr_v2"
    backbone = _backbone_name(config, config_path)
    encoder_dim = int(config.get("encoder_hidden_dim", 256))
    levels = int(config.get("num_feature_levels", 3))
    refuse_unless(config, {
        "encoder_activation_function": "gelu", "activation_function": "silu", "decoder_activation_function": "relu",
        "normalize_before": False, "learn_initial_query": False, "with_box_refine": True, "encode_proj_layers": [2],
        "feat_strides": [8, 16, 32], "positional_encoding_temperature": 10000, "layer_norm_eps": 1e-5,
        "batch_norm_eps": 1e-5, "decoder_in_channels": [encoder_dim] * 3,
        "decoder_attention_heads": config.get("encoder_attention_heads", 8),
        **({"decoder_n_levels": levels} if version_2 else {})}, config_path, "RT-DETR")
    if config.get("eval_size") is not None:
        logger.warning("%s sets eval_size %s: transformers then runs the AIFI layer without positions in eval mode, "
                       "this project (as the authors' code) with them; outputs will differ from transformers'",
                       config_path, config["eval_size"])
    state_dict = to_official_state_dict(read_weights(directory), str(directory),
                                        num_points=int(config.get("decoder_n_points", 4)), num_levels=levels)
    if "decoder.dec_score_head.0.weight" not in state_dict:
        raise CheckpointError(f"{directory}: no decoder class heads (model.decoder.class_embed.0): an RTDetrModel "
                              f"without the detection heads?")
    decoder_ffn = int(config.get("decoder_ffn_dim", 1024))
    encoder_ffn = int(config.get("encoder_ffn_dim", 1024))
    model_config = RTDETRConfig(
        class_head="sigmoid", backbone=backbone,
        backbone_norm="frozen_batch_norm" if config.get("freeze_backbone_batch_norms", True) else "batch_norm",
        hidden_dim=int(config.get("d_model", 256)), num_heads=int(config.get("encoder_attention_heads", 8)),
        encoder_hidden_dim=encoder_dim if encoder_dim != int(config.get("d_model", 256)) else None,
        num_encoder_layers=int(config.get("encoder_layers", 1)),
        num_decoder_layers=int(config.get("decoder_layers", 6)),
        dim_feedforward=decoder_ffn, encoder_dim_feedforward=encoder_ffn if encoder_ffn != decoder_ffn else None,
        csp_expansion=float(config.get("hidden_expansion", 1.0)), dropout=float(config.get("dropout", 0.0)),
        num_queries=int(config.get("num_queries", 300)),
        num_classes=int(state_dict["decoder.dec_score_head.0.weight"].shape[0]),
        num_feature_levels=levels, num_points=int(config.get("decoder_n_points", 4)),
        denoising=int(config.get("num_denoising", 100)) > 0,
        sampling_offset_scale=float(config.get("decoder_offset_scale", 0.5)) if version_2 else 0.5,
        sampling_method="discrete" if version_2 and config.get("decoder_method") == "discrete" else "bilinear",
        pretrained_backbone=False)
    check_stated_sizes(model_config, state_dict, STATED_SIZES, config_path, str(directory))
    size = processor_square_size(directory, default=EVAL_SIZE)
    meta = read_meta(config, model_config.num_classes, config_path, (size, size) if size is not None else None)
    return CheckpointContents(state_dict, model_config, meta)


#: The sizes config.json states that the weights show, in the layout RT-DETR, D-FINE and DEIMv2 share (this
#: project's keys): :func:`detr.checkpoints.formats.check_stated_sizes` names those that disagree.
STATED_SIZES: tuple[StatedSize, ...] = (
    ("d_model", lambda config: config.hidden_dim, "decoder.enc_output.proj.weight", 0),
    ("encoder_hidden_dim", lambda config: config.encoder_hidden_dim or config.hidden_dim,
     "encoder.input_proj.0.conv.weight", 0),
    ("decoder_ffn_dim", lambda config: config.dim_feedforward, "decoder.decoder.layers.0.linear1.weight", 0),
    ("decoder_ffn_dim (halved: DEIMv2's SwiGLU)", lambda config: config.dim_feedforward // 2,
     "decoder.decoder.layers.0.ffn.gate_proj.weight", 0),
    ("encoder_ffn_dim", lambda config: config.encoder_dim_feedforward or config.dim_feedforward,
     "encoder.encoder.0.layers.0.linear1.weight", 0),
    ("decoder_layers", lambda config: config.num_decoder_layers, "decoder.decoder.layers.", None),
    ("encoder_layers", lambda config: config.num_encoder_layers, "encoder.encoder.0.layers.", None),
    ("decoder_attention_heads x decoder_n_points x num_feature_levels",
     lambda config: config.num_heads * sum(config.points_per_level if isinstance(config, DFINEConfig)
                                           else (config.num_points,) * config.num_feature_levels),
     "decoder.decoder.layers.0.cross_attn.attention_weights.weight", 0),
)


#: The authors' files (lyuwenyu/RT-DETR): this project's keys but for RT-DETR (v1)'s spellings of two Sequentials
#: that RT-DETRv2 names (this project keeps v2's names) and buffers this project computes.
AUTHORS_RTDETR_KEYS = KeyMap(
    "RT-DETR", (Rename("", ""),), source="the authors'",
    read_spelling=((r"^encoder\.input_proj\.(\d+)\.0\.", r"encoder.input_proj.\1.conv."),
                   (r"^encoder\.input_proj\.(\d+)\.1\.", r"encoder.input_proj.\1.norm."),
                   (r"^decoder\.enc_output\.0\.", "decoder.enc_output.proj."),
                   (r"^decoder\.enc_output\.1\.", "decoder.enc_output.norm.")),
    drop=(Drop(r"decoder\.(anchors|valid_mask)$", "RT-DETRv2's anchors and valid mask at its eval size, computed "
                                                  "here at the input's size"),
          Drop(r"decoder\.decoder\.layers\.\d+\.cross_attn\.num_points_scale$",
               "1 / points per sampling point, computed here from the point count")))


def is_rtdetr_state_dict(state_dict: dict[str, torch.Tensor]) -> bool:
    """The authors' RT-DETR / RT-DETRv2 layout (and this project's): per-layer decoder score heads."""
    return "decoder.dec_score_head.0.weight" in state_dict and "encoder.fpn_blocks.0.conv1.conv.weight" in state_dict


def count_numbered(state_dict: dict[str, torch.Tensor], prefix: str) -> int:
    """How many ``prefix{N}.`` modules the state dict has (numbered 0..N-1, else a :class:`CheckpointError`):
    the readers infer layer and block counts from the weights this way."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(match.group(1)) for key in state_dict if (match := pattern.match(key))}
    if found != set(range(len(found))):
        raise CheckpointError(f"{prefix}N is numbered {sorted(found)}: the file lacks some (cut or edited)")
    return len(found)


def read_rtdetr_state_dict(state_dict: dict[str, torch.Tensor], where: str = "the state dict", *,
                           num_heads: int = 8) -> CheckpointContents:
    """An authors' RT-DETR or RT-DETRv2 state dict (lyuwenyu/RT-DETR, the ``ema.module`` or ``model`` entry of
    their files) → this project's keys and the configuration read off the weights.

    Read from the weights: the ResNet-vd depth, widths, layer counts, levels, points (given ``num_heads``: the
    authors' 8), classes, the CSP expansion and the denoising embedding. Not visible, so the authors' defaults
    that ``load_checkpoint(path, **overrides)`` can replace: num_queries (300), num_heads (8), and RT-DETRv2's
    sampling_offset_scale (0.5) and sampling_method ("bilinear"; "discrete" for their ``_dsp`` models).
    """
    official = AUTHORS_RTDETR_KEYS.to_ours(state_dict, where)
    if "decoder.tgt_embed.weight" in official:
        raise CheckpointError(f"{where}: learned initial queries (decoder.tgt_embed) are not supported; this "
                              f"project's RT-DETR takes its queries from the encoder, as the released models")
    if "backbone.conv1.conv1_1.conv.weight" not in official:
        raise CheckpointError(f"{where}: the backbone is not a ResNet-vd (PResNet: backbone.conv1.conv1_1); "
                              f"HGNetV2 and other backbones are not supported")
    bottleneck = "backbone.res_layers.0.blocks.0.branch2c.conv.weight" in official
    counts = tuple(count_numbered(official, f"backbone.res_layers.{stage}.blocks.") for stage in range(4))
    backbone = next((name for name, spec in DEPTHS.items() if spec == (counts, bottleneck)), None)
    if backbone is None:
        raise CheckpointError(f"{where}: a ResNet-vd with blocks {counts} (bottleneck={bottleneck}) is none of "
                              f"{', '.join(DEPTHS)}")
    levels = count_numbered(official, "decoder.input_proj.")
    weights_out = int(official["decoder.decoder.layers.0.cross_attn.attention_weights.weight"].shape[0])
    if weights_out % (num_heads * levels):
        raise CheckpointError(f"{where}: the attention weights ({weights_out} outputs) do not split into {levels} "
                              f"levels x num_heads={num_heads}; pass the model's num_heads")
    hidden = int(official["decoder.enc_output.proj.weight"].shape[0])
    encoder_dim = int(official["encoder.input_proj.0.conv.weight"].shape[0])
    encoder_layers = count_numbered(official, "encoder.encoder.0.layers.")
    ffn = int(official["decoder.decoder.layers.0.linear1.weight"].shape[0])
    encoder_ffn = int(official["encoder.encoder.0.layers.0.linear1.weight"].shape[0]) if encoder_layers else ffn
    num_classes = int(official["decoder.dec_score_head.0.weight"].shape[0])
    if int(official["decoder.enc_score_head.weight"].shape[0]) != num_classes:
        raise CheckpointError(f"{where}: a class-agnostic query selection (enc_score_head with one output) is not "
                              f"supported")
    config = RTDETRConfig(
        class_head="sigmoid", backbone=backbone, hidden_dim=hidden, num_heads=num_heads,
        encoder_hidden_dim=encoder_dim if encoder_dim != hidden else None, num_encoder_layers=encoder_layers,
        num_decoder_layers=count_numbered(official, "decoder.decoder.layers."), dim_feedforward=ffn,
        encoder_dim_feedforward=encoder_ffn if encoder_ffn != ffn else None,
        csp_expansion=int(official["encoder.fpn_blocks.0.conv1.conv.weight"].shape[0]) / encoder_dim,
        dropout=0.0, num_queries=300, num_classes=num_classes, num_feature_levels=levels,
        num_points=weights_out // (num_heads * levels),
        denoising="decoder.denoising_class_embed.weight" in official, pretrained_backbone=False)
    # the authors' COCO models predict COCO's 80 categories in the order of their ids (their
    # remap_mscoco_category), at their 640 × 640 evaluation size
    coco = CategoryMap.from_coco_categories([{"id": i, "name": n} for i, n in COCO_CATEGORIES], contiguous=True)
    meta = ModelMeta(category_map=coco if num_classes == coco.num_classes else None, eval_size=(640, 640))
    return CheckpointContents(official, config, meta)


def to_huggingface_state_dict(model: RTDETR, *, version: int = 1) -> dict[str, torch.Tensor]:
    """This project's RT-DETR → transformers' keys (as on disk), every tensor a contiguous copy; ``version=2``
    adds RT-DETRv2's 1 / points buffer."""
    keys = RTDETR_V2_KEYS if version == 2 else RTDETR_KEYS
    return keys.to_theirs(model.state_dict(), context=(model.config.num_feature_levels, model.config.num_points))


def huggingface_rtdetr_config(model: RTDETR, *, version: int | None = None,
                              category_map: CategoryMap | None = None) -> dict[str, Any]:
    """config.json of :func:`save_pretrained_rtdetr` (``version`` None: 2 where RT-DETRv2's options are used)."""
    config = model.config
    if config is None or config.family != "rtdetr":
        raise ExportError("save_pretrained_rtdetr needs an RT-DETR built by build_detr (model.config)")
    v2_options = config.sampling_method != "bilinear" or config.sampling_offset_scale != 0.5
    version = version if version is not None else (2 if v2_options else 1)
    if version == 1 and v2_options:
        raise ExportError("RT-DETRv2's sampling options (discrete sampling, an offset scale other than 0.5) need "
                          "transformers' rt_detr_v2: pass version=2")
    if config.backbone_norm == "group_norm":
        raise ExportError("transformers' RT-DETR has batch norms in its backbone, not group norms")
    counts, bottleneck = DEPTHS[config.backbone]
    widths = [256, 512, 1024, 2048] if bottleneck else [64, 128, 256, 512]
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    category_map = category_map or model.meta.category_map
    hf: dict[str, Any] = {
        "architectures": ["RTDetrForObjectDetection" if version == 1 else "RTDetrV2ForObjectDetection"],
        "model_type": MODEL_TYPES[version - 1],
        "backbone_config": {"model_type": "rt_detr_resnet", "layer_type": "bottleneck" if bottleneck else "basic",
                            "depths": list(counts), "hidden_sizes": widths, "embedding_size": 64,
                            "hidden_act": "relu", "downsample_in_first_stage": False,
                            "downsample_in_bottleneck": False, "num_channels": 3, "out_indices": [2, 3, 4]},
        "freeze_backbone_batch_norms": config.backbone_norm == "frozen_batch_norm",
        "encoder_hidden_dim": encoder_dim, "encoder_in_channels": widths[1:], "feat_strides": [8, 16, 32],
        "encoder_layers": config.num_encoder_layers,
        "encoder_ffn_dim": config.encoder_dim_feedforward or config.dim_feedforward,
        "encoder_attention_heads": config.num_heads, "dropout": config.dropout, "activation_dropout": 0.0,
        "encode_proj_layers": [2], "positional_encoding_temperature": 10000, "encoder_activation_function": "gelu",
        "activation_function": "silu", "eval_size": None, "normalize_before": False,
        "hidden_expansion": config.csp_expansion, "d_model": config.hidden_dim, "num_queries": config.num_queries,
        "decoder_in_channels": [encoder_dim] * 3, "decoder_ffn_dim": config.dim_feedforward,
        "num_feature_levels": config.num_feature_levels, "decoder_n_points": config.num_points,
        "decoder_layers": config.num_decoder_layers, "decoder_attention_heads": config.num_heads,
        "decoder_activation_function": "relu", "attention_dropout": 0.0,
        "num_denoising": 100 if config.denoising else 0, "learn_initial_query": False, "anchor_image_size": None,
        "with_box_refine": True, "is_encoder_decoder": True, "layer_norm_eps": 1e-5, "batch_norm_eps": 1e-5,
        **label_fields(category_map, model.num_classes, model.meta.score_threshold),
    }
    if version == 2:
        hf.update(decoder_n_levels=config.num_feature_levels, decoder_offset_scale=config.sampling_offset_scale,
                  decoder_method="discrete" if config.sampling_method == "discrete" else "default")
    return hf


def preprocessor_config(size: int) -> dict[str, Any]:
    """preprocessor_config.json of ``RTDetrImageProcessor`` at a ``size`` square (RT-DETR's and D-FINE's)."""
    return {"image_processor_type": "RTDetrImageProcessor", "format": "coco_detection", "do_resize": True,
            "size": {"height": size, "width": size}, "resample": 2, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": False, "do_pad": False}


def save_pretrained_rtdetr(model: RTDETR, directory: str | Path, *, version: int | None = None,
                           category_map: CategoryMap | None = None, backbone_format: str | None = None) -> Path:
    """Write ``model`` as ``RTDetr(V2)ForObjectDetection.save_pretrained`` would: config.json, model.safetensors
    and preprocessor_config.json (``RTDetrImageProcessor`` at the model's square size). ``version``: 1 (rt_detr)
    or 2 (rt_detr_v2); None picks 2 only where RT-DETRv2's sampling options are used. ``backbone_format`` (the
    DETR writers' choice of timm or transformers' ResNet) is not read: transformers' RT-DETR has one backbone,
    its RTDetrResNet."""
    config = huggingface_rtdetr_config(model, version=version, category_map=category_map)
    tensors = to_huggingface_state_dict(model, version=MODEL_TYPES.index(config["model_type"]) + 1)
    directory = Path(directory)
    write_huggingface_directory(directory, config, import_safetensors().save(tensors, metadata={"format": "pt"}),
                                preprocessor_config(model.input_spec.size))
    logger.info("wrote %s (%s, %s, %d classes)", directory, config["model_type"], model.config.backbone,
                model.num_classes)
    return directory
