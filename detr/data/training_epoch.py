"""The training epoch as the DataLoader workers see it, and the augmentation that stops at an epoch.

RT-DETRv2 and D-FINE train their last epochs without the strong augmentations and at the base square (their
``stop_epoch`` policy: docs/models/rtdetr.md, "The authors' augmentations"). The transform and the collate that decide
this run in the loader's worker processes, which hold copies of them, so the epoch cannot be a plain attribute
set in the training process: workers that persist across epochs would never see it change. :class:`SharedEpoch`
keeps it in a shared-memory tensor that the training process writes before an epoch's workers start (or resume)
and every worker reads per sample.
"""

from __future__ import annotations

from typing import Any

import torch

from detr.data.transforms import reseed_transform


class SharedEpoch:
    """A training epoch (0-based, Lightning's ``current_epoch``) shared with DataLoader workers.

    The value lives in shared memory: workers that fork from, or are sent (pickled by ``torch.multiprocessing``)
    this object read what the training process last :meth:`set`, persistent workers included.
    """

    def __init__(self, epoch: int = 0) -> None:
        self._value = torch.full((), int(epoch), dtype=torch.int64).share_memory_()

    def set(self, epoch: int) -> None:
        """Make ``epoch`` the current epoch, for this process and every worker."""
        self._value.fill_(int(epoch))

    def get(self) -> int:
        """The current epoch."""
        return int(self._value)

    def __repr__(self) -> str:
        return f"SharedEpoch({self.get()})"


class StopAtEpoch:
    """A transform that runs ``augmented`` before epoch ``stop_epoch`` and ``plain`` from it on.

    Both are albumentations-style callables with the same call and output (:mod:`detr.data.transforms`), e.g. the
    authors' full pipeline and its flip + resize (:func:`detr.data.transforms.make_rtdetr_train_transform`).

    Args:
        augmented: the transform of epochs ``< stop_epoch``.
        plain: the transform of epochs ``>= stop_epoch``.
        stop_epoch: the first epoch (0-based) of ``plain``.
        epoch: where the current epoch is read, once per sample.
    """

    def __init__(self, augmented: Any, plain: Any, *, stop_epoch: int, epoch: SharedEpoch) -> None:
        self.augmented, self.plain = augmented, plain
        self.stop_epoch = stop_epoch
        self.epoch = epoch

    def __call__(self, **data: Any) -> dict[str, Any]:
        transform = self.augmented if self.epoch.get() < self.stop_epoch else self.plain
        return transform(**data)

    def set_random_seed(self, seed: int) -> None:
        """Reseed both transforms (:func:`detr.data.transforms.reseed_transform`), each from its own seed."""
        reseed_transform(self.augmented, seed)
        reseed_transform(self.plain, seed + 1)

    def __repr__(self) -> str:
        return f"StopAtEpoch(stop_epoch={self.stop_epoch}, epoch={self.epoch.get()})"
