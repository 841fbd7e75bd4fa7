"""Every config in configs/ starts and trains on this machine: each one (and each model config stacked on
the COCO base) runs one training batch and one validation batch on the CPU with a tiny transformer and
small images, so no config can ship that hangs waiting for other nodes or fails to build. Every output
of a run lands in ``trainer.default_root_dir``, and nothing in the working directory."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
import yaml

from detr.lightning.cli import main
from detr.models.build import recipe_for
from detr.models.family import config_from_dict, preset_config
from detr.models.recipe import DETR_RECIPE, LossRecipe, OptimizerRecipe
from tests.helpers import write_tiny_shapes

REPO = Path(__file__).resolve().parents[2]
# the panoptic configs run through detr-panoptic: tests/lightning/test_panoptic_training.py starts each one
CONFIGS = sorted(path for path in (REPO / "configs").glob("*.yaml") if "panoptic" not in path.name)
BASE = REPO / "configs" / "detr_coco.yaml"
MODEL_CONFIGS = ["detr_r50_coco.yaml", "detr_r50_dc5_coco.yaml", "detr_r101_coco.yaml", "detr_r101_dc5_coco.yaml"]
COCO_MINI = REPO / "data" / "coco-mini"

# Small enough for one CPU step in seconds; the backbone stays a ResNet, and a dilated (DC5) config keeps
# its dilation on the smallest ResNet that has one (torchvision's ResNet-18 blocks cannot dilate).
TINY = [
    "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
    "--model.detr.pretrained_backbone=false", "--model.init_checkpoint=null", "--model.detr.hidden_dim=32",
    "--model.detr.num_heads=2", "--model.detr.num_encoder_layers=1", "--model.detr.num_decoder_layers=1",
    "--model.detr.dim_feedforward=64",  # each config keeps its queries: coco-mini has images with 20+ objects
    "--data.batch_size=2", "--data.val_batch_size=2", "--data.num_workers=0", "--data.train_scales=[64]",
    "--data.train_max_size=96", "--data.crop_resize_scales=[64]", "--data.crop_min_size=48",
    "--data.crop_max_size=64", "--data.eval_min_size=64", "--data.eval_max_size=96",
]


pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=3)


@pytest.fixture(scope="module")
def tiny_keypoint_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=3, keypoints=True)


def _printed(capsys, *configs: Path) -> dict:
    args = ["fit"] + [arg for config in configs for arg in ("--config", str(config))]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def _resolved(model: dict) -> dict:
    """A printed config's ``model`` group with its loss and optimizer as the system trains them (a field the config
    leaves unset: the family's recipe), flat beside its other keys: {"detr": ..., "lr": ..., "cost_class": ...}."""
    family = recipe_for(config_from_dict(model["detr"]))
    loss = LossRecipe(**model["loss"]).over(family.loss)
    optimizer = OptimizerRecipe(**model["optimizer"]).over(family.optimizer)
    return {**model, **dataclasses.asdict(loss), **dataclasses.asdict(optimizer)}


def _tiny_backbone(printed: dict) -> list[str]:
    """The options of a small backbone for the config's architecture (and, for RF-DETR, the squares it takes)."""
    architecture = printed["model"]["detr"]["family"]
    if architecture in ("dfine", "deimv2"):
        return ["--model.detr.backbone=hgnetv2_b0"]  # D-FINE's and DEIMv2's smallest
    if architecture == "rfdetr":  # a 2-block ViT with 4-px patches: enough cells for 300 queries at 112 px
        vit = {"backbone": "dinov2_windowed", "vit.width": 32, "vit.depth": 2, "vit.heads": 2, "vit.mlp_dim": 128,
               "vit.out_indices": "[1,2]", "vit.patch_size": 4, "vit.position_size": 112, "projector_blocks": 1}
        return [*(f"--model.detr.{name}={value}" for name, value in vit.items()), "--data.square_size=112",
                *(["--data.multi_scale=[112]"] if printed["data"].get("multi_scale") else [])]
    return [f"--model.detr.backbone={'resnet50' if printed['model']['detr'].get('dilation') else 'resnet18'}"]


