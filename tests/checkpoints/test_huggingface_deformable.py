"""Hugging Face transformers Deformable DETR directories in and out: the same outputs as transformers itself
on a padded batch of two real photos, for the four variants (plain, box refinement, refinement + two-stage,
single-scale), timm and transformers ResNet backbones and several label counts; and back out again."""

from __future__ import annotations

import logging

import pytest
import torch

from detr.models.deformable.config import DeformableConfig
import detr
from detr.checkpoints import CheckpointError
from detr.checkpoints.huggingface_deformable import save_pretrained_deformable, to_huggingface_state_dict
from tests.helpers import RESNET_SPECS, detr_outputs, huggingface_outputs, padded_photo_batch, randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")
pytest.importorskip("safetensors")

TOLERANCE = 1e-4
TINY = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_n_points=2, decoder_n_points=2, num_queries=12,
            two_stage_num_proposals=12, dropout=0.0)
@pytest.fixture(scope="module")
def photo_batch():
    return padded_photo_batch()


VARIANTS = {"plain": dict(), "box_refine": dict(with_box_refine=True),
            "two_stage": dict(with_box_refine=True, two_stage=True), "single_scale": dict(num_feature_levels=1)}


def _hf_model(variant: str, num_labels: int, backbone: str = "resnet18", *, timm: bool = True, seed: int = 0):
    options = dict(TINY, **VARIANTS[variant], num_labels=num_labels,
                   id2label={i: f"thing {i}" for i in range(num_labels)})
    if timm:
        config = transformers.DeformableDetrConfig(backbone=backbone, use_timm_backbone=True,
                                                   use_pretrained_backbone=False, **options)
    else:
        layer_type, depths, widths = RESNET_SPECS[backbone]
        stages = ["stage2", "stage3", "stage4"] if options.get("num_feature_levels", 4) > 1 else ["stage4"]
        resnet = transformers.ResNetConfig(layer_type=layer_type, depths=depths, hidden_sizes=widths,
                                           out_features=stages)
        config = transformers.DeformableDetrConfig(backbone_config=resnet, use_timm_backbone=False,
                                                   use_pretrained_backbone=False, **options)
    torch.manual_seed(seed)
    model = transformers.DeformableDetrForObjectDetection(config).eval()
    randomise(model, seed)
    return model


def _differences(ours, theirs) -> tuple[float, float]:
    (logits, boxes), (hf_logits, hf_boxes) = ours, theirs
    assert logits.shape == hf_logits.shape and boxes.shape == hf_boxes.shape
    assert boxes[0].std(dim=0).max() > 1e-3  # queries differ: the comparison is not between constants
    return float((logits - hf_logits).abs().max()), float((boxes - hf_boxes).abs().max())


@pytest.mark.parametrize("variant, backbone, timm, num_labels", [
    ("plain", "resnet18", True, 5),
    ("box_refine", "resnet18", True, 3),
    ("two_stage", "resnet18", True, 91),
    ("single_scale", "resnet18", True, 2),
    ("plain", "resnet18", False, 4),
    ("box_refine", "resnet50", False, 1),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photo_batch, variant, backbone, timm,
                                                            num_labels):
    hf = _hf_model(variant, num_labels, backbone, timm=timm)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.family, config.backbone, config.num_classes) == ("deformable", backbone, num_labels)
    assert (config.box_refine, config.two_stage) == (hf.config.with_box_refine, hf.config.two_stage)
    assert config.num_feature_levels == hf.config.num_feature_levels and config.num_queries == 12
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    logits_diff, boxes_diff = _differences(detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch))
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    # and out again: transformers builds the same model from the directory this project writes
    backbone_format = "timm" if timm else "transformers"
    save_pretrained_deformable(model, tmp_path / "again", backbone_format=backbone_format)
    again = transformers.DeformableDetrForObjectDetection.from_pretrained(tmp_path / "again").eval()
    assert again.config.id2label == hf.config.id2label
    logits_diff, boxes_diff = _differences(huggingface_outputs(again, *photo_batch), huggingface_outputs(hf, *photo_batch))
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_distinct_heads_per_layer_load_and_round_trip(tmp_path, photo_batch):
    """A file with a class head per decoder layer (the authors' box-refinement release) keeps them distinct,
    as transformers does when the file holds them, and writes them all back."""
    hf = _hf_model("box_refine", 3, seed=2)
    hf.class_embed[1] = torch.nn.Linear(64, 3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        hf.class_embed[1].weight.copy_(torch.randn(3, 64, generator=generator) / 8)
    hf.save_pretrained(tmp_path)
    again_hf = transformers.DeformableDetrForObjectDetection.from_pretrained(tmp_path).eval()
    assert not torch.equal(again_hf.class_embed[0].weight, again_hf.class_embed[1].weight)
    model = detr.load_checkpoint(tmp_path)
    assert not torch.equal(model.class_embed[0].weight, model.class_embed[1].weight)
    logits_diff, boxes_diff = _differences(detr_outputs(model, *photo_batch), huggingface_outputs(again_hf, *photo_batch))
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE
    exported = to_huggingface_state_dict(model)
    assert torch.equal(exported["class_embed.1.weight"], model.class_embed[1].weight)
    assert torch.equal(exported["model.decoder.bbox_embed.1.layers.0.weight"], exported["bbox_embed.1.layers.0.weight"])


def test_a_deformable_directory_without_weights_is_explained(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "deformable_detr"}')
    with pytest.raises(CheckpointError, match="no weights"):
        detr.load_checkpoint(tmp_path)


def test_a_two_stage_file_without_refinement_is_refused(tmp_path):
    hf = _hf_model("plain", 2)
    hf.save_pretrained(tmp_path)
    config = (tmp_path / "config.json").read_text().replace('"two_stage": false', '"two_stage": true')
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match="two_stage without with_box_refine"):
        detr.load_checkpoint(tmp_path)


