"""The grounding set loss (Grounding DINO: targets named by the prompt's phrases): equal to transformers'
``GroundingDinoForObjectDetection(..., labels=...)`` loss on the same tiny model, photos and targets (every decoder
layer's terms and the encoder's); phrase token maps equal to transformers' label maps; a label without a phrase
refused."""

from __future__ import annotations

import pytest
import torch

from detr.loss.grounding import build_grounding_criterion, phrase_token_maps, with_token_maps
from detr.models.outputs import LayerOutput
from tests.helpers import padded_photo_batch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers_grounding import TINY, write_directory  # noqa: E402

PROMPT = "a cat. a remote control. two dogs."
#: per image: labels (the prompt's phrases) and normalised cxcywh boxes
TARGETS = [([0, 1, 0], [[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2], [0.5, 0.5, 0.8, 0.7]]),
           ([2, 1], [[0.4, 0.3, 0.3, 0.4], [0.6, 0.7, 0.2, 0.2]])]


def _targets(labels_and_boxes, key="labels"):
    return [{key: torch.tensor(labels), "boxes": torch.tensor(boxes)} for labels, boxes in labels_and_boxes]


@pytest.mark.parametrize("family", ["gdino", "mm"])
def test_loss_equals_transformers(tmp_path, family):
    """Same weights, photos, prompt and targets → transformers' loss_dict (the last layer's, every earlier layer's
    ``_i``, cardinality_error) within 1e-5; its encoder terms ``_enc`` from our criterion on transformers' own
    encoder outputs (our model scores its selected proposals instead: the authors', see docs); and its total."""
    from detr.checkpoints import load_checkpoint as load_grounding
    from detr.checkpoints.grounding import load_grounding_tokenizer

    theirs = write_directory(tmp_path / "model", family, auxiliary_loss=True)
    ours = load_grounding(tmp_path / "model")
    text = load_grounding_tokenizer(tmp_path / "model")([PROMPT, PROMPT], return_tensors="pt")
    images, padding_mask = padded_photo_batch()
    expected = theirs(pixel_values=images, pixel_mask=(~padding_mask).long(), input_ids=text["input_ids"],
                      attention_mask=text["attention_mask"], token_type_ids=text["token_type_ids"],
                      labels=_targets(TARGETS, key="class_labels"))
    outputs = ours(images, padding_mask, text["input_ids"], text["attention_mask"], text["token_type_ids"])
    targets = with_token_maps(_targets(TARGETS), phrase_token_maps(text["input_ids"][0], TINY["max_text_len"]))
    criterion = build_grounding_criterion(ours.config)
    got = criterion(outputs, targets)
    encoder = criterion.layer_losses(LayerOutput(expected.encoder_logits, expected.encoder_pred_boxes), targets,
                                     torch.tensor(5.0))
    got.update({f"{name}_enc": value for name, value in encoder.items() if name != "class_error"})
    names = set(expected.loss_dict)
    assert {"loss_ce_0", "loss_bbox_enc", "cardinality_error"} <= names
    assert names <= set(got)
    for name in sorted(names):
        torch.testing.assert_close(got[name], expected.loss_dict[name].reshape(got[name].shape), atol=1e-5, rtol=1e-5,
                                   msg=name)
    total = sum(criterion.weight_dict[name] * got[name] for name in names if name in criterion.weight_dict)
    torch.testing.assert_close(total, expected.loss, atol=1e-5, rtol=1e-5)
    assert expected.loss_dict["loss_ce"] > 0 and got["loss_ce"].requires_grad


def test_phrase_token_maps_are_transformers_label_maps():
    from transformers.models.grounding_dino.modeling_grounding_dino import build_label_maps

    input_ids = torch.tensor([101, 1030, 1031, 1012, 1030, 1032, 1033, 1012, 1034, 1035, 1036, 1029, 102, 0, 0])
    expected = build_label_maps(torch.zeros(1, 3, 20), input_ids[None])[0]
    assert torch.equal(phrase_token_maps(input_ids, 20), expected.float())
    assert phrase_token_maps(input_ids, 20).sum(1).tolist() == [2.0, 3.0, 3.0]


def test_a_prompt_longer_than_the_model_reads_or_a_label_without_phrase_is_refused():
    with pytest.raises(ValueError, match="max_text_len"):
        phrase_token_maps(torch.tensor([101, 1030, 1012, 102]), 3)
    maps = phrase_token_maps(torch.tensor([101, 1030, 1012, 1031, 1012, 102]), 8)
    with pytest.raises(ValueError, match="2 phrases"):
        with_token_maps(_targets([([0, 2], [[0.5, 0.5, 0.2, 0.2]] * 2)]), maps)


def test_an_image_without_targets_has_only_negative_tokens():
    from detr.models.grounding.config import GroundingConfig
    from tests.helpers import model_output

    criterion = build_grounding_criterion(GroundingConfig(num_classes=8, num_decoder_layers=1), aux_loss=False)
    logits = torch.randn(1, 4, 8, requires_grad=True)
    prompt_logits = logits.masked_fill(torch.arange(8) >= 5, float("-inf"))  # a prompt of 5 tokens
    maps = phrase_token_maps(torch.tensor([101, 1030, 1012, 1031, 102]), 8)
    targets = with_token_maps([{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}], maps)
    losses = criterion(model_output(prompt_logits, proposals=LayerOutput(prompt_logits, torch.rand(1, 4, 4))), targets)
    assert torch.isfinite(losses["loss_ce"]) and losses["loss_ce"] > 0 and losses["loss_bbox"] == 0
    losses["loss_ce"].backward()
    assert logits.grad[..., 5:].eq(0).all() and logits.grad[..., :5].ne(0).all()
