"""hubconf.py through torch.hub.load(source="local") itself, as users call it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from detr import DETR, CategoryMap, PostProcess

ROOT = str(Path(__file__).resolve().parents[2])


def test_entry_points_are_the_authors_names():
    spec = importlib.util.spec_from_file_location("hubconf_under_test", Path(ROOT) / "hubconf.py")
    hubconf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hubconf)
    assert {"torch", "torchvision"} <= set(hubconf.dependencies)
    for name in ("detr_resnet50", "detr_resnet50_dc5", "detr_resnet101", "detr_resnet101_dc5",
                 "detr_resnet50_panoptic", "detr_resnet50_dc5_panoptic", "detr_resnet101_panoptic"):
        assert callable(getattr(hubconf, name))


def test_untrained_r50_with_postprocessor():
    model, postprocess = torch.hub.load(ROOT, "detr_resnet50", source="local", pretrained=False,
                                        return_postprocessor=True)
    assert isinstance(model, DETR) and isinstance(postprocess, PostProcess)
    assert model.config.backbone == "resnet50" and not model.config.dilation
    assert model.num_classes == 91 and model.meta.category_map == CategoryMap.coco()
    model.eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 96), torch.zeros(1, 64, 96, dtype=torch.bool))
    assert out.logits.shape == (1, 100, 92) and out.aux == []  # as the authors' hub model
    results = postprocess(out, torch.tensor([[480, 640]]))
    assert results[0]["boxes"].shape == (100, 4)


def test_dc5_and_num_classes():
    model = torch.hub.load(ROOT, "detr_resnet50_dc5", source="local", pretrained=False, num_classes=20)
    assert model.backbone[0].stride == 16 and model.config.dilation
    assert model.class_embed.out_features == 21 and model.meta.category_map is None


def test_pretrained_weights_need_coco_classes():
    with pytest.raises(ValueError, match="predicts 91 classes"):
        torch.hub.load(ROOT, "detr_resnet101", source="local", pretrained=True, num_classes=5)


def test_untrained_panoptic_r50_with_its_postprocessor():
    from detr import DETRPanoptic
    from detr.inference.postprocess_masks import PostProcessPanoptic

    model, postprocess = torch.hub.load(ROOT, "detr_resnet50_panoptic", source="local", pretrained=False,
                                        threshold=0.5, return_postprocessor=True)
    assert isinstance(model, DETRPanoptic) and isinstance(postprocess, PostProcessPanoptic)
    assert model.num_classes == 250 and postprocess.threshold == 0.5
    assert model.meta.is_thing[1] and not model.meta.is_thing[200]  # COCO panoptic: thing ids <= 90, stuff above
    model.eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 96), torch.zeros(1, 64, 96, dtype=torch.bool))
    assert out.logits.shape == (1, 100, 251) and out.masks.shape == (1, 100, 16, 24)
