"""What the serving tests share: the served tiny model and the test server's settings."""

from __future__ import annotations

import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.models.config import ModelMeta
from tests.helpers import tiny_config_with

#: The served model's default threshold (the tiny random model's scores spread around 0.4 to 0.9).
THRESHOLD = 0.5
#: Limits of the test server, small enough that the refusals are cheap to provoke.
MAX_PIXELS = 1_000_000
MAX_BODY_MB = 2


def spread_out_model(seed: int = 0) -> torch.nn.Module:
    """A tiny random DETR whose queries predict visibly different boxes and scores (as the explorer's browser
    test builds it): at random init all queries attend alike, so larger query embeddings and heads spread them.
    Its meta names five shape classes (data set ids 3, 7, 9, 11, 12) and an eval size of 160 / 240."""
    torch.manual_seed(seed)
    model = build_detr(tiny_config_with(num_decoder_layers=2, num_queries=12))
    with torch.no_grad():
        model.query_embed.weight.mul_(10)
        model.bbox_embed.layers[-1].weight.mul_(10)
        model.class_embed.weight.mul_(10)
    model.meta = ModelMeta(category_map=CategoryMap((3, 7, 9, 11, 12), ("circle", "square", "triangle", "star", "ring")),
                           eval_size=(160, 240))
    return model
