"""The real-time families' training augmentation per image, ours beside the authors' pipeline, and the loader's
images/s beside a training step's.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/realtime_data.py [--root data/coco-mini] [--size 640]
        [--repeats 3] [--workers 2] [--batch-size 8]

Ours: ``--data.augmentation rtdetr`` (:func:`detr.data.transforms.make_rtdetr_train_transform`: photometric
distortion p 0.5, zoom-out p 0.5, IoU crop p 0.8, flip, square resize, boxes under 1 px dropped, pixels / 255) and
``deim`` (DEIM's mosaic in front of it, p 0.5 in its epochs: :class:`detr.data.dense_o2o.DenseO2OTransform`).
The authors': RT-DETR's and D-FINE's ``include/dataloader.yml`` as torchvision.transforms.v2 runs it (their
classes are v2's with these arguments: ``RandomPhotometricDistort(p=0.5)``, ``RandomZoomOut(fill=0)``,
``RandomIoUCrop`` applied with p 0.8, ``SanitizeBoundingBoxes(min_size=1)``, ``RandomHorizontalFlip``,
``Resize((size, size))``, ``SanitizeBoundingBoxes(min_size=1)``, float32 pixels / 255 and normalised cxcywh boxes),
on PIL images as their COCO data set hands them over. Both start from decoded images held in memory (the decode
is the same JPEG read on both sides: ``(1)``), and both run in this one process, alternating image by image, the
fastest of ``--repeats`` passes over the set.

Then the loader: our :class:`detr.data.coco.CocoDetection` with the rtdetr pipeline through a DataLoader of
``--workers`` processes, batch ``--batch-size``: images/s in all and per worker, to set beside a training step's
images/s (docs/measurements/gpu.md: the real-time families' GPU steps). Results: docs/measurements/speed.md,
"The real-time augmentation".
"""

from __future__ import annotations

import argparse
import random
import time

import albumentations
import cv2
import numpy as np
import torch
from data_throughput import loader_throughput, rate
from machine import describe_machine
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from detr.data.coco import CocoDetection
from detr.data.dense_o2o import DenseO2OTransform
from detr.data.images import load_rgb_image
from detr.data.training_epoch import SharedEpoch
from detr.data.transforms import make_rtdetr_train_transform


def authors_pipeline(size: int) -> v2.Compose:
    """RT-DETR's / D-FINE's training transforms (include/dataloader.yml) in torchvision.transforms.v2."""
    return v2.Compose([
        v2.RandomPhotometricDistort(p=0.5),
        v2.RandomZoomOut(fill=0),
        v2.RandomApply([v2.RandomIoUCrop()], p=0.8),
        v2.SanitizeBoundingBoxes(min_size=1),
        v2.RandomHorizontalFlip(),
        v2.Resize((size, size)),
        v2.SanitizeBoundingBoxes(min_size=1),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.ConvertBoundingBoxFormat("CXCYWH"),
    ])


def authors_step(pipeline: v2.Compose, image: Image.Image, boxes: np.ndarray, labels: np.ndarray) -> tuple:
    height, width = image.height, image.width
    target = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=(height, width)),
              "labels": torch.from_numpy(labels)}
    image, target = pipeline(image, target)
    target["boxes"] = target["boxes"] / torch.tensor([image.shape[-1], image.shape[-2]] * 2)  # their ConvertBoxes
    return image, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="data/coco-mini", help="COCO-layout folder")
    parser.add_argument("--split", default="train2017")
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the set; the fastest counts")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the loader (0 skips it)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a loader worker
    dataset = CocoDetection(f"{args.root}/{args.split}", f"{args.root}/annotations/instances_{args.split}.json",
                            transform=make_rtdetr_train_transform(args.size, seed=args.seed))
    print(describe_machine())
    print(f"albumentations {albumentations.__version__}, opencv {cv2.__version__}, torchvision "
          f"{__import__('torchvision').__version__}; data: {args.root}/{args.split}, {len(dataset)} images, "
          f"square {args.size}")
    samples = [dataset.raw_sample(index) for index in range(len(dataset))]
    start = time.perf_counter()
    for index in range(len(dataset)):
        load_rgb_image(dataset.image_path(index))
    print(f"(1) decode, 1 process:                       {rate(len(dataset), time.perf_counter() - start)}")

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    ours = make_rtdetr_train_transform(args.size, seed=args.seed)
    mosaic = DenseO2OTransform(args.size, epoch=SharedEpoch(4), mosaic_epochs=(4, 29), mosaic_prob=0.5,
                               seed=args.seed)  # epoch 4: in the mosaic's epochs
    mosaic.draw_from(dataset)
    theirs = authors_pipeline(args.size)
    pictures = [Image.fromarray(sample.pixels) for sample in samples]
    best = {"ours": float("inf"), "theirs": float("inf"), "mosaic": float("inf")}
    for _ in range(args.repeats):
        spent = dict.fromkeys(best, 0.0)
        for sample, picture in zip(samples, pictures):
            start = time.perf_counter()
            ours(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)
            spent["ours"] += -start + (start := time.perf_counter())
            authors_step(theirs, picture, sample.boxes_xyxy, sample.labels)
            spent["theirs"] += -start + (start := time.perf_counter())
            mosaic(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)
            spent["mosaic"] += time.perf_counter() - start
        best = {name: min(best[name], spent[name]) for name in best}
    count = len(samples)
    print(f"(2) ours, rtdetr pipeline, 1 thread:          {rate(count, best['ours'])}")
    print(f"(3) authors' pipeline (torchvision v2):       {rate(count, best['theirs'])}   "
          f"ours / authors' {best['ours'] / best['theirs']:.2f}")
    print(f"(4) ours, deim (mosaic p 0.5, then rtdetr):   {rate(count, best['mosaic'])}   (the mosaic decodes its "
          f"three other images)")

    if args.workers > 0:
        order = [i % len(dataset) for i in range(max(4 * args.batch_size * args.workers, 2 * len(dataset)))]
        random.Random(args.seed).shuffle(order)
        count, seconds = loader_throughput(dataset, order, args.workers, args.batch_size, args.seed)
        print(f"(5) DataLoader, {args.workers} workers, batch {args.batch_size}, decode + rtdetr: "
              f"{rate(count, seconds)}, {count / seconds / args.workers:.1f} images/s per worker")


if __name__ == "__main__":
    main()
