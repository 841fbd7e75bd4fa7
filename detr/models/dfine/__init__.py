"""D-FINE: HGNetV2, RT-DETR's hybrid encoder with D-FINE's fusion blocks, and the Fine-grained Distribution
Refinement decoder (docs/models/dfine.md)."""
