"""Inference degrades per file, never per run: an image that cannot be processed (too thin, undecodable,
NaN output) is reported and skipped, the rest is written, predictions.json is always valid JSON, float
images are scaled, and file names stay unique."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr.data.images import load_rgb_image
from detr.inference.outputs import predict_files, unique_file_names
from detr.inference.predictor import Predictor
from detr.visualize.explorer import write_attention_explorer

pytestmark = pytest.mark.usefixtures("one_thread")


def _image(path: Path, size: tuple[int, int] = (48, 64), seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture
def images(tmp_path) -> list[Path]:
    """Two good images, one 1 x 500 pixels (too thin to resize), one text file named .jpg."""
    good = [_image(tmp_path / "in" / "a.jpg", seed=1), _image(tmp_path / "in" / "c.png", seed=2)]
    thin = _image(tmp_path / "in" / "thin.png", size=(1, 500))
    text = tmp_path / "in" / "notes.jpg"
    text.write_text("not an image")
    return [good[0], thin, text, good[1]]


def _predictor(model, **kwargs) -> Predictor:
    return Predictor(model, device="cpu", min_size=64, max_size=96, threshold=0.0, **kwargs)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_predict_files_skips_images_it_cannot_process_and_writes_the_rest(tiny_model, images, tmp_path,
                                                                          batch_size) -> None:
    run = predict_files(_predictor(tiny_model, batch_size=batch_size), images, tmp_path / "out", draw=True)
    assert [p.file_name for p in run.predictions] == ["a.jpg", "c.png"]
    skipped = dict(run.skipped)
    assert set(skipped) == {images[1], images[2]}
    assert "500x1" in skipped[images[1]]  # the thin image's size is named, not a bare OpenCV assertion
    written = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert {entry["file_name"] for entry in written} == {"a.jpg", "c.png"}
    assert len(run.drawn) == 2


def test_nan_weights_give_skipped_images_and_valid_json(tiny_model, images, tmp_path) -> None:
    with torch.no_grad():
        tiny_model.class_embed.weight.fill_(float("nan"))
    run = predict_files(_predictor(tiny_model), [images[0], images[3]], tmp_path / "out", draw=False)
    assert run.predictions == [] and len(run.skipped) == 2
    assert all("not finite" in reason for _, reason in run.skipped)
    assert json.loads((tmp_path / "out" / "predictions.json").read_text()) == []


def test_predictions_json_is_written_when_the_run_stops_early(tiny_model, images, tmp_path, monkeypatch) -> None:
    calls = []
    original = Predictor.predict_arrays

    def stop_on_second_batch(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Predictor, "predict_arrays", stop_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        predict_files(_predictor(tiny_model), [images[0], images[3]], tmp_path / "out", draw=False)
    written = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert {entry["file_name"] for entry in written} == {"a.jpg"}


def test_the_same_file_name_in_two_folders_stays_two_names(tiny_model, tmp_path) -> None:
    paths = [_image(tmp_path / "day" / "0001.jpg", seed=1), _image(tmp_path / "night" / "0001.jpg", seed=2)]
    assert unique_file_names(paths) == ["day/0001.jpg", "night/0001.jpg"]
    assert unique_file_names([paths[0]]) == ["0001.jpg"]
    run = predict_files(_predictor(tiny_model), paths, tmp_path / "out", draw=True)
    written = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert {entry["file_name"] for entry in written} == {"day/0001.jpg", "night/0001.jpg"}
    assert len({entry["image_id"] for entry in written}) == 2 and len(set(run.drawn)) == 2


def test_a_float_tiff_in_0_1_is_scaled_not_black(tmp_path) -> None:
    values = np.linspace(0.0, 1.0, 32 * 48, dtype=np.float32).reshape(32, 48)
    path = tmp_path / "float.tif"
    Image.fromarray(values, mode="F").save(path)
    pixels = load_rgb_image(path)
    assert pixels.dtype == np.uint8 and pixels.max() == 255 and pixels.min() == 0


def test_the_explorer_writes_the_good_pages_and_reports_the_bad_ones(tiny_model, images, tmp_path) -> None:
    errors: list[tuple[str, str]] = []
    pages = write_attention_explorer(tiny_model, images, tmp_path / "explorer", min_size=64, max_size=96,
                                     device="cpu", errors=errors)
    assert [page.name for page in pages] == ["a.html", "c.html", "index.html"]
    assert [title for title, _ in errors] == ["thin.png", "notes.jpg"]
    with pytest.raises(Exception):  # without an errors list, the first bad image raises as before
        write_attention_explorer(tiny_model, images, tmp_path / "again", min_size=64, max_size=96, device="cpu")


def test_the_tools_exit_1_and_write_what_they_could(tiny_model, images, tmp_path) -> None:
    from tests.helpers import load_script

    checkpoint = tmp_path / "tiny.pth"
    torch.save(tiny_model.state_dict(), checkpoint)

    def tool(name):
        return load_script(f"tools/{name}.py")

    sizes = ["--min-size", "64", "--max-size", "96", "--device", "cpu"]
    code = tool("predict").main([*map(str, images), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "p"),
                                 "--no-draw", *sizes])
    assert code == 1
    assert {e["file_name"] for e in json.loads((tmp_path / "p" / "predictions.json").read_text())} <= {"a.jpg", "c.png"}
    code = tool("explore").main([*map(str, images), "--checkpoint", str(checkpoint), "--out",
                                           str(tmp_path / "e"), *sizes])
    assert code == 1 and (tmp_path / "e" / "a.html").is_file() and (tmp_path / "e" / "c.html").is_file()


def test_detr_predict_without_annotations_takes_the_classes_from_the_checkpoint_and_skips_bad_images(
    tiny_shapes_root, images, tmp_path, monkeypatch
) -> None:
    from detr.lightning.cli import main
    from tests.helpers import TINY_CLI_MODEL, tiny_fit_args

    monkeypatch.setattr("sys.argv", ["detr"])
    main(tiny_fit_args(tiny_shapes_root, tmp_path / "run", "--trainer.max_steps=1"))
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    config = Path(__file__).resolve().parents[2] / "configs" / "demo_shapes_cpu.yaml"
    output = tmp_path / "predictions.json"
    writer = json.dumps([{"class_path": "detr.lightning.callbacks.PredictionsWriter",
                          "init_args": {"output_path": str(output)}}])
    code = main([
        "predict", "--config", str(config), "--data.root=null", f"--data.predict_images={images[0].parent}",
        "--data.num_workers=0",
        "--data.val_batch_size=2", *TINY_CLI_MODEL, f"--trainer.callbacks={writer}", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'predict'}",
        f"--ckpt_path={checkpoint}",
    ])
    assert code == 1  # two of the four files could not be predicted
    names = {Path(entry["file_name"]).name for entry in json.loads(output.read_text())}
    assert names == {"a.jpg", "c.png"}
    assert {entry["category_id"] for entry in json.loads(output.read_text())} <= {1, 2, 3, 4, 5}
