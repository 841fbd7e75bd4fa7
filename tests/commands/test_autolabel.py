"""detr-autolabel: a prompt over a folder of real photos with a tiny random Grounding DINO → a COCO data set whose
categories are the prompt's phrases, that detr-check-data accepts and CocoDetection reads as it is; its mistakes
as one error line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from detr.commands.autolabel import main
from tests.helpers import REPO

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


PHOTOS = ["000000039769.png", "chelsea.png", "coffee.png"]
PROMPT = "a cat. a remote control."


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in PHOTOS:
        shutil.copy(REPO / "data" / "photos" / name, folder / name)
    return folder


def _autolabel(grounding_directory, images, out, *extra):
    return main([str(images), "--prompt", PROMPT, "--checkpoint", str(grounding_directory), "--out", str(out),
                 "--device", "cpu", "--threshold", "0.0", *extra])


def test_autolabel_writes_a_coco_data_set_of_the_prompts_phrases(grounding_directory, images, tmp_path, capsys):
    from detr.inference.predictor import Predictor

    out = tmp_path / "instances.json"
    assert _autolabel(grounding_directory, images, out) == 0
    data = json.loads(out.read_text())
    assert data["categories"] == [{"id": 1, "name": "a cat"}, {"id": 2, "name": "a remote control"}]
    assert [image["file_name"] for image in data["images"]] == PHOTOS
    predicted = Predictor.from_checkpoint(grounding_directory, device="cpu").predict(
        [images / name for name in PHOTOS], prompt=PROMPT, threshold=0.0)
    for image, prediction in zip(data["images"], predicted):
        assert (image["height"], image["width"]) == prediction.image_size
        mine = [a for a in data["annotations"] if a["image_id"] == image["id"]]
        assert len(mine) == len(prediction) > 0  # every query kept: threshold 0
        torch.testing.assert_close(torch.tensor([a["score"] for a in mine]), prediction.scores, atol=1e-4, rtol=0)
        assert [a["category_id"] for a in mine] == (prediction.labels + 1).tolist()
        for annotation in mine:  # clipped to the image
            x, y, w, h = annotation["bbox"]
            assert 0 <= x and 0 <= y and w > 0 and h > 0
            assert x + w <= image["width"] + 0.01 and y + h <= image["height"] + 0.01
            assert annotation["area"] == pytest.approx(w * h, abs=0.05) and annotation["iscrowd"] == 0
    assert data["info"]["prompt"] == PROMPT
    assert f"-> {out}" in capsys.readouterr().out


def test_autolabel_output_passes_detr_check_data_and_reads_as_coco_detection(grounding_directory, images, tmp_path,
                                                                              capsys):
    from detr.commands.check_data import main as check_data
    from detr.data.coco import CocoDetection

    out = tmp_path / "instances.json"
    assert _autolabel(grounding_directory, images, out) == 0
    capsys.readouterr()
    assert check_data([str(images), str(out), "--min-images-per-class", "0"]) == 0
    assert "OK: nothing that would hurt training" in capsys.readouterr().out
    dataset = CocoDetection(images, out)
    assert len(dataset) == len(PHOTOS)
    assert list(dataset.category_map.names) == ["a cat", "a remote control"]
    _, target = dataset[0]
    assert len(target["labels"]) > 0 and set(target["labels"].tolist()) <= {0, 1}


def test_autolabel_keeps_an_existing_json_unless_overwrite(grounding_directory, images, tmp_path, capsys):
    out = tmp_path / "instances.json"
    out.write_text("reviewed")
    with pytest.raises(SystemExit):
        _autolabel(grounding_directory, images, out)
    assert "--overwrite" in capsys.readouterr().err and out.read_text() == "reviewed"
    assert _autolabel(grounding_directory, images, out, "--overwrite", "--threshold", "1.0") == 0
    data = json.loads(out.read_text())
    assert len(data["images"]) == len(PHOTOS) and data["annotations"] == []


def test_an_unreadable_image_is_left_out_and_reported(grounding_directory, images, tmp_path, capsys):
    (images / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "instances.json"
    assert _autolabel(grounding_directory, images, out, "--batch-size", "2") == 1
    assert [image["file_name"] for image in json.loads(out.read_text())["images"]] == PHOTOS
    assert "broken.png" in capsys.readouterr().err


@pytest.mark.parametrize("argv,named", [
    (["--prompt", "a cat.. a dog."], "empty phrase"),
    (["--prompt", "a cat. a cat."], "twice"),
])
def test_a_bad_prompt_is_one_error_line(grounding_directory, images, tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit):
        main([str(images), "--checkpoint", str(grounding_directory), "--out", str(tmp_path / "x.json"), *argv])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and named in error
    assert not (tmp_path / "x.json").exists()


def test_a_checkpoint_that_reads_no_prompt_is_one_error_line(images, tmp_path, capsys):
    from detr.categories import CategoryMap
    from detr.models.build import build_detr
    from tests.helpers import TINY, save_project_checkpoint

    names = [f"class{index}" for index in range(TINY.num_classes)]
    checkpoint = save_project_checkpoint(build_detr(TINY), tmp_path / "tiny.ckpt", (64, 96),
                                         CategoryMap.from_coco_categories(
                                             [{"id": i, "name": n} for i, n in enumerate(names)], contiguous=True))
    with pytest.raises(SystemExit):
        main([str(images), "--prompt", PROMPT, "--checkpoint", str(checkpoint), "--out", str(tmp_path / "x.json"),
              "--device", "cpu"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and "reads no prompt" in error


def test_a_missing_checkpoint_is_one_error_line(images, tmp_path, capsys):
    assert main([str(images), "--prompt", PROMPT, "--checkpoint", str(tmp_path / "none.pth"),
                 "--out", str(tmp_path / "x.json")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error:") and len(error.splitlines()) == 1


def test_autolabel_output_trains_a_shapes_model(grounding_directory, tmp_path_factory, tmp_path, monkeypatch):
    """The loop of the README's "Open vocabulary": label the shapes set's train and val images with a prompt,
    then `detr fit` a tiny DETR on the two jsons as they are (a few steps, validation included)."""
    from detr.lightning.cli import main as detr
    from tests.helpers import tiny_fit_args, write_tiny_shapes

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    shapes = write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2)
    jsons = {}
    for split in ("train", "val"):
        jsons[split] = tmp_path / f"{split}.json"
        assert main([str(shapes / f"{split}2017"), "--prompt", "circle. square.", "--checkpoint",
                     str(grounding_directory), "--out", str(jsons[split]), "--device", "cpu", "--threshold",
                     "0.0"]) == 0
    # the jsons replace the root's; 12 queries of the grounding model kept per image: as many queries
    args = tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=2", "--model.detr.num_queries=12")
    assert detr([*args, f"--data.train_images={shapes / 'train2017'}", f"--data.train_annotations={jsons['train']}",
                 f"--data.val_images={shapes / 'val2017'}", f"--data.val_annotations={jsons['val']}"]) == 0
    assert list((tmp_path / "run").rglob("*.ckpt"))
