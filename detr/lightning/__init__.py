"""Lightning integration: the training system, the data module, callbacks and the ``detr`` CLI."""

from detr.lightning.datamodule import DetrDataModule
from detr.lightning.system import DetrSystem, NonFiniteLossError

__all__ = ["DetrDataModule", "DetrSystem", "NonFiniteLossError"]
