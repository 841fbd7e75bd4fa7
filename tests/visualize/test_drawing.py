"""detr.visualize.drawing: labels that cover no other label and stay inside the image, on small images too."""

from __future__ import annotations

import itertools
from dataclasses import replace

import torch

from detr.inference.prediction import Prediction
from detr.visualize.drawing import (
    LEGEND_PREDICTED,
    LEGEND_TRUE,
    draw_detections,
    draw_tracks,
    label_color,
    label_rectangles,
)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_labels_of_crowded_boxes_on_a_small_image_cover_no_other_label() -> None:
    """On the shapes set's 128-px images every label sat at its box's top-left corner, so the true and the
    predicted label of one object, and those of neighbours, were drawn over each other."""
    boxes = [[10, 20, 60, 50], [12, 21, 59, 52], [50, 40, 110, 100], [52, 41, 109, 102], [15, 70, 40, 120]]
    sizes = [(30, 13), (44, 13), (30, 13), (44, 13), (30, 13)]
    rectangles = label_rectangles(boxes, sizes, (128, 128))
    assert all(0 <= x0 and 0 <= y0 and x1 <= 128 and y1 <= 128 for x0, y0, x1, y1 in rectangles)
    assert [(x1 - x0, y1 - y0) for x0, y0, x1, y1 in rectangles] == sizes
    assert not [pair for pair in itertools.combinations(rectangles, 2) if _overlap(*pair)]
    assert rectangles[0][3] <= boxes[0][1]  # where there is room, above its box: the object stays visible


def test_true_and_predicted_labels_of_one_object_are_both_drawn() -> None:
    image = torch.full((3, 128, 128), 90, dtype=torch.uint8)
    true = torch.tensor([[10.0, 30.0, 60.0, 70.0]])
    drawn = draw_detections(image, boxes_xyxy=true + 1, labels=torch.tensor([0]), scores=torch.tensor([0.9]),
                            true_boxes_xyxy=true, true_labels=torch.tensor([0]))
    colours = {tuple(pixel) for pixel in drawn.permute(1, 2, 0).reshape(-1, 3).tolist()}
    assert LEGEND_TRUE in colours and LEGEND_PREDICTED in colours  # each label's background shows


def test_labels_of_a_small_image_are_small_and_leave_the_objects_visible() -> None:
    """On 128-px images the labels (11 px text, half the image wide) covered the shapes: the text scales with the
    image within [8, 36] px, and a label takes the place beside its box that covers the fewest objects."""
    from detr.visualize.drawing import MAX_LABEL_FONT, MIN_LABEL_FONT, _font_size

    assert (_font_size(128), _font_size(640), _font_size(4000)) == (MIN_LABEL_FONT, 20, MAX_LABEL_FONT)
    # the box's top edge touches another object: above it the label would cover that object, below it nothing
    boxes = [[40, 60, 90, 100], [40, 30, 90, 60]]
    [first, _] = label_rectangles(boxes, [(40, 10), (40, 10)], (128, 128))
    assert first[1] >= boxes[0][3]  # below its box
    assert not _overlap(first, boxes[1]) and not _overlap(first, boxes[0])


def test_a_label_stays_inside_an_image_narrower_than_its_text(monkeypatch) -> None:
    """A label wider than the image was cut at its edge: its text is made smaller to fit."""
    from detr.visualize import drawing

    measured = []

    def record(boxes, sizes, image_size, **kwargs):
        measured.extend(sizes)
        return [(0, 0, w, h) for w, h in sizes]

    monkeypatch.setattr(drawing, "label_rectangles", record)
    image = torch.full((3, 40, 60), 90, dtype=torch.uint8)
    drawing.draw_labels(image, torch.tensor([[2.0, 10.0, 50.0, 30.0]]), ["traffic light 0.93"], [(200, 0, 0)],
                        font_size=11)
    [(width, _)] = measured
    assert width <= 60


def test_keypoints_are_drawn_with_their_skeleton_in_the_label_colour_and_hidden_ones_left_out() -> None:
    from detr.inference.prediction import Prediction
    from detr.visualize.drawing import draw_prediction, label_color

    image = torch.zeros((3, 80, 120), dtype=torch.uint8)
    points = torch.tensor([[[20.0, 60.0, 0.9], [100.0, 60.0, 0.9], [60.0, 10.0, 0.1]]])
    prediction = Prediction(boxes=torch.zeros(1, 4), scores=torch.tensor([0.8]), labels=torch.tensor([2]),
                            label_names=["hand"], query_indices=torch.tensor([0]), image_size=(80, 120),
                            keypoints=points)
    drawn = draw_prediction(image, prediction, skeleton={2: [(0, 1), (1, 2)]})
    colour = torch.tensor(label_color(2), dtype=torch.uint8)
    assert torch.equal(drawn[:, 60, 60], colour)  # on the line between the two visible points
    assert torch.equal(drawn[:, 60, 20], colour)  # a point's centre (its rim is white)
    assert not drawn[:, 10, 60].any() and not drawn[:, 35, 80].any()  # the hidden point and its line are not drawn
    assert not draw_prediction(image, prediction, skeleton=None)[:, 60, 60].any()  # points only
    # a predictor's prediction carries its category map's skeletons: drawn without being passed
    joined = replace(prediction, keypoint_skeletons={2: ((0, 1),)})
    assert torch.equal(draw_prediction(image, joined)[:, 60, 60], colour)


def test_a_tracked_frame_draws_tracked_boxes_in_their_tracks_colours_and_the_trails() -> None:
    image = torch.full((3, 96, 128), 255, dtype=torch.uint8)
    prediction = Prediction(boxes=torch.tensor([[10.0, 40.0, 30.0, 60.0], [70.0, 40.0, 90.0, 60.0]]),
                            scores=torch.tensor([0.9, 0.8]), labels=torch.tensor([0, 0]), label_names=["a", "a"],
                            query_indices=torch.arange(2), image_size=(96, 128), track_ids=torch.tensor([3, -1]))
    drawn = draw_tracks(image, prediction, {3: [(20.0, 90.0), (60.0, 90.0)], 5: [(100.0, 5.0), (120.0, 5.0)]})
    pixels = {tuple(drawn[:, y, x].tolist()) for y, x in ((40, 20), (90, 40), (5, 110))}
    assert tuple(label_color(3)) in pixels and tuple(label_color(5)) in pixels  # box top edge, both trails
    assert drawn[:, 40:61, 70:91].eq(255).all()  # the untracked detection is not drawn
