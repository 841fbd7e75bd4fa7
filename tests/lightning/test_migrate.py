"""An earlier version's flat training settings (``model.lr``, ``model.loss_giou`` ...) read as today's records
(detr/lightning/migrate.py): in checkpoints' hyperparameters, YAML configs and on the command line, each old key
named with its new one."""

from __future__ import annotations

import contextlib
import io
import logging
import lzma

import pytest
import torch
import yaml

from detr.lightning.cli import main, make_cli
from detr.lightning.migrate import OLD_DEFAULTS, migrate_arguments, migrate_config, migrate_hyperparameters
from detr.lightning.system import DetrSystem
from detr.models.rtdetr.recipe import RECIPE as RTDETR
from tests.helpers import REPO, TINY_CLI_MODEL

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

OLD = REPO / "tests" / "fixtures" / "v0_9fa7164"


def test_old_hyperparameters_are_grouped_with_the_old_defaults_for_what_they_lack() -> None:
    old = {"detr": {"backbone": "resnet18"}, "lr": 3e-4, "loss_giou": 4.0, "channels_last": True,
           "evaluation_dir": "", "lr_drop_epochs": None, "lr_flat_cosine_epochs": None, "matchability": None,
           "init_checkpoint": None}
    new = migrate_hyperparameters(old)
    assert new["optimizer"]["lr"] == 3e-4 and new["loss"]["loss_giou"] == 4.0
    assert new["optimizer"]["lr_drop_epochs"] == [200] and new["optimizer"]["lr_flat_cosine_epochs"] == []
    assert "matchability" not in new["loss"]  # None: the family's, as it was
    assert new["runtime"]["channels_last"] is True and new["evaluation"]["evaluation_dir"] == ""
    assert new["loss"]["cost_class"] == OLD_DEFAULTS["cost_class"]  # not written by that version: its default
    assert new["detr"] == old["detr"] and new["init_checkpoint"] is None
    assert not set(new) & set(OLD_DEFAULTS)
    assert migrate_hyperparameters(new) is new  # today's stay as they are


def test_an_old_checkpoint_rebuilds_its_system_with_its_own_settings(tmp_path) -> None:
    """The demo checkpoint of 9fa7164 (flat hyperparameters) rebuilds a system training with the values it saved."""
    path = tmp_path / "demo.ckpt"
    path.write_bytes(lzma.decompress((OLD / "demo.ckpt.xz").read_bytes()))
    saved = torch.load(path, weights_only=True, map_location="cpu")["hyper_parameters"]
    assert "lr" in saved and "optimizer" not in saved
    system = DetrSystem.load_from_checkpoint(path, map_location="cpu")
    assert system.recipe.optimizer.lr == saved["lr"] and system.recipe.loss.loss_ce == saved["loss_ce"]
    assert system.recipe.optimizer.lr_decay_fraction == saved["lr_decay_fraction"]
    assert system.hparams["optimizer"]["warmup_steps"] == saved["warmup_steps"]
    assert "lr" not in system.hparams  # saved again in today's form


def test_old_yaml_keys_move_to_their_records_with_a_note(caplog) -> None:
    old = {"model": {"detr": {"backbone": "resnet18"}, "lr": 1e-3, "loss_ce": 8.0, "loss": {"cost_class": 2.0}},
           "model.warmup_steps": 10, "model.evaluator_backend": "auto", "model.lr_flat_cosine_epochs": None,
           "trainer": {"max_steps": 3}}
    with caplog.at_level(logging.WARNING, logger="detr.lightning.migrate"):
        new = migrate_config(old, where="my.yaml")
    assert new["model"] == {"detr": {"backbone": "resnet18"}, "optimizer": {"lr": 1e-3},
                            "loss": {"loss_ce": 8.0, "cost_class": 2.0}}
    assert new["model.optimizer.warmup_steps"] == 10 and new["model.evaluation.evaluator_backend"] == "auto"
    assert new["model.optimizer.lr_flat_cosine_epochs"] == [] and new["trainer"] == {"max_steps": 3}
    assert "my.yaml: model.lr is now model.optimizer.lr" in caplog.text
    assert migrate_config(new) == new


