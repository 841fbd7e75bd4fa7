"""Convert a data set between COCO json, YOLO and Pascal VOC.

    detr-convert-data my-yolo/data.yaml --out train.json                 # YOLO → COCO json (the train split)
    detr-convert-data my-yolo --split val --out val.json
    detr-convert-data VOCdevkit/VOC2012 --split val --out val.json        # Pascal VOC → COCO json
    detr-convert-data train.json --images train/ --to yolo --out my-yolo  # COCO json + images → YOLO layout
    detr-convert-data VOCdevkit/VOC2012 --to yolo --out my-yolo           # VOC → YOLO (each --split in turn)

COCO json out: the json's file_name entries are relative to the split's image folder, which the command prints
(train with `--data.train_images FOLDER --data.train_annotations JSON`, or check with `detr-check-data FOLDER JSON`).
VOC's difficult objects are crowd boxes (ignored by training and evaluation). YOLO out: images/<split>/,
labels/<split>/ (class cx cy w h, normalised; --segments: polygons as class x1 y1 x2 y2 ...) and data.yaml; crowd
boxes have no YOLO form and are left out. Keypoints go both ways: a json whose categories name keypoints becomes
YOLO-pose (kpt_shape, flip_idx, kpt_names; each line's points after its box), and a YOLO-pose set becomes COCO
keypoints (its skeleton is empty: YOLO has none).
A label line or file that cannot be read stops the conversion, naming it (--skip-bad-labels leaves them out).
The readers: detr.data.yolo and detr.data.voc; `detr fit --data.format yolo|voc` trains on the data as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detr.inference.command_line import EXPECTED_ERROR_STATUS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a YOLO data.yaml (or its folder), a Pascal VOC folder (with Annotations/) or "
                        "a COCO instances json (with --images)")
    parser.add_argument("--out", required=True, help="the COCO json to write (--to coco), or the YOLO folder (--to "
                        "yolo)")
    parser.add_argument("--to", choices=("coco", "yolo"), default="coco", help="the format to write (default: coco)")
    parser.add_argument("--split", default="train", help="the split to read from a YOLO or VOC data set, and to "
                        "write in a YOLO one (default: train)")
    parser.add_argument("--format", choices=("coco", "yolo", "voc"), default=None,
                        help="the source's format (default: told from the path)")
    parser.add_argument("--images", default=None, help="a COCO json's image folder (its file_name entries are "
                        "relative to it)")
    parser.add_argument("--link", action="store_true", help="--to yolo: hard-link the images instead of copying "
                        "them (where the file system allows)")
    parser.add_argument("--segments", action="store_true", help="--to yolo: write polygon segmentations as YOLO "
                        "segmentation lines (class x1 y1 x2 y2 ...) instead of their boxes")
    parser.add_argument("--skip-bad-labels", action="store_true", help="write the data set without the label lines "
                        "and files that cannot be read (each named on stderr) instead of stopping")
    args = parser.parse_args(argv)
    try:
        return convert(args)
    except ValueError as error:  # a data set that cannot be read, or one with bad labels: named in one line
        print(f"error: {error}", file=sys.stderr)
        return EXPECTED_ERROR_STATUS


def convert(args: argparse.Namespace) -> int:
    from detr.atomic_files import write_atomically
    from detr.data.coco import load_coco_json
    from detr.data.formats import detect_format, read_split
    from detr.data.yolo import write_yolo

    data_format = args.format or detect_format(args.source)
    if data_format == "coco":
        if args.to == "coco":
            raise ValueError(f"{args.source} is COCO already: pass --to yolo to write it in the YOLO layout")
        if Path(args.source).is_dir():
            raise ValueError(f"{args.source} is a folder in COCO's layout: pass one of its instances jsons (e.g. "
                             f"{Path(args.source) / 'annotations' / 'instances_train2017.json'}) and --images with "
                             "its image folder")
        if args.images is None:
            raise ValueError(f"{args.source} is a COCO json: pass --images FOLDER, the folder its file_name entries "
                             "are relative to")
        data, images_dir = load_coco_json(args.source), Path(args.images)
    else:
        split = read_split(args.source, args.split, data_format)
        for problem in split.problems if args.skip_bad_labels else ():
            print(f"left out: {problem}", file=sys.stderr)
        if not args.skip_bad_labels:
            split.require_clean()
        data, images_dir = split.data, split.images_dir
    if args.to == "yolo":
        counts = write_yolo(data, images_dir, args.out, args.split, link=args.link, segments=args.segments)
        crowd = f", {counts['crowd_left_out']} crowd box(es) left out" if counts["crowd_left_out"] else ""
        polygons = f" ({counts['polygons']} as polygons)" if counts["polygons"] else ""
        print(f"wrote {counts['images']} images and {counts['boxes']} objects{polygons} to "
              f"{Path(args.out) / 'data.yaml'} ({args.split} split){crowd}")
        return 0
    text = json.dumps(data, ensure_ascii=False).encode()
    write_atomically(args.out, lambda file: file.write(text))
    print(f"wrote {len(data['images'])} images, {len(data['annotations'])} annotations and "
          f"{len(data['categories'])} categories to {args.out}; its file_name entries are relative to {images_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
