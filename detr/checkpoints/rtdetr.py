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
from collections.abc import Callable
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
from detr.models.config import ModelMeta
from detr.models.dfine.config import DFINEConfig
from detr.models.rtdetr.config import RTDETRConfig
from detr.models.rtdetr.model import EVAL_SIZE, RTDETR
from detr.models.rtdetr.resnet_vd import DEPTHS

logger = logging.getLogger(__name__)

MODEL_TYPES = ("rt_detr", "rt_detr_v2")

_CONV_NORM = {"convolution": "conv", "normalization": "norm"}
#: (transformers' pattern, this project's replacement), tried in order; the first match wins.
_RENAMES: tuple[tuple[str, str], ...] = (
    (r"model\.backbone\.model\.embedder\.embedder\.(\d)\.(convolution|normalization)\.",
     "backbone.conv1.conv1_{stem}.{cn}."),
    (r"model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d)\.(convolution|normalization)\.",
     "backbone.res_layers.{0}.blocks.{1}.branch2{branch}.{cn}."),
    (r"model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.1\.(convolution|normalization)\.",
     "backbone.res_layers.{0}.blocks.{1}.short.conv.{cn}."),
    (r"model\.backbone\.model\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.(convolution|normalization)\.",
     "backbone.res_layers.{0}.blocks.{1}.short.{cn}."),
    (r"model\.encoder_input_proj\.(\d+)\.0\.", "encoder.input_proj.{0}.conv."),
    (r"model\.encoder_input_proj\.(\d+)\.1\.", "encoder.input_proj.{0}.norm."),
    (r"model\.encoder\.encoder\.(\d+)\.layers\.(\d+)\.self_attn\.out_proj\.",
     "encoder.encoder.{0}.layers.{1}.self_attn.out_proj."),
    (r"model\.encoder\.encoder\.(\d+)\.layers\.(\d+)\.self_attn_layer_norm\.", "encoder.encoder.{0}.layers.{1}.norm1."),
    (r"model\.encoder\.encoder\.(\d+)\.layers\.(\d+)\.fc1\.", "encoder.encoder.{0}.layers.{1}.linear1."),
    (r"model\.encoder\.encoder\.(\d+)\.layers\.(\d+)\.fc2\.", "encoder.encoder.{0}.layers.{1}.linear2."),
    (r"model\.encoder\.encoder\.(\d+)\.layers\.(\d+)\.final_layer_norm\.", "encoder.encoder.{0}.layers.{1}.norm2."),
    (r"model\.encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", "encoder.{0}."),
    (r"model\.decoder_input_proj\.(\d+)\.0\.", "decoder.input_proj.{0}.conv."),
    (r"model\.decoder_input_proj\.(\d+)\.1\.", "decoder.input_proj.{0}.norm."),
    (r"model\.decoder\.layers\.(\d+)\.self_attn\.out_proj\.", "decoder.decoder.layers.{0}.self_attn.out_proj."),
    (r"model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.", "decoder.decoder.layers.{0}.norm1."),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn\.", "decoder.decoder.layers.{0}.cross_attn."),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.", "decoder.decoder.layers.{0}.norm2."),
    (r"model\.decoder\.layers\.(\d+)\.fc1\.", "decoder.decoder.layers.{0}.linear1."),
    (r"model\.decoder\.layers\.(\d+)\.fc2\.", "decoder.decoder.layers.{0}.linear2."),
    (r"model\.decoder\.layers\.(\d+)\.final_layer_norm\.", "decoder.decoder.layers.{0}.norm3."),
    (r"model\.decoder\.query_pos_head\.", "decoder.query_pos_head."),
    (r"model\.decoder\.class_embed\.(\d+)\.", "decoder.dec_score_head.{0}."),
    (r"model\.decoder\.bbox_embed\.(\d+)\.", "decoder.dec_bbox_head.{0}."),
    (r"model\.enc_output\.0\.", "decoder.enc_output.proj."),
    (r"model\.enc_output\.1\.", "decoder.enc_output.norm."),
    (r"model\.(enc_score_head|enc_bbox_head|denoising_class_embed)\.", "decoder.{0}."),
)
_COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement in _RENAMES)
#: q, k, v projections of transformers' attention → one in_proj of this project's: (stack prefix, q/k/v, kind)
HUGGINGFACE_QKV = re.compile(r"(model\.encoder\.encoder\.\d+\.layers\.\d+|model\.decoder\.layers\.\d+)\.self_attn\."
                     r"([qkv])_proj\.(weight|bias)$")
