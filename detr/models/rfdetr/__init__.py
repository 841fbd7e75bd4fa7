"""RF-DETR and LW-DETR, for inference: docs/rfdetr.md."""
