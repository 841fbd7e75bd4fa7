"""Shared fixtures: tiny models, padded batches and in-memory data that keep the suite fast on 2 CPU cores."""

from __future__ import annotations

import contextlib
import copy
import io
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from pycocotools.coco import COCO
from torch.utils.data import DataLoader

from detr import build_detr

TINY = dict(backbone="resnet18", hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
            dim_feedforward=64, num_queries=10, num_classes=5)


def tiny_config_with(**changes: Any) -> dict:
    """:data:`TINY` with some keys changed or added, so a test module states only what it needs different."""
    return {**TINY, **changes}


def system_args(**kwargs: Any) -> dict:
    """DetrSystem keyword arguments from one flat mix of detector options and recipe arguments (a test's
    TINY plus what it changes): the detector's gathered into ``detr=DetrConfig(...)``, the rest kept."""
    from detr.models.config import DetrConfig, field_names

    model = {key: kwargs.pop(key) for key in list(kwargs) if key in field_names()}
    return {"detr": DetrConfig(**model), **kwargs}


@pytest.fixture
def tiny_config() -> dict:
    return dict(TINY)


@pytest.fixture
def one_thread():
    """One torch thread: tiny models run faster on one, and far faster when other processes share the 2 cores
    (forked DDP processes keep it too: an OpenMP pool does not survive a fork). Use it per module with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def bare_argv(monkeypatch):
    """``sys.argv`` of a bare ``detr`` call: LightningCLI warns when sys.argv and its args both hold arguments."""
    monkeypatch.setattr("sys.argv", ["detr"])


def coco_ground_truth(dataset: dict) -> COCO:
    """A pycocotools ``COCO`` over a copy of ``dataset`` (images, annotations, categories), indexed without
    pycocotools' prints."""
    coco = COCO()
    coco.dataset = copy.deepcopy(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def collate_unpadded(samples: list) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Same-size ``(image [3, H, W], target)`` samples → the batch contract: images [B, 3, H, W], padding mask
    bool [B, H, W] (all False: nothing is padded) and the targets."""
    images = torch.stack([s[0] for s in samples])
    return images, torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool), [s[1] for s in samples]


class InMemoryData(L.LightningDataModule):
    """A data module over samples held in memory, batched with :func:`collate_unpadded`.

    Args:
        samples: ``(image, target)`` pairs for training, and for validation unless ``val_samples`` is given.
        coco: ground truth offered as ``val_dataset.coco``, as the real data module does (None: no
            ``val_dataset``).
        batch_size: of both loaders.
        shuffle: shuffle the training loader.
        train_repeats: the training loader goes over the samples this many times an epoch.
    """

    def __init__(self, samples: list, *, coco: Any = None, batch_size: int = 2, shuffle: bool = False,
                 train_repeats: int = 1, val_samples: list | None = None) -> None:
        super().__init__()
        self.samples = samples
        self.val_samples = samples if val_samples is None else val_samples
        self.batch_size, self.shuffle, self.train_repeats = batch_size, shuffle, train_repeats
        if coco is not None:
            self.val_dataset = SimpleNamespace(coco=coco)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.samples * self.train_repeats, batch_size=self.batch_size, shuffle=self.shuffle,
                          collate_fn=collate_unpadded)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_samples, batch_size=self.batch_size, collate_fn=collate_unpadded)


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
    "--model.detr.backbone=resnet18", "--model.detr.hidden_dim=32", "--model.detr.num_heads=2", "--model.detr.num_encoder_layers=1",
    "--model.detr.num_decoder_layers=2", "--model.detr.dim_feedforward=64", "--model.detr.num_queries=10",
    "--model.detr.backbone_last_stage=layer3",
]


def write_tiny_shapes(tmp_path_factory, *, num_train: int = 8, num_val: int = 4, seed: int = 3):
    """A COCO-layout shapes set of 64 px images (5 classes, at most 6 objects of 12 to 32 px) in a new
    temporary folder; returns the folder."""
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    root = tmp_path_factory.mktemp("tiny_shapes")
    write_shapes_dataset(root, ShapesConfig(num_train=num_train, num_val=num_val, image_size=64, min_object_size=12,
                                            max_object_size=32, seed=seed))
    return root


@pytest.fixture(scope="session")
def tiny_shapes_root(tmp_path_factory):
    """A COCO-layout shapes set: 8 training and 4 validation images of 64 px (5 classes, at most 6 objects)."""
    return write_tiny_shapes(tmp_path_factory)


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