#: The heads' copies at RT-DETRv2's top level: not read by transformers' forward
_UNUSED = re.compile(r"(class|bbox)_embed\.\d+\.")
#: RT-DETRv2's 1 / points per sampling point, a buffer this project computes from the point count
_POINTS_SCALE = re.compile(r"model\.decoder\.layers\.\d+\.encoder_attn\.n_points_scale$")


def current_rtdetr_spelling(key: str) -> str:
    """transformers 5's in-memory names → the names it writes to disk."""
    key = re.sub(r"^model\.encoder\.aifi\.", "model.encoder.encoder.", key)
    key = re.sub(r"\.o_proj\.", ".out_proj.", key)
    return re.sub(r"\.mlp\.(fc[12])\.", r".\1.", key)


def _substitute(table: tuple[tuple[re.Pattern, str], ...], key: str,
                names: Callable[[str, tuple[str, ...]], dict[str, str]]) -> str | None:
    """``key`` rewritten by the first (pattern, replacement) of ``table`` that matches its start: the
    replacement's ``{0}``, ``{1}`` ... are the pattern's groups, its named fields ``names(replacement, groups)``;
    None when no pattern matches."""
    for pattern, replacement in table:
        if match := pattern.match(key):
            groups = match.groups()
            return replacement.format(*groups, **names(replacement, groups)) + key[match.end():]
    return None


def _our_names(replacement: str, groups: tuple[str, ...]) -> dict[str, str]:
    """The named fields of a transformers → ours replacement: stem index, block branch letter, conv/norm."""
    if "{stem}" in replacement:
        return {"stem": str(int(groups[0]) + 1), "cn": _CONV_NORM[groups[1]]}
    if "{branch}" in replacement:
        return {"branch": "abc"[int(groups[2])], "cn": _CONV_NORM[groups[3]]}
    return {"cn": _CONV_NORM[groups[-1]]} if "{cn}" in replacement else {}


def _rename(key: str) -> str | None:
    return _substitute(_COMPILED, key, _our_names)


