"""Convergence on a CPU budget (docs/measurements/convergence.md): train one configuration on the synthetic shapes set
for a fixed training time and print COCO AP / AP50 (pycocotools) at regular points, with images per second.

    .venv/bin/python benchmarks/convergence.py --preset paper --minutes 10 --eval-every 2
    .venv/bin/python benchmarks/convergence.py --preset best --minutes 10 --eval-every 2 --jsonl runs.jsonl
    .venv/bin/python benchmarks/convergence.py --preset best --set lr=2e-4 --set detr.num_queries=30
    .venv/bin/python benchmarks/convergence.py --step-time paper anchor best   # ms per training step
    # the demo's YAML, one run per shapes-generator seed, fitted to 3,000 steps: AP50 at 250 / 500 / 1k / 2k / 3k
    .venv/bin/python benchmarks/convergence.py --preset demo --seeds 0 1 --train-steps 3000 --eval-every-steps 250
    # any shapes YAML of configs/ as it trains (RT-DETR's, D-FINE's, Deformable DETR's): AP50 at 250 / 500 / 1k
    .venv/bin/python benchmarks/convergence.py --preset configs/rtdetr_shapes_cpu.yaml --seeds 0 \
        --train-steps 1000 --eval-every-steps 250 --report-steps 250 500 750 1000

Each run is what ``detr fit`` trains: :class:`detr.lightning.DetrSystem` (the model from a
:class:`detr.models.config.DetrConfig`, the Hungarian loss, AdamW and its step-based learning-rate schedule:
warm-up, plateau, linear decay to zero over the run's last ``lr_decay_fraction``), the
:class:`detr.lightning.DetrDataModule` (flips only: the images' own size), and a Lightning Trainer with
gradient clipping at global norm ``clip``, the demo's callbacks (:class:`TrainingThroughput`,
:class:`TimeBudget`: ``--minutes`` of training, evaluation excluded, the step count fixed from the step rate
by the start of the decay; ``--train-steps`` instead bounds the run by steps, the way to compare runs made
on machines of different speed or under different load) and the weights' EMA when ``ema_decay`` > 0
(validation then scores the average). The system evaluates with pycocotools at every validation, every
``--eval-every`` minutes of training and at the end; each line also prints the class-agnostic AP50, the
step, images/s, the wall and CPU time and the load average (on shared cores a run pays for its
neighbours' load: compare runs by step count).

Data: the COCO-layout shapes set that ``tools/make_shapes.py`` writes (``data/shapes``, the demo's, written
here if missing; other sizes or seeds go into ``--cache-dir``), or any COCO-layout folder of equal-size
images with ``--data-root`` and ``--image-size``.

Presets (``--preset``) are the configurations measured in docs/measurements/convergence.md: ``paper`` (the authors'
settings on the small model), one per option alone, ``best``, and ``demo`` (read from
configs/demo_shapes_cpu.yaml, so always the demo's recipe). A preset, like ``--set KEY=VALUE``
(values parsed as JSON, else kept as strings), sets model fields (``detr.KEY``, or a bare DetrConfig field
name), :class:`RunConfig`'s trainer fields, or any other :class:`DetrSystem` argument (loss weights,
learning rates, schedule).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from detr.lightning import DetrDataModule, DetrSystem
from detr.lightning.callbacks import ExponentialMovingAverage, TimeBudget, TrainingThroughput
from detr.models.config import ModelConfig
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict
from detr.models.legacy import FLAT_DEFAULTS
from detr.lightning.migrate import OLD_DEFAULTS, migrate_hyperparameters
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.models.recipe import LossRecipe, OptimizerRecipe

REPO = Path(__file__).resolve().parents[1]

#: The small model for 128-px images that every preset starts from (the rest of DetrConfig: the paper's).
BENCHMARK_MODEL = DetrConfig(backbone="resnet18", hidden_dim=128, num_heads=8, num_encoder_layers=3,
                             num_decoder_layers=3, dim_feedforward=1024, dropout=0.1, num_queries=20)


@dataclass
class RunConfig:
    """Everything one run depends on: the model, the training system's other arguments, the trainer's."""

    detr: ModelConfig = BENCHMARK_MODEL  # num_classes comes from the data
    system: dict[str, Any] = field(default_factory=dict)  # loss, optimizer and runtime fields; unset: the family's
    batch_size: int = 16
    clip: float = 0.1  # gradient clipping, global norm (the authors')
    precision: str = "32-true"  # the Trainer's ("bf16-mixed": everything in bfloat16 autocast)
    ema_decay: float = 0.0  # > 0: validate an exponential moving average of the weights (and BN buffers)
    ema_warmup_steps: int = 0  # the average's warm-up (the real-time DETRs' ModelEMA: 1000 or 2000 updates)
    seed: int = 0
    square_size: int | None = None  # the data's input contract: a square resize (the real-time DETRs')
    normalize: bool = True  # ImageNet mean / std; False: pixels / 255 (the real-time DETRs')
    data: dict[str, Any] = field(default_factory=dict)  # other DetrDataModule arguments (augmentation: "rtdetr")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "detr": self.detr.to_dict()}


#: The training settings a run may set, each a field of one of DetrSystem's records.
_SETTINGS = {"loss": LossRecipe, "optimizer": OptimizerRecipe, "runtime": RuntimeOptions}


#: DetrSystem's own arguments a run may set beside the records (a fine-tune's source and how its classes map).
_DIRECT = ("init_checkpoint", "init_classes")


def system_arguments() -> set[str]:
    """The training settings a run may set: the fields of the loss and optimizer recipes and of the runtime
    options (:class:`DetrSystem`'s ``loss``, ``optimizer`` and ``runtime``; unset: the family's recipe)."""
    return {field.name for kind in _SETTINGS.values() for field in dataclasses.fields(kind)} | set(_DIRECT)


def system_records(settings: dict[str, Any]) -> dict[str, Any]:
    """A run's flat training settings as :class:`DetrSystem`'s ``loss``, ``optimizer`` and ``runtime`` records. A
    setting the run leaves unset keeps the training system's default from before the family recipes (DETR's, as
    the runs of docs/measurements/convergence.md were measured: :data:`detr.lightning.migrate.OLD_DEFAULTS`); the
    recipe's other parts (the class loss, the proposals ...) are the family's."""
    old = migrate_hyperparameters({**OLD_DEFAULTS, **{k: v for k, v in settings.items() if k in OLD_DEFAULTS}})
    return {**{name: kind(**{**old.get(name, {}),
                             **{field.name: settings[field.name] for field in dataclasses.fields(kind)
                                if field.name in settings}})
               for name, kind in _SETTINGS.items()},
            **{name: settings[name] for name in _DIRECT if name in settings}}


def _flat_settings(model: dict[str, Any], ignored: set[str]) -> dict[str, Any]:
    """A YAML's ``model`` group's set training settings (``loss:``, ``optimizer:``, ``runtime:``), flat."""
    return {key: value for group in _SETTINGS for key, value in (model.get(group) or {}).items()
            if value is not None and key not in ignored}


_FROM_SCRATCH_MODEL = {"backbone_norm": "batch_norm", "backbone_trainable_layers": 5}
_FOCAL = {"cost_class": 2.0, "loss_ce": 2.0}

#: name → overrides of RunConfig's defaults (the paper's recipe on the small model): model fields under
#: "detr", any other key a RunConfig field or a DetrSystem argument; results: docs/measurements/convergence.md.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "scratch_backbone": {"detr": dict(_FROM_SCRATCH_MODEL), "lr_backbone": 1e-4},
    "layer3": {"detr": {"backbone_last_stage": "layer3"}},
    "anchor": {"detr": {"query_type": "anchor"}},
    "denoising": {"detr": {"query_type": "anchor", "denoising": True}},
    "focal": {"detr": {"class_head": "sigmoid"}, **_FOCAL},
    "warmup_lr": {"lr": 4e-4, "lr_backbone": 4e-4, "warmup_steps": 200},
    "anchor_local": {"detr": {"query_type": "anchor", "anchor_local_attention": 4.0}},
    # The four from-scratch options together at the paper's lr.
    "combined_paper_lr": {"detr": {**_FROM_SCRATCH_MODEL, "backbone_last_stage": "layer3", "query_type": "anchor",
                                   "denoising": True, "class_head": "sigmoid"}, "lr_backbone": 1e-4, **_FOCAL},
    "query_groups": {"detr": {"query_type": "anchor", "query_groups": 3}},
    "dense_aux": {"detr": {"dense_aux_head": True}},
    # Best measured (docs/measurements/convergence.md has the runs): every option above except query groups (no gain for
    # their step time), lr 5e-4 with a 50-step warm-up and a linear decay to zero over the run's last 30 %
    # of steps, no dropout, channels_last backbone, batch 8 (twice the updates of batch 16 in the same
    # time), a lighter transformer (FFN 512, 20 queries, 2 encoder layers, 2 denoising groups: on a budget
    # of minutes a cheaper step reaches more). The weights' EMA (``--set ema_decay=0.99``) adds nothing
    # once the learning rate decays; the bfloat16 backbone's net effect on a 10-minute budget is not settled.
    "best": {"detr": {**_FROM_SCRATCH_MODEL, "backbone_last_stage": "layer3", "query_type": "anchor",
                      "denoising": True, "class_head": "sigmoid", "anchor_local_attention": 4.0,
                      "dense_aux_head": True, "num_queries": 20, "dropout": 0.0, "dim_feedforward": 512,
                      "denoising_groups": 2, "num_encoder_layers": 2},
             **_FOCAL, "lr": 5e-4, "lr_backbone": 5e-4, "warmup_steps": 50, "lr_decay_fraction": 0.3,
             "channels_last": True, "backbone_bf16": True, "batch_size": 8},
    # Deformable DETR (docs/models/deformable.md) with "best"'s training settings: 4 levels from layer2–4 of the
    # ResNet-18 (strides 8 to 64), 4 points, box refinement, the same light transformer and budget.
    "deformable": {"detr": {**_FROM_SCRATCH_MODEL, "architecture": "deformable", "class_head": "sigmoid",
                            "box_refine": True, "num_queries": 20, "dropout": 0.0, "dim_feedforward": 512,
                            "num_encoder_layers": 2},
                   **_FOCAL, "lr": 5e-4, "lr_backbone": 5e-4, "warmup_steps": 50, "lr_decay_fraction": 0.3,
                   "channels_last": True, "backbone_bf16": True, "batch_size": 8},
}


DEMO_CONFIG = REPO / "configs" / "demo_shapes_cpu.yaml"


def demo_preset(path: Path = DEMO_CONFIG) -> dict[str, Any]:
    """The ``demo`` preset: what ``detr fit --config configs/demo_shapes_cpu.yaml`` trains, read from the
    YAML (its model block, batch size, gradient clipping and seed), so that the benchmark and the demo
    cannot drift apart. Its image size is the YAML's ``data.train_max_size`` (see :func:`demo_image_size`)."""
    import yaml

    config = yaml.safe_load(path.read_text())
    model = dict(config["model"])
    ignored = {"lr_drop_epochs"}  # an empty list is no step decay
    return {"detr": dict(model["detr"]), **_flat_settings(model, ignored),
            "batch_size": config["data"]["batch_size"], "clip": config["trainer"]["gradient_clip_val"],
            "seed": config.get("seed_everything", 0)}


