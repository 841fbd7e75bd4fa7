"""Old training settings read as today's: the flat ``model.*`` keys of DetrSystem before its recipe records
(``model.lr``, ``model.loss_giou``, ``model.channels_last``, ``model.evaluation_dir`` ...), now
``model.optimizer.lr``, ``model.loss.loss_giou``, ``model.runtime.channels_last``, ``model.evaluation.evaluation_dir``.

Users' files keep working: a checkpoint's hyperparameters (:func:`migrate_hyperparameters`), a YAML config
(:func:`migrate_config`, the loader of every config file the commands read: :func:`install_config_loader`) and the
command line (:func:`migrate_arguments`) are migrated where they are read, before LightningCLI parses them, each
old key with a one-line note naming its new key.
"""

from __future__ import annotations

import logging
from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

from detr.lightning.model_yaml import PARSER_MODE, without_model_detr

logger = logging.getLogger(__name__)

_LOSS = ("cost_class", "cost_bbox", "cost_giou", "loss_ce", "loss_bbox", "loss_giou", "eos_coef", "focal_alpha",
         "focal_gamma", "loss_fgl", "loss_ddf", "matchability", "loss_mask_ce", "loss_mask_dice", "mask_point_ratio",
         "loss_mask", "loss_dice")
_OPTIMIZER = ("lr", "lr_backbone", "lr_layer_decay", "lr_component_decay", "weight_decay", "lr_drop_epochs",
              "lr_drop_gamma", "warmup_steps", "lr_decay_fraction", "lr_flat_cosine_epochs", "lr_flat_cosine_gamma")
_RUNTIME = ("channels_last", "fold_batch_norm", "backbone_bf16")
_EVALUATION = ("evaluator_backend", "evaluation_dir", "error_analysis", "error_analysis_every_n_validations")
#: Each old flat key of the training system → the record (``model.<record>.<key>``) that holds it now.
MOVED: dict[str, str] = {**dict.fromkeys(_LOSS, "loss"), **dict.fromkeys(_OPTIMIZER, "optimizer"),
                         **dict.fromkeys(_RUNTIME, "runtime"), **dict.fromkeys(_EVALUATION, "evaluation")}
#: The old defaults of DetrSystem's flat arguments (the code at 9fa7164), for hyperparameters that lack some
#: (a checkpoint written before an argument existed trained with its default). Loss weights and costs were DETR's
#: whatever the family; ``matchability`` None meant the family's.
OLD_DEFAULTS: dict[str, Any] = {
    "cost_class": 1.0, "cost_bbox": 5.0, "cost_giou": 2.0, "loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0,
    "eos_coef": 0.1, "focal_alpha": 0.25, "focal_gamma": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5, "matchability": None,
    "loss_mask_ce": 5.0, "loss_mask_dice": 5.0, "mask_point_ratio": 16, "lr": 1e-4, "lr_backbone": 1e-5,
    "lr_layer_decay": 1.0, "lr_component_decay": 1.0, "weight_decay": 1e-4, "lr_drop_epochs": None,
    "lr_drop_gamma": 0.1, "warmup_steps": 0, "lr_decay_fraction": 0.0, "lr_flat_cosine_epochs": None,
    "lr_flat_cosine_gamma": 0.5, "channels_last": False, "fold_batch_norm": True, "backbone_bf16": False,
    "evaluator_backend": "auto", "evaluation_dir": None, "error_analysis": True,
    "error_analysis_every_n_validations": 0}
#: The panoptic system's mask loss weights had their own defaults (in the loss recipe now).
_OLD_PANOPTIC_DEFAULTS = {"loss_mask": 1.0, "loss_dice": 1.0}


def _new_value(key: str, value: Any) -> tuple[bool, Any]:
    """(keep, value): an old value in today's terms; a None that meant "the default" becomes what it meant."""
    if key == "lr_drop_epochs" and value is None:
        return True, [200]  # the old default: the authors' 300-epoch schedule
    if key == "lr_flat_cosine_epochs" and value is None:
        return True, []  # off
    if key == "matchability" and value is None:
        return False, None  # the family's: left unset
    return True, value


def _note(old: str, record: str, where: str, seen: set[str] | None) -> None:
    logger.warning("%s: model.%s is now model.%s.%s (read as it; rename it there)", where, old, record, old)
    if seen is not None:
        seen.add(old)


def migrate_model_settings(model: dict[str, Any], where: str = "config", seen: set[str] | None = None
                           ) -> dict[str, Any]:
    """The ``model`` group of a config (a dict of the training system's arguments) with every old flat key moved
    into its record's dict (an existing ``loss:``... dict of the same config wins over an old key), noted."""
    if not any(key in MOVED for key in model):
        return model
    migrated: dict[str, Any] = {}
    for key, value in model.items():
        record = MOVED.get(key)
        if record is None:
            if isinstance(value, dict) and isinstance(migrated.get(key), dict):
                migrated[key] = {**migrated[key], **value}  # today's record wins over an old key
            else:
                migrated[key] = value
            continue
        _note(key, record, where, seen)
        keep, value = _new_value(key, value)
        group = migrated.setdefault(record, {})
        if keep and isinstance(group, dict):
            group.setdefault(key, value)
    return migrated


