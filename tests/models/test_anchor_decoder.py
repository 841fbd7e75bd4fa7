"""Anchor-box queries (DAB-DETR): sine embedding, refinement formula, detached references."""

from __future__ import annotations

import math

import pytest
import torch

import detr.models.anchor.decoder as anchor_decoder
from detr import build_detr
from detr.box_ops import inverse_sigmoid
from detr.models.anchor.decoder import AnchorDecoder, anchor_sine_embedding
from tests.helpers import model_output, tiny_config_with

TINY = tiny_config_with(num_decoder_layers=3, num_queries=6, num_classes=4, dropout=0.0)


@pytest.fixture
def anchor_model():
    torch.manual_seed(0)
    model = build_detr(TINY, query_type="anchor").eval()
    with torch.no_grad():  # non-zero box deltas, so refinement is visible
        model.bbox_embed.layers[-1].weight.normal_(0, 0.5)
        model.bbox_embed.layers[-1].bias.normal_(0, 0.5)
    return model


def _batch():
    torch.manual_seed(1)
    images = torch.randn(2, 3, 64, 96)
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 40:, :] = True
    images[1, :, 40:] = 0
    return images, mask


def test_inverse_sigmoid_inverts_and_stays_finite():
    x = torch.tensor([-3.0, 0.0, 2.5])
    assert torch.allclose(inverse_sigmoid(x.sigmoid()), x, atol=1e-5)
    assert torch.isfinite(inverse_sigmoid(torch.tensor([0.0, 1.0]))).all()


def test_sine_embedding_is_detrs_formula_per_coordinate_y_first():
    boxes = torch.tensor([[0.1, 0.7, 0.3, 0.05]])  # cx, cy, w, h
    num_feats = 8
    embedding = anchor_sine_embedding(boxes, num_feats)
    assert embedding.shape == (1, 4 * num_feats)
    for block, coordinate in enumerate((1, 0, 2, 3)):  # order (y, x, w, h)
        for i in range(num_feats):
            angle = boxes[0, coordinate].item() * 2 * math.pi / 10000 ** (2 * (i // 2) / num_feats)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert embedding[0, block * num_feats + i].item() == pytest.approx(expected, abs=1e-6)


def test_every_layer_refines_the_previous_box_in_inverse_sigmoid_space(anchor_model):
    deltas = []
    hook = anchor_model.bbox_embed.register_forward_hook(lambda module, args, output: deltas.append(output))
    images, mask = _batch()
    with torch.no_grad():
        out = anchor_model(images, mask)
    hook.remove()
    layers = [*out.aux, model_output(boxes=out.boxes)]
    assert len(deltas) == len(layers) == TINY.num_decoder_layers
    previous = anchor_model.refpoint_embed.weight.sigmoid().expand(2, -1, -1)  # layer 1 refines the anchors
    for delta, layer in zip(deltas, layers):
        expected = (delta + inverse_sigmoid(previous)).sigmoid()
        torch.testing.assert_close(layer.boxes, expected, rtol=0, atol=1e-6)
        previous = layer.boxes
    assert not torch.allclose(layers[0].boxes, layers[-1].boxes)


def test_initial_boxes_are_the_anchors(anchor_model):
    torch.nn.init.zeros_(anchor_model.bbox_embed.layers[-1].weight)  # build_detr's init for anchor queries
    torch.nn.init.zeros_(anchor_model.bbox_embed.layers[-1].bias)
    images, mask = _batch()
    with torch.no_grad():
        out = anchor_model(images, mask)
    anchors = anchor_model.refpoint_embed.weight.sigmoid().expand(2, -1, -1)
    torch.testing.assert_close(out.boxes, anchors, rtol=0, atol=1e-6)


def test_references_after_the_first_layer_are_detached(anchor_model, monkeypatch):
    seen = []
    original = anchor_decoder.anchor_sine_embedding

    def spy(boxes, num_feats, temperature=10000.0):
        seen.append(boxes.requires_grad)
        return original(boxes, num_feats, temperature)

    monkeypatch.setattr(anchor_decoder, "anchor_sine_embedding", spy)
    anchor_model.train()
    images, mask = _batch()
    out = anchor_model(images, mask)
    # layer 1 sees the learned anchors (they get gradient); later layers see detached boxes
    assert seen == [True] + [False] * (TINY.num_decoder_layers - 1)
    # ...but a layer's output box still adds the previous layer's delta with its gradient ("look forward twice")
    grad = torch.autograd.grad(out.boxes.sum(), anchor_model.refpoint_embed.weight, allow_unused=True)[0]
    assert grad is not None


def test_decoder_alone_shapes_and_attention_rows():
    torch.manual_seed(0)
    decoder = AnchorDecoder(16, 2, num_layers=2, dim_feedforward=32, dropout=0.0)
    box_head = torch.nn.Linear(16, 4)
    tgt, anchors = torch.zeros(3, 5, 16), torch.randn(3, 5, 4)
    memory, pos = torch.randn(3, 12, 16), torch.randn(3, 12, 16)
    memory_mask = torch.ones(3, 1, 1, 12, dtype=torch.bool)
    memory_mask[1, ..., 8:] = False
    hs, boxes, weights = decoder(tgt, anchors, memory, memory_mask, pos, box_head, return_attention=True)
    assert hs.shape == (2, 3, 5, 16) and boxes.shape == (2, 3, 5, 4) and len(weights) == 2
    assert ((boxes > 0) & (boxes < 1)).all()
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3, 2, 5))
    assert weights[0][1, ..., 8:].abs().max() == 0  # padding gets no attention
    # the fast path (SDPA) and the explicit-weights path agree
    hs_fast, boxes_fast, _ = decoder(tgt, anchors, memory, memory_mask, pos, box_head)
    torch.testing.assert_close(hs_fast, hs, rtol=1e-5, atol=1e-5)


