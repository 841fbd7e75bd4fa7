"""D-FINE weights in (transformers' ``d_fine`` directories, the authors' release files) and out (transformers).

transformers: :func:`read_huggingface_dfine` reads a directory as ``DFineForObjectDetection.save_pretrained``
writes it and as the hub serves the converted models (ustc-community/dfine-*): ``config.json`` (model_type
"d_fine", an ``hgnet_v2`` backbone) + ``model.safetensors`` + ``preprocessor_config.json`` (``RTDetrImageProcessor``,
the square size). Any label count and any of HGNetV2's sizes B0-B5; ``id2label`` becomes the category map.
:func:`save_pretrained_dfine` writes this project's model in that format, so that transformers'
``from_pretrained`` gives the same outputs.

The authors' files (Peterande/D-FINE, and DEIM's D-FINE models: ``{"ema": {"module": state_dict}}`` or
``{"model": state_dict}``) hold this project's own key layout but for buffers it recomputes;
:func:`read_dfine_state_dict` reads them, with the configuration read off the weights.

This project keeps the authors' parameter names; transformers renames them (:data:`DFINE_KEYS`, a table over
:mod:`detr.checkpoints.key_map`, read in both directions, ``{}`` a layer index):

=====================================================  ==============================================
this project (the authors' layout)                     transformers (as written to disk)
=====================================================  ==============================================
``backbone.stem.*``, ``backbone.stages.*``             ``model.backbone.model.embedder.*``, ``...encoder.stages.*``
  (``conv``, ``bn``, ``lab``)                            (``convolution``, ``normalization``, ``lab``)
``encoder.{fpn,pan}_blocks.{}.cv1``, ``cv2.0``,        ``model.encoder.{fpn,pan}_blocks.{}.conv1``, ``csp_rep1``,
``cv2.1``, ``cv3.0``, ``cv3.1``, ``cv4``               ``conv2``, ``csp_rep2``, ``conv3``, ``conv4``
``encoder.downsample_convs.{}.0.cv{1,2}``              ``model.encoder.downsample_convs.{}.conv{1,2}``
``decoder.decoder.layers.{}``: ``cross_attn``,         ``model.decoder.layers.{}``: ``encoder_attn``, ``gateway``
``gateway``, ``norm3``                                 ``final_layer_norm``
``decoder.decoder.{lqe_layers,up,reg_scale}``          ``model.decoder.{lqe_layers,up,reg_scale}``
``decoder.{pre_bbox_head,dec_score_head,               ``model.decoder.{pre_bbox_head,class_embed,bbox_embed}``
dec_bbox_head}``
=====================================================  ==============================================

and RT-DETR's renames for the rest (input projections, AIFI, self-attention, query selection:
:mod:`detr.checkpoints.rtdetr`). transformers is never imported; safetensors only for .safetensors files.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from detr.categories import COCO_CATEGORIES, CategoryMap
from detr.checkpoints.formats import CheckpointContents, CheckpointError, ExportError, check_stated_sizes
from detr.checkpoints.huggingface import (
    import_safetensors,
    label_fields,
    processor_square_size,
    read_json,
    read_meta,
    read_weights,
    write_huggingface_directory,
)
from detr.checkpoints.key_map import Buffer, Drop, Field, KeyMap, Rename, refuse_unless
from detr.checkpoints.rtdetr import (
    REALTIME_FIELDS,
    REALTIME_FUSE,
    REALTIME_RENAMES,
    REALTIME_SPELLING,
    STATED_SIZES,
    count_numbered,
    preprocessor_config,
)
from detr.models.config import ModelMeta
from detr.models.deimv2.config import DEIMv2Config
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.models.dfine.hgnetv2 import SIZES
from detr.models.dfine.model import DFINE
from detr.models.rtdetr.model import EVAL_SIZE

logger = logging.getLogger(__name__)

MODEL_TYPE = "d_fine"

_DECODER = "model.decoder.layers.{}.", "decoder.decoder.layers.{}."
#: D-FINE's own renames besides RT-DETR's (:data:`detr.checkpoints.rtdetr.REALTIME_RENAMES`): transformers' key
#: start, this project's, ``{}`` an index.
_RULES: tuple[Rename, ...] = (
    Rename("model.encoder.lateral_convs.{}.", "encoder.lateral_convs.{}."),
    *(Rename(f"model.encoder.{{blocks}}.{{}}.{theirs}.", f"encoder.{{blocks}}.{{}}.{ours}.")
      for theirs, ours in (("conv1", "cv1"), ("csp_rep1", "cv2.0"), ("conv2", "cv2.1"), ("csp_rep2", "cv3.0"),
                           ("conv3", "cv3.1"), ("conv4", "cv4"))),
    Rename("model.encoder.downsample_convs.{}.conv{}.", "encoder.downsample_convs.{}.0.cv{}."),
    Rename(_DECODER[0] + "gateway.", _DECODER[1] + "gateway."),
    Rename("model.decoder.lqe_layers.{}.", "decoder.decoder.lqe_layers.{}."),
    Rename("model.decoder.up", "decoder.decoder.up"),
    Rename("model.decoder.reg_scale", "decoder.decoder.reg_scale"),
    Rename("model.decoder.pre_bbox_head.", "decoder.pre_bbox_head."),
)
_FIELDS = {**REALTIME_FIELDS, "blocks": Field.choice("fpn_blocks", "pan_blocks"),
           # HGNetV2's modules: transformers' names inside the backbone, this project's (the rest as it is)
           "hgnet": Field(r".*", r".*",
                          lambda rest: rest.replace(".convolution.", ".conv.").replace(".normalization.", ".bn."),
                          lambda rest: rest.replace(".conv.", ".convolution.").replace(".bn.", ".normalization."))}


def points_scale(points_per_level: tuple[int, ...] | list[int]) -> torch.Tensor:
    """1 / count for each sampling point of each level: the buffer transformers and the authors store."""
    return torch.tensor([1.0 / count for count in points_per_level for _ in range(count)])


def _family(name: str, renames: tuple[Rename, ...], backbone_prefix: str, **options: Any) -> KeyMap:
    """A transformers table of the D-FINE kind: ``renames``, then the HGNetV2 backbone under ``backbone_prefix``;
    the points scale (context: the points per level), the tied top-level head copies dropped, q/k/v fused, keys read
    in D-FINE's spelling."""
    hgnet = (Rename(backbone_prefix + "embedder.{hgnet}", "backbone.stem.{hgnet}"),
             Rename(backbone_prefix + "encoder.stages.{hgnet}", "backbone.stages.{hgnet}"))
    return KeyMap(
        name, (*hgnet, *renames), fields=_FIELDS, fuse=REALTIME_FUSE, read_spelling=REALTIME_SPELLING,
        drop=(Drop(r"(class|bbox)_embed\.\d+\.", "copies of the decoder's heads at the top level (tied to them)"),),
        buffers=(Buffer(_DECODER[0] + "encoder_attn.num_points_scale",
                        _DECODER[1] + "cross_attn.attention_weights.weight", points_scale,
                        "1 / points per point for decoder_n_points {context}"),),
        **options)


