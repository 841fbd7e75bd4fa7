"""Check a COCO-format data set for what would hurt DETR training.

    detr-check-data data/coco-mini/val2017 data/coco-mini/annotations/instances_val2017.json

Exit code 0 when nothing would hurt training (warnings may be listed), 1 with the list of errors
otherwise. The checks themselves: detr.data.checker.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images_dir", help="folder the json's file_name entries are relative to")
    parser.add_argument("annotations_json", help="COCO instances json")
    parser.add_argument("--num-queries", type=int, default=100,
                        help="the model's num_queries: an image with more objects is an error (default 100, the "
                        "paper's; configs/demo_shapes_cpu.yaml uses 20). `detr fit` runs these checks itself with "
                        "its model's value")
    parser.add_argument("--quick", action="store_true", help="read image headers only (misses truncated files)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for reading images (default: one per CPU core when decoding 256 or more "
                        "images, else 0: in this process)")
    parser.add_argument("--max-per-kind", type=int, default=20, help="problems listed per kind")
    parser.add_argument("--cache", action="store_true",
                        help="remember each image read in JSON.imagecache beside the json (as `detr fit` does) and "
                        "reread only files whose size or mtime changed")
    args = parser.parse_args(argv)
    images, annotations = Path(args.images_dir), Path(args.annotations_json)
    if images.is_file() and annotations.is_dir():  # said "does not exist" of a folder that exists
        parser.error(f"IMAGES_DIR comes first, then ANNOTATIONS_JSON: {images} is a file and {annotations} a folder; "
                     f"swap them: detr-check-data {annotations} {images}")
    from detr.data.checker import check_dataset, format_problems, has_errors  # after --help: no image pipeline
    from detr.data.image_checks import default_cache_file

    problems = check_dataset(
        args.images_dir, args.annotations_json, num_queries=args.num_queries, decode_images=not args.quick,
        workers=args.workers, cache_file=default_cache_file(args.annotations_json) if args.cache else None,
        progress=True,
    )
    print(format_problems(problems, max_per_kind=args.max_per_kind))
    failed = has_errors(problems)
    print("FAIL: fix the errors above before training" if failed else "OK: nothing that would hurt training")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
