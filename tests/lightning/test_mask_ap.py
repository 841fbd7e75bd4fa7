"""Mask AP in validation: a tiny RF-DETR with instance masks (random weights) validated on a tiny shapes set with
RLE masks logs val/mask_AP ... beside val/AP, equal to pycocotools' COCOeval("segm") on the val_mask_predictions.json
it writes; a detection model, or ground truth without segmentations, logs box AP only."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.evaluation import STAT_NAMES
from detr.lightning.datamodule import DetrDataModule
from detr.lightning.options import EvaluationOptions
from detr.lightning.system import DetrSystem
from detr.models.detr_family import DetrConfig

pytestmark = pytest.mark.usefixtures("one_thread")

#: RF-DETR at 64 px: 16-pixel patches in 2 × 2 windows, 12 queries, 5 shape classes, the mask head.
TINY_RFDETR = RFDETRConfig(backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1, hidden_dim=32,
                           num_heads=4, cross_attention_heads=8, dim_feedforward=48, num_decoder_layers=2,
                           num_queries=12, num_classes=5, dropout=0.0, projector_blocks=1, instance_masks=True,
                           mask_dim_feedforward=16, pretrained_backbone=False, num_points=4, query_groups=1,
                           vit=WindowedViTSize(width=24, depth=3, heads=3, out_indices=(1, 3), num_windows=2,
                                               patch_size=16, position_size=64, mlp_dim=96))
_COCOEVAL_INDEX = {"AP": 0, "AP50": 1, "AP75": 2, "APs": 3, "APm": 4, "APl": 5, "AR100": 8}


@pytest.fixture(scope="module")
def shapes_with_masks(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes_rle")
    write_shapes_dataset(root, ShapesConfig(num_train=0, num_val=6, image_size=64, min_object_size=16,
                                            max_object_size=40, max_objects=4, empty_fraction=0.0, seed=5,
                                            mask_format="rle"))
    return root


def _validate(config: DetrConfig, root: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
              annotations: Path | None = None) -> tuple[DetrSystem, dict]:
    torch.manual_seed(0)
    data = DetrDataModule(val_images=str(root / "val2017"),
                          val_annotations=str(annotations or root / "annotations" / "instances_val2017.json"),
                          square_size=64, batch_size=3, val_batch_size=3, num_workers=0,
                          masks=config.instance_masks)
    system = DetrSystem(detr=config.to_dict(), category_map=data.category_map,
                        evaluation=EvaluationOptions(evaluation_dir=str(out), error_analysis=False))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(out))
    trainer.validate(system, datamodule=data, verbose=False)
    return system, {name: float(value) for name, value in trainer.callback_metrics.items()}


def _pycocotools_stats(ground_truth: Path, predictions: Path, iou_type: str) -> dict[str, float]:
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ground_truth))
        evaluation = COCOeval(coco, coco.loadRes(json.loads(predictions.read_text())), iouType=iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return {name: float(evaluation.stats[index]) for name, index in _COCOEVAL_INDEX.items()}


def _own_masks_as_ground_truth(shapes: Path, predictions: Path, out: Path) -> Path:
    """The shapes' val json with, as its annotations, each image's two best-scored predicted masks (a random
    model's masks match no shape: on these its mask AP is far from 0)."""
    data = json.loads((shapes / "annotations" / "instances_val2017.json").read_text())
    best: dict[int, list[dict]] = {}
    for entry in sorted(json.loads(predictions.read_text()), key=lambda entry: -entry["score"]):
        if len(best.setdefault(entry["image_id"], [])) < 2 and mask_utils.area(entry["segmentation"]) > 0:
            best[entry["image_id"]].append(entry)
    data["annotations"] = [
        {"id": index + 1, "image_id": entry["image_id"], "category_id": entry["category_id"], "iscrowd": 0,
         "segmentation": entry["segmentation"], "area": float(mask_utils.area(entry["segmentation"])),
         "bbox": [float(v) for v in mask_utils.toBbox(entry["segmentation"])]}
        for index, entry in enumerate(entry for entries in best.values() for entry in entries)]
    out.write_text(json.dumps(data))
    return out


def test_rfdetr_masks_are_scored_as_pycocotools_scores_the_written_predictions(shapes_with_masks, tmp_path,
                                                                               monkeypatch):
    _validate(TINY_RFDETR, shapes_with_masks, tmp_path / "first", monkeypatch)
    ground_truth = _own_masks_as_ground_truth(shapes_with_masks, tmp_path / "first" / "val_mask_predictions.json",
                                              tmp_path / "own_masks.json")
    system, logged = _validate(TINY_RFDETR, shapes_with_masks, tmp_path / "run", monkeypatch,
                                annotations=ground_truth)

    written = json.loads((tmp_path / "run" / "val_mask_predictions.json").read_text())
    assert written and all(set(entry) == {"image_id", "category_id", "segmentation", "score"} for entry in written)
    assert {entry["image_id"] for entry in written} == set(range(1, 7))
    assert all(entry["segmentation"]["size"] == [64, 64] for entry in written)
    theirs = _pycocotools_stats(ground_truth, tmp_path / "run" / "val_mask_predictions.json", "segm")
    assert theirs["AP"] > 0.3  # the numbers compared are not all zeros
    for name in STAT_NAMES:
        assert logged[f"val/mask_{name}"] == pytest.approx(theirs[name], abs=1e-6), name
        assert system.last_mask_evaluation.stats[name] == pytest.approx(theirs[name], abs=1e-12), name
    boxes = _pycocotools_stats(ground_truth, tmp_path / "run" / "val_predictions.json", "bbox")
    assert logged["val/AP"] == pytest.approx(boxes["AP"], abs=1e-6)
    assert json.loads((tmp_path / "run" / "val_mask_metrics.json").read_text()) == system.last_mask_evaluation.stats
    assert "AP50" in (tmp_path / "run" / "val_mask_per_class_ap.txt").read_text()


def test_box_ap_only_for_a_detection_model_or_ground_truth_without_every_segmentation(shapes_with_masks, tmp_path,
                                                                                       monkeypatch, caplog):
    _, logged = _validate(TINY_RFDETR.replace(instance_masks=False), shapes_with_masks, tmp_path / "boxes", monkeypatch)
    assert "val/AP" in logged and not any(name.startswith("val/mask_") for name in logged)
    assert not (tmp_path / "boxes" / "val_mask_predictions.json").exists()

    # a crowd region without segmentation: no target, so the masks load, but COCOeval("segm") could not read it
    data = json.loads((shapes_with_masks / "annotations" / "instances_val2017.json").read_text())
    data["annotations"][0]["iscrowd"] = 1
    del data["annotations"][0]["segmentation"]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    _, logged = _validate(TINY_RFDETR, shapes_with_masks, tmp_path / "partial", monkeypatch, annotations=partial)
    assert "val/AP" in logged and not any(name.startswith("val/mask_") for name in logged)
    assert "1 of the" in caplog.text and "have no segmentation: box AP only" in caplog.text
