"""Checkpoints a long run can rely on: always current, always whole, and written on preemption.

- :class:`AtomicCheckpointIO` writes every checkpoint through a temporary file beside the target
  (:func:`detr.atomic_files.write_atomically`): a kill at any moment leaves the previous file intact.
  Reading a file that is truncated or not a checkpoint raises a :class:`detr.checkpoints.CheckpointError`
  that names it. The temporary files of saves killed mid-write (their process is gone) are deleted when
  a run starts and at every save of ``last.ckpt`` (:func:`remove_stale_temporary_files`).
- :class:`LastCheckpoint` rewrites ``last.ckpt`` at every validation, every ``every_n_train_steps``
  steps and at the end of training, whether or not the monitored metric improved (Lightning's
  ``ModelCheckpoint(save_last=True)`` rewrites it only when it also saves a best checkpoint). On
  SIGTERM (preemption) it writes ``last.ckpt`` at the step reached and makes the process exit with
  status 143 (128 + SIGTERM) instead of Lightning's 0, so schedulers see that the run did not finish;
  on Ctrl-C (SIGINT) likewise, with status 130; on an error mid-run (an unreadable image, non-finite
  values) it saves the step reached too and adds the resume command to the error.

Resuming (``detr fit ... --ckpt_path .../checkpoints/last.ckpt``) continues at the saved step. From a
checkpoint written mid-epoch, Lightning restores the step, epoch and batch counters, the optimizer and
the schedulers, but not the position in the shuffled data: the epoch's remaining batches are drawn
from a new pass over the data set (Lightning warns "not resumable"), so some images of that epoch are
seen twice and others not at all. The epoch still has its usual number of steps. A run that ended on
``max_steps`` is saved at its last step, mid-epoch; one stopped by a time budget (``should_stop``) is
saved when training ends, after Lightning closed the epoch, so resuming it starts the next epoch.

The training system also keeps every process's random number generator states in its checkpoints
(:func:`save_rng_states`, :func:`restore_rng_states`), so that a resumed run draws the same dropout and
shuffling as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from detr.atomic_files import write_atomically
from detr.checkpoints import CheckpointError
from detr.evaluation.gather import gather_to_rank_zero
from detr.output_folder import process_is_alive

logger = logging.getLogger(__name__)

#: Exit status of a run stopped by SIGTERM after saving ``last.ckpt`` (the shell's 128 + 15).
PREEMPTED_EXIT_CODE = 143
#: Exit status of a run stopped by Ctrl-C (SIGINT) after saving ``last.ckpt`` (the shell's 128 + 2).
INTERRUPTED_EXIT_CODE = 130

LAST_NAME = "last.ckpt"


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) back until the block ends, then let it interrupt as it would have.

    A KeyboardInterrupt raised inside ``torch.save`` leaves its zip writer half-done, and closing it then
    raises a RuntimeError ("unexpected pos") that replaces the interrupt: the run ended with status 1 and
    "once the cause is fixed" instead of 130 and the resume hint. The block swaps in a handler that only
    notes the signal (a signal already caught but not yet handled reaches it too), and on leaving restores
    the previous one and calls it. Outside the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, None)  # Python's default raises KeyboardInterrupt here
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO with atomic local writes and readable errors (module docstring).

    Remote paths (``s3://`` ...) go through Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with ctrl_c_deferred():
            write_atomically(path, lambda file: torch.save(checkpoint, file))

    def load_checkpoint(
        self, path: Any, map_location: Callable | None = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        try:
            checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError as error:
            raise CheckpointError(f"checkpoint file {path} does not exist") from error
        except Exception as error:  # EOFError, UnpicklingError, RuntimeError, KeyError ... by how the file is broken
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            raise CheckpointError(
                f"could not read checkpoint {path} ({size} bytes): {type(error).__name__}: {error}. The file is "
                "truncated or not a checkpoint; resume from another one (the best-model checkpoints beside it) "
                "or start over"
            ) from error
        if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
            # a weights file (the authors' .pth, a state dict): Lightning failed on it with a bare KeyError
            raise CheckpointError(
                f"{path} holds weights only, not a training run's state (step, optimizer, schedule): --ckpt_path "
                f"takes a checkpoint that detr fit wrote (its checkpoints/last.ckpt). To start from these weights, "
                f"pass --model.init_checkpoint {path} instead")
        return checkpoint


#: Model options that differ between a config and a checkpoint without changing the model: the data decides
#: the class count (linked at instantiation), and an init_checkpoint run records pretrained_backbone off.
_NOT_THE_MODEL = ("num_classes", "pretrained_backbone")


def warn_of_replaced_model_options(configured: Any, restored: Any, ckpt_path: str) -> list[str]:
    """Log a warning naming each ``model.detr`` option whose value the config (file or defaults) gave and
    ``--ckpt_path``'s hyperparameters replaced: LightningCLI reads them over the config, so ``--config
    configs/deformable_shapes_cpu.yaml --ckpt_path <a DETR checkpoint>`` trained the checkpoint's DETR without
    a word. ``configured``, ``restored``: the option values before and after (namespaces or dicts). Returns
    the differences, ``"name: checkpoint's value (the config's value)"``."""
    before, after = _as_dict(configured), _as_dict(restored)
    replaced = [f"{name} {after[name]!r} (the config: {before[name]!r})" for name in before
                if name in after and name not in _NOT_THE_MODEL and before[name] != after[name]]
    if replaced:
        logger.warning(
            "--ckpt_path %s keeps the checkpoint's model, not the config's: %s. To train the config's model, start a "
            "new run that fine-tunes the checkpoint's weights with --model.init_checkpoint %s (without --ckpt_path)",
            ckpt_path, "; ".join(replaced), ckpt_path)
    return replaced


def _as_dict(values: Any) -> dict[str, Any]:
    if values is None:
        return {}
    return dict(values.as_dict() if hasattr(values, "as_dict") else values)


def use_atomic_checkpoint_io(trainer: L.Trainer) -> None:
    """Make ``trainer`` write checkpoints with :class:`AtomicCheckpointIO` (if it uses Lightning's default IO)."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()


def checkpoint_directory(trainer: L.Trainer) -> Path:
    """Where ``ModelCheckpoint`` puts checkpoints: the first ModelCheckpoint's ``dirpath`` when set, else
    ``<save_dir>/<name>/<version>/checkpoints`` of the first logger, else ``<default_root_dir>/checkpoints``
    (Lightning's own rule, resolved here before ModelCheckpoint resolves it in its setup)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath)
    if trainer.loggers:
        first = trainer.loggers[0]
        save_dir = first.save_dir if first.save_dir is not None else trainer.default_root_dir
        version = first.version if isinstance(first.version, str) else f"version_{first.version}"
        return Path(save_dir, str(first.name), version, "checkpoints")
    return Path(trainer.default_root_dir, "checkpoints")


class LastCheckpoint(L.Callback):
    """Keep ``last.ckpt`` current: rewritten at every validation, every ``every_n_train_steps`` optimizer
    steps, at the end of training, and when fit stops early: SIGTERM, Ctrl-C, an error (module docstring).

    Args:
        dirpath: the folder; default: the trainer's checkpoint folder (:func:`checkpoint_directory`).
        every_n_train_steps: also save every this many steps, for epochs longer than one can afford to
            lose (None or 0: only at validation, end and SIGTERM).

    At setup it installs :class:`AtomicCheckpointIO`, and it takes ``last.ckpt`` over from any
    ``ModelCheckpoint(save_last=True)`` writing into the same folder (that callback then keeps only its
    best checkpoints; two writers of one ``last.ckpt`` would make Lightning name one of them
    ``last-v1.ckpt``).
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int | None = 1000) -> None:
        super().__init__()
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise ValueError(f"LastCheckpoint: every_n_train_steps must be >= 0 or None, got {every_n_train_steps}")
        self.dirpath = dirpath
        self.every_n_train_steps = every_n_train_steps or 0
        self._saved_step: int | None = None
        self._saved_validated = False  # whether the save of _saved_step came after that step's validation
        self._start_step: int | None = None  # the step this fit started from (None before training starts)
        #: The KeyboardInterrupt (Ctrl-C) that stopped the last fit after a save, else None.
        self.interrupted: KeyboardInterrupt | None = None

    @property
    def state_key(self) -> str:
        return "LastCheckpoint"

    def path(self, trainer: L.Trainer) -> Path:
        """The ``last.ckpt`` file this callback writes."""
        return Path(self.dirpath) / LAST_NAME if self.dirpath else checkpoint_directory(trainer) / LAST_NAME

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        use_atomic_checkpoint_io(trainer)
        if stage != "fit":
            return
        self._saved_step, self._saved_validated, self._start_step, self.interrupted = None, False, None, None
        if trainer.is_global_zero:
            remove_stale_temporary_files(self.path(trainer).parent)
        # First in line: at the end of training, weight averaging copies the average into the model, and the
        # last checkpoint must hold the trained weights (with the average beside them) to resume from.
        if self in trainer.callbacks:
            trainer.callbacks.remove(self)
            trainer.callbacks.insert(0, self)
        own = self.path(trainer).parent.resolve()
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.save_last:
                continue
            folder = Path(callback.dirpath) if callback.dirpath is not None else checkpoint_directory(trainer)
            if folder.resolve() == own:
                callback.save_last = False
                logger.info("last.ckpt in %s is written by LastCheckpoint (at every validation, every %s steps, at "
                            "the end and on SIGTERM); ModelCheckpoint keeps the best checkpoints", own,
                            self.every_n_train_steps or "no")

    def save(self, trainer: L.Trainer, reason: str, *, validated: bool = False) -> Path | None:
        """Write ``last.ckpt`` now (every process must call this together); skipped when this step is saved.
        ``validated``: a validation has just run; if this step was saved before it (at max_steps the save comes
        first), the file's record is brought up to date (:meth:`refresh_record`) rather than saved again: a save
        from inside the validation would make a resumed run train that step's batch a second time."""
        if trainer.global_step == 0:
            return None
        if trainer.global_step == self._saved_step:
            if validated and not self._saved_validated:
                self.refresh_record(trainer)
            return None
        path = self.path(trainer)
        if trainer.is_global_zero:
            remove_stale_temporary_files(path.parent)
        # the full state (optimizer, schedulers, callbacks) that resuming needs; said explicitly, since
        # Lightning logs "`weights_only` was not set" at every save that leaves it to its default
        trainer.save_checkpoint(path, weights_only=False)
        self._saved_step, self._saved_validated = trainer.global_step, validated
        logger.info("saved %s at step %d (%s)", path, trainer.global_step, reason)
        return path

    def refresh_record(self, trainer: L.Trainer) -> None:
        """Put what the validation just changed into the ``last.ckpt`` of this step: the model's record
        (``checkpoint["detr"]``: the score threshold it found, the category map) and the callbacks' states (the best
        score so far, the AP curve), keeping the rest of the file (the loops' state of the step's end, from which a
        resume goes on); written whole or not at all, by rank 0."""
        module = trainer.lightning_module
        fresh: dict[str, Any] = {}
        if trainer.is_global_zero and hasattr(module, "on_save_checkpoint"):
            module.on_save_checkpoint(fresh)
        if trainer.is_global_zero and "detr" in fresh:
            path = self.path(trainer)
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)
            checkpoint["detr"] = fresh["detr"]
            states = checkpoint.setdefault("callbacks", {})
            for callback in trainer.callbacks:
                state = callback.state_dict()
                if state:
                    states[callback.state_key] = state
            AtomicCheckpointIO().save_checkpoint(checkpoint, path)
            logger.info("updated %s at step %d with its validation's record", path, trainer.global_step)
        self._saved_validated = True
        trainer.strategy.barrier("last_checkpoint_record")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0:
            self.save(trainer, f"every {self.every_n_train_steps} steps")
        elif 0 < trainer.max_steps <= trainer.global_step:
            # Saved here, not at on_train_end, where the loop has already closed the epoch: a run resumed
            # from there with a larger max_steps would skip the rest of this epoch.
            self.save(trainer, "end of training")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.save(trainer, "validation", validated=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer, "end of training")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_step = trainer.global_step

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Save what the run has when fit stops early: SIGTERM (exit status 143), Ctrl-C (SIGINT: 130, see
        :attr:`interrupted`) or an error (an unreadable image in the loader, non-finite values ...), which
        then carries a note naming the checkpoint and the resume command.

        Only when this fit trained a step since it started (a run that fails while restoring its checkpoint
        must not overwrite it), with finite weights, outside the sanity check, and in a single process (where
        one process fails alone, the others wait in a collective operation and a save, which all of them must
        join, would hang).
        """
        self.interrupted = None
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        trained = self._start_step is not None and trainer.global_step > self._start_step
        if isinstance(exception, SIGTERMException):
            path = self.save(trainer, "SIGTERM") or self.path(trainer)
            # Lightning stops on SIGTERM by raising a SystemExit without a code, i.e. status 0: "finished".
            exception.code = PREEMPTED_EXIT_CODE
            logger.warning("SIGTERM: stopped at step %d; %s holds it. Resume with --ckpt_path %s (exit status %d)",
                           trainer.global_step, path, path, PREEMPTED_EXIT_CODE)
            return
        if not trained or trainer.world_size > 1:
            return
        if not all(torch.isfinite(parameter).all() for parameter in pl_module.parameters()):
            # the last good last.ckpt is worth more than the step reached
            logger.warning("%s not saved after %s: the weights hold NaN or inf values", self.path(trainer),
                           type(exception).__name__)
            return
        try:
            path = self.save(trainer, type(exception).__name__) or self.path(trainer)
        except Exception:  # the run's own error is the one to report; this one only adds to it
            logger.exception("could not save %s after %s", self.path(trainer), type(exception).__name__)
            return
        if isinstance(exception, KeyboardInterrupt):
            # Lightning ends the process with status 1 after this hook; the CLI makes it 130 (128 + SIGINT)
            self.interrupted = exception
            logger.warning("SIGINT (Ctrl-C): stopped at step %d; %s holds it. Resume with --ckpt_path %s "
                           "(exit status %d)", trainer.global_step, path, path, INTERRUPTED_EXIT_CODE)
            return
        exception.add_note(f"The run stopped at step {trainer.global_step}, saved in {path}. Once the cause is "
                           f"fixed, resume with --ckpt_path {path}")


#: A temporary file of :func:`detr.atomic_files.write_atomically`: ``.<name>.<pid>.tmp``.
_TEMPORARY_NAME = re.compile(r"^\..+\.(\d+)\.tmp$")


def remove_stale_temporary_files(folder: Path) -> list[Path]:
    """Delete the temporary files that saves killed mid-write left in ``folder`` (``.last.ckpt.<pid>.tmp``, as
    large as a checkpoint): those whose process is gone. A live process's file is a save in progress and
    stays. Returns the files deleted. (Pids are this machine's: the run folder's lock keeps runs of other
    machines out of it.)"""
    removed = []
    for path in sorted(folder.glob(".*.tmp")) if folder.is_dir() else []:
        match = _TEMPORARY_NAME.match(path.name)
        if match is None or process_is_alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            removed.append(path)
            logger.info("removed %s (%d bytes), left by a save whose process (%s) was killed", path, size,
                        match.group(1))
    return removed


def seed_each_process(rank: int) -> None:
    """Seed this process with the entry point's seed plus its ``rank`` (as the authors' main.py: seed + rank).

    The entry point's seed_everything gives all processes one seed, so the model starts identical everywhere;
    after that, dropout and in-process augmentation should not draw the same numbers on every process. A
    resumed run then restores each process's own states from the checkpoint (:func:`restore_rng_states`)."""
    seed = (torch.initial_seed() + rank) % 2**32
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


