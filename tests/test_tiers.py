"""The tiers (tests/tiers.py): what marks a test integration or parity, read from sample tests written to a module
of their own, and the parity modules of the suite all in the quick tier (`make test`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import REPO
from tests.tiers import collect_uses, heavy_reasons, is_parity

SAMPLES = '''
import subprocess

import lightning as L
import torch

from detr.checkpoints.export import export_onnx, export_program
from detr.commands import demo
from detr.lightning.cli import main
from tests.helpers import load_script, load_tool


def fit_with_a_trainer(model, data):
    L.Trainer(max_epochs=1).fit(model, data)


def test_pure():
    assert torch.zeros(1).sum() == 0


def test_cli():
    main(["fit", "--print_config"])


def test_helper_that_fits():
    fit_with_a_trainer(None, None)


def test_subprocess():
    subprocess.run(["true"], check=True)


def test_ddp():
    L.Trainer(strategy="ddp_spawn" if True else "auto")


def test_demo_advice_only():
    demo.expectation(1, 2)


def test_demo_training():
    demo.main([])


def test_transformers_parity():
    from transformers import RTDetrConfig
    assert RTDetrConfig


def test_transformers_model_exported(tmp_path):
    from transformers import RTDetrConfig
    export_onnx(RTDetrConfig, tmp_path)


def test_served(server):
    server.running_server()


def test_program_exported(tmp_path):
    export_program(None, tmp_path / "model.pt2")


def test_export_tool():
    load_script("tools/export.py").main([])


def test_predict_tool():
    load_tool("predict").main([])


def test_benchmark_importing_its_neighbour():
    load_script("benchmarks/finetune.py").main([])  # its training is convergence.py's
'''


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """The sample tests above as the module ``tests.tier_samples`` (tests/ helpers are followed by module name)."""
    path = tmp_path_factory.mktemp("tiers") / "tier_samples.py"
    path.write_text(SAMPLES)
    spec = importlib.util.spec_from_file_location("tests.tier_samples", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _tier(module, name: str, *fixtures: str) -> tuple[set[str], bool]:
    item = SimpleNamespace(obj=getattr(module, name), fixturenames=list(fixtures), path=Path(module.__file__),
                           get_closest_marker=lambda _name: None)
    uses = collect_uses([item.obj])
    reasons = heavy_reasons(item, uses)
    return reasons, is_parity(item, uses, reasons)


@pytest.mark.parametrize(("name", "fixtures", "reasons", "parity"), [
    ("test_pure", (), set(), False),
    ("test_cli", (), {"Lightning CLI"}, False),
    ("test_helper_that_fits", (), {"Trainer"}, False),
    ("test_subprocess", (), {"subprocess"}, False),
    ("test_ddp", (), {"Trainer", "DDP"}, False),
    ("test_demo_advice_only", (), set(), False),
    ("test_demo_training", (), {"demo training"}, False),
    ("test_transformers_parity", (), set(), True),
    ("test_transformers_model_exported", (), {"export"}, False),
    ("test_served", ("server",), {"server"}, False),
    ("test_pure", ("chromium",), {"browser"}, False),
    ("test_program_exported", (), {"export"}, False),
    ("test_export_tool", (), {"export"}, False),
    ("test_predict_tool", (), set(), False),
    ("test_benchmark_importing_its_neighbour", (), {"Lightning CLI", "Trainer"}, False),
])
def test_what_a_test_uses_decides_its_tier(samples, name, fixtures, reasons, parity):
    assert _tier(samples, name, *fixtures) == (reasons, parity)


# The parity modules the issue names (the reference DETR, the authors' panoptic model, transformers for every
# family and its image processors, the losses): `make test` runs every test in them.
PARITY_MODULES = ["tests/models/test_detr.py", "tests/models/test_segmentation.py",
                  "tests/inference/test_postprocess_masks.py", "tests/evaluation/test_panoptic.py", "tests/loss",
                  *(f"tests/checkpoints/test_{name}.py" for name in ("huggingface", "huggingface_deformable", "rtdetr",
                                                                      "dfine", "deimv2", "rfdetr", "rfdetr_package")),
                  *(f"tests/inference/test_predictor_{name}.py" for name in ("rtdetr", "dfine", "deimv2", "rfdetr"))]


def test_every_parity_module_is_in_the_quick_tier():
    """Collected with ``-m integration`` beside a module that fits a Trainer, the parity modules give no test."""
    fits = "tests/lightning/test_overfit.py"
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "integration", fits, *PARITY_MODULES], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith(fits + "::") for line in collected), collected
