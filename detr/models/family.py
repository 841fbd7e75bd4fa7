"""What a model family is, as one record, and the one list of families every lookup derives from.

A family (the paper's DETR, Deformable DETR, RT-DETR, D-FINE, DEIMv2, RF-DETR, Grounding DINO; or one a user
adds) declares ``FAMILY = Family(...)`` in its own folder and registers it with :func:`register_family`; importing
:mod:`detr.models` registers the package's own. Code outside a family's folder asks the record
(:func:`family_of` a config, :func:`family_named` a checkpoint's or a YAML's name), never compares names.

Presets are named builders of configs (``dfine_s``, ``rtdetr_r50vd``, ``rfdetr_base``, ...):
:func:`preset_config` returns one, :func:`detr.models.build.build` builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from detr.models.config import ModelConfig
from detr.models.legacy import migrate_flat_config

if TYPE_CHECKING:
    from detr.models.detector import Detector

#: The data module's augmentation recipes (:class:`detr.lightning.datamodule.DetrDataModule`'s ``augmentation``).
Augmentation = Literal["default", "rtdetr", "rfdetr", "deim"]


@dataclass(frozen=True)
class Family:
    """One model family: its name, its config class, its builder and its presets.

    Attributes:
        name: the family's name, as configs and checkpoints write it (``config.to_dict()["family"]``); equal
            to its config class's ``family``.
        title: the family as its papers write it ("D-FINE"), for messages and ``--help``.
        config_class: the family's config, a frozen subclass of :class:`ModelConfig`.
        builder: config → the detector (a :class:`detr.models.detector.Detector`).
        presets: preset name → a function returning that model's config (its authors' sizes, COCO's classes).
        parent: the family whose code this one builds on ("dfine" for DEIMv2), or None.
        recipe: the family's training recipe (:class:`detr.models.recipe.Recipe`: its authors' loss and optimizer),
            or a function of the config that returns one (RF-DETR: the segmentation recipe with instance masks);
            None: the family does not train here (Grounding DINO: it predicts from a transformers directory).
        augmentation: the data module's augmentation its authors train with.
        real_time: the family predicts the ``num_queries`` best (query, class) pairs and takes denoising targets
            in training (RT-DETR's lineage); the CLI and the data module ask this, not the name.
        flat_names: old one-record config field (``architecture`` = this name) → this config's field, as a
            dotted path into a record (``"max_num_bins": "decoder.max_num_bins"``); the old fields this config
            has under the same name need no entry (:mod:`detr.models.legacy`).
        migrate_flat: a function that rewrites an old one-record dict's values before ``flat_names`` applies
            (a unit that changed), or None.
    """

    name: str
    title: str
    config_class: type[ModelConfig]
    builder: Callable[[Any], Detector]
    presets: Mapping[str, Callable[[], ModelConfig]] = field(default_factory=dict)
    parent: str | None = None
    recipe: Any = None
    augmentation: Augmentation = "default"
    real_time: bool = False
    flat_names: Mapping[str, str] = field(default_factory=dict)
    migrate_flat: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.config_class.family != self.name:
            raise ValueError(f"family {self.name!r}: its config class {self.config_class.__name__} names family "
                             f"{self.config_class.family!r}; set {self.config_class.__name__}.family = {self.name!r}")


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` to the list (again: no change); a preset name or a family name that another family already
    has raises ValueError. Returns the record, for ``FAMILY = register_family(Family(...))``."""
    known = _FAMILIES.get(family.name)
    if known is not None and known != family:
        raise ValueError(f"family {family.name!r} is registered already (by {known.config_class.__module__})")
    for other in _FAMILIES.values():
        taken = sorted(set(other.presets) & set(family.presets)) if other.name != family.name else []
        if taken:
            raise ValueError(f"family {family.name!r}: preset(s) {taken} belong to family {other.name!r}")
    _FAMILIES[family.name] = family
    return family


def families() -> tuple[Family, ...]:
    """Every registered family, in registration order."""
    return tuple(_FAMILIES.values())


def family_named(name: str) -> Family:
    """The family called ``name`` (a config's ``family``, an old config's ``architecture``); an unknown name
    raises ValueError listing the known ones."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; the families are {', '.join(_FAMILIES)} (a family of "
                         f"your own: import the module that registers it first)") from None


def family_of(config: ModelConfig) -> Family:
    """The family ``config`` belongs to (its class's ``family``)."""
    family = family_named(type(config).family)
    if type(config) is not family.config_class:
        raise ValueError(f"{type(config).__name__} names family {family.name!r}, whose config class is "
                         f"{family.config_class.__name__}")
    return family


def presets() -> dict[str, Family]:
    """Every preset name → its family."""
    return {name: family for family in _FAMILIES.values() for name in family.presets}


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """The config of preset ``name`` (``dfine_s``, ``rtdetr_r50vd``, ...) with ``overrides`` (its fields, e.g.
    ``num_classes=3``) applied; an unknown name raises ValueError listing the presets."""
    family = presets().get(name)
    if family is None:
        raise ValueError(f"unknown model preset {name!r}; the presets are {', '.join(presets())}")
    config = family.presets[name]()
    return config.replace(**overrides) if overrides else config


def config_from_dict(values: Mapping[str, Any], where: str = "the model configuration") -> ModelConfig:
    """A model config from its dict: :meth:`ModelConfig.to_dict`'s form (``family`` and the family's fields) or
    the old one-record form (every family's options, ``architecture`` naming the family, DETR without it; what
    checkpoints, YAML files and readers wrote before the families had their own configs), migrated.
    Problems raise ValueError naming ``where``."""
    values = dict(values)
    if "family" in values:
        family = family_named(values.pop("family"))
        return family.config_class.from_dict(values, where=where)
    family = family_named(values.get("architecture", "detr"))
    return family.config_class.from_dict(migrate_flat_config(values, family, where), where=where)


__all__ = ["Augmentation", "Family", "config_from_dict", "families", "family_named", "family_of",
           "preset_config", "presets", "register_family"]
