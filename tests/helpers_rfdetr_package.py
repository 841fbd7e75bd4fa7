"""The rfdetr package's model code (roboflow/rf-detr), for parity tests: never a dependency of this project. The
keypoint tests pass with 1.8.0 (the first with ``RFDETRKeypointPreview``) and 1.11.2; where the two differ, they
follow 1.11.2 and say so.

``make setup`` installs a copy, without its dependencies, in ``.venv/rfdetr_package`` (found here without
setting anything); elsewhere install a throwaway copy and point at it (the tests that need it skip without it)::

    pip install --no-deps --target /tmp/rfdetr_pkg rfdetr==1.8.0
    RFDETR_PACKAGE_DIR=/tmp/rfdetr_pkg pytest tests/models/test_keypoint_head.py   # or put the folder on PYTHONPATH

Only its model modules are imported, not ``rfdetr/__init__`` (which loads its training and download stack), as
benchmarks/rfdetr_package_parity.py does; ``requests`` is replaced by an empty module when missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

import pytest


def rfdetr_module(name: str) -> types.ModuleType:
    """``rfdetr.<name>`` (e.g. ``models.transformer``) of the package, or skip the test when it is not installed
    (on the path, or in the folder ``RFDETR_PACKAGE_DIR`` names) or has no keypoint model (before 1.8.0)."""
    if "rfdetr" not in sys.modules:
        locations = None
        spec = importlib.util.find_spec("rfdetr")
        if spec is not None and spec.submodule_search_locations:
            locations = list(spec.submodule_search_locations)
        else:
            root = os.environ.get("RFDETR_PACKAGE_DIR") or os.path.join(sys.prefix, "rfdetr_package")
            folder = os.path.join(root, "rfdetr")
            locations = [folder] if os.path.isdir(folder) else None
        if locations is None:
            pytest.skip("the rfdetr package is not installed: pip install --no-deps --target DIR rfdetr==1.8.0 and "
                        "set RFDETR_PACKAGE_DIR=DIR")
        if importlib.util.find_spec("requests") is None:
            sys.modules["requests"] = types.ModuleType("requests")
        package = types.ModuleType("rfdetr")
        package.__path__ = locations
        sys.modules["rfdetr"] = package
    try:
        return importlib.import_module(f"rfdetr.{name}")
    except ModuleNotFoundError as error:
        pytest.skip(f"the installed rfdetr package has no {name} ({error}): install rfdetr>=1.8.0")


#: A tiny DINOv2 in place of the package's smallest (ViT-S): the package reads its sizes from a JSON file per size.
TINY_VIT = {"hidden_size": 64, "num_attention_heads": 1, "num_hidden_layers": 4}


def package_config(name: str, **fields: Any) -> Any:
    """The package's config class ``name`` (``rfdetr.config.RFDETRKeypointPreviewConfig`` ...) with ``fields``, its
    warnings silenced: a warning class of the package (``PretrainWeightsCompatibilityWarning``) reaching pytest-xdist's
    controller, which cannot import ``rfdetr``, takes the whole test run down."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(rfdetr_module("config"), name)(**fields)


def package_keypoint_model(counts: Sequence[int], *, num_classes: int = 4, seed: int = 0, **changes: Any):
    """The package's own ``RFDETRKeypointPreview`` (its ``LWDETR`` built by ``build_model_from_config``) in a tiny
    size, random weights: a 64-wide 4-block DINOv2 (patch 12, 2 × 2 windows, 48-pixel position table), a 32-wide
    decoder of 2 layers, 3 query groups of 10 queries, ``num_classes`` + 1 logits, keypoints ``counts`` per class,
    the second projector for the keypoints' cross-attention; ``changes``: other ``ModelConfig`` fields. Returns
    (model in eval mode, the package's ``ModelConfig``)."""
    lwdetr, dinov2 = (rfdetr_module(name) for name in ("models.lwdetr", "models.backbone.dinov2"))
    fields = {"num_keypoints_per_class": list(counts), "num_classes": num_classes, "hidden_dim": 32, "sa_nheads": 4,
              "ca_nheads": 8, "dec_layers": 2, "num_queries": 10, "num_select": 10, "resolution": 48,
              "positional_encoding_size": 4, "out_feature_indexes": [1, 2, 4], "pretrain_weights": None,
              "group_detr": 3, "device": "cpu", **changes}
    config = package_config("RFDETRKeypointPreviewConfig", **fields)
    read_config, width = dinov2.get_config, dinov2.size_to_width["small"]
    dinov2.get_config = lambda size, registers: {**read_config(size, registers), **TINY_VIT}
    dinov2.size_to_width["small"] = TINY_VIT["hidden_size"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = lwdetr.build_model_from_config(config)
    finally:
        dinov2.get_config, dinov2.size_to_width["small"] = read_config, width
    from tests.helpers import randomise
    randomise(model, seed)
    for layer in model.transformer.decoder.layers:  # so that the object query's share of the attention shows
        layer.instance_kp_layer_scale.data.fill_(0.5)
    return model.eval(), config
