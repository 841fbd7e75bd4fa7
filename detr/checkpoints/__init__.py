"""Load released, plain and this project's own checkpoints safely (``torch.load(weights_only=True)``).

:func:`read_checkpoint` tries :data:`READERS` in order; the first that recognises the source reads it:
- a released model's name ("detr-r50": :mod:`detr.checkpoints.released`, downloaded on first use);
- a Hugging Face hub id ("PekingU/rtdetr_r50vd", :func:`detr.checkpoints.released.hub_directory`: downloaded with
  huggingface_hub, then read as the directory it is);
- a directory written by Hugging Face transformers (:mod:`detr.checkpoints.huggingface`; Deformable DETR's:
  :mod:`detr.checkpoints.huggingface_deformable`; RT-DETR's: :mod:`detr.checkpoints.rtdetr`; D-FINE's: :mod:`detr.checkpoints.dfine`;
  DEIMv2's: :mod:`detr.checkpoints.deimv2`; RF-DETR's: :mod:`detr.checkpoints.rfdetr`; (MM-)Grounding DINO's:
  :mod:`detr.checkpoints.grounding`);
- a file written by ``torch.save`` (:func:`detr.checkpoints.formats.read_torch_file`): the authors' release
  files (detr-r50-e632da11.pth …: ``{"model": state_dict, ...}``; the real-time DETRs' ``{"ema": {"module":
  state_dict}}``, whose configuration :data:`STATE_DICT_READERS` read off the weights; the rfdetr package's
  ``{"model": ..., "args": ...}``: :mod:`detr.checkpoints.rfdetr_package`), plain state dicts, and
  this project's Lightning checkpoints (``state_dict`` with keys ``"model." + official key`` and
  ``checkpoint["detr"]``: the model's config (:meth:`detr.models.config.ModelConfig.to_dict`) and the
  :class:`detr.models.config.ModelMeta`, written by the training system or :func:`save_checkpoint`).

:func:`load_checkpoint` then builds the model: a :class:`DETRPanoptic` for the authors' panoptic layout
(:mod:`detr.checkpoints.panoptic`), else the detector. The architecture is the file's own config, or is
inferred from the weights (what the weights cannot show, DC5, the number of heads and sometimes the class
head or query groups, comes from the file name, the defaults or an override).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from detr.atomic_files import write_atomically
from detr.categories import CategoryMap
from detr.checkpoints import deimv2, dfine, grounding, huggingface, huggingface_deformable, released, rfdetr, rtdetr
from detr.checkpoints.deimv2 import read_huggingface_deimv2, save_pretrained_deimv2
from detr.checkpoints.dfine import (
    is_dfine_state_dict,
    read_dfine_state_dict,
    read_huggingface_dfine,
    save_pretrained_dfine,
)
from detr.checkpoints.formats import (
    CheckpointContents,
    CheckpointError,
    ExportError,
    checkpoint_record,
    infer_model_config,
    load_strict,
    torch_contents,
    torch_load,
)
from detr.checkpoints.grounding import read_huggingface_grounding
from detr.checkpoints.huggingface import BackboneFormat, read_huggingface, read_json, save_pretrained
from detr.checkpoints.huggingface_deformable import (
    read_huggingface_deformable,
    save_pretrained_deformable,
)
from detr.checkpoints.panoptic import is_panoptic_state_dict, load_panoptic
from detr.checkpoints.rfdetr import read_huggingface_rfdetr, save_pretrained_rfdetr
from detr.checkpoints.rfdetr_package import is_rfdetr_package_file, read_rfdetr_package_file
from detr.checkpoints.rtdetr import (
    is_rtdetr_state_dict,
    read_huggingface_rtdetr,
    read_rtdetr_state_dict,
    save_pretrained_rtdetr,
)
from detr.models.build import build_detr
from detr.models.config import AUTHORS_EVAL_SIZE, ModelConfig
from detr.models.detr_family import DetrConfig
from detr.models.detector import Detector

__all__ = ["HUGGINGFACE_WRITERS", "READERS", "CheckpointContents", "CheckpointError", "ExportError", "infer_model_config",
           "load_checkpoint", "read_checkpoint", "save_checkpoint", "save_huggingface"]

logger = logging.getLogger(__name__)


def _released_name(source: str | Path) -> CheckpointContents | None:
    model = released.find(source)
    return None if model is None else released.read_released(model)


def _hub_id(source: str | Path) -> CheckpointContents | None:
    directory = released.hub_directory(source)
    return None if directory is None else _huggingface_directory(directory)


#: transformers' directories by config.json's ``model_type`` → the reader of that family's.
HUGGINGFACE_READERS: dict[str, Callable[[str | Path], CheckpointContents]] = {
    huggingface.MODEL_TYPE: read_huggingface,
    huggingface_deformable.MODEL_TYPE: read_huggingface_deformable,
    **dict.fromkeys(rtdetr.MODEL_TYPES, read_huggingface_rtdetr),
    dfine.MODEL_TYPE: read_huggingface_dfine,
    deimv2.MODEL_TYPE: read_huggingface_deimv2,
    **dict.fromkeys((rfdetr.MODEL_TYPE, rfdetr.LW_MODEL_TYPE), read_huggingface_rfdetr),
    **dict.fromkeys(grounding.MODEL_TYPES, read_huggingface_grounding),
}

#: transformers' detectors of the DETR kind that no reader here reads (their weights do not fit any family
#: here): model_type → the model's name, so that the error says what the folder holds.
OTHER_MODEL_TYPES: dict[str, str] = {
    "conditional_detr": "Conditional DETR", "dab-detr": "DAB-DETR", "table-transformer": "Table Transformer",
    "yolos": "YOLOS", "omdet-turbo": "OmDet-Turbo", "owlvit": "OWL-ViT", "owlv2": "OWLv2", "deta": "DETA",
}


def _huggingface_directory(source: str | Path) -> CheckpointContents | None:
    directory = Path(source)
    if not directory.is_dir():
        return None
    config_path = directory / "config.json"
    if not config_path.is_file():
        return read_huggingface(directory)  # names what the folder lacks
    model_type = read_json(config_path).get("model_type")
    reader = HUGGINGFACE_READERS.get(model_type)
    if reader is None:
        raise CheckpointError(f"{config_path} has model_type {model_type!r}"
                              f"{f' ({OTHER_MODEL_TYPES[model_type]})' if model_type in OTHER_MODEL_TYPES else ''}"
                              f", which this project does not implement; it reads transformers' directories of "
                              f"model_type {', '.join(map(repr, HUGGINGFACE_READERS))}")
    return reader(directory)


#: State-dict layouts of the families whose configuration the weights show (recognises the layout, reads the
#: state dict into contents with that configuration); other layouts are inferred by ``infer_model_config``.
STATE_DICT_READERS: tuple[tuple[Callable[[dict[str, torch.Tensor]], bool],
                                Callable[[dict[str, torch.Tensor], str], CheckpointContents]], ...] = (
    (is_rtdetr_state_dict, read_rtdetr_state_dict),
    (is_dfine_state_dict, read_dfine_state_dict),
)


def _torch_file(source: str | Path) -> CheckpointContents | None:
    path = Path(source)
    obj = torch_load(path)
    if is_rfdetr_package_file(obj):  # its configuration is in its args (and its name)
        return read_rfdetr_package_file(obj, path)
    contents = torch_contents(obj, path)
    if contents.config is not None:
        return contents
    reader = next((read for recognises, read in STATE_DICT_READERS if recognises(contents.state_dict)), None)
    return contents if reader is None else reader(contents.state_dict, str(source))


#: The readers :func:`read_checkpoint` tries, in order: each returns the contents, or None when the source is
#: not its format. The last reads any file, so every source is read or raises CheckpointError.
READERS: tuple[Callable[[str | Path], CheckpointContents | None], ...] = (
    _released_name, _hub_id, _huggingface_directory, _torch_file)


def read_checkpoint(source: str | Path) -> CheckpointContents:
    """Read a checkpoint (a file, an http(s) URL of one, a released model's name or a Hugging Face directory)
    into a state dict in the official layout, its config (if recorded) and its metadata."""
    if released.is_url(source):  # downloaded once into torch's hub cache, then read as a file
        source = released.download_url(str(source))
    for reader in READERS:
        contents = reader(source)
        if contents is not None:
            return contents
    raise CheckpointError(f"{source} is not a checkpoint any reader recognises")  # _torch_file reads everything


def load_checkpoint(path: str | Path, **overrides: Any) -> Detector:
    """Build the model a checkpoint describes, load its weights, return it in eval mode.

    Args:
        path: an authors' release file, a plain state dict, this project's Lightning checkpoint, a
            released model's name ("detr-r50"; see :mod:`detr.checkpoints.released`; downloaded on first use), an
            http(s) URL of a file (downloaded once into torch's hub cache: :func:`released.download_url`) or a
            Hugging Face transformers DETR directory (see :mod:`detr.checkpoints.huggingface`).
        overrides: :class:`detr.models.config.DetrConfig` fields that win over what is inferred (e.g. ``dilation=True``
            for a renamed DC5 file, ``num_heads``, ``class_head="sigmoid"``, ``query_groups``: what
            :func:`infer_model_config` cannot see).

    The returned model carries ``meta`` (:class:`detr.models.config.ModelMeta`): the checkpoint's own, with
    COCO's category map for a 91-class file without one; ``meta.eval_size`` is (min_size, max_size) of the validation resize it
    was trained with (this project's checkpoints), else None. Missing or unexpected keys raise
    :class:`CheckpointError` naming them. A panoptic file (the authors' layout: the detector under ``detr.``
    beside ``mask_head.*``) gives a :class:`DETRPanoptic` (see :func:`detr.checkpoints.panoptic.load_panoptic`).
    """
    path = released.download_url(path) if released.is_url(path) else Path(path)  # Path would fold a URL's //
    contents = read_checkpoint(path)
    if is_panoptic_state_dict(contents.state_dict):
        return load_panoptic(path, contents, **overrides)
    config = contents.config
    if config is None:
        config = infer_model_config(contents.state_dict, path.name, class_head=overrides.get("class_head"),
                                    query_groups=overrides.get("query_groups", 1),
                                    num_heads=overrides.get("num_heads", DetrConfig.num_heads))
        _check_inferred_layer_counts(path, config, overrides)
    config = config.replace(pretrained_backbone=False, **overrides)
    model = build_detr(config)
    load_strict(model, contents.state_dict,
                f"{path} does not fit the {config.family} model built from its config ({model.describe()})")
    meta = contents.meta
    if meta.category_map is None and model.num_classes == CategoryMap.coco().num_classes:
        meta = meta.replace(category_map=CategoryMap.coco())
    elif meta.category_map is None and contents.config is None and meta.eval_size is None:
        # Not COCO-sized and nothing recorded: the defaults may be far from how the model was trained.
        logger.warning(
            "%s is a plain state dict of a %d-class model without a category map or eval size: its labels are "
            "written as category ids 0..%d and images are resized to the authors' %d/%d px. If it was trained "
            "otherwise, pass its category map (Predictor(category_map=...)) and eval size (--min-size/--max-size)",
            path, model.num_classes, model.num_classes - 1, *AUTHORS_EVAL_SIZE,
        )
    model.meta = meta
    if model.prompted:
        model.tokenizer = contents.tokenizer
    logger.info("loaded %s (%s, %d classes)", path, config.backbone, model.num_classes)
    return model.eval()


def _check_inferred_layer_counts(path: Path, inferred: DetrConfig, overrides: dict[str, Any]) -> None:
    """A plain state dict records no config, so its layer counts are read off the weights, and a file cut
    after a whole layer reads as a shallower model that loads and predicts. Counts stated by the caller
    must agree with the weights; counts nobody stated are named when they are not the paper's 6/6."""
    counts = {"num_encoder_layers": ("encoder", inferred.num_encoder_layers),
              "num_decoder_layers": ("decoder", inferred.num_decoder_layers)}
    for field, (stack, found) in counts.items():
        if field in overrides and overrides[field] != found:
            raise CheckpointError(
                f"{path} has weights for {found} {stack} layer(s) (transformer.{stack}.layers.0..{found - 1}), "
                f"but {field}={overrides[field]} was given: the file lacks layers (cut, or saved from another "
                f"model); use the complete file, or drop {field} to load the {found} layer(s) it has")
    paper = (DetrConfig.num_encoder_layers, DetrConfig.num_decoder_layers)
    found_counts = (inferred.num_encoder_layers, inferred.num_decoder_layers)
    if found_counts != paper and not counts.keys() <= overrides.keys():
        logger.warning(
            "%s is a plain state dict: its weights show %d encoder and %d decoder layer(s), not the paper's %d/%d. "
            "If the model had more, the file is cut. State the counts to confirm them: "
            "load_checkpoint(path, num_encoder_layers=%d, num_decoder_layers=%d)",
            path, *found_counts, *paper, *found_counts)


#: a family's name (``config.family``) → the writer of its transformers format (a new family adds its line).
HUGGINGFACE_WRITERS: dict[str, Callable[..., Path]] = {
    "detr": save_pretrained,
    "deformable": save_pretrained_deformable,
    "rtdetr": save_pretrained_rtdetr,
    "dfine": save_pretrained_dfine,
    "deimv2": save_pretrained_deimv2,
    "rfdetr": save_pretrained_rfdetr,
}


def save_huggingface(model: Detector, directory: str | Path, *, backbone_format: BackboneFormat = "timm") -> Path:
    """Write ``model`` as transformers' ``save_pretrained`` would, in its family's format
    (:data:`HUGGINGFACE_WRITERS`: DETR's :func:`detr.checkpoints.huggingface.save_pretrained`, which names what
    it cannot write, Deformable DETR's :func:`detr.checkpoints.huggingface_deformable.save_pretrained_deformable`
    RT-DETR's :func:`detr.checkpoints.rtdetr.save_pretrained_rtdetr`, D-FINE's
    :func:`detr.checkpoints.dfine.save_pretrained_dfine` or RF-DETR's
    :func:`detr.checkpoints.rfdetr.save_pretrained_rfdetr`). A family without a writer (Grounding DINO: read
    from transformers' directories, not written back) raises :class:`CheckpointError` naming it."""
    family = model.config.family if model.config is not None else "detr"
    writer = HUGGINGFACE_WRITERS.get(family)
    if writer is None:
        raise CheckpointError(f"{model.describe()}: this project writes no transformers directory of the {family!r} "
                              f"family (it writes {', '.join(HUGGINGFACE_WRITERS)}); use the directory it was read "
                              "from, or save_checkpoint for this project's layout")
    return writer(model, directory, backbone_format=backbone_format)


def save_checkpoint(model: Detector, path: str | Path) -> Path:
    """Write ``model`` in this project's checkpoint layout (as the training system does, without the training
    state): its weights, its config and its ``meta``, so that :func:`load_checkpoint` rebuilds it as it was.
    The file is replaced atomically; returns its path."""
    if model.config is None:
        raise ValueError(f"cannot save {type(model).__name__} to {path}: it was built without build_detr, so it has "
                         "no config to record; build it with detr.build_detr(config)")
    checkpoint = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
                  "detr": checkpoint_record(model.config, model.meta)}
    return write_atomically(path, lambda file: torch.save(checkpoint, file))
