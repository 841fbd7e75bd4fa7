"""What every checkpoint reader shares: the contents record, the error, the safe ``torch.load``, state-dict
detection, the architecture read from the weights (:func:`infer_model_config`) and the strict-load message.

The readers (:mod:`detr.checkpoints.released`, :mod:`~detr.checkpoints.huggingface`,
:mod:`~detr.checkpoints.panoptic`) and the dispatcher (:mod:`detr.checkpoints`) import this module; it
imports none of them.
"""

from __future__ import annotations

import argparse
import pickle
import re
import types
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from detr.models.config import ClassHead, ModelConfig, ModelMeta
from detr.models.deformable.config import DeformableConfig
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, is unsafe, or does not fit the model."""


class CheckpointCodeError(CheckpointError):
    """A checkpoint that carries code (a pickle that calls ``os.system``, ``builtins.exec`` ...): refused unread."""


class ExportError(ValueError):
    """A model that cannot be written in a format (ONNX, ``.pt2``, transformers' DETR), or an exported file
    that does not reproduce the model."""


@dataclass(frozen=True)
class CheckpointContents:
    """What a checkpoint file holds: the weights in the official key layout, the config that built them
    (None where the file does not record it: it is then read from the weights), the run metadata and, for a
    prompted model (:attr:`detr.models.detector.Detector.prompted`), the prompt's tokenizer (transformers', read
    from the directory's tokenizer files; None where it has none)."""

    state_dict: dict[str, torch.Tensor]
    config: ModelConfig | None = None
    meta: ModelMeta = ModelMeta()
    tokenizer: Any = None


#: Plain attribute bags that training scripts pickle beside the weights (the rfdetr package's and the authors' DETR
#: ``args``), allowed to ``torch.load(weights_only=True)``: unpickling one sets attributes and runs no code.
SAFE_GLOBALS = (argparse.Namespace, types.SimpleNamespace)


def torch_load(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, with errors that say what the file is instead."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    with path.open("rb") as file:
        head = file.read(64)
    # torch.save writes a zip archive (PK..) or, in its legacy format, a pickle (protocol byte 0x80)
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        pointer = " (a Git LFS pointer: run `git lfs pull`)" if head.startswith(b"version https://git-lfs") else ""
        raise CheckpointError(f"{path} is not a checkpoint torch can read: it starts with {head[:32]!r}{pointer}; pass "
                              "a .pth/.ckpt file written by torch.save")
    if head.startswith(b"PK\x03\x04") and _is_exported_program(path):
        raise CheckpointError(
            f"{path} is a torch.export program (a .pt2 file, as detr-export --format pt2 writes it): a traced graph "
            "for deployment, not weights to build a model from. Predict with the checkpoint it was exported from, "
            "or export that one with --format onnx (detr-predict and detr-serve run .onnx files); in Python, "
            f"detr.checkpoints.export.load_program('{path}') runs it")
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise unpickling_refusal(path, error) from None
    except (RuntimeError, EOFError, OSError) as error:
        raise CheckpointError(f"could not read checkpoint {path}: {error} (truncated or not a torch file?)") from error
    except Exception as error:  # pickle fails on text and other files with KeyError, IndexError, ValueError ...
        raise CheckpointError(
            f"{path} is not a checkpoint torch can read ({type(error).__name__}: {error}); pass a .pth/.ckpt file "
            "written by torch.save (a truncated download or a text file such as a Git LFS pointer?)"
        ) from error


#: Modules whose functions run commands, files or code: a pickle that calls one carries an attack, not weights.
CODE_MODULES = frozenset({"os", "posix", "nt", "sys", "subprocess", "builtins", "__builtin__", "shutil", "socket",
                          "runpy", "importlib", "pty", "code", "ctypes", "pickle", "marshal", "webbrowser"})


def unpickling_refusal(path: str | Path, error: pickle.UnpicklingError) -> CheckpointError:
    """The one-line error for a file ``torch.load(weights_only=True)`` refused (``error``): a pickle that
    names a function of :data:`CODE_MODULES` (``posix.system``, ``builtins.exec`` ...) carries code and is
    refused as such, with no advice to load it anyway; another Python object (a training script's class) is
    named, with how to keep the weights of a file one trusts. torch's own text (retry with
    ``weights_only=False``) is not quoted: for a file that carries code that is the attack."""
    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    name = found.group(1) if found else None
    if name is None or name.split(".")[0] in CODE_MODULES:
        what = f"a call of {name}" if name else "pickle instructions that torch's safe loader refuses"
        return CheckpointCodeError(
            f"refused to load {path}: it carries code ({what}) that loading it would run, besides or instead of "
            "weights; nothing was run. A checkpoint holds tensors only: get the model's weights from a source you "
            "trust")
    return CheckpointError(
        f"refused to load {path}: besides tensors it holds a Python object ({name}) that loading would have to "
        "construct by running code, which only weight files are spared; nothing was run. If you trust the file, "
        "re-save its state dict in Python: torch.save(torch.load(path, weights_only=False)['model'], 'clean.pth')")


def _is_exported_program(path: Path) -> bool:
    """Whether ``path`` is a torch.export archive (``torch.export.save``: ``<name>/archive_format`` and
    ``<name>/models/*.json``, no ``data.pkl``), which ``torch.load`` calls "probably corrupted"."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return (any(name.endswith("/archive_format") for name in names)
            and any("/models/" in name for name in names) and not any(name.endswith("/data.pkl") for name in names))


def is_state_dict(obj: Any) -> bool:
    """A non-empty dict of tensors."""
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def key_mismatch(missing: Sequence[str], unexpected: Sequence[str], shown: int = 10) -> str:
    """"missing keys [...] (n), unexpected keys [...] (m)": the message of a strict load that failed, the
    first ``shown`` keys of each kind named."""
    def some(keys: Sequence[str]) -> str:
        return f"{list(keys[:shown])}{' …' if len(keys) > shown else ''} ({len(keys)})"

    return f"missing keys {some(missing)}, unexpected keys {some(unexpected)}"


def shape_mismatch(model_shapes: dict[str, torch.Size], state_dict: dict[str, torch.Tensor], shown: int = 3
                   ) -> str | None:
    """"n tensors have other shapes than the model's: key [file] vs [model]; ..." (the first ``shown``), or None
    when every tensor both hold has the model's shape: one line where torch lists every mismatch on its own."""
    differing = [(key, list(tensor.shape), list(model_shapes[key])) for key, tensor in state_dict.items()
                 if key in model_shapes and tensor.shape != model_shapes[key]]
    if not differing:
        return None
    some = "; ".join(f"{key} {theirs} in the file vs {ours}" for key, theirs, ours in differing[:shown])
    more = " …" if len(differing) > shown else ""
    return f"{len(differing)} tensor(s) have other shapes than the model's: {some}{more}"


def load_strict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], where: str) -> None:
    """Load every tensor of ``state_dict`` into ``model``; a missing, unexpected or misshapen key raises
    :class:`CheckpointError` starting with ``where`` ("x.pth does not fit the model built from ..."), in one
    line whatever the number of tensors."""
    shapes = shape_mismatch({key: value.shape for key, value in model.state_dict().items()}, state_dict)
    if shapes is not None:
        raise CheckpointError(f"{where}: {shapes}")
    try:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
    except RuntimeError as error:  # shape mismatches, e.g. an override that contradicts the weights
        raise CheckpointError(f"{where}: {error}") from error
    if missing or unexpected:
        raise CheckpointError(f"{where}: {key_mismatch(missing, unexpected)}")


