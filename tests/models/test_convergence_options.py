"""The options for training from scratch on a short budget (docs/measurements/convergence.md): off by default (the
paper's model unchanged), composable, checkpointable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lightning as L
import pytest
import torch

from detr import build_detr
from detr.checkpoints import load_checkpoint
from detr.data.images import load_rgb_image
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from detr.inference.postprocess import PostProcess
from detr.loss.build import build_criterion
from detr.loss.criterion import SetCriterion
from detr.models.detr_family import DetrConfig
from detr.models.detr import DETR
from tests.helpers import load_script, tiny_config_with

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: 2 threads on shared cores are 10x slower

TINY = tiny_config_with(dropout=0.0)
LAYOUT = Path(__file__).resolve().parents[1] / "data" / "official_detr_state_dict_layout.json"


def _batch(size: int = 64):
    torch.manual_seed(1)
    images = torch.randn(2, 3, size, size)
    mask = torch.zeros(2, size, size, dtype=torch.bool)
    mask[1, :, size * 3 // 4:] = True
    targets = [{"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.4, 0.5, 0.3, 0.4]])}]
    return images, mask, targets


def test_default_model_keeps_the_authors_layout_and_outputs():
    layout = json.loads(LAYOUT.read_text())["resnet18"]
    model = build_detr(backbone="resnet18", num_classes=91)
    assert {k: list(v.shape) for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")} == layout
    # the paper's model class (the anchor-query family, with its denoising queries, is AnchorDETR)
    assert type(model) is DETR and model.query_type == "learned" and model.class_head == "softmax"
    # the options at their defaults are the same model: same weights, same outputs, targets ignored
    torch.manual_seed(0)
    plain = build_detr(TINY)
    torch.manual_seed(0)
    explicit = build_detr(TINY, query_type="learned", class_head="softmax", denoising=False)
    for (name, a), (other, b) in zip(plain.state_dict().items(), explicit.state_dict().items()):
        assert name == other and torch.equal(a, b)
    images, mask, targets = _batch()
    plain.train()
    explicit.train()
    out = plain(images, mask)
    out_with_targets = explicit(images, mask, targets=targets)
    assert len(out.aux) == 1 and out.denoising is None and out.dense is None
    assert out.logits.shape == (2, 10, 6)  # num_classes + 1: the last logit is "no object"
    assert torch.equal(out.logits, out_with_targets.logits)
    assert torch.equal(out.boxes, out_with_targets.boxes)
    assert SetCriterion(5).weight_dict == {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, **{
        f"{n}_{i}": w for i in range(5) for n, w in (("loss_ce", 1.0), ("loss_bbox", 5.0), ("loss_giou", 2.0))}}


# Every option in both states, each query/class-head pair once, backbones varied across them.
COMBINATIONS = [
    dict(query_type="learned", class_head="softmax", denoising=False, backbone_norm="frozen_batch_norm",
         backbone_last_stage="layer4"),
    dict(query_type="learned", class_head="sigmoid", denoising=False, backbone_norm="group_norm",
         backbone_last_stage="layer3"),
    dict(query_type="anchor", class_head="softmax", denoising=False, backbone_norm="batch_norm",
         backbone_last_stage="layer3"),
    dict(query_type="anchor", class_head="sigmoid", denoising=False, backbone_norm="frozen_batch_norm",
         backbone_last_stage="layer4"),
    dict(query_type="anchor", class_head="softmax", denoising=True, backbone_norm="group_norm",
         backbone_last_stage="layer4"),
    dict(query_type="anchor", class_head="sigmoid", denoising=True, backbone_norm="batch_norm",
         backbone_last_stage="layer3"),
]


@pytest.mark.parametrize("options", COMBINATIONS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_options_compose_train_and_predict(options):
    torch.manual_seed(0)
    trainable = 5 if options["backbone_norm"] != "frozen_batch_norm" else 3
    config = TINY.replace(**options, backbone_trainable_layers=trainable)
    model = build_detr(config).train()
    criterion = build_criterion(config)
    images, mask, targets = _batch()
    out = model(images, mask, targets=targets)
    logits = 5 if options["class_head"] == "sigmoid" else 6
    assert out.logits.shape == (2, 10, logits) and out.boxes.shape == (2, 10, 4)
    assert (out.denoising is not None) == options["denoising"]
    losses = criterion(out, targets)
    total = sum(losses[name] * weight for name, weight in criterion.weight_dict.items())
    assert torch.isfinite(total)
    total.backward()
    without_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert without_grad == []
    model.eval()
    with torch.no_grad():
        detections = PostProcess(class_head=model.class_head)(model(images, mask), torch.tensor([[64, 64], [64, 48]]))
    assert detections[0]["scores"].shape == (10,) and ((detections[0]["scores"] >= 0) & (detections[0]["scores"] <= 1)).all()
    assert detections[0]["labels"].max() < 5


def test_backbone_options_for_training_from_scratch():
    torch.manual_seed(0)
    model = build_detr(TINY, backbone_norm="batch_norm", backbone_trainable_layers=5, backbone_last_stage="layer3")
    body = model.backbone[0]
    assert all(p.requires_grad for p in body.parameters())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in body.modules())
    features, feature_mask = body(torch.randn(2, 3, 128, 128), torch.zeros(2, 128, 128, dtype=torch.bool))
    assert features.shape == (2, 256, 8, 8) and body.stride == 16  # layer3 of ResNet-18: 256 channels
    assert not any(k.startswith("backbone.0.body.layer4") for k in model.state_dict())


def test_bfloat16_backbone_returns_float32_features_close_to_float32_and_trains():
    torch.manual_seed(0)
    model = build_detr(TINY, backbone_norm="batch_norm", backbone_trainable_layers=5, backbone_last_stage="layer3")
    body = model.backbone[0]
    images, mask = torch.randn(2, 3, 128, 128), torch.zeros(2, 128, 128, dtype=torch.bool)
    reference, _ = body(images, mask)
    body.use_autocast(torch.bfloat16)
    features, _ = body(images, mask)
    assert features.dtype == torch.float32 and body.body.conv1.weight.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: about 1 % of the features' scale after 3 stages
    assert (features - reference).abs().max() < 0.05 * reference.abs().max()
    assert (features - reference).abs().max() > 0  # it did run in bfloat16
    features.square().mean().backward()
    assert body.body.conv1.weight.grad is not None and body.body.conv1.weight.grad.dtype == torch.float32
    body.use_autocast(None)  # off again: an enclosing autocast is left to apply
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert body(images, mask)[0].dtype == torch.bfloat16


def test_options_are_validated():
    with pytest.raises(ValueError, match="query_type"):
        build_detr(TINY, query_type="anchors")
    with pytest.raises(ValueError, match="class_head"):
        build_detr(TINY, class_head="focal")
    with pytest.raises(ValueError, match="query_type='anchor'"):
        build_detr(TINY, denoising=True)
    with pytest.raises(ValueError, match="pre_norm"):
        build_detr(TINY, query_type="anchor", pre_norm=True)
    with pytest.raises(ValueError, match="denoising_groups"):
        build_detr(TINY, query_type="anchor", denoising=True, denoising_groups=0)


def test_checkpoint_round_trip_keeps_the_options(tmp_path):
    torch.manual_seed(0)
    model = build_detr(TINY, query_type="anchor", class_head="sigmoid", denoising=True,
                       backbone_norm="group_norm", backbone_trainable_layers=5, backbone_last_stage="layer3")
    path = tmp_path / "own.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "detr": {"model_config": model.config.to_dict(), "category_map": None}}, path)
    loaded = load_checkpoint(path)
    assert loaded.query_type == "anchor" and loaded.class_head == "sigmoid" and loaded.denoising is not None
    images, mask, _ = _batch()
    model.eval()
    with torch.no_grad():
        expected, got = model(images, mask), loaded(images, mask)
    torch.testing.assert_close(got.logits, expected.logits)
    torch.testing.assert_close(got.boxes, expected.boxes)


def _load_benchmark():
    return load_script("benchmarks/convergence.py")


#: a tiny model for the benchmark's runs (64-px images of tiny_shapes_root)
TINY_RUN = ["detr.hidden_dim=32", "num_heads=2", "dim_feedforward=64", "num_encoder_layers=1", "num_decoder_layers=2",
            "batch_size=4"]


def test_convergence_benchmark_options_route_to_the_model_the_system_and_the_trainer():
    benchmark = _load_benchmark()
    config = benchmark.build_run_config("best", ["detr.num_queries=30", "hidden_dim=64", "lr=2e-4", "batch_size=4",
                                                 "precision=bf16-mixed", "lr_drop_epochs=[3]"])
    assert (config.detr.num_queries, config.detr.hidden_dim, config.detr.query_type) == (30, 64, "anchor")
    assert config.system["lr"] == 2e-4 and config.system["lr_drop_epochs"] == [3]
    assert config.system["lr_decay_fraction"] == 0.3 and config.batch_size == 4 and config.precision == "bf16-mixed"
    # the model's options exist once, in DetrConfig: no RunConfig field repeats them
    assert not {f.name for f in dataclasses.fields(benchmark.RunConfig)} & {f.name for f in dataclasses.fields(DetrConfig)}
    for preset in benchmark.PRESETS:  # every preset is a valid DetrConfig and DetrSystem arguments
        built = benchmark.build_run_config(preset, [])
        assert set(built.system) <= benchmark.system_arguments()
    with pytest.raises(SystemExit, match="detr.NAME"):
        benchmark.build_run_config("paper", ["num_querys=3"])
    with pytest.raises(ValueError, match="query_type"):
        benchmark.build_run_config("paper", ["detr.denoising=true"])  # DetrConfig's own check


def test_convergence_benchmark_runs_and_reports(tiny_shapes_root, tmp_path, capsys):
    benchmark = _load_benchmark()
    config = benchmark.build_run_config("best", [*TINY_RUN, "ema_decay=0.9"])
    curve = benchmark.run(config, tiny_shapes_root, minutes=1e-4, eval_every=1.0, name="smoke",
                          jsonl=tmp_path / "runs.jsonl", image_size=64)
    # the budget (6 ms) is spent by the first step: the count is fixed at 1, then the last validation
    assert len(curve) == 1 and curve[0]["step"] == 1 and 0 <= curve[0]["AP50"] <= 1
    assert 0 <= curve[0]["AP50_agnostic"] <= 1 and curve[0]["images_per_s"] > 0
    assert "EMA AP" in capsys.readouterr().out  # validation scores the averaged weights
    point = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])
    assert point["run"] == "smoke" and point["config"]["detr"]["hidden_dim"] == 32


def test_convergence_benchmark_step_budget_decays_the_learning_rate_to_zero(tiny_shapes_root, monkeypatch):
    benchmark = _load_benchmark()
    config = benchmark.build_run_config("best", [*TINY_RUN, "warmup_steps=0", "lr_decay_fraction=0.5"])
    lrs = []

    class Recorder(L.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    make_trainer = benchmark.make_trainer
    monkeypatch.setattr(benchmark, "make_trainer",
                        lambda config, callbacks, *args, **kwargs: make_trainer(config, [*callbacks, Recorder()],
                                                                                 *args, **kwargs))
    curve = benchmark.run(config, tiny_shapes_root, minutes=1e3, eval_every=1e3, name="steps", jsonl=None,
                          max_steps=4, image_size=64)
    assert [point["step"] for point in curve] == [4]  # the step budget ends the run, evaluated once at its end
    lr = config.system["lr"]
    assert lrs == pytest.approx([lr, lr, lr, lr * 0.5])  # steps 0..3 of 4: constant for half, then linear
    assert curve[-1]["lr"] == 0.0  # and zero after the last step


def test_shape_classifier_crops_every_object_inside_the_image(tiny_shapes_root, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import shape_classifier

    annotations = json.loads((tiny_shapes_root / "annotations" / "instances_train2017.json").read_text())
    crops, labels = shape_classifier.object_crops(tiny_shapes_root, "train2017", limit=1000)
    assert crops.shape == (len(annotations["annotations"]), 3, 48, 48) and labels.max() < 5
    # the first object's crop is the image patch around its centre, clamped into the 64-px image
    first = min(annotations["annotations"], key=lambda a: (a["image_id"], a["id"]))
    file_name = next(i["file_name"] for i in annotations["images"] if i["id"] == first["image_id"])
    image = torch.from_numpy(load_rgb_image(tiny_shapes_root / "train2017" / file_name)).permute(2, 0, 1).float() / 255
    x, y, w, h = first["bbox"]
    x0, y0 = min(max(int(x + w / 2) - 24, 0), 16), min(max(int(y + h / 2) - 24, 0), 16)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    torch.testing.assert_close(crops[0], (image[:, y0:y0 + 48, x0:x0 + 48] - mean) / std)
