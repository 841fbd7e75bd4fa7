"""Post-processing: scores exclude no-object, boxes scale to the original (h, w)."""

from __future__ import annotations

import pytest
import torch

from detr import PostProcess
from tests.helpers import model_output


def test_scaling_and_scores():
    logits = torch.tensor([[[0.0, 3.0, 5.0], [2.0, 0.0, -1.0]]])  # query 0: no-object is max; label 1 still wins
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.25, 0.75, 0.5, 0.5]]])
    result = PostProcess()(model_output(logits=logits, boxes=boxes), torch.tensor([[200, 400]]))[0]
    prob = logits[0].softmax(-1)
    torch.testing.assert_close(result["scores"], torch.stack([prob[0, 1], prob[1, 0]]))
    assert result["labels"].tolist() == [1, 0]
    torch.testing.assert_close(result["boxes"], torch.tensor([[100.0, 50.0, 300.0, 150.0], [0.0, 100.0, 200.0, 200.0]]))


def test_keeps_all_queries_per_image():
    outputs = model_output(logits=torch.randn(3, 7, 4), boxes=torch.rand(3, 7, 4))
    results = PostProcess()(outputs, torch.tensor([[10, 20], [30, 40], [50, 60]]))
    assert len(results) == 3 and all(r["boxes"].shape == (7, 4) for r in results)
    assert results[2]["boxes"][:, 0::2].max() <= 60 * 1.5  # x scaled by width


def test_boxes_are_the_authors_unclipped_and_clipped_on_request():
    """PostProcess() equals the authors' PostProcess (models/detr.py: no clipping; their 42.0 box AP was
    measured so); clip=True, what predictions files and drawings get, ends a box at the image's edges."""
    boxes = torch.tensor([[[0.05, 0.1, 0.4, 0.6], [0.9, 0.95, 0.5, 0.3], [0.5, 0.5, 0.2, 0.2]]])
    outputs = model_output(logits=torch.zeros(1, 3, 3), boxes=boxes)
    authors = boxes_to_authors_pixels(boxes, torch.tensor([[100, 200]]))
    torch.testing.assert_close(PostProcess()(outputs, torch.tensor([[100, 200]]))[0]["boxes"], authors[0])
    assert float(authors.min()) < 0  # a corner outside the image, as the authors' code gives it
    result = PostProcess(clip=True)(outputs, torch.tensor([[100, 200]]))[0]
    torch.testing.assert_close(result["boxes"], torch.tensor([[0.0, 0.0, 50.0, 40.0], [130.0, 80.0, 200.0, 100.0],
                                                              [80.0, 40.0, 120.0, 60.0]]))


def boxes_to_authors_pixels(boxes: torch.Tensor, target_sizes: torch.Tensor) -> torch.Tensor:
    """The authors' PostProcess box lines (facebookresearch/detr models/detr.py): box_cxcywh_to_xyxy, then
    ``img_h, img_w = target_sizes.unbind(1)``, ``scale_fct = stack([img_w, img_h, img_w, img_h], dim=1)``,
    ``boxes * scale_fct[:, None, :]``."""
    x_c, y_c, w, h = boxes.unbind(-1)
    xyxy = torch.stack([(x_c - 0.5 * w), (y_c - 0.5 * h), (x_c + 0.5 * w), (y_c + 0.5 * h)], dim=-1)
    img_h, img_w = target_sizes.unbind(1)
    scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
    return xyxy * scale_fct[:, None, :]


def test_the_default_reads_outputs_with_the_head_that_made_them():
    """A sigmoid-head model's outputs (the demo's, Deformable DETR's) were scored by a softmax whose last class
    was dropped as "no object" when PostProcess() was built without class_head; now the outputs say."""
    logits = torch.tensor([[[-4.0, 2.0, -1.0], [3.0, -2.0, -3.0]]])  # 3 real classes, no "no object" column
    outputs = model_output(logits=logits, class_head="sigmoid")
    result = PostProcess()(outputs, torch.tensor([[100, 100]]))[0]
    torch.testing.assert_close(result["scores"], torch.tensor([2.0, 3.0]).sigmoid())
    assert result["labels"].tolist() == [1, 0]
    assert PostProcess(class_head="sigmoid")(outputs, torch.tensor([[100, 100]]))[0]["labels"].tolist() == [1, 0]
    with pytest.raises(ValueError, match="class_head='sigmoid'"):
        PostProcess(class_head="softmax")(outputs, torch.tensor([[100, 100]]))


def test_every_detector_states_its_head_in_its_outputs(tiny_config):
    from detr import build_detr

    for config in (tiny_config, tiny_config.replace(class_head="sigmoid")):
        model = build_detr(config).eval()
        with torch.no_grad():
            outputs = model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool))
        assert outputs.class_head == config.class_head


def test_top_k_takes_the_best_query_class_pairs_and_names_their_queries():
    """The real-time DETRs' post-processing: the k best (query, class) pairs by sigmoid score, best first; a
    query confident in two classes is detected twice, one with no confident class not at all."""
    logits = torch.tensor([[[4.0, 3.0, -5.0], [-5.0, -5.0, -4.0], [-1.0, 2.0, -5.0]]])  # 3 queries x 3 classes
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1], [0.25, 0.75, 0.5, 0.5]]])
    outputs = model_output(logits=logits, boxes=boxes)
    result = PostProcess("sigmoid", top_k=3)(outputs, torch.tensor([[100, 200]]))[0]
    assert result["queries"].tolist() == [0, 0, 2] and result["labels"].tolist() == [0, 1, 1]
    torch.testing.assert_close(result["scores"], torch.tensor([4.0, 3.0, 2.0]).sigmoid())
    torch.testing.assert_close(result["boxes"][2], torch.tensor([0.0, 50.0, 100.0, 100.0]))
    per_query = PostProcess("sigmoid")(outputs, torch.tensor([[100, 200]]))[0]
    assert per_query["queries"].tolist() == [0, 1, 2] and per_query["labels"].tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match="sigmoid"):
        PostProcess("softmax", top_k=3)