def _flat(group: dict) -> dict:
    """One group of a printed config with its nested dicts' keys dotted: {"detr.backbone": ..., "lr": ...}."""
    flat = {}
    for key, value in group.items():
        if isinstance(value, dict) and "class_path" not in value:
            flat.update({f"{key}.{inner}": item for inner, item in value.items()})
        else:
            flat[key] = value
    return flat


@pytest.mark.parametrize(("name", "preset"), [
    ("rfdetr_base_coco.yaml", "rfdetr_base"), ("dfine_s_coco.yaml", "dfine_s"), ("dfine_n_coco.yaml", "dfine_n"),
    ("dfine_m_coco.yaml", "dfine_m"), ("dfine_l_coco.yaml", "dfine_l"), ("dfine_x_coco.yaml", "dfine_x"),
    ("deim_dfine_s_coco.yaml", "deim_dfine_s"), ("rtdetr_r50vd_coco.yaml", "rtdetr_r50vd"),
    ("rtdetr_r18vd_coco.yaml", "rtdetr_r18vd"),
])
def test_a_config_naming_a_preset_resolves_to_the_preset(name: str, preset: str, capsys) -> None:
    """The COCO configs of a released size name its preset (``model.detr: dfine_n``): what they train is the
    preset's model, field by field (num_classes, linked from the data, left at its default)."""
    assert config_from_dict(_printed(capsys, REPO / "configs" / name)["model"]["detr"]) == preset_config(preset)


def test_the_model_configs_and_their_base_exist() -> None:
    names = {path.name for path in CONFIGS}
    assert {"detr_coco.yaml", *MODEL_CONFIGS, "finetune_custom.yaml", "demo_shapes_cpu.yaml"} <= names


@pytest.mark.parametrize("name", MODEL_CONFIGS + ["finetune_custom.yaml"])
def test_overlays_change_the_base_only_where_they_say(name: str, capsys) -> None:
    """A model config alone = the base with its own keys; stacked on the base (``--config detr_coco.yaml
    --config X``) it gives the same configuration."""
    base, alone = _printed(capsys, BASE), _printed(capsys, REPO / "configs" / name)
    assert _printed(capsys, BASE, REPO / "configs" / name) == alone
    own = {key for key in yaml.safe_load((REPO / "configs" / name).read_text()) if key != "config"}
    for group in ("trainer", "model", "data"):
        base_group, alone_group = _flat(base[group]), _flat(alone[group])
        for key in set(base_group) | set(alone_group):
            if f"{group}.{key}" not in own:
                assert alone_group.get(key) == base_group.get(key), f"{name}: {group}.{key}"
    assert alone["trainer"]["default_root_dir"] == f"outputs/{Path(name).stem}"


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_coco_configs_run_on_one_machine_with_the_authors_recipe(name: str, capsys) -> None:
    printed = _printed(capsys, REPO / "configs" / name)
    trainer, model, data = printed["trainer"], printed["model"], printed["data"]
    assert (trainer["accelerator"], trainer["devices"], trainer["num_nodes"]) == ("auto", "auto", 1)
    optimizer = OptimizerRecipe(**model["optimizer"]).over(DETR_RECIPE.optimizer)  # unset: the family's
    recipe = (optimizer.lr, optimizer.lr_backbone, optimizer.weight_decay, optimizer.lr_drop_epochs)
    assert recipe == (1e-4, 1e-5, 1e-4, [400])
    assert LossRecipe(**model["loss"]).over(DETR_RECIPE.loss) == DETR_RECIPE.loss
    assert model["detr"]["backbone"] == ("resnet101" if "r101" in name else "resnet50")
    assert model["detr"]["dilation"] == ("dc5" in name)
    assert (model["detr"]["hidden_dim"], model["detr"]["num_queries"]) == (256, 100)
    # the authors' images per GPU: 64 = 2 × 8 GPUs × 4 nodes, or 1 × 8 × 8 for DC5
    assert data["batch_size"] == data["val_batch_size"] == (1 if "dc5" in name else 2)
    assert trainer["gradient_clip_val"] == 0.1 and trainer["precision"] == "32-true"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_config_trains_a_step_and_writes_only_under_default_root_dir(
    config: Path, tiny_shapes: Path, tmp_path: Path, monkeypatch, capsys, request
) -> None:
    printed = _printed(capsys, config)  # --print_config works, and what every config holds:
    assert (printed["trainer"]["gradient_clip_val"], printed["trainer"]["gradient_clip_algorithm"]) == (0.1, "norm")
    assert "num_classes" not in printed["model"]["detr"]  # linked from the data, never configured
    callbacks = [callback["class_path"] for callback in printed["trainer"]["callbacks"]]
    assert "lightning.pytorch.callbacks.ModelCheckpoint" in callbacks
    backbone = _tiny_backbone(printed)
    data_root = tiny_shapes if "shapes" in config.name else COCO_MINI
    if printed["data"].get("keypoints"):  # a keypoint model trains only on data with its keypoints
        data_root = request.getfixturevalue("tiny_keypoint_shapes")
    workdir, run_dir = tmp_path / "cwd", tmp_path / "runs" / "one"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    tiny = [arg for arg in TINY if not (arg.startswith("--model.detr.num_encoder_layers")  # no such option there
                                        and printed["model"]["detr"]["family"] == "rfdetr")]
    main(["fit", "--config", str(config), *tiny, *backbone, f"--data.root={data_root}",
          f"--trainer.default_root_dir={run_dir}"])

    assert not list(workdir.iterdir())  # no lightning_logs/, outputs/ or checkpoints beside the user
    with (run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert any(row.get("train/loss") for row in rows) and any(row.get("val/AP") for row in rows)
    assert list(run_dir.glob("events.out.tfevents*"))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "evaluation" / "val_predictions.json").is_file()
    assert list((run_dir / "val_images").glob("*.png"))


