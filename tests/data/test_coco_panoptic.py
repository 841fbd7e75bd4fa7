"""COCO panoptic data set on the synthetic shapes: masks from the PNGs, boxes around them, labels, transforms
that move masks with the image, and a batch the panoptic model and mask losses accept."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from detr.categories import coco_panoptic_categories_json, coco_panoptic_category_map
from detr.data.coco_panoptic import CocoPanoptic, is_coco_panoptic, masks_to_boxes_xyxy
from detr.data.collate import collate_detection
from detr.data.shapes import ShapesConfig
from detr.data.shapes_panoptic import write_shapes_panoptic
from detr.data.transforms import make_eval_transform, make_train_transform
from detr.loss.criterion import SetCriterion
from detr.loss.masks import MaskLoss
from tests.helpers import tiny_config_with

CONFIG = ShapesConfig(num_train=6, num_val=2, image_size=64, min_object_size=10, max_object_size=30, max_objects=4)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes_panoptic")
    write_shapes_panoptic(root, CONFIG)
    return root


def dataset(root, transform=None):
    return CocoPanoptic(root / "train2017", root / "annotations" / "panoptic_train2017.json", transform=transform)


def test_targets_are_the_pngs_segments(root):
    data = dataset(root)
    annotations = json.loads((root / "annotations" / "panoptic_train2017.json").read_text())["annotations"]
    assert data.category_map.names[-1] == "background" and data.is_thing == [True] * 5 + [False]
    for index, annotation in enumerate(annotations):
        image, target = data[index]
        segments = annotation["segments_info"]
        assert image.shape == (3, 64, 64) and target["masks"].shape == (len(segments), 64, 64)
        assert target["labels"].tolist() == [s["category_id"] - 1 for s in segments]  # contiguous labels
        assert target["masks"].sum((1, 2)).tolist() == [s["area"] for s in segments]
        assert target["masks"].sum(0).eq(1).all()  # a partition: every pixel in exactly one segment
        boxes = [[x, y, x + w, y + h] for x, y, w, h in (s["bbox"] for s in segments)]
        assert target["boxes_xyxy"].tolist() == boxes


def test_resize_and_random_crops_move_masks_with_boxes(root):
    # the mask lies in its box up to nearest-resize rounding: < 1 output pixel per resize, and the train
    # recipe resizes twice (the second up to 2.5×: 3 px); clamped boxes may be wider than what a crop left
    for transform, slack in ((make_eval_transform(min_size=96, max_size=128), 1),
                             (make_train_transform(scales=[48, 64, 80], max_size=120, crop_resize_scales=[64, 80],
                                                   crop_min_size=32, crop_max_size=60, seed=0), 3)):
        data = dataset(root, transform)
        for trial in range(24):
            image, target = data[trial % len(data)]
            masks, boxes = target["masks"], target["boxes_xyxy"]
            assert masks.shape[1:] == image.shape[1:] and len(masks) == len(boxes) == len(target["labels"])
            assert masks.flatten(1).any(1).all()
            around = torch.from_numpy(masks_to_boxes_xyxy(masks.numpy()))
            assert (around[:, :2] >= boxes[:, :2] - slack).all() and (around[:, 2:] <= boxes[:, 2:] + slack).all()


def test_a_batch_trains_the_panoptic_model(root):
    from detr.models.segmentation import build_detr_panoptic

    data = dataset(root)
    images, padding_mask, targets = collate_detection([data[0], data[4]])
    assert targets[0]["boxes"].shape[-1] == 4 and targets[0]["masks"].dtype == torch.bool
    torch.manual_seed(0)
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8, num_decoder_layers=1, num_queries=8,
                                                 num_classes=data.category_map.num_classes))
    losses = SetCriterion(data.category_map.num_classes, num_decoder_layers=1, parts=[MaskLoss()])(
        model(images, padding_mask), targets)
    assert torch.isfinite(torch.stack(list(losses.values()))).all() and losses["loss_dice"] > 0


def test_coco_panoptic_categories_give_the_authors_label_space():
    categories = coco_panoptic_categories_json()
    assert is_coco_panoptic(categories) and not is_coco_panoptic(categories[:-1])
    assert coco_panoptic_category_map().num_classes == 250
    assert np.array([c["isthing"] for c in categories]).sum() == 80


def test_predictions_score_against_the_ground_truth(root):
    """Data set → model → panoptic post-processing → PQ runs end to end; the ground truth scores PQ 1."""
    from detr.evaluation.panoptic import PanopticQuality
    from detr.inference.postprocess_masks import PostProcessPanoptic
    from detr.models.segmentation import build_detr_panoptic

    data = dataset(root)
    metric, perfect = PanopticQuality(data.categories), PanopticQuality(data.categories)
    torch.manual_seed(0)
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8, num_decoder_layers=1, num_queries=8,
                                                 num_classes=6)).eval()
    post = PostProcessPanoptic(data.is_thing, threshold=0.0, category_ids=data.category_map.category_ids)
    images, padding_mask, targets = collate_detection([data[0], data[1]])
    with torch.no_grad():
        results = post(model(images, padding_mask), torch.stack([t["size"] for t in targets]),
                       torch.stack([t["orig_size"] for t in targets]))
    for index, result in enumerate(results):
        gt_ids, gt_segments = data.ground_truth(index)
        metric.update(gt_ids, gt_segments, result["id_map"], result["segments_info"])
        perfect.update(gt_ids, gt_segments, gt_ids, gt_segments)
    assert 0 <= metric.compute()["All"]["pq"] < 1 and perfect.compute()["All"]["pq"] == 1.0


def test_images_without_a_panoptic_annotation_are_named(root, tmp_path, caplog):
    """An image of the json's 'images' without an annotation was left out of training and evaluation silently."""
    data = json.loads((root / "annotations" / "panoptic_train2017.json").read_text())
    data["images"].append({"id": 9001, "file_name": "000000009001.jpg", "width": 64, "height": 64})
    annotations = tmp_path / "panoptic_train2017.json"
    annotations.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="detr.data.coco_panoptic"):
        panoptic = CocoPanoptic(root / "train2017", annotations, root / "annotations" / "panoptic_train2017")
    assert len(panoptic) == len(data["annotations"])
    assert f"1 of the {len(data['images'])} images of '{annotations}' have no panoptic annotation" in caplog.text
    assert "[9001]" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="detr.data.coco_panoptic"):
        dataset(root)  # every image annotated: nothing to say
    assert "no panoptic annotation" not in caplog.text