def demo_image_size(path: Path = DEMO_CONFIG) -> int:
    """The demo's image size: the longest side its data block resizes to (the shapes set is square)."""
    import yaml

    return int(yaml.safe_load(path.read_text())["data"]["train_max_size"])


#: Training settings a YAML preset does not carry over (the benchmark's runs have no step decay).
_NOT_TRAINING = {"lr_drop_epochs"}


def resolved_config(path: Path) -> dict[str, Any]:
    """What ``detr fit --config PATH`` trains, as its ``--print_config`` resolves it (includes and dotted keys
    followed, every default filled in); a fresh dict each call, the CLI run once per file."""
    import yaml

    return yaml.safe_load(_printed_config(str(path)))


@functools.lru_cache(maxsize=None)
def _printed_config(path: str) -> str:
    from detr.lightning.cli import main as detr_main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        detr_main(["fit", "--config", path, "--print_config"])
    return printed.getvalue()


def yaml_preset(path: Path) -> dict[str, Any]:
    """A YAML of configs/ as a preset (``--preset configs/rtdetr_shapes_cpu.yaml``): its whole model, batch
    size, gradient clipping, seed and input contract (square size, normalisation), as ``detr fit`` resolves
    them; its image size is :func:`yaml_image_size`'s."""
    config = resolved_config(path)
    model, data = dict(config["model"]), config["data"]
    system = _flat_settings(model, _NOT_TRAINING)
    return {"detr": model["detr"], **system, "batch_size": data["batch_size"],
            "clip": config["trainer"]["gradient_clip_val"], "seed": config.get("seed_everything") or 0,
            "square_size": data["square_size"], "normalize": data["normalize"]}


