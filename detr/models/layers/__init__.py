"""The blocks more than one family builds on, so that a family folder imports these and at most its declared
parent, never another family's folder: multi-scale deformable attention (:mod:`.deformable_attention`), multi-head
attention and dropout (:mod:`.attention`), RT-DETR's decoder layer (:mod:`.decoder_layer`), the cells' anchor boxes
of two-stage query selection (:mod:`.cell_anchors`), the denoising queries' place and attention mask
(:mod:`.denoising`), convolution + norm and BatchNorm folding (:mod:`.conv_norm`), the heads' MLP (:mod:`.mlp`),
position encodings (:mod:`.position_encoding`), the GroupPose keypoint head (:mod:`.keypoint_head`); and the CPU
and export kernels behind them (:mod:`.cpu_kernels`)."""
