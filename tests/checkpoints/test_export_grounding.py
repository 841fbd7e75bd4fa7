"""Grounding DINO out of PyTorch with its prompt baked in (``detr-export --prompt``): ONNX Runtime gives the
fixed-prompt model's logits and boxes on real photos within 1e-4, whose class logits are each phrase's best token
logit of the prompted model; the file names the phrases as its classes and the Predictor runs it; a prompted model
without a prompt, and a prompt for a model that reads none, refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detr.inference.fixed_prompt import fix_prompt
from detr.inference.predictor import Predictor
from tests.helpers import REPO, padded_photo_batch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
onnxruntime = pytest.importorskip("onnxruntime")

from tests.helpers_grounding import write_directory  # noqa: E402

PROMPT = "a cat. a remote control."
PHOTO = REPO / "data" / "photos" / "000000039769.png"
SIZE = (160, 240)  # the processor's resize (shortest, longest side)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grounding") / "model"
    write_directory(directory, "gdino", seed=3, image_size=SIZE)
    return directory


@pytest.mark.slow  # minutes: the ONNX exporter on the feature enhancer and the cross-modality decoder
def test_exported_file_gives_the_fixed_prompt_models_logits_and_boxes(directory, tmp_path):
    from detr.checkpoints import load_checkpoint
    from detr.checkpoints.onnx import read_onnx_metadata
    from detr.commands.export import main

    out = tmp_path / "grounding.onnx"
    assert main([str(directory), "--prompt", PROMPT, "--out", str(out)]) == 0
    prompted = load_checkpoint(directory)
    fixed = fix_prompt(prompted, PROMPT)
    images, padding_mask = padded_photo_batch()  # two real photos of different sizes, padded
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits, boxes = session.run(["pred_logits", "pred_boxes"],
                                {"images": images.numpy(), "padding_mask": padding_mask.numpy()})
    text = prompted.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = fixed(images, padding_mask)
        tokens = prompted(images, padding_mask, text["input_ids"].expand(2, -1), text["attention_mask"].expand(2, -1))
    assert logits.shape == (2, prompted.num_queries, 2) and np.isfinite(logits).all()
    torch.testing.assert_close(torch.from_numpy(logits), expected.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(boxes), expected.boxes, atol=1e-4, rtol=1e-4)
    # [CLS] a cat . a remote control . [SEP]: phrase 0 is tokens 1-2, phrase 1 tokens 4-6
    assert torch.equal(expected.logits[..., 0], tokens.logits[..., 1:3].amax(-1))
    assert torch.equal(expected.logits[..., 1], tokens.logits[..., 4:7].amax(-1))
    assert torch.equal(expected.boxes, tokens.boxes)
    metadata = read_onnx_metadata(out)
    assert metadata["category_map"]["names"] == ["a cat", "a remote control"] and metadata["class_head"] == "sigmoid"
    # the Predictor runs the file as a detector of the prompt's phrases
    on_file = Predictor.from_checkpoint(out, device="cpu").predict(PHOTO, threshold=0.0)[0]
    assert len(on_file) == prompted.num_queries and set(on_file.label_names) <= {"a cat", "a remote control"}


def test_a_prompted_model_needs_a_prompt_to_export(directory, tmp_path, capsys):
    from detr.commands.export import main

    with pytest.raises(SystemExit):
        main([str(directory), "--out", str(tmp_path / "grounding.onnx")])
    assert "--prompt" in capsys.readouterr().err
    assert not (tmp_path / "grounding.onnx").exists()


def test_fixing_a_prompt_refuses_a_model_without_one_and_repeated_phrases(directory):
    from detr.checkpoints import load_checkpoint
    from detr.models.build import build_detr
    from tests.helpers import TINY

    with pytest.raises(ValueError, match="reads no prompt"):
        fix_prompt(build_detr(TINY), PROMPT)
    with pytest.raises(ValueError, match="twice"):
        fix_prompt(load_checkpoint(directory), "a cat. a cat.")
