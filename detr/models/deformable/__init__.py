"""Deformable DETR: multi-scale deformable attention (:mod:`.attention`), its encoder and decoder
(:mod:`.transformer`) and the detector (:mod:`.model`)."""
