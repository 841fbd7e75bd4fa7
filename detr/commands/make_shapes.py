"""Write the synthetic shapes data set (COCO layout) for CPU-sized training runs.

    detr-make-shapes                      # data/shapes: 2000 train, 200 val, 128 px
    detr-make-shapes --out /tmp/s --num-train 100 --num-val 20
    detr-make-shapes --panoptic           # also COCO panoptic annotations (PNGs + json)
    detr-make-shapes --masks rle --out data/shapes-rle   # instance masks as the drawn pixels (COCO RLE)
    detr-make-shapes --shapes circle,triangle,cross,arrow,semicircle --num-train 200 --seed 1 --out data/new
    detr-make-shapes --keypoints --out data/shapes-keypoints   # corners and vertices as COCO keypoints
    detr-make-shapes --clips --out data/shape-clips   # frames of tracking clips (40 train, 4 val clips), 192 x 128

Idempotent: a complete set made with the same parameters is left as it is (--force rewrites it).
The generator itself: detr.data.shapes (panoptic annotations: detr.data.shapes_panoptic).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from detr.data.shapes import ALL_SHAPES, ShapesConfig, write_shapes_dataset
from detr.data.shapes_panoptic import write_shapes_panoptic
from detr.inference.command_line import bounded_int, non_negative_int, positive_int, probability


def shape_list(text: str) -> tuple[str, ...]:
    """``--shapes``: comma-separated distinct names from :data:`detr.data.shapes.ALL_SHAPES` (ShapesConfig's check,
    as a one-line usage error)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    try:
        return ShapesConfig(shapes=names).shapes
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    defaults = ShapesConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/shapes", help="output folder (default: data/shapes)")
    parser.add_argument("--num-train", type=non_negative_int, default=None,
                        help=f"training images (default {defaults.num_train})")
    parser.add_argument("--num-val", type=non_negative_int, default=None,
                        help=f"validation images (default {defaults.num_val})")
    parser.add_argument("--image-size", type=bounded_int(16), default=defaults.image_size)
    parser.add_argument("--max-objects", type=positive_int, default=defaults.max_objects)
    parser.add_argument("--empty-fraction", type=probability, default=defaults.empty_fraction)
    parser.add_argument("--min-object-size", type=bounded_int(4), default=defaults.min_object_size)
    parser.add_argument("--max-object-size", type=bounded_int(4), default=defaults.max_object_size)
    parser.add_argument("--seed", type=non_negative_int, default=None, help=f"default {defaults.seed}")
    parser.add_argument("--masks", choices=("polygon", "rle"), default=defaults.mask_format,
                        help="each object's segmentation: the drawn polygon (default) or the drawn pixels as COCO "
                             "RLE (exact instance masks)")
    parser.add_argument("--shapes", type=shape_list, default=defaults.shapes, metavar="NAME,NAME,...",
                        help=f"the classes, in category id order (default {','.join(defaults.shapes)}; any of "
                             f"{','.join(ALL_SHAPES)})")
    parser.add_argument("--keypoints", action="store_true",
                        help="also each shape's corners or vertices as COCO keypoints (a quarter of the shapes with "
                             "one covered: v = 1), the categories' names, skeleton, flip_pairs and OKS sigmas")
    parser.add_argument("--clips", action="store_true",
                        help="instead: every third frame of synthetic tracking clips (what detr-track and "
                             "benchmarks/tracking.py track), 192 x 128; --num-train and --num-val count clips "
                             "(default 40 and 4), --seed is the first clip's (default 1000: not the benchmark's)")
    parser.add_argument("--force", action="store_true", help="rewrite even if a complete set exists")
    parser.add_argument("--panoptic", action="store_true",
                        help="also write COCO panoptic annotations: annotations/panoptic_{split}.json and PNGs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.clips:
        return _write_clips(parser, args)
    args.num_train = defaults.num_train if args.num_train is None else args.num_train
    args.num_val = defaults.num_val if args.num_val is None else args.num_val
    args.seed = defaults.seed if args.seed is None else args.seed
    try:  # the options that depend on each other (object sizes within the image)
        config = ShapesConfig(
            num_train=args.num_train, num_val=args.num_val, image_size=args.image_size,
            max_objects=args.max_objects, empty_fraction=args.empty_fraction, min_object_size=args.min_object_size,
            max_object_size=args.max_object_size, seed=args.seed, mask_format=args.masks, shapes=args.shapes,
            keypoints=args.keypoints,
        )
    except ValueError as error:
        parser.error(f"{error} (--min-object-size, --max-object-size, --image-size)")
    start = time.perf_counter()
    written = write_shapes_dataset(args.out, config, overwrite=args.force)
    if written:
        seconds = time.perf_counter() - start
        print(f"wrote {args.out} ({config.num_train} train, {config.num_val} val) in {seconds:.1f} s")
    else:
        print(f"{args.out} is already complete with these parameters; nothing written (use --force to rewrite)")
    if args.panoptic and write_shapes_panoptic(args.out, config, overwrite=args.force):
        print(f"wrote panoptic annotations to {args.out}/annotations")
    return 0


def _write_clips(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from detr.data.shape_clips import ClipFramesConfig, write_clip_frames_dataset  # imports torch: not for --help

    frames = ClipFramesConfig()
    if args.panoptic or args.keypoints:
        parser.error("--clips writes boxes only: leave out --panoptic and --keypoints")
    config = ClipFramesConfig(
        num_train_clips=frames.num_train_clips if args.num_train is None else args.num_train,
        num_val_clips=frames.num_val_clips if args.num_val is None else args.num_val,
        first_seed=frames.first_seed if args.seed is None else args.seed)
    start = time.perf_counter()
    if write_clip_frames_dataset(args.out, config, overwrite=args.force):
        print(f"wrote {args.out} ({config.num_train_clips} train, {config.num_val_clips} val clips, every "
              f"{config.every}th frame) in {time.perf_counter() - start:.1f} s")
    else:
        print(f"{args.out} is already complete with these parameters; nothing written (use --force to rewrite)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
