"""transformers' Grounding DINO and MM-Grounding-DINO directories → this project's
:class:`~detr.models.grounding.model.GroundingDINO`.

:func:`read_grounding` reads a directory as ``GroundingDinoForObjectDetection`` or
``MMGroundingDinoForObjectDetection``'s ``save_pretrained`` writes it (``config.json`` with ``model_type``
"grounding-dino" or "mm-grounding-dino", ``model.safetensors`` or ``pytorch_model.bin``) and returns the authors'
state dict and the :class:`~detr.models.grounding.config.GroundingConfig`; :func:`read_huggingface_grounding` is
the reader :func:`detr.load_checkpoint` finds by those model types (:data:`detr.checkpoints.HUGGINGFACE_READERS`),
which also reads the processor's resize and, with :func:`load_grounding_tokenizer`, the prompt's tokenizer from
the directory's tokenizer files (BERT WordPiece).

The image backbone is a transformers ResNet that is torchvision's (ResNet-18/34/50/101, stages 2–4 out), read
into this project's ResNet, or a Swin Transformer (the released checkpoints'), kept as transformers' module: its
weights go through transformers' own loader (``AutoBackbone.from_pretrained``), which renames them from their
names on disk to those of the installed version's modules.

The two implementations are the same model with different parameter names (this project keeps the authors',
IDEA-Research/GroundingDINO):

===================================================  =====================================================
this project (the authors' layout)                   transformers (as written to disk)
===================================================  =====================================================
``backbone.0.body.*`` (torchvision ResNet)           ``model.backbone.conv_encoder.model.*`` (its ResNet)
``bert.*``, ``feat_map``                             ``model.text_backbone.*``, ``model.text_projection``
``input_proj.{l}``                                   ``model.input_proj_vision.{l}``
``transformer.{level_embed, tgt_embed, enc_output,   ``model.{level_embed, query_position_embeddings,
enc_output_norm, enc_out_bbox_embed,                 enc_output, enc_output_norm, encoder_output_bbox_embed,
enc_out_class_embed}``                               encoder_output_class_embed}``
encoder ``fusion_layers.{i}`` (``layer_norm_v/l``,   ``layers.{i}.fusion_layer`` (``layer_norm_vision/text``,
``attn.{v,l,values_v,values_l,out_v,out_l}_proj``,   ``attn.{vision,text,values_vision,values_text,out_vision,
``gamma_v/l``)                                       out_text}_proj``, ``vision/text_param``)
encoder ``text_layers.{i}`` (``self_attn.in_proj``,  ``layers.{i}.text_enhancer_layer`` (``self_attn.{query,
``linear1/2``, ``norm1/2``)                          key,value}``, ``fc1/2``, ``layer_norm_before/after``)
encoder ``layers.{i}`` (``self_attn``, ``norm1``,    ``layers.{i}.deformable_layer`` (``self_attn``,
``linear1/2``, ``norm2``)                            ``self_attn_layer_norm``, ``fc1/2``, ``final_layer_norm``)
decoder ``self_attn`` + ``norm2``, ``ca_text`` +     ``self_attn`` + ``self_attn_layer_norm``,
``catext_norm``, ``cross_attn`` + ``norm1``,         ``encoder_attn_text`` + ``encoder_attn_text_layer_norm``,
``linear1/2`` + ``norm3``; ``norm``,                 ``encoder_attn`` + ``encoder_attn_layer_norm``, ``fc1/2``
``ref_point_head``                                   + ``final_layer_norm``; ``layer_norm``, ``reference_points_head``
``bbox_embed.{i}``, ``class_embed.{i}``              the same (and ``model.decoder.{bbox,class}_embed.{i}``)
===================================================  =====================================================

transformers' attention has separate query, key and value projections where the authors' has one ``in_proj``
(stacked q, k, v). A shared head (``decoder_bbox_embed_share``, ``decoder_cls_embed_share``) is written once, as
``*.0``; its other layers are read from it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from detr.checkpoints.formats import CheckpointContents, CheckpointError
from detr.checkpoints.huggingface import (
    BACKBONE_BODY,
    HF_BACKBONE_BODY,
    check_backbone_config,
    processor_eval_size,
    read_json,
    read_weights,
    with_resnet,
)
from detr.checkpoints.key_map import Drop, Fuse, KeyMap, Rename
from detr.models.config import ModelMeta
from detr.models.grounding.config import GroundingConfig

logger = logging.getLogger(__name__)

#: config.json's model_type → the contrastive head of that family.
MODEL_TYPES = {"grounding-dino": "dot", "mm-grounding-dino": "scaled_bias"}

_ENCODER, _DECODER = "transformer.encoder.", "transformer.decoder."
_FUSION, _TEXT_LAYER = "model.encoder.layers.{}.fusion_layer.", "model.encoder.layers.{}.text_enhancer_layer."
# (transformers' key start, this project's); "{}" is a layer index, the same on both sides.
_RENAMES: tuple[Rename, ...] = tuple(Rename(theirs, ours) for theirs, ours in (
    ("model.text_backbone.", "bert."),
    ("model.text_projection.", "feat_map."),
    ("model.input_proj_vision.", "input_proj."),
    ("model.level_embed", "transformer.level_embed"),
    ("model.query_position_embeddings.", "transformer.tgt_embed."),
    ("model.enc_output_norm.", "transformer.enc_output_norm."),
    ("model.enc_output.", "transformer.enc_output."),
    ("model.encoder_output_bbox_embed.", "transformer.enc_out_bbox_embed."),
    ("model.encoder_output_class_embed.", "transformer.enc_out_class_embed."),
    (_FUSION + "layer_norm_vision.", _ENCODER + "fusion_layers.{}.layer_norm_v."),
    (_FUSION + "layer_norm_text.", _ENCODER + "fusion_layers.{}.layer_norm_l."),
    (_FUSION + "attn.vision_proj.", _ENCODER + "fusion_layers.{}.attn.v_proj."),
    (_FUSION + "attn.text_proj.", _ENCODER + "fusion_layers.{}.attn.l_proj."),
    (_FUSION + "attn.values_vision_proj.", _ENCODER + "fusion_layers.{}.attn.values_v_proj."),
    (_FUSION + "attn.values_text_proj.", _ENCODER + "fusion_layers.{}.attn.values_l_proj."),
    (_FUSION + "attn.out_vision_proj.", _ENCODER + "fusion_layers.{}.attn.out_v_proj."),
    (_FUSION + "attn.out_text_proj.", _ENCODER + "fusion_layers.{}.attn.out_l_proj."),
    (_FUSION + "vision_param", _ENCODER + "fusion_layers.{}.gamma_v"),
    (_FUSION + "text_param", _ENCODER + "fusion_layers.{}.gamma_l"),
    (_TEXT_LAYER + "self_attn.out_proj.", _ENCODER + "text_layers.{}.self_attn.out_proj."),
    (_TEXT_LAYER + "fc1.", _ENCODER + "text_layers.{}.linear1."),
    (_TEXT_LAYER + "fc2.", _ENCODER + "text_layers.{}.linear2."),
    (_TEXT_LAYER + "layer_norm_before.", _ENCODER + "text_layers.{}.norm1."),
    (_TEXT_LAYER + "layer_norm_after.", _ENCODER + "text_layers.{}.norm2."),
    ("model.encoder.layers.{}.deformable_layer.self_attn.", _ENCODER + "layers.{}.self_attn."),
    ("model.encoder.layers.{}.deformable_layer.self_attn_layer_norm.", _ENCODER + "layers.{}.norm1."),
    ("model.encoder.layers.{}.deformable_layer.fc1.", _ENCODER + "layers.{}.linear1."),
    ("model.encoder.layers.{}.deformable_layer.fc2.", _ENCODER + "layers.{}.linear2."),
    ("model.encoder.layers.{}.deformable_layer.final_layer_norm.", _ENCODER + "layers.{}.norm2."),
    ("model.decoder.layers.{}.self_attn.out_proj.", _DECODER + "layers.{}.self_attn.out_proj."),
    ("model.decoder.layers.{}.self_attn_layer_norm.", _DECODER + "layers.{}.norm2."),
    ("model.decoder.layers.{}.encoder_attn_text.out_proj.", _DECODER + "layers.{}.ca_text.out_proj."),
    ("model.decoder.layers.{}.encoder_attn_text_layer_norm.", _DECODER + "layers.{}.catext_norm."),
    ("model.decoder.layers.{}.encoder_attn.", _DECODER + "layers.{}.cross_attn."),
    ("model.decoder.layers.{}.encoder_attn_layer_norm.", _DECODER + "layers.{}.norm1."),
    ("model.decoder.layers.{}.fc1.", _DECODER + "layers.{}.linear1."),
    ("model.decoder.layers.{}.fc2.", _DECODER + "layers.{}.linear2."),
    ("model.decoder.layers.{}.final_layer_norm.", _DECODER + "layers.{}.norm3."),
    ("model.decoder.layer_norm.", _DECODER + "norm."),
    ("model.decoder.reference_points_head.", _DECODER + "ref_point_head."),
    ("bbox_embed.", "bbox_embed."),
    ("class_embed.", "class_embed."),
))
#: transformers' Grounding DINO, without its backbone (:func:`_keys` adds it): its attentions' separate ``query``,
#: ``key`` and ``value`` projections (respelled to the engine's ``q_proj`` ...) are one ``in_proj`` here.
GROUNDING_KEYS = KeyMap(
    "Grounding DINO", _RENAMES,
    fuse=(Fuse(_TEXT_LAYER + "self_attn.", _ENCODER + "text_layers.{}.self_attn."),
          Fuse("model.decoder.layers.{}.self_attn.", _DECODER + "layers.{}.self_attn."),
          Fuse("model.decoder.layers.{}.encoder_attn_text.", _DECODER + "layers.{}.ca_text.")),
    drop=(Drop(r"model\.decoder\.(bbox|class)_embed\.", "the decoder's references to the heads (tied in "
               "transformers), read from the heads"),
          Drop(r".*position_ids$", "BERT's position index buffer"),
          Drop(r".*num_batches_tracked$", "BatchNorm's step counter")),
    read_spelling=((r"(text_enhancer_layer\.self_attn|decoder\.layers\.\d+\.(?:self_attn|encoder_attn_text))"
                    r"\.(q|k|v)(?:uery|ey|alue)\.", r"\1.\2_proj."),))


def _keys(resnet: bool) -> KeyMap:
    """:data:`GROUNDING_KEYS` with the backbone: a transformers or timm ResNet; else Swin, whose names stay as on
    disk under ``backbone.0.body.``."""
    if resnet:
        return with_resnet(GROUNDING_KEYS, "either")
    return replace(GROUNDING_KEYS, renames=(*GROUNDING_KEYS.renames, Rename(HF_BACKBONE_BODY, BACKBONE_BODY)))


def to_authors_state_dict(state_dict: dict[str, torch.Tensor], *, num_layers: int, share_box_heads: bool,
                          share_class_heads: bool, resnet: bool = True, where: str = "the state dict"
                          ) -> dict[str, torch.Tensor]:
    """A transformers Grounding DINO state dict → the authors' layout (:class:`GroundingDINO`'s keys); shared heads
    written once (``*.0``) fill every layer. A transformers ResNet becomes torchvision's; another backbone
    (``resnet=False``: Swin) keeps its names on disk under ``backbone.0.body.``. Keys without a counterpart raise a
    :class:`CheckpointError`."""
    converted = _keys(resnet).to_ours(state_dict, where)
    for head, shared in (("bbox_embed", share_box_heads), ("class_embed", share_class_heads)):
        first = {key[len(f"{head}.0."):]: value for key, value in converted.items() if key.startswith(f"{head}.0.")}
        for layer in range(1, num_layers):
            for name, value in first.items():
                if shared or f"{head}.{layer}.{name}" not in converted:
                    converted[f"{head}.{layer}.{name}"] = value
    return converted


def _field(config: dict[str, Any], key: str, expected: Any, config_path: Path) -> None:
    value = config.get(key, expected)
    if value != expected:
        raise CheckpointError(f"{config_path}: {key} = {value!r} has no counterpart here; this project's Grounding "
                              f"DINO is the released models' ({key} = {expected!r})")


def grounding_config(config: dict[str, Any], config_path: Path) -> GroundingConfig:
    """config.json of a transformers (MM-)Grounding DINO → :class:`GroundingConfig`; options this project does not
    build raise a :class:`CheckpointError` naming the field."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{config_path}: model_type {model_type!r} is not Grounding DINO; expected one of "
                              f"{', '.join(MODEL_TYPES)}")
    backbone_config = config.get("backbone_config")
    kind = backbone_config.get("model_type") if isinstance(backbone_config, dict) else config.get("backbone")
    if kind not in ("resnet", "swin"):
        raise CheckpointError(f"{config_path}: the image backbone is {kind!r}; this project builds Grounding DINO on "
                              "a transformers ResNet or Swin backbone_config")
    backbone, dilation = ("swin", False) if kind == "swin" else check_backbone_config(config, str(config_path))
    stages = backbone_config.get("out_features") or [f"stage{i}" for i in backbone_config.get("out_indices", [])]
    if dilation or list(stages) != ["stage2", "stage3", "stage4"]:
        raise CheckpointError(f"{config_path}: backbone_config out_features {stages} (dilation {dilation}): this "
                              "project reads the ResNet's stage2, stage3 and stage4, without dilation")
    for key, expected in (("two_stage", True), ("embedding_init_target", True), ("activation_function", "relu"),
                          ("position_embedding_type", "sine"), ("query_dim", 4)):
        _field(config, key, expected, config_path)
    if config.get("num_feature_levels", 4) < 3:
        raise CheckpointError(f"{config_path}: num_feature_levels {config['num_feature_levels']} < 3: transformers "
                              "then still reads three backbone stages, which this project does not")
    text_config = config.get("text_config") or {}
    if text_config.get("model_type", "bert") != "bert":
        raise CheckpointError(f"{config_path}: text_config model_type {text_config.get('model_type')!r}: the text "
                              "encoder must be BERT")
    return GroundingConfig(
        backbone=backbone, text_config=text_config, backbone_config=backbone_config if kind == "swin" else {},
        hidden_dim=config.get("d_model", 256),
        num_queries=config.get("num_queries", 900), num_feature_levels=config.get("num_feature_levels", 4),
        encoder_layers=config.get("encoder_layers", 6), num_decoder_layers=config.get("decoder_layers", 6),
        encoder_ffn_dim=config.get("encoder_ffn_dim", 2048), dim_feedforward=config.get("decoder_ffn_dim", 2048),
        encoder_heads=config.get("encoder_attention_heads", 8), num_heads=config.get("decoder_attention_heads", 8),
        encoder_points=config.get("encoder_n_points", 4), decoder_points=config.get("decoder_n_points", 4),
        num_classes=config.get("max_text_len", 256),
        position_temperature=float(config.get("positional_embedding_temperature", 20)),
        layer_norm_eps=config.get("layer_norm_eps", 1e-5), dropout=config.get("dropout", 0.1),
        fusion_drop_path=config.get("fusion_droppath", 0.1), contrastive_head=MODEL_TYPES[model_type],
        share_box_heads=config.get("decoder_bbox_embed_share", True),
        share_class_heads=config.get("decoder_cls_embed_share", True))


