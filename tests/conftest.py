"""Shared fixtures: tiny models and padded batches that keep the suite fast on 2 CPU cores."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr

TINY = dict(backbone="resnet18", hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
            dim_feedforward=64, num_queries=10, num_classes=5)


@pytest.fixture
def tiny_config() -> dict:
    return dict(TINY)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return build_detr(**TINY, dropout=0.0).eval()


@pytest.fixture
def padded_batch():
    """Two images of different sizes, zero-padded to 96 × 128 (bottom/right), mask True on padding."""
    torch.manual_seed(1)
    images = torch.zeros(2, 3, 96, 128)
    mask = torch.ones(2, 96, 128, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, 96, 128), False
    images[1, :, :64, :96], mask[1, :64, :96] = torch.randn(3, 64, 96), False
    return images, mask


#: Command-line overrides that shrink any config's model to a few-second CPU fit (tiny shapes images).
TINY_CLI_MODEL = [
    "--model.backbone=resnet18", "--model.hidden_dim=32", "--model.num_heads=2", "--model.num_encoder_layers=1",
    "--model.num_decoder_layers=2", "--model.dim_feedforward=64", "--model.num_queries=10",
    "--model.backbone_last_stage=layer3",
]


@pytest.fixture(scope="session")
def tiny_shapes_root(tmp_path_factory):
    """A COCO-layout shapes set: 8 training and 4 validation images of 64 px (5 classes, at most 6 objects)."""
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    root = tmp_path_factory.mktemp("tiny_shapes")
    write_shapes_dataset(root, ShapesConfig(num_train=8, num_val=4, image_size=64, min_object_size=12,
                                            max_object_size=32, seed=3))
    return root


def tiny_fit_args(data_root, out_dir, *extra: str) -> list[str]:
    """``detr fit`` arguments for a few-step CPU run of the demo config on ``data_root`` into ``out_dir``:
    batch 4 (2 steps an epoch on :func:`tiny_shapes_root`), validation every epoch, no progress bar."""
    from pathlib import Path

    config = Path(__file__).parents[1] / "configs" / "demo_shapes_cpu.yaml"
    return [
        "fit", "--config", str(config), f"--data.root={data_root}", "--data.batch_size=4", "--data.val_batch_size=4",
        "--data.num_workers=0", *TINY_CLI_MODEL, f"--trainer.default_root_dir={out_dir}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=-1",
        *extra,
    ]


def load_script(relative_path: str):
    """Import a script of tools/ or benchmarks/ (folders of scripts, not packages) from its path in the
    repository, e.g. ``load_script("tools/predict.py")``; each call executes the file afresh."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative_path
    name = f"script_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