#: The checkpoint key of :func:`save_rng_states`: one entry per process, by rank.
RNG_STATES_KEY = "detr_rng_states"


def save_rng_states(checkpoint: dict[str, Any]) -> None:
    """Put every process's RNG states into ``checkpoint`` (a list by rank; one entry outside a distributed run).

    Every process must call this together, as Lightning calls ``on_save_checkpoint`` on all of them: the
    states go to rank 0, which writes the checkpoint (:func:`detr.evaluation.gather.gather_to_rank_zero`;
    the other ranks' unwritten copies hold their own states only)."""
    states = rng_states()
    checkpoint[RNG_STATES_KEY] = gather_to_rank_zero(states) or [states]


def restore_rng_states(checkpoint: dict[str, Any], trainer: L.Trainer) -> None:
    """Set this process's RNG states from ``checkpoint`` (written by :func:`save_rng_states`), if it holds
    them for as many processes as this run has; otherwise warn that the random streams start afresh."""
    states = checkpoint.get(RNG_STATES_KEY)
    if not states:
        return
    if len(states) == trainer.world_size:
        set_rng_states(states[trainer.global_rank])
    else:
        logger.warning("checkpoint holds RNG states of %d processes, this run has %d; random streams "
                       "are not restored", len(states), trainer.world_size)


def rng_states() -> dict[str, Any]:
    """This process's RNG states (torch, CUDA when in use, numpy, Python) as tensors and plain Python values,
    so that the checkpoint loads with torch.load(weights_only=True)."""
    numpy_state = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [numpy_state[0], numpy_state[1].tolist(), int(numpy_state[2]), int(numpy_state[3]),
                  float(numpy_state[4])],
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Set this process's RNG states from :func:`rng_states`' record."""
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    random.setstate(_to_tuples(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _to_lists(value: Any) -> Any:
    return [_to_lists(v) for v in value] if isinstance(value, (tuple, list)) else value


def _to_tuples(value: Any) -> Any:
    return tuple(_to_tuples(v) for v in value) if isinstance(value, (tuple, list)) else value
