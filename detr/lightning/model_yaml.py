"""``model.detr`` as YAML files and command lines write it, and as jsonargparse parses it.

The training system's ``detr`` argument is a family's config class (jsonargparse's subclass form:
``{class_path: detr.models.dfine.config.DFINEConfig, init_args: {...}}``, or ``--model.detr DFINEConfig
--model.detr.decoder.max_num_bins 16``). Users write it in three more forms, which :func:`migrate_arguments` turns
into that one before parsing:

- a preset's name: ``model.detr: dfine_s`` (``--model.detr dfine_s``), its fields overridable key by key;
- the family form that :meth:`detr.models.config.ModelConfig.to_dict` writes (``family: dfine`` and the fields), which
  is also how a printed or saved config (``--print_config``, a run's config.yaml) shows it (:func:`family_form`);
- the old one-record form (``architecture: dfine`` and any of its 74 fields, DETR's without ``architecture``), as
  every YAML file before the families had their own configs wrote it, also across a chain of files that include one
  another (``config: parent.yaml`` and ``model.detr.<field>: value`` overrides).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import get_loader

from detr.models.config import ModelConfig
from detr.models.family import config_from_dict, families, preset_config, presets

logger = logging.getLogger(__name__)


def class_path_form(value: Any, where: str) -> dict[str, Any] | None:
    """jsonargparse's ``{class_path, init_args}`` of a ``model.detr`` value in any of the module's forms (None: the
    value is in that form already, or is not a model config at all). Invalid settings raise ValueError naming
    ``where``."""
    if isinstance(value, str) and value in presets():
        config = preset_config(value)
    elif isinstance(value, dict) and "class_path" not in value:
        config = config_from_dict(value, where=where)
    else:
        return None
    values = config.to_dict()
    values.pop("family")
    return {"class_path": f"{type(config).__module__}.{type(config).__qualname__}", "init_args": values}


def family_form(value: Any) -> Any:
    """``value`` (a parsed or dumped config, nested dicts) with every ``{class_path, init_args}`` of a model config
    written in the family form (``family`` and the fields), the form users read and write."""
    if isinstance(value, list):
        return [family_form(item) for item in value]
    if not isinstance(value, dict):
        return value
    config_class = _model_config_class(value.get("class_path"))
    if config_class is not None and set(value) <= {"class_path", "init_args"}:
        return {"family": config_class.family, **family_form(value.get("init_args") or {})}
    return {key: family_form(item) for key, item in value.items()}


def family_form_yaml(text: str) -> str:
    """:func:`family_form` of a YAML document (a dump of the parser), as YAML again, its leading comment lines (the
    header LightningCLI writes: how a run's own config.yaml is told from a user's) kept."""
    loaded = yaml.safe_load(text)
    converted = family_form(loaded)
    if converted == loaded:
        return text
    header = "".join(line for line in text.splitlines(keepends=True)[:5] if line.startswith("#"))
    return header + yaml.safe_dump(converted, sort_keys=False, allow_unicode=True)


#: The parser mode (jsonargparse's YAML loader) of the detr commands: :func:`load_yaml_without_model_detr`.
PARSER_MODE = "detr_yaml"


def load_yaml_without_model_detr(text: str) -> Any:
    """jsonargparse's YAML loader, leaving out a config file's ``model.detr`` (:func:`without_model_detr`)."""
    return without_model_detr(get_loader("yaml")(text))


def without_model_detr(value: Any) -> Any:
    """A loaded config file without its ``model.detr`` (nested or as dotted keys): :func:`migrate_arguments` gives
    it, from the whole chain of files, as one ``--model.detr`` after the ``--config``, in the form the parser
    reads."""
    if not isinstance(value, dict):
        return value
    value = {key: item for key, item in value.items() if key != "model.detr" and not str(key).startswith("model.detr.")}
    if isinstance(value.get("model"), dict) and "detr" in value["model"]:
        value["model"] = {key: item for key, item in value["model"].items() if key != "detr"}
    return value


def migrate_arguments(args: Sequence[str]) -> list[str]:
    """A command line with every ``model.detr`` in jsonargparse's form (the parser's loader leaves it out of the
    files: :func:`load_yaml_without_model_detr`):

    - after each ``--config FILE`` whose files (following their ``config:`` includes) set ``model.detr``: that
      value as ``--model.detr={class_path...}``, so that later ``--model.detr.<field>`` options still apply to it;
      a file that sets only some fields (no ``family``, ``architecture`` or preset) after an earlier model is an
      overlay, as a chain of configs was before the families had their own classes: its fields as
      ``--model.detr.<field>=VALUE`` options;
    - a ``--model.detr PRESET`` as that preset's class and fields;
    - before the first ``--model.detr.<field>`` that no model precedes: the model it changes, the ``--ckpt_path``
      checkpoint's when the command line resumes one, otherwise the default (the paper's DETR);
    - a field by an old one-record name that its family moved into a record (``--model.detr.vit_hidden_dim`` of
      RF-DETR) as today's (``--model.detr.vit.width``), with a note."""
    out: list[str] = []
    index = 0
    args = list(args)
    have_model = False
    config_class: type[ModelConfig] | None = None  # the model the field options that follow change
    while index < len(args):
        arg = args[index]
        name, equals, given = arg.partition("=")
        value = given if equals else (args[index + 1] if index + 1 < len(args) else None)
        step = 1 if equals else 2
        if name in ("--config", "-c") and value is not None:
            out += args[index:index + step]
            path = Path(value)
            if path.is_file():
                try:
                    detr = _chain_value(path, ("model", "detr"))
                except (yaml.YAMLError, OSError, UnicodeDecodeError):
                    detr = None  # the command's check of its config files names the file and the problem
                if have_model and _is_overlay(detr):
                    out += [f"--model.detr.{_today_name(key, config_class, f'{path}: model.detr')}="
                            f"{item if isinstance(item, str) else json.dumps(item)}" for key, item in _leaves(detr)]
                elif detr is not None:
                    form = class_path_form(detr, f"{path}: model.detr") or detr
                    out.append(f"--model.detr={json.dumps(form)}")
                    have_model, config_class = True, _config_class_of(form)
            index += step
            continue
        if name == "--model.detr.architecture":
            raise ValueError(f"{arg}: the family is the config's class now, not a field: give it as "
                             f"--model.detr RTDETRConfig (a family's config class) or a preset such as "
                             f"--model.detr rtdetr_r18vd (detr --help lists them), then its fields; a YAML file's "
                             f"old model.detr.architecture still reads as before")
        if name in ("--model.detr", "--model.detr.class_path"):
            have_model = True
            if value is not None and value in presets():
                form = class_path_form(value, name)
                out.append(f"--model.detr={json.dumps(form)}")
                config_class = _config_class_of(form)
                index += step
                continue
            config_class = _config_class_of(value)
        elif name.startswith("--model.detr.") and name.split(".")[2] not in ("help", "init_args"):
            if not have_model:
                form = _default_model(args)
                out.append(f"--model.detr={json.dumps(form)}")
                have_model, config_class = True, _config_class_of(form)
            field = _today_name(name[len("--model.detr."):], config_class, "command line")
            arg = f"--model.detr.{field}" + (f"={given}" if equals else "")
        out.append(arg)
        index += 1
    return out


