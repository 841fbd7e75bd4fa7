"""Label a folder of images with what a prompt names (an open-vocabulary checkpoint: a transformers Grounding DINO
directory), as a COCO data set to review and fine-tune on.

    detr-autolabel photos/ --prompt "a cat. a remote control." --checkpoint grounding-dino-tiny/ --out cats.json
    detr-check-data photos/ cats.json      # then: detr fit ... --data.train_annotations cats.json

Writes OUT (replaced whole, never half-written: --overwrite to replace an existing file): the prompt's phrases as
categories (ids 1.. in prompt order), the images with their width and height (file_name relative to IMAGES), and
one annotation per box scored above --threshold, with its ``score`` kept. A file that cannot be read or predicted
is reported and left out; the exit status is then 1. The data set: detr.inference.autolabel.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from functools import partial
from pathlib import Path

from tqdm import tqdm

from detr.inference.command_line import (
    add_checkpoint_argument,
    add_resize_arguments,
    device_argument,
    keep_output_on_stop,
    report_skipped,
    one_line_errors,
    positive_int,
    probability,
)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images_dir", metavar="IMAGES", help="the folder of images to label (not recursive)")
    parser.add_argument("--prompt", required=True,
                        help='what to label, one phrase per category: "a cat. a remote control."')
    add_checkpoint_argument(parser)
    parser.add_argument("--out", required=True, help="the COCO instances json to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--threshold", type=probability, default=0.3,
                        help="the score a box needs to become a label (default 0.3)")
    parser.add_argument("--text-threshold", type=probability, default=0.25,
                        help="the score a word needs to be part of a box's phrase (default 0.25)")
    add_resize_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None,
                        help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--batch-size", type=positive_int, default=1)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        parser.error(f"--out {out} is a folder: name the json to write, e.g. {out / 'instances.json'}")
    if out.exists() and not args.overwrite:
        parser.error(f"--out {out} exists (reviewed labels?): pass --overwrite to replace it, or another --out")
    # after parsing, so that --help does not wait for torch
    from detr.data.images import list_image_files
    from detr.inference.autolabel import autolabel_files, labelled_images
    from detr.inference.grounding import prompt_phrases
    from detr.inference.predictor import Predictor

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        paths = list_image_files(args.images_dir)
        prompt_phrases(args.prompt)
    except ValueError as error:
        parser.error(str(error))
    predictor = Predictor.from_checkpoint(args.checkpoint, device=args.device, threshold=args.threshold,
                                          batch_size=args.batch_size, min_size=args.min_size, max_size=args.max_size)
    try:
        predictor.check_prompt(args.prompt)
    except ValueError as error:
        parser.error(f"--prompt with {args.checkpoint}: {error}")

    def write() -> int:
        from detr.atomic_files import write_text_atomically

        run = autolabel_files(predictor, args.images_dir, paths, args.prompt, text_threshold=args.text_threshold,
                              progress=partial(tqdm, total=-(-len(paths) // args.batch_size), unit="batch",
                                               desc="autolabel"),
                              info={"checkpoint": str(args.checkpoint)})
        write_text_atomically(out, json.dumps(run.data, ensure_ascii=False))
        data = run.data
        print(f"{len(data['annotations'])} boxes on {labelled_images(data)} of {len(data['images'])} images, "
              f"{len(data['categories'])} categories, scores above {predictor.threshold:g} -> {out}; its file_name "
              f"entries are relative to {args.images_dir}")
        return report_skipped(run.skipped)

    return keep_output_on_stop(write, f"{out} is as it was")


if __name__ == "__main__":
    sys.exit(main())