def yaml_image_size(path: Path) -> int:
    """A YAML preset's image size: its square, else the longest side its training resizes to."""
    data = resolved_config(path)["data"]
    return int(data["square_size"] or data["train_max_size"])


def preset_values(preset: str) -> dict[str, Any]:
    """The overrides a preset makes (the ``demo`` preset is read from the demo's YAML, a ``.yaml`` path from
    that file)."""
    if preset == "demo":
        return demo_preset()
    if preset.endswith((".yaml", ".yml")):
        if not Path(preset).is_file():
            raise SystemExit(f"--preset {preset}: no such file")
        return yaml_preset(Path(preset))
    if preset not in PRESETS:
        raise SystemExit(f"unknown preset {preset!r}; choose one of {sorted(PRESETS) + ['demo']}")
    return PRESETS[preset]


def build_run_config(preset: str, overrides: list[str]) -> RunConfig:
    """``preset``'s RunConfig with ``--set KEY=VALUE`` ``overrides`` applied (module docstring)."""
    values = {key: value for key, value in preset_values(preset).items() if key != "detr"}
    model = dict(preset_values(preset).get("detr", {}))
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"detr", "system"}
    # the presets' model settings are in the one-record vocabulary (``architecture`` and any family's options)
    system_fields, model_fields = system_arguments(), set(FLAT_DEFAULTS)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.removeprefix("detr.") if key.removeprefix("detr.") in model_fields else key
        if not sep or key not in run_fields | system_fields | model_fields:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE with KEY a model field (detr.NAME: "
                             f"{sorted(model_fields)}), one of {sorted(run_fields)}, or a DetrSystem argument "
                             f"({sorted(system_fields)})")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        (model if key in model_fields else values)[key] = value
    unknown = sorted(set(values) - run_fields - system_fields)
    if unknown:
        raise SystemExit(f"preset {preset!r}: unknown keys {unknown}")
    base = {name: value for name, value in BENCHMARK_MODEL.to_dict().items() if name != "family"}
    # a YAML preset's model is whole, in the family form (``family: rtdetr`` and that family's fields only)
    return RunConfig(detr=config_from_dict(model if "family" in model else {**base, **model},
                                           where=f"preset {preset!r}"),
                     system={k: v for k, v in values.items() if k in system_fields},
                     **{k: v for k, v in values.items() if k in run_fields})


