"""The served model and one detr-serve process per test module (benchmarks/serve_load.py starts it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.models.config import ModelMeta
from tests.helpers import load_script, tiny_config_with

#: The served model's default threshold (the tiny random model's scores spread around 0.4 to 0.9).
THRESHOLD = 0.5
#: Limits of the test server, small enough that the refusals are cheap to provoke.
MAX_PIXELS = 1_000_000
MAX_BODY_MB = 2


def spread_out_model(seed: int = 0) -> torch.nn.Module:
    """A tiny random DETR whose queries predict visibly different boxes and scores (as the explorer's browser
    test builds it): at random init all queries attend alike, so larger query embeddings and heads spread them."""
    torch.manual_seed(seed)
    model = build_detr(tiny_config_with(num_decoder_layers=2, num_queries=12))
    with torch.no_grad():
        model.query_embed.weight.mul_(10)
        model.bbox_embed.layers[-1].weight.mul_(10)
        model.class_embed.weight.mul_(10)
    model.meta = ModelMeta(category_map=CategoryMap((3, 7, 9, 11, 12), ("circle", "square", "triangle", "star", "ring")),
                           eval_size=(160, 240))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """:func:`spread_out_model` saved in this project's layout (category map and eval size 160 / 240 kept)."""
    return save_checkpoint(spread_out_model(), tmp_path_factory.mktemp("served") / "tiny.ckpt")


@pytest.fixture(scope="module")
def load_tools():
    """benchmarks/serve_load.py as a module: running_server, run_load, free_port."""
    return load_script("benchmarks/serve_load.py")


@pytest.fixture(scope="module")
def server(checkpoint, load_tools, tmp_path_factory):
    """One detr-serve process for the module: batches of up to 8 within 50 ms, the limits above, one thread."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with load_tools.running_server(checkpoint, log, "--threshold", str(THRESHOLD), "--batch-timeout", "0.05",
                                   "--max-pixels", str(MAX_PIXELS), "--max-body-mb", str(MAX_BODY_MB),
                                   threads=1) as running:
        yield running
