"""The families' training recipes (detr/models/<family>/recipe.py): complete records, found by the model config,
equal to what the configs set, and read by the loss builder in place of the family's name."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from detr.lightning.migrate import migrate_config
from detr.loss.build import build_criterion
from detr.loss.parts import DenoisingLoss, ProposalLoss
from detr.models.build import recipe_for
from detr.models.deformable.config import DeformableConfig
from detr.models.detr_family import DetrConfig
from detr.models.deformable.recipe import RECIPE as DEFORMABLE
from detr.models.deimv2.recipe import RECIPE as DEIMV2_RECIPE
from detr.models.dfine.recipe import RECIPE as DFINE
from detr.models.recipe import DETR_RECIPE, LossRecipe, OptimizerRecipe, Recipe
from detr.models.rfdetr.recipe import RECIPE as RFDETR, SEGMENTATION_RECIPE
from detr.models.rtdetr.recipe import RECIPE as RTDETR
from tests.helpers_realtime import CONFIGS

REPO = Path(__file__).resolve().parents[2]
OLD_CONFIGS = REPO / "tests" / "fixtures" / "v0_9fa7164" / "configs"
RECIPES = {"detr": DETR_RECIPE, "deformable": DEFORMABLE, "rtdetr": RTDETR, "dfine": DFINE, "deimv2": DEIMV2_RECIPE,
           "rfdetr": RFDETR, "rfdetr_segmentation": SEGMENTATION_RECIPE}


@pytest.mark.parametrize("name", RECIPES)
def test_a_familys_recipe_sets_every_field(name: str) -> None:
    recipe = RECIPES[name]
    assert recipe.loss.unset() == [] and recipe.optimizer.unset() == []


def test_the_config_finds_its_familys_recipe() -> None:
    assert recipe_for(DetrConfig()) is DETR_RECIPE
    assert recipe_for(DetrConfig().replace(query_type="anchor")) is DETR_RECIPE
    for family in ("rtdetr", "dfine", "deimv2"):
        assert recipe_for(CONFIGS[family]) is RECIPES[family]
    assert recipe_for(CONFIGS["rfdetr"]) is SEGMENTATION_RECIPE  # the tiny RF-DETR has instance masks
    assert recipe_for(CONFIGS["rfdetr"].replace(instance_masks=False)) is RFDETR


def test_a_field_left_unset_is_the_familys() -> None:
    loss = LossRecipe(cost_class=8.0, matchability=False).over(DEIMV2_RECIPE.loss)
    assert loss.cost_class == 8.0 and loss.matchability is False and loss.loss_fgl == DEIMV2_RECIPE.loss.loss_fgl
    assert OptimizerRecipe().over(RFDETR.optimizer) == RFDETR.optimizer


def _model_settings(path: Path) -> dict[str, Any]:
    """What a YAML config (its ``config:`` includes followed) sets of the loss and the optimizer, in today's keys:
    {"loss.cost_class": 2.0, "optimizer.lr": ...}."""
    content = migrate_config(yaml.safe_load(path.read_text()), where=str(path))
    settings = _model_settings(path.parent / content["config"]) if "config" in content else {}
    for record in ("loss", "optimizer"):
        settings.update({f"{record}.{key}": value for key, value in (content.get("model", {}).get(record) or {}).items()})
        settings.update({key[len("model."):]: value for key, value in content.items()
                         if key.startswith(f"model.{record}.")})
    return settings


def _recipe_values(recipe: Recipe) -> dict[str, Any]:
    return {**{f"loss.{k}": v for k, v in dataclasses.asdict(recipe.loss).items()},
            **{f"optimizer.{k}": v for k, v in dataclasses.asdict(recipe.optimizer).items()}}


#: Each COCO config (as the code at 9fa7164 wrote it, with every loss and optimizer value spelt out, and as it is
#: now), the recipe it trains with, and the values it sets that differ from the family's on purpose.
COCO_CONFIGS = [
    ("detr_coco.yaml", DETR_RECIPE, {"optimizer.lr_drop_epochs": [400]}),  # the released 500-epoch schedule
    ("rtdetr_r50vd_coco.yaml", RTDETR, {}),
    ("dfine_s_coco.yaml", DFINE, {}),
    ("deim_dfine_s_coco.yaml", DEIMV2_RECIPE, {}),  # D-FINE trained with DEIM's loss and schedule
    ("rfdetr_base_coco.yaml", RFDETR, {}),
]


@pytest.mark.parametrize("name, recipe, deviations", COCO_CONFIGS, ids=[c[0] for c in COCO_CONFIGS])
@pytest.mark.parametrize("generation", ["v0_9fa7164", "today"])
def test_the_coco_configs_train_with_their_familys_recipe(name, recipe, deviations, generation) -> None:
    """Every loss and optimizer value a family's COCO config sets is its family's recipe (or a stated deviation):
    the old configs spelt each out, and those values are what the family's record now holds."""
    path = (OLD_CONFIGS if generation != "today" else REPO / "configs") / name
    settings = _model_settings(path)
    if generation != "today":
        assert len(settings) >= 8  # the old configs spelt the recipe out
    expected = {**_recipe_values(recipe), **deviations}
    differing = {key: (value, expected[key]) for key, value in settings.items() if value != expected[key]}
    assert not differing, f"{path}: (config, recipe) {differing}"


def test_deformable_detrs_config_sets_its_familys_recipe() -> None:
    settings = _model_settings(REPO / "configs" / "deformable_detr_coco.yaml")
    values = _recipe_values(DEFORMABLE)
    assert all(settings[key] == values[key] for key in ("loss.cost_class", "loss.loss_ce", "optimizer.lr",
                                                       "optimizer.lr_backbone", "optimizer.lr_drop_epochs"))


def test_the_loss_builder_reads_the_recipes_parts_not_the_family() -> None:
    """An RT-DETR model trained with another recipe's parts gets those parts: the class loss, the proposals and
    the denoising come from the recipe."""
    config = CONFIGS["rtdetr"].replace(denoising=True)
    own = build_criterion(config)
    assert own.varifocal and not own.ia_bce
    proposals, denoising = own.parts[0], own.parts[1]
    assert not proposals.class_agnostic and denoising.contrastive
    other = build_criterion(config, LossRecipe(class_loss="ia_bce", proposals="two_stage",
                                               contrastive_denoising=False))
    assert other.ia_bce and not other.varifocal
    [denoising] = other.parts  # "two_stage": only a two-stage model's proposals are scored
    assert isinstance(denoising, DenoisingLoss) and not denoising.contrastive
    deformable = DeformableConfig(class_head="sigmoid", box_refine=True, two_stage=True)
    assert build_criterion(deformable).parts[0].class_agnostic  # Deformable DETR's
    [selected] = build_criterion(deformable, LossRecipe(proposals="selected")).parts
    assert isinstance(selected, ProposalLoss) and not selected.class_agnostic
    with pytest.raises(ValueError, match="matchability"):
        build_criterion(config, LossRecipe(class_loss="focal", matchability=True))
    with pytest.raises(ValueError, match="LossRecipe"):
        build_criterion(config, no_such_weight=1.0)


def test_a_family_without_a_recipe_is_refused_by_name():
    """Grounding DINO is a family (its presets build) but has no training recipe here: asking for one
    names the family and what it does instead, not a TypeError on None."""
    from detr.models.family import preset_config

    with pytest.raises(ValueError, match="Grounding DINO family has no training recipe"):
        recipe_for(preset_config("grounding_dino_tiny"))