def test_detr_convert_writes_a_deformable_checkpoint_for_transformers(tmp_path, photo_batch, capsys):
    from detr.checkpoints import save_checkpoint
    from detr.commands import convert

    hf = _hf_model("box_refine", 4, seed=3)
    hf.save_pretrained(tmp_path / "hf")
    checkpoint = save_checkpoint(detr.load_checkpoint(tmp_path / "hf"), tmp_path / "model.ckpt")
    assert convert.main([str(checkpoint), "--to-huggingface", str(tmp_path / "out")]) == 0
    again = transformers.DeformableDetrForObjectDetection.from_pretrained(tmp_path / "out").eval()
    logits_diff, boxes_diff = _differences(huggingface_outputs(again, *photo_batch), huggingface_outputs(hf, *photo_batch))
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_box_refinement_model_with_its_own_head_per_layer_loads_in_transformers_quietly(tmp_path, photo_batch):
    """Box refinement trains a class head per decoder layer; transformers ties them all to the first unless
    config.json says tie_word_embeddings: false, so loading a converted model warned once per tensor that it
    would NOT tie them ("You should update the config with `tie_word_embeddings=False`"). The directory now
    says so, transformers loads it without a word and with the same outputs."""
    config = DeformableConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=64, num_heads=4,
                              num_encoder_layers=1, num_decoder_layers=3, dim_feedforward=32, num_queries=12,
                              num_points=2, num_classes=3, box_refine=True)
    torch.manual_seed(0)
    model = detr.build_detr(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as training leaves them: each layer's heads its own
        for parameter in [*model.class_embed.parameters(), *model.bbox_embed.parameters()]:
            parameter.add_(torch.randn(parameter.shape, generator=generator) / 10)
    save_pretrained_deformable(model, tmp_path)
    records = _Records()
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(records)
    try:
        hf = transformers.DeformableDetrForObjectDetection.from_pretrained(tmp_path).eval()
    finally:
        transformers_logger.removeHandler(records)
    assert not [m for m in records.messages if "tie" in m], records.messages
    assert not torch.equal(hf.class_embed[0].weight, hf.class_embed[1].weight)
    logits_diff, boxes_diff = _differences(detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch))
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_detr_convert_keeps_the_data_sets_category_ids(tmp_path):
    """Labels 0..K-1 are all transformers has: the ids the model was trained on go beside them in config.json
    and come back when the directory is loaded (they were lost: label 2 predicted where the checkpoint said 3)."""
    from detr.categories import CategoryMap
    from detr.checkpoints import save_checkpoint
    from detr.commands import convert
    from detr.models.config import ModelMeta

    _hf_model("plain", 4, seed=3).save_pretrained(tmp_path / "hf")
    model = detr.load_checkpoint(tmp_path / "hf")
    category_map = CategoryMap((1, 3, 5, 8), ("a", "b", "c", "d"))
    model.meta = ModelMeta(category_map=category_map)
    checkpoint = save_checkpoint(model, tmp_path / "model.ckpt")
    assert convert.main([str(checkpoint), "--to-huggingface", str(tmp_path / "out")]) == 0
    assert detr.load_checkpoint(tmp_path / "out").meta.category_map == category_map


@pytest.mark.parametrize("edit", [{"encoder_ffn_dim": 256, "decoder_ffn_dim": 256}, {"d_model": 128},
                                  {"encoder_n_points": 3, "decoder_n_points": 3}])
def test_a_config_json_that_contradicts_its_weights_is_named(tmp_path, edit):
    """A config.json of another model beside the weights printed torch's 21 size mismatches, naming neither
    config.json nor the sizes it states."""
    import json

    _hf_model("plain", 2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(CheckpointError) as refusal:
        detr.load_checkpoint(tmp_path)
    message = str(refusal.value)
    assert message.startswith(f"{tmp_path / 'config.json'} does not fit the weights")
    key = next(iter(edit))
    assert f"{key} {edit[key]} (config.json) vs {config[key]} (weights)" in message
    assert "size mismatch" not in message
