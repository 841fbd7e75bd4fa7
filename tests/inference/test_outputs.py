"""The detr-predict command (detr.commands.predict) and detr.inference.outputs: unreadable files are skipped and named, the rest is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr import CategoryMap
from detr.commands import predict
from detr.inference.outputs import assign_image_ids, collect_image_paths, predictions_to_coco_results
from detr.inference.prediction import Prediction
from detr.visualize.drawing import draw_prediction
from tests.helpers import REPO


@pytest.fixture
def image_folder(tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / "a.png")
    Image.fromarray(rng.integers(0, 256, (64, 40), dtype=np.uint8), "L").save(folder / "b.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / "notes.txt").write_text("not an image, and not an image suffix: never collected")
    return folder


def test_predict_tool_skips_corrupt_file(tmp_path, image_folder, tiny_model, capsys):
    checkpoint = tmp_path / "tiny.pth"
    torch.save({"model": tiny_model.state_dict()}, checkpoint)
    out = tmp_path / "out"
    status = predict.main([
        str(image_folder), "--checkpoint", str(checkpoint), "--out", str(out), "--threshold", "0.0",
        "--device", "cpu", "--batch-size", "2", "--min-size", "64", "--max-size", "100",
    ])
    captured = capsys.readouterr()
    assert status != 0
    assert "broken.jpg" in captured.err and "a.png" not in captured.err

    results = json.loads((out / "predictions.json").read_text())
    assert {r["file_name"] for r in results} == {"a.png", "b.jpg"}
    assert len(results) == 2 * tiny_model.num_queries  # threshold 0: every query of both images
    for result in results:
        assert set(result) == {"image_id", "file_name", "category_id", "bbox", "score"}
        assert len(result["bbox"]) == 4 and result["bbox"][2] >= 0 and result["bbox"][3] >= 0
    assert len({(r["file_name"], r["image_id"]) for r in results}) == 2  # one id per file
    assert sorted(p.name for p in out.glob("*.jpg")) == ["a.jpg", "b.jpg"]
    assert Image.open(out / "b.jpg").size == (40, 64)  # drawn on the original image


def test_collect_image_paths(image_folder):
    pattern = str(image_folder / "*.png")
    paths = collect_image_paths([image_folder, pattern, image_folder / "a.png"])
    assert [p.name for p in paths] == ["a.png", "b.jpg", "broken.jpg"]  # de-duplicated, folder order
    with pytest.raises(ValueError, match="nothing.jpg"):
        collect_image_paths([image_folder / "nothing.jpg"])


def make_prediction(file_name: str | None, labels: list[int]) -> Prediction:
    count = len(labels)
    return Prediction(
        boxes=torch.tensor([[10.0, 20.0, 30.0, 60.0]] * count), scores=torch.full((count,), 0.9),
        labels=torch.tensor(labels, dtype=torch.int64), label_names=["x"] * count,
        query_indices=torch.arange(count), image_size=(80, 50), file_name=file_name,
    )


def test_coco_results_use_category_ids_and_xywh():
    category_map = CategoryMap(category_ids=(3, 5), names=("ant", "bee"))
    predictions = [make_prediction("000000000042.jpg", [1, 0]), make_prediction("000000000007.jpg", [])]
    assign_image_ids(predictions)
    assert [p.image_id for p in predictions] == [42, 7]  # COCO file names keep COCO's ids
    results = predictions_to_coco_results(predictions, category_map=category_map)
    assert [r["category_id"] for r in results] == [5, 3]
    assert results[0]["bbox"] == [10.0, 20.0, 20.0, 40.0]
    assert results[0] == {**results[0], "image_id": 42, "file_name": "000000000042.jpg", "score": 0.9}

    named = [make_prediction("dog.jpg", [0]), make_prediction("cat.jpg", [0])]
    assign_image_ids(named)
    assert [p.image_id for p in named] == [1, 2]
    with pytest.raises(ValueError, match="image_id"):
        predictions_to_coco_results([make_prediction(None, [0])], category_map=None)


def test_draw_prediction_keeps_image_size():
    image = np.zeros((80, 50, 3), np.uint8)
    drawn = draw_prediction(image, make_prediction(None, [0, 1]))
    assert drawn.shape == (3, 80, 50) and drawn.dtype == torch.uint8 and drawn.any()
    with pytest.raises(ValueError, match="predicted"):
        draw_prediction(np.zeros((10, 10, 3), np.uint8), make_prediction(None, [0]))


# ------------------------------------------------------------------------------------ one run, one --out
def _predict(image_inputs: list[Path], checkpoint: Path, out: Path, *extra: str) -> int:
    return predict.main([*map(str, image_inputs), "--checkpoint", str(checkpoint), "--out", str(out), "--threshold",
                         "0.0", "--device", "cpu", "--min-size", "64", "--max-size", "100", *extra])


@pytest.fixture
def checkpoint(tmp_path, tiny_model) -> Path:
    path = tmp_path / "tiny.pth"
    torch.save({"model": tiny_model.state_dict()}, path)
    return path


def test_a_second_predict_run_into_a_live_runs_out_is_refused(tmp_path, image_folder, checkpoint, capsys):
    """Two detr-predict runs started together into one --out both exited 0; predictions.json held only the
    second one's detections. Here the first run is another process holding the folder."""
    out = tmp_path / "out"
    holder = ("import sys, time\nfrom detr.output_folder import claim_output_folder\n"
              "with claim_output_folder(sys.argv[1], overwrite=False, overwrite_flag='--overwrite', elsewhere='--out'):\n"
              "    print('held', flush=True)\n    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-c", holder, str(out)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as refusal:
            _predict([image_folder / "a.png"], checkpoint, out)
        assert refusal.value.code == 2
        message = capsys.readouterr().err
        assert f"output folder {out} is in use by a live run (process {first.pid}" in message
        assert "another --out" in message
        assert not (out / "predictions.json").exists() and not list(out.glob("*.jpg"))
    finally:
        first.kill()
        first.wait()
    # killed, its lock is stale: the folder is free again
    assert _predict([image_folder / "a.png"], checkpoint, out) == 0
    assert not (out / "run.lock").exists()  # released at the end


def test_a_later_predict_run_into_a_used_out_is_refused_without_overwrite(tmp_path, image_folder, checkpoint, capsys):
    """A later run into a used --out silently replaced predictions.json and left the old drawings beside the new."""
    out = tmp_path / "out"
    _predict([image_folder / "a.png", image_folder / "b.jpg"], checkpoint, out)
    first = (out / "predictions.json").read_text()
    assert sorted(p.name for p in out.glob("*.jpg")) == ["a.jpg", "b.jpg"]
    (out / "mine.jpg").write_bytes(b"a file of the user's: no run wrote it")

    with pytest.raises(SystemExit) as refusal:
        _predict([image_folder / "a.png"], checkpoint, out)
    assert refusal.value.code == 2
    message = capsys.readouterr().err
    assert f"output folder {out} holds a previous run's outputs" in message and "--overwrite" in message
    assert (out / "predictions.json").read_text() == first

    assert _predict([image_folder / "a.png"], checkpoint, out, "--overwrite") == 0
    assert sorted(p.name for p in out.glob("*.jpg")) == ["a.jpg", "mine.jpg"]  # b.jpg was the old run's
    assert {r["file_name"] for r in json.loads((out / "predictions.json").read_text())} == {"a.png"}
    assert (out / "outputs.txt").read_text().splitlines() == ["a.jpg", "predictions.json"]


def test_an_out_folder_that_holds_the_inputs_is_refused(tmp_path, image_folder, checkpoint, capsys):
    """detr-predict photos/ --out photos/ wrote its drawing b.jpg over the input b.jpg (exit 0), and a later
    --overwrite deleted the inputs."""
    before = {path.name: path.read_bytes() for path in image_folder.iterdir()}
    with pytest.raises(SystemExit) as refusal:
        _predict([image_folder], checkpoint, image_folder, "--overwrite")
    assert refusal.value.code == 2 and "holds input images" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in image_folder.iterdir()} == before  # nothing written, nothing lost
    # a folder above the inputs is fine: the drawings go beside the inputs' folder, not into it
    assert _predict([image_folder / "a.png"], checkpoint, image_folder.parent) == 0
    assert (image_folder.parent / "a.jpg").exists() and (image_folder / "a.png").read_bytes() == before["a.png"]


