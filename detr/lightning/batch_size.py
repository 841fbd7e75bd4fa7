"""``--data.batch_size auto``: the largest training batch that fits in the memory the run has.

The rule, the same on the CPU and on a GPU: one probe measures the bytes a training forward keeps for backward
per image (the tensors autograd saves, counted once per storage: :func:`saved_bytes`), from the first image of the
data set, once as a batch of one and once as a batch of two copies of it; the difference is one image's share, scaled
up to the largest training image the data module can make (``square_size`` or the largest ``multi_scale`` side; the
largest training scale by ``train_max_size`` otherwise) in proportion to its pixels. The batch is the largest whose
share takes at most :data:`MEMORY_FRACTION` of the memory available (the CPU: the operating system's available
memory, ``MemAvailable`` of /proc/meminfo; a GPU: the free memory ``torch.cuda.mem_get_info`` reports), leaving
the rest to backward's gradients of the activations, the optimizer's state, the loaders and other processes; at
least 1, at most :data:`MAX_BATCH` and at most the training set's size. With several processes each probes its own
device and all take the smallest choice. The probe changes no weight, running statistic or random state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from detr.data.collate import collate_detection

logger = logging.getLogger(__name__)

#: The share of the available memory that the saved activations of a batch may take.
MEMORY_FRACTION = 0.25
#: The largest batch chosen (the recipes' largest global batch).
MAX_BATCH = 64


def available_memory(device: torch.device) -> int:
    """Bytes available to a new allocation on ``device``: a GPU's free memory, or on the CPU the operating
    system's available memory (Linux ``MemAvailable``; elsewhere psutil's ``available`` where it is installed).
    Raises ValueError where neither can be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    raise ValueError(f"--data.batch_size auto: cannot read the memory available on {device} (no /proc/meminfo, "
                     "no psutil); give a number (--data.batch_size 4) or install psutil")


def saved_bytes(run: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for backward while ``run()`` runs, each storage counted once
    (parameters included: they cancel in a difference of two runs)."""
    storages: dict[tuple[int, torch.device], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[(storage.data_ptr(), tensor.device)] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def largest_training_pixels(data: Any) -> int | None:
    """Pixels of the largest training image the data module makes: the square (``square_size`` or the largest
    ``multi_scale`` side), else the largest training scale by ``train_max_size``; None where it cannot tell."""
    sides = [side for side in [getattr(data, "square_size", None), *(getattr(data, "multi_scale", None) or ())]
             if side is not None]
    if sides:
        return max(sides) ** 2
    sizes = getattr(data, "sizes", None)
    if not sizes:
        return None
    return max(sizes["train_scales"]) * sizes["train_max_size"]


def choose_batch_size(system: Any, data: Any, device: torch.device) -> tuple[int, str]:
    """The batch of the module docstring's rule for the training ``system`` (a DetrSystem: its forward with
    targets and ``compute_losses``) on ``data`` (its training set and sizes), probed on ``device`` → the batch and
    a line that says how it was chosen."""
    dataset = data.val_dataset if data.val_dataset is not None else data.train_dataset
    if dataset is None or len(dataset) == 0:
        raise ValueError("--data.batch_size auto: no image to probe the memory of a training step with; give a "
                         "number (--data.batch_size 4)")
    image, target = dataset[0]
    buffers = {name: buffer.clone() for name, buffer in system.named_buffers()}
    was_training = system.training
    system.train()

    def step(count: int) -> None:
        images, mask, targets = collate_detection([(image, target)] * count)
        targets = [{key: value.to(device) if isinstance(value, torch.Tensor) else value
                    for key, value in each.items()} for each in targets]
        outputs = system(images.to(device), mask.to(device), targets)
        system.compute_losses(outputs, targets)

    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            one, two = saved_bytes(lambda: step(1)), saved_bytes(lambda: step(2))
    finally:
        with torch.no_grad():
            for name, buffer in system.named_buffers():
                buffer.copy_(buffers[name])
        system.train(was_training)
    probed_pixels = image.shape[-2] * image.shape[-1]
    largest = largest_training_pixels(data) or probed_pixels
    per_image = max(two - one, 1) * max(1.0, largest / probed_pixels)
    available = available_memory(device)
    train_size = len(data.train_dataset) if data.train_dataset is not None else MAX_BATCH
    batch = max(1, min(MAX_BATCH, train_size, math.floor(MEMORY_FRACTION * available / per_image)))
    line = (f"--data.batch_size auto: {batch} images per batch ({per_image / 2**20:.0f} MiB saved for backward per "
            f"image at {largest} pixels, {MEMORY_FRACTION:.0%} of {available / 2**30:.1f} GiB available on "
            f"{device.type}; at most {MAX_BATCH} and the training set's {train_size})")
    return batch, line


def resolve_auto_batch_size(system: Any, trainer: Any) -> None:
    """Where the trainer's data module asks for ``batch_size="auto"``, choose it (:func:`choose_batch_size`, the
    smallest choice of all processes), set it on the data module and log it."""
    data = getattr(trainer, "datamodule", None)
    if data is None or getattr(data, "batch_size", None) != "auto":
        return
    device = trainer.strategy.root_device
    batch, line = choose_batch_size(system, data, device)
    if trainer.world_size > 1:
        batch = int(trainer.strategy.reduce(torch.tensor(batch, device=device), reduce_op="min").item())
    data.set_batch_size(batch)
    logger.info(line if trainer.world_size == 1 else f"{line}; the smallest of the processes: {batch}")
