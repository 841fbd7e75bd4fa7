"""SizeConstants: size-only tensors kept between calls under inference mode, and only there."""

from __future__ import annotations

import torch

from detr import build_detr
from detr.models.dfine.config import DFINEConfig, DistributionDecoder

from detr.models.size_constants import SizeConstants

CPU = torch.device("cpu")


def test_kept_per_key_and_dtype_under_inference_mode_and_computed_afresh_outside():
    calls = []

    def compute(key: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        calls.append((key, dtype))
        return torch.zeros(key, device=device, dtype=dtype)

    constants = SizeConstants(compute)
    with torch.inference_mode():
        first = constants(3, device=CPU, dtype=torch.float32)
        assert constants(3, device=CPU, dtype=torch.float32) is first
        assert constants(3, device=CPU, dtype=torch.float64).dtype == torch.float64
        assert constants(4, device=CPU, dtype=torch.float32).shape == (4,)
    outside = constants(3, device=CPU, dtype=torch.float32)
    assert outside is not first and not outside.is_inference()
    assert calls == [(3, torch.float32), (3, torch.float64), (4, torch.float32), (3, torch.float32)]


def test_a_model_run_under_inference_mode_then_trains_and_predicts_the_same():
    """The kept anchors, AIFI positions and point scales are inference tensors, which autograd cannot save: a
    model that predicted under inference mode (a validation pass) must still train, and predict as before."""
    config = DFINEConfig(class_head="sigmoid", backbone="hgnetv2_b0", hidden_dim=32, num_heads=4, dim_feedforward=48,
                         num_decoder_layers=2, num_queries=10, num_classes=3, dropout=0.0, num_feature_levels=3,
                         csp_expansion=0.5, csp_depth_multiplier=0.34, denoising=False, num_encoder_layers=6,
                         backbone_norm='frozen_batch_norm', backbone_learnable_affine=False,
                         decoder=DistributionDecoder(num_points_per_level=(2, 3, 1), max_num_bins=8))
    torch.manual_seed(0)
    model = build_detr(config).eval()
    images, mask = torch.rand(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool)
    with torch.inference_mode():
        kept = model(images, mask)
        again = model(images, mask)
    assert torch.equal(kept.logits, again.logits) and torch.equal(kept.boxes, again.boxes)
    with torch.no_grad():
        fresh = model(images, mask)
    assert torch.equal(kept.logits, fresh.logits) and torch.equal(kept.boxes, fresh.boxes)
    model.train()
    outputs = model(images, mask)
    (outputs.logits.sum() + outputs.boxes.sum() + outputs.proposals.logits.sum()).backward()  # anchors, valid mask
    assert model.decoder.enc_output.proj.weight.grad.abs().sum() > 0
    assert model.encoder.encoder[0].layers[0].linear1.weight.grad.abs().sum() > 0  # through AIFI's positions