def test_sigterm_stops_detr_predict_as_ctrl_c_does(tmp_path, image_folder, checkpoint):
    """SIGTERM (a scheduler's stop, `kill`) ended detr-predict at once: no predictions.json for the images done
    and a run.lock left behind. The process here sends itself SIGTERM once the first image is predicted."""
    script = (
        "import os, signal, sys\n"
        "from detr.commands import predict\n"
        "def progress(batches, **_):\n"
        "    for number, batch in enumerate(batches):\n"
        "        if number == 1:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "        yield batch\n"
        "predict.tqdm = progress\n"
        "sys.exit(predict.main(sys.argv[1:]))\n"
    )
    out = tmp_path / "out"
    inputs = [image_folder / "a.png", image_folder / "b.jpg", image_folder / "a.png"]
    arguments = [*map(str, inputs), "--checkpoint", str(checkpoint), "--out", str(out), "--threshold", "0.0",
                 "--device", "cpu", "--min-size", "64", "--max-size", "100"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script, *arguments], env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "SIGTERM: stopped" in done.stderr and "Traceback" not in done.stderr
    written = json.loads((out / "predictions.json").read_text())
    assert {entry["file_name"] for entry in written} == {"a.png"}  # the image done before the signal
    assert not (out / "run.lock").exists()


def test_a_full_disk_keeps_what_was_done_and_names_the_cause(tmp_path, image_folder, checkpoint, monkeypatch,
                                                             capsys):
    """A disk that fills up mid-run ended detr-predict in a traceback; the predictions of the images done are
    kept, and one line names the cause and the file."""
    import errno

    from PIL import Image as PILImage

    real_save, saves = PILImage.Image.save, []

    def save(self, file, *args, **kwargs):
        saves.append(file)
        if len(saves) == 2:  # the second drawing finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(self, file, *args, **kwargs)

    monkeypatch.setattr(PILImage.Image, "save", save)
    out = tmp_path / "out"
    assert _predict([image_folder / "a.png", image_folder / "b.jpg"], checkpoint, out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: No space left on device writing ") and str(out / "b.jpg") in err[-1]
    assert f"{out / 'predictions.json'} holds the images predicted before it" in err[-1]
    # both were predicted (b's drawing is what failed): nothing predicted is lost
    assert {entry["file_name"] for entry in json.loads((out / "predictions.json").read_text())} == {"a.png", "b.jpg"}
    assert (out / "a.jpg").is_file() and not (out / "b.jpg").exists() and not list(out.glob(".*.tmp"))
    assert not (out / "run.lock").exists()