def build_system(config: RunConfig, datamodule: DetrDataModule) -> DetrSystem:
    """The training system of a run: the model of ``config.detr`` for the data's classes."""
    return DetrSystem(detr=for_data(config, datamodule).detr, category_map=datamodule.category_map,
                      evaluation=EvaluationOptions(evaluation_dir="", error_analysis=False),
                      **system_records(config.system))


def for_data(config: RunConfig, datamodule: DetrDataModule) -> RunConfig:
    """``config`` with the data's number of classes (what the run trains, as printed and stored)."""
    return dataclasses.replace(config, detr=config.detr.replace(num_classes=datamodule.num_classes))


# ----------------------------------------------------------------------------------------------- data
def shapes_root(num_train: int, num_val: int, seed: int, cache_dir: Path) -> Path:
    """The shapes set with these sizes and seed (the defaults: the demo's ``data/shapes``), written if missing."""
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    shapes = ShapesConfig(num_train=num_train, num_val=num_val, seed=seed)
    root = REPO / "data" / "shapes" if shapes == ShapesConfig() else cache_dir / f"shapes_{num_train}_{num_val}_{seed}"
    write_shapes_dataset(root, shapes)  # nothing to do when a complete set with these parameters is there
    return root


def make_datamodule(data_root: Path, batch_size: int, image_size: int, *, square_size: int | None = None,
                    normalize: bool = True, **options: Any) -> DetrDataModule:
    """The demo's data settings: every resize at the images' own size, so flips are the only augmentation;
    read in the training process (a loader worker competes with the compute threads). ``square_size`` and
    ``normalize``: the real-time DETRs' input contract (``--data.square_size``, ``--data.normalize``);
    ``options``: other :class:`DetrDataModule` arguments (``augmentation="rtdetr"``: the real-time DETRs'
    photometric distortion, zoom-out, IoU crop and flip)."""
    sizes = dict(train_scales=[image_size], train_max_size=image_size, crop_resize_scales=[image_size],
                 crop_min_size=image_size, crop_max_size=image_size, eval_min_size=image_size,
                 eval_max_size=image_size)
    return DetrDataModule(root=str(data_root), batch_size=batch_size, val_batch_size=50, num_workers=0,
                          pin_memory=False, square_size=square_size, normalize=normalize, **{**sizes, **options})


