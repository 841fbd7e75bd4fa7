"""The ``detr`` console script: LightningCLI over :class:`DetrSystem` and :class:`DetrDataModule`.

    detr fit --config configs/detr_r50_coco.yaml --data.root /data/coco
    detr validate --config configs/detr_r50_coco.yaml --data.root /data/coco --ckpt_path best.ckpt
    detr fit --config configs/demo_shapes_cpu.yaml --print_config

YAML keys mirror the constructors (``model.*`` = DetrSystem: ``model.detr.*`` the detector's
:class:`detr.models.config.DetrConfig`, the rest the recipe; ``data.*`` = DetrDataModule, ``trainer.*`` =
lightning.Trainer). The number of classes and the category map are not
configured: the data module reads them from the annotation json and they are linked into the model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from detr.checkpoints import CheckpointError
from detr.lightning.callbacks import PredictionsWriter
from detr.lightning.checkpointing import LastCheckpoint
from detr.lightning.data_checks import CheckData
from detr.lightning.datamodule import DetrDataModule
from detr.lightning.run_folder import claim_run_folder
from detr.lightning.system import DetrSystem
from detr.models.config import field_names


class DetrCLI(LightningCLI):
    """LightningCLI with the data → model links DETR needs."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The data decides these (the annotation json), so no config repeats them: linked once both are built.
        parser.link_arguments("data.num_classes", "model.detr.num_classes", apply_on="instantiate")
        parser.link_arguments("data.category_map", "model.category_map", apply_on="instantiate")
        # Always there, whatever the config's callbacks: last.ckpt kept current (and written on SIGTERM), and
        # every input checked before the first step. Configurable as last_checkpoint.* and data_check.*.
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(CheckData, "data_check")
        parser.add_argument(
            "--overwrite_run", type=bool, default=False,
            help="fit: start over in an output folder that holds a previous run, deleting its checkpoints and logs "
            "(without it such a folder is refused unless --ckpt_path resumes the run)",
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse, after refusing the model keys of the layout before ``model.detr`` with the key to use."""
        moved = moved_model_keys(args)
        if moved:
            parser.error("the detector's options moved under model.detr (detr.models.config.DetrConfig): "
                         + "; ".join(f"{where}: model.{key} is now model.detr.{key}" for where, key in moved))
        self._command_line_model_keys = command_line_model_keys(args)
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads --ckpt_path's hyperparameters while parsing, over everything parsed before them;
        # what the command line itself sets (detr-panoptic predict ... --model.panoptic_threshold 0.4) wins.
        subcommand = self.config.get("subcommand")
        given = {}
        for key in getattr(self, "_command_line_model_keys", []) if subcommand else []:
            with contextlib.suppress(KeyError):
                given[key] = self.config[subcommand][key]
        try:
            super()._parse_ckpt_path()
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
            path = self.config[subcommand].get("ckpt_path") if subcommand else None
            raise CheckpointError(
                f"could not read checkpoint {path}: {type(error).__name__}: {error}. The file is truncated or not a "
                "checkpoint; resume from another one (the best-model checkpoints beside it) or start over"
            ) from error
        for key, value in given.items():
            self.config[subcommand][key] = value

    def before_instantiate_classes(self) -> None:
        # Without annotations (detr predict on plain images) the checkpoint names the classes.
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and config.get("data.categories_from") is None:
            config["data.categories_from"] = str(ckpt_path)

    def fit(self, **kwargs: Any) -> None:
        """``trainer.fit`` in output folders that no other run owns (:mod:`detr.lightning.run_folder`)."""
        overwrite = bool(self.config.get(str(self.subcommand), self.config).get("overwrite_run"))
        with claim_run_folder(self.trainer, resuming=kwargs.get("ckpt_path") is not None, overwrite=overwrite):
            self.trainer.fit(**kwargs)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with :func:`run_loggers` unless the config names its own loggers (or ``logger: false``):
        into ``trainer.default_root_dir`` for ``fit``, into its ``validate/``, ``test/`` or ``predict/`` subfolder
        for the others, so that evaluating a run's checkpoint keeps the run's own metrics.csv and config.yaml."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        if "logger" not in kwargs and trainer_config.get("logger") in (None, True):
            root = trainer_config.get("default_root_dir") or os.getcwd()
            subfolder = self.subcommand if self.subcommand not in (None, "fit") else ""
            kwargs["logger"] = run_loggers(os.path.join(root, subfolder))
        return super().instantiate_trainer(**kwargs)


def moved_model_keys(args: Any) -> list[tuple[str, str]]:
    """(where, key) for every detector option given as ``model.<key>`` instead of ``model.detr.<key>`` in
    command-line ``args`` or the YAML files they pass with ``--config`` (and the files those include)."""
    fields = set(field_names())
    argv = _argv(args)
    found: list[tuple[str, str]] = []
    config_files = []
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name.startswith("--model.") and name[len("--model."):] in fields:
            found.append(("command line", name[len("--model."):]))
        if name == "--config":
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
            if value:
                config_files.append(Path(value))
    seen: set[Path] = set()
    while config_files:
        path = config_files.pop()
        if path in seen or not path.is_file():
            continue  # a missing file is jsonargparse's error to report
        seen.add(path)
        try:
            content = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue
        if not isinstance(content, dict):
            continue
        model = content.get("model")
        if isinstance(model, dict):
            model = model.get("init_args", model) if isinstance(model.get("init_args"), dict) else model
            found += [(str(path), key) for key in model if key in fields]
        found += [(str(path), key[len("model."):]) for key in content
                  if isinstance(key, str) and key.startswith("model.") and key[len("model."):] in fields]
        included = content.get("config")
        for include in [included] if isinstance(included, str) else included or []:
            config_files.append(path.parent / include)
    return found


def command_line_model_keys(args: Any) -> list[str]:
    """The ``model.*`` keys that command-line ``args`` set (``--model.lr 1e-4``, ``--model.lr=1e-4``)."""
    return [arg.split("=", 1)[0][2:] for arg in _argv(args) if arg.startswith("--model.")]


def _argv(args: Any) -> list[str]:
    """LightningCLI's ``args`` as command-line strings: ``sys.argv[1:]`` when None, none for a dict."""
    if args is None:
        args = sys.argv[1:]
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else []


def run_loggers(root_dir: str) -> list[Logger]:
    """A CSV and a TensorBoard logger writing straight into ``root_dir`` (``trainer.default_root_dir``), so
    that metrics.csv, the TensorBoard events, checkpoints/ (ModelCheckpoint follows the first logger),
    val_images/, evaluation/ and config.yaml of a run all land in the one folder that key names."""
    return [CSVLogger(root_dir, name="", version=""), TensorBoardLogger(root_dir, name="", version="")]


def make_cli(args: list[str] | None = None, *, run: bool = True) -> DetrCLI:
    """Build the CLI from ``args`` (``sys.argv[1:]`` when None) and, with ``run``, run its subcommand.

    With ``run=False`` nothing runs and ``args`` has no subcommand: the returned CLI holds the configured
    ``model``, ``datamodule`` and ``trainer`` for the caller to use (``cli.trainer.fit(cli.model, ...)``).
    """
    return DetrCLI(DetrSystem, DetrDataModule, args=args, run=run, save_config_kwargs={"overwrite": True})


def show_package_messages() -> None:
    """Print this package's INFO messages (the COCO and per-class tables of every evaluation) on stderr,
    unless the application configured the "detr" logger itself."""
    package_logger = logging.getLogger("detr")
    if not package_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        package_logger.addHandler(handler)
        package_logger.setLevel(logging.INFO)


def main(args: list[str] | None = None) -> int:
    """Entry point of the ``detr`` console script: ``detr fit|validate|test|predict --config ...``.

    Shows this package's INFO messages (e.g. the COCO summary and per-class AP table of every
    evaluation) next to Lightning's. Exit status: 0; 1 when ``predict`` could not predict some images (the
    others are written); 143 when SIGTERM stopped ``fit`` after saving last.ckpt."""
    show_package_messages()
    cli = make_cli(args)
    writers = [c for c in getattr(cli.trainer, "callbacks", []) if isinstance(c, PredictionsWriter)]
    return 1 if any(writer.failed for writer in writers) else 0


if __name__ == "__main__":
    raise SystemExit(main())
