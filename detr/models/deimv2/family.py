"""DEIMv2 as a family: its config, builder and presets (the released sizes it builds:
:mod:`detr.models.deimv2.presets`), D-FINE its parent."""

from __future__ import annotations

from detr.models.deimv2.build import build_deimv2
from detr.models.deimv2.config import FLAT_NAMES, DEIMv2Config
from detr.models.deimv2.presets import PRESETS
from detr.models.dfine.config import FLAT_NAMES as DFINE_FLAT_NAMES
from detr.models.family import Family, register_family
from detr.models.deimv2.recipe import RECIPE

FAMILY = register_family(Family(
    name="deimv2", title="DEIMv2", config_class=DEIMv2Config, builder=build_deimv2, parent="dfine",
    presets=PRESETS, augmentation="deim", real_time=True, flat_names={**DFINE_FLAT_NAMES, **FLAT_NAMES},
    recipe=RECIPE,
))
