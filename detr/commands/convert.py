"""Convert a DETR checkpoint to a Hugging Face transformers directory (config.json + model.safetensors).

    detr-convert detr-r50 --to-huggingface detr-r50-hf/
    detr-convert outputs/demo/checkpoints/last.ckpt --to-huggingface my-detr/ --backbone-format transformers

CHECKPOINT is anything detr.load_checkpoint reads: a released model's name, a .pth / .ckpt file, or a
Hugging Face directory. The result loads with transformers.DetrForObjectDetection.from_pretrained(DIR), for a
Deformable DETR with transformers.DeformableDetrForObjectDetection.from_pretrained(DIR), and for an RT-DETR (e.g.
the authors' rtdetr_r50vd_6x_coco.pth) with RTDetrForObjectDetection or RTDetrV2ForObjectDetection
(--backbone-format does not apply: transformers' RT-DETR has its own ResNet-vd); D-FINE, DEIMv2, RF-DETR and
LW-DETR likewise with their classes. Every family's directory keeps the data set's category ids and names and the
score threshold the model's validation chose (config.json's category_ids, id2label and score_threshold).
Models with options transformers' DETR lacks (anchor queries, sigmoid head, denoising, ...) are refused.

The directory is written whole or not at all: into a hidden folder beside DIR, then moved into place. An existing
DIR that holds a model (a config.json) is replaced as a whole once the new one is complete (none of its files
stays; the command says so), and kept as it was if anything fails (a full disk, Ctrl-C, SIGTERM); a folder of
other files, a file, or the checkpoint's own folder is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from detr.inference.command_line import add_checkpoint_argument, keep_output_on_stop


def check_output_folder(out: Path, checkpoint: str) -> str | None:
    """What is wrong with ``out`` as ``--to-huggingface`` for ``checkpoint`` (None: nothing): a file, a folder
    that holds files but no model, or the checkpoint itself (or the folder it is in)."""
    if out.exists() and not out.is_dir():
        return f"--to-huggingface {out} is a file; give a directory (new, empty, or an earlier model's)"
    source = Path(checkpoint)
    if source.exists() and out.exists() and (source.resolve() == out.resolve()
                                             or out.resolve() in source.resolve().parents):
        return (f"--to-huggingface {out} is the checkpoint {checkpoint} itself or holds it: converting would "
                "replace the source; write to another directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        return (f"--to-huggingface {out} holds files but no config.json: it is not a model directory, and it would "
                "be replaced as a whole; write to a new or empty directory")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, positional=True)
    parser.add_argument("--to-huggingface", required=True, metavar="DIR",
                        help="output directory: new, empty, or an earlier model's (replaced as a whole once the new "
                             "one is written)")
    parser.add_argument("--backbone-format", choices=("timm", "transformers"), default="timm",
                        help="timm ResNet (transformers' default; needs timm to load; DC5 possible) or "
                             "transformers' own ResNet (no DC5)")
    args = parser.parse_args(argv)
    out = Path(args.to_huggingface)
    problem = check_output_folder(out, args.checkpoint)
    if problem is not None:
        parser.error(problem)
    from detr.checkpoints import CheckpointError, load_checkpoint, save_huggingface  # after --help: torch
    from detr.checkpoints.formats import ExportError

    replacing = out.is_dir() and any(out.iterdir())

    def convert() -> int:
        try:
            model = load_checkpoint(args.checkpoint)
            save_huggingface(model, out, backbone_format=args.backbone_format)
        except (CheckpointError, ExportError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        if replacing:
            print(f"replaced the earlier model in {out}")
        print(f"wrote {out}/config.json, model.safetensors, preprocessor_config.json "
              f"({model.config.backbone}, {model.num_classes} classes)")
        return 0

    return keep_output_on_stop(convert, f"{out} is as it was")


if __name__ == "__main__":
    sys.exit(main())
