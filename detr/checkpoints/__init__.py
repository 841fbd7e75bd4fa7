"""Load released, plain and this project's own checkpoints safely (``torch.load(weights_only=True)``).

Three formats are read:
- the authors' release files (detr-r50-e632da11.pth …): ``{"model": state_dict, ...}``;
- plain state dicts in that key layout;
- this project's Lightning checkpoints: ``state_dict`` with keys ``"model." + official key`` and
  ``checkpoint["detr"] = {"model_config": …, "category_map": …}`` written by the training system.

The architecture is inferred from the weights (what the weights cannot show, DC5, the number of heads and
sometimes the class head or query groups, comes from the file name, the stored config or an override).
"""

from __future__ import annotations

import logging
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from detr.categories import CategoryMap
from detr.models.build import build_detr
from detr.models.config import ClassHead
from detr.models.detr import DETR

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, is unsafe, or does not fit the model."""


@dataclass
class CheckpointContents:
    """What a checkpoint file holds, in the official key layout."""

    state_dict: dict[str, torch.Tensor]
    model_config: dict[str, Any] | None  # build_detr kwargs, for this project's own checkpoints
    category_map: CategoryMap | None
    eval_size: tuple[int, int] | None = None  # (min_size, max_size) the model was validated at, if recorded
    is_thing: list[bool] | None = None  # panoptic checkpoints of this project: per label, thing or stuff
    # panoptic checkpoints of this project: the PostProcessPanoptic settings the run validated with
    # ({"threshold": ..., "overlap_threshold": ...})
    panoptic_postprocess: dict[str, Any] | None = None


def _torch_load(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    with path.open("rb") as file:
        head = file.read(64)
    # torch.save writes a zip archive (PK..) or, in its legacy format, a pickle (protocol byte 0x80)
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        pointer = " (a Git LFS pointer: run `git lfs pull`)" if head.startswith(b"version https://git-lfs") else ""
        raise CheckpointError(f"{path} is not a checkpoint torch can read: it starts with {head[:32]!r}{pointer}; pass "
                              "a .pth/.ckpt file written by torch.save")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"refused to load {path}: it holds Python objects other than tensors and plain containers, "
            f"which could run code when unpickled ({str(error).splitlines()[0]}). Only weight files are read. "
            f"If you trust the file, re-save its state dict: torch.save(torch.load(path, weights_only=False)"
            f"['model'], 'clean.pth')."
        ) from error
    except (RuntimeError, EOFError, OSError) as error:
        raise CheckpointError(f"could not read checkpoint {path}: {error} (truncated or not a torch file?)") from error
    except Exception as error:  # pickle fails on text and other files with KeyError, IndexError, ValueError ...
        raise CheckpointError(
            f"{path} is not a checkpoint torch can read ({type(error).__name__}: {error}); pass a .pth/.ckpt file "
            "written by torch.save (a truncated download or a text file such as a Git LFS pointer?)"
        ) from error


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def read_checkpoint(path: str | Path) -> CheckpointContents:
    """Read any supported checkpoint file into a state dict in the official layout (+ metadata).

    ``path`` may also be a released model's name ("detr-r50": :mod:`detr.checkpoints.released`, downloaded on first
    use) or a directory written by Hugging Face transformers (:mod:`detr.checkpoints.huggingface`).
    """
    from detr.checkpoints import released as pretrained  # both modules import this one

    released = pretrained.find(path)
    if released is not None:
        return pretrained.read_released(released)
    path = Path(path)
    if path.is_dir():
        from detr.checkpoints.huggingface import read_huggingface

        return read_huggingface(path)
    obj = _torch_load(path)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj.get("detr"), dict):
        meta = obj["detr"]
        prefix = "model."
        state_dict = {k[len(prefix):]: v for k, v in obj["state_dict"].items() if k.startswith(prefix)}
        category_map = CategoryMap.from_dict(meta["category_map"]) if meta.get("category_map") else None
        data = obj.get("datamodule_hyper_parameters") or {}  # Lightning stores the data module's arguments
        eval_size = ((int(data["eval_min_size"]), int(data["eval_max_size"]))
                     if isinstance(data, dict) and "eval_min_size" in data and "eval_max_size" in data else None)
        is_thing = [bool(flag) for flag in meta["is_thing"]] if meta.get("is_thing") else None
        postprocess = dict(meta["panoptic_postprocess"]) if isinstance(meta.get("panoptic_postprocess"), dict) else None
        return CheckpointContents(state_dict, dict(meta.get("model_config") or {}) or None, category_map, eval_size,
                                  is_thing, postprocess)
    if isinstance(obj, dict) and _is_state_dict(obj.get("model")):
        return CheckpointContents(dict(obj["model"]), None, None)
    if _is_state_dict(obj):
        return CheckpointContents(dict(obj), None, None)
    keys = list(obj)[:10] if isinstance(obj, dict) else type(obj).__name__
    raise CheckpointError(
        f"{path} is not a DETR checkpoint: expected an authors' release file (a dict with a 'model' state dict), "
        f"a plain state dict, or a Lightning checkpoint of this project; found {keys}"
    )


def _count_layers(state_dict: dict[str, torch.Tensor], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for key in state_dict if (m := pattern.match(key))}
    return max(found) + 1 if found else 0


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


def infer_model_config(state_dict: dict[str, torch.Tensor], file_name: str = "", *,
                       class_head: ClassHead | None = None, query_groups: int = 1) -> dict[str, Any]:
    """build_detr keyword arguments that reproduce the layout of ``state_dict``.

    Read from the weights: backbone, hidden and FFN sizes, layer counts, query_type ("anchor" has
    ``refpoint_embed``, "learned" ``query_embed``), num_queries, denoising (``denoising.label_embed``),
    dense_aux_head (``dense_head.*``) and num_classes.

    Not visible, so defaults that ``load_checkpoint(path, **overrides)`` can replace:
    - DC5 (a dilated layer4) changes no weight shape: it is taken from the file name (the released
      files contain "dc5"). The number of heads: the authors always use 8.
    - class_head: sigmoid has num_classes logits, softmax num_classes + 1, so the shape is ambiguous. It
      is resolved by the denoising or dense head's class count; otherwise softmax. Pass ``class_head="sigmoid"`` (here or to load_checkpoint) for a trained
      sigmoid model without those heads (a bare state dict: this project's checkpoints store the config):
      num_classes then follows from the class head.
    - query_groups: ``refpoint_embed`` holds num_queries × query_groups anchors, indistinguishable from
      one group of that many. Pass ``query_groups`` (num_queries is divided by it); with 1, a Group DETR
      model loads but decodes every group at inference.
    - The denoising noise settings and anchor_local_attention are training and initialisation choices,
      not weights: they do not matter for loading.
    """
    where = file_name or "the state dict"
    required = ("class_embed.weight", "backbone.0.body.conv1.weight")
    missing = [key for key in required if key not in state_dict]
    if "query_embed.weight" not in state_dict and "refpoint_embed.weight" not in state_dict:
        missing.insert(0, "query_embed.weight (or refpoint_embed.weight)")
    if missing:
        raise CheckpointError(f"{where} lacks DETR keys {missing}: not a DETR checkpoint in the authors' "
                              f"layout or this project's")
    body = "backbone.0.body."
    bottleneck = f"{body}layer1.0.conv3.weight" in state_dict
    blocks_layer3 = _count_layers(state_dict, f"{body}layer3.")
    depth = {(False, 2): "resnet18", (False, 6): "resnet34", (True, 6): "resnet50", (True, 23): "resnet101"}.get(
        (bottleneck, blocks_layer3))
    if depth is None:
        raise CheckpointError(f"{where}: cannot tell the ResNet depth (layer3 has "
                              f"{blocks_layer3} blocks, bottleneck={bottleneck})")
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
    encoder_layers = _count_layers(state_dict, "transformer.encoder.layers.")
    ffn_key = ("transformer.encoder.layers.0.linear1.weight" if encoder_layers
               else "transformer.decoder.layers.0.linear1.weight")
    class_head = class_head or _infer_class_head(state_dict, where)
    outputs = int(state_dict["class_embed.weight"].shape[0])
    return {
        "backbone": depth,
        "dilation": "dc5" in Path(file_name).name.lower(),
        "position_encoding": "learned" if "backbone.1.row_embed.weight" in state_dict else "sine",
        "hidden_dim": int(state_dict["class_embed.weight"].shape[1]),
        "num_heads": 8,
        "num_encoder_layers": encoder_layers,
        "num_decoder_layers": _count_layers(state_dict, "transformer.decoder.layers."),
        "dim_feedforward": int(state_dict[ffn_key].shape[0]),
        "pre_norm": "transformer.encoder.norm.weight" in state_dict,
        "num_queries": num_queries // query_groups,
        "num_classes": outputs if class_head == "sigmoid" else outputs - 1,
        "backbone_norm": norm,
        "backbone_last_stage": "layer4" if _count_layers(state_dict, f"{body}layer4.") else "layer3",
        "query_type": "anchor" if anchor else "learned",
        "class_head": class_head,
        "denoising": "denoising.label_embed.weight" in state_dict,
        "query_groups": query_groups,
        "dense_aux_head": any(key.startswith("dense_head.") for key in state_dict),
    }


def load_checkpoint(path: str | Path, **overrides: Any) -> DETR:
    """Build the model a checkpoint describes, load its weights, return it in eval mode.

    Args:
        path: an authors' release file, a plain state dict, this project's Lightning checkpoint, a
            released model's name ("detr-r50"; see :mod:`detr.checkpoints.released`; downloaded on first use) or a
            Hugging Face transformers DETR directory (see :mod:`detr.checkpoints.huggingface`).
        overrides: build_detr keyword arguments that win over what is inferred (e.g. ``dilation=True``
            for a renamed DC5 file, ``num_heads``, ``class_head="sigmoid"``, ``query_groups``: what
            :func:`infer_model_config` cannot see).

    The returned model carries ``category_map``: the checkpoint's own, or COCO's for a 91-class file
    without one; and ``eval_size``: (min_size, max_size) of the validation resize it was trained with
    (this project's checkpoints), else None. Missing or unexpected keys raise :class:`CheckpointError` naming them.
    A panoptic file (the authors' layout: the detector under ``detr.`` beside ``mask_head.*``) gives a
    :class:`detr.models.segmentation.DETRPanoptic` (see :func:`detr.checkpoints.panoptic.load_panoptic`).
    """
    path = Path(path)
    contents = read_checkpoint(path)
    if any(key.startswith("mask_head.") for key in contents.state_dict):  # the authors' panoptic layout
        from detr.checkpoints.panoptic import load_panoptic

        return load_panoptic(path, contents, **overrides)
    config = contents.model_config or infer_model_config(
        contents.state_dict, path.name, class_head=overrides.get("class_head"),
        query_groups=overrides.get("query_groups", 1))
    config = {**config, "pretrained_backbone": False, **overrides}
    model = build_detr(**config)
    try:
        missing, unexpected = model.load_state_dict(contents.state_dict, strict=False)
    except RuntimeError as error:  # shape mismatches, e.g. an override that contradicts the weights
        raise CheckpointError(f"{path} does not fit the model built from {config}: {error}") from error
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not fit the model built from {config}: missing keys {missing[:10]}"
            f"{' …' if len(missing) > 10 else ''} ({len(missing)}), unexpected keys {unexpected[:10]}"
            f"{' …' if len(unexpected) > 10 else ''} ({len(unexpected)})"
        )
    category_map = contents.category_map
    if category_map is None and model.num_classes == 91:
        category_map = CategoryMap.coco()
    elif category_map is None and contents.model_config is None and contents.eval_size is None:
        # Not COCO-sized and nothing recorded: the defaults may be far from how the model was trained.
        # (Imported here: detr.data pulls in albumentations and OpenCV, which `import detr` must not need.)
        from detr.data.transforms import EVAL_MAX_SIZE, EVAL_MIN_SIZE

        logger.warning(
            "%s is a plain state dict of a %d-class model without a category map or eval size: its labels are "
            "written as category ids 0..%d and images are resized to the authors' %d/%d px. If it was trained "
            "otherwise, pass its category map (Predictor(category_map=...)) and eval size (--min-size/--max-size)",
            path, model.num_classes, model.num_classes - 1, EVAL_MIN_SIZE, EVAL_MAX_SIZE,
        )
    model.category_map = category_map
    model.eval_size = contents.eval_size
    logger.info("loaded %s (%s, %d classes)", path, config["backbone"], model.num_classes)
    return model.eval()
