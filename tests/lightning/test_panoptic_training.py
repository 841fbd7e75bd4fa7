"""Panoptic training through Lightning, both stages of the authors' recipe on a tiny shapes-panoptic set: the
box stage fits and writes a checkpoint, the mask stage starts from it with the detector frozen, validation
logs PQ and mask AP, the checkpoints load with detr.load_checkpoint, bad data stops the run at start-up,
and every panoptic config starts and runs a step."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr import load_checkpoint
from detr.data.panoptic_checks import PanopticDataError
from detr.data.shapes import ShapesConfig
from detr.data.shapes_panoptic import write_shapes_panoptic
from detr.inference.predictor import Predictor
from detr.lightning.cli import make_cli, panoptic_main
from detr.lightning.panoptic_datamodule import PanopticDataModule
from detr.models.recipe import DETR_RECIPE, LossRecipe, OptimizerRecipe
from detr.models.segmentation import DETRPanoptic

REPO = Path(__file__).resolve().parents[2]
BOXES_CONFIG = REPO / "configs" / "demo_shapes_panoptic_boxes_cpu.yaml"
MASKS_CONFIG = REPO / "configs" / "demo_shapes_panoptic_cpu.yaml"

# hidden_dim 128 with 8 heads is the smallest model the mask head's GroupNorm(8) allows
TINY = [
    "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
    "--model.detr.hidden_dim=128", "--model.detr.num_heads=8", "--model.detr.num_encoder_layers=1",
    "--model.detr.num_decoder_layers=2", "--model.detr.dim_feedforward=64", "--model.detr.num_queries=8",
    "--data.batch_size=2", "--data.val_batch_size=2", "--data.num_workers=0", "--data.train_scales=[64]",
    "--data.train_max_size=64", "--data.crop_resize_scales=[64]", "--data.crop_min_size=64",
    "--data.crop_max_size=64", "--data.eval_min_size=64", "--data.eval_max_size=64",
]


pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes_panoptic")
    write_shapes_panoptic(root, ShapesConfig(num_train=4, num_val=2, image_size=64, min_object_size=12,
                                             max_object_size=32, max_objects=3, seed=3))
    return root


@pytest.fixture(scope="module")
def box_stage(shapes_root, tmp_path_factory) -> Path:
    """Stage 1 run folder (its checkpoints/last.ckpt is the mask stage's init_checkpoint)."""
    run = tmp_path_factory.mktemp("runs") / "boxes"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.argv", ["detr"])
        panoptic_main(["fit", "--config", str(BOXES_CONFIG), *TINY, f"--data.root={shapes_root}",
                       f"--trainer.default_root_dir={run}"])
    return run


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as file:
        return list(csv.DictReader(file))


def test_box_stage_trains_the_detector_on_things_and_stuff(box_stage):
    rows = _metrics(box_stage)
    assert any(row.get("train/loss") for row in rows) and any(row.get("val/AP") for row in rows)
    assert not any(row.get("val/PQ") for row in rows)  # no mask head yet
    checkpoint = torch.load(box_stage / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["detr"]["is_thing"] == [True] * 5 + [False]  # five shapes, one background stuff class
    assert not any(key.startswith("model.mask_head.") for key in checkpoint["state_dict"])


def test_mask_stage_freezes_the_detector_logs_pq_and_loads_back(box_stage, shapes_root, tmp_path):
    run = tmp_path / "masks"
    init = box_stage / "checkpoints" / "last.ckpt"
    panoptic_main(["fit", "--config", str(MASKS_CONFIG), *TINY, f"--data.root={shapes_root}",
                   f"--trainer.default_root_dir={run}", f"--model.init_checkpoint={init}"])
    rows = _metrics(run)
    values = {name: [float(row[name]) for row in rows if row.get(name)] for name in
              ("val/PQ", "val/SQ", "val/RQ", "val/PQ_th", "val/PQ_st", "val/mask_AP", "val/AP", "train/loss_dice")}
    assert all(values.values()), {name: bool(v) for name, v in values.items()}
    assert all(0.0 <= value <= 1.0 for value in values["val/PQ"] + values["val/mask_AP"])

    # the frozen detector is the box stage's, tensor for tensor (batch-norm statistics included)
    before = torch.load(init, weights_only=True)["state_dict"]
    after = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key, value in before.items():
        assert torch.equal(after[key.replace("model.", "model.detr.", 1)], value), key
    heads = [key for key in after if key.startswith(("model.mask_head.", "model.bbox_attention."))]
    assert heads

    # validate the run's checkpoint: into the run's validate/ folder, the same PQ as the fit's last validation
    panoptic_main(["validate", "--config", str(MASKS_CONFIG), *TINY, f"--data.root={shapes_root}",
                   f"--trainer.default_root_dir={run}", f"--model.init_checkpoint={init}",
                   f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    validated = [float(row["val/PQ"]) for row in _metrics(run / "validate") if row.get("val/PQ")]
    assert validated == pytest.approx(values["val/PQ"][-1:])

    model = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert isinstance(model, DETRPanoptic)
    assert list(model.meta.is_thing) == [True] * 5 + [False]
    assert model.meta.category_map.names[-1] == "background"
    for key, value in model.state_dict().items():
        assert torch.equal(value, after[f"model.{key}"]), key
    # the panoptic settings the run validated with travel with the checkpoint, and the Predictor uses them
    assert (model.meta.panoptic_threshold, model.meta.panoptic_overlap_threshold) == (0.2, 0.8)
    predictor = Predictor(model)
    assert (predictor.panoptic_threshold, predictor.panoptic_overlap_threshold) == (0.2, 0.8)
    predictor = Predictor(model, panoptic_threshold=0.5, panoptic_overlap_threshold=0.6)
    assert (predictor.panoptic_threshold, predictor.panoptic_overlap_threshold) == (0.5, 0.6)
    model.meta = model.meta.replace(panoptic_threshold=None, panoptic_overlap_threshold=None)  # e.g. the authors' files: their rules
    assert (Predictor(model).panoptic_threshold, Predictor(model).panoptic_overlap_threshold) == (0.85, None)


def test_mask_stage_step_changes_only_the_mask_head(box_stage, shapes_root):
    cli = make_cli(["--config", str(MASKS_CONFIG), *TINY, f"--data.root={shapes_root}",
                    f"--model.init_checkpoint={box_stage / 'checkpoints' / 'last.ckpt'}"], run=False, panoptic=True)
    system = cli.model
    system.train()
    trainable = {name for name, p in system.model.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith(("mask_head.", "bbox_attention.")) for name in trainable)
    assert not system.model.detr.backbone[0].body.bn1.training  # batch-norm statistics stay put
    detector = {k: v.clone() for k, v in system.model.detr.state_dict().items()}
    heads = {k: v.clone() for k, v in system.model.state_dict().items() if k.startswith("mask_head.")}
    optimizer = torch.optim.AdamW(system.parameter_groups(), lr=1e-3)
    cli.datamodule.setup("fit")
    batch = next(iter(cli.datamodule.train_dataloader()))
    images, mask, targets = batch
    losses = system.compute_losses(system(images, mask, targets), targets)
    assert {"loss_mask", "loss_dice"} <= set(losses)
    losses["loss"].backward()
    optimizer.step()
    assert all(torch.equal(value, system.model.detr.state_dict()[key]) for key, value in detector.items())
    assert any(not torch.equal(value, system.model.state_dict()[key]) for key, value in heads.items())


def test_mask_stage_refuses_a_box_model_of_other_classes(box_stage, shapes_root, tmp_path):
    checkpoint = torch.load(box_stage / "checkpoints" / "last.ckpt", weights_only=True)
    state = checkpoint["state_dict"]
    state["model.class_embed.weight"] = torch.zeros(9, state["model.class_embed.weight"].shape[1])
    state["model.class_embed.bias"] = torch.zeros(9)
    checkpoint["detr"]["category_map"] = None
    path = tmp_path / "other.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="does not fit the panoptic model"):
        panoptic_main(["fit", "--config", str(MASKS_CONFIG), *TINY, f"--data.root={shapes_root}",
                       f"--trainer.default_root_dir={tmp_path / 'run'}", f"--model.init_checkpoint={path}"])


# ---------------------------------------------------------------------- detr-panoptic predict
@pytest.fixture(scope="module")
def mask_stage(box_stage, shapes_root, tmp_path_factory) -> Path:
    """Stage 2 run folder, trained from the box stage's checkpoint."""
    run = tmp_path_factory.mktemp("runs") / "masks"
    panoptic_main(["fit", "--config", str(MASKS_CONFIG), *TINY, f"--data.root={shapes_root}",
                   f"--trainer.default_root_dir={run}", f"--model.init_checkpoint={box_stage / 'checkpoints' / 'last.ckpt'}"])
    return run


def test_predict_writes_coco_panoptic_pngs_and_json(mask_stage, shapes_root, tmp_path):
    """Plain images, the classes from the checkpoint: predictions.json, panoptic.json and one PNG per readable
    image whose ids are its segments (threshold 0: every pixel belongs to a segment); a broken file is
    reported (exit status 1) and left out, as tools/predict.py does."""
    from detr.inference.postprocess_masks import rgb_to_id_map

    images = tmp_path / "images"
    images.mkdir()
    for name in ("000000000001.jpg", "000000000002.jpg"):
        shutil.copy(shapes_root / "val2017" / name, images / name)
    (images / "broken.jpg").write_bytes(b"not an image")
    # the model's arguments come from --ckpt_path's hyperparameters, except what the command line sets
    checkpoint = mask_stage / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, weights_only=True)["hyper_parameters"]["panoptic_threshold"] > 0
    run = tmp_path / "run"
    status = panoptic_main(["predict", "--config", str(MASKS_CONFIG), *TINY, "--data.root=null",
                            f"--data.predict_images={images}", f"--ckpt_path={checkpoint}", "--model.panoptic_threshold", "0",
                            "--model.panoptic_overlap_threshold=null",  # the authors' rules: every pixel gets a segment
                            f"--trainer.default_root_dir={run}"])
    assert status == 1
    folder = run / "predict"
    detections = json.loads((folder / "predictions.json").read_text())
    assert {Path(d["file_name"]).name for d in detections} == {"000000000001.jpg", "000000000002.jpg"}
    panoptic = json.loads((folder / "panoptic.json").read_text())
    assert {c["id"]: c["isthing"] for c in panoptic["categories"]} == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 0}
    assert sorted(a["file_name"] for a in panoptic["annotations"]) == ["000000000001.png", "000000000002.png"]
    for annotation in panoptic["annotations"]:
        ids = rgb_to_id_map(torch.from_numpy(np.array(Image.open(folder / "panoptic" / annotation["file_name"]))))
        segments = annotation["segments_info"]
        assert segments and set(ids.unique().tolist()) == {s["id"] for s in segments}
        assert sum(s["area"] for s in segments) == ids.numel() == 64 * 64
        assert {s["category_id"] for s in segments} <= set(range(1, 7))


def test_predict_does_not_need_the_configs_data_root(mask_stage, shapes_root, tmp_path):
    """A config's data.root that does not exist here (the demo's data/shapes_panoptic on another machine) failed
    `detr-panoptic predict` with "data root ... does not exist", though predict reads only predict_images and
    the checkpoint's categories; training still names the missing root."""
    missing = tmp_path / "data" / "shapes_panoptic"
    data = PanopticDataModule(root=str(missing), predict_images=str(shapes_root / "val2017"), num_workers=0,
                              categories_from=str(mask_stage / "checkpoints" / "last.ckpt"))
    assert data.is_thing == [True] * 5 + [False]
    images, _, _ = next(iter(data.predict_dataloader()))
    assert images.dim() == 4
    with pytest.raises(ValueError, match=f"no train data: data root '{missing}' does not exist"):
        data.train_dataloader()
    with pytest.raises(ValueError, match=f"data root '{missing}' does not exist"):
        PanopticDataModule(root=str(missing), predict_images=str(shapes_root / "val2017"))  # no categories


# ---------------------------------------------------------------------- bad data, named at start-up
@pytest.fixture
def broken_root(shapes_root, tmp_path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    return root


def _data(root: Path) -> PanopticDataModule:
    return PanopticDataModule(root=str(root), batch_size=2, num_workers=0)


def test_a_missing_png_is_named_at_setup(broken_root):
    png = broken_root / "annotations" / "panoptic_val2017" / "000000000002.png"
    png.unlink()
    data = _data(broken_root)
    with pytest.raises(PanopticDataError, match=r"000000000002\.png' \(image 2\) does not exist"):
        data.setup("fit")


def test_a_segment_id_missing_from_its_png_is_named_at_setup(broken_root):
    json_path = broken_root / "annotations" / "panoptic_train2017.json"
    data = json.loads(json_path.read_text())
    data["annotations"][0]["segments_info"].append({"id": 4242, "category_id": 1, "iscrowd": 0, "area": 1,
                                                    "bbox": [0, 0, 1, 1]})
    json_path.write_text(json.dumps(data))
    with pytest.raises(PanopticDataError, match=r"segment ids \[4242\].*000000000001\.png") as error:
        _data(broken_root).setup("fit")
    assert "make_shapes.py --panoptic --force" in str(error.value)


def test_a_png_id_the_json_does_not_list_is_named(broken_root):
    png = broken_root / "annotations" / "panoptic_val2017" / "000000000001.png"
    rgb = np.asarray(Image.open(png).convert("RGB")).copy()
    rgb[0, 0] = (77, 0, 0)
    Image.fromarray(rgb).save(png)
    with pytest.raises(PanopticDataError, match=r"000000000001\.png' has segment ids \[77\]"):
        _data(broken_root).setup("validate")


def test_a_png_of_another_size_than_its_image_is_named_at_setup(broken_root):
    """It passed the start-up check and ended the run when its sample was first drawn (step 3)."""
    png = broken_root / "annotations" / "panoptic_train2017" / "000000000003.png"
    image = Image.open(png)
    width, height = image.size
    image.resize((width // 2, height)).save(png)
    with pytest.raises(PanopticDataError, match=rf"000000000003\.png' is {width // 2}x{height} but its image "
                                                rf"'.*' is {width}x{height} \(width x height\)"):
        _data(broken_root).setup("fit")


def test_an_annotation_without_segments_info_is_named_at_setup(broken_root):
    """It was a bare KeyError: 'segments_info' when the sample was drawn."""
    from detr.data.coco import AnnotationFileError

    json_path = broken_root / "annotations" / "panoptic_train2017.json"
    data = json.loads(json_path.read_text())
    del data["annotations"][1]["segments_info"]
    json_path.write_text(json.dumps(data))
    with pytest.raises(AnnotationFileError, match=r"panoptic_train2017\.json': annotations\[1\] \(image_id \d+\) "
                                                 r"has no segments_info"):
        _data(broken_root).setup("fit")


def test_the_data_module_links_the_panoptic_categories(shapes_root):
    data = _data(shapes_root)
    assert data.num_classes == 6 and data.is_thing == [True] * 5 + [False]
    assert [c["isthing"] for c in data.categories] == [1] * 5 + [0]
    coco = data.val_dataset.coco  # box AP ground truth: every segment, the background included
    assert {a["category_id"] for a in coco.dataset["annotations"]} >= {6}


# ---------------------------------------------------------------------- the configs
PANOPTIC_CONFIGS = sorted((REPO / "configs").glob("*panoptic*.yaml"))


def test_the_panoptic_configs_exist():
    assert {path.name for path in PANOPTIC_CONFIGS} == {
        "panoptic_boxes_coco.yaml", "panoptic_coco.yaml", "demo_shapes_panoptic_boxes_cpu.yaml",
        "demo_shapes_panoptic_cpu.yaml"}


@pytest.mark.parametrize("config", PANOPTIC_CONFIGS, ids=lambda path: path.name)
def test_every_panoptic_config_parses_with_the_data_deciding_the_classes(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        panoptic_main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    import yaml

    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["trainer"]["gradient_clip_val"], printed["trainer"]["gradient_clip_algorithm"]) == (0.1, "norm")
    assert "num_classes" not in printed["model"] and "categories" not in printed["model"]  # linked from the data
    monitor = [c["init_args"]["monitor"] for c in printed["trainer"]["callbacks"]
               if c["class_path"].endswith("ModelCheckpoint")]
    assert monitor == ["val/PQ" if printed["model"]["masks"] else "val/AP"]
    assert printed["trainer"]["default_root_dir"] == f"outputs/{config.stem.removesuffix('_cpu')}"


@pytest.mark.parametrize("name", ["panoptic_boxes_coco.yaml", "panoptic_coco.yaml"])
def test_coco_panoptic_configs_follow_the_authors_recipe(name, capsys):
    with pytest.raises(SystemExit):
        panoptic_main(["fit", "--config", str(REPO / "configs" / name), "--print_config"])
    import yaml

    printed = yaml.safe_load(capsys.readouterr().out)
    model, trainer = printed["model"], printed["trainer"]
    optimizer = OptimizerRecipe(**model["optimizer"]).over(DETR_RECIPE.optimizer)  # unset: DETR's recipe
    assert (optimizer.lr, optimizer.lr_backbone, optimizer.weight_decay) == (1e-4, 1e-5, 1e-4)
    assert LossRecipe(**model["loss"]).over(DETR_RECIPE.loss) == DETR_RECIPE.loss  # mask weights 1 and 1
    assert model["detr"]["class_head"] == "softmax" and model["detr"]["query_type"] == "learned"
    if name == "panoptic_coco.yaml":
        assert model["masks"] and model["freeze_detr"]
        assert (trainer["max_epochs"], optimizer.lr_drop_epochs) == (25, [15])
        assert model["init_checkpoint"] == "outputs/panoptic_boxes_coco/checkpoints/last.ckpt"
    else:
        assert not model["masks"] and (trainer["max_epochs"], optimizer.lr_drop_epochs) == (300, [200])


def test_coco_panoptic_configs_train_a_step(shapes_root, tmp_path):
    """The COCO configs (the paper's detector: learned queries, softmax head), shrunk to a ResNet-18 on the
    tiny shapes set, start and train: the box stage, then the mask stage from its checkpoint."""
    small = [*TINY, "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_sanity_val_steps=0",
             "--model.detr.backbone=resnet18", "--model.detr.backbone_last_stage=layer3",
             "--model.detr.backbone_norm=batch_norm", "--model.detr.pretrained_backbone=false",
             f"--data.root={shapes_root}"]
    boxes, masks = tmp_path / "boxes", tmp_path / "masks"
    panoptic_main(["fit", "--config", str(REPO / "configs" / "panoptic_boxes_coco.yaml"), *small,
                   "--model.init_checkpoint=null", f"--trainer.default_root_dir={boxes}"])
    panoptic_main(["fit", "--config", str(REPO / "configs" / "panoptic_coco.yaml"), *small,
                   f"--model.init_checkpoint={boxes / 'checkpoints' / 'last.ckpt'}", f"--trainer.default_root_dir={masks}"])
    for run, metric in ((boxes, "val/AP"), (masks, "val/PQ")):
        rows = _metrics(run)
        assert any(row.get("train/loss") for row in rows)
        assert any(row.get(metric) for row in rows)