def test_validate_and_predict_write_beside_the_fit_not_over_it(tiny_shapes: Path, tmp_path: Path, monkeypatch) -> None:
    """``detr validate`` / ``predict`` of a run's checkpoint, with the run's config, write into the run's
    validate/ and predict/ subfolders and leave the fit's metrics.csv and config.yaml alone."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    args = ["--config", str(REPO / "configs" / "demo_shapes_cpu.yaml"), *TINY, "--model.detr.backbone=resnet18",
            f"--data.root={tiny_shapes}", f"--trainer.default_root_dir={run_dir}"]
    main(["fit", *args])
    fit_metrics, fit_config = (run_dir / "metrics.csv").read_text(), (run_dir / "config.yaml").read_text()
    checkpoint = f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    main(["validate", *args, checkpoint])
    main(["predict", *args, checkpoint, f"--data.predict_images={tiny_shapes / 'val2017'}"])

    assert (run_dir / "metrics.csv").read_text() == fit_metrics
    assert (run_dir / "config.yaml").read_text() == fit_config
    with (run_dir / "validate" / "metrics.csv").open() as file:
        assert any(row.get("val/AP") for row in csv.DictReader(file))
    assert (run_dir / "validate" / "evaluation" / "val_predictions.json").is_file()
    assert (run_dir / "predict" / "predictions.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_the_deformable_coco_config_has_the_authors_recipe(capsys) -> None:
    printed = _printed(capsys, REPO / "configs" / "deformable_detr_coco.yaml")
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    detr = model["detr"]
    assert (detr["family"], detr["class_head"], detr["num_queries"], detr["dim_feedforward"]) == (
        "deformable", "sigmoid", 300, 1024)
    assert (detr["num_feature_levels"], detr["num_points"], detr["backbone"]) == (4, 4, "resnet50")
    assert (model["lr"], model["lr_backbone"], model["weight_decay"], model["lr_drop_epochs"]) == (2e-4, 2e-5, 1e-4, [40])
    assert (model["cost_class"], model["loss_ce"], model["cost_bbox"], model["loss_giou"]) == (2.0, 2.0, 5.0, 2.0)
    assert trainer["max_epochs"] == 50 and trainer["gradient_clip_val"] == 0.1 and data["batch_size"] == 2


def test_the_cpu_finetune_config_trains_on_coco_mini_at_its_image_size(tmp_path: Path) -> None:
    """configs/finetune_custom_cpu.yaml: the fine-tuning recipe at data.image_size 384 (the authors' sizes
    scaled from 800) with a loader worker; two steps on coco-mini with a tiny transformer, and the checkpoint
    records the evaluation size the Predictor will use (384, long side 640), not the authors' 800 / 1333."""
    from detr.checkpoints import read_checkpoint

    run_dir = tmp_path / "run"
    tiny_model = [arg for arg in TINY if arg.startswith("--model.")]
    main(["fit", "--config", str(REPO / "configs" / "finetune_custom_cpu.yaml"), *tiny_model,
          "--model.detr.backbone=resnet18", f"--data.root={COCO_MINI}", f"--trainer.default_root_dir={run_dir}",
          "--trainer.max_steps=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])
    with (run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert max(int(row["step"]) for row in rows if row.get("train/loss")) == 1  # steps 0 and 1
    assert any(row.get("val/AP") for row in rows)
    assert read_checkpoint(str(run_dir / "checkpoints" / "last.ckpt")).meta.eval_size == (384, 640)


@pytest.mark.parametrize("name", ["rtdetr_r18vd_coco.yaml", "rtdetr_r50vd_coco.yaml"])
def test_rtdetr_coco_configs_hold_the_authors_recipe(name: str, capsys) -> None:
    printed = _printed(capsys, REPO / "configs" / name)
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    recipe = (model["lr"], model["lr_backbone"], model["weight_decay"], model["warmup_steps"], trainer["max_epochs"])
    assert recipe == (1e-4, 1e-5, 1e-4, 2000, 72)
    assert (model["cost_class"], model["loss_ce"], model["loss_bbox"], model["loss_giou"]) == (2.0, 1.0, 5.0, 2.0)
    detector = model["detr"]
    assert (detector["family"], detector["num_queries"], detector["denoising"]) == ("rtdetr", 300, True)
    assert detector["num_decoder_layers"] == (3 if "r18" in name else 6)
    assert (data["square_size"], data["normalize"], data["batch_size"]) == (640, False, 4)  # 4 × 4 GPUs = 16
    # RT-DETRv2's include/dataloader.yml: the random operations and the multi-scale batches stop for epoch 71 of 72
    assert (data["augmentation"], data["augmentation_stop_epoch"]) == ("rtdetr", 71)
    assert data["multi_scale"] == [480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768, 800]
    (ema,) = [c for c in trainer["callbacks"] if c["class_path"].endswith("ExponentialMovingAverage")]
    assert (ema["init_args"]["decay"], ema["init_args"]["warmup_steps"]) == (0.9999, 2000)


def test_the_dfine_coco_config_holds_the_authors_recipe(capsys) -> None:
    printed = _printed(capsys, REPO / "configs" / "dfine_s_coco.yaml")
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    recipe = (model["lr"], model["lr_backbone"], model["weight_decay"], model["warmup_steps"], trainer["max_epochs"])
    assert recipe == (2e-4, 1e-4, 1e-4, 500, 132)  # dfine_hgnetv2_s_coco.yml (its include's 2.5e-4 overridden)
    weights = tuple(model[name] for name in ("cost_class", "loss_ce", "loss_bbox", "loss_giou", "loss_fgl", "loss_ddf"))
    assert weights == (2.0, 1.0, 5.0, 2.0, 0.15, 1.5) and not model["matchability"]
    detector = model["detr"]
    assert (detector["family"], detector["backbone"], detector["num_queries"]) == ("dfine", "hgnetv2_b0", 300)
    assert (detector["num_decoder_layers"], detector["decoder"]["num_points_per_level"]) == (3, [3, 6, 3])
    assert (data["square_size"], data["normalize"], data["batch_size"]) == (640, False, 8)  # 8 × 4 GPUs = 32
    # the authors' generate_scales(640, base_size_repeat=20) and stop epoch 120 (dfine_hgnetv2_s_coco.yml)
    assert (data["augmentation"], data["augmentation_stop_epoch"]) == ("rtdetr", 120)
    assert data["multi_scale"] == [480, 512, 544, 576, 608] + [640] * 20 + [672, 704, 736, 768, 800]
    (ema,) = [c for c in trainer["callbacks"] if c["class_path"].endswith("ExponentialMovingAverage")]
    assert (ema["init_args"]["decay"], ema["init_args"]["warmup_steps"]) == (0.9999, 1000)


@pytest.mark.parametrize(("name", "sizes", "recipe", "multi_scale"), [
    # (backbone, lab, norm, levels, hidden, encoder width, decoder layers, expansion, depth, points, reg_scale),
    # (lr, backbone lr, weight decay, epochs, stop, batch), the 640 repeats (None: no multi-scale batches)
    ("dfine_n_coco.yaml", ("hgnetv2_b0", True, "batch_norm", 2, 128, None, 3, 0.34, 0.5, [6, 6], 4.0),
     (8e-4, 4e-4, 1e-4, 160, 148, 32), None),
    ("dfine_m_coco.yaml", ("hgnetv2_b2", True, "batch_norm", 3, 256, None, 4, 1.0, 0.67, [3, 6, 3], 4.0),
     (2e-4, 2e-5, 1e-4, 132, 120, 8), 6),
    ("dfine_l_coco.yaml", ("hgnetv2_b4", False, "frozen_batch_norm", 3, 256, None, 6, 1.0, 1.0, [3, 6, 3], 4.0),
     (2.5e-4, 1.25e-5, 1.25e-4, 80, 72, 8), 4),
    ("dfine_x_coco.yaml", ("hgnetv2_b5", False, "frozen_batch_norm", 3, 256, 384, 6, 1.0, 1.0, [3, 6, 3], 8.0),
     (2.5e-4, 2.5e-6, 1.25e-4, 80, 72, 8), 3),
])
def test_the_dfine_size_configs_hold_the_authors_recipes(name: str, sizes: tuple, recipe: tuple,
                                                         multi_scale: int | None, capsys) -> None:
    """Peterande/D-FINE configs/dfine/dfine_hgnetv2_{n,m,l,x}_coco.yml over their includes."""
    printed = _printed(capsys, REPO / "configs" / name)
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    detector = model["detr"]
    detector = {**detector, **detector["decoder"]}  # D-FINE's decoder record's fields beside the others
    assert tuple(detector[key] for key in ("backbone", "backbone_learnable_affine", "backbone_norm",
                                           "num_feature_levels", "hidden_dim", "encoder_hidden_dim",
                                           "num_decoder_layers", "csp_expansion", "csp_depth_multiplier",
                                           "num_points_per_level", "reg_scale")) == sizes
    assert (model["lr"], model["lr_backbone"], model["weight_decay"], trainer["max_epochs"],
            data["augmentation_stop_epoch"], data["batch_size"]) == recipe
    expected = None if multi_scale is None else [480, 512, 544, 576, 608] + [640] * multi_scale + [672, 704, 736,
                                                                                                    768, 800]
    assert data["multi_scale"] == expected and data["augmentation"] == "rtdetr"


def test_the_deim_config_holds_the_authors_recipe(capsys) -> None:
    """Intellindust/DEIM configs/deim_dfine/deim_hgnetv2_s_coco.yml over base/deim.yml: D-FINE S with DEIM's SiLU
    decoder and FlatCosine schedule, MAL, the dense one-to-one policy [4, 64, 120] with mosaic and MixUp at 0.5."""
    printed = _printed(capsys, REPO / "configs" / "deim_dfine_s_coco.yaml")
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    assert (model["lr"], model["lr_backbone"], model["weight_decay"], model["warmup_steps"], trainer["max_epochs"]) == (
        4e-4, 2e-4, 1e-4, 2000, 132)
    flat_cosine = (model["lr_flat_cosine_epochs"], model["lr_flat_cosine_gamma"], model["lr_drop_epochs"])
    assert flat_cosine == ([64, 120], 0.5, [])
    assert model["matchability"] and (model["cost_class"], model["cost_bbox"], model["cost_giou"]) == (2.0, 5.0, 2.0)
    assert (model["detr"]["family"], model["detr"]["backbone"]) == ("dfine", "hgnetv2_b0")
    assert (model["detr"]["decoder"]["activation"], model["detr"]["decoder"]["mlp_activation"]) == ("silu", "silu")
    assert (data["augmentation"], data["mosaic_epochs"], data["mosaic_prob"], data["augmentation_stop_epoch"]) == (
        "deim", [4, 64], 0.5, 120)
    assert (data["mixup_prob"], data["mixup_epochs"], data["square_size"]) == (0.5, [4, 64], 640)


def test_the_dfine_finetune_config_is_the_s_recipe_with_the_benchmarks_defaults(capsys) -> None:
    """configs/dfine_finetune_custom.yaml: D-FINE S's model and learning rates, one device, and what
    benchmarks/finetune.py chose: class rows by name, augmentations to the end, no EMA, a short warm-up and the
    final linear decay."""
    coco = _printed(capsys, REPO / "configs" / "dfine_s_coco.yaml")
    printed = _printed(capsys, REPO / "configs" / "dfine_finetune_custom.yaml")
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    assert model["detr"] == coco["model"]["detr"] and (model["lr"], model["lr_backbone"]) == (2e-4, 1e-4)
    assert (trainer["devices"], trainer["max_epochs"]) == (1, 50)
    # the warm-up a share of the run (15 %: the measured 50 of about 350 steps), in place of D-FINE's 500 steps
    assert (model["init_classes"], model["warmup_fraction"], model["lr_decay_fraction"], model["lr_drop_epochs"]) == (
        "by_name", 0.15, 0.3, [])
    assert (data["augmentation"], data["augmentation_stop_epoch"]) == ("rtdetr", None)
    assert not [c for c in trainer["callbacks"] if c["class_path"].endswith("ExponentialMovingAverage")]
    assert len(trainer["callbacks"]) == len(coco["trainer"]["callbacks"]) - 1


#: family → its fine-tuning config and the COCO config it builds on (RF-DETR's is the authors' own recipe:
#: RFDETRBase().train(), tested below with its COCO config)
FINETUNE_CONFIGS = {"detr": ("finetune_custom.yaml", "detr_coco.yaml"),
                    "deformable": ("deformable_finetune_custom.yaml", "deformable_detr_coco.yaml"),
                    "rtdetr": ("rtdetr_finetune_custom.yaml", "rtdetr_r18vd_coco.yaml"),
                    "dfine": ("dfine_finetune_custom.yaml", "dfine_s_coco.yaml"),
                    "deimv2": ("deimv2_finetune_custom.yaml", None),
                    "rfdetr": ("rfdetr_finetune_custom.yaml", "rfdetr_base_coco.yaml")}


def test_every_family_that_trains_has_a_finetuning_config() -> None:
    from detr.models.family import families

    trained = {family.name for family in families() if family.recipe is not None
               and family.builder.__module__.startswith("detr.")}
    assert trained == set(FINETUNE_CONFIGS)


@pytest.mark.parametrize("family", [name for name in FINETUNE_CONFIGS if name != "rfdetr"])
def test_finetuning_configs_share_the_small_data_schedule(family: str, capsys) -> None:
    """Each family's fine-tuning config: its family's model, one device, class rows by name, the warm-up and the
    final linear decay as shares of the run (so that a short run is never all warm-up), no drop, no EMA, the
    augmentations to the end of the run; the COCO config's learning rates where it has one (DEIMv2 N: the
    authors' deimv2_hgnetv2_n_coco.yml, 8e-4 and 4e-4)."""
    name, coco_name = FINETUNE_CONFIGS[family]
    printed = _printed(capsys, REPO / "configs" / name)
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    assert model["detr"]["family"] == family and trainer["devices"] == 1
    assert (model["init_classes"], model["warmup_fraction"], model["lr_decay_fraction"], model["lr_drop_epochs"],
            model["lr_flat_cosine_epochs"]) == ("by_name", 0.15, 0.3, [], [])
    assert not [c for c in trainer["callbacks"] if c["class_path"].endswith("ExponentialMovingAverage")]
    assert data["augmentation_stop_epoch"] is None
    if coco_name is None:
        assert (model["lr"], model["lr_backbone"]) == (8e-4, 4e-4)
    else:
        coco = _resolved(_printed(capsys, REPO / "configs" / coco_name)["model"])
        assert (model["lr"], model["lr_backbone"]) == (coco["lr"], coco["lr_backbone"])
        ours, theirs = ({k: v for k, v in m["detr"].items() if k != "pretrained_backbone"} for m in (model, coco))
        assert ours == theirs  # the checkpoint holds the backbone's weights: no ImageNet weights read first


@pytest.mark.parametrize("name", ["rtdetr_shapes_cpu.yaml", "dfine_shapes_cpu.yaml", "rfdetr_shapes_cpu.yaml"])
def test_the_real_time_shapes_configs_train_with_flips_only(name: str, capsys) -> None:
    data = _printed(capsys, REPO / "configs" / name)["data"]
    assert (data["augmentation"], data["multi_scale"], data["augmentation_stop_epoch"]) == ("default", None, None)


def test_the_rfdetr_coco_config_holds_the_authors_recipe(capsys) -> None:
    """roboflow/rf-detr's RFDETRBaseConfig and TrainConfig (config.py), main.py's clipping and get_param_dicts.py's
    decays; and the fine-tuning config is the same recipe on one device."""
    printed = _printed(capsys, REPO / "configs" / "rfdetr_base_coco.yaml")
    trainer, model, data = printed["trainer"], _resolved(printed["model"]), printed["data"]
    recipe = (model["lr"], model["lr_backbone"], model["lr_layer_decay"], model["lr_component_decay"],
              model["weight_decay"], model["warmup_steps"], model["lr_drop_epochs"], trainer["max_epochs"])
    assert recipe == (1e-4, 1.5e-4, 0.8, 0.7, 1e-4, 0, [], 100)
    assert (model["cost_class"], model["cost_bbox"], model["cost_giou"]) == (2.0, 5.0, 2.0)
    assert (model["loss_ce"], model["loss_bbox"], model["loss_giou"], model["focal_alpha"]) == (1.0, 5.0, 2.0, 0.25)
    detector = model["detr"]
    assert (detector["family"], detector["num_queries"], detector["query_groups"]) == ("rfdetr", 300, 13)
    vit = detector["vit"]
    assert (vit["width"], vit["depth"], vit["out_indices"]) == (384, 12, [2, 5, 8, 11])
    assert (vit["patch_size"], vit["num_windows"], detector["num_decoder_layers"]) == (14, 4, 3)
    assert (detector["num_points"], detector["cross_attention_heads"], detector["dropout"]) == (2, 16, 0.0)
    # batch 4 × 4 accumulated per device; clipping 0.1
    assert (data["batch_size"], trainer["accumulate_grad_batches"], trainer["gradient_clip_val"]) == (4, 4, 0.1)
    # 560 × 560 with ImageNet's mean and std; compute_multi_scale_scales(560, expanded_scales=True, 14, 4)
    assert (data["square_size"], data["normalize"], data["augmentation"]) == (560, True, "rfdetr")
    assert data["multi_scale"] == [56 * k for k in range(5, 16)]
    (ema,) = [c for c in trainer["callbacks"] if c["class_path"].endswith("ExponentialMovingAverage")]
    assert (ema["init_args"]["decay"], ema["init_args"]["warmup_steps"]) == (0.993, 100)
    finetune = _printed(capsys, REPO / "configs" / "rfdetr_finetune_custom.yaml")
    assert finetune["model"] == printed["model"] and finetune["data"] == data and finetune["trainer"]["devices"] == 1
