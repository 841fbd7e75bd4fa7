"""The detector contract: what every detector of this package, and every backend that runs one, is.

:class:`Detector` is the one base every model meets: the paper's DETR and the anchor detector (through
their shared :class:`detr.models.single_scale.SingleScaleDetector`), Deformable DETR, RT-DETR, the panoptic
model, and the ONNX Runtime backend (:class:`detr.checkpoints.onnx.OnnxDetector`). Code outside ``detr/models``
asks this contract (``model.predicts_masks``, ``model.attention_kind``, ``model.min_image_size``, ...),
never the class, and reads the :class:`~detr.models.outputs.DetectorOutput` that ``forward`` returns.

A new family subclasses :class:`Detector`, sets the attributes its ``__init__`` knows and overrides what
differs (its ``stride``, its ``describe``); the rest of the package then runs it unchanged.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from detr.models.config import ClassHead, ModelConfig, ModelMeta, QueryType
from detr.models.inputs import InputSpec
from detr.models.layers.keypoint_head import KeypointSchema
from detr.models.outputs import DetectorOutput

Targets = list[dict[str, torch.Tensor]]
#: What ``forward(..., return_attention=True)`` adds to the output: "maps" (dense attention maps,
#: :attr:`DetectorOutput.attention`), "points" (sampling points, :attr:`DetectorOutput.sampling`), or None.
AttentionKind = Literal["maps", "points"] | None


def check_inputs(images: torch.Tensor, padding_mask: torch.Tensor) -> None:
    """Raise ValueError unless ``images`` is [B, 3, H, W] and ``padding_mask`` [B, H, W]."""
    if images.dim() != 4 or padding_mask.shape != (images.shape[0], *images.shape[-2:]):
        raise ValueError(
            f"expected images [B, 3, H, W] and padding_mask [B, H, W], got {tuple(images.shape)} and "
            f"{tuple(padding_mask.shape)}"
        )


class Detector(nn.Module):
    """A detector: a padded batch in, a :class:`DetectorOutput` out.

    Input: images float [B, 3, H, W], ImageNet-normalised and zero-padded at the bottom and right to the
    batch's largest image, and padding_mask bool [B, H, W] (True = padding); at eval time each image
    resized so that its shortest side is ``meta.eval_size[0]`` (default 800) and its longest at most
    ``meta.eval_size[1]`` (1333). Output: :class:`DetectorOutput`, post-processed by
    :class:`detr.inference.postprocess.PostProcess` with this model's ``class_head``.

    Attributes every detector has:
        num_classes, num_queries: the model's real classes and object queries.
        class_head: "softmax" (num_classes + 1 logits, the last = "no object") or "sigmoid".
        query_type: "learned" or "anchor" (the query source).
        config: the family's config (a :class:`detr.models.config.ModelConfig`) that built it (None for a model built by hand; checkpoints store it).
        meta: :class:`ModelMeta` (categories, eval size, things/stuff; set by loaders, empty here).
        attention_kind: what ``return_attention=True`` adds ("maps", "points" or None: see :data:`AttentionKind`).
        predicts_masks: whether the output holds masks (a panoptic model, RF-DETR with instance masks, their files).
        keypoint_schema: a keypoint model's :class:`~detr.models.layers.keypoint_head.KeypointSchema` (its
            outputs' ``keypoints`` are GroupPose's 8 channels per class slot); None for a model without keypoints.
        keypoint_trace_alpha: how much a keypoint model's post-processing lowers a detection's score for its
            keypoints' uncertainty (:func:`detr.inference.postprocess_keypoints.grouppose_keypoints`; 0: not).
        exportable: whether :func:`detr.checkpoints.export.export` can trace it.
        backend: what runs it: "pytorch", or the backend's own description.
        prompted: whether ``forward`` also takes a text prompt's tokens (an open-vocabulary model: Grounding DINO,
            :mod:`detr.models.grounding`), whose logits are per prompt token.
    """

    num_classes: int
    num_queries: int
    class_head: ClassHead = "softmax"
    query_type: QueryType = "learned"
    config: ModelConfig | None = None  # set by build_detr and the loaders
    meta: ModelMeta = ModelMeta()  # frozen: loaders assign a new record per model
    attention_kind: AttentionKind = "maps"
    predicts_masks: bool = False
    keypoint_schema: KeypointSchema | None = None
    keypoint_trace_alpha: float = 0.0
    exportable: bool = True
    backend: str = "pytorch"
    prompted: bool = False

    @property
    def stride(self) -> int:
        """Input pixels per feature cell of the finest level the decoder reads: cell ``(y, x)`` covers input
        pixels ``[y * stride, (y + 1) * stride)``."""
        raise NotImplementedError

    @property
    def min_image_size(self) -> int:
        """The smallest height and width the model takes: one stride of its coarsest feature map more than a
        single cell (an exported graph traced on sizes 0 and 1 would be specialised to them)."""
        return self.stride + 1

    @property
    def size_multiple(self) -> int:
        """What the input's height and width must be multiples of (1 here: a padded batch takes any size; RT-DETR's
        32, RF-DETR's patch × windows)."""
        return 1

    @property
    def max_image_size(self) -> int | None:
        """The largest height and width the model takes (a learned position table bounds it), or None."""
        return None

    @property
    def input_spec(self) -> InputSpec:
        """What the model takes (:class:`detr.models.inputs.InputSpec`): the authors' shortest-side resize at
        ``meta.eval_size`` (what it was validated at; 800 / 1333 when unknown), ImageNet normalisation, zero
        padding with a mask. A family with another contract overrides this."""
        eval_size = self.meta.eval_size
        return InputSpec() if eval_size is None else InputSpec(size=eval_size[0], max_size=eval_size[1])

    @property
    def detections_per_image(self) -> int | None:
        """How post-processing turns queries into detections: None, one per query (its best class: the paper's
        DETR, Deformable DETR); k, the k best (query, class) pairs by sigmoid score, a query possibly detected
        as several classes (the real-time DETRs: k = num_queries)."""
        return None

    @property
    def box_detector(self) -> Detector:
        """The detector that predicts the boxes: this model, or the one a mask model wraps."""
        return self

    def describe(self) -> str:
        """One line about the model, e.g. "resnet50, 256 hidden, 91 classes" ("" when built without a config);
        a family says more."""
        config = self.config
        if config is None:
            return ""
        return ", ".join([config.backbone, f"{config.hidden_dim} hidden", f"{config.num_classes} classes"])

    # Declarative hooks of the optimizer's parameter groups (detr.lightning.param_groups.parameter_groups).
    def slow_modules(self) -> list[nn.Module]:
        """Modules its authors train at a tenth of the learning rate (none here; Deformable DETR's sampling
        offsets and reference points)."""
        return []

    def no_weight_decay_parameters(self) -> list[nn.Parameter]:
        """Parameters that their authors train without weight decay (none here; RT-DETR's encoder and decoder
        norms, RF-DETR's ViT biases, norms and embeddings)."""
        return []

    def backbone_layer_depths(self) -> dict[int, int]:
        """Layer-wise learning-rate decay (BEiT's, as RF-DETR trains its ViT): ``id`` of each backbone parameter →
        its depth below the backbone's output (0 at the top); with a layer decay d it trains at the backbone's
        rate · d^depth. Empty (here): the backbone has no such depths."""
        return {}

    def decoder_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at the rate × a component decay c (RF-DETR's decoder layers; its backbone then at the
        backbone's rate × c²). Empty (here): none."""
        return []

    def backbone_parameters(self) -> list[nn.Parameter]:
        """The parameters trained at the backbone's learning rate: here the DETR backbone
        wrapper's (``self.backbone``); a family with another backbone overrides this."""
        return list(self.backbone.parameters())

    @property
    def coarsest_stride(self) -> int:
        """Input pixels per cell of the backbone's coarsest feature map (32; 16 with a dilated last stage)."""
        return self.backbone[0].stride

    def use_channels_last(self) -> None:
        """Run the backbone in NHWC memory layout, which oneDNN (CPU) and cuDNN (tensor cores) prefer: the same
        numbers up to float rounding. In place."""
        self.backbone[0].use_channels_last()

    def use_folded_batch_norm(self, enabled: bool = True) -> None:
        """Run the backbone's frozen BatchNorms folded into their convolutions in training too, with the state
        dict unchanged (:meth:`detr.models.backbone.Backbone.use_folded_batch_norm`): the same losses and
        gradients up to float rounding, a faster step. In place."""
        self.backbone[0].use_folded_batch_norm(enabled)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the backbone's convolutions run in under autocast (:meth:`use_autocast`), or None."""
        return self.backbone[0].autocast_dtype

    def use_autocast(self, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Run the backbone's convolutions under ``torch.autocast`` in ``dtype`` and hand float32 features on
        (None: off). The weights stay float32."""
        self.backbone[0].use_autocast(dtype)

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> Detector:
        """Make this model faster for inference, in place; returns it in eval mode.

        fold_batch_norm: fold the frozen BatchNorms into the backbone's convolutions (outputs equal to
        float rounding; the state dict no longer has the authors' layout, so save checkpoints before).
        channels_last: run the backbone in NHWC, which oneDNN (CPU) and cuDNN (tensor cores) prefer.
        """
        self.eval()
        self.backbone[0].optimize_for_inference(fold_batch_norm=fold_batch_norm, channels_last=channels_last)
        return self

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: Targets | None = None) -> DetectorOutput:
        """Raw predictions for a padded batch (see the class docstring); ``targets`` are read in training by a
        query source that learns from them (denoising queries), and every detector takes them."""
        raise NotImplementedError