DFINE_KEYS = _family("D-FINE", (*REALTIME_RENAMES, *_RULES), "model.backbone.model.")

#: DEIMv2's (transformers' ``Deimv2ForObjectDetection``): the backbone and the input projections under
#: ``model.conv_encoder``, the fusion blocks and the lite encoder under their transformers names (this project uses
#: them: :mod:`detr.models.dfine.encoder`), the SwiGLU ``mlp`` (``ffn`` here) and the gate-less layers' norm; its
#: files spell AIFI ``aifi`` and the output projections ``o_proj``.
_DEIMV2_RULES: tuple[Rename, ...] = (
    Rename("model.conv_encoder.encoder_input_proj.{}.conv.", "encoder.input_proj.{}.conv."),
    Rename("model.conv_encoder.encoder_input_proj.{}.norm.", "encoder.input_proj.{}.norm."),
    *(rule for rule in (*REALTIME_RENAMES, *_RULES)
      if not rule.theirs.startswith(("model.encoder_input_proj.", "model.encoder.{blocks}.", _DECODER[0] + "fc",
                                     "model.encoder.encoder.{}.layers.{}.fc"))),
    Rename("model.encoder.encoder.{}.layers.{}.mlp.layers.0.", "encoder.encoder.{}.layers.{}.linear1."),
    Rename("model.encoder.encoder.{}.layers.{}.mlp.layers.1.", "encoder.encoder.{}.layers.{}.linear2."),
    Rename(_DECODER[0] + "mlp.", _DECODER[1] + "ffn."),
    Rename(_DECODER[0] + "encoder_attn_layer_norm.", _DECODER[1] + "norm2."),
    Rename("model.encoder.fpn_blocks.", "encoder.fpn_blocks."),
    Rename("model.encoder.pan_blocks.", "encoder.pan_blocks."),
)
#: DEIMv2 S-X: the DINOv3 ViT and the adapter under ``backbone`` (transformers' names), the hybrid encoder's input
#: projections are transformers' ``fusion_proj``.
_DEIMV2_DINOV3_RULES: tuple[Rename, ...] = (
    Rename("model.conv_encoder.fusion_proj.{}.", "encoder.input_proj.{}."),
    Rename("model.conv_encoder.backbone.layer.{}.attention.out_proj.", "backbone.backbone.layer.{}.attention.o_proj."),
    Rename("model.conv_encoder.backbone.", "backbone.backbone."),
    Rename("model.conv_encoder.spatial_tuning_adapter.", "backbone.spatial_tuning_adapter."),
    *_DEIMV2_RULES[2:],
)
_DEIMV2_DISK = ((r"^model\.encoder\.encoder\.", "model.encoder.aifi."), (r"\.out_proj\.", ".o_proj."))
_DEIMV2_BACKBONE = "model.conv_encoder.model."
DEIMV2_KEYS = _family("DEIMv2", _DEIMV2_RULES, _DEIMV2_BACKBONE, write_spelling=_DEIMV2_DISK)
DEIMV2_DINOV3_KEYS = _family("DEIMv2", _DEIMV2_DINOV3_RULES, _DEIMV2_BACKBONE, write_spelling=_DEIMV2_DISK)
#: The lite encoder's parts keep transformers' names (its input projections included).
DEIMV2_LITE_KEYS = _family("DEIMv2", (*_DEIMV2_RULES[2:], Rename("model.encoder.", "encoder.")), _DEIMV2_BACKBONE,
                           write_spelling=_DEIMV2_DISK)


