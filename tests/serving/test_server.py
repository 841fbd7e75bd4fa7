"""detr-serve over real HTTP (one server process for the module, tests/serving/conftest.py): /predict equals
the Predictor on the repository's photos, alone and batched; bad inputs get a 4xx JSON that names the problem
and the server keeps serving; 200 requests at concurrency 8 without an error; a NaN model fails per request;
SIGTERM ends the server cleanly."""

from __future__ import annotations

import concurrent.futures
import http.client
import io
import json
import math
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr import build_detr
from detr.checkpoints import save_checkpoint
from detr.inference.predictor import Predictor
from detr.inference.slicing import SliceSettings
from tests.helpers import load_script, randomise, read_sampling_page, tiny_config_with
from tests.serving.helpers import MAX_BODY_MB, THRESHOLD, spread_out_model

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"
PHOTO_FILES = sorted(p for p in PHOTOS.iterdir() if p.suffix in (".png", ".jpg"))

pytestmark = pytest.mark.usefixtures("one_thread")


def post(url: str, body: bytes, *, content_type: str = "application/octet-stream") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post_multipart(url: str, field: str, file_name: str, data: bytes) -> tuple[int, dict]:
    """POST ``data`` as the file field ``field`` of a multipart form (what ``curl -F field=@file`` sends)."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{file_name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return post(url, body, content_type=f"multipart/form-data; boundary={boundary}")


@pytest.fixture(scope="module")
def predictor(checkpoint) -> Predictor:
    return Predictor.from_checkpoint(checkpoint, threshold=THRESHOLD, device="cpu")


def assert_same_as_predictor(response: dict, expected, predictor: Predictor) -> None:
    assert response["image"] == {"width": expected.image_size[1], "height": expected.image_size[0]}
    detections = response["detections"]
    assert [d["query"] for d in detections] == expected.query_indices.tolist()
    assert [d["label"] for d in detections] == expected.labels.tolist()
    assert [d["category_name"] for d in detections] == expected.label_names
    assert [d["category_id"] for d in detections] == [predictor.category_map.category_ids[label]
                                                      for label in expected.labels.tolist()]
    np.testing.assert_allclose([d["score"] for d in detections], expected.scores.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array([d["box_xyxy"] for d in detections]).reshape(-1, 4), expected.boxes.numpy(),
                               rtol=0, atol=1e-3)


def test_predict_equals_the_predictor_on_photos(server, predictor) -> None:
    assert len(PHOTO_FILES) >= 4
    seen = 0
    for photo in PHOTO_FILES:
        expected = predictor.predict(photo)[0]
        status, raw = post(server.url + "/predict", photo.read_bytes())
        assert status == 200, raw
        assert raw["model"] == "tiny.ckpt" and raw["task"] == "detection" and raw["threshold"] == THRESHOLD
        assert_same_as_predictor(raw, expected, predictor)
        status, form = post_multipart(server.url + "/predict", "image", photo.name, photo.read_bytes())
        assert status == 200 and form["detections"] == raw["detections"]
        seen += len(raw["detections"])
    assert seen > 0, "the photos gave no detection to compare"


def test_threshold_parameter(server, predictor) -> None:
    photo = PHOTOS / "chelsea.png"
    for threshold in (0.0, 0.8, 1.0):
        status, response = post(server.url + f"/predict?threshold={threshold}", photo.read_bytes())
        assert status == 200 and response["threshold"] == threshold
        assert_same_as_predictor(response, predictor.predict(photo, threshold=threshold)[0], predictor)
    assert len(post(server.url + "/predict?threshold=0", photo.read_bytes())[1]["detections"]) == 12  # every query


def test_slice_parameter_gives_the_predictors_sliced_predictions(server, predictor) -> None:
    photo = PHOTOS / "chelsea.png"
    status, response = post(server.url + "/predict?slice=160&slice_overlap=0.3&threshold=0.3", photo.read_bytes())
    assert status == 200, response
    settings = SliceSettings(160, overlap=0.3)
    expected = predictor.predict(photo, slice=settings, threshold=0.3)[0]
    assert response["slice"] == {"size": 160, "overlap": 0.3, "inputs": settings.count(*expected.image_size)}
    assert response["slice"]["inputs"] > 2
    assert_same_as_predictor(response, expected, predictor)


def test_concurrent_requests_are_batched_and_give_the_same_results(server, predictor) -> None:
    photos = [PHOTOS / "chelsea.png", PHOTOS / "astronaut.png"] * 6  # two sizes: batched within each size
    before = json.loads(urllib.request.urlopen(server.url + "/stats").read())["batch_sizes"]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda p: post(server.url + "/predict", p.read_bytes()), photos))
    after = json.loads(urllib.request.urlopen(server.url + "/stats").read())["batch_sizes"]
    formed = {int(size): n - before.get(size, 0) for size, n in after.items() if n - before.get(size, 0)}
    assert max(formed) > 1, formed  # 12 requests within 50 ms: some shared a batch
    assert sum(size * n for size, n in formed.items()) == len(photos)
    expected = {photo: predictor.predict(photo)[0] for photo in set(photos)}
    for photo, (status, response) in zip(photos, responses):
        assert status == 200, response
        assert_same_as_predictor(response, expected[photo], predictor)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def post_oversized(url: str, size: int, *, chunked: bool) -> tuple[int, str]:
    """POST ``size`` bytes to /predict and return the status and error kind; the server may answer (and close)
    before the client has sent everything, which is the point."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/predict")
    connection.putheader("Content-Type", "application/octet-stream")
    connection.putheader(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(size))))
    connection.endheaders()
    block = bytes(2**16)
    try:
        for start in range(0, size, len(block)):
            piece = block[: size - start]
            connection.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            connection.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server refused the rest
    response = connection.getresponse()
    kind = json.loads(response.read())["error"]
    connection.close()
    return response.status, kind