def to_official_state_dict(state_dict: dict[str, torch.Tensor], where: str = "the state dict", *,
                           num_points: int = 4) -> dict[str, torch.Tensor]:
    """A transformers ``RTDetr(V2)ForObjectDetection`` state dict → this project's (the authors') keys.

    q, k and v become one ``in_proj``; floats become float32; RT-DETRv2's unused head copies are dropped, and
    its points scale too once checked to be 1 / ``num_points`` (the decoder's points per level); unknown keys
    raise :class:`CheckpointError`."""
    official: dict[str, torch.Tensor] = {}
    projections: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    unknown = []
    for hf_key, value in state_dict.items():
        value = value.float() if value.is_floating_point() else value
        key = current_rtdetr_spelling(hf_key)
        if _UNUSED.match(key):
            continue
        if _POINTS_SCALE.match(key):
            if not torch.allclose(value, torch.full_like(value, 1.0 / num_points)):
                raise CheckpointError(f"{where}: {hf_key} is not 1 / {num_points} per point (the config's "
                                      f"decoder_n_points); per-level point counts are not supported")
            continue
        if match := HUGGINGFACE_QKV.match(key):
            prefix, which, kind = match.groups()
            projections.setdefault((prefix, kind), {})[which] = value
            continue
        new_key = _rename(key)
        if new_key is None:
            unknown.append(hf_key)
        else:
            official[new_key] = value
    if unknown:
        raise CheckpointError(f"{where}: {len(unknown)} keys have no counterpart in RT-DETR's layout: {unknown[:10]}")
    for (prefix, kind), parts in projections.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{where}: {prefix} has only the {sorted(parts)} projections")
        ours = _rename(prefix + ".self_attn_layer_norm.")
        assert ours is not None and ours.endswith(".norm1.")
        official[ours[: -len("norm1.")] + f"self_attn.in_proj_{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return official


def _refuse_unless(config: dict[str, Any], expected: dict[str, Any], config_path: Path) -> None:
    """Raise naming every setting of ``config`` that differs from ``expected`` (absent ones take the default)."""
    wrong = {key: config[key] for key, value in expected.items()
             if key in config and config[key] is not None and _plain(config[key]) != _plain(value)}
    if wrong:
        raise CheckpointError(f"{config_path}: this project's RT-DETR has {expected}; the file sets "
                              f"{wrong}, which it cannot reproduce")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


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
    _refuse_unless(backbone, {"embedding_size": 64, "hidden_sizes": widths, "hidden_act": "relu",
                              "downsample_in_first_stage": False, **resnet_block_flags(layer_type),
                              "num_channels": 3, "out_indices": [2, 3, 4]}, config_path)
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
    _refuse_unless(config, {
        "encoder_activation_function": "gelu", "activation_function": "silu", "decoder_activation_function": "relu",
        "normalize_before": False, "learn_initial_query": False, "with_box_refine": True, "encode_proj_layers": [2],
        "feat_strides": [8, 16, 32], "positional_encoding_temperature": 10000, "layer_norm_eps": 1e-5,
        "batch_norm_eps": 1e-5, "decoder_in_channels": [encoder_dim] * 3,
        "decoder_attention_heads": config.get("encoder_attention_heads", 8),
        **({"decoder_n_levels": levels} if version_2 else {})}, config_path)
    if config.get("eval_size") is not None:
        logger.warning("%s sets eval_size %s: transformers then runs the AIFI layer without positions in eval mode, "
                       "this project (as the authors' code) with them; outputs will differ from transformers'",
                       config_path, config["eval_size"])
    state_dict = to_official_state_dict(read_weights(directory), str(directory),
                                        num_points=int(config.get("decoder_n_points", 4)))
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


#: RT-DETR (v1)'s spellings of two Sequentials that RT-DETRv2 names (this project keeps v2's names).
_V1_SPELLINGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^encoder\.input_proj\.(\d+)\.0\."), r"encoder.input_proj.\1.conv."),
    (re.compile(r"^encoder\.input_proj\.(\d+)\.1\."), r"encoder.input_proj.\1.norm."),
    (re.compile(r"^decoder\.enc_output\.0\."), "decoder.enc_output.proj."),
    (re.compile(r"^decoder\.enc_output\.1\."), "decoder.enc_output.norm."),
)
#: Buffers of the authors' files that this project computes: RT-DETRv2's anchors and valid mask at its eval size
#: and its 1 / points per sampling point.
_RECOMPUTED = re.compile(r"^decoder\.(anchors|valid_mask)$"
                         r"|^decoder\.decoder\.layers\.\d+\.cross_attn\.num_points_scale$")


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
    official: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if _RECOMPUTED.match(key):
            continue
        for pattern, replacement in _V1_SPELLINGS:
            key = pattern.sub(replacement, key)
        official[key] = value.float() if value.is_floating_point() else value
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