def to_official_state_dict(state_dict: dict[str, torch.Tensor], where: str, *, points_per_level: list[int],
                           keys: KeyMap = DFINE_KEYS) -> dict[str, torch.Tensor]:
    """A transformers ``DFineForObjectDetection`` state dict → this project's (the authors') keys (``keys``: D-FINE's
    or a DEIMv2 table): q, k and v become one ``in_proj``, floats float32; the points scale is checked against
    ``points_per_level`` and dropped, as are the tied top-level head copies; unknown keys raise
    :class:`CheckpointError`."""
    return keys.to_ours(state_dict, where, context=list(points_per_level))


def _hgnetv2_backbone_config(name: str, learnable_affine: bool, levels: int) -> dict[str, Any]:
    """transformers' ``HGNetV2Config`` fields of one of :data:`SIZES`, returning the last ``levels`` stages."""
    spec = SIZES[name]
    stages = spec.stages
    return {
        "model_type": "hgnet_v2", "num_channels": 3, "hidden_act": "relu", "embedding_size": spec.stem_channels[2],
        "depths": [stage.num_blocks for stage in stages], "hidden_sizes": [stage.out_channels for stage in stages],
        "stem_channels": list(spec.stem_channels), "stem_strides": [2, 1, 1, 2, 1],
        "stage_in_channels": [s.in_channels for s in stages], "stage_mid_channels": [s.mid_channels for s in stages],
        "stage_out_channels": [s.out_channels for s in stages], "stage_num_blocks": [s.num_blocks for s in stages],
        "stage_downsample": [s.downsample for s in stages], "stage_downsample_strides": [2, 2, 2, 2],
        "stage_light_block": [s.light for s in stages], "stage_kernel_size": [s.kernel_size for s in stages],
        "stage_numb_of_layers": [s.num_layers for s in stages], "use_learnable_affine_block": learnable_affine,
        "out_indices": list(range(5 - levels, 5)),
    }


#: the HGNetV2Config fields that name a size (the others are checked to be the ones it always has)
_SIZE_FIELDS = ("stem_channels", "stage_in_channels", "stage_mid_channels", "stage_out_channels", "stage_num_blocks",
                "stage_downsample", "stage_light_block", "stage_kernel_size", "stage_numb_of_layers")