def _config_class_of(value: Any) -> type[ModelConfig] | None:
    """The family config class a ``model.detr`` value names: jsonargparse's form (a dict or its JSON), a class
    path or a config class's name (``--model.detr RFDETRConfig``); None if it names none."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if isinstance(value, dict):
        value = value.get("class_path")
    if not isinstance(value, str):
        return None
    for family in families():
        config_class = family.config_class
        if value in (config_class.__name__, f"{config_class.__module__}.{config_class.__qualname__}"):
            return config_class
    return _model_config_class(value)


def _today_name(field: str, config_class: type[ModelConfig] | None, where: str) -> str:
    """A ``model.detr`` field as the family's config names it today: an old one-record name that the family moved
    into a record (RF-DETR's ``vit_hidden_dim`` → ``vit.width``, D-FINE's ``max_num_bins`` →
    ``decoder.max_num_bins``) is renamed, with a note; any other name is returned as it is."""
    top, dot, rest = field.partition(".")
    if config_class is None or dot or top in {f.name for f in dataclasses.fields(config_class)}:
        return field
    family = next((family for family in families() if family.config_class is config_class), None)
    renamed = family.flat_names.get(top) if family is not None else None
    if renamed is None:
        return field
    logger.warning("%s: model.detr.%s is now model.detr.%s (read as it; rename it there)", where, top, renamed)
    return renamed


def _is_overlay(detr: Any) -> bool:
    """A config file's ``model.detr`` that changes some fields of the model before it rather than naming one."""
    return isinstance(detr, dict) and not {"family", "architecture", "class_path"} & set(detr)


