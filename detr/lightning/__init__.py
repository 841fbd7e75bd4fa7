"""Lightning integration: the training system, the data module, callbacks and the ``detr`` CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detr import lazy_exports

if TYPE_CHECKING:
    from detr.lightning.datamodule import DetrDataModule
    from detr.lightning.system import DetrSystem, NonFiniteLossError

__all__ = ["DetrDataModule", "DetrSystem", "NonFiniteLossError"]

# Imported on first use (PEP 562): `detr --help` (detr.lightning.command) prints without loading Lightning.
_MODULE_OF = {"DetrDataModule": "detr.lightning.datamodule", "DetrSystem": "detr.lightning.system",
              "NonFiniteLossError": "detr.lightning.system"}


__getattr__ = lazy_exports(__name__, _MODULE_OF)