def _backbone(config: dict[str, Any], config_path: Path) -> tuple[str, bool, int]:
    """(HGNetV2 size, learnable affine blocks, returned stages) of config.json's backbone_config."""
    backbone = config.get("backbone_config") or {}
    if config.get("use_timm_backbone") or config.get("backbone") or backbone.get("model_type") != "hgnet_v2":
        raise CheckpointError(f"{config_path}: the backbone must be transformers' HGNetV2 (backbone_config model_type "
                              f"'hgnet_v2'; DEIMv2 also 'dinov3_vit'), got {backbone.get('model_type') or config.get('backbone')!r}")
    found = {field: list(backbone.get(field, ())) for field in _SIZE_FIELDS}
    levels = len(backbone.get("out_indices") or [2, 3, 4])
    for name in SIZES:
        expected = _hgnetv2_backbone_config(name, bool(backbone.get("use_learnable_affine_block")), levels)
        if all(found[field] == list(expected[field]) for field in _SIZE_FIELDS):
            refuse_unless(backbone, {key: expected[key] for key in ("hidden_act", "stem_strides", "num_channels",
                                                                    "stage_downsample_strides", "out_indices")},
                          config_path, "D-FINE")
            return name, bool(backbone.get("use_learnable_affine_block")), levels
    raise CheckpointError(f"{config_path}: the HGNetV2 of backbone_config (stem_channels "
                          f"{found['stem_channels']}, stage_out_channels {found['stage_out_channels']}, ...) is none of "
                          f"the sizes this project builds ({', '.join(SIZES)})")


def _points(config: dict[str, Any], levels: int) -> list[int]:
    points = config.get("decoder_n_points", 4)
    return [int(points)] * levels if isinstance(points, int) else [int(count) for count in points]


