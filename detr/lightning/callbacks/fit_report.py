"""What a ``detr fit`` says and draws as it goes: a line every ``log_every_n_steps`` steps when the output is no
terminal (a log file, CI, nohup: no progress bar to read there), a line per validation, the AP curve drawn after
each validation (``ap_curve.png`` in the run folder), and at the end the best checkpoint with its AP and score
threshold."""

from __future__ import annotations

import io
import logging
import math
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import lightning as L

from detr.atomic_files import write_atomically

logger = logging.getLogger(__name__)

#: The figure each validation redraws in the run folder.
AP_CURVE_NAME = "ap_curve.png"


class FitReport(L.Callback):
    """Report a fit in plain lines and one figure.

    Args (``detr fit --fit_report.step_lines true``, ...):
        step_lines: a line every ``trainer.log_every_n_steps`` optimizer steps (step, loss, seconds a step, time
            left); None: when standard output is not a terminal (a log file, where a progress bar is unreadable).
        quiet: no lines at all, only the figure (a caller that writes its own, as ``make demo``).

    ``stream`` (an attribute, standard output when None) is where the lines go; ``folder`` where ``ap_curve.png``
    goes (None: the trainer's ``default_root_dir``, the run folder).
    """

    def __init__(self, step_lines: bool | None = None, quiet: bool = False) -> None:
        super().__init__()
        self.step_lines = step_lines
        self.quiet = quiet
        self.stream: TextIO | None = None
        self.folder: Path | None = None
        #: (step, AP, AP50) of every validation of this fit
        self.history: list[tuple[int, float, float]] = []
        self._clock: tuple[int, float] | None = None  # (step, time) where the step rate is measured from

    # ------------------------------------------------------------------ lines
    def _write(self, line: str) -> None:
        if self.quiet:
            return
        stream = self.stream if self.stream is not None else sys.stdout
        print(line, file=stream, flush=True)

    def _wants_step_lines(self) -> bool:
        if self.step_lines is not None:
            return self.step_lines
        stream = self.stream if self.stream is not None else sys.stdout
        return not (hasattr(stream, "isatty") and stream.isatty())

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        # last.ckpt is written at a validation's end before this callback's own hook has run: the point of the
        # validation under way is recorded here first, so that a resumed run's curve goes on from all of them
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.validating and not trainer.sanity_checking:
            self._record(trainer)
        return {"history": [list(point) for point in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [(int(step), float(ap), float(ap50)) for step, ap, ap50 in state_dict.get("history", [])]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._clock = (trainer.global_step, time.perf_counter())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        every = trainer.log_every_n_steps
        step = trainer.global_step
        if not trainer.is_global_zero or not every or step % every or not self._wants_step_lines():
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        parts = [f"step {step}" + (f"/{trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else "")]
        if loss is not None:
            parts.append(f"loss {float(loss):.4g}")
        if self._clock is not None and step > self._clock[0]:
            seconds = (time.perf_counter() - self._clock[1]) / (step - self._clock[0])
            parts.append(f"{seconds:.2f} s/step")
            total = _total_steps(trainer)
            if total is not None and total > step:
                parts.append(f"about {timedelta(seconds=round(seconds * (total - step)))} left")
        self._write("; ".join(parts))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not trainer.is_global_zero:
            return
        if not self._record(trainer):
            return
        _, ap, ap50 = self.history[-1]
        best = max(value for _, value, _ in self.history)
        self._write(f"validation at step {trainer.global_step}: AP {ap:.3f}, AP50 {ap50:.3f} (best so far {best:.3f})")
        path = self._folder(trainer) / AP_CURVE_NAME
        try:
            write_ap_curve(self.history, path)
        except OSError as error:  # a figure is not worth stopping a run for
            logger.warning("could not write %s: %s", path, error)

    def _record(self, trainer: L.Trainer) -> bool:
        """Add this validation's (step, AP, AP50) to the history once; False when it logged no AP."""
        metrics = trainer.callback_metrics
        if "val/AP" not in metrics:
            return False
        if not self.history or self.history[-1][0] != trainer.global_step:
            self.history.append((trainer.global_step, float(metrics["val/AP"]),
                                 float(metrics.get("val/AP50", math.nan))))
        return True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        lines = [f"trained to step {trainer.global_step}"]
        checkpoint = trainer.checkpoint_callback
        best_path = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
        best_score = getattr(checkpoint, "best_model_score", None) if checkpoint is not None else None
        if best_path:
            monitor = getattr(checkpoint, "monitor", None) or "score"
            score = f", {monitor} {float(best_score):.3f}" if best_score is not None else ""
            lines.append(f"best checkpoint: {best_path}{score}")
        threshold = getattr(pl_module, "score_threshold", None)
        lines.append(f"score threshold (best F1 at the last validation): {threshold:.2f}" if threshold is not None
                     else "no validated score threshold (no validation found one with detections)")
        if self.history:
            lines.append(f"AP curve: {self._folder(trainer) / AP_CURVE_NAME}")
        self._write("; ".join(lines))

    def _folder(self, trainer: L.Trainer) -> Path:
        return self.folder if self.folder is not None else Path(trainer.default_root_dir)


def _total_steps(trainer: L.Trainer) -> int | None:
    """The step the fit ends at, when the trainer knows it (max_steps, or the epochs' stepping batches)."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - Lightning raises several kinds where it cannot tell
        return None
    return int(total) if math.isfinite(total) else None


def write_ap_curve(history: list[tuple[int, float, float]], path: str | Path) -> Path:
    """Draw AP and AP50 against the training step (one point per validation) into the PNG ``path``, whole or not
    at all."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    steps = [step for step, _, _ in history]
    figure = Figure(figsize=(5, 3.2), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.plot(steps, [ap for _, ap, _ in history], marker="o", label="AP")
    axes.plot(steps, [ap50 for _, _, ap50 in history], marker="s", label="AP50")
    axes.set_xlabel("training step")
    axes.set_ylabel("COCO AP (validation)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_atomically(path, lambda file: file.write(buffer.getvalue()))
