"""RF-DETR's and LW-DETR's loss as parts of the one criterion, against transformers' LwDetrForObjectDetectionLoss
(the function both RfDetrForObjectDetection and LwDetrForObjectDetection train with; the authors' rf-detr
``SetCriterion`` with ``ia_bce_loss``): the IoU-aware BCE class loss, L1 and GIoU of every decoder layer and of the
selected encoder proposals, Group DETR's groups matched one by one, with the recipe's costs and weights; on random
predictions, and on the predictions of the two models in training mode from the same weights. The instance masks'
point-sampled terms against transformers' RfDetrForSegmentationLoss, and the matcher's mask costs."""

from __future__ import annotations

import pytest
import torch

from detr.models.rfdetr.config import RFDETRConfig
import detr
from detr.loss.build import build_criterion
from detr.loss.focal import ia_bce_loss
from detr.loss.matcher import HungarianMatcher
from detr.loss.point_sampling import pairwise_dice, pairwise_sigmoid_ce

from detr.models.outputs import DetectorOutput, LayerOutput, MaskFeatures
from tests.helpers_rfdetr import hf_lwdetr, hf_model
from tests.helpers_rtdetr import RECIPE, loss_targets, random_layer, square_photos

NUM_CLASSES, NUM_QUERIES, GROUPS, LAYERS = 4, 6, 3, 3
CONFIG = RFDETRConfig(backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1,
                      num_classes=NUM_CLASSES, num_queries=NUM_QUERIES, query_groups=GROUPS,
                      num_decoder_layers=LAYERS, dropout=0.1, num_points=4)


def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]], groups: int,
            num_layers: int = LAYERS) -> dict[str, torch.Tensor]:
    """transformers' loss terms (unweighted) on the same predictions, as its models hand them over."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_lw_detr import LwDetrForObjectDetectionLoss

    layers = outputs.layers
    config = transformers.LwDetrConfig(num_labels=NUM_CLASSES, group_detr=groups, decoder_layers=num_layers)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    _, losses, _ = LwDetrForObjectDetectionLoss(
        logits=outputs.logits, labels=labels, device="cpu", pred_boxes=outputs.boxes, config=config,
        outputs_class=torch.stack([layer.logits for layer in layers]),
        outputs_coord=torch.stack([layer.boxes for layer in layers]),
        enc_outputs_class=outputs.proposals.logits, enc_outputs_coord=outputs.proposals.boxes)
    return losses


def _weighted_differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                          weight_dict: dict[str, float]) -> dict[str, float]:
    """Every term transformers weighs (weights 1, 5, 2 there too) → |ours · weight − theirs · weight|."""
    trained = {name: value for name, value in theirs.items() if not name.startswith("cardinality_error")}
    assert set(trained) == set(weight_dict)
    return {name: abs(float((ours[name] - value).detach() * weight_dict[name])) for name, value in trained.items()}


def test_rfdetr_loss_is_transformers_on_random_predictions():
    targets = loss_targets(NUM_CLASSES)
    generator = torch.Generator().manual_seed(0)
    batch, queries = len(targets), GROUPS * NUM_QUERIES
    layers = [random_layer(NUM_CLASSES, batch, queries, generator) for _ in range(LAYERS)]
    for layer in layers:
        layer.logits.requires_grad_(True)
    outputs = DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1],
                             proposals=random_layer(NUM_CLASSES, batch, queries, generator), class_head="sigmoid")
    criterion = build_criterion(CONFIG, **RECIPE)
    ours = criterion(outputs, targets)
    theirs = _theirs(outputs, targets, GROUPS)

    differences = _weighted_differences(ours, theirs, criterion.weight_dict)
    assert max(differences.values()) <= 1e-5, differences
    # the class loss's gradient too: the negatives' weight p^γ keeps its gradient in both
    for layer, name in zip(layers, ["loss_ce_0", "loss_ce_1", "loss_ce"]):
        ours_grad, = torch.autograd.grad(ours[name], layer.logits, retain_graph=True)
        theirs_grad, = torch.autograd.grad(theirs[name], layer.logits, retain_graph=True)
        assert torch.allclose(ours_grad, theirs_grad, atol=1e-7), name


def test_each_group_is_matched_on_its_own_and_the_terms_divide_by_groups():
    """Three identical groups: each is matched as the first is alone, so every term equals one group's."""
    targets = loss_targets(NUM_CLASSES)
    generator = torch.Generator().manual_seed(1)
    one = [random_layer(NUM_CLASSES, len(targets), NUM_QUERIES, generator) for _ in range(LAYERS + 1)]
    def repeated(layer: LayerOutput) -> LayerOutput:
        return LayerOutput(layer.logits.repeat(1, GROUPS, 1), layer.boxes.repeat(1, GROUPS, 1))

    last = repeated(one[LAYERS - 1])
    grouped = DetectorOutput(last.logits, last.boxes, aux=[repeated(x) for x in one[:LAYERS - 1]],
                             proposals=repeated(one[LAYERS]), class_head="sigmoid")
    single = DetectorOutput(one[LAYERS - 1].logits, one[LAYERS - 1].boxes, aux=one[:LAYERS - 1], proposals=one[LAYERS],
                            class_head="sigmoid")
    ours = build_criterion(CONFIG, **RECIPE)(grouped, targets)
    alone = build_criterion(CONFIG.replace(query_groups=1), **RECIPE)(single, targets)
    for name in build_criterion(CONFIG).weight_dict:
        assert ours[name].item() == pytest.approx(alone[name].item(), rel=1e-5), name


