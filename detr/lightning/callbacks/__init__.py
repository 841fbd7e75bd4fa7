"""Callbacks for the training system, one module per concern; configs name them as
``detr.lightning.callbacks.<Class>`` (re-exported here).

- :mod:`~detr.lightning.callbacks.validation_images`: :class:`DrawValidationPredictions`, validation images
  with their true and predicted boxes;
- :mod:`~detr.lightning.callbacks.averaging`: :class:`ExponentialMovingAverage` of the weights;
- :mod:`~detr.lightning.callbacks.training_time`: :class:`TrainingThroughput` and :class:`TimeBudget`, over a
  :class:`TrainingClock` that validation does not advance;
- :mod:`~detr.lightning.callbacks.progress_lines`: :class:`ProgressLines`, one console line per validation and
  the step count a :class:`TimeBudget` is expected to hold (the demo's quiet output);
- :mod:`~detr.lightning.callbacks.fit_report`: :class:`FitReport`, ``detr fit``'s lines in a log file, the AP
  curve after every validation and the best checkpoint at the end (always there in ``detr fit``);
- :mod:`~detr.lightning.callbacks.predictions_writer`: :class:`PredictionsWriter`, ``detr predict``'s COCO
  results json.
"""

from detr.lightning.callbacks.averaging import ExponentialMovingAverage
from detr.lightning.callbacks.fit_report import FitReport
from detr.lightning.callbacks.predictions_writer import PredictionsWriter
from detr.lightning.callbacks.progress_lines import ProgressLines
from detr.lightning.callbacks.training_time import (
    TimeBudget,
    TrainingClock,
    TrainingThroughput,
    decay_schedulers,
    time_budget_of,
)
from detr.lightning.callbacks.validation_images import DrawValidationPredictions

__all__ = ["DrawValidationPredictions", "ExponentialMovingAverage", "FitReport", "PredictionsWriter", "ProgressLines",
           "TimeBudget", "TrainingClock", "TrainingThroughput", "decay_schedulers", "time_budget_of"]
