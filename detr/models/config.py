"""The detector's configuration: one typed record of every choice that shapes the model.

:class:`DetrConfig` is the single description of a detector that every part of the project shares:
:func:`detr.build_detr` builds from it, the training system takes it as its ``detr`` argument (the
``model.detr.*`` keys of a LightningCLI YAML), checkpoints store it (``checkpoint["detr"]["model_config"]``)
so that loading never guesses, and the benchmarks build their models from it. Adding an option means one
field here and the code that uses it.

Defaults are the paper's COCO model (R50, 6 + 6 layers, 100 queries, 91 classes, learned queries, a
softmax class head). The options after ``backbone_last_stage`` train from scratch on a short budget
(docs/measurements/convergence.md): they select :class:`detr.models.anchor.model.AnchorDETR` (``query_type="anchor"``)
and the training-only heads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from detr.categories import CategoryMap

QueryType = Literal["learned", "anchor"]
#: "detr": the paper's single-scale transformer (with the query types above); "deformable": Deformable DETR's
#: multi-scale deformable attention (:class:`detr.models.deformable.model.DeformableDETR`); "rtdetr": the
#: real-time DETR (RT-DETR and RT-DETRv2, :class:`detr.models.rtdetr.model.RTDETR`); "dfine": D-FINE
#: (:class:`detr.models.dfine.model.DFINE`); "deimv2": DEIMv2 (the same class with DEIMv2's parts); "rfdetr": RF-DETR
#: and LW-DETR (:class:`detr.models.rfdetr.model.RFDETR`).
Architecture = Literal["detr", "deformable", "rtdetr", "dfine", "deimv2", "rfdetr"]
#: How deformable attention reads a sampling location: "bilinear" (grid_sample) or "discrete" (the nearest cell).
SamplingMethod = Literal["bilinear", "discrete"]
#: ResNets (ResNet-vd for RT-DETR), for D-FINE and DEIMv2 only HGNetV2's sizes B0-B5, for DEIMv2 only a DINOv3
#: ViT with the spatial tuning adapter ("dinov3_vit", its size in DEIMv2's vit_* options), for RF-DETR only its
#: windowed DINOv2 ViT and LW-DETR's windowed ViT (sized by RF-DETR's ``vit_*`` options).
BackboneName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "hgnetv2_b0", "hgnetv2_b1", "hgnetv2_b2",
                       "hgnetv2_b3", "hgnetv2_b4", "hgnetv2_b5", "dinov3_vit", "dinov2_windowed", "lwdetr_vit"]
#: The norm of RF-DETR's projector ("layer_norm") or LW-DETR's ("batch_norm").
ProjectorNorm = Literal["layer_norm", "batch_norm"]
#: The options only D-FINE (and DEIMv2) read, with their defaults (the authors').
DFINE_DEFAULTS: dict[str, Any] = {"backbone_learnable_affine": False, "num_points_per_level": None,
                                  "csp_depth_multiplier": 1.0, "max_num_bins": 32, "reg_scale": 4.0, "reg_up": 0.5,
                                  "lqe_top_k": 4, "lqe_hidden_dim": 64, "lqe_layers": 2, "decoder_activation": "relu",
                                  "decoder_mlp_activation": "relu"}
#: The options only DEIMv2 reads, with their defaults (transformers' Deimv2Config).
DEIMV2_DEFAULTS: dict[str, Any] = {"lite_encoder": False, "decoder_gateway": True, "csp_trailing_conv": True,
                                   "vit_dim": 384, "vit_depth": 12, "vit_heads": 6, "vit_mlp_dim": 1536,
                                   "vit_register_tokens": 4, "vit_out_layers": (5, 8, 11),
                                   "vit_gated_mlp": False, "adapter_channels": 16}
#: The families built on D-FINE's parts (HGNetV2, the distribution-refinement decoder).
DFINE_FAMILY = ("dfine", "deimv2")
#: The options only RF-DETR reads, with their defaults (transformers' ``RfDetrConfig``: a DINOv2-S-sized ViT).
RFDETR_DEFAULTS: dict[str, Any] = {"vit_hidden_dim": 384, "vit_num_layers": 12, "vit_num_heads": 6, "vit_mlp_ratio": 4,
                                   "vit_out_indices": (2, 5, 8, 11), "vit_num_windows": 4, "vit_patch_size": 14,
                                   "vit_position_size": 518, "cross_attention_heads": 16, "projector_expansion": 0.5,
                                   "projector_blocks": 3, "instance_masks": False, "mask_dim_feedforward": 1024,
                                   "vit_window_blocks": None, "projector_scales": (1.0,), "projector_norm": "layer_norm"}
#: What :func:`detr.models.build.build_detr` (called with options, no config) takes for the fields the caller
#: leaves unset, per family: DetrConfig's own defaults are DETR's (the paper's R50), which the other families
#: refuse. Each is one of the authors' COCO models, as configs/ gives it: Deformable DETR (single-scale
#: queries, deformable_detr_coco.yaml), RT-DETR R50vd (the standard size, rtdetr_r50vd_coco.yaml), D-FINE S
#: (the smallest with three levels, dfine_s_coco.yaml) and RF-DETR base (rfdetr_base_coco.yaml).
ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "detr": {},
    "deformable": {"class_head": "sigmoid", "num_queries": 300, "dim_feedforward": 1024},
    "rtdetr": {"backbone": "resnet50", "class_head": "sigmoid", "num_encoder_layers": 1, "dim_feedforward": 1024,
               "dropout": 0.0, "num_queries": 300, "num_feature_levels": 3, "denoising": True},
    "dfine": {"backbone": "hgnetv2_b0", "backbone_norm": "batch_norm", "backbone_learnable_affine": True,
              "class_head": "sigmoid", "num_encoder_layers": 1, "num_decoder_layers": 3, "dim_feedforward": 1024,
              "dropout": 0.0, "num_queries": 300, "num_feature_levels": 3, "num_points_per_level": (3, 6, 3),
              "csp_expansion": 0.5, "csp_depth_multiplier": 0.34, "denoising": True},
    "rfdetr": {"backbone": "dinov2_windowed", "class_head": "sigmoid", "num_feature_levels": 1, "num_points": 2,
               "num_decoder_layers": 3, "dim_feedforward": 2048, "dropout": 0.0, "num_queries": 300,
               "query_groups": 13},
}
BackboneNorm = Literal["frozen_batch_norm", "batch_norm", "group_norm"]
LastStage = Literal["layer4", "layer3", "layer2"]
PositionEncoding = Literal["sine", "learned"]
#: The class head, in one vocabulary for the model, the matcher, the criterion and the post-processing:
#: "softmax" (the paper: num_classes + 1 logits, the last "no object"; cross-entropy, -p matching cost) or
#: "sigmoid" (num_classes independent sigmoids; focal loss and the focal matching cost).
ClassHead = Literal["softmax", "sigmoid"]

#: Bias of a sigmoid class logit that starts every class at p = 0.01 (the focal-loss prior, Lin et al. §4.1).
PRIOR_BIAS = -math.log((1 - 0.01) / 0.01)
#: The real-time families, which share RT-DETR's options (hybrid encoder, query selection, sampling).
REAL_TIME = ("rtdetr", "dfine", "deimv2")


@dataclass(frozen=True)
class DetrConfig:
    """Everything that decides a detector's layout and behaviour. One entry per field, in the form
    LightningCLI reads (``detr fit --help`` shows each as the meaning of ``--model.detr.<field>``).

    Attributes:
        backbone: ResNet depth of the backbone: resnet18, resnet34, resnet50 (paper) or resnet101.
        dilation: DC5: layer4 dilated instead of strided (stride 16 instead of 32; ResNet-50/101 only).
        position_encoding: "sine" (paper) or "learned" (a 50 × 50 table) spatial position encoding.
        hidden_dim: width of the transformer (paper: 256).
        num_heads: attention heads of every transformer layer (paper: 8).
        num_encoder_layers: transformer encoder layers (paper: 6).
        num_decoder_layers: transformer decoder layers (paper: 6).
        dim_feedforward: hidden width of each layer's feed-forward network (paper: 2048).
        dropout: dropout in the transformer (paper: 0.1).
        pre_norm: LayerNorm before each sub-layer instead of after it (paper: False, post-norm).
        num_queries: object queries: the most objects one image can have detected (paper: 100).
        num_classes: the model's classes; the detr CLI links it from the annotation json (or the checkpoint).
        aux_loss: return every decoder layer's predictions, for the auxiliary losses (paper: True).
        pretrained_backbone: False (random init), True (torchvision's ImageNet weights, downloaded) or a path
            to a ResNet state dict.
        backbone_norm: "frozen_batch_norm" (paper, with pretrained weights), "batch_norm" or "group_norm"
            (training from scratch).
        backbone_trainable_layers: ResNet stages that train, counted from the top (3 = layer2–4, paper;
            5 = all, from scratch; 0 = none).
        backbone_last_stage: "layer4" (stride 32), "layer3" (stride 16) or "layer2" (stride 8): cut the ResNet
            early, for small images.
        query_type: "learned" (paper: a learned embedding per query, :class:`detr.models.detr.DETR`) or
            "anchor" (DAB-DETR: a learned anchor box per query, conditional spatial cross-attention, box
            refinement in every layer, :class:`detr.models.anchor.model.AnchorDETR`); docs/measurements/convergence.md.
        class_head: "softmax" (paper: num_classes + 1 logits, the last = no object; cross-entropy) or
            "sigmoid" (num_classes logits scored by independent sigmoids; focal loss). The matcher, the
            criterion and the post-processing take the same word.
        denoising: DN-DETR's denoising queries in training (needs query_type="anchor"; the forward then
            needs ``targets``).
        denoising_groups: noised copies of every ground-truth box and label fed to the decoder (DN-DETR: 5).
        denoising_label_noise: probability that a denoising query's label is replaced by a random class
            (DN-DETR: 0.2).
        denoising_box_noise: box noise scale λ: centres move by up to λ · half the width and height, sides
            scale by a factor in [1 - λ, 1 + λ] (DN-DETR: 0.4).
        anchor_local_attention: > 0 starts every cross-attention head as a kernel centred on its query's
            anchor, with this scale (an initialisation only; query_type="anchor"); 0 keeps DAB-DETR's Xavier init.
        query_groups: Group DETR's one-to-many assignment in training: this many groups of queries, each
            matched on its own; inference decodes group 1 only. 1 = the paper's assignment. The anchor decoder's
            option, and RF-DETR's (``architecture="rfdetr"``: 13 groups in the authors' recipe).
        dense_aux_head: a training-only FCOS-like head on the encoder output, every cell inside a box
            positive for it (Co-DETR's collaborative auxiliary head); inference does not run it.
        architecture: "detr" (the paper's transformer), "deformable" (Deformable DETR's multi-scale
            deformable attention, :class:`detr.models.deformable.model.DeformableDETR`; needs
            class_head="sigmoid"; the authors' model also sets num_queries=300 and dim_feedforward=1024;
            docs/models/deformable.md) or "rtdetr" (RT-DETR and RT-DETRv2, :class:`detr.models.rtdetr.model.RTDETR`:
            a ResNet-vd backbone named by ``backbone``, the hybrid encoder of ``num_encoder_layers`` AIFI layers
            with CCFM fusion, a deformable decoder with box refinement and queries from the encoder's top
            ``num_queries``; the authors set num_queries=300, dim_feedforward=1024, dropout=0.0,
            class_head="sigmoid", num_feature_levels=3, num_encoder_layers=1 and num_decoder_layers=6, 3 for
            R18; docs/models/rtdetr.md).
        num_feature_levels: the deformable models' input levels: 4 (layer2–4 + one stride-64 level, the
            paper), 1 (single-scale: layer4), 2 or 3 (the last stages; RT-DETR: 3), more (further stride-2
            levels).
        num_points: the deformable attention's sampling points per head and level (4).
        box_refine: Deformable DETR's iterative bounding-box refinement (§4.2).
        two_stage: Deformable DETR's queries from the encoder's best proposals (§4.2; needs box_refine).
        encoder_hidden_dim: RT-DETR's hybrid encoder width (None: hidden_dim; R101: 384).
        encoder_dim_feedforward: RT-DETR's AIFI feed-forward width (None: dim_feedforward; R101: 2048).
        csp_expansion: width of RT-DETR's CSP blocks' RepVGG branch relative to encoder_hidden_dim (1.0).
        sampling_offset_scale: RT-DETRv2's decoder offsets around a box in units of this × its size / points
            (0.5).
        sampling_method: "bilinear" or "discrete" (RT-DETRv2's nearest-cell sampling, without grid_sample).
        backbone_learnable_affine: D-FINE and DEIMv2 (``architecture="dfine"`` or "deimv2", a ``backbone`` of
            the HGNetV2 sizes "hgnetv2_b0" ... "hgnetv2_b5"; docs/models/dfine.md): HGNetV2's learnable affine blocks
            (the authors' use_lab: N, S and M).
        num_points_per_level: D-FINE: the decoder's sampling points per level (S-X: (3, 6, 3)); None:
            num_points at each.
        csp_depth_multiplier: D-FINE: RepVGG blocks per CSP layer of the encoder's fusion blocks = round(3 × this).
        max_num_bins: D-FINE: N, each box edge is a distribution over N + 1 bins (32).
        reg_scale: D-FINE: the weighting function's curvature (4.0, the authors' reg_scale).
        reg_up: D-FINE: the weighting function's range (0.5, the authors' up).
        lqe_top_k: D-FINE: top probabilities of each edge the localisation-quality head reads (4).
        lqe_hidden_dim: D-FINE: the localisation-quality head's hidden width (64).
        lqe_layers: D-FINE: the localisation-quality head's layers (2).
        lite_encoder: DEIMv2 (D-FINE's parts with RMSNorm and SwiGLU decoder layers and summed RepNCSPELAN5
            fusion; ``backbone`` an HGNetV2 size or "dinov3_vit"): the Atto/Femto/Pico encoder (no AIFI, two
            levels; num_feature_levels=2) instead of the hybrid encoder.
        decoder_gateway: DEIMv2: the decoder layers' gate after the cross-attention (True); False: residual +
            RMSNorm.
        decoder_activation: D-FINE: "relu" or "silu" in the decoder layers' feed-forward networks (DEIM: "silu");
            DEIMv2 (whose feed-forward networks are SwiGLU): between the layers of the query-position MLP
            (transformers' decoder_activation_function in both).
        decoder_mlp_activation: D-FINE: "relu" or "silu" in the decoder's MLPs: the query positions, the
            encoder's box head, the first layer's box head, the distribution heads and the quality heads (DEIM's
            mlp_act and, for the quality heads, its activation: "silu"; transformers' D-FINE has ReLU there).
        csp_trailing_conv: DEIMv2: the 3×3 at the end of the fusion blocks' CSP layers (True; the DINOv3
            models: False).
        vit_dim: DEIMv2's DINOv3 ViT (backbone="dinov3_vit"): width (ViT-S/16: 384).
        vit_depth: DEIMv2's DINOv3 ViT: blocks (12).
        vit_heads: DEIMv2's DINOv3 ViT: attention heads (6).
        vit_mlp_dim: DEIMv2's DINOv3 ViT: MLP hidden width (1536).
        vit_register_tokens: DEIMv2's DINOv3 ViT: register tokens (4).
        vit_gated_mlp: DEIMv2's DINOv3 ViT: a gated (SwiGLU) MLP instead of the plain one (False).
        vit_out_layers: DEIMv2's DINOv3 ViT: the three layers (1-based) whose patch tokens become the strides
            8, 16, 32.
        adapter_channels: DEIMv2: c of the spatial tuning adapter (2c, 4c, 4c channels at strides 8, 16, 32; 16).
        vit_hidden_dim: RF-DETR (``architecture="rfdetr"``, ``backbone="dinov2_windowed"``; LW-DETR: "lwdetr_vit";
            one feature level per projector scale; docs/models/rfdetr.md): the ViT's width (DINOv2-S: 384).
        vit_num_layers: RF-DETR: the ViT's blocks (12).
        vit_num_heads: RF-DETR: the ViT's attention heads (6).
        vit_mlp_ratio: RF-DETR: the ViT's MLP width over its width (4).
        vit_out_indices: RF-DETR: the ViT stages (outputs after that many blocks) the projector reads; those
            blocks and the ones after the last attend globally, the others within windows ((2, 5, 8, 11)).
        vit_num_windows: RF-DETR: windows per side of the windowed blocks (4: 16 windows; 1: none).
        vit_patch_size: RF-DETR: pixels per patch side (14).
        vit_position_size: RF-DETR: the image side the position table was learned at (518: 37 × 37 patches),
            interpolated to other sizes.
        cross_attention_heads: RF-DETR: heads of the decoder's deformable cross-attention (16; ``num_heads`` is
            its self-attention's).
        projector_expansion: RF-DETR: the C2f projector's hidden width (× hidden_dim; 0.5).
        projector_blocks: RF-DETR: the C2f projector's blocks (3).
        instance_masks: RF-DETR: the segmentation head (query features × pixel features): masks beside the boxes.
        mask_dim_feedforward: RF-DETR: the segmentation head's query MLP width (1024).
        vit_window_blocks: LW-DETR's ViT: the blocks that attend within windows (None: RF-DETR's rule above).
        projector_scales: RF-DETR: one projector per feature level, at this scale of the patch grid (RF-DETR:
            (1.0,); LW-DETR: (2.0, 0.5) and the like).
        projector_norm: RF-DETR: "layer_norm" (RF-DETR) or "batch_norm" (LW-DETR) in the projector's C2f blocks.
    """

    backbone: BackboneName = "resnet50"
    dilation: bool = False
    position_encoding: PositionEncoding = "sine"
    hidden_dim: int = 256
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    pre_norm: bool = False
    num_queries: int = 100
    num_classes: int = 91
    aux_loss: bool = True
    pretrained_backbone: bool | str = False
    backbone_norm: BackboneNorm = "frozen_batch_norm"
    backbone_trainable_layers: int = 3
    backbone_last_stage: LastStage = "layer4"
    query_type: QueryType = "learned"
    class_head: ClassHead = "softmax"
    denoising: bool = False
    denoising_groups: int = 5
    denoising_label_noise: float = 0.2
    denoising_box_noise: float = 0.4
    anchor_local_attention: float = 0.0
    query_groups: int = 1
    dense_aux_head: bool = False
    architecture: Architecture = "detr"
    num_feature_levels: int = 4
    num_points: int = 4
    box_refine: bool = False
    two_stage: bool = False
    encoder_hidden_dim: int | None = None
    encoder_dim_feedforward: int | None = None
    csp_expansion: float = 1.0
    sampling_offset_scale: float = 0.5
    sampling_method: SamplingMethod = "bilinear"
    backbone_learnable_affine: bool = False
    num_points_per_level: tuple[int, ...] | None = None
    csp_depth_multiplier: float = 1.0
    max_num_bins: int = 32
    reg_scale: float = 4.0
    reg_up: float = 0.5
    lqe_top_k: int = 4
    lqe_hidden_dim: int = 64
    lqe_layers: int = 2
    lite_encoder: bool = False
    decoder_gateway: bool = True
    decoder_activation: Literal["relu", "silu"] = "relu"
    decoder_mlp_activation: Literal["relu", "silu"] = "relu"
    csp_trailing_conv: bool = True
    vit_dim: int = 384
    vit_depth: int = 12
    vit_heads: int = 6
    vit_mlp_dim: int = 1536
    vit_register_tokens: int = 4
    vit_out_layers: tuple[int, ...] = (5, 8, 11)
    vit_gated_mlp: bool = False
    adapter_channels: int = 16
    vit_hidden_dim: int = 384
    vit_num_layers: int = 12
    vit_num_heads: int = 6
    vit_mlp_ratio: int = 4
    vit_out_indices: tuple[int, ...] = (2, 5, 8, 11)
    vit_num_windows: int = 4
    vit_patch_size: int = 14
    vit_position_size: int = 518
    cross_attention_heads: int = 16
    projector_expansion: float = 0.5
    projector_blocks: int = 3
    instance_masks: bool = False
    mask_dim_feedforward: int = 1024
    vit_window_blocks: tuple[int, ...] | None = None
    projector_scales: tuple[float, ...] = (1.0,)
    projector_norm: ProjectorNorm = "layer_norm"

    def __post_init__(self) -> None:
        if self.position_encoding not in ("sine", "learned"):
            raise ValueError(f"position_encoding must be 'sine' or 'learned', got {self.position_encoding!r}")
        if self.hidden_dim % 2:
            raise ValueError(f"hidden_dim must be even (half of it encodes each axis), got {self.hidden_dim}")
        if self.query_type not in ("learned", "anchor"):
            raise ValueError(f"query_type must be 'learned' or 'anchor', got {self.query_type!r}")
        if self.class_head not in ("softmax", "sigmoid"):
            raise ValueError(f"class_head must be 'softmax' or 'sigmoid', got {self.class_head!r}")
        for name in ("num_queries", "num_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                hint = {"num_queries": " (one query per detectable object; the paper uses 100)",
                        "num_classes": "; with the detr CLI it comes from the data's annotation json (or, for "
                                       "predict, from the checkpoint)"}[name]
                raise ValueError(f"{name} must be an integer >= 1{hint}, got {value!r}")
        if self.query_groups < 1:
            raise ValueError(f"query_groups must be at least 1, got {self.query_groups}")
        for name in ("num_points_per_level", "vit_out_layers", "vit_out_indices", "vit_window_blocks"):
            if getattr(self, name) is not None:  # checkpoints store lists: one value, one type
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "projector_scales", tuple(float(scale) for scale in self.projector_scales))
        if self.query_type != "anchor" and not (self.architecture in REAL_TIME and self.query_groups == 1
                                                and self.anchor_local_attention == 0):
            anchor_only = {"denoising": (self.denoising, "denoising=True feeds noised boxes as anchors"),
                           "anchor_local_attention": (self.anchor_local_attention > 0,
                                                      "anchor_local_attention initialises the anchor decoder"),
                           "query_groups": (self.query_groups > 1 and self.architecture != "rfdetr",
                                            "query_groups > 1 (Group DETR) is built on the anchor decoder (and "
                                            "RF-DETR's)")}
            for used, why in anchor_only.values():
                if used:
                    raise ValueError(f"{why}: it needs query_type='anchor'")
        if self.pre_norm and self.query_type == "anchor":
            raise ValueError("query_type='anchor' has DAB-DETR's post-norm decoder: set pre_norm=False")
        self._check_deformable()
        if self.backbone == "dinov3_vit" and self.architecture != "deimv2":
            raise ValueError(f"backbone 'dinov3_vit' is DEIMv2's (architecture='deimv2'), got architecture "
                             f"{self.architecture!r}")
        if self.backbone.startswith(("hgnetv2", "dinov3")) != (self.architecture in DFINE_FAMILY):
            raise ValueError(f"backbone {self.backbone!r} with architecture {self.architecture!r}: HGNetV2 sizes "
                             f"(hgnetv2_b0 ... b5) are D-FINE's and DEIMv2's backbones (architecture='dfine' or "
                             f"'deimv2'), ResNets the others'")
        if (self.backbone in ("dinov2_windowed", "lwdetr_vit")) != (self.architecture == "rfdetr"):
            raise ValueError(f"backbone {self.backbone!r} with architecture {self.architecture!r}: 'dinov2_windowed' "
                             f"and 'lwdetr_vit' are RF-DETR's and LW-DETR's backbones and theirs only "
                             f"(architecture='rfdetr')")
        if self.dilation and self.backbone in ("resnet18", "resnet34"):
            raise ValueError(f"dilation (DC5) needs bottleneck blocks: use resnet50 or resnet101, not {self.backbone}")

    def _check_deformable(self) -> None:
        if self.architecture not in ("detr", "deformable", "rtdetr", "dfine", "deimv2", "rfdetr"):
            raise ValueError(f"architecture must be 'detr', 'deformable', 'rtdetr', 'dfine', 'deimv2' or 'rfdetr', got "
                             f"{self.architecture!r}")
        if self.sampling_method not in ("bilinear", "discrete"):
            raise ValueError(f"sampling_method must be 'bilinear' or 'discrete', got {self.sampling_method!r}")
        if self.architecture not in DFINE_FAMILY:
            for name, default in DFINE_DEFAULTS.items():
                if getattr(self, name) != default:
                    raise ValueError(f"{name}={getattr(self, name)!r} is a D-FINE option: set architecture='dfine'")
        if self.architecture != "deimv2":
            for name, default in DEIMV2_DEFAULTS.items():
                if getattr(self, name) != default:
                    raise ValueError(f"{name}={getattr(self, name)!r} is a DEIMv2 option: set architecture='deimv2'")
        if self.architecture != "rfdetr":
            for name, default in RFDETR_DEFAULTS.items():
                if getattr(self, name) != default:
                    raise ValueError(f"{name}={getattr(self, name)!r} is an RF-DETR option: set architecture='rfdetr'")
        if self.architecture not in REAL_TIME:
            rtdetr_only = {"encoder_hidden_dim": self.encoder_hidden_dim is not None,
                           "encoder_dim_feedforward": self.encoder_dim_feedforward is not None,
                           "csp_expansion": self.csp_expansion != 1.0,
                           "sampling_offset_scale": self.sampling_offset_scale != 0.5,
                           "sampling_method": self.sampling_method != "bilinear"}
            for name, used in rtdetr_only.items():
                if used:
                    raise ValueError(f"{name}={getattr(self, name)!r} is an RT-DETR option: set architecture='rtdetr'")
        if self.architecture in REAL_TIME:
            self._check_rtdetr()
            return
        if self.architecture == "rfdetr":
            self._check_rfdetr()
            return
        if self.architecture == "detr":
            for name in ("box_refine", "two_stage"):
                if getattr(self, name):
                    raise ValueError(f"{name}=True is a Deformable DETR option: set architecture='deformable'")
            return
        if self.num_feature_levels < 1 or self.num_points < 1:
            raise ValueError(f"num_feature_levels and num_points must be at least 1, got {self.num_feature_levels} "
                             f"and {self.num_points}")
        if self.two_stage and not self.box_refine:
            raise ValueError("two_stage=True needs box_refine=True (as in the authors' Deformable DETR)")
        if self.hidden_dim % 32 or self.hidden_dim % self.num_heads:
            raise ValueError(f"architecture='deformable' projects every level with GroupNorm(32): hidden_dim must "
                             f"divide by 32 and by num_heads ({self.num_heads}), got {self.hidden_dim}")
        unsupported = {
            "class_head": (self.class_head != "sigmoid", "set class_head='sigmoid' (the focal head)"),
            "query_type": (self.query_type != "learned", "set query_type='learned'"),
            "position_encoding": (self.position_encoding != "sine", "set position_encoding='sine'"),
            "pre_norm": (self.pre_norm, "set pre_norm=False (the authors' layers are post-norm)"),
            "dense_aux_head": (self.dense_aux_head, "set dense_aux_head=False"),
            "backbone_last_stage": (self.backbone_last_stage != "layer4", "set backbone_last_stage='layer4' (the "
                                    "levels are layer2–4 and beyond)"),
        }
        for name, (used, fix) in unsupported.items():
            if used:
                raise ValueError(f"architecture='deformable' does not take {name}={getattr(self, name)!r}: {fix}")

    def _check_rtdetr(self) -> None:
        if self.architecture in DFINE_FAMILY:
            self._check_dfine()
        elif self.num_feature_levels < 3 or self.num_points < 1:
            raise ValueError(f"architecture='rtdetr' reads the backbone's strides 8, 16 and 32 (and optionally "
                             f"coarser levels): num_feature_levels must be at least 3 and num_points at least 1, got "
                             f"{self.num_feature_levels} and {self.num_points}")
        encoder_hidden_dim = self.encoder_hidden_dim or self.hidden_dim
        if self.hidden_dim % self.num_heads or encoder_hidden_dim % self.num_heads or encoder_hidden_dim % 4:
            raise ValueError(f"architecture={self.architecture!r} needs hidden_dim ({self.hidden_dim}) and encoder_hidden_dim "
                             f"({encoder_hidden_dim}) divisible by num_heads ({self.num_heads}), and "
                             f"encoder_hidden_dim by 4 (its 2-D sin-cos positions)")
        unsupported = {
            "class_head": (self.class_head != "sigmoid", "set class_head='sigmoid' (the varifocal head)"),
            "query_type": (self.query_type != "learned", "set query_type='learned' (queries come from the encoder)"),
            "position_encoding": (self.position_encoding != "sine", "set position_encoding='sine'"),
            "pre_norm": (self.pre_norm, "set pre_norm=False (the authors' layers are post-norm)"),
            "dilation": (self.dilation, "set dilation=False"),
            "dense_aux_head": (self.dense_aux_head, "set dense_aux_head=False"),
            "box_refine": (self.box_refine, "drop it: RT-DETR always refines its boxes"),
            "two_stage": (self.two_stage, "drop it: RT-DETR's queries always come from the encoder"),
            "backbone_last_stage": (self.backbone_last_stage != "layer4", "set backbone_last_stage='layer4'"),
        }
        for name, (used, fix) in unsupported.items():
            if used:
                raise ValueError(f"architecture={self.architecture!r} does not take {name}={getattr(self, name)!r}: "
                                 f"{fix}")

    def _check_dfine(self) -> None:
        if self.num_feature_levels not in (2, 3) or self.num_points < 1:
            raise ValueError(f"architecture={self.architecture!r} reads HGNetV2's last 3 stages (or 2, the N models), "
                             f"one decoder level "
                             f"each: num_feature_levels must be 2 or 3 and num_points at least 1, got "
                             f"{self.num_feature_levels} and {self.num_points}")
        points = self.num_points_per_level
        if points is not None and (len(points) != self.num_feature_levels or min(points) < 1):
            raise ValueError(f"num_points_per_level must give a count >= 1 for each of the {self.num_feature_levels} "
                             f"levels, got {points}")
        if self.max_num_bins < 4 or self.max_num_bins % 2 or self.lqe_top_k > self.max_num_bins + 1:
            raise ValueError(f"max_num_bins must be even and at least 4, and lqe_top_k at most max_num_bins + 1, got "
                             f"{self.max_num_bins} and {self.lqe_top_k}")
        if self.lite_encoder and self.num_feature_levels != 2:
            raise ValueError(f"lite_encoder=True fuses HGNetV2's last 2 stages: set num_feature_levels=2, got "
                             f"{self.num_feature_levels}")
        if self.lite_encoder and self.num_encoder_layers:
            raise ValueError(f"lite_encoder=True has no AIFI layers: set num_encoder_layers=0, got "
                             f"{self.num_encoder_layers}")
        if self.backbone != "dinov3_vit":
            for name in ("vit_dim", "vit_depth", "vit_heads", "vit_mlp_dim", "vit_register_tokens", "vit_out_layers",
                         "vit_gated_mlp", "adapter_channels"):
                if getattr(self, name) != DEIMV2_DEFAULTS[name]:
                    raise ValueError(f"{name}={getattr(self, name)!r} sizes the DINOv3 ViT: set backbone='dinov3_vit'")
        if self.backbone == "dinov3_vit" and (self.num_feature_levels != 3 or self.lite_encoder):
            raise ValueError("backbone='dinov3_vit' gives three levels to the hybrid encoder: set "
                             "num_feature_levels=3 and lite_encoder=False")
        if self.backbone == "dinov3_vit" and (self.vit_dim % self.vit_heads or self.vit_dim // self.vit_heads % 4
                                              or len(self.vit_out_layers) != 3):
            raise ValueError(f"the DINOv3 ViT needs vit_dim divisible by vit_heads into heads of a multiple of 4 "
                             f"(its rotary positions) and three vit_out_layers, got {self.vit_dim}, {self.vit_heads} "
                             f"and {self.vit_out_layers}")
        for name in ("decoder_activation", "decoder_mlp_activation"):
            if getattr(self, name) not in ("relu", "silu"):
                raise ValueError(f"{name} must be 'relu' or 'silu', got {getattr(self, name)!r}")
        if self.architecture == "deimv2" and self.decoder_mlp_activation != "relu":
            raise ValueError(f"decoder_mlp_activation={self.decoder_mlp_activation!r} is D-FINE's (DEIM's) option: "
                             f"DEIMv2's query positions take decoder_activation, its heads ReLU")

    def _check_rfdetr(self) -> None:
        out = self.vit_out_indices
        if not out or list(out) != sorted(set(out)) or out[0] < 1 or out[-1] > self.vit_num_layers:
            raise ValueError(f"vit_out_indices must be increasing stages in 1..vit_num_layers ({self.vit_num_layers}), "
                             f"got {list(out)}")
        if self.vit_hidden_dim % self.vit_num_heads or self.hidden_dim % self.num_heads or (
                self.hidden_dim % self.cross_attention_heads):
            raise ValueError(f"architecture='rfdetr' needs vit_hidden_dim ({self.vit_hidden_dim}) divisible by "
                             f"vit_num_heads ({self.vit_num_heads}) and hidden_dim ({self.hidden_dim}) by num_heads "
                             f"({self.num_heads}) and cross_attention_heads ({self.cross_attention_heads})")
        if min(self.vit_num_windows, self.vit_patch_size, self.vit_position_size, self.num_points) < 1:
            raise ValueError("vit_num_windows, vit_patch_size, vit_position_size and num_points must be at least 1")
        unsupported = {
            "num_feature_levels": (self.num_feature_levels != len(self.projector_scales),
                                   f"set num_feature_levels={len(self.projector_scales)} (one per projector scale)"),
            "projector_scales": (any(scale not in (0.5, 1.0, 2.0) for scale in self.projector_scales),
                                 "use scales 0.5, 1.0 and 2.0 (LW-DETR's)"),
            "class_head": (self.class_head != "sigmoid", "set class_head='sigmoid'"),
            "query_type": (self.query_type != "learned", "set query_type='learned' (queries come from the encoder)"),
            "position_encoding": (self.position_encoding != "sine", "set position_encoding='sine'"),
            "pre_norm": (self.pre_norm, "set pre_norm=False (the decoder's layers are post-norm)"),
            "dilation": (self.dilation, "set dilation=False"),
            "dense_aux_head": (self.dense_aux_head, "set dense_aux_head=False"),
            "box_refine": (self.box_refine, "drop it: RF-DETR always refines its boxes"),
            "two_stage": (self.two_stage, "drop it: RF-DETR's queries always come from the encoder"),
            "backbone_last_stage": (self.backbone_last_stage != "layer4", "set backbone_last_stage='layer4'"),
            "denoising": (self.denoising, "drop it: RF-DETR trains without denoising queries"),
        }
        for name, (used, fix) in unsupported.items():
            if used:
                raise ValueError(f"architecture='rfdetr' does not take {name}={getattr(self, name)!r}: {fix}")

    @property
    def num_logits(self) -> int:
        """Outputs of the class head: num_classes + 1 (softmax: the last is "no object") or num_classes."""
        return self.num_classes + 1 if self.class_head == "softmax" else self.num_classes

    def replace(self, **changes: Any) -> DetrConfig:
        """A copy with ``changes`` applied (validated again); unknown names raise ValueError naming them."""
        return DetrConfig.from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain types only: what checkpoints store (they load with ``torch.load(weights_only=True)``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "the model configuration") -> DetrConfig:
        """The config from :meth:`to_dict`'s output (or any subset of the fields; the rest are defaults).
        A name that is not a field raises ValueError naming it and ``where`` it came from."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"{where}: unknown model option(s) {unknown}; the options are {sorted(names)}")
        return cls(**values)