def test_ia_bce_on_a_hand_computed_case():
    """LW-DETR's eq. 1 by hand: the positive at t = max(p^α IoU^(1−α), 0.01), the negatives at −p^γ log(1 − p)."""
    logits = torch.tensor([[1.5, -2.0], [0.3, -4.0]])
    onehot = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    for iou, expected_target in ((0.6, None), (0.0, 0.01)):
        scores = onehot * iou
        p = logits.sigmoid()
        target = max(p[0, 0].item() ** 0.25 * iou ** 0.75, 0.01)
        if expected_target is not None:
            assert target == expected_target
        positive = -(target * p[0, 0].log() + (1 - target) * (1 - p[0, 0]).log())
        negatives = (p.pow(2) * -(1 - p).log())[onehot == 0].sum()
        loss = ia_bce_loss(logits, onehot, scores, 2.0)
        assert loss.item() == pytest.approx(((positive + negatives) / 2).item(), rel=1e-6)


def _train_mode_losses(hf, directory, photos, targets, **recipe):
    """transformers' model in training mode with labels, and this project's model read from its save, in training
    mode, through the criterion: (ours, theirs, weight_dict)."""
    hf.save_pretrained(directory)
    model = detr.load_checkpoint(directory).train()
    hf.train()
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    theirs = hf(pixel_values=photos, labels=labels).loss_dict
    criterion = build_criterion(model.config, **recipe)
    outputs = model(photos, torch.zeros(photos.shape[0], *photos.shape[-2:], dtype=torch.bool))
    return criterion(outputs, targets), theirs, criterion.weight_dict


@pytest.mark.parametrize("family", ["rfdetr", "lwdetr"])
def test_training_losses_equal_transformers_from_the_same_weights(tmp_path, family):
    """The whole training step's loss: the model's Group DETR forward (3 groups: their encoder heads, proposals and
    group-masked self-attention) and the criterion, against transformers' training forward and loss."""
    pytest.importorskip("transformers")
    photos = square_photos(112)
    targets = loss_targets(NUM_CLASSES)[:2]
    if family == "rfdetr":
        hf = hf_model(NUM_CLASSES, seed=4, dropout=0.0)
    else:
        hf = hf_lwdetr(NUM_CLASSES, seed=4)
    torch.manual_seed(0)
    ours, theirs, weight_dict = _train_mode_losses(hf, tmp_path, photos, targets, **RECIPE)
    differences = _weighted_differences(ours, theirs, weight_dict)
    assert max(differences.values()) <= 1e-4, differences


MASK_SIZE, MASK_CHANNELS, IMAGE_SIZE = 32, 8, 128


class _BoxMatcher(HungarianMatcher):
    """The box costs only (no mask cost, so no random points): the same matches on both sides of the parity test."""

    def __init__(self) -> None:
        super().__init__(**RECIPE, class_head="sigmoid", group_size=NUM_QUERIES)

    def forward(self, outputs, targets, group_detr=None):
        if isinstance(outputs, dict):  # transformers' layer and labels
            outputs = LayerOutput(outputs["logits"], outputs["pred_boxes"])
            targets = [{"labels": t["class_labels"], "boxes": t["boxes"]} for t in targets]
        return super().forward(LayerOutput(outputs.logits, outputs.boxes), targets)


def _ring_zeroed(maps: torch.Tensor) -> torch.Tensor:
    """maps [..., H, W] with their outermost pixels 0: transformers reads points past the outermost pixel centres
    with zero padding, the authors (and this project) with the border's value; with a zero border both read 0."""
    maps = maps.clone()
    maps[..., [0, -1], :] = 0
    maps[..., :, [0, -1]] = 0
    return maps


