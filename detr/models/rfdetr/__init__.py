"""RF-DETR (and LW-DETR's decoder design), for inference: docs/rfdetr.md."""
