"""RF-DETR and LW-DETR, for inference: docs/models/rfdetr.md."""
