"""The served model and one detr-serve process per test module (benchmarks/serve_load.py starts it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr.checkpoints import save_checkpoint
from tests.helpers import load_script
from tests.serving.helpers import MAX_BODY_MB, MAX_PIXELS, THRESHOLD, spread_out_model


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
