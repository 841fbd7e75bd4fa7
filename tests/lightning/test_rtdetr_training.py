"""RT-DETR through `detr fit`: configs/rtdetr_shapes_cpu.yaml with a tiny model trains (the loss falls on a few
images), logs the encoder-proposal and denoising terms, and its checkpoint loads with detr.load_checkpoint and
predicts under the family's input contract; data that does not follow that contract is refused. `detr validate`
of a tiny checkpoint on data/coco-mini writes its COCO results (the top (query, class) pairs) and the error
analysis of them."""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from detr import Predictor, load_checkpoint
from detr.models.rtdetr.config import RTDETRConfig
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.lightning.cli import main
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.lightning.system import SettingError
from detr.models.recipe import OptimizerRecipe
from tests.helpers import RecordTrainingBatches, tiny_square_fit_args, write_tiny_shapes
from tests.helpers_realtime import tiny_model

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"
CONFIG = REPO / "configs" / "rtdetr_shapes_cpu.yaml"
TINY_RTDETR = ["--model.detr.hidden_dim=32", "--model.detr.num_heads=2", "--model.detr.num_decoder_layers=2",
               "--model.detr.dim_feedforward=64", "--model.detr.num_queries=10", "--model.detr.num_points=2"]

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory) -> Path:
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2, seed=3)


def _fit_args(data_root: Path, out_dir: Path, *extra: str) -> list[str]:
    return tiny_square_fit_args(CONFIG, TINY_RTDETR, data_root, out_dir, *extra)


def test_fit_trains_and_the_checkpoint_predicts(tiny_shapes: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    main(_fit_args(tiny_shapes, run, "--trainer.max_steps=30", "--trainer.check_val_every_n_epoch=30",
                   "--model.optimizer.warmup_steps=0", "--model.optimizer.lr_decay_fraction=0",
                   "--model.optimizer.lr=1e-3",
                   "--model.optimizer.lr_backbone=1e-3"))
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 30
    assert sum(losses[-5:]) < sum(losses[:5])  # the same 4 images (flipped or not) 30 times: it learns them
    logged = rows[0].keys()
    for name in ("train/loss_ce_enc", "train/loss_ce_dn", "train/loss_bbox_dn_0", "train/loss_giou_0"):
        assert name in logged, name

    model = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert model.config.family == "rtdetr" and model.config.denoising
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean) == ("square", 64, None)
    predictor = Predictor(model, threshold=0.0)
    image = sorted((tiny_shapes / "val2017").iterdir())[0]
    (prediction,) = predictor.predict([image])
    assert len(prediction.scores) == model.num_queries  # the top (query, class) pairs, as many as queries
    assert torch.isfinite(torch.as_tensor(prediction.boxes)).all()


def test_data_outside_the_input_contract_is_refused(tiny_shapes: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="--data.normalize false") as error:
        main(_fit_args(tiny_shapes, tmp_path / "run", "--data.normalize=true", "--trainer.max_steps=1"))
    assert "\n" not in str(error.value)


def test_the_system_trains_the_resnet_vd_at_the_backbone_rate_in_its_own_layout() -> None:
    from detr.lightning import DetrSystem


    config = RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=2, dim_feedforward=64,
                          num_decoder_layers=2, num_queries=10, num_classes=3, num_points=2, denoising=True,
                          backbone_norm="batch_norm", dropout=0.1, num_encoder_layers=6, num_feature_levels=4)
    system = DetrSystem(detr=config, optimizer=OptimizerRecipe(lr=1e-4, lr_backbone=1e-5, warmup_steps=0),
                        runtime=RuntimeOptions(channels_last=True, backbone_bf16=True),
                        evaluation=EvaluationOptions(evaluation_dir=""))
    (optimizer,), _ = system.configure_optimizers()
    groups = {group["name"]: group for group in optimizer.param_groups}
    model = system.model
    # the authors' groups, by name: the backbone but its norms at lr_backbone, the encoder's and decoder's
    # norms without weight decay, the rest (the backbone's trainable norms included) at lr
    named = dict(model.named_parameters())
    expected = {"backbone": {n for n in named if n.startswith("backbone.") and ".norm." not in n},
                "norms": {n for n in named if n.split(".")[0] in ("encoder", "decoder")
                          and isinstance(model.get_submodule(n.rsplit(".", 1)[0]),
                                         (torch.nn.BatchNorm2d, torch.nn.LayerNorm))}}
    expected["transformer"] = set(named) - expected["backbone"] - expected["norms"]
    names = {id(p): n for n, p in named.items()}
    assert {name: {names[id(p)] for p in group["params"]} for name, group in groups.items()} == expected
    assert any(".norm." in n for n in expected["transformer"])  # R18-vd's trainable BatchNorms
    assert (groups["backbone"]["lr"], groups["transformer"]["lr"], groups["norms"]["lr"]) == (1e-5, 1e-4, 1e-4)
    assert (groups["norms"]["weight_decay"], groups["transformer"]["weight_decay"]) == (0.0, 1e-4)
    assert model.autocast_dtype == torch.bfloat16 and system.model.backbone.channels_last
    assert system.model.backbone.conv1.conv1_1.conv.weight.is_contiguous(memory_format=torch.channels_last)
    system.model.train()
    features = system.model.backbone(torch.rand(1, 3, 64, 64))
    assert all(feature.dtype == torch.float32 for feature in features)  # bf16 convolutions, float32 maps out