def test_anchor_queries_are_permutation_equivariant(anchor_model):
    images, mask = _batch()
    with torch.no_grad():
        out = anchor_model(images, mask)
        permutation = torch.randperm(TINY.num_queries)
        anchor_model.refpoint_embed.weight.copy_(anchor_model.refpoint_embed.weight[permutation])
        permuted = anchor_model(images, mask)
    torch.testing.assert_close(permuted.boxes, out.boxes[:, permutation], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(permuted.logits, out.logits[:, permutation], rtol=1e-5, atol=1e-5)


def test_anchor_model_layout_and_attention_maps(anchor_model):
    keys = set(anchor_model.state_dict())
    assert "refpoint_embed.weight" in keys and "query_embed.weight" not in keys
    assert anchor_model.refpoint_embed.weight.shape == (TINY.num_queries, 4)
    assert "transformer.decoder.layers.0.ca_qpos_proj.weight" in keys
    assert "transformer.decoder.layers.1.ca_qpos_proj.weight" not in keys  # first layer only (Conditional DETR)
    images, mask = _batch()
    with torch.no_grad():
        out = anchor_model(images, mask, return_attention=True)
    h, w = out.attention.feature_mask.shape[-2:]
    assert out.attention.decoder.shape == (TINY.num_decoder_layers, 2, TINY.num_queries, h, w)
    real = ~out.attention.feature_mask
    sums = (out.attention.decoder * real[None, :, None]).sum((-2, -1))
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_cross_attention_with_a_wider_query_than_value_matches_explicit_attention():
    """Conditional cross-attention's q/k heads are twice v's; the fused path pads v and slices the output
    back: outputs and gradients equal the explicit softmax(q·kᵀ/√d)·v, masked keys included."""
    torch.manual_seed(0)
    heads = 4
    q = torch.randn(2, 7, heads * 8, requires_grad=True)
    k = torch.randn(2, 5, heads * 8, requires_grad=True)
    v = torch.randn(2, 5, heads * 4, requires_grad=True)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    fused, _ = anchor_decoder._attend(q, k, v, heads, mask, 0.0, need_weights=False)
    explicit, weights = anchor_decoder._attend(q, k, v, heads, mask, 0.0, need_weights=True)
    assert fused.shape == (2, 7, heads * 4)
    assert torch.allclose(fused, explicit, atol=1e-6)
    assert float(weights[1, ..., 3:].abs().max()) == 0.0
    upstream = torch.randn_like(fused)
    grads_fused = torch.autograd.grad(fused, (q, k, v), upstream)
    grads_explicit = torch.autograd.grad(explicit, (q, k, v), upstream)
    for a, b in zip(grads_fused, grads_explicit):
        assert torch.allclose(a, b, atol=1e-5)