# ------------------------------------------------------------------------------------------ training
def class_agnostic_ap50(coco_gt: Any, results: list[dict[str, Any]], image_ids: list[int]) -> float:
    """AP50 with every class merged (COCOeval ``useCats=0``): how well the boxes alone are found, so a
    curve shows whether localisation or classification holds AP50 back."""
    from pycocotools.cocoeval import COCOeval

    if not results:
        return 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(coco_gt, coco_gt.loadRes(results), iouType="bbox")
        coco_eval.params.imgIds, coco_eval.params.useCats = image_ids, 0
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return float(coco_eval.stats[1])


class ConvergenceReport(L.Callback):
    """After every validation of ``fit``: one point of the AP-vs-training-time curve, printed, appended to
    ``curve`` and to the ``jsonl`` file."""

    def __init__(self, name: str, config: RunConfig, throughput: TrainingThroughput, budget: TimeBudget,
                 jsonl: Path | None, save_at_ap: dict[float, Path] | None = None) -> None:
        self.name, self.config, self.throughput, self.budget, self.jsonl = name, config, throughput, budget, jsonl
        self.save_at_ap = dict(save_at_ap or {})
        self.curve: list[dict[str, Any]] = []
        self._wall_start, self._cpu_start = time.perf_counter(), time.process_time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: DetrSystem) -> None:
        evaluation = pl_module.last_evaluation
        if trainer.sanity_checking or trainer.state.fn != "fit" or evaluation is None:
            return
        coco_gt = trainer.datamodule.val_dataset.coco
        trained, step = self.throughput.clock.spent(), trainer.global_step
        seen = step * self.config.batch_size
        metrics = trainer.callback_metrics
        point = {
            "run": self.name, "train_min": round(trained / 60, 2), "step": step, "of_steps": self.budget.total_steps,
            "epoch": round(seen / len(trainer.datamodule.train_dataset), 2),
            "images_per_s": round(seen / max(trained, 1e-9), 1), "AP": round(evaluation.stats["AP"], 4),
            "AP50": round(evaluation.stats["AP50"], 4),
            "AP50_agnostic": round(class_agnostic_ap50(coco_gt, evaluation.results, evaluation.image_ids), 4),
            "loss": round(float(metrics.get("train/loss", float("nan"))), 3),
            "class_error": round(float(metrics.get("train/class_error", float("nan"))), 1),
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "wall_min": round((time.perf_counter() - self._wall_start) / 60, 2),
            "cpu_min": round((time.process_time() - self._cpu_start) / 60, 2), "load": round(os.getloadavg()[0], 1),
        }
        self.curve.append(point)
        planned = f"/{point['of_steps']}" if point["of_steps"] is not None else ""
        print(f"[{self.name}] train {point['train_min']:5.2f} min  step {step:5d}{planned}  "
              f"epoch {point['epoch']:5.2f}  {point['images_per_s']:5.1f} img/s  loss {point['loss']:7.3f}  "
              f"class_error {point['class_error']:5.1f}  "
              f"{'EMA ' if self.config.ema_decay > 0 else ''}AP {point['AP']:.4f}  AP50 {point['AP50']:.4f}  "
              f"(class-agnostic {point['AP50_agnostic']:.4f})  lr {point['lr']:.2e}  (wall {point['wall_min']:.1f} "
              f"min, cpu {point['cpu_min']:.1f} min, load {point['load']})", flush=True)
        if self.jsonl is not None:
            with self.jsonl.open("a") as handle:
                handle.write(json.dumps({**point, "config": self.config.to_dict()}) + "\n")
        for target in sorted(ap for ap in self.save_at_ap if point["AP"] >= ap):
            path = self.save_at_ap.pop(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(path, weights_only=True)
            print(f"[{self.name}] AP {point['AP']:.4f} >= {target} at step {step}: saved {path}", flush=True)
            if not self.save_at_ap:
                trainer.should_stop = True


def make_trainer(config: RunConfig, callbacks: list[L.Callback], root: str, *, max_steps: int = -1,
                 eval_every: float | None = None, eval_every_steps: int | None = None) -> L.Trainer:
    """A CPU Trainer without logger, checkpoints or progress bar; validation every ``eval_every`` minutes of
    training (Lightning's time-based ``val_check_interval``), or every ``eval_every_steps`` steps when given,
    and when the budget stops the run."""
    if eval_every_steps:
        validation = {"val_check_interval": eval_every_steps, "check_val_every_n_epoch": None}
    elif eval_every:
        validation = {"val_check_interval": datetime.timedelta(minutes=eval_every), "check_val_every_n_epoch": None}
    else:
        validation = {"limit_val_batches": 0}
    return L.Trainer(accelerator="cpu", devices=1, precision=config.precision, max_epochs=-1, max_steps=max_steps,
                     gradient_clip_val=config.clip or None, gradient_clip_algorithm="norm", callbacks=callbacks,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=50,
                     default_root_dir=root, **validation)


def run(config: RunConfig, data_root: Path, *, minutes: float, eval_every: float, name: str, jsonl: Path | None,
        max_steps: int | None = None, image_size: int = 128,
        eval_every_steps: int | None = None, save: Path | None = None,
        save_at_ap: dict[float, Path] | None = None) -> list[dict[str, Any]]:
    """Train for ``minutes`` of training time, or ``max_steps`` steps when given (the time budget is then
    only a safety stop); evaluate every ``eval_every`` minutes, or every ``eval_every_steps`` steps when
    given, and at the end; ``save``: write the trained model there as ``detr fit`` writes a checkpoint (it
    loads with :func:`detr.load_checkpoint`, its eval size and categories kept); ``save_at_ap``: COCO AP →
    path, the model written there at the first evaluation that reaches that AP, the run ended once every one
    is written. Returns the curve's points."""
    L.seed_everything(config.seed, verbose=False)
    datamodule = make_datamodule(data_root, config.batch_size, image_size, square_size=config.square_size,
                                 normalize=config.normalize, **config.data)
    config = for_data(config, datamodule)
    system = build_system(config, datamodule)
    throughput = TrainingThroughput()
    budget = TimeBudget(max_train_seconds=minutes * 60)
    report = ConvergenceReport(name, config, throughput, budget, jsonl, save_at_ap)
    callbacks: list[L.Callback] = [throughput, budget, report]
    if config.ema_decay > 0:
        callbacks.append(ExponentialMovingAverage(decay=config.ema_decay, warmup_steps=config.ema_warmup_steps))
    print(f"[{name}] {json.dumps(config.to_dict())}", flush=True)
    with tempfile.TemporaryDirectory() as root:
        trainer = make_trainer(config, callbacks, root, max_steps=max_steps or -1, eval_every=eval_every,
                               eval_every_steps=eval_every_steps)
        trainer.fit(system, datamodule=datamodule)
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(save, weights_only=True)
            print(f"[{name}] saved {save}", flush=True)
    return report.curve


class StepTimer(L.Callback):
    """Seconds of each training step (forward, loss, backward, optimizer), by process CPU time / threads
    (robust to other load on shared cores) and by the wall clock."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.cpu.append((time.process_time() - self._cpu) / torch.get_num_threads())
        self.wall.append(time.perf_counter() - self._wall)


def step_time(config: RunConfig, data_root: Path, steps: int, name: str, image_size: int = 128) -> float:
    """Median seconds per training step after 3 warm-up steps, by process CPU time / threads (the wall-clock
    median is printed too)."""
    L.seed_everything(0, verbose=False)
    datamodule = make_datamodule(data_root, config.batch_size, image_size, square_size=config.square_size,
                                 normalize=config.normalize)
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as root:
        make_trainer(config, [timer], root, max_steps=steps + 3).fit(build_system(config, datamodule), datamodule)
    median = float(np.median(timer.cpu[3:]))
    print(f"[{name}] {1000 * median:7.1f} ms/step CPU/threads (wall {1000 * float(np.median(timer.wall[3:])):7.1f} "
          f"ms; median of {steps}, batch {config.batch_size}, {config.batch_size / median:5.1f} img/s)", flush=True)
    return median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="paper",
                        help=f"one of {sorted(PRESETS) + ['demo']}, or a shapes YAML of configs/ (its whole recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model field (detr.KEY), a RunConfig field or a DetrSystem argument")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget (evaluation excluded)")
    parser.add_argument("--train-steps", type=int, default=None,
                        help="budget in training steps instead of --minutes (comparable across machine speeds)")
    parser.add_argument("--eval-every", type=float, default=2.0, help="minutes of training between evaluations")
    parser.add_argument("--eval-every-steps", type=int, default=None,
                        help="steps between evaluations instead of --eval-every (with --train-steps)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="one run per seed, each on the shapes set the generator makes with that seed and "
                             "trained with that seed; then AP50 at --report-steps for every run")
    parser.add_argument("--report-steps", type=int, nargs="+", default=[250, 500, 1000, 2000, 3000],
                        help="the steps of the --seeds summary (each a multiple of --eval-every-steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-val", type=int, default=200)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=None, help="COCO-layout folder instead of the shapes set")
    parser.add_argument("--image-size", type=int, default=None,
                        help="the images' size (--data-root); default: the demo's for --preset demo, else 128")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/detr_convergence_cache"),
                        help="where shapes sets of other sizes or seeds are written")
    parser.add_argument("--jsonl", type=Path, default=None, help="append every evaluation point here")
    parser.add_argument("--name", default=None,
                        help="run name in the output (default: the preset, a YAML preset's file stem)")
    parser.add_argument("--save-dir", type=Path, default=None,
                        help="write each run's trained model here (NAME.ckpt, NAME-seedS.ckpt with --seeds)")
    parser.add_argument("--step-time", nargs="*", default=None, metavar="PRESET",
                        help="only time training steps of these presets (with --set overrides)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed per preset with --step-time")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.image_size is None:
        if args.preset.endswith((".yaml", ".yml")) and Path(args.preset).is_file():
            args.image_size = yaml_image_size(Path(args.preset))
        else:
            args.image_size = demo_image_size() if args.preset == "demo" and args.data_root is None else 128
    if args.seeds is not None:
        return seeds_summary(args)
    start = time.perf_counter()
    data_root = args.data_root or shapes_root(args.num_train, args.num_val, args.data_seed, args.cache_dir)
    print(f"data: {data_root} ({time.perf_counter() - start:.1f} s); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    if args.step_time is not None:
        configs = {p: build_run_config(p, args.set) for p in args.step_time or ["paper"]}
        # per image: presets may differ in batch size (best trains with 8, the paper's recipe with 16)
        times = {p: step_time(c, data_root, args.steps, p, args.image_size) / c.batch_size for p, c in configs.items()}
        if "paper" in times:
            for preset, seconds in times.items():
                print(f"{preset:>18}: {seconds / times['paper']:.2f} × paper's training time per image")
        return 0
    config = build_run_config(args.preset, args.set)
    run(config, data_root, minutes=args.minutes, eval_every=args.eval_every, name=run_name(args),
        jsonl=args.jsonl, max_steps=args.train_steps, image_size=args.image_size,
        eval_every_steps=args.eval_every_steps, save=saved_as(args, None))
    return 0


def run_name(args: argparse.Namespace) -> str:
    """``--name``, else the preset's (a YAML preset's file stem)."""
    return args.name or (Path(args.preset).stem if args.preset.endswith((".yaml", ".yml")) else args.preset)


def saved_as(args: argparse.Namespace, seed: int | None) -> Path | None:
    """Where ``--save-dir`` puts a run's model: named after the run."""
    if args.save_dir is None:
        return None
    return args.save_dir / (f"{run_name(args)}.ckpt" if seed is None else f"{run_name(args)}-seed{seed}.ckpt")


