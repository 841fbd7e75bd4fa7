"""The model: official layout, parity with a plain nn.MultiheadAttention reference, attention maps,
padding invariance, query permutation equivariance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from detr import build_detr
from detr.models.layers.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine
from tests.helpers import tiny_config_with
from tests.reference_detr import ReferenceDETR, sine_position_encoding

LAYOUT = json.loads((Path(__file__).resolve().parents[1] / "data" / "official_detr_state_dict_layout.json").read_text())


@pytest.mark.parametrize("backbone", ["resnet18", "resnet50", "resnet101"])
def test_state_dict_layout_is_the_authors(backbone):
    model = build_detr(backbone=backbone)
    ours = {key: list(value.shape) for key, value in model.state_dict().items()}
    assert ours == LAYOUT[backbone]


def test_r50_has_the_papers_parameter_count():
    model = build_detr()
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 41_302_368


def test_sine_encoding_matches_the_formula():
    mask = torch.zeros(2, 7, 9, dtype=torch.bool)
    mask[1, 5:, :] = True
    mask[1, :, 6:] = True
    ours = PositionEmbeddingSine(16)(mask)
    assert ours.shape == (2, 32, 7, 9)
    torch.testing.assert_close(ours, sine_position_encoding(mask, 16), rtol=0, atol=1e-5)


def test_sine_encoding_ignores_padding():
    """Padding added at the bottom/right must not change the encoding of real pixels."""
    small = PositionEmbeddingSine(8)(torch.zeros(1, 4, 5, dtype=torch.bool))
    mask = torch.ones(1, 6, 8, dtype=torch.bool)
    mask[:, :4, :5] = False
    padded = PositionEmbeddingSine(8)(mask)
    torch.testing.assert_close(padded[..., :4, :5], small)


def test_learned_encoding_is_x_first():
    encoding = PositionEmbeddingLearned(4)
    pos = encoding(torch.zeros(1, 3, 5, dtype=torch.bool))
    torch.testing.assert_close(pos[0, :4, 1, 2], encoding.col_embed.weight[2])
    torch.testing.assert_close(pos[0, 4:, 1, 2], encoding.row_embed.weight[1])


def test_outputs_match_plain_multihead_attention_reference(tiny_config, padded_batch):
    """Same weights in a literal nn.MultiheadAttention implementation → same predictions and attention."""
    torch.manual_seed(0)
    model = build_detr(tiny_config).eval()
    reference = ReferenceDETR(model.backbone[0].body, model.backbone.num_channels, 32, 2, 1, 2, 64, 10, 5).eval()
    reference.load_state_dict(model.state_dict())
    images, mask = padded_batch
    with torch.no_grad():
        ours = model(images, mask, return_attention=True)
        ref = reference(images, mask)
    torch.testing.assert_close(ours.logits, ref["pred_logits"][-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.boxes, ref["pred_boxes"][-1], rtol=1e-5, atol=1e-5)
    for layer, aux in enumerate(ours.aux):
        torch.testing.assert_close(aux.logits, ref["pred_logits"][layer], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(aux.boxes, ref["pred_boxes"][layer], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.attention.decoder, ref["decoder_attention"], rtol=1e-5, atol=1e-6)


def test_fast_path_equals_attention_path(tiny_model, padded_batch):
    """SDPA (no weights) and explicit weights give the same predictions."""
    with torch.no_grad():
        fast = tiny_model(*padded_batch)
        slow = tiny_model(*padded_batch, return_attention=True)
    torch.testing.assert_close(fast.logits, slow.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.boxes, slow.boxes, rtol=1e-5, atol=1e-5)


def test_dropout_drops_each_element_with_probability_p_and_scales_the_rest():
    """The CPU dropout's draw (31-bit integers against p · 2³¹): each element kept with probability 1 - p (within
    five standard deviations over 400,000), kept ones scaled by exactly 1 / (1 - p), dropped ones 0, the gradient
    through the same mask; the same seed, the same mask; nothing dropped outside training."""
    from detr.models.layers.attention import Dropout
    from detr.models.layers.cpu_kernels import dropout

    count, p = 400_000, 0.1
    x = torch.ones(count, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, p)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / count) ** 0.5
    assert torch.equal(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    torch.manual_seed(0)
    assert torch.equal(dropout(x, p), y)
    assert dropout(x, p, training=False) is x and dropout(x, 0.0) is x
    assert Dropout(p).eval()(x) is x and torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_attention_maps_shapes_and_sum_to_one_over_unpadded(tiny_model, padded_batch):
    images, mask = padded_batch
    with torch.no_grad():
        out = tiny_model(images, mask, return_attention=True)
    feature_mask = out.attention.feature_mask  # [B, h, w]
    batch, height, width = feature_mask.shape
    assert out.attention.decoder.shape == (2, batch, 10, height, width)
    assert out.attention.decoder_heads.shape == (2, batch, 2, 10, height, width)
    assert out.attention.encoder.shape == (batch, height * width, height, width)
    assert feature_mask[1].any() and not feature_mask[0].any()
    decoder = out.attention.decoder
    torch.testing.assert_close(decoder.sum(dim=(-1, -2)), torch.ones(2, batch, 10))
    assert decoder[:, 1][..., feature_mask[1]].abs().max() == 0  # nothing lands on padding
    encoder = out.attention.encoder
    torch.testing.assert_close(encoder.sum(dim=(-1, -2)), torch.ones(batch, height * width))
    assert encoder[1][:, feature_mask[1]].abs().max() == 0
    torch.testing.assert_close(out.attention.decoder_heads.mean(2), decoder)


def test_padding_does_not_change_predictions(tiny_model):
    """An image alone and the same image padded inside a larger batch give the same boxes (stride-aligned pad)."""
    torch.manual_seed(3)
    image = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        alone = tiny_model(image, torch.zeros(1, 64, 64, dtype=torch.bool))
        padded_image = torch.zeros(1, 3, 128, 128)
        padded_image[..., :64, :64] = image
        mask = torch.ones(1, 128, 128, dtype=torch.bool)
        mask[:, :64, :64] = False
        padded = tiny_model(padded_image, mask)
    # The backbone's receptive field sees the zero padding near the border, so equality is approximate,
    # but the boxes stay relative to the unpadded image.
    assert (padded.boxes - alone.boxes).abs().max() < 0.1


def test_query_permutation_equivariance(tiny_model, padded_batch):
    """Permuting the object queries permutes the predictions (dropout off): queries are a set."""
    with torch.no_grad():
        out = tiny_model(*padded_batch)
        permutation = torch.randperm(tiny_model.num_queries, generator=torch.Generator().manual_seed(0))
        tiny_model.query_embed.weight.copy_(tiny_model.query_embed.weight[permutation])
        permuted = tiny_model(*padded_batch)
    torch.testing.assert_close(permuted.logits, out.logits[:, permutation], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(permuted.boxes, out.boxes[:, permutation], rtol=1e-5, atol=1e-5)


def test_pre_norm_adds_encoder_norm_and_runs(tiny_config, padded_batch):
    model = build_detr(tiny_config, pre_norm=True).eval()
    assert "transformer.encoder.norm.weight" in model.state_dict()
    out = model(*padded_batch)
    assert torch.isfinite(out.logits).all()


def test_frozen_stages_follow_the_paper():
    model = build_detr(backbone="resnet18")
    trainable = {n.split(".")[2] for n, p in model.backbone.named_parameters() if p.requires_grad}
    assert trainable == {"layer2", "layer3", "layer4"}


def test_backbone_options_for_training_from_scratch(padded_batch):
    model = build_detr(tiny_config_with(num_decoder_layers=1, num_queries=5, num_classes=3,
                                          backbone_norm="group_norm", backbone_trainable_layers=5,
                                          backbone_last_stage="layer3"))
    assert all(p.requires_grad for p in model.backbone.parameters())
    assert model.backbone[0].stride == 16 and model.backbone.num_channels == 256
    out = model(*padded_batch, return_attention=True)
    assert out.attention.feature_mask.shape == (2, 6, 8)


def test_dc5_doubles_the_feature_map():
    model = build_detr(backbone="resnet50", dilation=True, num_encoder_layers=1, num_decoder_layers=1)
    features, _ = model.backbone[0](torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool))
    assert features.shape[-2:] == (4, 4)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="resnet50 or resnet101"):
        build_detr(backbone="resnet18", dilation=True)
    with pytest.raises(ValueError, match="position_encoding"):
        build_detr(position_encoding="cosine")
    with pytest.raises(ValueError, match="divisible"):
        build_detr(backbone="resnet18", hidden_dim=30, num_heads=4)


def test_offline_imagenet_weights_error_says_how_to_pass_a_file(tmp_path, monkeypatch):
    import torchvision

    def refuse(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.__class__, "get_state_dict", refuse)
    from detr.models.backbone import PretrainedWeightsError

    with pytest.raises(PretrainedWeightsError, match="pretrained_backbone='/path/resnet18") as error:
        build_detr(backbone="resnet18", pretrained_backbone=True)
    assert error.value.file_name == "resnet18-f37072fd.pth" and error.value.reason == "network unreachable"


def test_imagenet_weights_from_a_local_file(tmp_path):
    resnet = torchvision_resnet18()
    path = tmp_path / "resnet18.pth"
    torch.save(resnet.state_dict(), path)
    model = build_detr(backbone="resnet18", pretrained_backbone=str(path), num_encoder_layers=1, num_decoder_layers=1)
    torch.testing.assert_close(model.backbone[0].body.conv1.weight, resnet.conv1.weight)
    torch.testing.assert_close(model.backbone[0].body.layer1[0].bn1.running_var, resnet.layer1[0].bn1.running_var)


def torchvision_resnet18():
    import torchvision

    torch.manual_seed(5)
    resnet = torchvision.models.resnet18()
    resnet.layer1[0].bn1.running_var.uniform_(0.5, 2.0)
    return resnet


def test_optimize_for_inference_keeps_outputs(tiny_config, padded_batch):
    torch.manual_seed(0)
    model = build_detr(tiny_config).eval()
    for buffer_name, buffer in model.backbone.named_buffers():  # non-trivial frozen statistics
        if buffer_name.endswith("running_var"):
            buffer.uniform_(0.5, 2.0)
        elif buffer_name.endswith("running_mean"):
            buffer.normal_(0, 0.1)
    with torch.no_grad():
        before = model(*padded_batch)
        folded = model.backbone[0].fold_frozen_batch_norm()
        model.optimize_for_inference(fold_batch_norm=False)
        after = model(*padded_batch)
    assert folded == 20  # ResNet-18: stem + 8 blocks × 2 + 3 downsamples
    torch.testing.assert_close(after.boxes, before.boxes, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after.logits, before.logits, rtol=1e-4, atol=1e-4)
