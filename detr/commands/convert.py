"""Convert a DETR checkpoint to a Hugging Face transformers directory (config.json + model.safetensors).

    detr-convert detr-r50 --to-huggingface detr-r50-hf/
    detr-convert outputs/demo/checkpoints/last.ckpt --to-huggingface my-detr/ --backbone-format transformers

CHECKPOINT is anything detr.load_checkpoint reads: a released model's name, a .pth / .ckpt file, or a
Hugging Face directory. The result loads with transformers.DetrForObjectDetection.from_pretrained(DIR), for a
Deformable DETR with transformers.DeformableDetrForObjectDetection.from_pretrained(DIR), and for an RT-DETR (e.g.
the authors' rtdetr_r50vd_6x_coco.pth) with RTDetrForObjectDetection or RTDetrV2ForObjectDetection
(--backbone-format does not apply: transformers' RT-DETR has its own ResNet-vd).
Models with options transformers' DETR lacks (anchor queries, sigmoid head, denoising, ...) are refused.
"""

from __future__ import annotations

import argparse
import sys

from detr.inference.command_line import add_checkpoint_argument


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, positional=True)
    parser.add_argument("--to-huggingface", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--backbone-format", choices=("timm", "transformers"), default="timm",
                        help="timm ResNet (transformers' default; needs timm to load; DC5 possible) or "
                             "transformers' own ResNet (no DC5)")
    args = parser.parse_args(argv)
    from detr.checkpoints import CheckpointError, load_checkpoint, save_huggingface  # after --help: torch
    from detr.checkpoints.formats import ExportError

    try:
        model = load_checkpoint(args.checkpoint)
        out = save_huggingface(model, args.to_huggingface, backbone_format=args.backbone_format)
    except (CheckpointError, ExportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out}/config.json, model.safetensors, preprocessor_config.json "
          f"({model.config.backbone}, {model.num_classes} classes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