def _leaves(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested dict's leaves as (dotted key, value): ``{"decoder": {"max_num_bins": 16}}`` → decoder.max_num_bins."""
    leaves: list[tuple[str, Any]] = []
    for key, item in value.items():
        if isinstance(item, dict) and item:
            leaves += _leaves(item, f"{prefix}{key}.")
        else:
            leaves.append((f"{prefix}{key}", item))
    return leaves


def _default_model(args: Sequence[str]) -> dict[str, Any]:
    """The model that command-line ``--model.detr.<field>`` options change when nothing names one: the
    ``--ckpt_path`` checkpoint's (a resume), otherwise the paper's DETR with its defaults."""
    for index, arg in enumerate(args):
        name, equals, given = arg.partition("=")
        path = given if equals else (args[index + 1] if index + 1 < len(args) else "")
        if name == "--ckpt_path" and Path(path).is_file():
            try:
                hparams = torch.load(path, weights_only=True, map_location="cpu", mmap=True).get("hyper_parameters")
            except Exception:  # noqa: BLE001 - the command's own check names an unreadable checkpoint
                break
            detr = (hparams or {}).get("detr")
            if isinstance(detr, dict):
                return class_path_form(detr, f"{path}: its model config") or detr
            break
    return class_path_form({}, "the default model")  # type: ignore[return-value]  # a dict: never None


def _chain_value(path: Path, keys: tuple[str, ...], seen: frozenset[Path] = frozenset()) -> Any:
    """The value at ``keys`` of a YAML config file after its includes (``config: parent.yaml``, relative to the
    file) and its own keys, nested or dotted (``model.detr.backbone: x``), each over the last: None if unset."""
    path = path.resolve()
    if path in seen:
        return None
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        return None
    value: Any = None
    parents = data.get("config")
    for parent in [parents] if isinstance(parents, str) else parents or []:
        inherited = _chain_value(path.parent / parent, keys, seen | {path})
        value = _merge(value, inherited)
    for key, item in data.items():
        parts = tuple(str(key).split("."))
        if parts[:len(keys)] == keys:  # the value itself or a field of it
            for part in reversed(parts[len(keys):]):
                item = {part: item}
            value = _merge(value, item)
        elif keys[:len(parts)] == parts:  # a dict holding it
            for part in keys[len(parts):]:
                item = item.get(part) if isinstance(item, dict) else None
            if item is not None:
                value = _merge(value, item)
    return value


def _merge(base: Any, update: Any) -> Any:
    if update is None:
        return base
    if isinstance(base, dict) and isinstance(update, dict) and "class_path" not in update:
        merged = dict(base)
        for key, item in update.items():
            merged[key] = _merge(merged.get(key), item)
        return merged
    return update


def _model_config_class(class_path: Any) -> type[ModelConfig] | None:
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, ModelConfig) else None
