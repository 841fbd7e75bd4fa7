"""The HTTP API (FastAPI): :func:`create_app` over a :class:`~detr.serving.service.DetectionService`.

Endpoints:
    POST /predict?threshold=T&task=K   an image as the raw request body or as the multipart field ``image``;
        the JSON of :func:`detr.serving.service.prediction_json`. Concurrent requests are batched.
        ``&slice=SIZE&slice_overlap=F`` predicts SIZE-px tiles and the whole image, merged
        (:mod:`detr.inference.slicing`), at most ``max_tiles`` model inputs per image. A prompted model
        (Grounding DINO) needs ``&prompt=a cat. a remote control.`` (``&text_threshold=T``: a word's score to be
        part of a box's phrase, default 0.25), and any other refuses one (422 ``prompt_required`` /
        ``prompt_not_read``).
    POST /explore?threshold=T          the same image input; the attention explorer's HTML page for it
        (:mod:`detr.visualize.explorer`), which ``GET /`` shows in a frame.
    POST /track?tracker=N&threshold=T&format=F   a video (raw body or multipart field ``video``) tracked whole:
        tracks.json's record (``format=tracks``) or tracks.txt's MOTChallenge lines (``format=mot``)
        (:mod:`detr.serving.tracking`), bounded by ``track_limits`` (bytes, frames, seconds).
    POST /track/sessions?tracker=N&threshold=T&frame_rate=R   opens a frame stream: ``{"session": id, ...}``;
    POST /track/sessions/ID/frames     its next frame (an image): /predict's JSON with ``frame`` and each
        detection's ``track_id``; DELETE /track/sessions/ID closes it and answers its tracks.
    GET /health                        ``{"status": "ok", "model", "device", "backend", ...}``
    GET /stats                         requests served and the batch sizes the server formed
    GET /                              the page: drop or pick an image, see the boxes, click one for its attention

Every refused request gets a 4xx JSON body ``{"error": kind, "detail": message}`` (see
:class:`detr.serving.inputs.RequestError`): body over ``max_body_bytes`` (413 ``body_too_large``), not an
image, truncated, too many pixels, decompression bomb, too thin to resize, unknown or unsupported task,
threshold out of range, a bad slice or one that cuts the image into more than ``max_tiles`` inputs (422
``too_many_tiles``);
a body that has not all arrived after ``body_timeout`` seconds gets 408 ``body_timeout``; more than
``max_requests`` uploads in the server at once, or more than ``max_queue`` requests waiting for the model or for
memory to decode their images in (at most ``max_decoded_bytes`` of decoded images in flight:
:mod:`detr.serving.budget`), get 503 ``overloaded``.
A model whose outputs are not finite answers that request 500 ``model_output``; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.requests import ClientDisconnect

from detr.serving.batching import DynamicBatcher, QueueFull
from detr.serving.budget import BudgetFull, DecodedBytesBudget
from detr.serving.inputs import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_TILES,
    RequestError,
    check_tiles,
    decode_image_bytes,
    decoded_bytes,
    parse_prompt,
    parse_slice,
    parse_task,
    parse_threshold,
)
from detr.serving.service import DetectionService, Job, ModelOutputError, prediction_json
from detr.serving.tracking import (
    TrackLimits,
    TrackSessions,
    parse_frame_rate,
    parse_track_format,
    parse_tracker,
    track_upload,
    tracks_json,
)

logger = logging.getLogger(__name__)

#: The largest request body the server reads: 20 MiB, a large camera JPEG with room to spare.
DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024
#: The most requests that may wait for the model before the server answers 503.
DEFAULT_MAX_QUEUE = 256
#: The decoded images a server holds at once: 1 GiB, eight 40 MP images or about thirty 12 MP photos.
DEFAULT_MAX_DECODED_BYTES = 2**30
#: Seconds a request's body may take to arrive: a 20 MiB upload at 1 MB/s, with room to spare.
DEFAULT_BODY_TIMEOUT = 30.0
#: The most POST requests the server handles at once (reading, waiting, running); more get 503 at once.
DEFAULT_MAX_REQUESTS = 512


async def read_body(request: Request, max_body_bytes: int, body_timeout: float = DEFAULT_BODY_TIMEOUT, *,
                    what: str = "image", option: str = "--max-body-mb") -> bytes:
    """The request body, refused (413 ``body_too_large``, naming ``option``, the limit's) as soon as it passes
    ``max_body_bytes``: from the Content-Length header before anything is read, else while streaming (chunked
    uploads); and refused (408 ``body_timeout``) when it has not all arrived after ``body_timeout`` seconds (a client
    that sends half a body and waits held its request open until the connection died). ``what``: the file the body
    holds ("image", "video"), for the messages."""
    too_large = RequestError(413, "body_too_large", f"the request body is larger than the server's limit of "
                                                    f"{max_body_bytes} bytes ({option}); send a smaller {what}")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_body_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError as error:
        raise RequestError(408, "body_timeout", f"the request body did not arrive within {body_timeout:g} s "
                                                f"(--body-timeout; {size} bytes came): send the whole {what} "
                                                "at once") from error
    return b"".join(chunks)


class RequestLimit:
    """ASGI middleware: at most ``limit`` POST requests (uploads) in the app at once, from their first byte to
    their answer; one more is answered 503 ``overloaded`` at once. GET requests (/health, /stats, the page)
    are never refused, so a busy server can still be watched."""

    def __init__(self, app: Any, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the request limit must be >= 1, got {limit}")
        self.app, self.limit, self.active = app, limit, 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            error = RequestError(503, "overloaded", f"{self.active} requests are in the server already "
                                                    f"(--max-requests {self.limit}); retry later")
            await JSONResponse(error.to_json(), status_code=error.status)(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


async def image_bytes(request: Request, max_body_bytes: int, body_timeout: float = DEFAULT_BODY_TIMEOUT, *,
                      what: str = "image", option: str = "--max-body-mb") -> bytes:
    """The file of a request: the multipart field named ``what`` ("image", "video") or, for any other content type,
    the body (:func:`read_body`, whose limit is ``option``)."""
    body = await read_body(request, max_body_bytes, body_timeout, what=what, option=option)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return body

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_part_size=max_body_bytes)
    except Exception as error:  # a malformed multipart body
        raise RequestError(400, "bad_multipart", f"the multipart body could not be parsed ({error})") from error
    field = form.get(what)
    if field is None or isinstance(field, str):
        example = "photo.jpg" if what == "image" else "clip.mp4"
        raise RequestError(400, f"missing_{what}_field", f"the multipart body has no file field '{what}'; send the "
                                                          f"{what} as -F {what}=@{example} or as the raw body")
    return await field.read()


def create_app(
    service: DetectionService,
    *,
    max_batch_size: int = 8,
    batch_timeout: float = 0.01,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_queue: int | None = DEFAULT_MAX_QUEUE,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    max_tiles: int = DEFAULT_MAX_TILES,
    track_limits: TrackLimits = TrackLimits(),
) -> FastAPI:
    """The server's FastAPI application; the batcher starts and stops with it (its lifespan).

    Args:
        service: the model.
        max_batch_size: the most requests per forward pass.
        batch_timeout: how long (seconds) a request waits for others to batch with.
        max_body_bytes: the largest request body accepted.
        max_pixels: the most pixels an image may have.
        max_queue: the most requests that may wait for the model, and the most that may wait for memory to
            decode in; more get 503 ``overloaded`` (None: no limit).
        max_decoded_bytes: the most bytes of decoded images in flight (read from each image's header before it
            is decoded); a request whose image does not fit waits for others to be answered.
        body_timeout: seconds a request's body may take to arrive; later, 408 ``body_timeout``.
        max_requests: the most POST requests in the server at once; more get 503 ``overloaded`` at once
            (:class:`RequestLimit`).
        max_tiles: the most model inputs (tiles and the whole image) a ``?slice=`` request's image may take.
        track_limits: the bounds of ``/track`` uploads and ``/track/sessions`` streams (:mod:`detr.serving.tracking`).
    """
    batcher = DynamicBatcher(service.run_batch, max_batch_size=max_batch_size, batch_timeout=batch_timeout,
                             max_queue=max_queue)
    budget = DecodedBytesBudget(max_decoded_bytes, max_waiting=max_queue)
    counts = {"requests": 0, "errors": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        logger.info("serving %s on %s", service.model_name, service.predictor.backend)
        yield
        await batcher.stop()
        logger.info("stopped: %d requests, %d refused or failed", counts["requests"], counts["errors"])

    app = FastAPI(title="DETR", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(RequestLimit, limit=max_requests)
    app.state.batcher = batcher
    app.state.budget = budget

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        counts["errors"] += 1
        return JSONResponse(error.to_json(), status_code=error.status)

    @app.exception_handler(ModelOutputError)
    async def failed(request: Request, error: ModelOutputError) -> JSONResponse:
        counts["errors"] += 1
        logger.error("request failed in the model: %s", error)
        return JSONResponse({"error": "model_output", "detail": str(error)}, status_code=500)

    @contextlib.asynccontextmanager
    async def decoded_image(request: Request) -> AsyncIterator[np.ndarray]:
        """The request's image, decoded once its decoded size (read from the header) fits the budget, which it
        holds until the block ends (the request is answered)."""
        try:
            data = await image_bytes(request, max_body_bytes, body_timeout)
        except ClientDisconnect as error:
            raise RequestError(400, "client_disconnected", "the client left before sending the whole body") from error
        # header and decoding run on a thread of their own, beside the model's
        size = await asyncio.to_thread(decoded_bytes, data, max_pixels=max_pixels)
        try:
            async with budget.hold(size):
                pixels = await asyncio.to_thread(decode_image_bytes, data, max_pixels=max_pixels)
                del data
                try:
                    service.check_image(pixels)
                except ValueError as error:
                    raise RequestError(422, "image_too_thin", str(error)) from error
                yield pixels
        except BudgetFull as error:
            raise RequestError(503, "overloaded", str(error)) from error

    @app.post("/predict")
    async def predict(request: Request) -> JSONResponse:
        counts["requests"] += 1
        threshold = parse_threshold(request.query_params.get("threshold"), service.predictor.threshold)
        task = parse_task(request.query_params.get("task"))
        tiles = parse_slice(request.query_params.get("slice"), request.query_params.get("slice_overlap"))
        prompt = parse_prompt(request.query_params.get("prompt"), prompted=service.predictor.model.prompted,
                              model_name=service.model_name)
        text_threshold = parse_threshold(request.query_params.get("text_threshold"), 0.25, "text_threshold")
        try:
            service.check_task(task)
        except ValueError as error:
            raise RequestError(422, "unsupported_task", str(error)) from error
        try:
            service.predictor.check_slice(tiles, task=task)
        except ValueError as error:
            raise RequestError(422, "bad_slice", str(error)) from error
        try:
            service.predictor.check_prompt(prompt, task=task, slice=tiles)
        except ValueError as error:  # a prompt with a task or a slice it cannot go with
            raise RequestError(422, "bad_prompt", str(error)) from error
        async with decoded_image(request) as pixels:
            if tiles is not None:
                check_tiles(tiles, pixels, max_tiles)
            try:
                return JSONResponse(await batcher.submit(Job(pixels=pixels, threshold=threshold, task=task,
                                                             slice=tiles, prompt=prompt,
                                                             text_threshold=text_threshold)))
            except QueueFull as error:
                raise RequestError(503, "overloaded", str(error)) from error

    @app.post("/explore")
    async def explore(request: Request) -> HTMLResponse:
        counts["requests"] += 1
        threshold = parse_threshold(request.query_params.get("threshold"), service.predictor.threshold)
        title = request.query_params.get("title") or "uploaded image"
        refuse_prompted(service, "/explore")
        if service.predictor.model.attention_kind is None:  # what this backend cannot do is a 4xx, not a 500
            raise RequestError(400, "no_attention", f"{service.model_name} runs on {service.predictor.backend}, "
                               "which returns no attention: the explorer needs the model's PyTorch checkpoint "
                               "(detr-serve --checkpoint <the .ckpt or .pth it was exported from>)")
        async with decoded_image(request) as pixels:
            page = await batcher.run_exclusive(lambda: service.explorer_page(pixels, title=title, threshold=threshold))
        return HTMLResponse(page)

    sessions = TrackSessions(service, track_limits)
    app.state.track_sessions = sessions

    @app.post("/track", response_model=None)
    async def track(request: Request) -> JSONResponse | PlainTextResponse:
        counts["requests"] += 1
        threshold = parse_threshold(request.query_params.get("threshold"), service.predictor.threshold)
        tracker = parse_tracker(request.query_params.get("tracker"))
        answer = parse_track_format(request.query_params.get("format"))
        refuse_prompted(service, "/track")
        try:
            data = await image_bytes(request, track_limits.max_bytes, body_timeout, what="video",
                                     option="--max-video-mb")
        except ClientDisconnect as error:
            raise RequestError(400, "client_disconnected", "the client left before sending the whole body") from error
        if not data:
            raise RequestError(400, "empty_body", "the request holds no video: send the video file as the request "
                                                  "body or as the multipart field 'video'")
        tracked = await track_upload(data, service, batcher.run_exclusive, tracker=tracker, threshold=threshold,
                                     limits=track_limits, max_pixels=max_pixels)
        if answer == "mot":
            return PlainTextResponse("".join(line + "\n" for line in tracked.lines))
        return JSONResponse(tracks_json(tracked, service, source="upload", tracker=tracker, threshold=threshold))

    @app.post("/track/sessions", status_code=201)
    async def open_session(request: Request) -> JSONResponse:
        refuse_prompted(service, "/track/sessions")
        session = sessions.open(
            tracker=parse_tracker(request.query_params.get("tracker")),
            threshold=parse_threshold(request.query_params.get("threshold"), service.predictor.threshold),
            frame_rate=parse_frame_rate(request.query_params.get("frame_rate")))
        return JSONResponse(session.describe(track_limits), status_code=201)

    @app.post("/track/sessions/{key}/frames")
    async def track_frame(key: str, request: Request) -> JSONResponse:
        counts["requests"] += 1
        session = sessions.get(key)
        async with decoded_image(request) as pixels:
            prediction = await sessions.track_frame(session, pixels, batcher.run_exclusive)
        if prediction.error is not None:
            raise ModelOutputError(prediction.error)
        return JSONResponse({"session": session.id, **prediction_json(
            prediction, category_map=service.predictor.category_map, model_name=service.model_name,
            task="detection", threshold=session.threshold)})

    @app.delete("/track/sessions/{key}")
    async def close_session(key: str) -> JSONResponse:
        session = sessions.close(key)
        return JSONResponse({**session.describe(track_limits),
                             "tracks": [session.tracks[track_id] for track_id in sorted(session.tracks)]})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        predictor = service.predictor
        return {"status": "ok", "model": service.model_name, "description": service.description,
                "device": str(predictor.device), "backend": predictor.backend,
                "tasks": [task for task in ("detection", "instances", "panoptic") if _can(service, task)],
                "threshold": predictor.threshold, "prompted": predictor.model.prompted,
                "max_batch_size": batcher.max_batch_size,
                "batch_timeout": batcher.batch_timeout, "max_queue": batcher.max_queue,
                "max_decoded_bytes": budget.limit, "max_tiles": max_tiles,
                "track": {"max_video_bytes": track_limits.max_bytes, "max_frames": track_limits.max_frames,
                          "max_seconds": track_limits.max_seconds, "max_sessions": track_limits.max_sessions,
                          "session_idle": track_limits.session_idle}}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {**counts, "batch_sizes": {str(size): n for size, n in sorted(batcher.batch_sizes.items())},
                "decoded_bytes": budget.stats(),
                "track_sessions": {"open": len(sessions.sessions), "expired": sessions.expired}}

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("detr.serving").joinpath("page.html").read_text(encoding="utf-8"))

    return app


def refuse_prompted(service: DetectionService, endpoint: str) -> None:
    """Raise 422 ``prompt_unsupported`` when the model is a prompted one (Grounding DINO): ``endpoint`` does not
    pass a prompt yet, and the model detects nothing without one."""
    if service.predictor.model.prompted:
        raise RequestError(422, "prompt_unsupported", f"{service.model_name} detects what a text prompt names and "
                           f"{endpoint} takes no prompt: use /predict?prompt=a%20cat.%20a%20remote%20control.")


def _can(service: DetectionService, task: str) -> bool:
    try:
        service.check_task(task)
    except ValueError:
        return False
    return True