def test_old_command_line_options_are_renamed() -> None:
    seen: set[str] = set()
    args = ["fit", "--model.lr", "1e-4", "--model.loss_giou=2.0", "--model.detr.num_queries=5",
            "--model.lr_flat_cosine_epochs", "null", "--model.optimizer.lr_backbone=1e-5"]
    assert migrate_arguments(args, seen) == [
        "fit", "--model.optimizer.lr", "1e-4", "--model.loss.loss_giou=2.0", "--model.detr.num_queries=5",
        "--model.optimizer.lr_flat_cosine_epochs", "[]", "--model.optimizer.lr_backbone=1e-5"]
    assert seen == {"lr", "loss_giou", "lr_flat_cosine_epochs"}


def _printed(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(out.getvalue())


def test_an_old_config_and_old_options_parse_as_todays(caplog) -> None:
    """configs/ of 9fa7164 (flat model.* keys, in a nested model: block and as dotted keys, through includes) and
    --model.lr on the command line configure today's records; each old key is named with its new one."""
    with caplog.at_level(logging.WARNING, logger="detr.lightning.migrate"):
        printed = _printed(["fit", "--config", str(OLD / "configs" / "rtdetr_shapes_cpu.yaml"), "--model.lr=3e-4",
                            "--model.channels_last", "false"])
    model = printed["model"]
    assert model["optimizer"]["lr"] == 3e-4 and model["optimizer"]["warmup_steps"] == 50
    assert model["loss"]["cost_class"] == 2.0 and model["loss"]["loss_ce"] == 1.0  # rtdetr's over the demo's 8
    assert model["runtime"]["channels_last"] is False and model["evaluation"]["evaluator_backend"] == "pycocotools"
    assert "command line: model.lr is now model.optimizer.lr" in caplog.text
    assert "demo_shapes_cpu.yaml: model.lr_backbone is now model.optimizer.lr_backbone" in caplog.text


def test_an_old_config_keeps_the_old_defaults_a_new_one_takes_the_familys(tiny_shapes_root, tmp_path) -> None:
    """A run configured in the old keys trains as it did: the settings it leaves unset take the old defaults
    (DETR's: no warm-up), not RT-DETR's recipe (2,000 warm-up steps), which a config in today's keys gets."""
    rtdetr = ["--model.detr=RTDETRConfig", "--model.detr.backbone=resnet18", "--model.detr.backbone_norm=batch_norm",
              "--model.detr.num_feature_levels=3", "--model.detr.num_points=2", "--data.square_size=64",
              "--data.normalize=false"]
    common = ["--config", str(REPO / "configs" / "demo_shapes_cpu.yaml"), f"--data.root={tiny_shapes_root}",
              "--data.num_workers=0", *[a for a in TINY_CLI_MODEL if "backbone" not in a], *rtdetr,
              f"--trainer.default_root_dir={tmp_path}", "--model.optimizer.warmup_steps=null",
              "--model.optimizer.lr_backbone=null"]
    today = make_cli([*common, "--model.optimizer.lr=1e-3"], run=False).model
    assert today.recipe.optimizer.warmup_steps == RTDETR.optimizer.warmup_steps == 2000
    assert today.recipe.optimizer.lr_backbone == RTDETR.optimizer.lr_backbone
    old = make_cli([*common, "--model.lr=1e-3"], run=False).model
    assert type(today.model).__name__ == type(old.model).__name__ == "RTDETR"
    assert old.recipe.optimizer.lr == 1e-3
    assert old.recipe.optimizer.warmup_steps == 0 and old.recipe.optimizer.lr_backbone == OLD_DEFAULTS["lr_backbone"]


def test_an_old_command_line_family_switch_is_refused_naming_the_new_form() -> None:
    """``--model.detr.architecture`` on a command line cannot switch the config's class silently: refused."""
    with pytest.raises(ValueError, match="--model.detr RTDETRConfig"):
        make_cli(["--model.detr.architecture=rtdetr"], run=False)