def read_huggingface_dfine(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``DFineForObjectDetection`` directory into this project's layout + config.

    Raises:
        CheckpointError: settings this project's D-FINE lacks (another backbone or activations, learned initial
            queries, an output layer other than the last, extra decoder levels, ...), keys without a counterpart.
    """
    return read_huggingface_family(directory, "dfine")


def read_huggingface_family(directory: str | Path, architecture: Literal["dfine", "deimv2"], *,
                            vit_backbone: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None
                            ) -> CheckpointContents:
    """:func:`read_huggingface_dfine`, or with ``architecture="deimv2"`` a ``Deimv2ForObjectDetection``
    directory (:mod:`detr.checkpoints.deimv2`); ``vit_backbone`` reads a DINOv3 backbone_config into
    :class:`detr.models.deimv2.config.DEIMv2Config` options (DEIMv2 S-X)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    config = read_json(config_path)
    deimv2 = architecture == "deimv2"
    vit_options: dict[str, Any] = {}
    if vit_backbone is not None and (config.get("backbone_config") or {}).get("model_type") == "dinov3_vit":
        vit_options = vit_backbone(config, config_path)
        backbone, learnable_affine, levels = "dinov3_vit", False, 3
        stage_channels = config.get("encoder_in_channels")  # not read by transformers' DINOv3 models
    else:
        backbone, learnable_affine, levels = _backbone(config, config_path)
        stage_channels = [stage.out_channels for stage in SIZES[backbone].stages][-levels:]
    encoder_dim = int(config.get("encoder_hidden_dim", 256))
    layers = int(config.get("decoder_layers", 6))
    lite = deimv2 and config.get("encoder_type", "hybrid") == "lite"
    extra: dict[str, Any] = {"encode_proj_layers": [levels - 1]} if not lite else {}
    if deimv2:
        extra.update({"encoder_fuse_op": "sum", "share_bbox_head": False,
                      "encoder_type": "lite" if lite else "hybrid", "layer_scale": 1.0})
        if not vit_options:  # the trailing 3×3 is left out by the DINOv3 models only
            extra["encoder_has_trailing_conv"] = True
    if config.get("decoder_activation_function", "relu") not in ("relu", "silu"):
        extra["decoder_activation_function"] = "relu"
    refuse_unless(config, {
        "encoder_activation_function": "gelu", "activation_function": "silu", **extra,
        "normalize_before": False, "learn_initial_query": False, "with_box_refine": True,
        "feat_strides": [8, 16, 32][-levels:], "num_feature_levels": levels,
        "encoder_in_channels": stage_channels, "positional_encoding_temperature": 10000, "layer_norm_eps": 1e-5,
        "batch_norm_eps": 1e-5, "decoder_in_channels": [encoder_dim] * levels,
        "decoder_attention_heads": config.get("encoder_attention_heads", 8),
        "decoder_method": config.get("decoder_method") if config.get("decoder_method") == "discrete" else "default",
        "anchor_image_size": None}, config_path, "D-FINE")
    if config.get("eval_idx", -1) not in (-1, layers - 1):
        raise CheckpointError(f"{config_path}: eval_idx {config['eval_idx']}: this project predicts with the last "
                              f"decoder layer (eval_idx -1)")
    if config.get("eval_size") is not None:
        logger.warning("%s sets eval_size %s: transformers then runs the AIFI layer without positions in eval mode, "
                       "this project (as the authors' code) with them; outputs will differ from transformers'",
                       config_path, config["eval_size"])
    points = _points(config, levels)
    keys = DFINE_KEYS
    if deimv2:
        keys = DEIMV2_DINOV3_KEYS if vit_options else DEIMV2_LITE_KEYS if lite else DEIMV2_KEYS
    state_dict = to_official_state_dict(read_weights(directory), str(directory), points_per_level=points, keys=keys)
    if "decoder.dec_score_head.0.weight" not in state_dict:
        raise CheckpointError(f"{directory}: no decoder class heads (model.decoder.class_embed.0): a model without "
                              f"the detection heads (DFineModel, Deimv2Model)? Save the ...ForObjectDetection")
    hidden = int(config.get("d_model", 256))
    decoder_ffn, encoder_ffn = int(config.get("decoder_ffn_dim", 1024)), int(config.get("encoder_ffn_dim", 1024))
    deimv2_options = {"lite_encoder": lite, "decoder_gateway": bool(config.get("use_gateway", True)),
                      "csp_trailing_conv": bool(config.get("encoder_has_trailing_conv", True)),
                      **vit_options} if deimv2 else {}
    config_class = DEIMv2Config if deimv2 else DFINEConfig
    model_config = config_class(
        class_head="sigmoid", backbone=backbone, backbone_learnable_affine=learnable_affine,
        backbone_norm="frozen_batch_norm" if config.get("freeze_backbone_batch_norms", True) else "batch_norm",
        hidden_dim=hidden, num_heads=int(config.get("encoder_attention_heads", 8)),
        encoder_hidden_dim=encoder_dim if encoder_dim != hidden else None,
        num_encoder_layers=0 if lite else int(config.get("encoder_layers", 1)), num_decoder_layers=layers,
        dim_feedforward=decoder_ffn, encoder_dim_feedforward=encoder_ffn if encoder_ffn != decoder_ffn else None,
        csp_expansion=float(config.get("hidden_expansion", 1.0)),
        csp_depth_multiplier=float(config.get("depth_mult", 1.0)), dropout=float(config.get("dropout", 0.0)),
        num_queries=int(config.get("num_queries", 300)),
        num_classes=int(state_dict["decoder.dec_score_head.0.weight"].shape[0]), num_feature_levels=levels,
        num_points=points[0], denoising=int(config.get("num_denoising", 100)) > 0,
        sampling_offset_scale=float(config.get("decoder_offset_scale", 0.5)),
        sampling_method="discrete" if config.get("decoder_method") == "discrete" else "bilinear",
        decoder=DistributionDecoder(
            num_points_per_level=tuple(points) if len(set(points)) > 1 else None,
            max_num_bins=int(config.get("max_num_bins", 32)), reg_scale=float(config.get("reg_scale", 4.0)),
            reg_up=float(config.get("up", 0.5)), lqe_top_k=int(config.get("top_prob_values", 4)),
            lqe_hidden_dim=int(config.get("lqe_hidden_dim", 64)), lqe_layers=int(config.get("lqe_layers", 2)),
            activation=config.get("decoder_activation_function", "relu")),
        pretrained_backbone=False, **deimv2_options)
    _check_constants(state_dict, model_config, str(config_path))
    check_stated_sizes(model_config, state_dict, STATED_SIZES, config_path, str(directory))
    size = processor_square_size(directory, default=EVAL_SIZE)
    meta = read_meta(config, model_config.num_classes, config_path, (size, size) if size is not None else None)
    return CheckpointContents(state_dict, model_config, meta)


def _check_constants(state_dict: dict[str, torch.Tensor], config: DFINEConfig, where: str) -> None:
    """The weights' copies of the weighting function's constants must be the configuration's."""
    for key, value in (("decoder.decoder.up", config.decoder.reg_up),
                       ("decoder.decoder.reg_scale", config.decoder.reg_scale)):
        if key in state_dict and not torch.allclose(state_dict[key], torch.tensor([value])):
            raise CheckpointError(f"{where}: {key} is {state_dict[key].tolist()} in the weights but {value} in the "
                                  f"configuration (up / reg_scale); make them agree")


