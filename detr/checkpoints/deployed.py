"""Files that ``detr-export`` wrote, run by a runtime behind the detector contract.

:class:`DeployedDetector` is what an exported file is to the rest of the package: a :class:`Detector`
called like the PyTorch model, ``(images, padding_mask) →`` :class:`~detr.models.outputs.DetectorOutput`, whose
categories, input contract, class head and config come from the file's metadata (the ``detr.*`` keys that
:func:`detr.checkpoints.export.metadata` writes). A runtime subclasses it and says how to run the graph
(:meth:`DeployedDetector.infer`): ONNX Runtime for ``.onnx`` (:class:`detr.checkpoints.onnx.OnnxDetector`) and
OpenVINO for ``.xml`` (:class:`detr.checkpoints.openvino.OpenVinoDetector`). :func:`open_deployed` picks the
runtime by the file's suffix; the runtimes are imported only when a file is opened, so ``import detr`` needs
neither.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from detr.categories import CategoryMap
from detr.checkpoints.formats import CheckpointError
from detr.models.config import ModelMeta
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict
from detr.models.detector import Detector
from detr.models.inputs import InputSpec
from detr.models.layers.keypoint_head import KeypointSchema
from detr.models.outputs import DetectorOutput

#: The metadata keys every exported file carries (values are JSON strings).
METADATA_KEYS = ("detr.outputs", "detr.class_head", "detr.num_classes", "detr.category_map", "detr.eval_size",
                 "detr.min_image_size", "detr.model_config")
#: Keys that files written before them lack (read as None).
OPTIONAL_METADATA_KEYS = ("detr.input_spec", "detr.precision", "detr.score_threshold", "detr.detections_per_image",
                          "detr.static_input_size", "detr.predicts_masks", "detr.keypoints")

#: Suffix of a deployed file → "module:class" of the runtime that runs it.
RUNTIMES = {".onnx": "detr.checkpoints.onnx:OnnxDetector", ".xml": "detr.checkpoints.openvino:OpenVinoDetector"}


def is_deployed(path: str | Path) -> bool:
    """Whether ``path`` names an exported file that a runtime runs (``.onnx``, ``.xml``), not a checkpoint."""
    return Path(path).suffix.lower() in RUNTIMES


def open_deployed(path: str | Path, **options: Any) -> DeployedDetector:
    """The runtime's detector for the exported file ``path`` (``options``: the runtime's own, e.g. ``device``,
    ``threads``, ``precision``)."""
    suffix = Path(path).suffix.lower()
    if suffix not in RUNTIMES:
        raise CheckpointError(f"{path} is not an exported file ({', '.join(RUNTIMES)}); load it with "
                              "detr.load_checkpoint")
    module, name = RUNTIMES[suffix].split(":")
    return getattr(importlib.import_module(module), name)(path, **options)


def decode_metadata(properties: dict[str, str], path: str | Path) -> dict[str, Any]:
    """The file's ``detr.*`` properties, JSON-decoded and keyed without the prefix. Raises
    :class:`CheckpointError` naming the file when detr-export did not write it."""
    missing = [key for key in METADATA_KEYS if key not in properties]
    if missing:
        raise CheckpointError(f"{path} lacks the DETR metadata {missing}: export it with detr-export "
                              "(detr.checkpoints.export), which records the class head, categories and input size")
    return {key.removeprefix("detr."): json.loads(properties[key]) if key in properties else None
            for key in METADATA_KEYS + OPTIONAL_METADATA_KEYS}


class DeployedDetector(Detector):
    """An exported file run by a runtime, called like the model it was exported from.

    A subclass opens the file, calls :meth:`read_metadata` with its properties, sets ``output_names`` and
    ``backend`` and implements :meth:`infer`. Attributes: ``path``, ``meta`` (:class:`ModelMeta`: category map, eval size), ``config``
    (:meth:`detr.models.config.ModelConfig.to_dict`), ``num_classes``, ``class_head``, ``postprocessed`` (the file outputs scores, labels
    and pixel boxes) and ``backend`` (the runtime, e.g. "onnxruntime (CPUExecutionProvider)"). It holds no
    torch parameters: ``.to()`` and ``.eval()`` change nothing. As a :class:`Detector` it returns no attention
    (``attention_kind`` None), masks where its model predicted instance masks (``predicts_masks`` from the
    metadata: RF-DETR's segmentation models), and does not export again.
    """

    attention_kind = None
    exportable = False
    #: the runtime's name in messages ("ONNX", "OpenVINO")
    kind = "exported"
    #: the graph's outputs, in order (set by the subclass when it opens the file)
    output_names: list[str]

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.kind} file {self.path} does not exist")

    def read_metadata(self, properties: dict[str, str]) -> None:
        """Set the model's record (categories, input contract, class head, config) from the file's properties."""
        meta = decode_metadata(properties, self.path)
        self.postprocessed = meta["outputs"] == "postprocessed"
        #: "fp32", or "int8" for a file quantised after export (:mod:`detr.inference.quantize`)
        self.weights_precision = meta["precision"] or "fp32"
        self.class_head = meta["class_head"]
        self.num_classes = int(meta["num_classes"])
        try:
            self.meta = ModelMeta(
                category_map=CategoryMap.from_dict(meta["category_map"]) if meta["category_map"] else None,
                eval_size=tuple(meta["eval_size"]) if meta["eval_size"] else None,
                score_threshold=meta["score_threshold"])
        except ValueError as error:  # a threshold of 5 or NaN used as the validated one found nothing, silently
            raise CheckpointError(f"{self.path}: its DETR metadata is not valid ({error}); export the checkpoint "
                                  "again with detr-export") from None
        self._input_spec = (InputSpec(**{key: tuple(value) if isinstance(value, list) else value
                                         for key, value in meta["input_spec"].items()})
                            if meta["input_spec"] else None)
        self._min_image_size = int(meta["min_image_size"])
        #: the top-k post-processing of the real-time DETRs (None: one detection per query)
        self._detections_per_image = meta["detections_per_image"]
        #: (height, width) of the only image size the file takes (a fixed-square model's), or None: any size
        self.static_input_size = tuple(meta["static_input_size"]) if meta["static_input_size"] else None
        #: the file outputs mask logits after the boxes (pred_masks; post-processed: mask_logits)
        self.predicts_masks = bool(meta["predicts_masks"])
        keypoints = meta["keypoints"]
        if keypoints:  # the file outputs a keypoint model's raw keypoints last (pred_keypoints; post-processed:
            # keypoints of the kept pairs)
            try:
                self.keypoint_schema = KeypointSchema(tuple(int(n) for n in keypoints["num_keypoints_per_class"]))
                self.keypoint_trace_alpha = float(keypoints["trace_alpha"])
            except (KeyError, TypeError, ValueError) as error:
                raise CheckpointError(f"{self.path}: its DETR metadata's keypoints are not valid ({error}); export "
                                      "the checkpoint again with detr-export") from None
        # files of models built without build_detr record no config: the class head and class count are all
        # the predictor needs, and they are recorded on their own
        self.config = (config_from_dict(meta["model_config"], where=str(self.path)) if meta["model_config"]
                       else DetrConfig(num_classes=self.num_classes, class_head=self.class_head))
        self.num_queries = self.config.num_queries

    @property
    def input_spec(self) -> InputSpec:
        return self._input_spec if self._input_spec is not None else super().input_spec

    @property
    def min_image_size(self) -> int:
        return self._min_image_size

    @property
    def detections_per_image(self) -> int | None:
        return self._detections_per_image

    @property
    def stride(self) -> int:
        raise ValueError(f"{self.path.name} keeps no feature maps (an exported file holds the predictions only): "
                         "use the PyTorch checkpoint for attention maps")

    def describe(self) -> str:
        return f"{super().describe()}, {self.backend}" if self.config is not None else self.backend

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> DeployedDetector:
        """Nothing to do: the runtime optimises the graph when it opens the file (the export folded the frozen
        BatchNorms already)."""
        return self

    def forward(self, images: Tensor, padding_mask: Tensor, return_attention: bool = False,
                targets: list[dict[str, Tensor]] | None = None) -> DetectorOutput:
        """images float [B, 3, H, W] (prepared by :attr:`input_spec`), padding_mask bool [B, H, W] (True =
        padding) → :class:`DetectorOutput` (logits and boxes of the last layer, and masks where the model predicts
        them, CPU tensors) as the PyTorch model's forward (no aux layers; ``targets`` are not read). A file exported
        with post-processing runs through :meth:`detect` instead."""
        if return_attention:
            raise ValueError(f"attention maps are not available from the {self.kind} file {self.path.name}: the "
                             "export keeps only the predictions. Use the PyTorch checkpoint for attention figures")
        if self.postprocessed:
            raise ValueError(f"{self.path.name} was exported with post-processing: it needs orig_sizes [B, 2] and "
                             f"returns scores, labels and pixel boxes ({type(self).__name__}.detect). "
                             "detr.Predictor post-processes itself: export without --postprocess for it")
        logits, boxes, *rest = self._run(images, padding_mask)
        masks = rest.pop(0) if self.predicts_masks else None
        keypoints = rest.pop(0) if self.keypoint_schema is not None else None
        return DetectorOutput(logits, boxes, class_head=self.class_head, masks=masks, keypoints=keypoints)

    def detect(self, images: Tensor, padding_mask: Tensor, orig_sizes: Tensor) -> dict[str, Tensor]:
        """A file exported with post-processing: images and padding_mask as :meth:`forward`, orig_sizes int64
        [B, 2] (height, width) → {"scores" [B, Q], "labels" int64 [B, Q], "boxes" [B, Q, 4] pixel xyxy}, and
        "mask_logits" [B, Q, H / 4, W / 4] where the model predicts masks; Q is :attr:`detections_per_image` where the
        model has it (the best (query, class) pairs, best first)."""
        if not self.postprocessed:
            raise ValueError(f"{self.path.name} was exported without post-processing: call it with images and "
                             f"padding_mask only ({type(self).__name__}(...)(images, padding_mask))")
        return dict(zip(self.output_names, self._run(images, padding_mask, orig_sizes)))

    def _run(self, images: Tensor, padding_mask: Tensor, orig_sizes: Tensor | None = None) -> list[Tensor]:
        if self.static_input_size is not None and tuple(images.shape[-2:]) != self.static_input_size:
            height, width = self.static_input_size
            raise ValueError(f"{self.path.name} takes images of {height} × {width} pixels only (its model's input "
                             f"contract is a fixed square: resize with its input_spec, as detr.Predictor does), got "
                             f"{tuple(images.shape[-2:])}")
        min_size = self.min_image_size
        if images.shape[-2] < min_size or images.shape[-1] < min_size:
            raise ValueError(f"{self.path.name} takes images of at least {min_size} × {min_size} pixels "
                             f"(a feature map of 2 × 2), got {tuple(images.shape[-2:])}")
        feeds = {"images": images.detach().float().cpu().numpy(),
                 "padding_mask": padding_mask.detach().bool().cpu().numpy()}
        if orig_sizes is not None:
            feeds["orig_sizes"] = orig_sizes.detach().long().cpu().numpy()
        return [torch.from_numpy(np.asarray(value)) for value in self.infer(feeds)]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the graph on named numpy inputs; its outputs in :attr:`output_names` order."""
        raise NotImplementedError
