"""Serve a detector over HTTP, with dynamic batching and a page to try it in a browser.

    detr-serve --checkpoint detr-r50 --port 8000
    detr-serve --checkpoint outputs/demo/checkpoints/last.ckpt --max-batch-size 8 --batch-timeout 0.01
    curl -F image=@photo.jpg 'http://127.0.0.1:8000/predict?threshold=0.7'

Endpoints: POST /predict (the image as the multipart field "image" or the raw body; ?threshold=, ?task=
detection | instances | panoptic, ?slice=SIZE&slice_overlap=F: tiles and the whole image, merged), POST /explore
(the attention explorer's page for an image), POST /track (a video upload tracked: tracks.json's record, or
?format=mot), /track/sessions (a frame stream posted frame by frame, keeping its tracker), GET /health, GET /stats,
and GET / (drop an image, see its boxes, click one for that query's decoder attention).
Any checkpoint detr.load_checkpoint reads, .onnx files through ONNX Runtime, panoptic models.
SIGTERM or Ctrl-C: finish the requests in flight, then exit 0. Needs the serve extra
(pip install 'detr-lightning[serve]'). The API: detr.serving; docs/guides/serve.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from detr.inference.command_line import (
    add_checkpoint_argument,
    add_resize_arguments,
    bounded_int,
    device_argument,
    non_negative_float,
    one_line_errors,
    positive_float,
    probability,
)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, onnx=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=bounded_int(0, 65535), default=8000, help="TCP port (0: any free one)")
    parser.add_argument("--device", type=device_argument, default="auto",
                        help="auto (CUDA when available, else CPU), cpu, cuda, cuda:1")
    parser.add_argument("--max-batch-size", type=bounded_int(1), default=8, help="most requests per forward pass")
    parser.add_argument("--batch-timeout", type=non_negative_float, default=0.01,
                        help="seconds a request waits for others to batch with")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="score threshold of requests that give none (default: the checkpoint's validated one, "
                             "else 0.7)")
    parser.add_argument("--max-body-mb", type=positive_float, default=20.0, help="largest request body accepted, MiB")
    parser.add_argument("--max-pixels", type=bounded_int(1), default=40_000_000, help="most pixels an image may have")
    parser.add_argument("--max-queue", type=bounded_int(0), default=256,
                        help="most requests waiting for the model (or for memory to decode in); more are refused "
                             "with 503 (0: no limit)")
    parser.add_argument("--body-timeout", type=positive_float, default=30.0,
                        help="seconds a request's body may take to arrive (later: 408)")
    parser.add_argument("--max-requests", type=bounded_int(1), default=512,
                        help="most uploads in the server at once (reading, waiting, running); more get 503")
    parser.add_argument("--max-decoded-mb", type=bounded_int(1), default=1024,
                        help="most MiB of decoded images in flight (each read from its header before decoding); "
                             "requests beyond wait")
    parser.add_argument("--max-tiles", type=bounded_int(1), default=64,
                        help="most model inputs (tiles and the whole image) a ?slice= request's image may take; "
                             "more get 422 too_many_tiles")
    tracking = parser.add_argument_group("tracking (POST /track, /track/sessions; the video and tracking extras)")
    tracking.add_argument("--max-video-mb", type=positive_float, default=100.0,
                          help="largest video upload, MiB (default 100; more: 413 body_too_large)")
    tracking.add_argument("--max-video-frames", type=bounded_int(1), default=1800,
                          help="most frames of an uploaded video or a session's stream (default 1800, a minute at "
                               "30 frames/s; more: 413 too_many_frames)")
    tracking.add_argument("--max-track-seconds", type=positive_float, default=300.0,
                          help="most seconds tracking one upload may take (default 300; more: 408 track_timeout)")
    tracking.add_argument("--max-track-sessions", type=bounded_int(1), default=16,
                          help="most frame-stream sessions open at once (default 16; more: 503 too_many_sessions)")
    tracking.add_argument("--session-idle", type=positive_float, default=60.0,
                          help="seconds a session may wait for its next frame before it is closed (default 60)")
    add_resize_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        from detr.serving import create_app, load_service, serve
        from detr.serving.tracking import TrackLimits
    except ImportError as error:
        print(f"detr-serve needs the serve extra ({error}): pip install 'detr-lightning[serve]'", file=sys.stderr)
        return 2

    service = load_service(args.checkpoint, device=args.device, threshold=args.threshold,
                           min_size=args.min_size, max_size=args.max_size)
    app = create_app(service, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout,
                     max_body_bytes=int(args.max_body_mb * 2**20), max_pixels=args.max_pixels,
                     max_queue=args.max_queue or None, max_decoded_bytes=args.max_decoded_mb * 2**20,
                     body_timeout=args.body_timeout, max_requests=args.max_requests, max_tiles=args.max_tiles,
                     track_limits=TrackLimits(max_bytes=int(args.max_video_mb * 2**20),
                                              max_frames=args.max_video_frames, max_seconds=args.max_track_seconds,
                                              max_sessions=args.max_track_sessions, session_idle=args.session_idle))
    serve(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