#: The authors' files (Peterande/D-FINE, DEIM): this project's keys but for buffers it computes or keeps once.
AUTHORS_DFINE_KEYS = KeyMap(
    "D-FINE", (Rename("", ""),), source="the authors'",
    drop=(Drop(r"decoder\.(anchors|valid_mask)$", "the anchors and valid mask at the evaluation size, computed here "
                                                  "at the input's size"),
          Drop(r"decoder\.(up|reg_scale)$", "the weighting function's constants, kept once beside the decoder layers"),
          Drop(r"decoder\.decoder\.layers\.\d+\.cross_attn\.num_points_scale$",
               "1 / points per sampling point, computed here from the point counts")))


def is_dfine_state_dict(state_dict: dict[str, torch.Tensor]) -> bool:
    """The authors' D-FINE layout (and this project's): the decoder's quality heads."""
    return "decoder.decoder.lqe_layers.0.reg_conf.layers.0.weight" in state_dict


def _backbone_from_weights(state_dict: dict[str, torch.Tensor], where: str) -> str:
    stem = tuple(int(state_dict[f"backbone.stem.{name}.conv.weight"].shape[index])
                 for name, index in (("stem1", 1), ("stem1", 0), ("stem4", 0)))
    blocks = tuple(count_numbered(state_dict, f"backbone.stages.{stage}.blocks.") for stage in range(4))
    layers = count_numbered(state_dict, "backbone.stages.0.blocks.0.layers.")
    outputs = int(state_dict["backbone.stages.3.blocks.0.aggregation.1.conv.weight"].shape[0])
    for name, spec in SIZES.items():
        if (spec.stem_channels == stem and tuple(s.num_blocks for s in spec.stages) == blocks
                and spec.stages[0].num_layers == layers and spec.stages[3].out_channels == outputs):
            return name
    raise CheckpointError(f"{where}: an HGNetV2 with stem {stem}, blocks {blocks} is none of {', '.join(SIZES)}")


