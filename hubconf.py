"""torch.hub entry points, with the names and arguments of the authors' hubconf:

    model = torch.hub.load("<this repository>", "detr_resnet50", pretrained=True)
    model, postprocess = torch.hub.load(..., "detr_resnet50", pretrained=True, return_postprocessor=True)

``pretrained=True`` downloads the authors' COCO weights on first use (see :mod:`detr.checkpoints.released`). The
panoptic entry points return :class:`detr.DETRPanoptic` (and ``PostProcessPanoptic`` as the post-processor).
"""

from detr.checkpoints.hub import hub_model

dependencies = ["torch", "torchvision", "scipy"]


def detr_resnet50(pretrained: bool = False, num_classes: int = 91, return_postprocessor: bool = False):
    """DETR R50 (box AP 42.0 on COCO val2017 with the released weights)."""
    return hub_model("detr-r50", pretrained=pretrained, num_classes=num_classes,
                     return_postprocessor=return_postprocessor)


def detr_resnet50_dc5(pretrained: bool = False, num_classes: int = 91, return_postprocessor: bool = False):
    """DETR R50-DC5: dilated last stage, stride 16 (box AP 43.3)."""
    return hub_model("detr-r50-dc5", pretrained=pretrained, num_classes=num_classes,
                     return_postprocessor=return_postprocessor)


def detr_resnet101(pretrained: bool = False, num_classes: int = 91, return_postprocessor: bool = False):
    """DETR R101 (box AP 43.5)."""
    return hub_model("detr-r101", pretrained=pretrained, num_classes=num_classes,
                     return_postprocessor=return_postprocessor)


def detr_resnet101_dc5(pretrained: bool = False, num_classes: int = 91, return_postprocessor: bool = False):
    """DETR R101-DC5 (box AP 44.9)."""
    return hub_model("detr-r101-dc5", pretrained=pretrained, num_classes=num_classes,
                     return_postprocessor=return_postprocessor)


def detr_resnet50_panoptic(pretrained: bool = False, num_classes: int = 250, threshold: float = 0.85,
                           return_postprocessor: bool = False):
    """DETR R50 with the panoptic mask head (PQ 43.4 on COCO panoptic val2017)."""
    return hub_model("detr-r50-panoptic", pretrained=pretrained, num_classes=num_classes, threshold=threshold,
                     return_postprocessor=return_postprocessor)


def detr_resnet50_dc5_panoptic(pretrained: bool = False, num_classes: int = 250, threshold: float = 0.85,
                               return_postprocessor: bool = False):
    """DETR R50-DC5 with the panoptic mask head (PQ 44.6)."""
    return hub_model("detr-r50-dc5-panoptic", pretrained=pretrained, num_classes=num_classes, threshold=threshold,
                     return_postprocessor=return_postprocessor)


def detr_resnet101_panoptic(pretrained: bool = False, num_classes: int = 250, threshold: float = 0.85,
                            return_postprocessor: bool = False):
    """DETR R101 with the panoptic mask head (PQ 45.1)."""
    return hub_model("detr-r101-panoptic", pretrained=pretrained, num_classes=num_classes, threshold=threshold,
                     return_postprocessor=return_postprocessor)
