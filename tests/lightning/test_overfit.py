"""The whole training system can learn: a tiny DETR overfits three synthetic images to AP50 > 0.9 within
150 optimizer steps, trained and evaluated through Lightning (Trainer.fit, then Trainer.validate)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from pycocotools.coco import COCO

from detr import CategoryMap
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions
from detr.models.recipe import OptimizerRecipe
from tests.helpers import InMemoryData, coco_ground_truth, tiny_config_with

SIZE = 64
MEAN = torch.tensor(IMAGENET_MEAN)[:, None, None]
STD = torch.tensor(IMAGENET_STD)[:, None, None]
COLOURS = (torch.tensor([1.0, 0.2, 0.2]), torch.tensor([0.2, 0.3, 1.0]))  # class 0 red, class 1 blue
# per image: (label, x0, y0, x1, y1) in pixels
OBJECTS = (
    ((0, 8, 8, 30, 30), (1, 36, 30, 60, 58)),
    ((1, 10, 34, 40, 60),),
    ((0, 30, 6, 58, 40), (1, 4, 40, 24, 60)),
)
CATEGORIES = [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}]


def _dataset() -> tuple[list[tuple[torch.Tensor, dict]], COCO]:
    samples, annotations = [], []
    for index, objects in enumerate(OBJECTS):
        image = torch.full((3, SIZE, SIZE), 0.5)
        boxes, labels = [], []
        for label, x0, y0, x1, y1 in objects:
            image[:, y0:y1, x0:x1] = COLOURS[label][:, None, None]
            boxes.append([(x0 + x1) / 2 / SIZE, (y0 + y1) / 2 / SIZE, (x1 - x0) / SIZE, (y1 - y0) / SIZE])
            labels.append(label)
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1, "category_id": label + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        target = {"boxes": torch.tensor(boxes), "labels": torch.tensor(labels), "image_id": torch.tensor(index + 1),
                  "orig_size": torch.tensor([SIZE, SIZE]), "size": torch.tensor([SIZE, SIZE])}
        samples.append(((image - MEAN) / STD, target))
    coco = coco_ground_truth({"images": [{"id": i + 1, "width": SIZE, "height": SIZE} for i in range(len(OBJECTS))],
                              "annotations": annotations, "categories": CATEGORIES})
    return samples, coco


def _three_images() -> InMemoryData:
    samples, coco = _dataset()
    return InMemoryData(samples, coco=coco, batch_size=3, train_repeats=50)  # 50 steps per epoch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tiny_detr_overfits_three_images(tmp_path) -> None:
    L.seed_everything(0)
    # Small and quick: a frozen random ResNet-18 (GroupNorm, so its random features are normalised) cut
    # after layer3 (4 × 4 features), a 1 + 2 layer transformer, no dropout, a high learning rate.
    system = DetrSystem(
        detr=tiny_config_with(backbone_norm="group_norm", backbone_trainable_layers=0, backbone_last_stage="layer3",
                              dropout=0.0, num_classes=2), optimizer=OptimizerRecipe(lr=1e-3, lr_backbone=1e-3),
        category_map=CategoryMap.from_coco_categories(CATEGORIES, contiguous=True),
        evaluation=EvaluationOptions(evaluation_dir=""),
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=150, gradient_clip_val=0.1, gradient_clip_algorithm="norm",
        check_val_every_n_epoch=100, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    data = _three_images()
    trainer.fit(system, datamodule=data)
    (metrics,) = trainer.validate(system, datamodule=data, verbose=False)
    assert trainer.global_step == 150
    assert metrics["val/AP50"] > 0.9, metrics