def _masked_layer(batch: int, queries: int, generator: torch.Generator) -> LayerOutput:
    """A random layer with masks as factors: random pixel features, each query reading one channel (so that its
    logits are the same numbers whether read from the factors or from the dense map: the importance sampling's
    top-k then picks the same points), no bias."""
    layer = random_layer(NUM_CLASSES, batch, queries, generator)
    pixels = _ring_zeroed(torch.randn(batch, MASK_CHANNELS, MASK_SIZE, MASK_SIZE, generator=generator) * 3)
    channels = torch.randint(0, MASK_CHANNELS, (batch, queries), generator=generator)
    layer.mask_features = MaskFeatures(pixels.requires_grad_(True),
                                       torch.nn.functional.one_hot(channels, MASK_CHANNELS).float(), torch.zeros(1))
    return layer


def _dense(features: MaskFeatures) -> torch.Tensor:
    return torch.einsum("bqc,bchw->bqhw", features.queries, features.pixels) + features.bias


def _mask_targets(generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """loss_targets with a random mask per object at the image size (4 × the masks' side), zero on the border."""
    targets = loss_targets(NUM_CLASSES)
    for target in targets:
        blobs = torch.rand(len(target["labels"]), IMAGE_SIZE // 8, IMAGE_SIZE // 8, generator=generator) > 0.5
        target["masks"] = _ring_zeroed(blobs.repeat_interleave(8, 1).repeat_interleave(8, 2))
    return targets


def test_mask_losses_are_transformers_on_random_predictions(monkeypatch):
    """Every term of RfDetrForSegmentationLoss (the masks' BCE and DICE on uncertainty-sampled points, of the last
    layer, the earlier ones and the encoder proposals; the box terms), on the same predictions and matches, the
    points drawn from the same seed; and the masks' gradient (inside the border, where the padding rules agree)."""
    pytest.importorskip("transformers")
    from transformers import RfDetrConfig
    from transformers.loss import loss_rf_detr

    generator = torch.Generator().manual_seed(5)
    targets = _mask_targets(generator)
    batch, queries = len(targets), GROUPS * NUM_QUERIES
    layers = [_masked_layer(batch, queries, generator) for _ in range(LAYERS)]
    proposals = _masked_layer(batch, queries, generator)
    last = layers[-1]
    outputs = DetectorOutput(last.logits, last.boxes, aux=layers[:-1], proposals=proposals, class_head="sigmoid",
                             mask_features=last.mask_features)
    criterion = build_criterion(CONFIG.replace(instance_masks=True), **RECIPE)
    criterion.matcher = _BoxMatcher()
    torch.manual_seed(11)
    ours = criterion(outputs, targets)

    monkeypatch.setattr(loss_rf_detr, "RfDetrHungarianMatcher", lambda **_: _BoxMatcher())
    config = RfDetrConfig(num_labels=NUM_CLASSES, group_detr=GROUPS, decoder_layers=LAYERS)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"], "masks": t["masks"]} for t in targets]
    dense = [_dense(layer.mask_features) for layer in layers]
    torch.manual_seed(11)
    _, theirs, _ = loss_rf_detr.RfDetrForSegmentationLoss(
        logits=last.logits, labels=labels, device="cpu", pred_boxes=last.boxes, pred_masks=dense[-1], config=config,
        outputs_class=torch.stack([layer.logits for layer in layers]),
        outputs_coord=torch.stack([layer.boxes for layer in layers]), outputs_masks=torch.stack(dense),
        enc_outputs_class=proposals.logits, enc_outputs_coord=proposals.boxes,
        enc_outputs_masks=_dense(proposals.mask_features))

    assert {"loss_mask_ce", "loss_mask_dice_0", "loss_mask_ce_enc"} <= set(theirs)
    differences = _weighted_differences(ours, theirs, criterion.weight_dict)
    assert max(differences.values()) <= 1e-5, differences
    assert min(float(ours[name].detach()) for name in theirs if name.startswith("loss_mask")) > 0
    pixels = last.mask_features.pixels
    for name in ("loss_mask_ce", "loss_mask_dice"):
        ours_grad, = torch.autograd.grad(ours[name], pixels, retain_graph=True)
        theirs_grad, = torch.autograd.grad(theirs[name], pixels, retain_graph=True)
        inside = (slice(None), slice(None), slice(1, -1), slice(1, -1))
        assert ours_grad[inside].abs().max() > 0
        assert torch.allclose(ours_grad[inside], theirs_grad[inside], atol=1e-7), name


def test_mask_costs_are_transformers_pairwise_costs_and_steer_the_matching():
    """The matcher's mask costs are Mask2Former's pairwise BCE and DICE (transformers' copies); with them, of two
    queries with the same box and class the one whose mask fits the target is matched."""
    pytest.importorskip("transformers")
    from transformers.loss.loss_rf_detr import pair_wise_dice_loss, pair_wise_sigmoid_cross_entropy_loss

    generator = torch.Generator().manual_seed(2)
    logits, labels = torch.randn(7, 50, generator=generator) * 3, (torch.rand(4, 50, generator=generator) > 0.5).float()
    torch.testing.assert_close(pairwise_sigmoid_ce(logits, labels), pair_wise_sigmoid_cross_entropy_loss(logits, labels))
    torch.testing.assert_close(pairwise_dice(logits, labels), pair_wise_dice_loss(logits, labels))

    mask = torch.zeros(1, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.bool)
    mask[:, :, : IMAGE_SIZE // 2] = True  # the left half
    target = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.25, 0.5, 0.5, 1.0]]), "masks": mask}]
    left = torch.full((MASK_SIZE, MASK_SIZE), -8.0)
    left[:, : MASK_SIZE // 2] = 8.0
    pixels = torch.stack([-left, left])[None]  # channel 0: the right half, channel 1: the left half
    layer = LayerOutput(torch.zeros(1, 2, NUM_CLASSES), torch.tensor([[[0.25, 0.5, 0.5, 1.0]] * 2]),
                        mask_features=MaskFeatures(pixels, torch.eye(2)[None], torch.zeros(1)))
    with_masks = HungarianMatcher(**RECIPE, class_head="sigmoid", cost_mask_ce=5.0, cost_mask_dice=5.0)
    (queries, _), = with_masks(layer, target)
    assert queries.tolist() == [1]


@pytest.mark.parametrize("pixels_dtype, queries_dtype", [(torch.float32, torch.bfloat16),
                                                         (torch.bfloat16, torch.float32),
                                                         (torch.bfloat16, torch.bfloat16)])
def test_mask_terms_of_a_bf16_model_are_computed_in_float32(pixels_dtype, queries_dtype):
    """A model trained under bf16 autocast hands the loss mask factors in bf16 or float32 (autocast's layer norms
    return float32), and the loss runs without autocast (DetrSystem.compute_losses): the mask terms read them in
    float32, equal to the terms of the same values given as float32 (a dtype error in grid_sample or einsum
    before)."""
    generator = torch.Generator().manual_seed(5)
    targets = _mask_targets(generator)
    batch, queries = len(targets), GROUPS * NUM_QUERIES
    layers = [_masked_layer(batch, queries, generator) for _ in range(LAYERS)]
    proposals = _masked_layer(batch, queries, generator)

    def outputs(mixed: bool) -> DetectorOutput:
        """The layers rounded to bf16, given in the test's dtypes (``mixed``) or as float32."""
        def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return tensor.detach().to(torch.bfloat16).to(dtype if mixed else torch.float32)

        def cast_layer(layer: LayerOutput) -> LayerOutput:
            features = layer.mask_features
            return LayerOutput(cast(layer.logits, queries_dtype), cast(layer.boxes, queries_dtype),
                               mask_features=MaskFeatures(cast(features.pixels, pixels_dtype),
                                                          cast(features.queries, queries_dtype),
                                                          cast(features.bias, torch.float32)))
        cast_layers = [cast_layer(layer) for layer in layers]
        last = cast_layers[-1]
        return DetectorOutput(last.logits, last.boxes, aux=cast_layers[:-1], proposals=cast_layer(proposals),
                              class_head="sigmoid", mask_features=last.mask_features)

    criterion = build_criterion(CONFIG.replace(instance_masks=True), **RECIPE)
    criterion.matcher = _BoxMatcher()
    torch.manual_seed(11)
    from_bf16 = criterion(outputs(True), targets)
    torch.manual_seed(11)
    from_float = criterion(outputs(False), targets)
    for name in ("loss_mask_ce", "loss_mask_dice", "loss_mask_ce_0", "loss_mask_ce_enc"):
        assert from_bf16[name].dtype == torch.float32, name
        assert torch.isfinite(from_bf16[name]), name
        assert torch.allclose(from_bf16[name], from_float[name], rtol=1e-5, atol=1e-6), name
