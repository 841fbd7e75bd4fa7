"""Draw DETR's attention on one image: the paper's Fig. 6 (decoder) and, on request, Fig. 3 (encoder).

    detr-visualize-attention photo.jpg --checkpoint detr-r50-e632da11.pth --out attention.png
    detr-visualize-attention photo.jpg --checkpoint RUN/checkpoints/last.ckpt --out grid.png --all-queries
    detr-visualize-attention photo.jpg --checkpoint detr-r50 --out a.png --encoder-points 120,80 300,200

--out gets the decoder cross-attention of every detected object (or of every query with --all-queries);
with --encoder or --encoder-points the encoder self-attention figure goes to <out stem>_encoder.png.
For a Deformable DETR --out gets each detected object's sampling points per feature level and head, sized by
their attention weights (its attention is sparse: there is no dense map to draw).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from detr.inference.command_line import (
    add_checkpoint_argument,
    add_resize_arguments,
    any_int,
    device_argument,
    non_negative_float,
    non_negative_int,
    one_line_errors,
    positive_int,
    probability,
)


def point(text: str) -> tuple[float, float]:
    """argparse ``type`` of ``--encoder-points``: X,Y in pixels, finite numbers >= 0."""
    x, _, y = text.partition(",")
    try:
        return non_negative_float(x), non_negative_float(y)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a reference point is X,Y in pixels (numbers >= 0), got {text!r}") from None


def figure_file(text: str) -> Path:
    """argparse ``type`` of ``--out``: the figure's file, ``.png`` added to a name without a suffix (matplotlib
    wrote NAME.png for --out NAME while the command printed NAME); a suffix matplotlib cannot write is refused
    before the model loads."""
    from matplotlib.figure import Figure  # here, so that --help does not wait for matplotlib

    path = Path(text)
    if not path.suffix:
        return path.with_name(f"{path.name}.png")
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise argparse.ArgumentTypeError(f"{text}: matplotlib cannot write {path.suffix} figures; use one of "
                                         f"{', '.join('.' + name for name in sorted(formats))} (e.g. {path.stem}.png)")
    return path


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image")
    add_checkpoint_argument(parser)
    parser.add_argument("--out", required=True, type=figure_file,
                        help="the decoder figure's file (PNG; .png is added to a name without a suffix)")
    parser.add_argument("--layer", type=any_int, default=-1, help="decoder layer, Python index (default -1: last)")
    parser.add_argument("--head", type=non_negative_int, default=None,
                        help="one attention head (default: mean over heads)")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="show queries scoring above this (default: the checkpoint's validated one, else 0.7)")
    parser.add_argument("--top-k", type=positive_int, default=None, help="show the K best queries instead")
    parser.add_argument("--all-queries", action="store_true", help="a grid of every query, no-object included")
    parser.add_argument("--encoder", action="store_true", help="also draw encoder self-attention (Fig. 3)")
    parser.add_argument("--encoder-points", type=point, nargs="+", default=None, metavar="X,Y",
                        help="reference points for the encoder figure (default: centres of detections)")
    add_resize_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None, help="default: CUDA when available, else CPU")
    parser.add_argument("--dpi", type=positive_int, default=120)
    args = parser.parse_args(argv)
    from detr.inference.images import to_rgb_array  # after --help: torch, matplotlib
    from detr.inference.predictor import Predictor
    from detr.visualize.figures import decoder_attention_figure, encoder_attention_figure
    from detr.visualize.sampling import sampling_points_figure


    predictor = Predictor.from_checkpoint(
        args.checkpoint, device=args.device, threshold=args.threshold, min_size=args.min_size, max_size=args.max_size
    )
    try:
        image = to_rgb_array(args.image)
        prediction = predictor.predict(image, return_attention=True)[0]
    except ValueError as error:  # unreadable, or too thin to resize: the message says which; name the file
        print(f"error: {args.image}: {error}", file=sys.stderr)
        return 1
    if prediction.sampling is not None:
        out = args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        sampling_points_figure(image, prediction, layer=args.layer, threshold=predictor.threshold,
                               top_k=args.top_k).savefig(out, dpi=args.dpi)
        print(f"{len(prediction)} detections above {predictor.threshold:g} ({predictor.threshold_source}); "
              f"deformable sampling points -> {out}")
        if args.encoder or args.encoder_points:  # said, not silently dropped
            print("no encoder figure: this model's encoder samples points (deformable attention) instead of "
                  "attending to every position, so it has no self-attention maps to draw", file=sys.stderr)
        return 0
    figure = decoder_attention_figure(
        image, prediction, layer=args.layer, head=args.head, threshold=predictor.threshold, top_k=args.top_k,
        all_queries=args.all_queries,
    )
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=args.dpi)
    print(f"{len(prediction)} detections above {predictor.threshold:g} ({predictor.threshold_source}); decoder "
          f"attention -> {out}")
    if args.encoder or args.encoder_points:
        encoder_out = out.with_name(f"{out.stem}_encoder{out.suffix}")
        encoder_attention_figure(image, prediction, points=args.encoder_points).savefig(encoder_out, dpi=args.dpi)
        print(f"encoder attention -> {encoder_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