#: (this project's pattern, transformers' replacement): :data:`_RENAMES` the other way.
_TO_HUGGINGFACE_PAIRS: tuple[tuple[str, str], ...] = (
    (r"backbone\.conv1\.conv1_(\d)\.(conv|norm)\.", "model.backbone.model.embedder.embedder.{stem}.{cn}."),
    (r"backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.branch2([abc])\.(conv|norm)\.",
     "model.backbone.model.encoder.stages.{0}.layers.{1}.layer.{branch}.{cn}."),
    (r"backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.short\.conv\.(conv|norm)\.",
     "model.backbone.model.encoder.stages.{0}.layers.{1}.shortcut.1.{cn}."),
    (r"backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.short\.(conv|norm)\.",
     "model.backbone.model.encoder.stages.{0}.layers.{1}.shortcut.{cn}."),
    (r"encoder\.input_proj\.(\d+)\.conv\.", "model.encoder_input_proj.{0}.0."),
    (r"encoder\.input_proj\.(\d+)\.norm\.", "model.encoder_input_proj.{0}.1."),
    (r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.self_attn\.out_proj\.",
     "model.encoder.encoder.{0}.layers.{1}.self_attn.out_proj."),
    (r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.norm1\.",
     "model.encoder.encoder.{0}.layers.{1}.self_attn_layer_norm."),
    (r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.linear1\.", "model.encoder.encoder.{0}.layers.{1}.fc1."),
    (r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.linear2\.", "model.encoder.encoder.{0}.layers.{1}.fc2."),
    (r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.norm2\.",
     "model.encoder.encoder.{0}.layers.{1}.final_layer_norm."),
    (r"encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", "model.encoder.{0}."),
    (r"decoder\.input_proj\.(\d+)\.conv\.", "model.decoder_input_proj.{0}.0."),
    (r"decoder\.input_proj\.(\d+)\.norm\.", "model.decoder_input_proj.{0}.1."),
    (r"decoder\.decoder\.layers\.(\d+)\.self_attn\.out_proj\.", "model.decoder.layers.{0}.self_attn.out_proj."),
    (r"decoder\.decoder\.layers\.(\d+)\.norm1\.", "model.decoder.layers.{0}.self_attn_layer_norm."),
    (r"decoder\.decoder\.layers\.(\d+)\.cross_attn\.", "model.decoder.layers.{0}.encoder_attn."),
    (r"decoder\.decoder\.layers\.(\d+)\.norm2\.", "model.decoder.layers.{0}.encoder_attn_layer_norm."),
    (r"decoder\.decoder\.layers\.(\d+)\.linear1\.", "model.decoder.layers.{0}.fc1."),
    (r"decoder\.decoder\.layers\.(\d+)\.linear2\.", "model.decoder.layers.{0}.fc2."),
    (r"decoder\.decoder\.layers\.(\d+)\.norm3\.", "model.decoder.layers.{0}.final_layer_norm."),
    (r"decoder\.query_pos_head\.", "model.decoder.query_pos_head."),
    (r"decoder\.dec_score_head\.(\d+)\.", "model.decoder.class_embed.{0}."),
    (r"decoder\.dec_bbox_head\.(\d+)\.", "model.decoder.bbox_embed.{0}."),
    (r"decoder\.enc_output\.proj\.", "model.enc_output.0."),
    (r"decoder\.enc_output\.norm\.", "model.enc_output.1."),
    (r"decoder\.(enc_score_head|enc_bbox_head|denoising_class_embed)\.", "model.{0}."),
)
_TO_HUGGINGFACE = tuple((re.compile(pattern), replacement) for pattern, replacement in _TO_HUGGINGFACE_PAIRS)
_CN = {"conv": "convolution", "norm": "normalization"}
FUSED_IN_PROJ = re.compile(r"(encoder\.encoder\.\d+\.layers\.\d+|decoder\.decoder\.layers\.\d+)"
                      r"\.self_attn\.in_proj_(weight|bias)$")


def _huggingface_names(replacement: str, groups: tuple[str, ...]) -> dict[str, str]:
    """The inverse of :func:`_our_names`, for an ours → transformers replacement."""
    if "{stem}" in replacement:
        return {"stem": str(int(groups[0]) - 1), "cn": _CN[groups[1]]}
    if "{branch}" in replacement:
        return {"branch": str("abc".index(groups[2])), "cn": _CN[groups[3]]}
    return {"cn": _CN[groups[-1]]} if "{cn}" in replacement else {}


def _to_huggingface_key(key: str) -> str:
    hf_key = _substitute(_TO_HUGGINGFACE, key, _huggingface_names)
    if hf_key is None:
        raise ExportError(f"{key} has no counterpart in transformers' RT-DETR")
    if _rename(current_rtdetr_spelling(hf_key)) != key:  # the two tables must be inverses
        raise AssertionError(f"{key} → {hf_key} does not read back")
    return hf_key


def to_huggingface_state_dict(model: RTDETR, *, version: int = 1) -> dict[str, torch.Tensor]:
    """This project's RT-DETR → transformers' keys (as on disk), every tensor a contiguous copy; ``version=2``
    adds RT-DETRv2's 1 / points buffer."""
    hf: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        value = value.detach().to("cpu", copy=True).contiguous()
        if match := FUSED_IN_PROJ.match(key):
            prefix, kind = match.groups()
            hf_prefix = _to_huggingface_key(prefix + ".norm1.")[: -len("self_attn_layer_norm.")]
            for which, part in zip("qkv", value.chunk(3)):
                hf[f"{hf_prefix}self_attn.{which}_proj.{kind}"] = part.clone()
            continue
        hf[_to_huggingface_key(key)] = value
    if version == 2:
        points = model.config.num_points
        for index in range(model.num_decoder_layers):
            hf[f"model.decoder.layers.{index}.encoder_attn.n_points_scale"] = torch.full(
                (model.config.num_feature_levels * points,), 1.0 / points)
    return hf


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
