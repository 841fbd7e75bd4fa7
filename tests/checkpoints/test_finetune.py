"""Fine-tuning from an authors'-layout checkpoint with another number of classes (configs/finetune_custom.yaml):
everything but the class head is loaded, the head fits the new classes, and a training step runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from detr.lightning import DetrSystem
from detr.lightning.cli import make_cli
from detr.models.detr_family import DetrConfig
from detr.models.family import family_named
from tests.helpers import write_tiny_shapes
from tests.helpers_realtime import CONFIGS, tiny_checkpoint

LAYOUT = json.loads((Path(__file__).resolve().parents[1] / "data" / "official_detr_state_dict_layout.json").read_text())
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "finetune_custom.yaml"


pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def release_file(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """An authors' release file (``{"model": state_dict}``, 91 classes) for ResNet-18, random values."""
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in LAYOUT["resnet18"].items():
        value = torch.randn(shape, generator=generator) * 0.02
        state[key] = value.abs() + 1.0 if key.endswith("running_var") else value
    path = tmp_path_factory.mktemp("release") / "detr-r18-test.pth"
    torch.save({"model": state, "args": {"lr": 1e-4}, "epoch": 499}, path)
    return path, state


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=5)


def test_finetune_config_loads_all_but_the_class_head_and_trains(release_file, tiny_shapes, tmp_path) -> None:
    path, state = release_file
    cli = make_cli([
        "--config", str(CONFIG), f"--model.init_checkpoint={path}", "--model.detr.backbone=resnet18",
        "--model.detr.dropout=0.0", f"--data.root={tiny_shapes}", "--data.batch_size=2", "--data.num_workers=0",
        "--data.train_scales=[64]", "--data.train_max_size=64", "--data.crop_resize_scales=[64]",
        "--data.crop_min_size=48", "--data.crop_max_size=64", "--data.eval_min_size=64", "--data.eval_max_size=64",
        "--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
        "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}", "--trainer.accelerator=cpu",
    ], run=False)  # two steps: the config's warm-up (15 % of the run, at least one step) starts at lr / 1000
    model = cli.model.model
    assert model.num_classes == 5
    assert model.class_embed.weight.shape == (6, 256) and model.class_embed.bias.shape == (6,)
    loaded = model.state_dict()
    assert set(loaded) == set(state)
    for key, value in state.items():
        if key.startswith("class_embed."):
            assert loaded[key].shape != value.shape
        else:
            assert torch.equal(loaded[key], value), key

    before = {k: v.clone() for k, v in loaded.items()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    after = cli.model.model.state_dict()
    assert not torch.equal(after["class_embed.weight"], before["class_embed.weight"])  # the new head trains
    assert not torch.equal(after["query_embed.weight"], before["query_embed.weight"])
    assert torch.equal(after["backbone.0.body.layer1.0.conv1.weight"], before["backbone.0.body.layer1.0.conv1.weight"])


def test_init_checkpoint_of_another_architecture_is_refused(release_file) -> None:
    path, _ = release_file
    with pytest.raises(ValueError, match="does not match the model's key layout"):
        DetrSystem(detr=DetrConfig(backbone="resnet18", num_encoder_layers=2, num_classes=5),
                   init_checkpoint=str(path))


@pytest.mark.parametrize("family, config", [
    ("rtdetr", CONFIGS["dfine"]),
    ("dfine", DetrConfig(backbone="resnet18", num_encoder_layers=2, num_classes=5)),
    ("rfdetr", CONFIGS["rtdetr"]),
])
def test_init_checkpoint_of_another_family_names_both_families(tmp_path, family, config) -> None:
    # an RT-DETR checkpoint under a D-FINE config (and D-FINE's under DETR's): the families, not a list of keys
    path = tiny_checkpoint(family, tmp_path)
    with pytest.raises(ValueError) as error:
        DetrSystem(detr=config.replace(pretrained_backbone=False), init_checkpoint=str(path))
    message = str(error.value)
    assert f"is a checkpoint of {family_named(family).title}, but the config builds " \
        f"{family_named(config.family).title}" in message, message
    assert f"(family {family!r})" in message and f"configs/{family}_shapes_cpu.yaml" in message
    assert "missing keys" not in message


def test_an_authors_detr_file_under_a_real_time_config_is_named(release_file) -> None:
    path, _ = release_file
    with pytest.raises(ValueError, match="is a checkpoint of DETR, but the config builds RT-DETR"):
        DetrSystem(detr=CONFIGS["rtdetr"].replace(pretrained_backbone=False), init_checkpoint=str(path))
