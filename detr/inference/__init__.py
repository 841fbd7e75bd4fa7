"""From raw predictions to results: post-processing, the Predictor, and the files a prediction run writes."""
