"""Serving a detector over HTTP (``detr-serve``): a FastAPI app with dynamic batching and a page to try it.

Needs the ``serve`` extra (``pip install 'detr-lightning[serve]'``: fastapi, uvicorn, python-multipart);
``import detr`` does not import this package.

- :mod:`~detr.serving.inputs`: request bytes and parameters → an image array, or a 4xx :class:`RequestError`;
- :mod:`~detr.serving.budget`: :class:`DecodedBytesBudget`, the decoded images a server holds at once;
- :mod:`~detr.serving.batching`: :class:`DynamicBatcher`, requests that arrive together run together;
- :mod:`~detr.serving.service`: the :class:`~detr.inference.predictor.Predictor` on batches, its JSON;
- :mod:`~detr.serving.tracking`: video uploads and frame streams tracked, within their bounds (:class:`TrackLimits`);
- :mod:`~detr.serving.app`: the endpoints (:func:`create_app`);
- :mod:`~detr.serving.server`: load a checkpoint and run uvicorn (:func:`load_service`, :func:`serve`).

Why FastAPI and not LitServe: LitServe 0.2.19's batched loop fails every request of a batch when one of them
raises (a corrupt image among seven good ones: eight 400s, measured in docs/guides/serve.md), and each request
crosses two process boundaries; a bad request must cost only itself, so the batcher here is our own.
"""

from detr.serving.app import create_app
from detr.serving.batching import DynamicBatcher
from detr.serving.inputs import RequestError, decode_image_bytes
from detr.serving.server import load_service, serve
from detr.serving.service import DetectionService, Job, prediction_json

__all__ = [
    "DetectionService",
    "DynamicBatcher",
    "Job",
    "RequestError",
    "create_app",
    "decode_image_bytes",
    "load_service",
    "prediction_json",
    "serve",
]
