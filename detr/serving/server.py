"""Load a checkpoint and serve it: :func:`load_service` and :func:`serve` (``detr-serve``).

Uvicorn runs the app in this process: on SIGTERM or Ctrl-C it stops accepting connections, lets the
requests in flight finish (at most ``graceful_seconds``), then stops the batcher (the app's lifespan) and
returns, so ``detr-serve`` exits 0.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from fastapi import FastAPI

from detr.inference.predictor import Predictor
from detr.serving.service import DetectionService

logger = logging.getLogger(__name__)


def load_service(checkpoint: str | Path, *, device: str | None = "auto", threshold: float | None = None,
                 min_size: int | None = None, max_size: int | None = None) -> DetectionService:
    """A :class:`DetectionService` for any checkpoint :meth:`Predictor.from_checkpoint` reads (this project's
    ``.ckpt``/``.pth``, the authors' files and names such as ``detr-r50``, transformers directories, ``.onnx``
    through ONNX Runtime, panoptic models).

    Args:
        device: "auto" (CUDA when available, else the CPU), or a torch device such as "cpu" or "cuda:1".
        threshold: the score threshold of requests that give none (None: the model's validated one, else 0.7).
        min_size, max_size: the eval resize (None: the checkpoint's validation size, else 800 and 1333).
    """
    predictor = Predictor.from_checkpoint(checkpoint, device=None if device == "auto" else device,
                                          threshold=threshold, min_size=min_size, max_size=max_size)
    return DetectionService(predictor, model_name=Path(str(checkpoint)).name)


def serve(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, graceful_seconds: float = 30.0) -> None:
    """Serve ``app`` with uvicorn until SIGTERM or Ctrl-C (then shut down cleanly, see the module docstring)."""
    import uvicorn

    # After its graceful shutdown uvicorn raises the signal again for the handler that was there before it; a
    # handler that does nothing makes that a clean return (exit status 0) instead of death by SIGTERM.
    previous = {sig: signal.signal(sig, _handled) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=graceful_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _handled(sig: int, frame: object) -> None:
    logger.info("shut down on %s", signal.Signals(sig).name)
