"""The authors' Deformable DETR release layout (fundamentalvision/Deformable-DETR: ``{"model": state_dict}``
with the refinement and two-stage heads registered twice): the file's model is inferred and loads with the
outputs of the model that wrote it."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr, load_checkpoint
from detr.checkpoints import CheckpointError
from tests.helpers import randomise, tiny_config_with

DEFORMABLE = tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, dropout=0.0,
                              num_heads=8, hidden_dim=64)


def _authors_file(model, path):
    """The model's state dict as the authors' code saves it: heads also under transformer.decoder."""
    state = dict(model.state_dict())
    for kind, used in (("bbox_embed", model.box_refine), ("class_embed", model.two_stage)):
        if used:
            state.update({f"transformer.decoder.{key}": value.clone() for key, value in model.state_dict().items()
                          if key.startswith(f"{kind}.")})
    torch.save({"model": state, "epoch": 49}, path)
    return path


@pytest.mark.parametrize("changes", [{}, {"box_refine": True}, {"box_refine": True, "two_stage": True},
                                     {"num_feature_levels": 1}], ids=["plain", "refine", "two_stage", "single_scale"])
def test_an_authors_release_file_loads_as_the_model_that_wrote_it(tmp_path, changes):
    torch.manual_seed(0)
    model = build_detr(DEFORMABLE, num_queries=300 if changes.get("two_stage") else 10, **changes).eval()
    randomise(model, 3)
    loaded = load_checkpoint(_authors_file(model, tmp_path / "r50_deformable_detr-checkpoint.pth"))
    assert loaded.config == model.config.replace(dropout=loaded.config.dropout)  # a training setting
    images = torch.randn(2, 3, 160, 224)  # 747 positions over the 4 levels: enough for 300 two-stage proposals
    mask = torch.zeros(2, 160, 224, dtype=torch.bool)
    mask[1, 120:] = True
    with torch.no_grad():
        assert torch.equal(loaded(images, mask).boxes, model(images, mask).boxes)


def test_decoder_head_copies_that_differ_are_refused(tmp_path):
    model = build_detr(DEFORMABLE, box_refine=True)
    path = _authors_file(model, tmp_path / "edited.pth")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["model"]["transformer.decoder.bbox_embed.0.layers.0.bias"] += 1
    torch.save(checkpoint, path)
    with pytest.raises(CheckpointError, match="differs from bbox_embed.0.layers.0.bias"):
        load_checkpoint(path)
