"""Deformable DETR: its encoder and decoder (:mod:`.transformer`) over the shared multi-scale deformable attention
(:mod:`detr.models.layers.deformable_attention`), and the detector (:mod:`.model`)."""
