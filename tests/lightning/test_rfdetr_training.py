"""RF-DETR through `detr fit`: configs/rfdetr_shapes_cpu.yaml with a tiny model trains (the loss falls on a few
images) with Group DETR's groups and the encoder-proposal terms, an EMA of its weights is what the checkpoint holds,
and the checkpoint loads with detr.load_checkpoint and predicts one group's queries; the optimizer's groups are the
authors' (rf-detr's get_param_dicts.py: the ViT's layer-wise and component decays, no weight decay on its biases,
norms and embeddings); squares the ViT cannot take are refused before training. With instance masks
(configs/rfdetr_seg_shapes_cpu.yaml) the point-sampled mask terms of every layer train, validation logs mask AP and
``detr predict`` writes each detection's mask, which ``detr-analyze`` reads."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import torch

from detr import Predictor, load_checkpoint
from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.models.rtdetr.config import RTDETRConfig
from detr.checkpoints.rfdetr import to_huggingface_state_dict
from detr.commands import analyze as analyze_command
from detr.lightning.cli import main
from detr.lightning.options import EvaluationOptions
from detr.lightning.system import SettingError
from detr.models.recipe import OptimizerRecipe
from tests.helpers import tiny_square_fit_args, write_tiny_shapes

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "rfdetr_shapes_cpu.yaml"
SEG_CONFIG = REPO / "configs" / "rfdetr_seg_shapes_cpu.yaml"
TINY_RFDETR = ["--model.detr.vit_hidden_dim=32", "--model.detr.vit_num_layers=2", "--model.detr.vit_num_heads=2",
               "--model.detr.vit_out_indices=[1,2]", "--model.detr.vit_position_size=64", "--model.detr.hidden_dim=32",
               "--model.detr.num_heads=2", "--model.detr.cross_attention_heads=4", "--model.detr.num_decoder_layers=2",
               "--model.detr.dim_feedforward=64", "--model.detr.num_queries=10", "--model.detr.query_groups=3"]

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=3)


@pytest.fixture(scope="module")
def tiny_shapes_with_masks(tmp_path_factory) -> Path:
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    root = tmp_path_factory.mktemp("tiny_shapes_rle")
    write_shapes_dataset(root, ShapesConfig(num_train=4, num_val=2, image_size=64, min_object_size=16,
                                            max_object_size=32, seed=3, mask_format="rle"))
    return root


def _fit_args(data_root: Path, out_dir: Path, *extra: str) -> list[str]:
    return tiny_square_fit_args(CONFIG, TINY_RFDETR, data_root, out_dir, *extra)


def test_fit_with_instance_masks_trains_the_mask_terms_and_predicts_masks(tiny_shapes_with_masks: Path,
                                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = tiny_square_fit_args(SEG_CONFIG, [*TINY_RFDETR, "--model.detr.mask_dim_feedforward=16"],
                                tiny_shapes_with_masks, run, "--trainer.check_val_every_n_epoch=1")
    main([*args, "--trainer.max_steps=2"])
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    terms = [f"train/loss_mask_{kind}{suffix}" for kind in ("ce", "dice") for suffix in ("", "_0", "_enc")]
    logged = [float(row[name]) for row in rows for name in terms if row.get(name)]
    assert len(logged) == 2 * len(terms)  # every term at both steps
    assert all(math.isfinite(value) and value > 0 for value in logged)
    assert any(row.get("val/mask_AP") for row in rows) and any(row.get("val/AP") for row in rows)

    main(["predict", *args[1:], f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
          f"--data.predict_images={tiny_shapes_with_masks / 'val2017'}"])
    entries = json.loads((run / "predict" / "predictions.json").read_text())
    assert entries and all(entry["segmentation"]["size"] == [64, 64] for entry in entries)

    # detr-analyze reads the instance predictions (their boxes; the masks are scored by validation's mask AP)
    out = tmp_path / "analysis"
    assert analyze_command.main([str(tiny_shapes_with_masks / "annotations" / "instances_val2017.json"),
                                 str(run / "predict" / "predictions.json"), "--images",
                                 str(tiny_shapes_with_masks / "val2017"), "--out", str(out)]) == 0
    assert json.loads((out / "analysis.json").read_text())["num_images"] == 2 and (out / "report.html").is_file()


def test_fit_with_instance_masks_needs_the_datas_masks(tiny_shapes_with_masks: Path, tmp_path: Path) -> None:
    args = tiny_square_fit_args(SEG_CONFIG, TINY_RFDETR, tiny_shapes_with_masks, tmp_path / "run",
                                "--data.masks=false", "--trainer.max_steps=1")
    with pytest.raises(SettingError, match="--data.masks true") as error:
        main(args)
    assert "\n" not in str(error.value)


def test_fit_trains_with_an_ema_and_the_checkpoint_predicts(tiny_shapes: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    main(_fit_args(tiny_shapes, run, "--trainer.max_steps=20", "--trainer.check_val_every_n_epoch=20",
                   "--model.optimizer.warmup_steps=0", "--model.optimizer.lr_decay_fraction=0",
                   "--model.optimizer.lr=1e-3",
                   "--model.optimizer.lr_backbone=1e-3",
                   "--trainer.callbacks+=detr.lightning.callbacks.ExponentialMovingAverage",
                   "--trainer.callbacks.decay=0.9", "--trainer.callbacks.warmup_steps=5"))
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 20
    assert sum(losses[-5:]) < sum(losses[:5])  # the same 4 images (flipped or not) 20 times: it learns them
    for name in ("train/loss_ce_enc", "train/loss_giou_enc", "train/loss_ce_0", "train/loss_bbox_0"):
        assert name in rows[0].keys(), name

    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    average, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    key = "model.decoder.class_head.weight"
    assert not torch.equal(average[key], current[key])  # the checkpoint's weights are the average
    model = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert (model.config.family, model.config.query_groups) == ("rfdetr", 3)
    assert torch.equal(model.state_dict()["decoder.class_head.weight"], average[key])
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean is not None) == ("square", 64, True)
    (prediction,) = Predictor(model, threshold=0.0).predict([sorted((tiny_shapes / "val2017").iterdir())[0]])
    assert len(prediction.scores) == model.num_queries == 10  # one group's top (query, class) pairs
    assert torch.isfinite(torch.as_tensor(prediction.boxes)).all()


def test_squares_the_vit_cannot_take_are_refused(tiny_shapes: Path, tmp_path: Path) -> None:
    """patch 8 × 2 windows: sides must be multiples of 16."""
    with pytest.raises(SettingError, match="multiples of 16") as error:
        main(_fit_args(tiny_shapes, tmp_path / "run", "--data.square_size=72", "--trainer.max_steps=1"))
    assert "\n" not in str(error.value)
    with pytest.raises(SettingError, match=r"--data.multi_scale \[72\]"):
        main(_fit_args(tiny_shapes, tmp_path / "run", "--data.multi_scale=[64, 72]", "--trainer.max_steps=1"))


def _authors_rate(key: str, lr: float, lr_encoder: float, num_layers: int, weight_decay: float
                  ) -> tuple[float, float]:
    """(lr, weight decay) of one parameter by its key in the authors' layout, as roboflow/rf-detr's
    get_param_dicts.py and backbone.py compute them (lr_vit_layer_decay 0.8, lr_component_decay 0.7)."""
    if key.startswith("backbone.0.encoder"):
        layer_id = num_layers + 1
        if "embeddings" in key:
            layer_id = 0
        elif ".layer." in key:
            layer_id = int(key[key.find(".layer."):].split(".")[2]) + 1
        no_decay = any(word in key for word in ("gamma", "pos_embed", "rel_pos", "bias", "norm", "embeddings"))
        return lr_encoder * 0.8 ** (num_layers + 1 - layer_id) * 0.7 ** 2, 0.0 if no_decay else weight_decay
    if "transformer.decoder" in key:
        return lr * 0.7, weight_decay
    return lr, weight_decay


def test_the_optimizer_groups_are_the_authors() -> None:
    from detr.lightning import DetrSystem
    from detr.models.detr_family import DetrConfig

    config = RFDETRConfig(backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1, hidden_dim=32,
                          num_heads=2, cross_attention_heads=4, num_decoder_layers=2, dim_feedforward=64,
                          num_queries=10, query_groups=3, num_classes=3, dropout=0.1, num_points=4,
                          vit=WindowedViTSize(width=32, depth=4, heads=2, out_indices=(1, 2, 3), num_windows=2,
                                              patch_size=8, position_size=64, mlp_dim=128))
    system = DetrSystem(detr=config, optimizer=OptimizerRecipe(lr=1e-4, lr_backbone=1.5e-4, lr_layer_decay=0.8,
                                                               lr_component_decay=0.7, weight_decay=1e-4),
                        evaluation=EvaluationOptions(evaluation_dir=""))
    (optimizer,), _ = system.configure_optimizers()
    settings = {id(p): (group["lr"], group["weight_decay"]) for group in optimizer.param_groups for p in group["params"]}
    theirs = to_huggingface_state_dict(system.model)  # the authors' key of every tensor, in our order
    ours = dict(system.model.named_parameters())
    assert len(settings) == len(ours) == len(theirs)
    for (name, parameter), key in zip(ours.items(), theirs):
        expected = _authors_rate(key, 1e-4, 1.5e-4, num_layers=3 + 1, weight_decay=1e-4)
        assert settings[id(parameter)] == pytest.approx(expected, rel=1e-9), (name, key)
    rates = {group["name"]: group["lr"] for group in optimizer.param_groups}
    assert rates["decoder"] == pytest.approx(7e-5) and rates["backbone.depth0.no_decay"] == pytest.approx(7.35e-5)
    assert any(re.fullmatch(r"backbone\.depth5(\.no_decay)?", name) for name in rates)  # the embeddings: L + 1


def test_decays_a_model_has_nothing_for_are_refused() -> None:
    from detr.lightning import DetrSystem
    from detr.models.detr_family import DetrConfig

    config = RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=2, dim_feedforward=64,
                          num_decoder_layers=2, num_queries=10, num_classes=3, num_points=2, dropout=0.1,
                          num_encoder_layers=6, denoising=False, num_feature_levels=4)
    with pytest.raises(SettingError, match="--model.optimizer.lr_layer_decay=0.8: RTDETR has no backbone layer depths"):
        DetrSystem(detr=config, optimizer=OptimizerRecipe(lr_layer_decay=0.8))
    with pytest.raises(SettingError, match="--model.optimizer.lr_component_decay must be in"):
        DetrSystem(detr=config, optimizer=OptimizerRecipe(lr_component_decay=0.0))
