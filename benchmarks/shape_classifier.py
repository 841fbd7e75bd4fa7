"""How fast does a from-scratch ResNet-18 learn the shapes' classes on their own? (a diagnostic for docs/measurements/convergence.md)

The convergence benchmark finds the boxes long before their classes (class-agnostic AP50 far above
AP50). This trains the detector's backbone (ResNet-18 up to layer3, BatchNorm, from scratch) as a plain
5-way classifier on 48 × 48 crops centred on the training objects, and prints validation accuracy: an
upper bound on how quickly the backbone can learn the classes from this many objects.

    .venv/bin/python benchmarks/shape_classifier.py                 # AdamW lr 5e-4, 200 steps of 64 crops
    .venv/bin/python benchmarks/shape_classifier.py --lr 2e-3

Data: the shapes set that benchmarks/convergence.py trains on (data/shapes, written if missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from convergence import shapes_root
from machine import describe_machine

from detr.categories import CategoryMap
from detr.data.images import load_rgb_image
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD

CROP = 48


def object_crops(root: Path, split: str, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised crops float [N, 3, 48, 48] centred on the objects of ``root``'s COCO-layout ``split``
    (moved inside the image), contiguous labels [N]; the first ``limit`` objects."""
    data = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
    category_map = CategoryMap.from_coco_categories(data["categories"], contiguous=True)
    by_image: dict[int, list[dict]] = {}
    for annotation in data["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    crops, labels = [], []
    for image in sorted(data["images"], key=lambda i: i["id"]):
        objects = by_image.get(image["id"], [])
        if not objects:
            continue
        pixels = torch.from_numpy(load_rgb_image(root / split / image["file_name"])).permute(2, 0, 1)  # uint8 [3, H, W]
        height, width = pixels.shape[1:]
        for annotation in objects:
            x, y, w, h = annotation["bbox"]  # pixel xywh
            x0 = min(max(int(x + w / 2) - CROP // 2, 0), width - CROP)
            y0 = min(max(int(y + h / 2) - CROP // 2, 0), height - CROP)
            crops.append(pixels[:, y0:y0 + CROP, x0:x0 + CROP])
            labels.append(category_map.category_id_to_label(annotation["category_id"]))
            if len(crops) >= limit:
                break
        if len(crops) >= limit:
            break
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (torch.stack(crops).float().div(255) - mean) / std, torch.tensor(labels)


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
    root = shapes_root(2000, 200, 0, args.cache_dir)
    train_x, train_y = object_crops(root, "train2017", 6000)
    val_x, val_y = object_crops(root, "val2017", 500)
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