def read_grounding(directory: str | Path) -> tuple[dict[str, torch.Tensor], GroundingConfig]:
    """A transformers (MM-)Grounding DINO directory → (the authors' state dict, its :class:`GroundingConfig`)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory} has no config.json: expected a directory that transformers' "
                              "GroundingDinoForObjectDetection.save_pretrained wrote")
    config = grounding_config(read_json(config_path), config_path)
    state_dict = to_authors_state_dict(read_weights(directory), num_layers=config.num_decoder_layers,
                                       share_box_heads=config.share_box_heads,
                                       share_class_heads=config.share_class_heads, resnet=config.backbone != "swin",
                                       where=str(directory))
    return state_dict, config


def read_huggingface_grounding(directory: str | Path) -> CheckpointContents:
    """A transformers (MM-)Grounding DINO directory → its contents: the authors' state dict (a Swin backbone's
    weights in the installed transformers' names), its :class:`GroundingConfig`, the processor's resize
    (``meta.eval_size``) and the prompt's tokenizer (when the directory has the tokenizer files; needs
    transformers, as building the model does)."""
    directory = Path(directory)
    state_dict, config = read_grounding(directory)
    if config.backbone == "swin":
        state_dict = transformers_backbone_weights(state_dict, config, where=str(directory))
    tokenizer = None
    if any((directory / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        tokenizer = load_grounding_tokenizer(directory)
    else:
        logger.warning("%s has no tokenizer files: prompts cannot be read (pass input_ids to the model)", directory)
    return CheckpointContents(state_dict, config, ModelMeta(eval_size=_eval_size(directory)), tokenizer=tokenizer)


def transformers_backbone_weights(state_dict: dict[str, torch.Tensor], config: GroundingConfig, *,
                                  where: str) -> dict[str, torch.Tensor]:
    """``state_dict`` with its ``backbone.0.body.*`` weights (a transformers backbone's names on disk) renamed as the
    installed transformers names its modules: written to a temporary directory with the backbone's config and
    read back by the backbone class's ``from_pretrained``, which knows its renames (not ``AutoBackbone``'s, which
    asks the hub whether the folder is a repository). Missing weights raise."""
    import json
    import tempfile

    from detr.checkpoints.huggingface import import_safetensors
    from detr.models.grounding.swin import transformers_backbone_class

    body = {key[len(BACKBONE_BODY):]: value.contiguous() for key, value in state_dict.items()
            if key.startswith(BACKBONE_BODY)}
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(dict(config.backbone_config)))
        import_safetensors().save_file(body, str(Path(folder) / "model.safetensors"))
        backbone, info = transformers_backbone_class(config.backbone_config).from_pretrained(
            folder, output_loading_info=True)
    missing = [key for key in info["missing_keys"] if not key.endswith("relative_position_index")]
    if missing:
        raise CheckpointError(f"{where}: the {config.backbone} backbone's weights lack {sorted(missing)[:3]}")
    converted = {key: value for key, value in state_dict.items() if not key.startswith(BACKBONE_BODY)}
    converted.update({BACKBONE_BODY + key: value for key, value in backbone.state_dict().items()})
    return converted


def _eval_size(directory: Path) -> tuple[int, int] | None:
    """The processor's resize (shortest, longest side): preprocessor_config.json (the hub's directories), else the
    ``image_processor`` of processor_config.json (what transformers 5's processor ``save_pretrained`` writes)."""
    combined = directory / "processor_config.json"
    if not (directory / "preprocessor_config.json").is_file() and combined.is_file():
        size = read_json(combined).get("image_processor", {}).get("size")
        if isinstance(size, dict) and "shortest_edge" in size and "longest_edge" in size:
            return int(size["shortest_edge"]), int(size["longest_edge"])
    return processor_eval_size(directory)


def load_grounding_tokenizer(directory: str | Path) -> Any:
    """The prompt's tokenizer from the directory's tokenizer files (``tokenizer.json`` or ``vocab.txt``, as
    ``save_pretrained`` of the processor writes them): transformers' ``AutoTokenizer``."""
    directory = Path(directory)
    if not any((directory / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        raise CheckpointError(f"{directory} has no tokenizer files (tokenizer.json or vocab.txt): save the processor "
                              "there too (GroundingDinoProcessor.save_pretrained), or pass input_ids yourself")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))
