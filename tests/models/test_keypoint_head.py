"""The GroupPose keypoint head (detr.models.layers.keypoint_head) against the rfdetr package's (1.8.0,
``RFDETRKeypointPreview``): the package's whole LW-DETR forward with keypoints runs on random weights (a stand-in
backbone hands it feature maps), and our head, given the same weights and the same decoder states, returns its
keypoint queries, layer updates, keypoints of every layer and of the encoder proposals, and class-logit boosts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from detr.models.layers.keypoint_head import KeypointHead, KeypointSchema
from tests.helpers import randomise
from tests.helpers_rfdetr_package import rfdetr_module

pytestmark = pytest.mark.usefixtures("one_thread")

HIDDEN, QUERIES, LEVELS, CLASSES = 32, 5, 2, 4
SHAPES = [(6, 5), (3, 3)]


def test_the_schema_pads_per_class_and_masks_other_classes():
    schema = KeypointSchema((0, 3, 2))
    assert (schema.total, schema.max_count, schema.num_classes) == (5, 3, 3)
    compact = torch.arange(1.0, 6.0)[:, None]  # keypoints 1..5: class 1's three, then class 2's two
    assert schema.pad(compact).flatten().tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 0]
    mask = schema.attention_mask()
    assert mask[0].all() and mask[:, 0].all()  # the object query sees and is seen by every keypoint
    assert mask[1:4, 1:4].all() and not mask[1:4, 4:].any() and not mask[4:, 1:4].any()
    assert schema.class_logits(schema.pad(torch.ones(5, 8)), 4).tolist() == [0, 3, 2, 0]
    with pytest.raises(ValueError, match="num_keypoints_per_class"):
        KeypointSchema((0, 0))
    with pytest.raises(ValueError, match="raise num_classes"):
        schema.class_logits(schema.pad(torch.ones(5, 8)), 2)


class _Maps(nn.Module):
    """A backbone's place: fixed feature maps and positions, and the second projector's maps (keypoints only)."""

    def __init__(self, nested_tensor: type, batch: int, generator: torch.Generator) -> None:
        super().__init__()
        self.nested_tensor = nested_tensor
        self.maps = [torch.randn(batch, HIDDEN, h, w, generator=generator) for h, w in SHAPES]
        self.positions = [torch.randn(batch, HIDDEN, h, w, generator=generator) for h, w in SHAPES]
        self.keypoint_maps = [torch.randn(batch, HIDDEN, h, w, generator=generator) for h, w in SHAPES]

    def forward(self, samples):
        def nested(maps):
            return [self.nested_tensor(m, torch.zeros(m.shape[0], *m.shape[-2:], dtype=torch.bool)) for m in maps]
        return nested(self.maps), self.positions, nested(self.keypoint_maps)


def transformer_module():
    return rfdetr_module("models.transformer")


def _package_model(counts, *, divisor, inter_instance, cross_attention, groups, batch):
    transformer_module, lwdetr, tensors = (rfdetr_module(name) for name in (
        "models.transformer", "models.lwdetr", "utilities.tensors"))
    transformer = transformer_module.Transformer(
        d_model=HIDDEN, sa_nhead=4, ca_nhead=8, num_queries=QUERIES, num_decoder_layers=2, dim_feedforward=64,
        return_intermediate_dec=True, group_detr=groups, two_stage=True, num_feature_levels=LEVELS, dec_n_points=2,
        lite_refpoint_refine=True, bbox_reparam=True, use_grouppose_keypoints=True,
        num_keypoints_per_class=list(counts), grouppose_keypoint_dim_downscale=divisor,
        keypoint_cross_attn=cross_attention, inter_instance_kp_attn=inter_instance, dual_projector_kp_only=True)
    generator = torch.Generator().manual_seed(1)
    model = lwdetr.LWDETR(_Maps(tensors.NestedTensor, batch, generator), transformer, None, num_classes=CLASSES,
                          num_queries=QUERIES, aux_loss=True, group_detr=groups, two_stage=True,
                          lite_refpoint_refine=True, bbox_reparam=True, use_grouppose_keypoints=True,
                          num_keypoints_per_class=list(counts), grouppose_keypoint_dim_downscale=divisor)
    randomise(model, 0)
    for layer in transformer.decoder.layers:  # so that the object query's share of the attention shows
        layer.instance_kp_layer_scale.data.fill_(0.5)
    return model


def package_keypoint_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The package's keypoint weights in :class:`KeypointHead`'s names (what the checkpoint reader will map)."""
    prefixes = {"transformer.keypoint_query_initializer.": "query_initializer.",
                "transformer.keypoint_query_initializer_enc.": "encoder_query_initializer.",
                "transformer.enc_out_keypoint_embed.": "encoder_predictors.",
                "transformer.decoder.keypoint_pos_embed": "keypoint_pos_embed",
                "keypoint_embed.": "predictor."}
    layer_names = ("inst_", "memory_in_proj", "kp_", "inter_inst_kp_", "instance_kp_layer_scale")
    ours = {}
    for key, value in state.items():
        for prefix, name in prefixes.items():
            if key.startswith(prefix):
                ours[name + key[len(prefix):]] = value
        if key.startswith("transformer.decoder.layers."):
            index, rest = key[len("transformer.decoder.layers."):].split(".", 1)
            if rest.startswith(layer_names):
                ours[f"layers.{index}.{rest}"] = value
    return ours


