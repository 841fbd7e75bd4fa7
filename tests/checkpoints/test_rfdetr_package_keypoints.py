"""The rfdetr package's keypoint model (``RFDETRKeypointPreview``, GroupPose) as its files hold it: built here by
the package's own code in a tiny size with random weights, saved as its training runs save it, loaded by
:func:`detr.load_checkpoint` with the same logits, boxes and keypoints; predicted with keypoints."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

import detr
from detr.checkpoints.formats import CheckpointError
from tests.helpers_rfdetr_package import package_keypoint_model, rfdetr_module

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

COUNTS = (0, 17, 5)  # classes with different keypoint counts, one without
SIZE = 48


def _package_file(path, model, config, **extra) -> None:
    torch.save({"model": model.state_dict(), "model_name": "RFDETRKeypointPreview",
                "model_config": config.model_dump(), "args": argparse.Namespace(epochs=1), **extra}, path)


def _package_outputs(model, images):
    tensors = rfdetr_module("utilities.tensors")
    with torch.no_grad():
        return model(tensors.NestedTensor(images, torch.zeros(len(images), SIZE, SIZE, dtype=torch.bool)))


def test_a_keypoint_file_loads_with_the_package_outputs(tmp_path):
    model, config = package_keypoint_model(COUNTS)
    path = tmp_path / "checkpoint_best_total.pth"
    _package_file(path, model, config)
    ours = detr.load_checkpoint(path)
    assert ours.config.num_keypoints_per_class == COUNTS and ours.config.keypoint_projector
    assert ours.config.num_classes == 5 and ours.meta.eval_size == (SIZE, SIZE)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    theirs = _package_outputs(model, images)
    with torch.no_grad():
        output = ours.eval()(images, torch.zeros(2, SIZE, SIZE, dtype=torch.bool))
    assert (output.logits - theirs["pred_logits"]).abs().max() <= 1e-4
    assert (output.boxes - theirs["pred_boxes"]).abs().max() <= 1e-4
    assert (output.keypoints - theirs["pred_keypoints"]).abs().max() <= 1e-4
    assert (output.aux[0].keypoints - theirs["aux_outputs"][0]["pred_keypoints"]).abs().max() <= 1e-4
    assert (output.proposals.boxes - theirs["enc_outputs"]["pred_boxes"]).abs().max() <= 1e-4
    if hasattr(rfdetr_module("models.transformer"), "_tracer_absent"):  # 1.8.0 cut eval's proposals in G chunks
        assert (output.proposals.logits - theirs["enc_outputs"]["pred_logits"]).abs().max() <= 1e-4
        assert (output.proposals.keypoints - theirs["enc_outputs"]["pred_keypoints"]).abs().max() <= 1e-4
    model.train(), ours.train()  # every query group, the encoder proposals by each group's predictor
    theirs = _package_outputs(model, images)
    with torch.no_grad():
        output = ours(images, torch.zeros(2, SIZE, SIZE, dtype=torch.bool))
    assert output.logits.shape[1] == 3 * 10
    for mine, key in ((output.logits, "pred_logits"), (output.keypoints, "pred_keypoints"),
                      (output.proposals.logits, "enc_outputs"), (output.proposals.keypoints, "enc_outputs")):
        reference = theirs[key] if key != "enc_outputs" else theirs[key][
            "pred_logits" if mine is output.proposals.logits else "pred_keypoints"]
        assert (mine - reference).abs().max() <= 1e-3  # logits up to ~10: float32 sums in another order


def test_the_predictor_returns_each_detection_s_keypoints(tmp_path):
    model, config = package_keypoint_model(COUNTS)
    path = tmp_path / "keypoints.pth"
    _package_file(path, model, config)
    predictor = detr.Predictor(detr.load_checkpoint(path), threshold=0.0)
    image = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    prediction = predictor.predict_arrays([image], threshold=0.0)[0]
    assert prediction.keypoints is not None and len(prediction.keypoints) == len(prediction.boxes) > 0
    assert prediction.keypoints.shape[1:] == (max(COUNTS), 3)
    labels = prediction.labels
    assert (prediction.keypoints[(labels != 1) & (labels != 2)] == 0).all()  # classes without keypoints
    assert (prediction.keypoints[labels == 2, 5:] == 0).all()  # class 2's five
    assert ((prediction.keypoints[..., 2] >= 0) & (prediction.keypoints[..., 2] <= 1)).all()


def test_a_decoder_reading_the_second_projector_is_refused_in_one_line(tmp_path):
    model, config = package_keypoint_model(COUNTS)
    path = tmp_path / "dual.pth"
    _package_file(path, model, config.model_copy(update={"dual_projector_kp_only": False}))
    with pytest.raises(CheckpointError, match="dual_projector_kp_only") as refusal:
        detr.load_checkpoint(path)
    assert "\n" not in str(refusal.value)