def _count_layers(state_dict: dict[str, torch.Tensor], prefix: str, where: str) -> int:
    """How many modules ``prefix``0., 1., ... the state dict holds. Numbers with a gap (0, 1, 3) are refused:
    modules are numbered from 0 without gaps, so a gap means the file was cut, not another architecture."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for key in state_dict if (m := pattern.match(key))}
    if found and found != set(range(max(found) + 1)):
        raise CheckpointError(f"{where} has {prefix} numbered {sorted(found)}: layers are numbered from 0 without "
                              f"gaps, so the file lacks some (cut or edited); use the file as it was saved")
    return max(found) + 1 if found else 0


#: A size that config.json states and the weights show: (config.json's key, the value the reader made of it,
#: where the weights show it: a tensor and its dimension, or with None a prefix whose numbered modules are counted).
StatedSize = tuple[str, Callable[[Any], int], str, int | None]


def check_stated_sizes(stated: ModelConfig, state_dict: dict[str, torch.Tensor], sizes: Sequence[StatedSize],
                       config_path: Path, where: str) -> None:
    """Raise :class:`CheckpointError` naming each size of config.json (``sizes``: the reader's table) that the
    weights contradict, with the tensor that shows it: a config.json of another model beside the weights printed
    a hundred size mismatches and named neither. A tensor the weights lack is not checked here."""
    differing = []
    for key, value_of, weight, dim in sizes:
        expected = value_of(stated)
        if dim is None:
            found, shown = _count_layers(state_dict, weight, where), f"{weight}N"
        elif weight in state_dict and state_dict[weight].dim() > dim:
            found, shown = int(state_dict[weight].shape[dim]), f"{weight} {list(state_dict[weight].shape)}"
        else:
            continue
        if found != expected:
            differing.append(f"{key} gives {expected}, the weights {found} ({shown})")
    if differing:
        raise CheckpointError(f"{config_path} does not fit the weights in {where}: {'; '.join(differing)}. The "
                              "config.json belongs to another model: use the one that came with the weights, or "
                              "write the directory again (save_pretrained, detr-convert)")


def _num_real_classes(state_dict: dict[str, torch.Tensor], where: str) -> int | None:
    """Real classes as shown by a head that has no "no object" entry (denoising labels, dense head), else None."""
    found = {}
    if "denoising.label_embed.weight" in state_dict:  # num_classes + 1 rows: the last is "unknown"
        found["denoising.label_embed.weight"] = int(state_dict["denoising.label_embed.weight"].shape[0]) - 1
    if "dense_head.class_embed.weight" in state_dict:  # always sigmoid: num_classes rows
        found["dense_head.class_embed.weight"] = int(state_dict["dense_head.class_embed.weight"].shape[0])
    if len(set(found.values())) > 1:
        raise CheckpointError(f"{where}: the heads disagree on the number of classes: {found}")
    return next(iter(found.values()), None)


def _infer_class_head(state_dict: dict[str, torch.Tensor], where: str) -> ClassHead:
    """softmax (num_classes + 1 logits) or sigmoid (num_classes): the class head's shape alone cannot tell.

    Decided by the real class count of the denoising or dense head when there is one; otherwise softmax,
    the authors' head. (This project's checkpoints store their config: nothing is guessed for them.)
    """
    outputs = int(state_dict["class_embed.weight"].shape[0])
    real = _num_real_classes(state_dict, where)
    if real is not None:
        if outputs not in (real, real + 1):
            raise CheckpointError(f"{where}: class_embed has {outputs} outputs for {real} classes; expected "
                                  f"{real} (sigmoid) or {real + 1} (softmax)")
        return "sigmoid" if outputs == real else "softmax"
    return "softmax"


#: The :class:`DetrConfig` fields :func:`infer_model_config` decides (from the weights, the file name or, for
#: num_heads, the authors' convention); the others keep their defaults.
INFERRED_FIELDS: tuple[str, ...] = (
    "backbone", "dilation", "position_encoding", "hidden_dim", "num_heads", "num_encoder_layers",
    "num_decoder_layers", "dim_feedforward", "pre_norm", "num_queries", "num_classes", "backbone_norm",
    "backbone_last_stage", "query_type", "class_head", "denoising", "query_groups", "dense_aux_head")


def infer_model_config(state_dict: dict[str, torch.Tensor], file_name: str = "", *,
                       class_head: ClassHead | None = None, query_groups: int = 1, num_heads: int = 8) -> DetrConfig:
    """The :class:`DetrConfig` whose model has the layout of ``state_dict`` (``pretrained_backbone=False``:
    every backbone weight is in the file).

    Read from the weights: backbone, hidden and FFN sizes, layer counts, query_type ("anchor" has
    ``refpoint_embed``, "learned" ``query_embed``), num_queries, denoising (``denoising.label_embed``),
    dense_aux_head (``dense_head.*``) and num_classes.

    Not visible, so defaults that ``load_checkpoint(path, **overrides)`` can replace:
    - DC5 (a dilated layer4) changes no weight shape: it is taken from the file name (the released
      files contain "dc5"). The number of heads: the authors always use 8 (DetrConfig's default).
    - class_head: sigmoid has num_classes logits, softmax num_classes + 1, so the shape is ambiguous. It
      is resolved by the denoising or dense head's class count; otherwise softmax. Pass ``class_head="sigmoid"`` (here or to load_checkpoint) for a trained
      sigmoid model without those heads (a bare state dict: this project's checkpoints store the config):
      num_classes then follows from the class head.
    - query_groups: ``refpoint_embed`` holds num_queries × query_groups anchors, indistinguishable from
      one group of that many. Pass ``query_groups`` (num_queries is divided by it); with 1, a Group DETR
      model loads but decodes every group at inference.
    - The denoising noise settings and anchor_local_attention are training and initialisation choices,
      not weights: they keep DetrConfig's defaults.

    A Deformable DETR state dict (``transformer.level_embed``) is read by :func:`infer_deformable_config`;
    ``num_heads`` is needed there (the sampling layers hold heads × points).
    """
    where = file_name or "the state dict"
    if is_deformable_state_dict(state_dict):
        return infer_deformable_config(state_dict, file_name, num_heads=num_heads)
    required = ("class_embed.weight", "backbone.0.body.conv1.weight")
    missing = [key for key in required if key not in state_dict]
    if "query_embed.weight" not in state_dict and "refpoint_embed.weight" not in state_dict:
        missing.insert(0, "query_embed.weight (or refpoint_embed.weight)")
    if missing:
        raise CheckpointError(f"{where} lacks DETR keys {missing}: not a DETR checkpoint in the authors' "
                              f"layout or this project's")
    body = "backbone.0.body."
    bottleneck = f"{body}layer1.0.conv3.weight" in state_dict
    blocks = {stage: _count_layers(state_dict, f"{body}{stage}.", where) for stage in ("layer2", "layer3", "layer4")}
    last_stage = "layer4" if blocks["layer4"] else "layer3" if blocks["layer3"] else "layer2"
    if blocks["layer3"]:
        depth = {(False, 2): "resnet18", (False, 6): "resnet34", (True, 6): "resnet50", (True, 23): "resnet101"}.get(
            (bottleneck, blocks["layer3"]))
    else:  # cut after layer2 (the CPU demo): its blocks tell 18 from 34; ResNet-50 and -101 are one network there
        depth = {(False, 2): "resnet18", (False, 4): "resnet34", (True, 4): "resnet50"}.get(
            (bottleneck, blocks["layer2"]))
    if depth is None:
        raise CheckpointError(f"{where}: cannot tell the ResNet depth (blocks per stage {blocks}, "
                              f"bottleneck={bottleneck})")
    if f"{body}bn1.running_mean" not in state_dict:
        norm = "group_norm"
    elif f"{body}bn1.num_batches_tracked" in state_dict:
        norm = "batch_norm"
    else:
        norm = "frozen_batch_norm"
    anchor = "refpoint_embed.weight" in state_dict
    num_queries = int(state_dict["refpoint_embed.weight" if anchor else "query_embed.weight"].shape[0])
    if query_groups < 1 or num_queries % query_groups:
        raise CheckpointError(f"{where}: {num_queries} queries do not split into query_groups={query_groups}")
    encoder_layers = _count_layers(state_dict, "transformer.encoder.layers.", where)
    ffn_key = ("transformer.encoder.layers.0.linear1.weight" if encoder_layers
               else "transformer.decoder.layers.0.linear1.weight")
    class_head = class_head or _infer_class_head(state_dict, where)
    outputs = int(state_dict["class_embed.weight"].shape[0])
    return DetrConfig(
        backbone=depth,
        dilation="dc5" in Path(file_name).name.lower(),
        position_encoding="learned" if "backbone.1.row_embed.weight" in state_dict else "sine",
        hidden_dim=int(state_dict["class_embed.weight"].shape[1]),
        num_encoder_layers=encoder_layers,
        num_decoder_layers=_count_layers(state_dict, "transformer.decoder.layers.", where),
        dim_feedforward=int(state_dict[ffn_key].shape[0]),
        pre_norm="transformer.encoder.norm.weight" in state_dict,
        num_queries=num_queries // query_groups,
        num_classes=outputs if class_head == "sigmoid" else outputs - 1,
        backbone_norm=norm,
        backbone_last_stage=last_stage,
        query_type="anchor" if anchor else "learned",
        class_head=class_head,
        denoising="denoising.label_embed.weight" in state_dict,
        query_groups=query_groups,
        dense_aux_head=any(key.startswith("dense_head.") for key in state_dict),
        pretrained_backbone=False,
    )


def is_deformable_state_dict(state_dict: dict[str, torch.Tensor]) -> bool:
    """Deformable DETR's layout (the authors' fundamentalvision/Deformable-DETR and this project's)."""
    return "transformer.level_embed" in state_dict


def without_decoder_head_copies(state_dict: dict[str, torch.Tensor], where: str = "the state dict"
                                ) -> dict[str, torch.Tensor]:
    """The authors' Deformable DETR registers its refinement (and two-stage) heads twice, as ``bbox_embed.i``
    and ``transformer.decoder.bbox_embed.i`` (``class_embed`` too): drop the second copies, which must equal
    the first (this project passes the heads to the decoder instead of registering them there)."""
    prefix = "transformer.decoder."
    kept = {}
    for key, value in state_dict.items():
        if key.startswith((prefix + "bbox_embed.", prefix + "class_embed.")):
            head = key[len(prefix):]
            if head not in state_dict or not torch.equal(state_dict[head], value):
                raise CheckpointError(f"{where}: {key} differs from {head} (or {head} is missing); in Deformable "
                                      f"DETR both names hold the same head")
            continue
        kept[key] = value
    return kept


def infer_deformable_config(state_dict: dict[str, torch.Tensor], file_name: str = "", *, num_heads: int = 8
                            ) -> DeformableConfig:
    """The Deformable DETR :class:`DeformableConfig` of a state dict in the authors' layout.

    Read from the weights: backbone, hidden and FFN sizes, layer counts, levels, points per head and level
    (given ``num_heads``: the authors' 8), num_queries (two-stage: 300, the authors' proposals), num_classes,
    box_refine (separate heads per layer) and two_stage (``transformer.enc_output``). DC5 from the file name.
    """
    where = file_name or "the state dict"
    body = "backbone.0.body."
    missing = [key for key in ("class_embed.0.weight", "bbox_embed.0.layers.0.weight", f"{body}conv1.weight")
               if key not in state_dict]
    if missing:
        raise CheckpointError(f"{where} lacks Deformable DETR keys {missing}")
    bottleneck = f"{body}layer1.0.conv3.weight" in state_dict
    blocks_layer3 = _count_layers(state_dict, f"{body}layer3.", where)
    depth = {(False, 2): "resnet18", (False, 6): "resnet34", (True, 6): "resnet50", (True, 23): "resnet101"}.get(
        (bottleneck, blocks_layer3))
    if depth is None:
        raise CheckpointError(f"{where}: cannot tell the ResNet depth (layer3 has {blocks_layer3} blocks)")
    levels, hidden = (int(n) for n in state_dict["transformer.level_embed"].shape)
    weights_out = int(state_dict["transformer.encoder.layers.0.self_attn.attention_weights.weight"].shape[0])
    if weights_out % (levels * num_heads):
        raise CheckpointError(f"{where}: the attention weights ({weights_out} outputs) do not split into {levels} "
                              f"levels x num_heads={num_heads}; pass the model's num_heads")
    two_stage = "transformer.enc_output.weight" in state_dict
    box_refine = not torch.equal(state_dict["bbox_embed.0.layers.0.weight"],
                                 state_dict["bbox_embed.1.layers.0.weight"]) if "bbox_embed.1.layers.0.weight" in \
        state_dict else False
    return DeformableConfig(
        class_head="sigmoid", backbone=depth,
        dilation="dc5" in Path(file_name).name.lower(), hidden_dim=hidden, num_heads=num_heads,
        num_encoder_layers=_count_layers(state_dict, "transformer.encoder.layers.", where),
        num_decoder_layers=_count_layers(state_dict, "transformer.decoder.layers.", where),
        dim_feedforward=int(state_dict["transformer.encoder.layers.0.linear1.weight"].shape[0]),
        num_queries=300 if two_stage else int(state_dict["query_embed.weight"].shape[0]),
        num_classes=int(state_dict["class_embed.0.weight"].shape[0]),
        num_feature_levels=levels, num_points=weights_out // (levels * num_heads),
        box_refine=box_refine or two_stage, two_stage=two_stage, pretrained_backbone=False)


def checkpoint_record(config: ModelConfig, meta: ModelMeta) -> dict[str, Any]:
    """``checkpoint["detr"]`` of this project's checkpoints: the model config and the run metadata, in plain
    types (:func:`read_torch_file` reads it back)."""
    return {"model_config": config.to_dict(), **meta.to_dict()}


def read_torch_file(path: Path) -> CheckpointContents:
    """A file written by ``torch.save``: this project's Lightning checkpoint (``state_dict`` with keys
    ``"model." + official key`` and ``checkpoint["detr"]``: :func:`checkpoint_record`), an authors' release
    file (``{"model": state_dict, ...}``, or ``{"ema": {"module": state_dict}, ...}``, preferred where both are
    there) or a plain state dict."""
    return torch_contents(torch_load(path), path)


def torch_contents(obj: Any, path: Path) -> CheckpointContents:
    """:func:`read_torch_file` of an object ``torch_load`` read from ``path``."""
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj.get("detr"), dict):
        record = obj["detr"]
        prefix = "model."
        state_dict = {k[len(prefix):]: v for k, v in obj["state_dict"].items() if k.startswith(prefix)}
        try:
            config = (config_from_dict(record["model_config"], where="checkpoint['detr']['model_config']")
                      if record.get("model_config") else None)
            meta = ModelMeta.from_dict(record)
        except (ValueError, TypeError, KeyError) as error:
            raise CheckpointError(f"{path}: its record checkpoint['detr'] does not describe a model: {error}"
                                  ) from error
        data = obj.get("datamodule_hyper_parameters") or {}  # Lightning stores the data module's arguments
        if meta.eval_size is None and isinstance(data, dict) and "eval_min_size" in data and "eval_max_size" in data:
            meta = meta.replace(eval_size=(int(data["eval_min_size"]), int(data["eval_max_size"])))
        return CheckpointContents(state_dict, config, meta)
    if isinstance(obj, dict) and isinstance(obj.get("ema"), dict) and is_state_dict(obj["ema"].get("module")):
        obj = obj["ema"]["module"]  # the real-time DETRs' training files: the averaged weights are the released ones
    elif isinstance(obj, dict) and is_state_dict(obj.get("model")):
        obj = obj["model"]
    if is_state_dict(obj):
        state_dict = dict(obj)
        if is_deformable_state_dict(state_dict):
            state_dict = without_decoder_head_copies(state_dict, str(path))
        return CheckpointContents(state_dict)
    keys = list(obj)[:10] if isinstance(obj, dict) else type(obj).__name__
    raise CheckpointError(
        f"{path} is not a DETR checkpoint: expected an authors' release file (a dict with a 'model' state dict), "
        f"a plain state dict, or a Lightning checkpoint of this project; found {keys}"
    )