def test_a_file_that_breaks_mid_run_is_skipped_in_training_and_named_otherwise(root, tmp_path, caplog):
    """A panoptic image or PNG that passed the start-up check but broke mid-run ended the run (the detection set
    skips it): with skip_unreadable the next sample takes its place, the file is named once and the sample
    carries it in "skipped_files" for the loop's count; without it the error names the file."""
    import shutil

    from detr.data.images import ImageLoadError

    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    annotations = copy / "annotations" / "panoptic_train2017.json"
    training = CocoPanoptic(copy / "train2017", annotations, skip_unreadable=True)
    strict = CocoPanoptic(copy / "train2017", annotations)
    first_png, second_image = training.png_path(0), training.image_path(1)
    first_png.write_bytes(b"not a png any more")
    second_image.write_bytes(first_png.read_bytes()[:5])

    with caplog.at_level("WARNING", logger="detr.data.images"):
        image, target = training[0]  # samples 0 and 1 are broken: sample 2 takes their place
    assert target["image_id"].item() == training.annotations[2]["image_id"]
    assert target["skipped_files"] == [str(first_png), str(second_image)]
    assert training.num_skipped == 2 and f"skipping image file '{first_png}'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="detr.data.images"):
        assert training[1][1]["skipped_files"] == [str(second_image)]
    assert "skipping" not in caplog.text  # named once
    with pytest.raises(ImageLoadError, match=f"panoptic PNG '{first_png}' .* cannot be read"):
        strict[0]
    with pytest.raises(ImageLoadError, match=str(second_image)):
        strict[1]


def test_a_segment_id_listed_twice_is_named_as_the_jsons_fault(root, tmp_path):
    """A duplicated segment id trained the same PNG pixels twice, and the evaluation blamed the PNG."""
    from detr.data.coco import AnnotationFileError

    data = json.loads((root / "annotations" / "panoptic_train2017.json").read_text())
    segments = data["annotations"][0]["segments_info"]
    segments.append(dict(segments[0]))
    annotations = tmp_path / "panoptic_train2017.json"
    annotations.write_text(json.dumps(data))
    with pytest.raises(AnnotationFileError) as error:
        CocoPanoptic(root / "train2017", annotations, root / "annotations" / "panoptic_train2017")
    message = str(error.value)
    assert f"segments_info lists segment id {segments[0]['id']} twice" in message
    assert f"(image_id {data['annotations'][0]['image_id']})" in message and "not the PNG" in message


@pytest.mark.parametrize("field", ["images", "annotations"])
def test_file_names_outside_their_folders_are_refused_and_backslashes_are_separators(root, tmp_path, field):
    """The panoptic set resolves image and PNG names by the detection set's rule (detr.data.file_names)."""
    import shutil

    from detr.data.coco import AnnotationFileError

    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    annotations = copy / "annotations" / "panoptic_train2017.json"
    data = json.loads(annotations.read_text())
    entry = data[field][0]
    entry["file_name"] = "../../" + entry["file_name"]
    annotations.write_text(json.dumps(data))
    with pytest.raises(AnnotationFileError, match=r"file_name '\.\./\.\./.*' \(image id \d+\) is a path with '\.\.'"):
        CocoPanoptic(copy / "train2017", annotations)
    entry["file_name"] = "sub\\" + entry["file_name"][len("../../"):]
    folder = copy / "train2017" if field == "images" else copy / "annotations" / "panoptic_train2017"
    (folder / "sub").mkdir()
    shutil.move(folder / entry["file_name"][len("sub\\"):], folder / "sub")
    annotations.write_text(json.dumps(data))
    panoptic = CocoPanoptic(copy / "train2017", annotations)
    index = panoptic.index_of_image(data["annotations"][0]["image_id"] if field == "annotations" else entry["id"])
    path = panoptic.image_path(index) if field == "images" else panoptic.png_path(index)
    assert path.parent == folder / "sub" and path.is_file()
    assert panoptic[index][1]["masks"].any()
