"""The training commands: LightningCLI over a training system and its data module.

``detr`` trains and evaluates detection (:class:`DetrSystem`, :class:`DetrDataModule`)::

    detr fit --config configs/detr_r50_coco.yaml --data.root /data/coco
    detr validate --config configs/detr_r50_coco.yaml --data.root /data/coco \\
        --ckpt_path outputs/detr_r50_coco/checkpoints/last.ckpt
    detr fit --config configs/demo_shapes_cpu.yaml --print_config

``detr-panoptic`` is the same command over :class:`PanopticSystem` and :class:`PanopticDataModule`, for the
two stages of the authors' panoptic recipe (paper §4.4)::

    # 1. box stage: the detector on every segment's box, things and stuff
    detr-panoptic fit --config configs/panoptic_boxes_coco.yaml --data.root /data/coco
    # 2. mask stage: the mask head on the frozen box model, 25 epochs
    detr-panoptic fit --config configs/panoptic_coco.yaml --data.root /data/coco \\
        --model.init_checkpoint outputs/panoptic_boxes_coco/checkpoints/last.ckpt
    # segment image files: predictions.json, panoptic.json and panoptic/<name>.png in <default_root_dir>/predict/
    detr-panoptic predict --config configs/demo_shapes_panoptic_cpu.yaml \\
        --data.predict_images data/photos --ckpt_path outputs/demo_shapes_panoptic/checkpoints/last.ckpt

YAML keys mirror the constructors (``model.*`` = the system: ``model.detr.*`` the detector's
:class:`detr.models.config.DetrConfig`, ``model.loss.*`` and ``model.optimizer.*`` its family's recipe
(:mod:`detr.models.recipe`), ``model.runtime.*`` and ``model.evaluation.*`` the run's options; an earlier
version's flat keys such as ``model.lr`` are read as today's with a note: :mod:`detr.lightning.migrate`;
``data.*`` = the data module, ``trainer.*`` = lightning.Trainer); a key that no constructor has is refused by name.
The number of classes, the category map and (panoptic) the categories with their things and stuff are not
configured: the data module reads them from the annotation json and they are linked into the model. One output
folder per run (:mod:`detr.lightning.run_folder`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import pickle
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import RichProgressBar
from jsonargparse import DefaultHelpFormatter, Namespace, dict_to_namespace, set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from detr.checkpoints import CheckpointError
from detr.checkpoints.formats import CheckpointCodeError, unpickling_refusal
from detr.data.coco import AnnotationFileError
from detr.data.images import ImageLoadError
from detr.data.panoptic_checks import PanopticDataError
from detr.lightning.callbacks import FitReport, PredictionsWriter
from detr.lightning.checkpointing import INTERRUPTED_EXIT_CODE, LastCheckpoint, warn_of_replaced_model_options
from detr.lightning.data_checks import CheckData, DataCheckError
from detr.lightning.datamodule import DetrDataModule
from detr.lightning.migrate import fill_old_defaults, install_config_loader, migrate_hyperparameters
from detr.lightning.migrate import migrate_arguments as migrate_old_arguments
from detr.lightning.panoptic_datamodule import PanopticDataModule
from detr.lightning.panoptic_system import PanopticSystem
from detr.lightning.run_folder import claim_run_folder
from detr.lightning.model_yaml import (
    class_path_form,
    family_form,
    family_form_yaml,
    migrate_arguments,
)
from detr.lightning.system import DetrSystem, SettingError
from detr.models.config import ModelConfig
from detr.models.family import families

logger = logging.getLogger(__name__)

#: What a user meets with a correct program, beside the commands' own (a checkpoint that cannot be read or
#: downloaded, an output folder in use: :func:`detr.inference.command_line.expected_errors`): data that would
#: break training, and a setting that cannot work. ``detr`` prints them as one line (the data check's report:
#: its list), exit status 2; a traceback is for anything else.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (DataCheckError, AnnotationFileError, ImageLoadError,
                                               PanopticDataError, SettingError)

#: LightningCLI's subcommands (``detr fit|validate|test|predict``), each a Trainer method.
SUBCOMMANDS: tuple[str, ...] = tuple(LightningCLI.subcommands())

#: The usage line printed above a command-line error (the generated one lists every option: 130 lines).
_USAGE = "%(prog)s [--config FILE.yaml] [--KEY VALUE ...]"


def _keep_none() -> dict[str, bool]:
    """jsonargparse's dump option keeping None values: ``skip_unset=False`` from 4.49, which warns of the older
    ``skip_none`` on every fit; the project allows 4.41 on. Asked at the dump, not at import (every command's
    start-up imports this module; reading the installed version takes milliseconds)."""
    version = tuple(int(part) for part in importlib.metadata.version("jsonargparse").split(".")[:2])
    return {"skip_unset": False} if version >= (4, 49) else {"skip_none": False}


class DetrCLI(LightningCLI):
    """LightningCLI with the data → model links DETR needs, for the detection or the panoptic system.

    ``subcommand_names``: the subcommands whose parsers are built (default: every one). Each parser describes
    every option of the system, the data module and the Trainer, which takes seconds, so :func:`make_cli`
    builds only the one the command line asks for. ``old_keys``: the flat ``model.*`` keys of an earlier version
    that the command line and its configs used (:mod:`detr.lightning.migrate`), filled in as it parses.
    ``command_line_keys``: the ``model.*`` keys the user's command line set (:func:`command_line_model_keys` of it
    before the config files' models were moved onto it), which win over a ``--ckpt_path`` checkpoint's."""

    def __init__(self, *args: Any, subcommand_names: tuple[str, ...] = SUBCOMMANDS,
                 old_keys: set[str] | None = None, command_line_keys: list[str] | None = None,
                 **kwargs: Any) -> None:
        self._subcommand_names = subcommand_names
        self._command_line_keys = command_line_keys
        self._old_keys = old_keys if old_keys is not None else set()
        # model.detr is any family's config class: --model.detr DFINEConfig, or class_path / init_args in YAML
        set_parsing_settings(subclasses_enabled=[ModelConfig])
        install_config_loader(self._old_keys)  # old keys migrated, model.detr left to the command line
        super().__init__(*args, parser_class=_FamilyFormParser, **kwargs)

    def _dump_config(self) -> None:
        # what Lightning's instantiator reads (and links into): jsonargparse's own form, not the family form
        if hasattr(self, "config_dump"):
            return
        self.config_dump = yaml.safe_load(LightningArgumentParser.dump(self.parser, self.config, skip_link_targets=False,
                                                                       format="yaml", **_keep_none()))
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]  # a staticmethod in LightningCLI
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name in self._subcommand_names}

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The data decides these (the annotation json), so no config repeats them: linked once both are built.
        parser.link_arguments("data.num_classes", "model.detr.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.category_map", "model.category_map", apply_on="instantiate")
        # Always there, whatever the config's callbacks: last.ckpt kept current (and written on SIGTERM).
        # Configurable as last_checkpoint.*.
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        # Always there too: a line every log_every_n_steps steps in a log file, the AP curve at every validation
        # and the best checkpoint at the end. Configurable as fit_report.*.
        parser.add_lightning_class_args(FitReport, "fit_report")
        if issubclass(self.model_class, PanopticSystem):
            parser.link_arguments("data.categories", "model.categories", apply_on="instantiate")
            # the panoptic data module checks its inputs itself at setup (detr.data.panoptic_checks)
        else:
            # every input checked before the first step; configurable as data_check.*
            parser.add_lightning_class_args(CheckData, "data_check")
        parser.add_argument(
            "--overwrite_run", type=bool, default=False,
            help="fit: start over in an output folder that holds a previous run, deleting its checkpoints and logs "
            "(without it such a folder is refused unless --ckpt_path resumes the run); predict: replace the "
            "predictions of an earlier run in <default_root_dir>/predict/ (without it that folder is refused)",
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse, then note the ``model.*`` values the command line itself set, and check that ``--ckpt_path``
        is readable: LightningCLI next reads the checkpoint's hyperparameters over everything parsed, and
        :meth:`before_instantiate_classes` puts the command line's values back (``detr-panoptic predict ...
        --model.panoptic_threshold 0.4`` wins)."""
        for config_file in command_line_config_files(args):
            problem = config_file_problem(config_file)
            if problem:
                parser.error(problem)
        keys = self._command_line_keys if self._command_line_keys is not None else command_line_model_keys(args)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        self._command_line_model_values = {}
        if not subcommand:
            return
        for key in keys:
            if key.startswith("model.detr.") and key.split(".")[2] not in ("class_path", "init_args"):
                key = "model.detr.init_args." + key[len("model.detr."):]  # a field of the family's config class
            with contextlib.suppress(KeyError):
                self._command_line_model_values[key] = self.config[subcommand][key]
        self._configured_model = self.config[subcommand].get("model.detr")  # before --ckpt_path's replace it
        path = self.config[subcommand].get("ckpt_path")
        if path and "://" not in path and path not in ("last", "best", "hpc", "registry") and not Path(path).exists():
            # said now, not after the data checks and the model were built (Lightning's FileNotFoundError)
            raise CheckpointError(f"--ckpt_path {path} does not exist; pass the run's checkpoints/last.ckpt (or "
                                  "another checkpoint it wrote)")
        if path and Path(path).is_file():
            try:  # memory-mapped: the tensors are not read, a truncated or foreign file fails here
                torch.load(path, weights_only=True, map_location="cpu", mmap=True)
            except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
                refusal = unpickling_refusal(path, error) if isinstance(error, pickle.UnpicklingError) else None
                if isinstance(refusal, CheckpointCodeError):
                    raise refusal from None
                if refusal is not None:  # Python objects beside the tensors: the authors' .pth (its args)
                    raise CheckpointError(
                        f"{path} holds Python objects besides tensors, so it is not a checkpoint that detr fit "
                        "wrote (--ckpt_path resumes those: checkpoints/last.ckpt). To start from a weights file, "
                        f"pass --model.init_checkpoint {path} instead") from None
                raise CheckpointError(
                    f"could not read checkpoint {path}: {type(error).__name__}: {error}. The file is truncated or "
                    "not a checkpoint; resume from another one (the best-model checkpoints beside it) or start over"
                ) from error

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's: the ``--ckpt_path`` checkpoint's hyperparameters over the parsed config, those of an
        earlier version migrated first (:func:`detr.lightning.migrate.migrate_hyperparameters`)."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if not (ckpt_path and Path(ckpt_path).is_file()):
            return
        checkpoint = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        hparams = migrate_hyperparameters(hparams, where=str(ckpt_path))
        try:
            self.config = self.parser.parse_object({self.config.subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    def instantiate_classes(self) -> None:
        """Build the model, the data module and the trainer; a value one of them refuses (a plain ValueError,
        whose message names the argument: ``num_queries must be an integer >= 1 ...``) is a
        :class:`SettingError`, an expected error of the command rather than a bug."""
        try:
            super().instantiate_classes()
        except ValueError as error:
            if type(error) is not ValueError:  # a precise kind (CheckpointError, DataCheckError ...) stays itself
                raise
            raise SettingError(_union_problem(str(error))) from error

    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        restored = config.get("model.detr")
        if isinstance(restored, dict) and not ckpt_path:  # a field the family's config class does not have
            raise SettingError(f"--model.detr: the configured family's config class has no option among "
                               f"{sorted(restored)}; a family has only its own options (e.g. RF-DETR no "
                               f"num_encoder_layers): drop them, or see `detr fit --model.detr CLASS --help`")
        if isinstance(restored, dict):  # --ckpt_path's hyperparameters: the config as a dict, in either form
            form = class_path_form(restored, f"{ckpt_path}: its model config")
            restored = dict_to_namespace(form if form is not None else restored)
            config["model.detr"] = restored
        for key, value in getattr(self, "_command_line_model_values", {}).items():
            config[key] = value  # over --ckpt_path's hyperparameters (parse_arguments)
        if self._old_keys:  # configured in an earlier version's keys: what they leave unset is its default
            filled = fill_old_defaults(config)
            if filled:
                logger.warning("configured with an earlier version's model.* keys: %d loss and optimizer settings they "
                               "leave unset take that version's defaults (DETR's), not the family's recipe; move the "
                               "keys to model.loss.* / model.optimizer.* to train with the family's",
                               len(filled))
        if ckpt_path:  # said, not silent: the config's own model options give way to the checkpoint's
            warn_of_replaced_model_options(_fields(getattr(self, "_configured_model", None)), _fields(restored),
                                           ckpt_path)
        if ckpt_path and config.get("model.init_checkpoint"):
            # every weight comes from the checkpoint: the fine-tune's source is not read again (it may have moved)
            logger.info("--ckpt_path %s holds the weights: init_checkpoint %s is not read", ckpt_path,
                        config["model.init_checkpoint"])
            config["model.init_checkpoint"] = None
        # Without annotations (detr predict on plain images) the checkpoint names the classes.
        if ckpt_path and config.get("data.categories_from") is None:
            config["data.categories_from"] = str(ckpt_path)

    def fit(self, **kwargs: Any) -> None:
        """``trainer.fit`` in output folders that no other run owns (:mod:`detr.lightning.run_folder`)."""
        overwrite = bool(self.config.get(str(self.subcommand), self.config).get("overwrite_run"))
        with claim_run_folder(self.trainer, resuming=kwargs.get("ckpt_path") is not None, overwrite=overwrite):
            try:
                self.trainer.fit(**kwargs)
            except SystemExit as exit_:
                # Lightning ends a fit stopped by Ctrl-C with status 1, as if it had failed; once LastCheckpoint
                # saved the step reached, the status says "interrupted" (128 + SIGINT), as a shell does.
                if any(isinstance(c, LastCheckpoint) and c.interrupted for c in self.trainer.callbacks):
                    raise SystemExit(INTERRUPTED_EXIT_CODE) from exit_
                raise

    def predict(self, **kwargs: Any) -> Any:
        """``trainer.predict``; ``--overwrite_run`` lets the predictions writers replace an earlier run's files."""
        if self.config.get(str(self.subcommand), self.config).get("overwrite_run"):
            for writer in (c for c in self.trainer.callbacks if isinstance(c, PredictionsWriter)):
                writer.overwrite = True
        return self.trainer.predict(**kwargs)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with :func:`run_loggers` unless the config names its own loggers (or ``logger: false``):
        into ``trainer.default_root_dir`` for ``fit``, into its ``validate/``, ``test/`` or ``predict/`` subfolder
        for the others, so that evaluating a run's checkpoint keeps the run's own metrics.csv and config.yaml."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        if "logger" not in kwargs and trainer_config.get("logger") in (None, True):
            root = trainer_config.get("default_root_dir") or os.getcwd()
            subfolder = self.subcommand if self.subcommand not in (None, "fit") else ""
            kwargs["logger"] = run_loggers(os.path.join(root, subfolder))
        trainer = super().instantiate_trainer(**kwargs)
        callbacks = trainer.callbacks
        for i, callback in enumerate(callbacks):
            if type(callback) is RichProgressBar:  # Lightning's default bar where rich is installed
                callbacks[i] = EpochProgressBar()
        return trainer


class EpochProgressBar(RichProgressBar):
    """Lightning's rich progress bar, whose "Epoch 3/-2" (``max_epochs - 1``) reads "Epoch 3" when the run has no
    epoch limit (``max_epochs: -1``: the step limit or a time budget ends it, as in the CPU configs)."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = super()._get_train_description(current_epoch)
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return description.replace(f"Epoch {current_epoch}/{self.trainer.max_epochs - 1}",
                                        f"Epoch {current_epoch}", 1)
        return description


def command_line_model_keys(args: Any) -> list[str]:
    """The ``model.*`` keys that command-line ``args`` set (``--model.optimizer.lr 1e-4``,
    ``--model.optimizer.lr=1e-4``), as the user wrote them: before :func:`detr.lightning.model_yaml.migrate_arguments`
    moves the config files' models onto the command line."""
    return [arg.split("=", 1)[0][2:] for arg in _argv(args) if arg.startswith("--model.")]


def command_line_config_files(args: Any) -> list[Path]:
    """The files of ``--config FILE`` / ``-c FILE`` / ``--config=FILE`` in command-line ``args``."""
    argv = _argv(args)
    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("--config", "-c")]
    files += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    return [Path(f) for f in files]


def config_file_problem(path: Path, _seen: frozenset[Path] = frozenset()) -> str | None:
    """Why the YAML config ``path`` (or one it includes with ``config: OTHER.yaml``) cannot configure a run, in
    one line naming the file, or None. jsonargparse's own messages name no file ("Unexpected config:" for an
    empty one, a YAML error "in <unicode string>") and come below a usage of every option."""
    if not path.is_file():
        return None  # jsonargparse says "File does not exist", naming it
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        return f"config {path} is not valid YAML{where}: {problem}; fix the file or pass another --config"
    except (OSError, UnicodeDecodeError) as error:
        return f"config {path} cannot be read: {error}"
    if content is None:
        return (f"config {path} is empty: a config holds YAML keys such as `trainer:`, `model:` and `data:` "
                "(see configs/demo_shapes_cpu.yaml)")
    if not isinstance(content, dict):
        return f"config {path} holds a {type(content).__name__}, not YAML keys (`trainer:`, `model:`, `data:`)"
    included = content.get("config")
    if isinstance(included, str):
        target = (path.parent / included).resolve()
        if target not in _seen:
            return config_file_problem(target, _seen | {path.resolve()})
    return None


def _fields(detr: Namespace | None) -> dict[str, Any] | None:
    """A parsed ``model.detr`` (jsonargparse's class_path form) as the family form's fields."""
    return None if detr is None else family_form(detr.as_dict())


class _FamilyFormParser(LightningArgumentParser):
    """The parser, printing and saving ``model.detr`` in the family form users write (``family: dfine`` and the
    fields) rather than jsonargparse's class_path / init_args (:mod:`detr.lightning.model_yaml`)."""

    def dump(self, *args: Any, **kwargs: Any) -> Any:
        dumped = super().dump(*args, **kwargs)
        return family_form_yaml(dumped) if isinstance(dumped, str) else dumped

    def error(self, message: str, *args: Any, **kwargs: Any) -> Any:
        return super().error(_union_problem(message), *args, **kwargs)


def _union_problem(message: str) -> str:
    """jsonargparse's message for a ``model.detr`` value (typed "a family's config or a checkpoint's dict") lists
    what each type made of it ("Does not validate against any of the Union subtypes ... - num_queries must be ...
    - Expected a <class 'dict'> ..."): the config class's own problem, on one line; other messages as they are."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    entries: list[list[str]] = []
    inside = False
    for line in message.splitlines():
        stripped = line.strip()
        if stripped == "Errors:":
            inside = True
        elif inside and stripped.startswith("- "):
            entries.append([stripped[2:]])
        elif inside and entries and stripped and line.startswith("    "):
            entries[-1].append(stripped)
        elif inside and stripped:
            inside = False
    problems = [" ".join(entry) for entry in entries if not entry[0].startswith("Expected a <class 'dict'>")]
    return problems[0] if problems else message


def models_epilog() -> str:
    """The model families and their presets, as the end of ``detr --help`` and ``detr fit --help`` lists them."""
    lines = ["model families and their presets (model.detr: PRESET in a config, --model.detr PRESET on the command",
             "line; --model.detr.help CLASS lists a family's options):"]
    for family in families():
        names = ", ".join(family.presets) or "no presets"
        lines.append(textwrap.fill(f"{family.title} ({family.config_class.__name__}): {names}", width=116,
                                   initial_indent="  ", subsequent_indent="      ", break_long_words=False,
                                   break_on_hyphens=False))
    return "\n".join(lines)


class _HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, its epilog (:func:`models_epilog`) printed line by line as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


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


def make_cli(args: list[str] | None = None, *, run: bool = True, panoptic: bool = False) -> DetrCLI:
    """Build the CLI from ``args`` (``sys.argv[1:]`` when None) and, with ``run``, run its subcommand;
    ``panoptic`` selects the panoptic system and data module (``detr-panoptic``).

    With ``run=False`` nothing runs and ``args`` has no subcommand: the returned CLI holds the configured
    ``model``, ``datamodule`` and ``trainer`` for the caller to use (``cli.trainer.fit(cli.model, ...)``).
    """
    system, data = (PanopticSystem, PanopticDataModule) if panoptic else (DetrSystem, DetrDataModule)
    old_keys: set[str] = set()  # an earlier version's keys found (its defaults then fill what they leave unset)
    if not isinstance(args, dict):  # an earlier version's option names (--model.lr ...), as today's
        args = migrate_old_arguments(_argv(args), old_keys)
    mode = install_config_loader(old_keys)  # and its YAML keys, in every config file read
    argv = _argv(args)
    command_line_keys = command_line_model_keys(argv)  # the user's, not the config files' models moved beside them
    if argv:  # model.detr as a preset, the family form or the old one-record form: as jsonargparse reads it
        migrated = migrate_arguments(argv)
        args = migrated if migrated != argv or args is not None else args
    # the subcommand asked for, first on the command line as the shell gives it; otherwise (none, a misspelt
    # one) every parser, so that the error lists every choice
    names = (argv[0],) if argv and argv[0] in SUBCOMMANDS else SUBCOMMANDS
    usage: dict[str, Any] = {subcommand: {"usage": _USAGE, "parser_mode": mode, "epilog": models_epilog(),
                                          "formatter_class": _HelpFormatter} for subcommand in names}
    # the command passes sys.argv[1:] itself (less --debug): Lightning's warning that args and sys.argv are both
    # given is about calls from Python, not this one, and opened every `detr fit` with four lines of noise
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run from within Python")
    return DetrCLI(system, data, args=args, run=run, save_config_kwargs={"overwrite": True},
                   parser_kwargs={"parser_mode": mode, "epilog": models_epilog(), "formatter_class": _HelpFormatter,
                                  **usage} if run else {"usage": _USAGE, "parser_mode": mode},
                   subcommand_names=names, old_keys=old_keys, command_line_keys=command_line_keys)


def show_package_messages() -> None:
    """Print this package's INFO messages (the COCO and per-class tables of every evaluation) on stderr,
    unless the application configured the "detr" logger itself."""
    package_logger = logging.getLogger("detr")
    if not package_logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        package_logger.addHandler(handler)
        package_logger.setLevel(logging.INFO)


class _StderrHandler(logging.StreamHandler):
    """A handler on ``sys.stderr`` as it is when a message comes, not as it was when the handler was made: a
    second ``main`` in one process (a notebook, a test after another) would otherwise write to the first's
    stream, which may be closed by then, and print a "--- Logging error ---" traceback for every message."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def hide_library_internal_warnings() -> None:
    """Silence warnings that one library raises about another's code, or that say the opposite of what this
    project does, and that no ``detr`` user can act on: torch 2.14 deprecates ``LeafSpec``, which Lightning
    (2.6.6, the newest) still builds in its pytree helper, so every ``detr fit`` printed a FutureWarning
    pointing into lightning/pytorch/utilities; Lightning's advertisement of its hosted logger on every
    command; "your dataloader is not resumable" on every mid-epoch resume, which draws the rest of the epoch
    from a fresh shuffle on purpose (docs/guides/train-on-your-data.md); and ModelCheckpoint's "could not find the monitored
    key" (val/AP) when a checkpoint is saved before the first validation: once a validation has run, a key
    it does not log is an error Lightning raises, not this warning."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    warnings.filterwarnings("ignore", message=r"`ModelCheckpoint\(monitor=.*\)` could not find the monitored key")
    # Lightning 2.6 advertises its hosted logger on every command ("💡 Tip: ... litlogger ..."): not ours to say
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger_ = logging.getLogger(name)
        if not any(isinstance(f, _AdvertisementFilter) for f in logger_.filters):
            logger_.addFilter(_AdvertisementFilter())


class _AdvertisementFilter(logging.Filter):
    """Drops Lightning's "💡 Tip" advertisements (the litlogger one on every command)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def main(args: list[str] | None = None, *, panoptic: bool = False) -> int:
    """Entry point of the ``detr`` command: ``detr fit|validate|test|predict --config ...``
    (``panoptic``: of ``detr-panoptic``).

    Shows this package's INFO messages (e.g. the COCO summary, per-class AP and PQ tables of every
    evaluation) next to Lightning's. Exit status: 0; 1 when ``predict`` could not predict some images (the
    others are written); 143 when SIGTERM stopped ``fit`` after saving last.ckpt, 130 when Ctrl-C (SIGINT) did."""
    show_package_messages()
    hide_library_internal_warnings()
    cli = make_cli(args, panoptic=panoptic)
    writers = [c for c in getattr(cli.trainer, "callbacks", []) if isinstance(c, PredictionsWriter)]
    return 1 if any(writer.failed for writer in writers) else 0


def panoptic_main(args: list[str] | None = None) -> int:
    """Entry point of the ``detr-panoptic`` command: :func:`main` over the panoptic system and data."""
    return main(args, panoptic=True)


if __name__ == "__main__":
    raise SystemExit(main())
