"""The Grounding DINO family on its own: importing it needs no transformers (only building its BERT does), a
prompt's padding changes nothing, and the config refuses sizes its blocks cannot take."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers import TINY_GROUNDING as TINY


def test_importing_the_family_does_not_import_transformers():
    code = ("import sys, detr.models.grounding.build, detr.checkpoints.grounding, detr.inference.grounding; "
            "print('transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_prompts_padding_changes_nothing():
    pytest.importorskip("transformers")
    from detr.models.grounding.build import build_grounding
    from tests.helpers import randomise

    torch.manual_seed(0)
    model = build_grounding(TINY).eval()
    randomise(model, 1)
    images = torch.randn(2, 3, 64, 80)
    padding_mask = torch.zeros(2, 64, 80, dtype=torch.bool)
    short = [101, 1030, 1031, 1012, 102]  # [CLS] a cat . [SEP]
    long = [101, 1030, 1031, 1012, 1032, 1033, 1029, 102]
    input_ids = torch.tensor([short + [0] * 3, long])
    attention_mask = (input_ids != 0).long()
    with torch.no_grad():
        batched = model(images, padding_mask, input_ids, attention_mask)
        alone = model(images[:1], padding_mask[:1], torch.tensor([short]))
    torch.testing.assert_close(batched.logits[:1], alone.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched.boxes[:1], alone.boxes, atol=1e-5, rtol=1e-5)
    assert batched.logits[0, :, 5:].isinf().all() and batched.logits[1, :, :8].isfinite().all()


@pytest.mark.parametrize("changes,named", [(dict(hidden_dim=48), "hidden_dim"), (dict(encoder_heads=3), "heads"),
                                           (dict(contrastive_head="cosine"), "contrastive_head")])
def test_config_refuses_what_the_blocks_cannot_take(changes, named):
    with pytest.raises(ValueError, match=named):
        TINY.replace(**changes)
