"""How fast does a from-scratch ResNet-18 learn the shapes' classes on their own? (a diagnostic for docs/convergence.md)

The convergence benchmark finds the boxes long before their classes (class-agnostic AP50 far above
AP50). This trains the detector's backbone (ResNet-18 up to layer3, BatchNorm, from scratch) as a plain
5-way classifier on 48 × 48 crops centred on the training objects, and prints validation accuracy: an
upper bound on how quickly the backbone can learn the classes from this many objects.

    .venv/bin/python benchmarks/shape_classifier.py                 # AdamW lr 5e-4, 200 steps of 64 crops
    .venv/bin/python benchmarks/shape_classifier.py --lr 2e-3

Data: the shapes set as benchmarks/convergence.py renders it (and caches it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

from convergence import IMAGENET_MEAN, IMAGENET_STD, DetectionSet, cached_shapes
from machine import describe_machine

CROP = 48


def object_crops(data: DetectionSet, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised crops float [N, 3, 48, 48] centred on each object (moved inside the image), labels [N]."""
    size = data.images.shape[-1]
    crops, labels = [], []
    for image, image_labels, boxes in zip(data.images, data.labels, data.boxes):
        for label, box in zip(image_labels.tolist(), boxes):
            x0 = min(max(int(box[0] * size) - CROP // 2, 0), size - CROP)
            y0 = min(max(int(box[1] * size) - CROP // 2, 0), size - CROP)
            crops.append(image[:, y0:y0 + CROP, x0:x0 + CROP])
            labels.append(label)
            if len(crops) >= limit:
                break
        if len(crops) >= limit:
            break
    pixels = torch.stack(crops).float().div(255)
    return (pixels - IMAGENET_MEAN) / IMAGENET_STD, torch.tensor(labels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/detr_convergence_cache"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(describe_machine(), flush=True)
    train, val = cached_shapes(2000, 200, 0, args.cache_dir)
    train_x, train_y = object_crops(train, 6000)
    val_x, val_y = object_crops(val, 500)
    resnet = torchvision.models.resnet18(num_classes=5)
    model = torch.nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, resnet.layer1, resnet.layer2,
                                resnet.layer3, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(256, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    start = time.perf_counter()
    for step in range(args.steps + 1):
        index = torch.randint(len(train_x), (args.batch_size,))
        model.train()
        loss = F.cross_entropy(model(train_x[index]), train_y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            model.eval()
            with torch.no_grad():
                accuracy = (model(val_x).argmax(1) == val_y).float().mean().item()
            print(f"step {step:4d}  {(step + 1) * args.batch_size:6d} crops seen  loss {loss.item():.3f}  "
                  f"val accuracy {accuracy:.3f}  ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
