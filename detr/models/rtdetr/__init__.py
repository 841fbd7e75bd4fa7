"""RT-DETR and RT-DETRv2: ResNet-vd, the hybrid encoder, query selection and the deformable decoder
(docs/models/rtdetr.md)."""
