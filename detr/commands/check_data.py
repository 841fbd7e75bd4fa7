"""Check a data set for what would hurt DETR training: COCO, YOLO or Pascal VOC.

    detr-check-data data/coco-mini/val2017 data/coco-mini/annotations/instances_val2017.json
    detr-check-data images/ train.json --checkpoint dfine_s_coco.pth   # before a fine-tune
    detr-check-data my-yolo/data.yaml       # YOLO: a data.yaml or its folder; every split it lists
    detr-check-data VOCdevkit/VOC2012       # Pascal VOC: the folder with Annotations/

Exit code 0 when nothing would hurt training (warnings may be listed), 1 with the list of errors
otherwise. The checks themselves: detr.data.checker.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from detr.inference.command_line import EXPECTED_ERROR_STATUS, non_negative_int, positive_int

if TYPE_CHECKING:
    from detr.data.checker import CheckpointClasses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images_dir", metavar="DATA",
                        help="COCO: the folder the json's file_name entries are relative to (or a folder in COCO's "
                        "layout: train2017/, val2017/, annotations/); YOLO: a data.yaml or the folder that holds it; "
                        "Pascal VOC: the folder with Annotations/")
    parser.add_argument("annotations_json", nargs="?", default=None,
                        help="COCO instances json (COCO only; YOLO and VOC need the DATA argument alone)")
    parser.add_argument("--split", action="append", default=None,
                        help="without a json: check only this split (train, val, test; repeatable; default: all)")
    parser.add_argument("--num-queries", type=positive_int, default=None,
                        help="the model's num_queries: an image with more objects is an error (default: the "
                        "--checkpoint's, else 100, the paper's; configs/demo_shapes_cpu.yaml uses 20). `detr fit` "
                        "runs these checks itself with its model's value")
    parser.add_argument("--quick", action="store_true", help="read image headers only (misses truncated files)")
    parser.add_argument("--workers", type=non_negative_int, default=None,
                        help="processes for reading images (default: one per CPU core when decoding 256 or more "
                        "images, else 0: in this process)")
    parser.add_argument("--max-per-kind", type=positive_int, default=20, help="problems listed per kind")
    parser.add_argument("--cache", action="store_true",
                        help="remember each image read in JSON.imagecache beside the json (YOLO, VOC: beside the "
                        "split's folder or list file; as `detr fit` does) and reread only files whose size or mtime "
                        "changed")
    parser.add_argument("--min-images-per-class", type=non_negative_int, default=10,
                        help="warn about categories with boxes on fewer images (default 10; 0: no check)")
    parser.add_argument("--checkpoint", default=None,
                        help="the checkpoint a fine-tune starts from: name the json's categories it was not "
                        "trained on (their class rows start fresh; the others carry over by name)")
    args = parser.parse_args(argv)
    images = Path(args.images_dir)
    annotations = Path(args.annotations_json) if args.annotations_json is not None else None
    # said "does not exist" of a folder that exists
    if annotations is not None and images.is_file() and annotations.is_dir():
        parser.error(f"IMAGES_DIR comes first, then ANNOTATIONS_JSON: {images} is a file and {annotations} a folder; "
                     f"swap them: detr-check-data {annotations} {images}")
    from detr.data.checker import check_dataset, format_problems, has_errors  # after --help: no image pipeline
    from detr.data.image_checks import default_cache_file

    checkpoint, num_queries = None, 100
    if args.checkpoint is not None:
        try:
            checkpoint, num_queries = checkpoint_classes(args.checkpoint)
        except (OSError, ValueError) as error:  # CheckpointError is a ValueError
            parser.error(f"--checkpoint {args.checkpoint}: {error}")
    num_queries = args.num_queries if args.num_queries is not None else num_queries

    options = {"num_queries": num_queries, "decode_images": not args.quick, "workers": args.workers, "progress": True,
               "min_images_per_class": args.min_images_per_class, "checkpoint": checkpoint}
    if annotations is not None:
        cache_file = default_cache_file(annotations) if args.cache else None
        problems = check_dataset(images, annotations, cache_file=cache_file, **options)
        print(format_problems(problems, max_per_kind=args.max_per_kind))
        failed = has_errors(problems)
    else:
        try:
            failed = check_each_split(images, args.split, options, cache=args.cache, max_per_kind=args.max_per_kind)
        except ValueError as error:  # not a data set, or one that cannot be read at all (no data.yaml ...)
            print(f"error: {error}", file=sys.stderr)
            return EXPECTED_ERROR_STATUS
    print("FAIL: fix the errors above before training" if failed else "OK: nothing that would hurt training")
    return 1 if failed else 0


def check_each_split(data: Path, splits: list[str] | None, options: dict, *, cache: bool, max_per_kind: int
                     ) -> bool:
    """Check every split (or ``splits``) of the data set ``data`` in any format, printing each split's report;
    True when one has errors."""
    from detr.data.checker import check_converted, check_dataset, format_problems, has_errors
    from detr.data.formats import dataset_splits, detect_format, read_split
    from detr.data.image_checks import default_cache_file

    data_format = detect_format(data)
    if data_format == "coco":
        if data.is_file():
            raise ValueError(f"{data} is a COCO json: pass the image folder first, then the json: detr-check-data "
                             f"IMAGES_DIR {data}")
        found = {split: (data / f"{split}2017", data / "annotations" / f"instances_{split}2017.json")
                 for split in ("train", "val", "test")}
        found = {split: paths for split, paths in found.items() if paths[1].is_file()}
        if not found:
            raise ValueError(f"{data}/annotations holds no instances_{{train,val}}2017.json: pass IMAGES_DIR and "
                             "ANNOTATIONS_JSON")
    else:
        found = dict.fromkeys(dataset_splits(data, data_format))
    failed = False
    for split in splits or list(found):
        if split not in found:
            raise ValueError(f"{data} has no {split} split (it has {', '.join(found) or 'none'})")
        if data_format == "coco":
            images, json_file = found[split]
            where = json_file
            problems = check_dataset(images, json_file, cache_file=default_cache_file(json_file) if cache else None,
                                     **options)
        else:
            converted = read_split(data, split, data_format, cache=cache)
            where = converted.source
            problems = check_converted(converted, cache_file=default_cache_file(converted.source) if cache else None,
                                       **options)
        print(f"{data_format} {split} split ({where}):")
        print(format_problems(problems, max_per_kind=max_per_kind))
        failed = failed or has_errors(problems)
    return failed


def checkpoint_classes(source: str) -> tuple[CheckpointClasses, int]:
    """The class count and category map of a checkpoint (a file, a released name or a transformers directory),
    and its number of queries: its recorded map, else its config's class count; the config recorded, else the
    one its weights show."""
    from detr.checkpoints import infer_model_config, read_checkpoint
    from detr.data.checker import CheckpointClasses

    contents = read_checkpoint(source)
    config = contents.config if contents.config is not None else infer_model_config(contents.state_dict, str(source))
    category_map = contents.meta.category_map
    num_classes = category_map.num_classes if category_map is not None else config.num_classes
    return CheckpointClasses(str(source), num_classes, category_map), config.num_queries


if __name__ == "__main__":
    sys.exit(main())