def read_dfine_state_dict(state_dict: dict[str, torch.Tensor], where: str = "the state dict", *,
                          num_heads: int = 8) -> CheckpointContents:
    """An authors' D-FINE state dict (Peterande/D-FINE or DEIM, the ``ema.module`` or ``model`` entry of their
    files) → this project's keys and the configuration read off the weights: the HGNetV2 size and its affine
    blocks, widths, layer counts, levels, points per level (from the points scale), bins, the weighting
    function's constants, the quality head, the fusion blocks' expansion and depth, classes and the denoising
    embedding. Not visible, so the authors' defaults that ``load_checkpoint(path, **overrides)`` can replace:
    num_queries (300), num_heads (8) and D-FINE's ReLU (DEIM's files: ``decoder_activation="silu",
    decoder_mlp_activation="silu"``)."""
    scales = {key: value for key, value in state_dict.items()
              if re.match(r"^decoder\.decoder\.layers\.0\.cross_attn\.num_points_scale$", key)}
    official = AUTHORS_DFINE_KEYS.to_ours(state_dict, where)
    backbone = _backbone_from_weights(official, where)
    levels = count_numbered(official, "encoder.input_proj.")
    weights_out = int(official["decoder.decoder.layers.0.cross_attn.attention_weights.weight"].shape[0])
    if weights_out % num_heads:
        raise CheckpointError(f"{where}: the attention weights ({weights_out} outputs) do not split into "
                              f"num_heads={num_heads}; pass the model's num_heads")
    points = [weights_out // num_heads // levels] * levels
    if scales:
        inverse = (1.0 / next(iter(scales.values())).float()).round().int().tolist()
        points, index = [], 0
        while index < len(inverse):
            points.append(inverse[index])
            index += inverse[index]
    hidden = int(official["decoder.enc_output.proj.weight"].shape[0])
    encoder_dim = int(official["encoder.input_proj.0.conv.weight"].shape[0])
    encoder_layers = count_numbered(official, "encoder.encoder.0.layers.")
    ffn = int(official["decoder.decoder.layers.0.linear1.weight"].shape[0])
    encoder_ffn = int(official["encoder.encoder.0.layers.0.linear1.weight"].shape[0]) if encoder_layers else ffn
    branch = int(official["encoder.fpn_blocks.0.cv2.0.conv1.conv.weight"].shape[0])
    quality_in = int(official["decoder.decoder.lqe_layers.0.reg_conf.layers.0.weight"].shape[1])
    defaults = DistributionDecoder()
    up = float(state_dict.get("decoder.decoder.up", torch.tensor([defaults.reg_up]))[0])
    reg_scale = float(state_dict.get("decoder.decoder.reg_scale", torch.tensor([defaults.reg_scale]))[0])
    config = DFINEConfig(
        class_head="sigmoid", backbone=backbone, backbone_norm="frozen_batch_norm",
        backbone_learnable_affine="backbone.stem.stem1.lab.scale" in official, hidden_dim=hidden,
        num_heads=num_heads, encoder_hidden_dim=encoder_dim if encoder_dim != hidden else None,
        num_encoder_layers=encoder_layers, num_decoder_layers=count_numbered(official, "decoder.decoder.layers."),
        dim_feedforward=ffn, encoder_dim_feedforward=encoder_ffn if encoder_ffn != ffn else None,
        # the encoder's widths are round(expansion · hidden // 2) and round(3 · depth): any value in the
        # rounding's interval builds the same layers
        csp_expansion=(2 * branch + 0.5) / encoder_dim,
        csp_depth_multiplier=count_numbered(official, "encoder.fpn_blocks.0.cv2.0.bottlenecks.") / 3,
        dropout=0.0, num_queries=300, num_classes=int(official["decoder.dec_score_head.0.weight"].shape[0]),
        num_feature_levels=levels, num_points=points[0],
        denoising="decoder.denoising_class_embed.weight" in official,
        decoder=DistributionDecoder(
            num_points_per_level=tuple(points) if len(set(points)) > 1 else None,
            max_num_bins=int(official["decoder.dec_bbox_head.0.layers.2.weight"].shape[0]) // 4 - 1,
            reg_scale=reg_scale, reg_up=up, lqe_top_k=quality_in // 4 - 1,
            lqe_hidden_dim=int(official["decoder.decoder.lqe_layers.0.reg_conf.layers.0.weight"].shape[0]),
            lqe_layers=count_numbered(official, "decoder.decoder.lqe_layers.0.reg_conf.layers.")),
        pretrained_backbone=False)
    if "decoder.decoder.up" not in official:  # older files keep the constants only beside the decoder
        official["decoder.decoder.up"] = torch.tensor([up])
        official["decoder.decoder.reg_scale"] = torch.tensor([reg_scale])
    # the authors' COCO models predict COCO's 80 categories in the order of their ids, at 640 × 640
    coco = CategoryMap.from_coco_categories([{"id": i, "name": n} for i, n in COCO_CATEGORIES], contiguous=True)
    meta = ModelMeta(category_map=coco if config.num_classes == coco.num_classes else None, eval_size=(640, 640))
    return CheckpointContents(official, config, meta)


def to_huggingface_state_dict(model: DFINE, keys: KeyMap = DFINE_KEYS) -> dict[str, torch.Tensor]:
    """This project's D-FINE → transformers' keys (as on disk; ``keys``: D-FINE's or a DEIMv2 table), every tensor a
    contiguous copy, with the points scale transformers keeps."""
    config = model.config
    points = list(config.points_per_level)
    return keys.to_theirs(model.state_dict(), context=points)


def huggingface_dfine_config(model: DFINE, *, category_map: CategoryMap | None = None,
                             backbone: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of :func:`save_pretrained_dfine` (and, for ``architecture="deimv2"``, of
    :func:`detr.checkpoints.deimv2.save_pretrained_deimv2`)."""
    config = model.config
    if not isinstance(config, DFINEConfig):
        raise ExportError("save_pretrained_dfine needs a D-FINE or DEIMv2 built by build_detr (model.config)")
    if config.backbone_norm == "group_norm":
        raise ExportError("transformers' D-FINE and DEIMv2 have batch norms in their backbone, not group norms")
    if config.decoder.mlp_activation != "relu":
        raise ExportError(f"decoder.mlp_activation={config.decoder.mlp_activation!r} (DEIM's SiLU heads): "
                          f"transformers' D-FINE has ReLU in its decoder's MLPs and no setting for them; keep the "
                          f".pt checkpoint")
    levels = config.num_feature_levels
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    points = list(config.points_per_level)
    category_map = category_map or model.meta.category_map
    deimv2 = {"architectures": ["Deimv2ForObjectDetection"], "model_type": "deimv2",
              "encoder_type": "lite" if config.lite_encoder else "hybrid", "encoder_fuse_op": "sum",
              "use_gateway": config.decoder_gateway, "share_bbox_head": False,
              "encoder_has_trailing_conv": config.csp_trailing_conv} if isinstance(config, DEIMv2Config) else {}
    if backbone is None:  # HGNetV2 (the DINOv3 backbone's fields come from detr.checkpoints.deimv2)
        backbone = {"backbone_config": _hgnetv2_backbone_config(config.backbone, config.backbone_learnable_affine,
                                                                levels),
                    "encoder_in_channels": [stage.out_channels for stage in SIZES[config.backbone].stages][-levels:]}
    return {
        "architectures": ["DFineForObjectDetection"], "model_type": MODEL_TYPE,
        "freeze_backbone_batch_norms": config.backbone_norm == "frozen_batch_norm",
        "encoder_hidden_dim": encoder_dim, **backbone,
        "feat_strides": [8, 16, 32][-levels:], "encoder_layers": config.num_encoder_layers,
        "encoder_ffn_dim": config.encoder_dim_feedforward or config.dim_feedforward,
        "encoder_attention_heads": config.num_heads, "dropout": config.dropout, "activation_dropout": 0.0,
        "encode_proj_layers": [levels - 1], "positional_encoding_temperature": 10000,
        "encoder_activation_function": "gelu", "activation_function": "silu", "eval_size": None,
        "normalize_before": False, "hidden_expansion": config.csp_expansion, "depth_mult": config.csp_depth_multiplier,
        "d_model": config.hidden_dim, "num_queries": config.num_queries, "decoder_in_channels": [encoder_dim] * levels,
        "decoder_ffn_dim": config.dim_feedforward, "num_feature_levels": levels, "decoder_n_points": points,
        "decoder_layers": config.num_decoder_layers, "decoder_attention_heads": config.num_heads,
        "decoder_activation_function": config.decoder.activation, "attention_dropout": 0.0,
        "num_denoising": 100 if config.denoising else 0, "learn_initial_query": False, "anchor_image_size": None,
        "with_box_refine": True, "is_encoder_decoder": True, "layer_norm_eps": 1e-5, "batch_norm_eps": 1e-5,
        "eval_idx": -1, "layer_scale": 1.0, "max_num_bins": config.decoder.max_num_bins,
        "reg_scale": config.decoder.reg_scale, "up": config.decoder.reg_up, "top_prob_values": config.decoder.lqe_top_k,
        "lqe_hidden_dim": config.decoder.lqe_hidden_dim, "lqe_layers": config.decoder.lqe_layers,
        "decoder_offset_scale": config.sampling_offset_scale,
        "decoder_method": "discrete" if config.sampling_method == "discrete" else "default",
        **label_fields(category_map, model.num_classes, model.meta.score_threshold),
        **deimv2,
    }


def save_pretrained_dfine(model: DFINE, directory: str | Path, *, category_map: CategoryMap | None = None,
                          backbone_format: str | None = None) -> Path:
    """Write ``model`` as ``DFineForObjectDetection.save_pretrained`` would: config.json, model.safetensors and
    preprocessor_config.json (``RTDetrImageProcessor`` at the model's square size). ``backbone_format`` (the DETR
    writers' choice of timm or transformers' ResNet) is not read: transformers' D-FINE has one backbone, HGNetV2."""
    if model.config is not None and model.config.family != "dfine":
        raise ExportError(f"save_pretrained_dfine writes D-FINE, got family {model.config.family!r}")
    return write_huggingface_family(model, directory, category_map=category_map, keys=DFINE_KEYS)


def write_huggingface_family(model: DFINE, directory: str | Path, *, category_map: CategoryMap | None,
                             keys: KeyMap, backbone: dict[str, Any] | None = None) -> Path:
    """config.json (:func:`huggingface_dfine_config`, ``backbone`` its backbone fields where not HGNetV2),
    model.safetensors (renamed by ``keys``) and preprocessor_config.json."""
    config = huggingface_dfine_config(model, category_map=category_map, backbone=backbone)
    tensors = to_huggingface_state_dict(model, keys)
    directory = Path(directory)
    write_huggingface_directory(directory, config, import_safetensors().save(tensors, metadata={"format": "pt"}),
                                preprocessor_config(model.input_spec.size))
    logger.info("wrote %s (%s, %s, %d classes)", directory, config["model_type"], config["backbone_config"]["model_type"],
                model.num_classes)
    return directory