@pytest.mark.parametrize(("counts", "divisor", "inter_instance", "cross_attention", "groups", "training"), [
    ((0, 3, 2), 1, False, True, 1, False),
    ((0, 3, 2), 2, True, True, 3, True),
    ((4,), 1, True, False, 2, False),
], ids=["preview layout", "narrow keypoints, groups, training", "one class, no cross-attention"])
def test_the_head_equals_the_package_on_the_same_weights(counts, divisor, inter_instance, cross_attention, groups,
                                                         training):
    batch = 2
    model = _package_model(counts, divisor=divisor, inter_instance=inter_instance, cross_attention=cross_attention,
                           groups=groups, batch=batch)
    model.train(training)
    for module in model.modules():  # train mode for Group DETR's groups, without dropout's randomness
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    head = KeypointHead(counts, hidden_dim=HIDDEN, num_layers=2, num_heads=4, cross_attention_heads=8,
                        num_levels=LEVELS, num_points=2, dim_divisor=divisor, cross_attention=cross_attention,
                        inter_instance_attention=inter_instance, num_groups=groups).train(training)
    assert head.load_state_dict(package_keypoint_state(model.state_dict()), strict=True)
    assert torch.equal(head.attention_mask, ~model.transformer.decoder.keypoint_class_mask)

    seen: dict[str, object] = {}
    hooks = [model.transformer.keypoint_query_initializer.register_forward_hook(
                 lambda m, args, out: seen.update(start=(args[0], out))),
             model.transformer.keypoint_query_initializer_enc.register_forward_hook(
                 lambda m, args, out: seen.update(encoder=args[0])),
             model.transformer.decoder.register_forward_hook(lambda m, args, out: seen.update(decoder=out))]
    for index, layer in enumerate(model.transformer.decoder.layers):
        hooks.append(layer.norm3.register_forward_hook(lambda m, args, out, i=index: seen.update({f"target{i}": out})))
        hooks.append(layer.register_forward_hook(
            lambda m, args, kwargs, out, i=index: seen.update({f"layer{i}": (args, kwargs, out)}), with_kwargs=True))
    with torch.no_grad():
        out = model(torch.zeros(batch, 3, 24, 20))
        for hook in hooks:
            hook.remove()

        features, keypoint_queries = seen["start"]
        assert (head.start(features) - keypoint_queries).abs().max() <= 1e-5
        for index in range(2):
            args, kwargs, (target, keypoints) = seen[f"layer{index}"]
            boxes = kwargs["reference_points"].expand(-1, -1, LEVELS, -1)
            spatial_shapes = [tuple(int(v) for v in shape) for shape in kwargs["spatial_shapes"]]
            ours = head.layer(index, seen[f"target{index}"], kwargs["query_pos"], kwargs["keypoint_tgt"], boxes,
                              kwargs["kp_cross_attn_memory"], spatial_shapes, kwargs["memory_key_padding_mask"])
            assert (ours[0] - target).abs().max() <= 1e-5
            assert (ours[1] - keypoints).abs().max() <= 1e-5

        hidden, references, keypoint_hidden = seen["decoder"]
        keypoints = head.predict(keypoint_hidden, references)  # [L, B, G·Q, C_k · K_max, 8]
        assert keypoints.shape == (2, batch, groups * QUERIES if training else QUERIES,
                                   len(counts) * max(counts), 8)
        assert (keypoints[-1] - out["pred_keypoints"]).abs().max() <= 1e-5
        assert (keypoints[0] - out["aux_outputs"][0]["pred_keypoints"]).abs().max() <= 1e-5
        boost = out["pred_logits"] - model.class_embed(hidden[-1])
        assert (head.schema.class_logits(keypoints[-1], CLASSES) - boost).abs().max() <= 1e-4
        encoder = head.encoder_keypoints(seen["encoder"], out["enc_outputs"]["pred_boxes"])
        if training or groups == 1 or hasattr(transformer_module(), "_tracer_absent"):  # 1.8.0 differs in eval
            assert (encoder - out["enc_outputs"]["pred_keypoints"]).abs().max() <= 1e-5


def test_a_fresh_head_predicts_keypoints_at_the_box_centre():
    head = KeypointHead((0, 3), hidden_dim=HIDDEN, num_layers=1, num_heads=4, cross_attention_heads=8,
                        num_levels=1, num_points=2)
    boxes = torch.tensor([[[0.5, 0.4, 0.2, 0.3]]])  # [B, Q, 4]
    keypoints = head.predict(head.start(torch.randn(1, 1, HIDDEN)), boxes)  # [1, 1, 2 · 3, 8]
    assert keypoints.shape == (1, 1, 6, 8)
    assert torch.equal(keypoints[0, 0, 3:, :2], torch.tensor([[0.5, 0.4]] * 3))
    assert not keypoints[..., 2:].any()
