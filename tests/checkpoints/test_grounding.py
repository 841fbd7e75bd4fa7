"""transformers' Grounding DINO and MM-Grounding-DINO directories → this project's model, with transformers'
logits and boxes on a padded batch of two real photos and two prompts of different lengths; its phrase masks and
position encodings equal to transformers'; options it does not build refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from detr.checkpoints import CheckpointError, load_checkpoint
from detr.checkpoints.grounding import load_grounding_tokenizer, read_grounding
from detr.models.grounding.text import box_position_embedding, phrase_attention
from tests.helpers import padded_photo_batch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers_grounding import (  # noqa: E402
    PROMPTS,
    TINY,
    TOLERANCE,
    swin_config,
    vocabulary,
    write_directory,
)

@pytest.fixture(scope="module")
def photo_batch():
    return padded_photo_batch()


@pytest.mark.parametrize("family,options", [("gdino", {}), ("gdino", {"decoder_bbox_embed_share": False}),
                                            ("mm", {}), ("mm", {"decoder_cls_embed_share": False}),
                                            ("gdino", {"backbone_config": "swin"}),
                                            ("mm", {"backbone_config": "swin"})])
def test_transformers_directory_gives_transformers_logits_and_boxes(tmp_path, photo_batch, family, options):
    """Same weights, images, input_ids and attention mask → the same logits (−inf at the same places) and boxes,
    for every decoder layer's heads shared or not, on a ResNet-18 or a Swin Transformer."""
    if options.get("backbone_config") == "swin":
        options = {**options, "backbone_config": swin_config()}
    theirs = write_directory(tmp_path / "model", family, **options)
    ours = load_checkpoint(tmp_path / "model")
    images, padding_mask = photo_batch
    text = load_grounding_tokenizer(tmp_path / "model")(PROMPTS, padding="longest", return_tensors="pt")
    assert text["input_ids"].tolist()[1] == [101, 1034, 1035, 1036, 1029, 102, 0, 0, 0]  # two dog ##s ?
    assert text["input_ids"].shape[1] < TINY["max_text_len"]
    with torch.no_grad():
        expected = theirs(pixel_values=images, pixel_mask=(~padding_mask).long(), input_ids=text["input_ids"],
                          attention_mask=text["attention_mask"], token_type_ids=text["token_type_ids"])
        got = ours(images, padding_mask, text["input_ids"], text["attention_mask"], text["token_type_ids"])
    assert got.logits.shape == expected.logits.shape == (2, TINY["num_queries"], TINY["max_text_len"])
    assert torch.equal(got.logits.isinf(), expected.logits.isinf())
    torch.testing.assert_close(got.logits, expected.logits, atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(got.boxes, expected.pred_boxes, atol=TOLERANCE, rtol=TOLERANCE)
    assert expected.logits.isfinite().any(-1).all() and expected.logits[expected.logits.isfinite()].std() > 0.1


def test_phrase_attention_and_positions_are_transformers():
    from transformers.models.grounding_dino.modeling_grounding_dino import (
        SPECIAL_TOKENS,
        generate_masks_with_special_tokens_and_transfer_map,
    )

    input_ids = torch.tensor([[101, 1030, 1031, 1012, 1030, 1032, 1033, 1012, 102, 0, 0],
                              [101, 1034, 1035, 1036, 1029, 1037, 102, 0, 0, 0, 0],
                              [101, 1030, 1012, 1012, 1031, 1032, 1033, 1034, 1035, 1036, 102]])
    allowed, positions = phrase_attention(input_ids)
    expected_allowed, expected_positions = generate_masks_with_special_tokens_and_transfer_map(
        input_ids, torch.tensor(SPECIAL_TOKENS))
    assert torch.equal(allowed, expected_allowed)
    assert torch.equal(positions, expected_positions)


def test_box_position_embedding_is_transformers():
    from transformers.models.grounding_dino.modeling_grounding_dino import encode_sinusoidal_position_embedding

    boxes = torch.rand(2, 5, 4)
    torch.testing.assert_close(box_position_embedding(boxes, 32), encode_sinusoidal_position_embedding(boxes, 16))


def test_options_without_counterpart_are_refused_by_name(tmp_path):
    write_directory(tmp_path / "model", "gdino")
    config_path = tmp_path / "model" / "config.json"
    config = json.loads(config_path.read_text())
    for key, value, named in (("two_stage", False, "two_stage"), ("activation_function", "gelu", "activation"),
                              ("model_type", "deformable_detr", "model_type")):
        config_path.write_text(json.dumps({**config, key: value}))
        with pytest.raises(CheckpointError, match=named):
            read_grounding(tmp_path / "model")
    config_path.write_text(json.dumps({**config, "backbone_config": {"model_type": "convnext"}}))
    with pytest.raises(CheckpointError, match="convnext"):
        read_grounding(tmp_path / "model")


def test_phrases_boxes_and_scores_are_the_processors_on_a_photo(tmp_path):
    """The processor's inputs for a real photo and prompt → our model + :func:`grounded_detections` give what
    transformers' model + ``post_process_grounded_object_detection`` give (boxes in pixels, scores, phrases)."""
    from PIL import Image

    from detr.inference.grounding import grounded_detections
    from tests.helpers import REPO

    theirs = write_directory(tmp_path / "model", "gdino", seed=3)
    ours = load_checkpoint(tmp_path / "model")
    processor = transformers.GroundingDinoProcessor.from_pretrained(tmp_path / "model")
    processor.image_processor.size = {"shortest_edge": 160, "longest_edge": 240}
    photo = Image.open(REPO / "data" / "photos" / "000000039769.png").convert("RGB")
    inputs = processor(images=photo, text="a cat. a remote control.", return_tensors="pt")
    with torch.no_grad():
        expected_outputs = theirs(**inputs)
        got = ours(inputs["pixel_values"], ~inputs["pixel_mask"].bool(), inputs["input_ids"],
                   inputs["attention_mask"], inputs["token_type_ids"])
    scores = expected_outputs.logits.sigmoid()[0]  # [Q, T]
    best = scores.max(-1).values.sort().values
    threshold = (best[-5] + best[-6]).item() / 2  # five boxes kept
    kept = scores[scores.max(-1).values > threshold]
    tokens = kept[kept > 0].sort().values
    middle = tokens[len(tokens) // 4: 3 * len(tokens) // 4]
    gap = (middle[1:] - middle[:-1]).argmax()  # the widest gap among the middle half: no score near it
    text_threshold = (middle[gap] + middle[gap + 1]).item() / 2
    size = (photo.height, photo.width)
    expected = processor.post_process_grounded_object_detection(
        expected_outputs, inputs["input_ids"], threshold=threshold, text_threshold=text_threshold,
        target_sizes=[size])[0]
    result = grounded_detections(got.logits, got.boxes, inputs["input_ids"], processor.tokenizer.decode,
                                 threshold=threshold, text_threshold=text_threshold, image_sizes=[size])[0]
    assert len(result.phrases) == 5 and result.phrases == expected["text_labels"]
    assert len(set(result.phrases)) > 1, result.phrases
    torch.testing.assert_close(result.scores, expected["scores"], atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(result.boxes, expected["boxes"], atol=1e-2, rtol=TOLERANCE)  # pixels


def test_phrases_of_chosen_token_scores_are_the_processors():
    """Logits that pick different words of the prompt per query → the processor's phrases, scores and boxes."""
    from types import SimpleNamespace

    from detr.inference.grounding import grounded_detections

    tokenizer = transformers.BertTokenizerFast(vocab=vocabulary(), do_lower_case=True)
    processor = transformers.GroundingDinoProcessor(transformers.GroundingDinoImageProcessor(), tokenizer)
    input_ids = tokenizer(["a cat. a remote control.", "two dogs?"], padding="longest",
                          return_tensors="pt")["input_ids"]
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 16, generator=generator) * 3
    logits[:, :, input_ids.shape[1]:] = float("-inf")
    logits[1, :, 6:] = float("-inf")  # the second prompt's padding
    boxes = torch.rand(2, 6, 4, generator=generator) * 0.5 + 0.25
    expected = processor.post_process_grounded_object_detection(
        SimpleNamespace(logits=logits, pred_boxes=boxes), input_ids, threshold=0.6, text_threshold=0.5,
        target_sizes=[(480, 640), (300, 200)])
    got = grounded_detections(logits, boxes, input_ids, tokenizer.decode, threshold=0.6, text_threshold=0.5,
                              image_sizes=[(480, 640), (300, 200)])
    for result, reference in zip(got, expected):
        assert result.phrases == reference["text_labels"]
        torch.testing.assert_close(result.scores, reference["scores"])
        torch.testing.assert_close(result.boxes, reference["boxes"])
    assert len({phrase for result in got for phrase in result.phrases}) > 3


def test_thresholds_outside_scores_are_refused():
    from detr.inference.grounding import grounded_detections

    with pytest.raises(ValueError, match="text_threshold"):
        grounded_detections(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 3, dtype=torch.long), str,
                            text_threshold=1.5)


def test_load_checkpoint_reads_the_directory_as_every_family_s(tmp_path):
    """A Grounding DINO directory is read through the transformers readers' table, into the family's config (its
    record found by the config), and overrides are that config's fields, as for every family."""
    import detr
    from detr.checkpoints import HUGGINGFACE_READERS, read_checkpoint
    from detr.checkpoints.grounding import read_huggingface_grounding
    from detr.models.family import family_of
    from detr.models.grounding.config import GroundingConfig
    from detr.models.grounding.model import GroundingDINO

    write_directory(tmp_path / "model", "mm")
    assert HUGGINGFACE_READERS["grounding-dino"] is HUGGINGFACE_READERS["mm-grounding-dino"] \
        is read_huggingface_grounding
    contents = read_checkpoint(tmp_path / "model")
    assert isinstance(contents.config, GroundingConfig) and family_of(contents.config).name == "grounding"
    model = detr.load_checkpoint(tmp_path / "model")
    assert isinstance(model, GroundingDINO) and model.prompted and model.tokenizer is not None
    assert model.config.contrastive_head == "scaled_bias" and model.config == contents.config
    assert detr.load_checkpoint(tmp_path / "model", aux_loss=False).aux_loss is False
    with pytest.raises(CheckpointError, match="does not fit"):
        detr.load_checkpoint(tmp_path / "model", num_queries=5)
    with pytest.raises(ValueError, match="unknown model option.*box_refine"):
        detr.load_checkpoint(tmp_path / "model", box_refine=True)


def test_writing_it_back_as_a_transformers_directory_is_refused_by_name(tmp_path):
    """As a family, Grounding DINO reaches save_huggingface (detr-convert), which has no writer for it: a
    CheckpointError naming the family, not a KeyError."""
    import detr
    from detr.checkpoints import save_huggingface

    write_directory(tmp_path / "model", "gdino")
    with pytest.raises(CheckpointError, match="'grounding' family"):
        save_huggingface(detr.load_checkpoint(tmp_path / "model"), tmp_path / "out")