def bad_requests() -> list[tuple[str, str, bytes, str, int, str]]:
    """(name, query, body, content type, status, error kind) of requests the server must refuse."""
    photo = (PHOTOS / "chelsea.png").read_bytes()
    jpeg = (PHOTOS / "grace_hopper.jpg").read_bytes()
    noise = np.random.default_rng(0).integers(0, 256, (1000, 1100, 3), dtype=np.uint8)  # 1.1 MP > 1 MP, ~3 MB
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="JPEG", quality=95)  # ~1.5 MB: under the body limit
    bomb = io.BytesIO()
    Image.new("L", (12_000, 12_000)).save(bomb, format="PNG")  # 144 MP in ~140 kB
    octet = "application/octet-stream"
    return [
        ("text", "", b"name,score\ncat,0.9\n", "text/csv", 400, "not_an_image"),
        ("empty", "", b"", octet, 400, "empty_body"),
        ("truncated png", "", photo[: len(photo) // 2], "image/png", 400, "truncated_image"),
        ("truncated jpeg", "", jpeg[: len(jpeg) // 2], "image/jpeg", 400, "truncated_image"),
        ("png header only", "", photo[:40], "image/png", 400, "truncated_image"),
        ("too many pixels", "", buffer.getvalue(), "image/jpeg", 413, "image_too_large"),
        ("decompression bomb", "", bomb.getvalue(), "image/png", 413, "decompression_bomb"),
        ("too thin to resize", "", _png(np.zeros((1, 4000, 3), np.uint8)), "image/png", 422, "image_too_thin"),
        ("unknown task", "?task=segmentation", photo, octet, 422, "unknown_task"),
        ("panoptic on a detection model", "?task=panoptic", photo, octet, 422, "unsupported_task"),
        ("threshold above 1", "?threshold=1.5", photo, octet, 422, "bad_threshold"),
        ("threshold below 0", "?threshold=-0.1", photo, octet, 422, "bad_threshold"),
        ("threshold nan", "?threshold=nan", photo, octet, 422, "bad_threshold"),
        ("threshold text", "?threshold=high", photo, octet, 422, "bad_threshold"),
        ("slice zero", "?slice=0", photo, octet, 422, "bad_slice"),
        ("slice text", "?slice=big", photo, octet, 422, "bad_slice"),
        ("slice overlap 1", "?slice=64&slice_overlap=1", photo, octet, 422, "bad_slice"),
        ("slice overlap alone", "?slice_overlap=0.2", photo, octet, 422, "bad_slice"),
        ("slice beyond the tiles' limit", "?slice=8", photo, octet, 422, "too_many_tiles"),
    ]


def test_bad_inputs_get_a_4xx_json_that_names_the_problem(server) -> None:
    for name, query, body, content_type, status, kind in bad_requests():
        got_status, response = post(server.url + "/predict" + query, body, content_type=content_type)
        assert (got_status, response.get("error")) == (status, kind), (name, response)
        assert len(response["detail"]) > 20, (name, response)
    # a body over the limit: refused from its Content-Length, or while it streams in (chunked, no length)
    for chunked in (False, True):
        assert post_oversized(server.url, MAX_BODY_MB * 2**20 + 1, chunked=chunked) == (413, "body_too_large")
    # a multipart body without the field "image"
    got_status, response = post_multipart(server.url + "/predict", "photo", "a.png", b"...")
    assert (got_status, response["error"]) == (400, "missing_image_field")
    # and the server still serves
    status, response = post(server.url + "/predict", (PHOTOS / "chelsea.png").read_bytes())
    assert status == 200 and response["detections"]
    assert json.loads(urllib.request.urlopen(server.url + "/health").read())["status"] == "ok"


def test_a_bad_request_does_not_fail_the_ones_batched_with_it(server, predictor) -> None:
    photo = PHOTOS / "chelsea.png"
    bodies = [photo.read_bytes()] * 7 + [b"not an image"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda body: post(server.url + "/predict", body), bodies))
    assert [status for status, _ in responses] == [200] * 7 + [400]
    for _, response in responses[:7]:
        assert_same_as_predictor(response, predictor.predict(photo)[0], predictor)


def test_health_and_explore(server) -> None:
    health = json.loads(urllib.request.urlopen(server.url + "/health").read())
    assert health["status"] == "ok" and health["model"] == "tiny.ckpt" and health["device"] == "cpu"
    assert health["tasks"] == ["detection"] and health["threshold"] == THRESHOLD
    request = urllib.request.Request(server.url + "/explore?title=cat", data=(PHOTOS / "chelsea.png").read_bytes(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        page = response.read().decode()
    assert response.headers["content-type"].startswith("text/html")
    data = json.loads(page.split('<script type="application/json" id="explorer-data">')[1].split("</script>")[0])
    assert data["title"] == "cat" and data["num_queries"] == 12 and data["image"]["original_width"] == 451
    with urllib.request.urlopen(server.url + "/") as response:
        assert b"detrServe" in response.read()


def test_200_requests_at_concurrency_8_without_an_error(server, load_tools) -> None:
    result = load_tools.run_load(server.url, (PHOTOS / "chelsea.png").read_bytes(), requests=200, concurrency=8,
                                 time_limit=120)
    assert len(result.latencies) == 200 and result.errors == 0, result.statuses
    assert sum(size * n for size, n in result.batch_sizes.items()) == 200
    assert max(result.batch_sizes) > 1, result.batch_sizes


def test_decoded_images_in_flight_stay_within_the_budget(checkpoint, predictor, tmp_path, load_tools) -> None:
    """The queue bounded the number of requests, not the size of their images: sixteen small files of large
    images decoded at once. With --max-decoded-mb 1, one decoded photo (451 × 300 RGB: 0.8 MB with its file's
    own pixels) fills the budget, so the others wait and no two share a batch, and all are answered."""
    photo = PHOTOS / "chelsea.png"
    with load_tools.running_server(checkpoint, tmp_path / "server.log", "--threshold", str(THRESHOLD),
                                   "--batch-timeout", "0.05", "--max-decoded-mb", "1", threads=1) as server:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda _: post(server.url + "/predict", photo.read_bytes()), range(6)))
        stats = json.loads(urllib.request.urlopen(server.url + "/stats").read())
    expected = predictor.predict(photo)[0]
    for status, response in responses:
        assert status == 200, response
        assert_same_as_predictor(response, expected, predictor)
    assert stats["decoded_bytes"] == {"limit": 2**20, "in_flight": 0, "peak": 451 * 300 * (3 + 3)}
    assert stats["batch_sizes"] == {"1": 6}


def _stalled_upload(url: str) -> http.client.HTTPConnection:
    """A POST /predict that announces 1,000 bytes, sends 10 and waits: what a slow or stuck client does."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/predict")
    connection.putheader("Content-Type", "application/octet-stream")
    connection.putheader("Content-Length", "1000")
    connection.endheaders()
    connection.send(bytes(10))
    return connection


def test_uploads_beyond_max_requests_are_refused_at_once(checkpoint, tmp_path, load_tools) -> None:
    """Half-sent requests were held open without a limit: each one costs the server a request in flight. With
    --max-requests 2, two stalled uploads fill the server and a third upload gets 503 overloaded at once; GET
    requests are still answered."""
    photo = (PHOTOS / "chelsea.png").read_bytes()
    with load_tools.running_server(checkpoint, tmp_path / "server.log", "--max-requests", "2",
                                   "--body-timeout", "600", threads=1) as server:
        stalled = [_stalled_upload(server.url) for _ in range(2)]
        try:
            while json.loads(urllib.request.urlopen(server.url + "/stats").read())["requests"] < 2:
                time.sleep(0.05)  # both are in the server, reading their bodies
            status, response = post(server.url + "/predict", photo)
            assert (status, response["error"]) == (503, "overloaded"), response
            assert "--max-requests 2" in response["detail"]
            assert json.loads(urllib.request.urlopen(server.url + "/health").read())["status"] == "ok"
        finally:
            for connection in stalled:
                connection.close()


def test_a_model_with_nan_outputs_fails_each_request_and_sigterm_stops_the_server(tmp_path, load_tools) -> None:
    """A NaN model: each request gets 500 model_output and the server goes on. Then SIGTERM while requests are
    in flight (batches of one at 800 px, a few tenths of a second each): every one of them is still answered,
    and the server exits 0."""
    model = spread_out_model()
    with torch.no_grad():
        model.class_embed.weight.fill_(math.nan)
    checkpoint = save_checkpoint(model, tmp_path / "nan.ckpt")
    photo = (PHOTOS / "chelsea.png").read_bytes()
    with load_tools.running_server(checkpoint, tmp_path / "server.log", "--max-batch-size", "1", "--min-size", "800",
                                   "--max-size", "1333", threads=1) as server:
        for _ in range(2):
            status, response = post(server.url + "/predict", photo)
            assert (status, response["error"]) == (500, "model_output"), response
            assert "not finite" in response["detail"]
        assert json.loads(urllib.request.urlopen(server.url + "/health").read())["status"] == "ok"

        def timed_post(_: int) -> tuple[int, float]:
            status, _ = post(server.url + "/predict", photo)
            return status, time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(timed_post, i) for i in range(4)]
            while json.loads(urllib.request.urlopen(server.url + "/stats").read())["requests"] < 6:
                time.sleep(0.01)
            stopped_at = time.monotonic()
            assert server.stop(timeout=600) == 0  # SIGTERM: a clean exit, however loaded the machine
            answers = [future.result() for future in in_flight]
    assert [status for status, _ in answers] == [500] * 4  # answered (the NaN model's error), none dropped
    assert max(answered_at for _, answered_at in answers) > stopped_at  # some were still running at SIGTERM
    log = (tmp_path / "server.log").read_text()
    assert "Application shutdown complete" in log and "stopped: 6 requests, 6 refused or failed" in log


def test_a_deformable_model_serves_its_explorer_page(tmp_path, load_tools) -> None:
    """/explore on a Deformable DETR answers the explorer page of its sampling points (the page that / shows in
    its frame), and /predict its detections."""
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, dropout=0.0,
                                        box_refine=True)).eval()
    randomise(model, 1)
    model.meta = model.meta.replace(eval_size=(160, 240))
    checkpoint = save_checkpoint(model, tmp_path / "deformable.ckpt")
    photo = PHOTOS / "chelsea.png"
    with load_tools.running_server(checkpoint, tmp_path / "server.log", "--threshold", "0.0", threads=1) as server:
        request = urllib.request.Request(server.url + "/explore?title=cat", data=photo.read_bytes(), method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            page = response.read().decode()
        status, predicted = post(server.url + "/predict", photo.read_bytes())
    path = tmp_path / "served.html"
    path.write_text(page, encoding="utf-8")
    data = read_sampling_page(path)
    assert data["kind"] == "sampling" and data["title"] == "cat" and data["image"]["original_width"] == 451
    expected = Predictor(model, device="cpu").predict(photo, threshold=0.0, return_attention=True)[0]
    width, height = expected.image_size[1], expected.image_size[0]
    pixels = data["sampling"]["points"] * np.array([width, height])
    assert np.abs(pixels - expected.sampling.points.numpy()).max() <= 0.5 / 16384 * width + 1e-3
    assert status == 200 and len(predicted["detections"]) == 10


def test_explore_on_an_onnx_model_is_a_4xx_that_names_the_fix(checkpoint, tmp_path, load_tools) -> None:
    """/explore on an .onnx model answered 500 model_output: ONNX Runtime returns no
    attention, so the request is refused as one the backend cannot serve; /predict still works."""
    onnx_path = tmp_path / "tiny.onnx"
    assert load_script("tools/export.py").main([str(checkpoint), "--out", str(onnx_path)]) == 0
    photo = (PHOTOS / "chelsea.png").read_bytes()
    with load_tools.running_server(onnx_path, tmp_path / "server.log", threads=1) as server:
        status, response = post(server.url + "/explore", photo)
        assert (status, response["error"]) == (400, "no_attention"), response
        assert "PyTorch checkpoint" in response["detail"]
        assert post(server.url + "/predict", photo)[0] == 200
