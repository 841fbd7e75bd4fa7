"""The anchor-query detector (DAB-DETR anchors, DN-DETR denoising, Group DETR groups) beside the paper's model:
``model`` (AnchorDETR), ``decoder`` (its anchor decoder) and ``denoising`` (DN-DETR's noised queries)."""
