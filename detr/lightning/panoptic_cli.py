"""The panoptic command line: LightningCLI over :class:`PanopticSystem` and :class:`PanopticDataModule`, for the
two stages of the authors' recipe (paper §4.4)::

    # 1. box stage: the detector on every segment's box, things and stuff
    python -m detr.lightning.panoptic_cli fit --config configs/panoptic_boxes_coco.yaml --data.root /data/coco
    # 2. mask stage: the mask head on the frozen box model, 25 epochs
    python -m detr.lightning.panoptic_cli fit --config configs/panoptic_coco.yaml --data.root /data/coco \\
        --model.init_checkpoint outputs/panoptic_boxes_coco/checkpoints/last.ckpt
    python -m detr.lightning.panoptic_cli validate --config configs/panoptic_coco.yaml --data.root /data/coco \\
        --ckpt_path outputs/panoptic_coco/checkpoints/last.ckpt
    # segment image files: predictions.json, panoptic.json and panoptic/<name>.png in <default_root_dir>/predict/
    python -m detr.lightning.panoptic_cli predict --config configs/demo_shapes_panoptic_cpu.yaml \\
        --data.predict_images photos/ --ckpt_path outputs/demo_shapes_panoptic/checkpoints/last.ckpt

Everything else is the ``detr`` command's (:mod:`detr.lightning.cli`): YAML keys mirror the constructors,
the data links ``num_classes``, ``category_map`` and the panoptic ``categories`` into the model, one output
folder per run. The data module checks its inputs at setup (:mod:`detr.data.panoptic_checks`) instead of
the detection data check.
"""

from __future__ import annotations

from typing import Any

from detr.lightning.callbacks import PredictionsWriter
from detr.lightning.checkpointing import LastCheckpoint
from detr.lightning.cli import DetrCLI, show_package_messages
from detr.lightning.panoptic_datamodule import PanopticDataModule
from detr.lightning.panoptic_system import PanopticSystem


class PanopticCLI(DetrCLI):
    """:class:`DetrCLI` with the panoptic data's links."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.detr.num_classes", apply_on="instantiate")
        parser.link_arguments("data.category_map", "model.category_map", apply_on="instantiate")
        parser.link_arguments("data.categories", "model.categories", apply_on="instantiate")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_argument(
            "--overwrite_run", type=bool, default=False,
            help="fit: start over in an output folder that holds a previous run, deleting its checkpoints and logs "
            "(without it such a folder is refused unless --ckpt_path resumes the run)",
        )


def make_cli(args: list[str] | None = None, *, run: bool = True) -> PanopticCLI:
    """As :func:`detr.lightning.cli.make_cli`, for the panoptic system and data."""
    return PanopticCLI(PanopticSystem, PanopticDataModule, args=args, run=run,
                       save_config_kwargs={"overwrite": True})


def main(args: list[str] | None = None) -> int:
    """``python -m detr.lightning.panoptic_cli fit|validate|test|predict --config ...``; shows this package's
    INFO messages (the COCO and PQ tables of every evaluation). Exit status 0; 1 when ``predict`` could not
    predict some images (the others are written)."""
    show_package_messages()
    cli = make_cli(args)
    writers = [c for c in getattr(cli.trainer, "callbacks", []) if isinstance(c, PredictionsWriter)]
    return 1 if any(writer.failed for writer in writers) else 0


if __name__ == "__main__":
    raise SystemExit(main())
