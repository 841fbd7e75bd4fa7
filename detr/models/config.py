"""What every family's config shares: the base record :class:`ModelConfig`, and a model's run metadata.

A detector is described by its family's config class, a frozen subclass of :class:`ModelConfig` that holds the
shared fields (classes, width, heads, queries, decoder layers, class head, auxiliary outputs, dropout, backbone)
and then only that family's options (:class:`detr.models.detr_family.DetrConfig`,
:class:`detr.models.rtdetr.config.RTDETRConfig`, ...). :func:`detr.build_detr` builds from it, the training
system takes it as its ``detr`` argument (``model.detr`` of a LightningCLI YAML), checkpoints store its
:meth:`ModelConfig.to_dict` (``checkpoint["detr"]["model_config"]``: the family's name under ``family``, then the
fields) and :func:`detr.models.family.config_from_dict` reads it back, and the old one-record form as well.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from detr.categories import CategoryMap

#: A torchvision ResNet depth (ResNet-vd for RT-DETR) or, per family, its own backbones (HGNetV2 sizes, ViTs).
BackboneName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "hgnetv2_b0", "hgnetv2_b1", "hgnetv2_b2",
                       "hgnetv2_b3", "hgnetv2_b4", "hgnetv2_b5", "dinov3_vit", "dinov2_windowed", "lwdetr_vit"]
BackboneNorm = Literal["frozen_batch_norm", "batch_norm", "group_norm"]
LastStage = Literal["layer4", "layer3", "layer2"]
#: Where a detector's object queries come from: "learned" (an embedding per query, or the encoder's top features)
#: or "anchor" (DAB-DETR's learned anchor boxes); the Detector contract states it.
QueryType = Literal["learned", "anchor"]
#: The class head, in one vocabulary for the model, the matcher, the criterion and the post-processing:
#: "softmax" (the paper: num_classes + 1 logits, the last "no object"; cross-entropy, -p matching cost) or
#: "sigmoid" (num_classes independent sigmoids; focal loss and the focal matching cost).
ClassHead = Literal["softmax", "sigmoid"]

#: Bias of a sigmoid class logit that starts every class at p = 0.01 (the focal-loss prior, Lin et al. §4.1).
PRIOR_BIAS = -math.log((1 - 0.01) / 0.01)

Config = TypeVar("Config", bound="ModelConfig")


@dataclass(frozen=True)
class ModelConfig:
    """The fields every family's config has. A family's config class subclasses it with its own options and
    its authors' standard model as defaults, and names its family in ``family`` (a class attribute).

    Attributes:
        num_classes: the model's classes; the detr CLI links it from the annotation json (or the checkpoint).
        hidden_dim: width of the transformer (the decoder's).
        num_heads: attention heads of the transformer's layers.
        num_queries: object queries: the most objects one image can have detected.
        num_decoder_layers: transformer decoder layers.
        dim_feedforward: hidden width of each layer's feed-forward network.
        dropout: dropout in the transformer.
        class_head: "softmax" (num_classes + 1 logits, the last = no object; cross-entropy) or "sigmoid"
            (num_classes logits scored by independent sigmoids; focal loss). The matcher, the criterion and the
            post-processing take the same word.
        aux_loss: return every decoder layer's predictions, for the auxiliary losses.
        backbone: the backbone's name (each family's config states the ones it builds).
        pretrained_backbone: False (random init), True (torchvision's ImageNet weights, downloaded) or a path to a
            state dict (the ResNet backbones; the other families start from a checkpoint instead).
    """

    #: The name of the family the config describes (:func:`detr.models.family.family_named`).
    family: ClassVar[str] = ""
    #: The backbones the family builds (checked in ``__post_init__``).
    backbones: ClassVar[tuple[str, ...]] = ()

    num_classes: int = 91
    hidden_dim: int = 256
    num_heads: int = 8
    num_queries: int = 100
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    class_head: ClassHead = "softmax"
    aux_loss: bool = True
    backbone: str = "resnet50"
    pretrained_backbone: bool | str = False

    def __post_init__(self) -> None:
        # checkpoints store lists: one value, one type
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))
        if self.class_head not in ("softmax", "sigmoid"):
            raise ValueError(f"class_head must be 'softmax' or 'sigmoid', got {self.class_head!r}")
        for name in ("num_queries", "num_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                hint = {"num_queries": " (one query per detectable object; the paper uses 100)",
                        "num_classes": "; with the detr CLI it comes from the data's annotation json (or, for "
                                       "predict, from the checkpoint)"}[name]
                raise ValueError(f"{name} must be an integer >= 1{hint}, got {value!r}")
        if self.hidden_dim < 2 or self.hidden_dim % 2:
            raise ValueError(f"hidden_dim must be even (half of it encodes each axis), got {self.hidden_dim}")
        if self.num_heads < 1 or self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim ({self.hidden_dim}) must be divisible by num_heads ({self.num_heads})")
        if self.backbones and self.backbone not in self.backbones:
            raise ValueError(f"backbone {self.backbone!r} is not one of {self.family}'s: "
                             f"{', '.join(self.backbones)}")

    @property
    def num_logits(self) -> int:
        """Outputs of the class head: num_classes + 1 (softmax: the last is "no object") or num_classes."""
        return self.num_classes + 1 if self.class_head == "softmax" else self.num_classes

    def replace(self: Config, **changes: Any) -> Config:
        """A copy with ``changes`` applied (validated again; a record field takes a record, or a dict of the fields
        to change); unknown names raise ValueError naming them."""
        values = self.to_dict()
        values.pop("family")
        for name, value in changes.items():  # a record's fields given as a dict change only those fields
            values[name] = {**values[name], **value} if isinstance(value, dict) and isinstance(values.get(name),
                                                                                                dict) else value
        return type(self).from_dict(values, where=f"{type(self).__name__}.replace")

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, the family's name under ``family`` and records as dicts: what checkpoints store
        (they load with ``torch.load(weights_only=True)``) and what :func:`detr.models.family.config_from_dict`
        reads."""
        return {"family": self.family, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls: type[Config], values: dict[str, Any], where: str = "the model configuration") -> Config:
        """The config from its fields (any subset; the rest are the class's defaults; a record field as a dict of
        its fields; a ``family`` key, as :meth:`to_dict` writes, must name this class's family). A name that is not
        a field raises ValueError naming it and ``where`` it came from."""
        values = dict(values)
        family = values.pop("family", cls.family)
        if family != cls.family:
            raise ValueError(f"{where}: a config of family {family!r}, not {cls.family!r} ({cls.__name__}); read it "
                             f"with detr.models.family.config_from_dict")
        return record_from_dict(cls, values, where)


@dataclass(frozen=True)
class ViTSize:
    """A vision transformer's size, in the one vocabulary of every family with a ViT backbone (DEIMv2's DINOv3,
    RF-DETR's windowed DINOv2, LW-DETR's ViT); each family's ViT record adds its own options.

    Attributes:
        width: the token width (ViT-S: 384).
        depth: blocks (12).
        heads: attention heads (6).
        mlp_dim: the MLP's hidden width (4 × width: 1536).
    """

    width: int = 384
    depth: int = 12
    heads: int = 6
    mlp_dim: int = 1536

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))
        if min(self.width, self.depth, self.heads, self.mlp_dim) < 1 or self.width % self.heads:
            raise ValueError(f"the ViT needs a width ({self.width}) divisible by its heads ({self.heads}) and depth "
                             f"and mlp_dim of at least 1, got {self.depth} and {self.mlp_dim}")