def check_threshold(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is None or a threshold :class:`ModelMeta` can hold under ``name``:
    ``score_threshold`` strictly between 0 and 1, the panoptic thresholds in [0, 1] (NaN fails both)."""
    if value is None:
        return
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if name == "score_threshold":
        if not (number and 0.0 < value < 1.0):  # type: ignore[operator]
            raise ValueError(f"score_threshold must be a number between 0 and 1, got {value!r}")
    elif not (number and 0.0 <= value <= 1.0):  # type: ignore[operator]
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


#: The authors' evaluation resize, (shortest side, longest-side cap) in pixels: what a model that records no
#: ``eval_size`` is run at.
AUTHORS_EVAL_SIZE: tuple[int, int] = (800, 1333)


@dataclass(frozen=True)
class ModelMeta:
    """What a trained model needs at inference besides its weights and layout, as torchvision's
    ``Weights.meta``: one frozen record that travels with the model (``model.meta``) and its checkpoint.

    category_map: label → data set category id and name (None: labels are written as they are).
    eval_size: (shortest side, longest-side cap) of the resize the model was validated at (None: the
        authors' :data:`AUTHORS_EVAL_SIZE`).
    is_thing: per label, thing (True) or stuff; panoptic models only.
    panoptic_threshold, panoptic_overlap_threshold: the
        :class:`detr.inference.postprocess_masks.PostProcessPanoptic` settings the training run validated
        with (None: that class's defaults).
    score_threshold: the detection score threshold the model's last validation found best (the best mean
        F1 over the classes at IoU 0.5), the default of every command and the Predictor (None: the
        authors' 0.7, as for their released models).

    The thresholds are checked here, the one place every reader (a checkpoint's record, config.json, an
    exported file's metadata) builds the record through: a score threshold is a number strictly between 0 and 1
    (0 would keep every query, 1 none: neither is a validation's best), the panoptic ones are in [0, 1]; NaN,
    infinities, text and booleans are refused with a ``ValueError`` naming the field.
    """

    category_map: CategoryMap | None = None
    eval_size: tuple[int, int] | None = None
    is_thing: tuple[bool, ...] | None = None
    panoptic_threshold: float | None = None
    panoptic_overlap_threshold: float | None = None
    score_threshold: float | None = None

    def __post_init__(self) -> None:
        # normalise sequences so that records compare equal whatever list or tuple they were built from
        if self.eval_size is not None:
            object.__setattr__(self, "eval_size", (int(self.eval_size[0]), int(self.eval_size[1])))
        if self.is_thing is not None:
            object.__setattr__(self, "is_thing", tuple(bool(flag) for flag in self.is_thing))
        for name in ("score_threshold", "panoptic_threshold", "panoptic_overlap_threshold"):
            check_threshold(name, getattr(self, name))
        if (self.category_map is not None and self.is_thing is not None
                and len(self.is_thing) != self.category_map.num_classes):
            raise ValueError(f"is_thing has {len(self.is_thing)} entries but the category map has "
                             f"{self.category_map.num_classes} classes; give one bool per label")

    def replace(self, **changes: Any) -> ModelMeta:
        """A copy with ``changes`` applied (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, in the keys of a checkpoint's ``checkpoint["detr"]`` (read with
        ``torch.load(weights_only=True)``): category_map, eval_size, is_thing, panoptic_postprocess
        (``{"threshold", "overlap_threshold"}`` or None) and score_threshold."""
        postprocess = (None if self.panoptic_threshold is None and self.panoptic_overlap_threshold is None else
                       {"threshold": self.panoptic_threshold, "overlap_threshold": self.panoptic_overlap_threshold})
        return {
            "category_map": self.category_map.to_dict() if self.category_map is not None else None,
            "eval_size": list(self.eval_size) if self.eval_size is not None else None,
            "is_thing": list(self.is_thing) if self.is_thing is not None else None,
            "panoptic_postprocess": postprocess,
            "score_threshold": self.score_threshold,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelMeta:
        """The record from :meth:`to_dict`'s keys; absent or empty ones are None, other keys are ignored
        (``checkpoint["detr"]`` also holds the model config)."""
        postprocess = values.get("panoptic_postprocess") or {}
        return cls(
            category_map=CategoryMap.from_dict(values["category_map"]) if values.get("category_map") else None,
            eval_size=tuple(values["eval_size"]) if values.get("eval_size") else None,
            is_thing=tuple(values["is_thing"]) if values.get("is_thing") else None,
            panoptic_threshold=postprocess.get("threshold"),
            panoptic_overlap_threshold=postprocess.get("overlap_threshold"),
            score_threshold=values.get("score_threshold"),
        )
