"""Train-pipeline throughput: images per second per DataLoader worker on data/coco-mini.

    .venv/bin/python benchmarks/data_throughput.py [--root data/coco-mini] [--images 100] [--workers 2] [--masks]

One worker is one process running decode → boxes → the authors' train augmentation (flip, multi-scale
resize 480..800 / max 1333, or resize + random crop + multi-scale) → normalise → tensor, then collate.
Printed: the machine, then (1) decoding alone and (2) the full train pipeline in this process (= one
worker), and (3) the full pipeline through a DataLoader with ``--workers`` processes (total and per
worker). Compare with the model's training step time: DETR R50 needs about 2 images per step per GPU
(the authors' recipe: 2 images per GPU, 32 GPUs), so one worker at N images/s feeds a step of up to 2/N seconds.
``--masks``: the targets also carry each box's instance mask (``--data.masks true``: polygons decoded, moved by
every step).
"""

from __future__ import annotations

import argparse
import random
import time

import albumentations
import cv2
import PIL
import torch
from machine import describe_machine
from torch.utils.data import DataLoader

from detr.data.coco import CocoDetection
from detr.data.collate import collate_detection
from detr.data.images import load_rgb_image
from detr.data.transforms import make_train_transform
from detr.lightning.datamodule import seed_worker_transform


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:7.1f} images/s  ({1000 * seconds / count:6.1f} ms/image, {count} images)"


def loader_throughput(dataset, order: list[int], workers: int, batch_size: int, seed: int) -> tuple[int, float]:
    """Images delivered and seconds taken by a DataLoader of ``workers`` processes over the samples ``order`` (in a
    seeded random order), after its first batch (workers started and warm)."""
    sampler = torch.utils.data.SubsetRandomSampler(order, generator=torch.Generator().manual_seed(seed))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        collate_fn=collate_detection, worker_init_fn=seed_worker_transform)
    iterator = iter(loader)
    next(iterator)
    start = time.perf_counter()
    count = 0
    for _, _, targets in iterator:
        count += len(targets)
    return count, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="data/coco-mini", help="COCO-layout folder")
    parser.add_argument("--split", default="train2017")
    parser.add_argument("--images", type=int, default=100, help="images per measurement (cycles the set)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for measurement (3); 0 skips it")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--masks", action="store_true", help="targets with instance masks (--data.masks true)")
    args = parser.parse_args()

    dataset = CocoDetection(f"{args.root}/{args.split}", f"{args.root}/annotations/instances_{args.split}.json",
                            transform=make_train_transform(seed=args.seed), masks=args.masks)
    order = [i % len(dataset) for i in range(args.images)]
    random.Random(args.seed).shuffle(order)
    print(describe_machine())
    print(f"albumentations {albumentations.__version__}, opencv {cv2.__version__} ({cv2.getNumThreads()} threads), "
          f"Pillow {PIL.__version__}")
    print(f"data: {args.root}/{args.split}, {len(dataset)} images; authors' train transform (default sizes)"
          f"{', instance masks' if args.masks else ''}")

    dataset[0]  # warm-up (imports, first allocation)
    start = time.perf_counter()
    for index in order:
        load_rgb_image(dataset.image_path(index))
    print(f"(1) decode only, 1 process:              {rate(len(order), time.perf_counter() - start)}")

    start = time.perf_counter()
    for index in order:
        dataset[index]
    print(f"(2) train pipeline, 1 process (1 worker): {rate(len(order), time.perf_counter() - start)}")

    if args.workers > 0:
        count, seconds = loader_throughput(dataset, order, args.workers, args.batch_size, args.seed)
        label = f"(3) DataLoader, {args.workers} workers, batch {args.batch_size}:".ljust(42)
        print(f"{label}{rate(count, seconds)} total, "
              f"{count / seconds / args.workers:.1f} images/s per worker")


if __name__ == "__main__":
    main()
