"""DEIMv2 weights in and out of transformers' ``deimv2`` directories (``Deimv2ForObjectDetection``), HGNetV2
backbones only.

A directory as ``Deimv2ForObjectDetection.save_pretrained`` writes it (``config.json`` of model_type "deimv2",
``model.safetensors``, ``preprocessor_config.json``) reads into this project's D-FINE class with DEIMv2's parts
(``architecture="deimv2"``): the hybrid encoder (the N model) or the lite encoder (``encoder_type`` "lite"), the gate
or not (``use_gateway``), ReLU or SiLU query positions (``decoder_activation_function``). The renames are D-FINE's
(:mod:`detr.checkpoints.dfine`) but for the backbone and input projections under ``model.conv_encoder``, the
fusion blocks (transformers' names here too) and the SwiGLU ``mlp`` (``ffn`` here): :data:`DEIMV2_KEYS`,
:data:`DEIMV2_LITE_KEYS`. Refused with one line naming config.json: the DINOv3 backbones (S-X), a shared box
head, fusion blocks without the trailing convolution, and D-FINE's own refusals. transformers is never imported.
"""

from __future__ import annotations

from pathlib import Path

from detr.categories import CategoryMap
from detr.checkpoints.dfine import (
    DEIMV2_KEYS,
    DEIMV2_LITE_KEYS,
    read_huggingface_family,
    write_huggingface_family,
)
from detr.checkpoints.formats import CheckpointContents, ExportError
from detr.checkpoints.huggingface import _read_json
from detr.models.dfine.model import DFINE

MODEL_TYPE = "deimv2"


def is_deimv2_directory(directory: str | Path) -> bool:
    """Whether ``directory`` holds a config.json of model_type "deimv2"."""
    path = Path(directory) / "config.json"
    return path.is_file() and _read_json(path).get("model_type") == MODEL_TYPE


def read_huggingface_deimv2(directory: str | Path) -> CheckpointContents:
    """Read a transformers ``Deimv2ForObjectDetection`` directory (HGNetV2 backbone) into this project's layout and
    a ``DetrConfig(architecture="deimv2", ...)``.

    Raises:
        CheckpointError: a DINOv3 backbone or other settings this project does not build, keys without a
            counterpart.
    """
    return read_huggingface_family(directory, "deimv2")


def save_pretrained_deimv2(model: DFINE, directory: str | Path, *, category_map: CategoryMap | None = None,
                           backbone_format: str | None = None) -> Path:
    """Write ``model`` (``architecture="deimv2"``) as ``Deimv2ForObjectDetection.save_pretrained`` would.
    ``backbone_format`` is not read (the backbone is HGNetV2)."""
    if model.config is None or model.config.architecture != "deimv2":
        raise ExportError("save_pretrained_deimv2 needs a DEIMv2 built by build_detr (architecture='deimv2')")
    keys = DEIMV2_LITE_KEYS if model.config.lite_encoder else DEIMV2_KEYS
    return write_huggingface_family(model, directory, category_map=category_map, keys=keys)
