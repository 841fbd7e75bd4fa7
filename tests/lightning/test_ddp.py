"""Two-process DDP on the CPU (gloo; ddp_fork to validate, ddp_spawn to train): validation AP equals the
single-process AP, every image is counted once although the distributed sampler repeats one to even out the
shards, the detections are gathered to rank 0 and evaluated there once, and the box count that normalises the
loss is averaged over the processes."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from pycocotools.coco import COCO

from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions
from tests.helpers import InMemoryData, coco_ground_truth, model_output, tiny_config_with

NUM_IMAGES = 5  # odd: with 2 processes the sampler pads with a repeated image
NUM_QUERIES = 10
NUM_CLASSES = 3
SIZE = 16
TINY = tiny_config_with(num_queries=NUM_QUERIES, num_classes=NUM_CLASSES, aux_loss=False)

pytestmark = pytest.mark.usefixtures("one_thread")  # also in the forked processes


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
    images = [{"id": int(t["image_id"]), "height": int(t["orig_size"][0]), "width": int(t["orig_size"][1])}
              for t in targets]
    return coco_ground_truth({"images": images, "annotations": annotations,
                              "categories": [{"id": i, "name": f"class{i}"} for i in range(NUM_CLASSES)]})


def _validation_data() -> InMemoryData:
    targets = _targets()
    # pixel [0, 0, 0] of each image holds its id, which OracleSystem uses to look up its predictions
    samples = [(torch.full((3, SIZE, SIZE), float(t["image_id"])), t) for t in targets]
    return InMemoryData(samples, coco=_ground_truth(targets), shuffle=True)


class OracleSystem(DetrSystem):
    """DetrSystem whose predictions are fixed per image (set ``table_logits``/``table_boxes``), so AP is
    non-trivial and independent of which process sees which image; records what each process saw."""

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor) -> dict:
        rows = images[:, 0, 0, 0].round().long() - 1
        return model_output(logits=self.table_logits[rows], boxes=self.table_boxes[rows])

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.cocoeval_runs = 0
        run_cocoeval = self.evaluator._run_cocoeval

        def counted(*args):
            self.cocoeval_runs += 1
            return run_cocoeval(*args)

        self.evaluator._run_cocoeval = counted
        self.seen: list[int] = []
        self.box_counts: list[tuple[float, float]] = []

    def validation_step(self, batch, batch_idx: int) -> dict:
        targets = batch[2]
        self.seen += [int(t["image_id"]) for t in targets]
        local = float(sum(len(t["labels"]) for t in targets))
        self.box_counts.append((local, float(self.reduced_num_boxes(targets))))
        return super().validation_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        record = {"seen": self.seen, "box_counts": self.box_counts, "stats": self.last_evaluation.stats,
                  "image_ids": self.last_evaluation.image_ids, "num_results": len(self.last_evaluation.results),
                  "cocoeval_runs": self.cocoeval_runs,
                  "logged_AP": float(self.trainer.callback_metrics["val/AP"])}
        path = Path(self.record_dir) / f"rank{self.global_rank}_of{self.trainer.world_size}.json"
        path.write_text(json.dumps(record))


def _system(record_dir: Path) -> OracleSystem:
    torch.manual_seed(0)
    system = OracleSystem(detr=TINY, evaluation=EvaluationOptions(evaluation_dir=""))
    system.table_logits, system.table_boxes = _predictions(_targets())
    system.record_dir = str(record_dir)
    return system


def _validate(record_dir: Path, devices: int) -> None:
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp_fork" if devices > 1 else "auto",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=record_dir)
    trainer.validate(_system(record_dir), datamodule=_validation_data(), verbose=False)


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
        assert record["stats"] == single["stats"]  # broadcast from rank 0, logged unchanged
        assert record["logged_AP"] == pytest.approx(single["stats"]["AP"], abs=1e-7)  # float32 in Lightning
    # the detections were gathered to rank 0 and evaluated there once; rank 1 got the numbers only
    assert ranks[0]["num_results"] == NUM_IMAGES * NUM_QUERIES and ranks[0]["cocoeval_runs"] == 1
    assert ranks[1]["num_results"] == 0 and ranks[1]["cocoeval_runs"] == 0
    for (local0, reduced0), (local1, reduced1) in zip(ranks[0]["box_counts"], ranks[1]["box_counts"]):
        assert reduced0 == reduced1 == max((local0 + local1) / 2, 1.0)
    assert any(local0 != local1 for (local0, _), (local1, _) in zip(ranks[0]["box_counts"], ranks[1]["box_counts"]))


def test_two_process_training_checkpoints_every_process_rng_and_resumes(tmp_path) -> None:
    def fit(max_epochs: int, ckpt_path: str | None = None) -> L.Trainer:
        torch.manual_seed(0)
        # Spawned, not forked: a forked process cannot run backward once autograd's threads were started in
        # this one, which earlier tests in the same pytest process may have done (validation needs no backward).
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=max_epochs,
                            limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path,
                            callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
        system = DetrSystem(detr=TINY, evaluation=EvaluationOptions(evaluation_dir=""))
        trainer.fit(system, datamodule=_validation_data(), ckpt_path=ckpt_path)
        return trainer

    fit(max_epochs=1)
    checkpoint = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    torch_states = [states["torch"] for states in checkpoint["detr_rng_states"]]
    assert len(torch_states) == 2 and not torch.equal(torch_states[0], torch_states[1])  # seeded per rank
    assert checkpoint["global_step"] == 2  # 5 images, 2 per process and step, padded to 6: 2 steps
    fit(max_epochs=2, ckpt_path=str(tmp_path / "last.ckpt"))
    assert torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4
