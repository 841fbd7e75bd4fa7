"""The ``detr`` console script: LightningCLI over :class:`DetrSystem` and :class:`DetrDataModule`.

    detr fit --config configs/detr_r50_coco.yaml --data.root /data/coco
    detr validate --config configs/detr_r50_coco.yaml --data.root /data/coco --ckpt_path best.ckpt
    detr fit --config configs/demo_shapes_cpu.yaml --print_config

YAML keys mirror the constructors (``model.*`` = DetrSystem = build_detr + recipe, ``data.*`` =
DetrDataModule, ``trainer.*`` = lightning.Trainer). The number of classes and the category map are not
configured: the data module reads them from the annotation json and they are linked into the model.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.cli import LightningCLI

from detr.lightning.datamodule import DetrDataModule
from detr.lightning.system import DetrSystem


class DetrCLI(LightningCLI):
    """LightningCLI with the data → model links DETR needs."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The data decides these (STYLE.md habit 4): linked once both objects are built.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.category_map", "model.category_map", apply_on="instantiate")


def make_cli(args: list[str] | None = None, *, run: bool = True) -> DetrCLI:
    """Build the CLI from ``args`` (``sys.argv[1:]`` when None) and, with ``run``, run its subcommand.

    With ``run=False`` nothing runs and ``args`` has no subcommand: the returned CLI holds the configured
    ``model``, ``datamodule`` and ``trainer`` for the caller to use (``cli.trainer.fit(cli.model, ...)``).
    """
    return DetrCLI(DetrSystem, DetrDataModule, args=args, run=run, save_config_kwargs={"overwrite": True})


def main(args: list[str] | None = None) -> int:
    """Entry point of the ``detr`` console script: ``detr fit|validate|test|predict --config ...``.

    Shows this package's INFO messages (e.g. the COCO summary and per-class AP table of every
    evaluation) next to Lightning's."""
    package_logger = logging.getLogger("detr")
    if not package_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        package_logger.addHandler(handler)
        package_logger.setLevel(logging.INFO)
    make_cli(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