def migrate_config(config: Any, where: str = "config", seen: set[str] | None = None) -> Any:
    """A loaded YAML config (or a subcommand's part of one) with its old keys moved: the ``model:`` group's
    (:func:`migrate_model_settings`) and dotted top-level ``model.lr: ...`` keys (→ ``model.optimizer.lr``).
    ``seen`` collects the old keys found."""
    if not isinstance(config, dict):
        return config
    migrated: dict[str, Any] = {}
    for key, value in config.items():
        if key == "model" and isinstance(value, dict):
            migrated[key] = migrate_model_settings(value, where, seen)
        elif isinstance(key, str) and key.startswith("model.") and key[len("model."):] in MOVED:
            old = key[len("model."):]
            _note(old, MOVED[old], where, seen)
            keep, value = _new_value(old, value)
            if keep:
                migrated[f"model.{MOVED[old]}.{old}"] = value
        elif isinstance(key, str) and key in ("fit", "validate", "test", "predict") and isinstance(value, dict):
            migrated[key] = migrate_config(value, where, seen)
        else:
            migrated[key] = value
    return migrated


def migrate_arguments(argv: list[str], seen: set[str] | None = None) -> list[str]:
    """Command-line arguments with old ``--model.<key>`` options renamed (``--model.lr 1e-4`` →
    ``--model.optimizer.lr 1e-4``; ``--model.lr=1e-4`` likewise), each noted; ``seen`` collects the old keys."""
    migrated = []
    for arg in argv:
        if not arg.startswith("--model."):
            migrated.append(arg)
            continue
        name, equals, value = arg[2:].partition("=")
        old = name[len("model."):]
        if old not in MOVED:
            migrated.append(arg)
            continue
        _note(old, MOVED[old], "command line", seen)
        if old == "lr_flat_cosine_epochs" and equals and value.lower() in ("null", "none"):
            value = "[]"
        migrated.append(f"--model.{MOVED[old]}.{old}" + (f"={value}" if equals else ""))
    for i, arg in enumerate(migrated[:-1]):  # --model.optimizer.lr_flat_cosine_epochs null: off
        if arg == "--model.optimizer.lr_flat_cosine_epochs" and migrated[i + 1].lower() in ("null", "none"):
            migrated[i + 1] = "[]"
    return migrated


def migrate_hyperparameters(hparams: dict[str, Any], where: str = "checkpoint") -> dict[str, Any]:
    """A checkpoint's ``hyper_parameters`` in today's form: flat loss, optimizer, runtime and evaluation keys
    (written before the recipe records) grouped into their records, with the old defaults for the keys an older
    version did not write yet. Today's hyperparameters are returned as they are."""
    if not any(key in MOVED for key in hparams):
        return hparams
    logger.info("%s: its training settings are the flat model.* keys of an earlier version; read as "
                "model.loss.*, model.optimizer.*, model.runtime.* and model.evaluation.*", where)
    filled = {**OLD_DEFAULTS, **(_OLD_PANOPTIC_DEFAULTS if "masks" in hparams else {}), **hparams}
    migrated: dict[str, Any] = {}
    for key, value in filled.items():
        record = MOVED.get(key)
        if record is None:
            migrated[key] = value
            continue
        keep, value = _new_value(key, value)
        if keep:
            migrated.setdefault(record, {})[key] = value
    return migrated


def fill_old_defaults(config: Any) -> list[str]:
    """In a parsed config (a subcommand's namespace) of a run configured with an earlier version's keys, give
    every loss and optimizer setting it leaves unset that version's default (DETR's, whatever the family), so
    the run trains as it did; returns the keys filled. (A config in today's keys takes the family's recipe.)"""
    filled = []
    for key, record in MOVED.items():
        name = f"model.{record}.{key}"
        if key in OLD_DEFAULTS and record in ("loss", "optimizer") and config.get(name, "") is None:
            keep, value = _new_value(key, OLD_DEFAULTS[key])
            if keep:
                config[name] = value
                filled.append(name)
    return filled


def install_config_loader(seen: set[str] | None = None) -> str:
    """Make jsonargparse migrate every config it loads (:func:`migrate_config`; ``seen`` collects the old keys
    found) and leave its ``model.detr`` to the command line (:func:`detr.lightning.model_yaml.without_model_detr`);
    returns the parser mode to give LightningCLI's parsers (``parser_kwargs={"parser_mode": ...}``)."""

    def load(text: str, path: Any = None) -> Any:
        return without_model_detr(migrate_config(get_loader("yaml")(text), where=str(path) if path else "config",
                                                 seen=seen))

    set_loader(PARSER_MODE, load, exceptions=(yaml.YAMLError,))
    return PARSER_MODE


__all__ = ["MOVED", "OLD_DEFAULTS", "fill_old_defaults", "install_config_loader", "migrate_arguments",
           "migrate_config", "migrate_hyperparameters", "migrate_model_settings"]
