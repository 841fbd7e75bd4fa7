"""The Predictor with a prompt, on a transformers Grounding DINO directory: the boxes, scores and phrases of
transformers' processor + model + ``post_process_grounded_object_detection`` on a real photo; labels = the
prompt's phrases; a prompt where none is read (and none where one is) refused by name."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from detr.inference.grounding import prompt_text
from detr.inference.predictor import Predictor
from tests.helpers import REPO

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers_grounding import write_directory  # noqa: E402

PHOTO = REPO / "data" / "photos" / "000000039769.png"
SIZE = (160, 240)  # the processor's resize (shortest, longest side): a quick test


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grounding") / "model"
    write_directory(directory, "gdino", seed=3, image_size=SIZE)
    return directory


@pytest.fixture(scope="module")
def mm_directory(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mm_grounding") / "model"
    write_directory(directory, "mm", seed=4, image_size=SIZE)
    return directory


@pytest.mark.parametrize("family", ["gdino", "mm"])
def test_prompt_gives_the_processors_boxes_scores_and_phrases(request, family):
    directory = request.getfixturevalue("directory" if family == "gdino" else "mm_directory")
    model_class = (transformers.GroundingDinoForObjectDetection if family == "gdino"
                   else transformers.MMGroundingDinoForObjectDetection)
    theirs = model_class.from_pretrained(directory).eval()
    processor = transformers.GroundingDinoProcessor.from_pretrained(directory)
    photo = Image.open(PHOTO).convert("RGB")
    inputs = processor(images=photo, text="a cat. a remote control.", return_tensors="pt")
    with torch.no_grad():
        outputs = theirs(**inputs)
    best = outputs.logits.sigmoid()[0].max(-1).values.sort().values
    threshold = (best[-4] + best[-5]).item() / 2  # four boxes
    scores = outputs.logits.sigmoid()[0]
    tokens = scores[scores > 0].sort().values
    middle = tokens[len(tokens) // 4: 3 * len(tokens) // 4]
    gap = (middle[1:] - middle[:-1]).argmax()  # no word's score near the text threshold
    text_threshold = (middle[gap] + middle[gap + 1]).item() / 2
    expected = processor.post_process_grounded_object_detection(
        outputs, inputs["input_ids"], threshold=threshold, text_threshold=text_threshold,
        target_sizes=[(photo.height, photo.width)])[0]

    predictor = Predictor.from_checkpoint(directory, device="cpu")
    assert predictor.min_size == SIZE[0] and predictor.max_size == SIZE[1]
    prediction = predictor.predict(PHOTO, prompt="a cat. a remote control.", threshold=threshold,
                                   text_threshold=text_threshold)[0]
    assert len(prediction) == 4
    assert prediction.label_names == expected["text_labels"]
    torch.testing.assert_close(prediction.scores, expected["scores"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prediction.boxes, expected["boxes"], atol=0.05, rtol=1e-4)  # pixels
    assert set(prediction.labels.tolist()) <= {0, 1}  # "a cat" or "a remote control"


def test_phrase_list_is_the_same_prompt(directory):
    predictor = Predictor.from_checkpoint(directory, device="cpu")
    assert prompt_text(["A cat", "a remote control"]) == prompt_text("a cat. a remote control")
    first = predictor.predict(PHOTO, prompt=["a cat", "a remote control"], threshold=0.0)[0]
    second = predictor.predict(PHOTO, prompt="a cat. a remote control.", threshold=0.0)[0]
    assert first.label_names == second.label_names and torch.equal(first.boxes, second.boxes)


def test_a_prompted_model_needs_a_prompt_and_others_refuse_one(directory):
    predictor = Predictor.from_checkpoint(directory, device="cpu")
    with pytest.raises(ValueError, match="prompt="):
        predictor.predict(PHOTO)
    with pytest.raises(ValueError, match="empty"):
        predictor.predict(PHOTO, prompt=" ")
    with pytest.raises(ValueError, match="text_threshold"):
        predictor.predict(PHOTO, prompt="a cat.", text_threshold=2.0)


def test_detr_predict_with_a_prompt_writes_phrases(directory, tmp_path, capsys):
    import json

    from detr.commands.predict import main

    out = tmp_path / "out"
    assert main([str(PHOTO), "--checkpoint", str(directory), "--prompt", "a cat. a remote control.",
                 "--threshold", "0.0", "--text-threshold", "0.5", "--device", "cpu", "--out", str(out)]) == 0
    results = json.loads((out / "predictions.json").read_text())
    predicted = Predictor.from_checkpoint(directory, device="cpu").predict(
        PHOTO, prompt="a cat. a remote control.", threshold=0.0, text_threshold=0.5)[0]
    assert len(results) == len(predicted) > 0
    assert [result["category_id"] for result in results] == predicted.labels.tolist()
    assert (out / f"{PHOTO.stem}.jpg").is_file()
    assert "threshold 0 (given)" in capsys.readouterr().out


def test_detr_predict_without_the_prompt_a_model_needs_is_one_error_line(directory, tmp_path, capsys):
    from detr.commands.predict import main

    with pytest.raises(SystemExit):
        main([str(PHOTO), "--checkpoint", str(directory), "--device", "cpu", "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("detr-predict: error:") or "error:" in error
    assert "--prompt" in error


def test_a_model_without_prompts_refuses_one():
    from detr.models.build import build_detr
    from tests.helpers import TINY

    predictor = Predictor(build_detr(TINY), device="cpu")
    with pytest.raises(ValueError, match="reads no prompt"):
        predictor.predict(PHOTO, prompt="a cat.")
