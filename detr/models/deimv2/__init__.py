"""DEIMv2 (docs/models/deimv2.md): D-FINE's parts (its declared parent) with RMSNorm and SwiGLU decoder layers,
summed RepNCSPELAN5 fusion or the lite encoder, on HGNetV2 or a DINOv3 ViT with the spatial tuning adapter."""
