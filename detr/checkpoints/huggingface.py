"""Hugging Face transformers DETR checkpoints in and out.

In: :func:`read_huggingface` reads a directory as ``transformers.DetrForObjectDetection.save_pretrained``
writes it and as the Hugging Face hub serves it (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``), with a timm ResNet backbone (transformers' default) or transformers' own ResNet,
DC5, any number of labels; ``id2label`` (and the data set's ``category_ids`` that :func:`save_pretrained`
writes beside it) becomes the category map. :func:`detr.load_checkpoint` calls it
for a directory, so ``detr.load_checkpoint("detr-resnet-50/")`` just works.

Out: :func:`save_pretrained` writes a model of this project in that format, so that
``transformers.DetrForObjectDetection.from_pretrained(directory)`` gives the same outputs.

The two implementations are the same model (the paper's) with different parameter names:

=====================================================  ==============================================
this project (the authors' layout)                     transformers (as written to disk)
=====================================================  ==============================================
``backbone.0.body.*`` (torchvision ResNet)             ``model.backbone.conv_encoder.model.*`` (timm
                                                       ResNet: same names; transformers' ResNet:
                                                       ``embedder`` / ``encoder.stages.N.layers.M``)
``*.self_attn.in_proj_weight`` [3C, C] (q; k; v)       ``*.self_attn.{q,k,v}_proj.weight`` [C, C] each
``multihead_attn``                                     ``encoder_attn``
``norm1/norm2`` (encoder), ``norm1/2/3`` (decoder)     ``self_attn_layer_norm``, (``encoder_attn_layer_norm``),
                                                       ``final_layer_norm``
``linear1/linear2``, ``transformer.decoder.norm``      ``fc1/fc2``, ``model.decoder.layernorm``
``input_proj``, ``query_embed``                        ``model.input_projection``, ``model.query_position_embeddings``
``class_embed``, ``bbox_embed.layers.N``               ``class_labels_classifier``, ``bbox_predictor.layers.N``
``backbone.1.{row,col}_embed`` (learned positions)     ``model.position_embedding.{row,column}_embeddings``
=====================================================  ==============================================

transformers 5 renames some of these in memory (``backbone.model``, ``o_proj``, ``mlp.fc1``) but writes the
names above, which are also those of transformers 4 and of the hub's original uploads (transformers 4 kept
the learned position table under ``model.backbone.position_embedding``); every spelling is read.
transformers, timm and safetensors are imported only when needed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.atomic_files import folder_written_atomically, write_atomically, write_text_atomically
from detr.categories import CategoryMap
from detr.checkpoints.key_map import Drop, Field, Fuse, KeyMap, Rename
from detr.checkpoints.formats import (
    CheckpointContents,
    CheckpointError,
    ExportError,
    StatedSize,
    check_stated_sizes,
    infer_model_config,
    torch_load,
)
from detr.models.backbone import Backbone
from detr.models.config import AUTHORS_EVAL_SIZE, ModelMeta, check_threshold
from detr.models.detr_family import DetrConfig
from detr.models.detr import DETR
from detr.models.layers.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine

logger = logging.getLogger(__name__)

BackboneFormat = Literal["timm", "transformers"]

MODEL_TYPE = "detr"

#: ResNets that exist both as torchvision's (this project) and as timm's / transformers' models.
RESNET_BLOCKS = {
    "resnet18": ("basic", [2, 2, 2, 2]),
    "resnet34": ("basic", [3, 4, 6, 3]),
    "resnet50": ("bottleneck", [3, 4, 6, 3]),
    "resnet101": ("bottleneck", [3, 4, 23, 3]),
}

BACKBONE_BODY, HF_BACKBONE_BODY = "backbone.0.body.", "model.backbone.conv_encoder.model."
NUM_BATCHES_TRACKED = Drop(r".*num_batches_tracked$", "batch norm's step counter, unused by frozen batch norm", "both")
#: transformers 5's in-memory names → the names it writes to disk (DETR, Deformable DETR).
CURRENT_SPELLING = ((r"^model\.backbone\.model\.", HF_BACKBONE_BODY), (r"\.o_proj\.", ".out_proj."),
                    (r"\.mlp\.(fc[12])\.", r".\1."))
_ATTENTION, _LAYERS = "model.{stack}.layers.{}.", "transformer.{stack}.layers.{}."
#: (transformers' key start, this project's); ``{}`` a layer index, the same on both sides.
_RENAMES: tuple[Rename, ...] = (
    Rename("model.input_projection.", "input_proj."),
    Rename("model.query_position_embeddings.", "query_embed."),
    Rename("class_labels_classifier.", "class_embed."),
    Rename("bbox_predictor.layers.", "bbox_embed.layers."),
    Rename("model.decoder.layernorm.", "transformer.decoder.norm."),
    # learned position encoding: transformers 4 had it under model.backbone., 5 reads and writes it here
    Rename("model.position_embedding.row_embeddings.", "backbone.1.row_embed."),
    Rename("model.position_embedding.column_embeddings.", "backbone.1.col_embed."),
    Rename(_ATTENTION + "self_attn.out_proj.", _LAYERS + "self_attn.out_proj."),
    Rename("model.decoder.layers.{}.encoder_attn.out_proj.", "transformer.decoder.layers.{}.multihead_attn.out_proj."),
    Rename("model.encoder.layers.{}.self_attn_layer_norm.", "transformer.encoder.layers.{}.norm1."),
    Rename("model.encoder.layers.{}.final_layer_norm.", "transformer.encoder.layers.{}.norm2."),
    Rename("model.decoder.layers.{}.self_attn_layer_norm.", "transformer.decoder.layers.{}.norm1."),
    Rename("model.decoder.layers.{}.encoder_attn_layer_norm.", "transformer.decoder.layers.{}.norm2."),
    Rename("model.decoder.layers.{}.final_layer_norm.", "transformer.decoder.layers.{}.norm3."),
    Rename(_ATTENTION + "fc{}.", _LAYERS + "linear{}."),
)
#: transformers' ResNet inside the backbone ↔ torchvision's (timm's ResNet has torchvision's names): torchvision
#: counts stages and convolutions from 1 (layer1, conv1), transformers from 0 (stages.0, layer.0).
_RESNET_RENAMES: tuple[Rename, ...] = tuple(Rename(HF_BACKBONE_BODY + theirs, BACKBONE_BODY + ours)
                                            for theirs, ours in (
    ("embedder.embedder.convolution.", "conv1."),
    ("embedder.embedder.normalization.", "bn1."),
    ("encoder.stages.{stage}.layers.{}.shortcut.convolution.", "layer{stage}.{}.downsample.0."),
    ("encoder.stages.{stage}.layers.{}.shortcut.normalization.", "layer{stage}.{}.downsample.1."),
    ("encoder.stages.{stage}.layers.{}.layer.{conv}.convolution.", "layer{stage}.{}.conv{conv}."),
    ("encoder.stages.{stage}.layers.{}.layer.{conv}.normalization.", "layer{stage}.{}.bn{conv}."),
))
_TIMM_RENAME = Rename(HF_BACKBONE_BODY, BACKBONE_BODY)


def with_resnet(keys: KeyMap, backbone_format: BackboneFormat | Literal["either"]) -> KeyMap:
    """``keys`` (a table of DETR or Deformable DETR without the backbone) with the ResNet's renames after its own:
    timm's (torchvision's names), transformers' own ResNet's, or, for reading, ``"either"``."""
    backbone = {"timm": (_TIMM_RENAME,), "transformers": _RESNET_RENAMES,
                "either": (*_RESNET_RENAMES, _TIMM_RENAME)}[backbone_format]
    return replace(keys, renames=(*keys.renames, *backbone),
                   fields={**keys.fields, "stage": Field.shifted(1), "conv": Field.shifted(1)})


#: DETR without its backbone (:func:`with_resnet` adds it).
DETR_KEYS = KeyMap(
    "DETR", _RENAMES, fields={"stack": Field.choice("encoder", "decoder")},
    fuse=(Fuse(_ATTENTION + "self_attn.", _LAYERS + "self_attn."),
          Fuse("model.decoder.layers.{}.encoder_attn.", "transformer.decoder.layers.{}.multihead_attn.")),
    drop=(NUM_BATCHES_TRACKED,),
    # transformers 5's in-memory names and version 4's learned position table → the names transformers 5 writes
    read_spelling=(*CURRENT_SPELLING, (r"^model\.backbone\.position_embedding\.", "model.position_embedding.")))


def import_safetensors():
    """``safetensors.torch``, or an ImportError that names the package to install (the readers and writers of
    transformers' directories share it)."""
    try:
        import safetensors.torch
    except ImportError as error:
        raise ImportError("Hugging Face's model.safetensors files need the safetensors package: "
                          "pip install safetensors") from error
    return safetensors.torch


def to_official_state_dict(state_dict: dict[str, torch.Tensor], where: str = "the state dict"
                           ) -> dict[str, torch.Tensor]:
    """A transformers ``DetrForObjectDetection`` state dict → this project's (the authors') key layout
    (:data:`DETR_KEYS` :func:`with_resnet` either backbone).

    q, k and v projections are concatenated into ``in_proj_weight`` / ``in_proj_bias`` (in that order, as
    ``nn.MultiheadAttention`` stores them); ``num_batches_tracked`` buffers are dropped; floating-point
    tensors become float32. A key that has no counterpart raises :class:`CheckpointError`.
    """
    if any(key.startswith("detr.") for key in state_dict):
        raise CheckpointError(f"{where} is a DetrForSegmentation (panoptic) model: only DetrForObjectDetection "
                              f"checkpoints are read")
    return with_resnet(DETR_KEYS, "either").to_ours(state_dict, where)


def to_huggingface_state_dict(state_dict: dict[str, torch.Tensor], backbone_format: BackboneFormat = "timm"
                              ) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_official_state_dict`: this project's layout → transformers' (as on disk).

    ``backbone_format`` "timm" keeps torchvision's ResNet names (transformers' default backbone);
    "transformers" uses transformers' own ResNet names. Every tensor is a contiguous copy.
    """
    return with_resnet(DETR_KEYS, backbone_format).to_theirs(state_dict)


# ---------------------------------------------------------------------------------------------- reading


def read_json(path: Path) -> dict[str, Any]:
    """A directory's config.json or preprocessor_config.json; a :class:`CheckpointError` naming the file when it
    cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"could not read {path}: {error}") from error


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, pytorch_model.bin, or their sharded forms (``*.index.json``)."""
    def load(path: Path) -> dict[str, torch.Tensor]:
        if path.suffix == ".safetensors":
            safetensors_torch = import_safetensors()
            from safetensors import SafetensorError
            try:
                return safetensors_torch.load_file(str(path))
            except SafetensorError as error:  # its message never names the file
                raise CheckpointError(
                    f"{path} is not a readable safetensors file ({error}): it is truncated or corrupt, e.g. an "
                    f"interrupted download or copy; download it again, or write the directory again with "
                    f"save_pretrained / detr-convert") from error
        obj = torch_load(path)  # weights_only=True
        if not isinstance(obj, dict):
            raise CheckpointError(f"{path} does not hold a state dict")
        return obj

    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return load(directory / name)
        index = directory / f"{name}.index.json"
        if index.is_file():
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(read_json(index)["weight_map"].values())):
                state.update(load(directory / shard))
            return state
    raise CheckpointError(f"{directory} has a config.json but no weights: expected model.safetensors or "
                          f"pytorch_model.bin (or their sharded *.index.json forms)")


def resnet_block_flags(layer_type: str) -> dict[str, bool]:
    """The block flags a transformers ResNet config must have to be torchvision's ResNet: none for basic blocks,
    whose layers never read ``downsample_in_bottleneck`` (transformers' ResNet and RTDetrResNet read it in the
    bottleneck only), so a basic-block config that sets it builds the same model."""
    return {"downsample_in_bottleneck": False} if layer_type == "bottleneck" else {}


def check_backbone_config(config: dict[str, Any], where: str) -> tuple[str | None, bool]:
    """The backbone the config describes → (ResNet name if stated, dilation); unsupported ones raise.

    transformers 4 writes ``use_timm_backbone`` + ``backbone`` (+ ``backbone_config`` for its own ResNet);
    transformers 5 writes ``backbone_config`` with model_type "timm_backbone" or "resnet"."""
    backbone_config = config.get("backbone_config")
    dilation = bool(config.get("dilation", False))
    if isinstance(backbone_config, dict) and backbone_config.get("model_type") == "resnet":
        layer_type, depths = backbone_config.get("layer_type", "bottleneck"), list(backbone_config.get("depths", []))
        expected = {"embedding_size": 64, "hidden_act": "relu", "downsample_in_first_stage": False,
                    "num_channels": 3, **resnet_block_flags(layer_type)}
        wrong = {k: backbone_config[k] for k, v in expected.items() if k in backbone_config and backbone_config[k] != v}
        name = next((n for n, spec in RESNET_BLOCKS.items() if spec == (layer_type, depths)), None)
        if wrong or name is None:
            raise CheckpointError(
                f"{where}: backbone_config describes a ResNet ({layer_type}, depths {depths}, {wrong or 'standard'}) "
                f"that is not torchvision's ResNet-18/34/50/101, the backbones this project builds")
        return name, dilation
    if isinstance(backbone_config, dict) and backbone_config.get("model_type") not in (None, "timm_backbone"):
        raise CheckpointError(f"{where}: backbone model_type {backbone_config.get('model_type')!r} is not supported; "
                              f"this project's DETR has a ResNet backbone (timm's or transformers' ResNet)")
    if isinstance(backbone_config, dict):  # transformers 5, timm
        timm_name = backbone_config.get("backbone")
        dilation = dilation or backbone_config.get("output_stride") == 16
    else:  # transformers 4: use_timm_backbone (default true) with `backbone`, or a hub name of a transformers ResNet
        timm_name = config.get("backbone") or "resnet50"
        if not config.get("use_timm_backbone", True):
            return None, dilation  # e.g. "microsoft/resnet-50": the depth is read from the weights
    base = str(timm_name).removeprefix("timm/").split(".")[0]
    if base not in RESNET_BLOCKS:
        raise CheckpointError(f"{where}: backbone {timm_name!r} has no counterpart here; supported: timm's "
                              f"{', '.join(RESNET_BLOCKS)} (torchvision's architecture) or transformers' ResNet")
    return base, dilation


def label_fields(category_map: CategoryMap | None, num_classes: int,
                 score_threshold: float | None = None) -> dict[str, Any]:
    """config.json's ``id2label`` and ``label2id`` (transformers' label names) and, with a category map, this
    project's ``category_ids`` (label ``i`` is the data set's category ``category_ids[i]``): transformers
    numbers labels 0..K-1 and has no field for a data set's ids, so without it a model trained on ids 1..5
    predicted ids 0..4 once converted. ``score_threshold`` (the threshold the model's validation found best,
    :attr:`ModelMeta.score_threshold`) is kept the same way, so predictions through the converted directory
    keep the model's default. transformers keeps extra fields through its own save_pretrained."""
    names = (list(category_map.names) if category_map is not None else [f"LABEL_{i}" for i in range(num_classes)])
    fields: dict[str, Any] = {"id2label": {str(i): n for i, n in enumerate(names)},
                              "label2id": {n: i for i, n in enumerate(names)}}
    if category_map is not None:
        fields["category_ids"] = list(category_map.category_ids)
    if score_threshold is not None:
        fields["score_threshold"] = float(score_threshold)
    return fields


def read_meta(config: dict[str, Any], num_classes: int, config_path: Path,
              eval_size: tuple[int, int] | None) -> ModelMeta:
    """The model's record from a transformers config.json: the category map (:func:`category_map_from_labels`) and the
    ``score_threshold`` :func:`label_fields` wrote (a value outside (0, 1) is refused, naming the file)."""
    threshold = config.get("score_threshold")
    try:
        check_threshold("score_threshold", threshold)  # ModelMeta's check, before the labels are read
    except ValueError as error:
        raise CheckpointError(f"{config_path}: {error}; correct it, or remove the field to use the default "
                              "threshold") from None
    return ModelMeta(category_map=category_map_from_labels(config, num_classes, config_path), eval_size=eval_size,
                     score_threshold=threshold)


def category_map_from_labels(config: dict[str, Any], num_classes: int, config_path: Path) -> CategoryMap:
    """``id2label`` → labels 0..num_classes-1 with their names (transformers' "LABEL_i" where missing), and
    the data set's category ids from ``category_ids`` (:func:`label_fields`; without it: the labels).

    Labels at or beyond the weights' class count are refused: transformers derives ``num_labels`` from
    ``id2label`` and refuses weights of another size, and here they would be names no prediction can carry.
    Gaps inside the range get transformers' default name, with a warning naming them."""
    try:
        id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    except (TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"{config_path}: id2label must map label numbers (\"0\", \"1\", ...) to names: "
                              f"{error}") from error
    beyond = sorted(k for k in id2label if not 0 <= k < num_classes)
    if beyond:
        raise CheckpointError(
            f"{config_path}: id2label has labels {beyond} but the weights have {num_classes} classes "
            f"(labels 0..{num_classes - 1}); renumber id2label to 0..{num_classes - 1}, or use the config.json "
            f"that came with these weights")
    gaps = [i for i in range(num_classes) if i not in id2label]
    if id2label and gaps:
        logger.warning("%s: id2label names no class for labels %s of 0..%d; they are called LABEL_n",
                       config_path, gaps, num_classes - 1)
    names = tuple(id2label.get(i, f"LABEL_{i}") for i in range(num_classes))
    ids = config.get("category_ids")
    if ids is None:
        return CategoryMap(tuple(range(num_classes)), names)
    if (not isinstance(ids, list) or len(ids) != num_classes or len(set(map(str, ids))) != num_classes
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise CheckpointError(
            f"{config_path}: category_ids must list one distinct integer category id per label ({num_classes}, "
            f"the weights' classes), got {ids!r}; write the directory again with detr-convert, or remove the "
            "field to predict label numbers")
    return CategoryMap(tuple(ids), names)


def processor_square_size(directory: Path, *, default: int) -> int | None:
    """The square side of preprocessor_config.json's resize (``{"height": s, "width": s}``); any other size
    raises: the real-time families resize to a square (``InputSpec`` resize "square"). None without the file,
    with a warning that names the family's ``default`` side used instead (as :func:`processor_eval_size` does
    for DETR's folders): a model trained at 128 px silently predicted at 640."""
    path = directory / "preprocessor_config.json"
    if not path.is_file():
        logger.warning("%s has no preprocessor_config.json: images are resized to the family's default %d x %d "
                       "pixels. If the model was trained at another size, pass it (--min-size; the Predictor's "
                       "min_size) or add the file (detr-convert writes it)", directory, default, default)
        return None
    size = read_json(path).get("size")
    if (not isinstance(size, dict) or "height" not in size or "width" not in size
            or int(size["height"]) != int(size["width"])):
        raise CheckpointError(f"{path}: size {size!r} is not a square {{'height': s, 'width': s}}; this project runs "
                              f"this model at a square size (InputSpec resize='square'): set size to one, e.g. "
                              f"{{'height': {default}, 'width': {default}}}")
    return int(size["height"])


def processor_eval_size(directory: Path) -> tuple[int, int] | None:
    """(shortest side, longest-side cap) from preprocessor_config.json; None, with a warning that names the
    size used instead (the authors' 800 / 1333), when the file is missing or states no such size: a model
    trained at 512 px silently predicted at 800."""
    path = directory / "preprocessor_config.json"
    if path.is_file():
        config = read_json(path)
        size = config.get("size")
        if isinstance(size, dict) and "shortest_edge" in size and "longest_edge" in size:
            return int(size["shortest_edge"]), int(size["longest_edge"])
        if isinstance(size, int) and isinstance(config.get("max_size"), int):  # older processors
            return size, int(config["max_size"])
        why = f"{path} states no size (shortest_edge and longest_edge)"
    else:
        why = f"{directory} has no preprocessor_config.json"
    logger.warning("%s: images are resized as the authors' (shortest side %d px, longest at most %d). If the model "
                   "was trained at another size, pass it (--min-size/--max-size; the Predictor's min_size/max_size) "
                   "or add the file", why, *AUTHORS_EVAL_SIZE)
    return None


#: config.json's sizes (DetrConfig field → its key) and the tensors that show them: checked by
#: :func:`detr.checkpoints.formats.check_stated_sizes`; the layer counts are checked by name below.
_STATED_FIELDS = {"hidden_dim": "d_model", "dim_feedforward": "encoder_ffn_dim", "num_queries": "num_queries"}
STATED_SIZES: tuple[StatedSize, ...] = (
    ("d_model", lambda config: config.hidden_dim, "class_embed.weight", 1),
    ("encoder_ffn_dim", lambda config: config.dim_feedforward, "transformer.decoder.layers.0.linear1.weight", 0),
    ("num_queries", lambda config: config.num_queries, "query_embed.weight", 0),
)


def write_huggingface_directory(directory: Path, config: dict[str, Any], weights: bytes,
                                processor: dict[str, Any]) -> Path:
    """Write a transformers directory whole or not at all (:func:`detr.atomic_files.folder_written_atomically`):
    config.json, model.safetensors (``weights``: safetensors' bytes) and preprocessor_config.json. An earlier
    directory there is replaced only once the new one is complete, so a full disk or a crash leaves it as it was,
    and none of its files (another model's pytorch_model.bin) stays beside the new ones."""
    with folder_written_atomically(directory) as staged:
        # Through the atomic writer, not safetensors' save_file: that one renames a private temporary file into
        # place, so model.safetensors came out 0600 beside 0644 files, unreadable to others sharing the model.
        write_text_atomically(staged / "config.json", json.dumps(config, indent=2) + "\n")
        write_atomically(staged / "model.safetensors", lambda file: file.write(weights))
        write_text_atomically(staged / "preprocessor_config.json", json.dumps(processor, indent=2) + "\n")
    return directory


def read_huggingface(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``DetrForObjectDetection`` directory into this project's layout + build config.

    Raises:
        CheckpointError: no config.json, a config of another model type (Deformable DETR, RT-DETR, ...),
            a segmentation model, a backbone other than a torchvision-style ResNet, settings this
            project's transformer lacks (different encoder and decoder widths, a non-ReLU activation).
    """
    directory = Path(directory)
    where = str(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory} is a directory without config.json: not a Hugging Face model directory "
                              f"(checkpoint files are read by path, e.g. {directory}/model.pth)")
    config = read_json(config_path)
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{config_path} has model_type {model_type!r}: read_huggingface reads DETR's "
                              f"directories (model_type {MODEL_TYPE!r}); detr.load_checkpoint reads every family's")
    architectures = config.get("architectures") or []
    if "DetrForSegmentation" in architectures:
        raise CheckpointError(f"{config_path}: DetrForSegmentation (panoptic) is not supported; only "
                              f"DetrForObjectDetection")
    differing = {f"{a}/{b}": (config.get(a), config.get(b)) for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
        if config.get(a, 8) != config.get(b, 8)}
    if differing:
        raise CheckpointError(f"{config_path}: this project's transformer has one head count and one FFN width for the "
                              f"encoder and the decoder; found {differing}")
    if config.get("activation_function", "relu") != "relu":
        raise CheckpointError(f"{config_path}: activation_function {config['activation_function']!r}; DETR uses relu")
    if config.get("num_channels", 3) != 3:
        raise CheckpointError(f"{config_path}: num_channels {config['num_channels']}; this project reads RGB images")
    position_encoding = config.get("position_embedding_type", "sine")
    if position_encoding not in ("sine", "learned"):
        raise CheckpointError(f"{config_path}: position_embedding_type {position_encoding!r} is not 'sine' or "
                              f"'learned'")
    backbone, dilation = check_backbone_config(config, str(config_path))
    if config.get("auxiliary_loss", False):
        logger.warning("%s: auxiliary_loss=true, with which transformers feeds each decoder layer's normalised "
                       "output to the next layer; this project's decoder follows the paper (the final norm only "
                       "on the heads' inputs), so predictions differ from transformers' for this model", config_path)

    state_dict = to_official_state_dict(read_weights(directory), where)
    if "class_embed.weight" not in state_dict:
        raise CheckpointError(f"{where} has no class_labels_classifier: a DetrModel without the detection heads?")
    model_config = infer_model_config(state_dict, where, class_head="softmax")
    # The weights decide the layer counts; config.json states them too, and a weights file that lost layers
    # would otherwise load as a shallower model.
    for stack in ("encoder", "decoder"):
        stated, found = config.get(f"{stack}_layers"), getattr(model_config, f"num_{stack}_layers")
        if stated is not None and stated != found:
            raise CheckpointError(f"{config_path} states {stack}_layers={stated} but the weights in {where} hold "
                                  f"{found} {stack} layer(s): the weights file is incomplete or belongs to another "
                                  f"model; download or write the directory again")
    if backbone is not None and model_config.backbone != backbone:
        raise CheckpointError(f"{config_path} names backbone {backbone} but the weights are a "
                              f"{model_config.backbone}")
    # the sizes come from the weights; config.json's must agree, or it belongs to another model
    stated = {field: int(config[key]) for field, key in _STATED_FIELDS.items() if isinstance(config.get(key), int)}
    check_stated_sizes(model_config.replace(**stated), state_dict, STATED_SIZES, config_path, where)
    model_config = model_config.replace(
        dilation=dilation, num_heads=int(config.get("encoder_attention_heads", DetrConfig.num_heads)),
        position_encoding=position_encoding, dropout=float(config.get("dropout", DetrConfig.dropout)))
    meta = read_meta(config, model_config.num_classes, config_path, processor_eval_size(directory))
    return CheckpointContents(state_dict, model_config, meta)


# ---------------------------------------------------------------------------------------------- writing


def check_exportable(model: DETR) -> None:
    """Raise :class:`ExportError` naming the first option transformers' DETR does not have.

    transformers' DetrForObjectDetection is the paper's model: learned queries, a softmax head with a
    no-object class, post-norm layers, a ResNet with frozen batch norm (or DC5) ending at layer4, sine or
    learned position encoding.
    """
    problems = []
    config = _config(model)
    if config.query_type != "learned":
        problems.append(f"query_type={config.query_type!r} (anchor queries: DAB-DETR's decoder)")
    if config.class_head != "softmax":
        problems.append(f"class_head={config.class_head!r} (sigmoid head: no no-object logit)")
    if config.denoising:
        problems.append("denoising queries")
    if config.query_groups != 1:
        problems.append(f"query_groups={config.query_groups}")
    if config.dense_aux_head:
        problems.append("a dense auxiliary head")
    transformer = model.transformer
    if getattr(transformer.encoder, "norm", None) is not None or any(
            getattr(layer, "pre_norm", False) for layer in transformer.modules()):
        problems.append("pre_norm=True (transformers' DETR is post-norm)")
    body = model.backbone[0]
    if not isinstance(body, Backbone):
        problems.append(f"backbone {type(body).__name__} (a ResNet Backbone is needed)")
    else:
        modules = list(body.body.modules())
        if any(isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) for m in modules):
            problems.append("a backbone with trainable batch norm or group norm (transformers freezes batch norm)")
        elif not any(isinstance(m, FrozenBatchNorm2d) for m in modules):
            problems.append("frozen batch norm folded into the convolutions (optimize_for_inference); save the "
                            "model before folding, or load the checkpoint again")
        if "layer4" not in dict(body.body.named_children()):
            problems.append("backbone_last_stage other than layer4")
    encoding = model.backbone[1]
    if isinstance(encoding, PositionEmbeddingSine):
        if (encoding.temperature, encoding.normalize) != (10000, True) or abs(encoding.scale - 2 * torch.pi) > 1e-12:
            problems.append("a sine encoding with non-default temperature, normalisation or scale")
    elif not (isinstance(encoding, PositionEmbeddingLearned) and encoding.row_embed.num_embeddings == 50):
        problems.append(f"position encoding {type(encoding).__name__}")
    if problems:
        raise ExportError("transformers' DetrForObjectDetection has no equivalent for " + "; ".join(problems)
                          + ". Only the paper's model (learned queries, softmax head, post-norm, frozen-BN ResNet) "
                            "can be exported")


def _config(model: DETR) -> DetrConfig:
    """The model's config; for a model built without build_detr, the one its weights show."""
    return model.config if model.config is not None else infer_model_config(model.state_dict(),
                                                                            class_head=model.class_head)


def _backbone_name(model: DETR) -> str:
    name = _config(model).backbone
    if name not in RESNET_BLOCKS:
        raise ExportError(f"backbone {name!r}: transformers' DETR can hold {', '.join(RESNET_BLOCKS)}")
    return name


def huggingface_config(model: DETR, backbone_format: BackboneFormat = "timm",
                       category_map: CategoryMap | None = None) -> dict[str, Any]:
    """config.json of :func:`save_pretrained`, in the form the hub's DETR configs have (read by transformers
    4 and 5 alike): ``use_timm_backbone`` + ``backbone``, or a ResNet ``backbone_config``."""
    transformer = model.transformer
    heads = transformer.nhead
    ffn = transformer.decoder.layers[0].linear1.out_features
    dropout = float(_config(model).dropout)
    name = _backbone_name(model)
    dilation = model.backbone[0].stride == 16
    if category_map is None:
        category_map = model.meta.category_map
    config: dict[str, Any] = {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "d_model": transformer.d_model,
        "encoder_layers": len(transformer.encoder.layers),
        "decoder_layers": len(transformer.decoder.layers),
        "encoder_attention_heads": heads,
        "decoder_attention_heads": heads,
        "encoder_ffn_dim": ffn,
        "decoder_ffn_dim": ffn,
        "num_queries": model.num_queries,
        "num_channels": 3,
        "activation_function": "relu",
        # the paper's dropout is on the residual branches, the attention weights and the FFN hidden layer
        "dropout": dropout,
        "attention_dropout": dropout,
        "activation_dropout": dropout,
        # transformers' auxiliary_loss=True also feeds each decoder layer's normalised output to the next
        # layer, which the paper's decoder does not (it normalises only the copies given to the heads), so
        # it would change the predictions: off.
        "auxiliary_loss": False,
        "position_embedding_type": "sine" if isinstance(model.backbone[1], PositionEmbeddingSine) else "learned",
        "dilation": dilation,
        "use_pretrained_backbone": False,  # every backbone weight is in the file
        **label_fields(category_map, model.num_classes, model.meta.score_threshold),
        "is_encoder_decoder": True,
    }
    config.update(resnet_backbone_fields(name, dilation, backbone_format, stages=[4]))
    return config


def resnet_backbone_fields(name: str, dilation: bool, backbone_format: BackboneFormat, stages: list[int]
                           ) -> dict[str, Any]:
    """config.json's fields for a torchvision ResNet ``name`` (DETR's and Deformable DETR's): timm's
    (``use_timm_backbone`` + ``backbone``) or transformers' own ResNet (``backbone_config``, returning ``stages``,
    1-4; no DC5)."""
    if backbone_format == "timm":
        return {"use_timm_backbone": True, "backbone": name, "backbone_config": None}
    if dilation:
        raise ExportError("transformers' own ResNet has no dilation (DC5): export with backbone_format='timm'")
    layer_type, depths = RESNET_BLOCKS[name]
    widths = [64, 128, 256, 512] if layer_type == "basic" else [256, 512, 1024, 2048]
    return {"use_timm_backbone": False, "backbone": None, "backbone_config": {
        "model_type": "resnet", "layer_type": layer_type, "depths": depths, "hidden_sizes": widths,
        "embedding_size": 64, "hidden_act": "relu", "downsample_in_first_stage": False,
        "downsample_in_bottleneck": False, "num_channels": 3, "out_features": [f"stage{i}" for i in stages]}}


def save_pretrained(model: DETR, directory: str | Path, *, backbone_format: BackboneFormat = "timm",
                    category_map: CategoryMap | None = None) -> Path:
    """Write ``model`` as transformers' ``DetrForObjectDetection.save_pretrained`` would.

    Files: config.json (architecture; ``id2label`` and ``category_ids`` from ``category_map`` or
    ``model.meta.category_map``: :func:`label_fields`),
    model.safetensors (float32 weights in transformers' on-disk names) and preprocessor_config.json
    (DetrImageProcessor with the model's eval resize, ``model.meta.eval_size`` or the authors' 800 / 1333, and ImageNet
    normalisation). ``backbone_format``: "timm" (transformers' default; DC5 possible; transformers needs
    timm to load it) or "transformers" (its own ResNet; no timm needed; no DC5).

    Raises:
        ExportError: for a model transformers' DETR cannot represent (see :func:`check_exportable`).
    """
    if backbone_format not in ("timm", "transformers"):
        raise ValueError(f"backbone_format must be 'timm' or 'transformers', got {backbone_format!r}")
    check_exportable(model)
    safetensors_torch = import_safetensors()
    config = huggingface_config(model, backbone_format, category_map)
    tensors = to_huggingface_state_dict(model.state_dict(), backbone_format)
    directory = Path(directory)
    min_size, max_size = model.meta.eval_size or AUTHORS_EVAL_SIZE
    processor = {
        "image_processor_type": "DetrImageProcessor", "format": "coco_detection",
        "do_resize": True, "size": {"shortest_edge": int(min_size), "longest_edge": int(max_size)},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "do_pad": True,
    }
    write_huggingface_directory(directory, config, safetensors_torch.save(tensors, metadata={"format": "pt"}),
                                processor)
    logger.info("wrote %s (%s backbone, %d classes)", directory, backbone_format, model.num_classes)
    return directory
