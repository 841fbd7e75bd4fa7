"""Tensors that depend only on an input's size (RT-DETR's anchors, AIFI's sin-cos positions, D-FINE's point
scales), kept between calls under ``torch.inference_mode``, so that inference does not rebuild them for every
image (dozens of small operations each, which cost most on a busy CPU; docs/measurements/speed.md).

They are kept only under inference mode: there no graph is traced or exported (which must compute them, or hold
them as its own constants), and nothing is saved for backward (which an inference tensor cannot be). Each module
owns its cache (no module-level state), keyed by the sizes, the device and the dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch

Kept = TypeVar("Kept")
#: Entries kept per cache before it starts over: a model sees one or a few input sizes.
MAX_ENTRIES = 8


class SizeConstants(Generic[Kept]):
    """``compute(key, device=..., dtype=...)``, kept per (key, device, dtype) while inference mode is on, computed
    afresh otherwise."""

    def __init__(self, compute: Callable[..., Kept]) -> None:
        self._compute = compute
        self._kept: dict[tuple[Hashable, torch.device, torch.dtype], Kept] = {}

    def __call__(self, key: Hashable, *, device: torch.device, dtype: torch.dtype) -> Kept:
        if not torch.is_inference_mode_enabled():
            return self._compute(key, device=device, dtype=dtype)
        full_key = (key, device, dtype)
        if full_key not in self._kept:
            if len(self._kept) >= MAX_ENTRIES:
                self._kept.clear()
            self._kept[full_key] = self._compute(key, device=device, dtype=dtype)
        return self._kept[full_key]
