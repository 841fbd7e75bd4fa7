"""ResNet backbone: images + padding mask → feature map + downsampled mask (paper section 3.2;
the authors' models/backbone.py).

The module layout (``body`` = the ResNet's stages up to the last one used, under their own names) gives the
state-dict keys ``backbone.0.body.{conv1,bn1,layer1..4}.*`` of the authors' released checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.models.config import BackboneName, BackboneNorm, LastStage, ModelConfig
from detr.models.layers.conv_norm import conv_frozen_norm, fold_norm_into_conv
from detr.models.layers.cpu_kernels import stage_layout

logger = logging.getLogger(__name__)


# torchvision's "trainable layers" convention: the first n of these train.
_STAGES_TOP_DOWN = ("layer4", "layer3", "layer2", "layer1", "conv1")

_IMAGENET_WEIGHTS = {
    "resnet18": "ResNet18_Weights",
    "resnet34": "ResNet34_Weights",
    "resnet50": "ResNet50_Weights",
    "resnet101": "ResNet101_Weights",
}


def norm_layer(norm: BackboneNorm) -> Callable[[int], nn.Module]:
    if norm == "frozen_batch_norm":
        return FrozenBatchNorm2d  # eps 1e-5, as the authors' own FrozenBatchNorm2d
    if norm == "batch_norm":
        return nn.BatchNorm2d
    if norm == "group_norm":
        return lambda channels: nn.GroupNorm(min(32, channels), channels)
    raise ValueError(f"backbone_norm must be 'frozen_batch_norm', 'batch_norm' or 'group_norm', got {norm!r}")


class PretrainedWeightsError(OSError):
    """The backbone's ImageNet weights could not be downloaded (offline, a proxy, a full disk). ``url``: the file;
    ``cache``: the folder torch looks in before downloading; the message says both fixes (a local file, or the
    file in that folder)."""

    def __init__(self, name: str, url: str, reason: BaseException) -> None:
        self.url, self.file_name = url, url.rsplit("/", 1)[-1]
        self.cache = Path(torch.hub.get_dir()) / "checkpoints"
        self.reason = str(getattr(reason, "reason", None) or reason).strip()
        super().__init__(f"could not download the ImageNet weights of {name} ({url}: {self.reason}); download that "
                         f"file elsewhere and pass its path as pretrained_backbone='/path/{self.file_name}', or put "
                         f"it in {self.cache}/")


def _load_imagenet_weights(resnet: nn.Module, name: BackboneName, pretrained: bool | str) -> None:
    """Load ImageNet weights: torchvision's IMAGENET1K_V1 (the authors' choice) or a local file."""
    if isinstance(pretrained, str):
        try:
            state_dict = torch.load(pretrained, map_location="cpu", weights_only=True)
        except FileNotFoundError as error:
            raise ValueError(f"pretrained_backbone file {pretrained!r} does not exist") from error
        source = pretrained
    else:
        weights = getattr(torchvision.models, _IMAGENET_WEIGHTS[name]).IMAGENET1K_V1
        try:
            state_dict = weights.get_state_dict(progress=True)
        except Exception as error:  # offline: URLError / OSError from the download
            raise PretrainedWeightsError(name, weights.url, error) from error
        source = weights.url
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
    missing, unexpected = resnet.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ValueError(
            f"ImageNet weights from {source} do not fit {name}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    logger.info("loaded ImageNet weights for %s from %s", name, source)


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX), where :meth:`Backbone.use_autocast`
    makes a training step faster; elsewhere bfloat16 is emulated, and slower. (torch's
    probes are private: a torch without them counts as "no", the safe side.)"""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def own_autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """The context of a part that runs in a precision of its own (``use_autocast``): ``torch.autocast`` in ``dtype``,
    or, when ``dtype`` is None, no context at all, so that an enclosing autocast (bf16-mixed, the Predictor's
    precision) reaches the part; a disabled autocast context would switch that one off there."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


class Backbone(nn.Module):
    """A torchvision ResNet cut after ``last_stage``.

    Args:
        name: ResNet depth.
        dilation: dilate layer4 instead of striding (DC5: output stride 16).
        pretrained: False, True (torchvision's ImageNet weights) or a path to a ResNet state dict.
        norm: FrozenBatchNorm2d (the paper; assumes pretrained statistics), trainable BatchNorm2d, or
            GroupNorm (small batches, training from scratch).
        trainable_layers: how many stages train, counted from the top (3: layer2–layer4, the paper;
            5: everything including the stem).
        last_stage: "layer4" (stride 32, or 16 with dilation), "layer3" (stride 16) or "layer2" (stride 8):
            finer feature maps for small images and small objects.
    """

    def __init__(self, name: BackboneName = "resnet50", *, dilation: bool = False, pretrained: bool | str = False,
                 norm: BackboneNorm = "frozen_batch_norm", trainable_layers: int = 3,
                 last_stage: LastStage = "layer4") -> None:
        super().__init__()
        if name not in _IMAGENET_WEIGHTS:
            raise ValueError(f"backbone must be one of {sorted(_IMAGENET_WEIGHTS)}, got {name!r}")
        if not 0 <= trainable_layers <= 5:
            raise ValueError(f"backbone_trainable_layers must be in 0..5, got {trainable_layers}")
        if last_stage not in ("layer4", "layer3", "layer2"):
            raise ValueError(f"backbone_last_stage must be 'layer4', 'layer3' or 'layer2', got {last_stage!r}")
        if dilation and last_stage != "layer4":
            raise ValueError(f"dilation (DC5) dilates layer4; it cannot be combined with backbone_last_stage={last_stage!r}")
        resnet = getattr(torchvision.models, name)(
            weights=None, replace_stride_with_dilation=[False, False, dilation], norm_layer=norm_layer(norm)
        )
        if pretrained:
            _load_imagenet_weights(resnet, name, pretrained)
        trained = _STAGES_TOP_DOWN[:trainable_layers]
        for param_name, parameter in resnet.named_parameters():
            stage = param_name.split(".")[0]
            if stage == "bn1":
                stage = "conv1"
            parameter.requires_grad_(stage in trained)
        stages = list(resnet.named_children())
        last = [name for name, _ in stages].index(last_stage)
        self.body = nn.ModuleDict(stages[:last + 1])  # conv1, bn1, relu, maxpool, layer1 .. last_stage, run in order
        last_block = getattr(resnet, last_stage)[-1]
        self.num_channels: int = (last_block.conv3 if hasattr(last_block, "conv3") else last_block.conv2).out_channels
        self.channels_last = False  # set by use_channels_last()
        #: on the CPU, the frozen stages ahead of the first trained one run in NHWC (see forward_with_stages);
        #: False keeps NCHW throughout (the layout before it: benchmarks/training_speed.py compares them)
        self.frozen_stages_channels_last = True
        self.fold_in_training = False  # set by use_folded_batch_norm()
        self.autocast_dtype: torch.dtype | None = None  # set by use_autocast()
        self.stride = {"layer2": 8, "layer3": 16, "layer4": 16 if dilation else 32}[last_stage]

    def use_channels_last(self) -> None:
        """Keep the weights and run the convolutions in NHWC (channels-last) memory layout, which oneDNN
        (CPU) and cuDNN (tensor cores) prefer: same numbers up to float rounding, faster. In place."""
        self.to(memory_format=torch.channels_last)
        self.channels_last = True

    def use_folded_batch_norm(self, enabled: bool = True) -> None:
        """Run every FrozenBatchNorm2d folded into the convolution before it in training (train mode, gradients on),
        without changing a parameter or the state dict: each forward computes the folded weight
        ``w · s`` and bias ``β − μ · s`` (:func:`conv_frozen_norm`), so autograd carries the gradient of a trained
        convolution's weight through ``w · s`` and no separate multiply-add over the activations (and its
        backward) runs. Outputs and gradients equal the plain path's up to float rounding. A backbone without
        frozen BatchNorms (trainable ones) keeps torchvision's own forward: there is nothing to fold."""
        self.fold_in_training = enabled and any(isinstance(module, FrozenBatchNorm2d) for module in self.body.modules())

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> None:
        """The backbone's part of a detector's ``optimize_for_inference``, in place: fold the frozen
        BatchNorms (:meth:`fold_frozen_batch_norm`), then run in NHWC (:meth:`use_channels_last`)."""
        if fold_batch_norm:
            self.fold_frozen_batch_norm()
        if channels_last:
            self.use_channels_last()

    def use_autocast(self, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Run the backbone (convolutions, under ``torch.autocast``) in ``dtype`` and return float32
        features; None turns it off. The weights stay float32. On CPUs with AMX or AVX512-BF16 the
        convolutions of a training step run faster in bfloat16; the transformer is left in float32
        because the CPU's bfloat16 attention backward is far slower than its float32 one. Outputs differ
        from float32 by bfloat16 rounding."""
        self.autocast_dtype = dtype

    @torch.no_grad()
    def fold_frozen_batch_norm(self) -> int:
        """Fold every FrozenBatchNorm2d into the convolution before it (inference only).

        A frozen BN is an affine map, so ``bn(conv(x)) = conv'(x)`` with ``w' = w · s`` and
        ``b' = β − μ · s``, ``s = γ / sqrt(σ² + eps)``: one pass over the activations fewer per layer (the
        separate multiply and add are memory-bound on the CPU). Outputs change only by float rounding
        (~1e-7), but the state dict no longer has the authors' layout. Returns the number folded.
        """
        folded = 0
        modules = dict(self.body.named_modules())
        for name, module in list(modules.items()):
            for conv_name, bn_name in (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3"), ("0", "1")):
                conv, bn = getattr(module, conv_name, None), getattr(module, bn_name, None)
                if isinstance(conv, nn.Conv2d) and isinstance(bn, FrozenBatchNorm2d):
                    fold_norm_into_conv(conv, bn)
                    if isinstance(module, nn.Sequential):
                        module[int(bn_name)] = nn.Identity()
                    else:
                        setattr(module, bn_name, nn.Identity())
                    folded += 1
        return folded

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images float [B, 3, H, W], padding_mask bool [B, H, W] (True = padding) →
        features [B, C, h, w] and mask bool [B, h, w], the padding mask resized by nearest interpolation."""
        features, mask, _ = self.forward_with_stages(images, padding_mask)
        return features, mask

    def forward_with_stages(self, images: torch.Tensor, padding_mask: torch.Tensor, keep_stages: Collection[str] = ()
                            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`forward`'s features and mask, and the outputs of the stages named in ``keep_stages``
        ({"layer1": [B, C_1, H_1, W_1], …}: the panoptic mask head's skip connections)."""
        # On the CPU a training step runs the frozen stages in NHWC (cpu_kernels.stage_layout). Training only, as
        # the folded norms: NHWC kernels round differently, and an inference forward stays equal to the
        # reference's (optimize_for_inference chooses its own layout).
        training = self.training and torch.is_grad_enabled()
        frozen_nhwc = (training and self.frozen_stages_channels_last and not self.channels_last
                       and images.device.type == "cpu")
        fold = training and self.fold_in_training
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        stages = {}
        with own_autocast(images.device.type, self.autocast_dtype):
            features = images
            for name, stage in self.body.items():
                features, frozen_nhwc = stage_layout(stage, features, frozen_nhwc)
                if not fold:
                    features = stage(features)
                elif name == "conv1":
                    features = conv_frozen_norm(stage, self.body["bn1"], features)
                elif name != "bn1":  # (bn1 ran with conv1)
                    features = _folded_stage(stage, features)
                if name in keep_stages:
                    stages[name] = features
        if frozen_nhwc:  # every stage frozen
            features = features.contiguous()
        if self.autocast_dtype is not None:
            features, stages = features.float(), {name: value.float() for name, value in stages.items()}
        return features, downsample_mask(padding_mask, features.shape[-2:]), stages


def _folded_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision's Bottleneck / BasicBlock forward with :func:`conv_frozen_norm`; other modules as they are."""
    if isinstance(block, torchvision.models.resnet.Bottleneck):
        out = conv_frozen_norm(block.conv1, block.bn1, x).relu_()
        out = conv_frozen_norm(block.conv2, block.bn2, out).relu_()
        out = conv_frozen_norm(block.conv3, block.bn3, out)
    elif isinstance(block, torchvision.models.resnet.BasicBlock):
        out = conv_frozen_norm(block.conv1, block.bn1, x).relu_()
        out = conv_frozen_norm(block.conv2, block.bn2, out)
    else:
        return block(x)
    downsample = block.downsample
    identity = x if downsample is None else conv_frozen_norm(downsample[0], downsample[1], x)
    out += identity
    return out.relu_()


def _folded_stage(stage: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(stage, nn.Sequential):  # layer1 .. layer4
        for block in stage:
            x = _folded_block(block, x)
        return x
    return stage(x)


def nearest_indices(in_size: int, out_size: int, device: torch.device) -> torch.Tensor:
    """The source indices nearest-neighbour resizing picks, as PyTorch's kernel computes them:
    ``min(floor(i * (in / out)), in - 1)`` with the scale and the product in float32."""
    scale = torch.full((), in_size, dtype=torch.float32, device=device) / out_size
    indices = (torch.arange(out_size, dtype=torch.float32, device=device) * scale).floor().long()
    return indices.clamp(max=in_size - 1)


def downsample_mask(padding_mask: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """The padding mask [B, H, W] at a feature map's ``size`` (h, w): ``F.interpolate``'s nearest
    neighbour (what the authors' code does), picked by index. An exported graph reproduces it exactly: the
    exporters lower ``F.interpolate`` to ONNX Resize, which computes its scale as out / in and picks the
    neighbouring row or column at some sizes (a 140 × 150 batch's 5 × 5 map marked an image's last real
    column as padding, changing its logits by 0.16)."""
    rows = nearest_indices(padding_mask.shape[-2], size[0], padding_mask.device)
    columns = nearest_indices(padding_mask.shape[-1], size[1], padding_mask.device)
    return padding_mask[:, rows[:, None], columns[None, :]]


def backbone_from_config(config: ModelConfig, last_stage: LastStage = "layer4") -> Backbone:
    """The ResNet :class:`Backbone` of a config with the ResNet options (DETR's, Deformable DETR's: ``backbone``,
    ``dilation``, ``pretrained_backbone``, ``backbone_norm``, ``backbone_trainable_layers``), cut after
    ``last_stage``."""
    return Backbone(config.backbone, dilation=config.dilation,  # type: ignore[attr-defined]
                    pretrained=config.pretrained_backbone, norm=config.backbone_norm,  # type: ignore[attr-defined]
                    trainable_layers=config.backbone_trainable_layers,  # type: ignore[attr-defined]
                    last_stage=last_stage)


def describe_resnet_detector(config: ModelConfig) -> str:
    """"resnet50-DC5, 6 encoder layers, 256 hidden, 91 classes": a ResNet detector's line for ``describe``."""
    return ", ".join([config.backbone + ("-DC5" if config.dilation else ""),  # type: ignore[attr-defined]
                      f"{config.num_encoder_layers} encoder layers",  # type: ignore[attr-defined]
                      f"{config.hidden_dim} hidden", f"{config.num_classes} classes"])


class Joiner(nn.Sequential):
    """``backbone.0`` = :class:`Backbone`, ``backbone.1`` = position encoding: the authors' key layout."""

    def __init__(self, backbone: Backbone, position_encoding: nn.Module) -> None:
        super().__init__(backbone, position_encoding)

    @property
    def num_channels(self) -> int:
        return self[0].num_channels

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """→ features [B, C, h, w], mask bool [B, h, w], pos float32 [B, hidden, h, w]."""
        features, mask = self[0](images, padding_mask)
        return features, mask, self[1](mask)