Record = TypeVar("Record")


def record_from_dict(cls: type[Record], values: dict[str, Any], where: str) -> Record:
    """A frozen dataclass ``cls`` from ``values``; a field whose type is itself a dataclass takes a dict of its
    fields (recursively). Unknown names raise ValueError naming them, ``where`` and the options."""
    fields = {field.name: field for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown model option(s) {unknown} for {cls.__name__}; the options are "
                         f"{sorted(fields)}")
    hints = typing.get_type_hints(cls)
    converted = {}
    for name, value in values.items():
        record = _record_type(hints[name])
        if record is not None and isinstance(value, dict):
            value = record_from_dict(record, value, f"{where}: {name}")
        converted[name] = value
    return cls(**converted)


def _record_type(hint: Any) -> type | None:
    """The dataclass a field's type names (also inside ``X | None``), or None."""
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for member in typing.get_args(hint):
            if dataclasses.is_dataclass(member):
                return member  # type: ignore[return-value]
    return None


def check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices`` (a Literal field's words)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_unsupported(family: str, config: object, unsupported: dict[str, tuple[bool, str]]) -> None:
    """Raise ValueError for the first ``name: (used, fix)`` whose option ``used`` is a value ``family`` does not
    build, naming the option, its value and the fix."""
    for name, (used, fix) in unsupported.items():
        if used:
            raise ValueError(f"{family} does not take {name}={getattr(config, name)!r}: {fix}")


def check_threshold(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is None or a threshold :class:`ModelMeta` can hold under ``name``:
    ``score_threshold`` strictly between 0 and 1, the panoptic thresholds in [0, 1] (NaN fails both)."""
    if value is None:
        return
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if name == "score_threshold":
        if not (number and 0.0 < value < 1.0):  # type: ignore[operator]
            raise ValueError(f"score_threshold must be a number between 0 and 1, got {value!r}")
    elif not (number and 0.0 <= value <= 1.0):  # type: ignore[operator]
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


#: The authors' evaluation resize, (shortest side, longest-side cap) in pixels: what a model that records no
#: ``eval_size`` is run at.
AUTHORS_EVAL_SIZE: tuple[int, int] = (800, 1333)


@dataclass(frozen=True)
class ModelMeta:
    """What a trained model needs at inference besides its weights and layout, as torchvision's
    ``Weights.meta``: one frozen record that travels with the model (``model.meta``) and its checkpoint.

    category_map: label → data set category id and name (None: labels are written as they are).
    eval_size: (shortest side, longest-side cap) of the resize the model was validated at (None: the
        authors' :data:`AUTHORS_EVAL_SIZE`).
    is_thing: per label, thing (True) or stuff; panoptic models only.
    panoptic_threshold, panoptic_overlap_threshold: the
        :class:`detr.inference.postprocess_masks.PostProcessPanoptic` settings the training run validated
        with (None: that class's defaults).
    score_threshold: the detection score threshold the model's last validation found best (the best mean
        F1 over the classes at IoU 0.5), the default of every command and the Predictor (None: the
        authors' 0.7, as for their released models).

    The thresholds are checked here, the one place every reader (a checkpoint's record, config.json, an
    exported file's metadata) builds the record through: a score threshold is a number strictly between 0 and 1
    (0 would keep every query, 1 none: neither is a validation's best), the panoptic ones are in [0, 1]; NaN,
    infinities, text and booleans are refused with a ``ValueError`` naming the field.
    """

    category_map: CategoryMap | None = None
    eval_size: tuple[int, int] | None = None
    is_thing: tuple[bool, ...] | None = None
    panoptic_threshold: float | None = None
    panoptic_overlap_threshold: float | None = None
    score_threshold: float | None = None

    def __post_init__(self) -> None:
        # normalise sequences so that records compare equal whatever list or tuple they were built from
        if self.eval_size is not None:
            object.__setattr__(self, "eval_size", (int(self.eval_size[0]), int(self.eval_size[1])))
        if self.is_thing is not None:
            object.__setattr__(self, "is_thing", tuple(bool(flag) for flag in self.is_thing))
        for name in ("score_threshold", "panoptic_threshold", "panoptic_overlap_threshold"):
            check_threshold(name, getattr(self, name))
        if (self.category_map is not None and self.is_thing is not None
                and len(self.is_thing) != self.category_map.num_classes):
            raise ValueError(f"is_thing has {len(self.is_thing)} entries but the category map has "
                             f"{self.category_map.num_classes} classes; give one bool per label")

    def replace(self, **changes: Any) -> ModelMeta:
        """A copy with ``changes`` applied (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, in the keys of a checkpoint's ``checkpoint["detr"]`` (read with
        ``torch.load(weights_only=True)``): category_map, eval_size, is_thing, panoptic_postprocess
        (``{"threshold", "overlap_threshold"}`` or None) and score_threshold."""
        postprocess = (None if self.panoptic_threshold is None and self.panoptic_overlap_threshold is None else
                       {"threshold": self.panoptic_threshold, "overlap_threshold": self.panoptic_overlap_threshold})
        return {
            "category_map": self.category_map.to_dict() if self.category_map is not None else None,
            "eval_size": list(self.eval_size) if self.eval_size is not None else None,
            "is_thing": list(self.is_thing) if self.is_thing is not None else None,
            "panoptic_postprocess": postprocess,
            "score_threshold": self.score_threshold,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelMeta:
        """The record from :meth:`to_dict`'s keys; absent or empty ones are None, other keys are ignored
        (``checkpoint["detr"]`` also holds the model config)."""
        postprocess = values.get("panoptic_postprocess") or {}
        return cls(
            category_map=CategoryMap.from_dict(values["category_map"]) if values.get("category_map") else None,
            eval_size=tuple(values["eval_size"]) if values.get("eval_size") else None,
            is_thing=tuple(values["is_thing"]) if values.get("is_thing") else None,
            panoptic_threshold=postprocess.get("threshold"),
            panoptic_overlap_threshold=postprocess.get("overlap_threshold"),
            score_threshold=values.get("score_threshold"),
        )
