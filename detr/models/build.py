"""Build a detector from its family's config (:func:`build_detr`) or from a preset's name (:func:`build`): the
builder is the family's (:class:`detr.models.family.Family`), found from the config's class."""

from __future__ import annotations

from typing import Any

from detr.models.config import ModelConfig
from detr.models.detector import Detector
from detr.models.detr_family import DetrConfig
from detr.models.family import family_of, preset_config
from detr.models.recipe import Recipe


def build_detr(config: ModelConfig | None = None, /, **options: Any) -> Detector:
    """Build the detector ``config`` describes (default: the paper's COCO model, R50, 6 + 6 layers, 100
    queries, 91 classes: :class:`detr.models.detr_family.DetrConfig`); ``options`` are fields of the config's
    class that replace the config's (``build_detr(num_classes=3)``, ``build_detr(config, dropout=0.0)``). The
    model's ``config`` is the config it was built from. Invalid options raise ValueError (the config class checks
    them). Another family's standard model: :func:`build` with a preset's name."""
    if config is None:
        config = DetrConfig.from_dict(options, where="build_detr")
    elif options:
        config = config.replace(**options)
    model = family_of(config).builder(config)
    model.config = config
    return model


def build(preset: str, /, **overrides: Any) -> Detector:
    """The detector of a named preset (``build("dfine_s", num_classes=3)``; ``detr --help`` lists the presets),
    with ``overrides`` (fields of its family's config) applied."""
    return build_detr(preset_config(preset, **overrides))


def recipe_for(config: ModelConfig) -> Recipe:
    """The authors' training recipe (:class:`detr.models.recipe.Recipe`) of the family ``config`` belongs to: its
    record's ``recipe``, or what its record's recipe function gives for ``config`` (RF-DETR with instance masks:
    its segmentation recipe). A family without one (``recipe`` None: Grounding DINO, read from transformers
    directories to predict) raises ValueError."""
    family = family_of(config)
    recipe = family.recipe
    if recipe is None:
        raise ValueError(f"model.detr: the {family.title} family has no training recipe here: it predicts, labels "
                         f"and serves (a transformers directory as --checkpoint) but does not train; pick another "
                         f"family's preset to train")
    return recipe if isinstance(recipe, Recipe) else recipe(config)