def test_the_authors_augmentations_stop_at_their_epoch_in_a_fit(tiny_shapes: Path, tmp_path: Path) -> None:
    """Two epochs with the authors' augmentations and multi-scale batches stopped at epoch 1, a loader worker per
    epoch: the first epoch's batches take the multi-scale sides, the second's are at the square, every image the
    plain flip and resize of its file."""
    record = tmp_path / "batches.jsonl"
    main(_fit_args(tiny_shapes, tmp_path / "run", "--data.batch_size=2", "--data.num_workers=1",
                   "--data.augmentation=rtdetr", "--data.multi_scale=[96, 128]", "--data.augmentation_stop_epoch=1",
                   "--trainer.max_epochs=2", "--trainer.limit_val_batches=1",
                   f"--trainer.callbacks+={RecordTrainingBatches.__module__}.RecordTrainingBatches",
                   f"--trainer.callbacks.path={record}"))
    batches = [json.loads(line) for line in record.read_text().splitlines()]
    assert [batch["epoch"] for batch in batches] == [0, 0, 1, 1]
    assert {batch["side"] for batch in batches if batch["epoch"] == 0} <= {96, 128}
    assert all(batch["side"] == 64 and batch["plain"] == batch["images"] for batch in batches if batch["epoch"] == 1)


def _validate_coco_mini_with_an_80_class_checkpoint(tmp_path: Path, category_ids: str, *, rename: str | None = None
                                                    ) -> tuple[torch.nn.Module, Path]:
    """`detr validate` of a tiny 80-class RT-DETR given as init_checkpoint on coco-mini → (model, run folder);
    ``rename``: a class the checkpoint records under another name ("xx" prefixed)."""
    ground_truth = json.loads((COCO_MINI / "annotations" / "instances_val2017.json").read_text())
    categories = CategoryMap.from_coco_categories(ground_truth["categories"], contiguous=True)  # RT-DETR's 80
    model = tiny_model("rtdetr", category_map=categories)
    if rename is not None:
        names = tuple("xx" + name if name == rename else name for name in categories.names)
        model.meta = model.meta.replace(category_map=CategoryMap(categories.category_ids, names))
    checkpoint = save_checkpoint(model, tmp_path / "rtdetr.ckpt")
    tiny = tmp_path / "tiny.yaml"  # the checkpoint's model; the number of classes comes from the data
    tiny.write_text(yaml.safe_dump({"model": {"detr": {key: value for key, value in model.config.to_dict().items()
                                                       if key != "num_classes"}}}))
    run = tmp_path / "run"
    main(["validate", "--config", str(CONFIG), "--config", str(tiny), f"--data.root={COCO_MINI}",
          f"--data.category_ids={category_ids}", "--data.square_size=160", "--data.val_batch_size=10",
          f"--model.init_checkpoint={checkpoint}", f"--trainer.default_root_dir={run}",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])
    return model, run


def test_validate_refuses_a_checkpoint_that_does_not_know_a_class_of_the_data(tmp_path: Path) -> None:
    """Scoring a freshly initialised class row would print an AP of nothing for it: refused, the class named."""
    with pytest.raises(SettingError, match="not trained on 1 of the data's classes \\('person'\\)"):
        _validate_coco_mini_with_an_80_class_checkpoint(tmp_path, "contiguous", rename="person")


def test_validate_takes_the_checkpoint_classes_by_name_under_other_labels(tmp_path: Path) -> None:
    """COCO's raw ids (91 labels, 11 unused) against an 80-class head: each class takes its row by name, so the
    scores are those of the contiguous labels that fit the head as it is."""
    _validate_coco_mini_with_an_80_class_checkpoint(tmp_path / "raw", "raw")
    _validate_coco_mini_with_an_80_class_checkpoint(tmp_path / "contiguous", "contiguous")
    raw, contiguous = ([(row["image_id"], row["category_id"], round(row["score"], 5),
                         [round(v, 3) for v in row["bbox"]])
                        for row in json.loads((tmp_path / name / "run" / "validate" / "evaluation" /
                                               "val_predictions.json").read_text())]
                       for name in ("raw", "contiguous"))
    assert len(raw) == 600 and sorted(raw) == sorted(contiguous)  # the same detections, classes and scores


def test_validate_on_coco_mini_writes_results_and_their_error_analysis(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="detr.lightning.system"):
        model, run = _validate_coco_mini_with_an_80_class_checkpoint(tmp_path, "contiguous")
    assert "stays freshly initialised" not in caplog.text  # every tensor of the checkpoint was loaded
    evaluation = run / "validate" / "evaluation"
    results = json.loads((evaluation / "val_predictions.json").read_text())
    per_image = Counter(row["image_id"] for row in results)
    assert len(per_image) == 50 and set(per_image.values()) == {model.num_queries}  # the top (query, class) pairs
    analysis = json.loads((evaluation / "val_analysis" / "analysis.json").read_text())
    assert (analysis["num_images"], analysis["num_detections"], analysis["num_objects"]) == (50, 600, 377)
    counts = analysis["errors"]["counts"]
    assert sum(counts[kind] for kind in ("cls", "loc", "both", "dupe", "bkg")) <= 600 and counts["missed"] <= 377
    metrics = json.loads((evaluation / "val_metrics.json").read_text())
    assert metrics["AP50"] == pytest.approx(analysis["stats"]["AP50"])
    assert (evaluation / "val_analysis" / "report.html").is_file()
