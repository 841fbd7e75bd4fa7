"""Pixel keypoints of each detection (detr.inference.postprocess_keypoints) equal the rfdetr package's
``PostProcess`` (1.8.0) on the same raw outputs: top-k (query, class) pairs, their class's keypoints in pixels,
the findable score, the precision factors and the trace-fused scores."""

from __future__ import annotations

import pytest
import torch

from detr.inference.postprocess import PostProcess
from detr.inference.postprocess_keypoints import grouppose_keypoints as keypoints_to_pixels
from detr.models.outputs import DetectorOutput
from tests.helpers_rfdetr_package import rfdetr_module

COUNTS = (0, 3, 2)


def _outputs(generator: torch.Generator) -> DetectorOutput:
    keypoints = torch.randn(2, 7, len(COUNTS) * max(COUNTS), 8, generator=generator)
    keypoints[..., :2] = torch.rand(2, 7, len(COUNTS) * max(COUNTS), 2, generator=generator)
    return DetectorOutput(torch.randn(2, 7, 4, generator=generator) * 2,
                          torch.rand(2, 7, 4, generator=generator) * 0.5 + 0.2, keypoints=keypoints,
                          class_head="sigmoid")


@pytest.mark.parametrize("trace_alpha", [0.2, 0.0])
def test_the_keypoints_equal_the_package(trace_alpha):
    package = rfdetr_module("models.postprocess").PostProcess(num_select=10, num_keypoints_per_class=list(COUNTS),
                                                              trace_alpha=trace_alpha)
    outputs = _outputs(torch.Generator().manual_seed(0))
    sizes = torch.tensor([[480, 640], [300, 200]])
    theirs = package({"pred_logits": outputs.logits, "pred_boxes": outputs.boxes,
                      "pred_keypoints": outputs.keypoints}, sizes)
    detections = PostProcess("sigmoid", top_k=10)(outputs, sizes)
    ours = keypoints_to_pixels(outputs.keypoints, detections, sizes, COUNTS, trace_alpha=trace_alpha)
    labels = torch.cat([image["labels"] for image in ours])
    assert {0, 1, 2, 3} <= set(labels.tolist())  # classes with 0, 3 and 2 keypoints, and one beyond the schema
    for mine, package_image in zip(ours, theirs):  # (boxes: the package clips them since 1.9)
        assert torch.equal(mine["labels"], package_image["labels"])
        expected = package_image["scores"]
        if trace_alpha > 0 and not hasattr(rfdetr_module("models.transformer"), "_tracer_absent"):
            # 1.8.0 fused as s · t̄^-α; since 1.11 as sigmoid(log s − α log t̄) (this module's rule): same ranking
            listed = package_image["labels"] < len(COUNTS)
            expected = torch.where(listed, expected / (1 + expected), expected)
        torch.testing.assert_close(mine["scores"], expected)
        torch.testing.assert_close(mine["keypoints"], package_image["keypoints"])
        torch.testing.assert_close(mine["keypoint_precision"], package_image["keypoint_precision_cholesky"],
                                   equal_nan=True)


def test_a_fresh_detection_keypoint_is_in_pixels_of_its_image():
    keypoints = torch.zeros(1, 1, 3, 8)
    keypoints[0, 0, :, :2] = torch.tensor([0.5, 0.25])
    detections = [{"scores": torch.tensor([0.9]), "labels": torch.tensor([0]), "queries": torch.tensor([0])}]
    (result,) = keypoints_to_pixels(keypoints, detections, torch.tensor([[100, 200]]), [3])
    assert result["keypoints"][0].tolist() == [[100.0, 25.0, 0.5]] * 3
    # unit precision: Σ = I, trace 2, so the score is sigmoid(log 0.9 − 0.2 · log 2)
    fused = 0.9 * 2 ** -0.2
    torch.testing.assert_close(result["scores"], torch.tensor([fused / (1 + fused)]))
    with pytest.raises(ValueError, match="target_sizes"):
        keypoints_to_pixels(keypoints, detections, torch.tensor([100, 200]), [3])
