"""A GroundingDINO written as a transformers directory: transformers reads every weight (none missing or left over)
and gives our logits and boxes; our loader reads it back exactly; a source without config.json refused."""

from __future__ import annotations

import pytest
import torch

from detr.checkpoints.formats import ExportError
from tests.helpers import padded_photo_batch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers_grounding import PROMPTS, TOLERANCE, write_directory  # noqa: E402


@pytest.mark.parametrize("family,options", [("gdino", {}), ("mm", {}), ("gdino", {"decoder_bbox_embed_share": False})])
def test_written_directory_reads_back_in_transformers_and_here(tmp_path, family, options):
    from detr.checkpoints import load_checkpoint as load_grounding
    from detr.checkpoints.grounding import load_grounding_tokenizer
    from detr.checkpoints.grounding_writer import write_grounding_directory

    write_directory(tmp_path / "source", family, **options)
    model = load_grounding(tmp_path / "source")
    generator = torch.Generator().manual_seed(0)  # the same changes whatever ran before in this process: a
    with torch.no_grad():  # near tie among the two-stage proposals would put one query in another's slot
        for parameter in model.parameters():  # a fine-tune's changes: every weight moves
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.01)
    write_grounding_directory(model, tmp_path / "tuned", like=tmp_path / "source", phrases=["a cat", "two dogs"])
    model_class = (transformers.MMGroundingDinoForObjectDetection if family == "mm"
                   else transformers.GroundingDinoForObjectDetection)
    theirs, info = model_class.from_pretrained(tmp_path / "tuned", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.config.id2label == {0: "a cat", 1: "two dogs"}
    again = load_grounding(tmp_path / "tuned")
    images, padding_mask = padded_photo_batch()
    text = load_grounding_tokenizer(tmp_path / "tuned")(PROMPTS, padding="longest", return_tensors="pt")
    with torch.no_grad():
        ours = model(images, padding_mask, text["input_ids"], text["attention_mask"])
        read = again(images, padding_mask, text["input_ids"], text["attention_mask"])
        expected = theirs.eval()(pixel_values=images, pixel_mask=(~padding_mask).long(), **text)
    assert torch.equal(read.logits, ours.logits) and torch.equal(read.boxes, ours.boxes)
    torch.testing.assert_close(ours.logits, expected.logits, atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(ours.boxes, expected.pred_boxes, atol=TOLERANCE, rtol=TOLERANCE)


def test_a_source_without_config_is_refused(tmp_path):
    from detr.checkpoints import load_checkpoint as load_grounding
    from detr.checkpoints.grounding_writer import write_grounding_directory

    write_directory(tmp_path / "source", "gdino")
    with pytest.raises(ExportError, match="config.json"):
        write_grounding_directory(load_grounding(tmp_path / "source"), tmp_path / "out", like=tmp_path)