def seeds_summary(args: argparse.Namespace) -> int:
    """``--seeds``: one run per seed (the generator's seed of the shapes set and the training seed), each
    ``--train-steps`` long (its schedule fitted to that count) with an evaluation every
    ``--eval-every-steps``; then a table of AP50 at ``--report-steps`` and the seconds per step."""
    steps = args.train_steps or max(args.report_steps)
    every = args.eval_every_steps or 250
    curves: dict[int, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        data_root = args.data_root or shapes_root(args.num_train, args.num_val, seed, args.cache_dir)
        config = build_run_config(args.preset, [*args.set, f"seed={seed}"])
        curves[seed] = run(config, data_root, minutes=10_000.0, eval_every=args.eval_every,
                           name=f"{run_name(args)} seed {seed}", jsonl=args.jsonl, max_steps=steps,
                           image_size=args.image_size, eval_every_steps=every, save=saved_as(args, seed))
    report = [s for s in args.report_steps if s <= steps]
    print(f"\nAP50 of --preset {args.preset} {' '.join('--set ' + s for s in args.set)} "
          f"(schedule fitted to {steps} steps; seed = the shapes generator's and the training seed)")
    print(f"{'seed':>6} | " + " | ".join(f"{s:>6}" for s in report) + " | s/step (training time)")
    for seed, curve in curves.items():
        by_step = {point["step"]: point for point in curve}
        cells = [f"{by_step[s]['AP50']:6.3f}" if s in by_step else f"{'-':>6}" for s in report]
        last = curve[-1] if curve else None
        rate = f"{last['train_min'] * 60 / last['step']:.3f}" if last and last["step"] else "-"
        print(f"{seed:>6} | " + " | ".join(cells) + f" | {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
