"""Write a COCO-sized synthetic detection set (tiny hard-linked JPEGs, random boxes) to measure scale.

    detr-make-synthetic-coco --out /tmp/coco-synthetic                       # train2017 at COCO's size + val2017
    detr-make-synthetic-coco --out /tmp/s --images 1000 --val-images 100 --polygons
    detr-make-synthetic-coco --out /tmp/s --category-ids 1 2 3 --boxes-per-image 20

Not for training: every image of one size is the same file. The generator: detr.data.synthetic_coco.
"""

from __future__ import annotations

import argparse
import sys
import time

from detr.inference.command_line import non_negative_float, non_negative_int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (COCO layout)")
    # the defaults are the generator's COCO figures, read after parsing (detr.categories imports torch)
    parser.add_argument("--images", type=non_negative_int, default=None,
                        help="training images (default: COCO train2017's 118,287)")
    parser.add_argument("--val-images", type=non_negative_int, default=5000, help="validation images (0: no val2017)")
    parser.add_argument("--boxes-per-image", type=non_negative_float, default=None,
                        help="mean boxes per image (default: COCO train2017's 7.27)")
    parser.add_argument("--category-ids", type=non_negative_int, nargs="+", default=None,
                        help="category ids to draw from (default: COCO's 80 ids and names)")
    parser.add_argument("--polygons", action="store_true", help="give every box a polygon segmentation")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)
    from detr.data.synthetic_coco import (
        COCO_BOXES_PER_IMAGE,
        COCO_TRAIN_IMAGES,
        SyntheticCocoConfig,
        write_synthetic_coco,
    )

    args.images = COCO_TRAIN_IMAGES if args.images is None else args.images
    args.boxes_per_image = COCO_BOXES_PER_IMAGE if args.boxes_per_image is None else args.boxes_per_image
    category_ids = tuple(args.category_ids) if args.category_ids else None
    if category_ids is not None and len(set(category_ids)) != len(category_ids):
        parser.error(f"--category-ids must be distinct, got {' '.join(map(str, category_ids))}")
    splits = [("train2017", args.images, args.seed), ("val2017", args.val_images, args.seed + 1)]
    for split, count, seed in splits:
        if count == 0:
            continue
        config = SyntheticCocoConfig(num_images=count, boxes_per_image=args.boxes_per_image,
                                     category_ids=category_ids, polygons=args.polygons, seed=seed)
        start = time.perf_counter()
        json_file = write_synthetic_coco(args.out, config, split=split)
        print(f"wrote {count:,} images to {args.out}/{split} and {json_file} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
