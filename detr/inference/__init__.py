"""From raw predictions to results: post-processing (``postprocess``, ``postprocess_masks``), users' images
(``images``), the :class:`~detr.inference.predictor.Predictor` and what it returns (``prediction``), and the
files a prediction run writes (``outputs``, ``panoptic_outputs``)."""
