"""Hugging Face transformers Deformable DETR directories in and out.

In: :func:`read_huggingface_deformable` reads a directory as
``transformers.DeformableDetrForObjectDetection.save_pretrained`` writes it and as the hub serves the authors'
converted models (SenseTime/deformable-detr, -with-box-refine, -with-box-refine-two-stage, -single-scale):
``config.json`` with ``model_type`` "deformable_detr" + ``model.safetensors`` or ``pytorch_model.bin``; a
timm or transformers ResNet; any label count (``id2label`` becomes the category map).
:func:`detr.load_checkpoint` reaches it through :func:`detr.checkpoints.huggingface.read_huggingface`.

Out: :func:`save_pretrained_deformable` writes a :class:`DeformableDETR` in that format.

The two implementations are the same model with different parameter names (this project keeps the
authors' names, fundamentalvision/Deformable-DETR):

=====================================================  ==============================================
this project (the authors' layout)                     transformers (as written to disk)
=====================================================  ==============================================
``backbone.0.body.*``                                  ``model.backbone.conv_encoder.model.*``
``input_proj.{l}.{0,1}``, ``query_embed``              ``model.input_proj.{l}.{0,1}``, ``model.query_position_embeddings``
``transformer.{level_embed, reference_points,          ``model.{level_embed, reference_points, enc_output,
enc_output(_norm), pos_trans(_norm)}``                 enc_output_norm, pos_trans, pos_trans_norm}``
encoder ``self_attn``, ``norm1``, ``linear1/2``,       ``self_attn``, ``self_attn_layer_norm``, ``fc1/2``,
``norm2``                                              ``final_layer_norm``
decoder ``cross_attn``, ``norm1``; ``self_attn``       ``encoder_attn``, ``encoder_attn_layer_norm``;
(in_proj), ``norm2``; ``linear1/2``, ``norm3``         ``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``;
                                                       ``fc1/2``, ``final_layer_norm``
``class_embed.{i}``, ``bbox_embed.{i}``                the same, and ``model.decoder.{class,bbox}_embed.{i}``
=====================================================  ==============================================

Heads: transformers ties every layer's class head to ``class_embed.0`` unless the file holds distinct ones, and
the refinement's ``model.decoder.bbox_embed.{i}`` to ``bbox_embed.{i}``; a head that the file leaves out is the
one it is tied to. A file whose two copies of one head differ has no counterpart here (the authors' model uses
one module for both) and is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from detr.categories import CategoryMap
from detr.checkpoints.formats import CheckpointContents, CheckpointError, ExportError, infer_deformable_config
from detr.checkpoints.huggingface import (
    BACKBONE_BODY,
    CURRENT_SPELLING,
    NUM_BATCHES_TRACKED,
    RESNET_BLOCKS,
    BackboneFormat,
    check_backbone_config,
    import_safetensors,
    label_fields,
    processor_eval_size,
    read_json,
    read_meta,
    read_weights,
    resnet_backbone_fields,
    with_resnet,
    write_huggingface_directory,
)
from detr.checkpoints.key_map import Field, Fuse, KeyMap, Rename, Tied
from detr.models.config import AUTHORS_EVAL_SIZE
from detr.models.deformable.config import DeformableConfig
from detr.models.deformable.model import DeformableDETR

logger = logging.getLogger(__name__)

MODEL_TYPE = "deformable_detr"

_LAYERS = "transformer.{stack}.layers.{}."
#: (transformers' key start, this project's), ``{}`` a layer index. The per-layer heads come twice in transformers'
#: files where the decoder uses them (``model.decoder.{class,bbox}_embed``): both copies are this project's one head.
_RENAMES: tuple[Rename, ...] = (
    Rename("model.input_proj.", "input_proj."),
    Rename("model.query_position_embeddings.", "query_embed."),
    Rename("model.level_embed", "transformer.level_embed"),
    *(Rename(f"model.{name}.", f"transformer.{name}.")
      for name in ("reference_points", "enc_output", "enc_output_norm", "pos_trans", "pos_trans_norm")),
    Rename("model.encoder.layers.{}.self_attn.", "transformer.encoder.layers.{}.self_attn."),
    Rename("model.encoder.layers.{}.self_attn_layer_norm.", "transformer.encoder.layers.{}.norm1."),
    Rename("model.encoder.layers.{}.final_layer_norm.", "transformer.encoder.layers.{}.norm2."),
    Rename("model.decoder.layers.{}.encoder_attn.", "transformer.decoder.layers.{}.cross_attn."),
    Rename("model.decoder.layers.{}.encoder_attn_layer_norm.", "transformer.decoder.layers.{}.norm1."),
    Rename("model.decoder.layers.{}.self_attn.out_proj.", "transformer.decoder.layers.{}.self_attn.out_proj."),
    Rename("model.decoder.layers.{}.self_attn_layer_norm.", "transformer.decoder.layers.{}.norm2."),
    Rename("model.decoder.layers.{}.final_layer_norm.", "transformer.decoder.layers.{}.norm3."),
    Rename("model.{stack}.layers.{}.fc{}.", _LAYERS + "linear{}."),
    Rename("{head}_embed.{}.", "{head}_embed.{}."),
    Rename("model.decoder.{head}_embed.{}.", "{head}_embed.{}."),
)
#: Deformable DETR without its backbone (:func:`detr.checkpoints.huggingface.with_resnet` adds it).
DEFORMABLE_KEYS = KeyMap(
    "Deformable DETR", _RENAMES,
    fields={"stack": Field.choice("encoder", "decoder"), "head": Field.choice("class", "bbox")},
    fuse=(Fuse("model.decoder.layers.{}.self_attn.", "transformer.decoder.layers.{}.self_attn."),),
    drop=(NUM_BATCHES_TRACKED,), read_spelling=CURRENT_SPELLING,
    # the heads the file leaves out are tied to the first layer's (context: the number of per-layer heads)
    tied=tuple(Tied(f"{head}_embed.{{}}.", lambda num_heads: num_heads,
                    "a DeformableDetrModel without the detection heads?")
               for head in ("class", "bbox")))


def to_official_state_dict(state_dict: dict[str, torch.Tensor], num_heads: int, where: str = "the state dict"
                           ) -> dict[str, torch.Tensor]:
    """A transformers ``DeformableDetrForObjectDetection`` state dict → this project's (the authors') keys
    (:data:`DEFORMABLE_KEYS`, either ResNet).

    ``num_heads``: per-layer heads the model has (decoder layers, +1 for two-stage). q, k and v become one
    ``in_proj``; ``num_batches_tracked`` is dropped; floats become float32; unknown keys raise, as do two copies of
    one head that differ."""
    return with_resnet(DEFORMABLE_KEYS, "either").to_ours(state_dict, where, context=num_heads)


def to_huggingface_state_dict(model: DeformableDETR, backbone_format: BackboneFormat = "timm"
                              ) -> dict[str, torch.Tensor]:
    """This project's Deformable DETR → transformers' keys (as on disk), every tensor a contiguous copy; the
    refinement's and two-stage's decoder copies of the heads are written too."""
    hf = with_resnet(DEFORMABLE_KEYS, backbone_format).to_theirs(model.state_dict())
    copied = ("bbox_embed." if model.box_refine else "!", "class_embed." if model.two_stage else "!")
    hf.update({f"model.decoder.{key}": value.clone() for key, value in hf.items() if key.startswith(copied)})
    return hf


def _same(config: dict[str, Any], first: str, second: str, default: Any, config_path: Path) -> Any:
    a, b = config.get(first, default), config.get(second, default)
    if a != b:
        raise CheckpointError(f"{config_path}: this project's Deformable DETR has one {first.split('_', 1)[1]} for "
                              f"the encoder and the decoder; found {first}={a}, {second}={b}")
    return a


def _resnet_depth(state_dict: dict[str, torch.Tensor], where: str) -> str:
    bottleneck = f"{BACKBONE_BODY}layer1.0.conv3.weight" in state_dict
    blocks = {int(k[len(BACKBONE_BODY) + len("layer3."):].split(".")[0]) for k in state_dict if k.startswith(BACKBONE_BODY + "layer3.")}
    name = {(False, 2): "resnet18", (False, 6): "resnet34", (True, 6): "resnet50", (True, 23): "resnet101"}.get(
        (bottleneck, len(blocks)))
    if name is None:
        raise CheckpointError(f"{where}: cannot tell the ResNet depth (layer3 has {len(blocks)} blocks)")
    return name


def read_huggingface_deformable(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``DeformableDetrForObjectDetection`` directory into this project's layout + config.

    Raises:
        CheckpointError: settings this project's Deformable DETR lacks (different encoder and decoder head
            counts, FFN widths or point counts, a non-ReLU activation, learned positions, a non-ResNet
            backbone), two copies of one head that differ, keys without a counterpart.
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    config = read_json(config_path)
    where = str(directory)
    if config.get("activation_function", "relu") != "relu":
        raise CheckpointError(f"{config_path}: activation_function {config['activation_function']!r}; the authors' "
                              f"Deformable DETR uses relu")
    if config.get("position_embedding_type", "sine") != "sine":
        raise CheckpointError(f"{config_path}: position_embedding_type {config['position_embedding_type']!r}; "
                              f"this project's Deformable DETR has the sine encoding")
    heads = _same(config, "encoder_attention_heads", "decoder_attention_heads", 8, config_path)
    ffn = _same(config, "encoder_ffn_dim", "decoder_ffn_dim", 1024, config_path)
    points = _same(config, "encoder_n_points", "decoder_n_points", 4, config_path)
    backbone, dilation = check_backbone_config(config, str(config_path))
    two_stage, box_refine = bool(config.get("two_stage", False)), bool(config.get("with_box_refine", False))
    if two_stage and not box_refine:
        raise CheckpointError(f"{config_path}: two_stage without with_box_refine, which transformers itself cannot "
                              f"run (its two-stage head reads the refinement heads)")
    decoder_layers = int(config.get("decoder_layers", 6))
    state_dict = to_official_state_dict(read_weights(directory), decoder_layers + two_stage, where)
    depth = _resnet_depth(state_dict, where)
    if backbone is not None and backbone != depth:
        raise CheckpointError(f"{config_path} names backbone {backbone} but the weights are a {depth}")
    num_queries = int(config.get("two_stage_num_proposals", 300) if two_stage else
                      state_dict["query_embed.weight"].shape[0])
    model_config = DeformableConfig(
        class_head="sigmoid", backbone=depth, dilation=dilation,
        hidden_dim=int(config.get("d_model", 256)), num_heads=int(heads), dim_feedforward=int(ffn),
        num_encoder_layers=int(config.get("encoder_layers", 6)), num_decoder_layers=decoder_layers,
        num_queries=num_queries, num_classes=int(state_dict["class_embed.0.weight"].shape[0]),
        num_feature_levels=int(config.get("num_feature_levels", 4)), num_points=int(points),
        box_refine=box_refine, two_stage=two_stage, dropout=float(config.get("dropout", 0.1)))
    _check_config_fits_weights(model_config, state_dict, config_path, where)
    meta = read_meta(config, model_config.num_classes, config_path, processor_eval_size(directory))
    return CheckpointContents(state_dict, model_config, meta)


#: config.json's name of each size the weights also show (DeformableConfig field → transformers' key).
_STATED_SIZES = {"hidden_dim": "d_model", "dim_feedforward": "encoder_ffn_dim", "num_encoder_layers": "encoder_layers",
                 "num_decoder_layers": "decoder_layers", "num_feature_levels": "num_feature_levels",
                 "num_points": "encoder_n_points"}


def _check_config_fits_weights(stated: DeformableConfig, state_dict: dict[str, torch.Tensor], config_path: Path,
                               where: str) -> None:
    """Raise :class:`CheckpointError` naming config.json and each size it states that the weights contradict
    (a config.json of another model beside these weights printed 21 size mismatches and named neither)."""
    try:
        found = infer_deformable_config(state_dict, where, num_heads=stated.num_heads)
    except CheckpointError as error:  # the heads config.json states do not divide the attention weights
        raise CheckpointError(f"{config_path} does not fit the weights in {where}: {error} (its "
                              "encoder_attention_heads); use the config.json that came with the weights") from error
    differing = [f"{key} {getattr(stated, field)} (config.json) vs {getattr(found, field)} (weights)"
                 for field, key in _STATED_SIZES.items() if getattr(stated, field) != getattr(found, field)]
    if differing:
        raise CheckpointError(f"{config_path} does not fit the weights in {where}: {'; '.join(differing)}. The "
                              "config.json belongs to another model: use the one that came with the weights, or "
                              "write the directory again (save_pretrained)")


def huggingface_deformable_config(model: DeformableDETR, backbone_format: BackboneFormat = "timm",
                                  category_map: CategoryMap | None = None) -> dict[str, Any]:
    """config.json of :func:`save_pretrained_deformable`."""
    config = model.config
    if config is None or config.family != "deformable":
        raise ExportError("save_pretrained_deformable needs a Deformable DETR built by build_detr (model.config)")
    if config.backbone not in RESNET_BLOCKS:
        raise ExportError(f"backbone {config.backbone!r}: transformers can hold {', '.join(RESNET_BLOCKS)}")
    category_map = category_map or model.meta.category_map
    hf: dict[str, Any] = {
        "architectures": ["DeformableDetrForObjectDetection"], "model_type": MODEL_TYPE,
        "d_model": config.hidden_dim, "encoder_layers": config.num_encoder_layers,
        "decoder_layers": config.num_decoder_layers, "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads, "encoder_ffn_dim": config.dim_feedforward,
        "decoder_ffn_dim": config.dim_feedforward, "encoder_n_points": config.num_points,
        "decoder_n_points": config.num_points, "num_feature_levels": config.num_feature_levels,
        "num_queries": config.num_queries, "two_stage_num_proposals": config.num_queries,
        "with_box_refine": config.box_refine, "two_stage": config.two_stage, "num_channels": 3,
        "activation_function": "relu", "dropout": config.dropout, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "position_embedding_type": "sine", "dilation": config.dilation,
        "auxiliary_loss": False, "use_pretrained_backbone": False, "is_encoder_decoder": True,
        **label_fields(category_map, model.num_classes, model.meta.score_threshold),
        # transformers ties every layer's class head to the first unless told not to: a file whose heads differ
        # (box refinement trains one per layer) then loads them untied, with a warning per tensor
        "tie_word_embeddings": not _distinct_class_heads(model),
    }
    stages = [2, 3, 4] if config.num_feature_levels > 1 else [4]
    hf.update(resnet_backbone_fields(config.backbone, config.dilation, backbone_format, stages))
    return hf


def _distinct_class_heads(model: DeformableDETR) -> bool:
    """Whether any decoder layer's class head holds other values than the first layer's."""
    first = model.class_embed[0]
    return any(not (torch.equal(head.weight, first.weight) and torch.equal(head.bias, first.bias))
               for head in model.class_embed[1:])


def save_pretrained_deformable(model: DeformableDETR, directory: str | Path, *, backbone_format: BackboneFormat = "timm",
                               category_map: CategoryMap | None = None) -> Path:
    """Write ``model`` as ``DeformableDetrForObjectDetection.save_pretrained`` would: config.json,
    model.safetensors and preprocessor_config.json (DeformableDetrImageProcessor at the model's eval size)."""
    if backbone_format not in ("timm", "transformers"):
        raise ValueError(f"backbone_format must be 'timm' or 'transformers', got {backbone_format!r}")
    config = huggingface_deformable_config(model, backbone_format, category_map)
    tensors = to_huggingface_state_dict(model, backbone_format)
    directory = Path(directory)
    min_size, max_size = model.meta.eval_size or AUTHORS_EVAL_SIZE
    processor = {
        "image_processor_type": "DeformableDetrImageProcessor", "format": "coco_detection",
        "do_resize": True, "size": {"shortest_edge": int(min_size), "longest_edge": int(max_size)},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "do_pad": True,
    }
    write_huggingface_directory(directory, config, import_safetensors().save(tensors, metadata={"format": "pt"}),
                                processor)
    logger.info("wrote %s (Deformable DETR, %s backbone, %d classes)", directory, backbone_format, model.num_classes)
    return directory
