"""One run, one folder: a new ``detr fit`` never writes into a folder that a live or finished run owns.

Two runs in one folder mix their files: both CSV loggers write one ``metrics.csv`` (and die on each
other's columns), Lightning names the second run's checkpoints ``-v1`` so ``last.ckpt`` stays the first
run's, and a resumed run's CSV logger deletes the ``metrics.csv`` it resumes. So before fit starts,
:func:`claim_run_folder` looks at the folders the trainer will write (every logger's log dir and the
checkpoint folder, as Lightning resolves them) and:

- refuses while another live run holds the folder's lock (naming its process, host, start time and
  command);
- refuses when the folder holds a previous run's files (checkpoints, ``metrics.csv``,
  ``hparams.yaml``), naming them, unless the new run resumes (``--ckpt_path``) or ``overwrite`` is
  set (the previous run's checkpoints and logs, TensorBoard events included, are deleted first);
- when resuming, keeps the previous ``metrics.csv`` as ``metrics-1.csv`` (``-2`` ...), since the
  CSV logger starts a new one;
- refuses a ``config.yaml`` there that no run wrote (the user's own: the run would replace it with its
  resolved config);
- holds the folders with ``run.lock`` (:func:`detr.output_folder.hold_folders`: JSON with pid, host, start
  time, command), removed when the run ends. A lock left by a killed process (its pid is gone) does not
  block, but its folder still counts as a previous run.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from detr.lightning.checkpointing import checkpoint_directory
from detr.output_folder import LOCK_NAME, OutputFolderError, hold_folders

__all__ = ["LOCK_NAME", "RunFolderError", "claim_run_folder", "open_csv_logs", "previous_run_files", "run_folders"]

logger = logging.getLogger(__name__)

#: Files that mark a folder as used by a run (besides checkpoints and the lock).
RUN_FILES = ("metrics.csv", "hparams.yaml")
#: What a run draws into its folder, deleted with its files by --overwrite_run (FitReport's AP curve).
DRAWN_FILES = ("ap_curve.png",)


#: How to give a fit run another folder, for the errors.
ELSEWHERE = "--trainer.default_root_dir, or the loggers' save_dir"


class RunFolderError(OutputFolderError):
    """The output folder belongs to another run (live or finished)."""


def run_folders(trainer: L.Trainer) -> tuple[list[Path], Path]:
    """(every logger's log dir, or ``default_root_dir`` without loggers; the checkpoint folder)."""
    log_dirs: list[Path] = []
    for logger_ in trainer.loggers:
        log_dir = getattr(logger_, "log_dir", None)
        if log_dir:
            log_dirs.append(Path(log_dir))
    if not trainer.loggers:
        log_dirs.append(Path(trainer.default_root_dir))
    return list(dict.fromkeys(log_dirs)), checkpoint_directory(trainer)


def previous_run_files(log_dirs: list[Path], checkpoint_dir: Path) -> list[Path]:
    """Files of an earlier run in these folders: checkpoints, metrics.csv, hparams.yaml. (TensorBoard's
    events file alone does not count: a run that stopped at setup, e.g. on a data error, leaves one.)"""
    found: list[Path] = sorted(checkpoint_dir.glob("*.ckpt")) if checkpoint_dir.is_dir() else []
    for folder in log_dirs:
        if folder.is_dir():
            found += [folder / name for name in RUN_FILES if (folder / name).is_file()]
    return list(dict.fromkeys(found))


def _events_files(log_dirs: list[Path]) -> list[Path]:
    return [path for folder in log_dirs if folder.is_dir() for path in sorted(folder.glob("events.out.tfevents.*"))]


def _lock_folders(log_dirs: list[Path], checkpoint_dir: Path) -> list[Path]:
    """The outermost folders: one lock each (the checkpoint folder usually lies inside the log dir)."""
    folders = [p.resolve() for p in [*log_dirs, checkpoint_dir.parent]]
    return [f for f in dict.fromkeys(folders) if not any(f != o and o in f.parents for o in folders)]


@contextlib.contextmanager
def claim_run_folder(
    trainer: L.Trainer, *, resuming: bool, overwrite: bool = False, command: str | None = None
) -> Iterator[list[Path]]:
    """Check and lock the trainer's output folders for one fit (module docstring); yields the locks.

    Raises:
        RunFolderError: a live run holds a folder, or a previous run's files are there and the run neither
            resumes nor overwrites.
    """
    if rank_zero_only.rank != 0:  # the other processes of a multi-process run write where rank 0 claimed
        yield []
        return
    log_dirs, checkpoint_dir = run_folders(trainer)
    folders = _lock_folders(log_dirs, checkpoint_dir)
    with hold_folders(folders, elsewhere=ELSEWHERE, command=command, error=RunFolderError) as locks:
        _check_previous_run(folders[0], log_dirs, checkpoint_dir, resuming=resuming, overwrite=overwrite)
        open_csv_logs(trainer)
        yield locks


#: How the config.yaml that LightningCLI writes into a run's folder begins (its dump header).
RUN_CONFIG_HEADER = "# lightning.pytorch=="


def _refuse_a_users_config(log_dirs: list[Path]) -> None:
    """Raise :class:`RunFolderError` for a ``config.yaml`` in a log dir that no run wrote (it lacks LightningCLI's
    header): the run writes its resolved config there and replaced the user's file without a word."""
    for folder in log_dirs:
        config = folder / "config.yaml"
        try:
            with config.open() as file:
                start = file.read(len(RUN_CONFIG_HEADER))
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            continue
        if start != RUN_CONFIG_HEADER:
            raise RunFolderError(
                f"{config} is not a config that a run wrote, and this run would replace it with its resolved config "
                f"(config.yaml in its folder): move that file elsewhere (and pass it with --config from there), or "
                f"give this run another folder ({ELSEWHERE})")


def _check_previous_run(folder: Path, log_dirs: list[Path], checkpoint_dir: Path, *, resuming: bool,
                        overwrite: bool) -> None:
    _refuse_a_users_config(log_dirs)
    previous = previous_run_files(log_dirs, checkpoint_dir)
    if previous and not resuming:
        more = f" and {len(previous) - 6} more" if len(previous) > 6 else ""
        shown = ", ".join(str(p) for p in previous[:6]) + more
        if not overwrite:
            last = checkpoint_dir / "last.ckpt"
            raise RunFolderError(
                f"output folder {folder} holds a previous run ({shown}). Resume it with --ckpt_path "
                f"{last if last.is_file() else checkpoint_dir / '<checkpoint>.ckpt'}, start over there with "
                f"--overwrite_run true (deletes those files), or give this run another folder ({ELSEWHERE})"
            )
        logger.warning("--overwrite_run: deleting the previous run's files: %s", shown)
        drawn = [folder / name for folder in log_dirs for name in DRAWN_FILES if (folder / name).is_file()]
        for path in [*previous, *_events_files(log_dirs), *drawn]:  # TensorBoard would draw both runs as one
            path.unlink()
    if resuming:
        for log_dir in log_dirs:
            _keep_previous_metrics(log_dir)


def open_csv_logs(trainer: L.Trainer) -> None:
    """Open the CSV loggers' files now, without Lightning's "Previous log files in this directory will be
    deleted" notice: it fires on any non-empty folder, so every run printed it (its own run.lock is there),
    and what it guards against is done by the folder's claim (fit: a previous metrics.csv is refused, deleted
    with --overwrite_run, or kept as metrics-N.csv on resume; predict: PredictionsWriter's claim)."""
    for logger_ in trainer.loggers:
        if isinstance(logger_, CSVLogger):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
                logger_.experiment  # noqa: B018 (creating the writer is what runs Lightning's check)


def _keep_previous_metrics(folder: Path) -> None:
    current = folder / "metrics.csv"
    if not current.is_file():
        return
    index = 1
    while (folder / f"metrics-{index}.csv").exists():
        index += 1
    kept = folder / f"metrics-{index}.csv"
    shutil.move(current, kept)
    logger.info("resuming: the previous metrics.csv is kept as %s (the CSV logger starts a new one)", kept)
