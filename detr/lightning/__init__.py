"""Lightning integration: the training system, the data module, callbacks and the ``detr`` CLI."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detr.lightning.datamodule import DetrDataModule
    from detr.lightning.system import DetrSystem, NonFiniteLossError

__all__ = ["DetrDataModule", "DetrSystem", "NonFiniteLossError"]

# Imported on first use (PEP 562): `detr --help` (detr.lightning.command) prints without loading Lightning.
_MODULE_OF = {"DetrDataModule": "detr.lightning.datamodule", "DetrSystem": "detr.lightning.system",
              "NonFiniteLossError": "detr.lightning.system"}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'detr.lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value
