"""detr.inference.autolabel's COCO data set from Predictions (boxes clipped to the image, a box with no area left
out, categories = the prompt's phrases in order) and detr.inference.grounding.prompt_phrases."""

from __future__ import annotations

import pytest
import torch

from detr.inference.autolabel import autolabel_dataset, labelled_images
from detr.inference.grounding import prompt_phrases
from detr.inference.prediction import Prediction


def _prediction(boxes, labels, scores, size=(100, 200)) -> Prediction:
    return Prediction(boxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), scores=torch.tensor(scores),
                      labels=torch.tensor(labels, dtype=torch.int64), label_names=["x"] * len(labels),
                      query_indices=torch.arange(len(labels)), image_size=size)


def test_phrases_in_prompt_order_and_bad_prompts_refused():
    assert prompt_phrases("a cat. a remote control.") == ["a cat", "a remote control"]
    assert prompt_phrases("circle. square") == ["circle", "square"]
    assert prompt_phrases(["Circle", "square"]) == ["circle", "square"]
    assert prompt_phrases("what is it? a dog.") == ["what is it", "a dog"]
    with pytest.raises(ValueError, match="empty phrase"):
        prompt_phrases("a cat.. a dog.")
    with pytest.raises(ValueError, match="twice"):
        prompt_phrases("a cat. a dog. a cat.")


def test_boxes_clipped_scores_kept_categories_from_one():
    first = _prediction([[-5.0, 10.0, 50.0, 40.0], [190.0, 90.0, 260.0, 130.0], [210.0, 0.0, 250.0, 20.0]],
                        [1, 0, 0], [0.9, 0.5, 0.4])
    second = _prediction(torch.zeros(0, 4).tolist(), [], [], size=(30, 40))
    data = autolabel_dataset([first, second], ["a.jpg", "sub/b.jpg"], ["circle", "square"], info={"prompt": "p"})
    assert data["categories"] == [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}]
    assert data["images"] == [{"id": 1, "file_name": "a.jpg", "width": 200, "height": 100},
                              {"id": 2, "file_name": "sub/b.jpg", "width": 40, "height": 30}]
    # the third box lies right of the 200-px image: nothing of it is left once clipped
    assert data["annotations"] == [
        {"id": 1, "image_id": 1, "category_id": 2, "bbox": [0.0, 10.0, 50.0, 30.0], "area": 1500.0, "iscrowd": 0,
         "score": pytest.approx(0.9)},
        {"id": 2, "image_id": 1, "category_id": 1, "bbox": [190.0, 90.0, 10.0, 10.0], "area": 100.0, "iscrowd": 0,
         "score": pytest.approx(0.5)}]
    assert data["info"] == {"prompt": "p"} and labelled_images(data) == 1
