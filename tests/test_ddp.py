"""Two-process DDP on the CPU (gloo, ddp_fork): validation AP equals the single-process AP, every image is
counted once although the distributed sampler repeats one to even out the shards, and the box count that
normalises the loss is averaged over the processes."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from pycocotools.coco import COCO
from torch.utils.data import DataLoader

from detr.lightning import DetrSystem

NUM_IMAGES = 5  # odd: with 2 processes the sampler pads with a repeated image
NUM_QUERIES = 10
NUM_CLASSES = 3
SIZE = 16
TINY = dict(backbone="resnet18", hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
            dim_feedforward=64, num_queries=NUM_QUERIES, num_classes=NUM_CLASSES, aux_loss=False)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, also in the forked processes (an OpenMP pool does not survive a fork)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _targets() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    targets = []
    for index in range(NUM_IMAGES):
        count = (2, 0, 3, 1, 4)[index]
        centre = torch.rand(count, 2, generator=generator) * 0.5 + 0.25
        size = torch.rand(count, 2, generator=generator) * 0.3 + 0.1
        labels = torch.randint(0, NUM_CLASSES, (count,), generator=generator)
        targets.append({"boxes": torch.cat([centre, size], 1), "labels": labels,
                        "image_id": torch.tensor(index + 1), "orig_size": torch.tensor([100, 80 + 10 * index]),
                        "size": torch.tensor([SIZE, SIZE])})
    return targets


def _predictions(targets: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy copies of the true boxes plus false positives: logits [N, Q, C+1], boxes [N, Q, 4]."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(NUM_IMAGES, NUM_QUERIES, NUM_CLASSES + 1, generator=generator)
    boxes = torch.rand(NUM_IMAGES, NUM_QUERIES, 4, generator=generator) * 0.3 + 0.2
    for index, target in enumerate(targets):
        count = len(target["labels"])
        boxes[index, :count] = (target["boxes"] + 0.03 * torch.randn(count, 4, generator=generator)).clamp(0.01, 0.99)
        logits[index, torch.arange(count), target["labels"]] += 3.0
    return logits, boxes


def _ground_truth(targets: list[dict]) -> COCO:
    annotations = []
    for target in targets:
        height, width = target["orig_size"].tolist()
        for (cx, cy, w, h), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": int(target["image_id"]), "category_id": label,
                                "iscrowd": 0, "area": w * h * width * height,
                                "bbox": [(cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height]})
    coco = COCO()
    images = [{"id": int(t["image_id"]), "height": int(t["orig_size"][0]), "width": int(t["orig_size"][1])}
              for t in targets]
    coco.dataset = {"images": images,
                    "annotations": annotations,
                    "categories": [{"id": i, "name": f"class{i}"} for i in range(NUM_CLASSES)]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _collate(samples: list) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    images = torch.stack([s[0] for s in samples])
    return images, torch.zeros(len(samples), SIZE, SIZE, dtype=torch.bool), [s[1] for s in samples]


class GroundTruth:
    """Stands in for the data module's ``val_dataset``: only ``.coco`` is used by the system."""

    def __init__(self, coco: COCO) -> None:
        self.coco = coco


class ValidationData(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        targets = _targets()
        # pixel [0, 0, 0] of each image holds its id, which OracleSystem uses to look up its predictions
        self.samples = [(torch.full((3, SIZE, SIZE), float(t["image_id"])), t) for t in targets]
        self.val_dataset = GroundTruth(_ground_truth(targets))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.samples, batch_size=2, shuffle=True, collate_fn=_collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.samples, batch_size=2, collate_fn=_collate)


class OracleSystem(DetrSystem):
    """DetrSystem whose predictions are fixed per image (set ``table_logits``/``table_boxes``), so AP is
    non-trivial and independent of which process sees which image; records what each process saw."""

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor) -> dict:
        rows = images[:, 0, 0, 0].round().long() - 1
        return {"pred_logits": self.table_logits[rows], "pred_boxes": self.table_boxes[rows]}

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.seen: list[int] = []
        self.box_counts: list[tuple[float, float]] = []

    def validation_step(self, batch, batch_idx: int) -> dict:
        targets = batch[2]
        self.seen += [int(t["image_id"]) for t in targets]
        self.box_counts.append((float(sum(len(t["labels"]) for t in targets)), self.reduced_num_boxes(targets)))
        return super().validation_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        record = {"seen": self.seen, "box_counts": self.box_counts, "stats": self.last_evaluation.stats,
                  "image_ids": self.last_evaluation.image_ids, "num_results": len(self.last_evaluation.results)}
        path = Path(self.record_dir) / f"rank{self.global_rank}_of{self.trainer.world_size}.json"
        path.write_text(json.dumps(record))


def _system(record_dir: Path) -> OracleSystem:
    torch.manual_seed(0)
    system = OracleSystem(**TINY, evaluation_dir="")
    system.table_logits, system.table_boxes = _predictions(_targets())
    system.record_dir = str(record_dir)
    return system


def _validate(record_dir: Path, devices: int) -> None:
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp_fork" if devices > 1 else "auto",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=record_dir)
    trainer.validate(_system(record_dir), datamodule=ValidationData(), verbose=False)


def test_two_processes_give_the_single_process_ap(tmp_path) -> None:
    _validate(tmp_path, devices=1)
    single = json.loads((tmp_path / "rank0_of1.json").read_text())
    assert 0.1 < single["stats"]["AP"] < 0.95  # a non-trivial case

    _validate(tmp_path, devices=2)
    ranks = [json.loads((tmp_path / f"rank{r}_of2.json").read_text()) for r in (0, 1)]

    seen = ranks[0]["seen"] + ranks[1]["seen"]
    assert len(seen) == NUM_IMAGES + 1 and set(seen) == set(range(1, NUM_IMAGES + 1))  # one image repeated
    for record in ranks:
        assert record["image_ids"] == list(range(1, NUM_IMAGES + 1))  # ... but counted once
        assert record["num_results"] == NUM_IMAGES * NUM_QUERIES
        assert record["stats"] == single["stats"]
    for (local0, reduced0), (local1, reduced1) in zip(ranks[0]["box_counts"], ranks[1]["box_counts"]):
        assert reduced0 == reduced1 == max((local0 + local1) / 2, 1.0)
    assert any(local0 != local1 for (local0, _), (local1, _) in zip(ranks[0]["box_counts"], ranks[1]["box_counts"]))


def test_two_process_training_checkpoints_every_process_rng_and_resumes(tmp_path) -> None:
    def fit(max_epochs: int, ckpt_path: str | None = None) -> L.Trainer:
        torch.manual_seed(0)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_epochs=max_epochs,
                            limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path,
                            callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
        trainer.fit(DetrSystem(**TINY, evaluation_dir=""), datamodule=ValidationData(), ckpt_path=ckpt_path)
        return trainer

    fit(max_epochs=1)
    checkpoint = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    torch_states = [states["torch"] for states in checkpoint["detr_rng_states"]]
    assert len(torch_states) == 2 and not torch.equal(torch_states[0], torch_states[1])  # seeded per rank
    assert checkpoint["global_step"] == 2  # 5 images, 2 per process and step, padded to 6: 2 steps
    fit(max_epochs=2, ckpt_path=str(tmp_path / "last.ckpt"))
    assert torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4
