import json
import pickle

import numpy as np
from PIL import Image

from detr.data.coco import CocoDetection, coco_from_dict
from detr.data.coco_index import CocoIndex
from detr.data.synthetic_coco import SyntheticCocoConfig, synthetic_coco_dict, write_synthetic_coco


def test_the_index_holds_what_pycocotools_holds_per_image():
    data = synthetic_coco_dict(SyntheticCocoConfig(num_images=40, boxes_per_image=4, crowd_fraction=0.2, seed=3),
                               [f"{i}.jpg" for i in range(40)])
    data["images"].reverse()  # json order is not id order
    del data["annotations"][0]["area"]
    index = CocoIndex.from_coco_dict(json.loads(json.dumps(data)))
    coco = coco_from_dict(data)
    assert index.image_ids.tolist() == sorted(coco.imgs) and len(index) == 40
    for position, image_id in enumerate(index.image_ids.tolist()):
        assert index.file_name(position) == coco.imgs[image_id]["file_name"]
        assert (index.heights[position], index.widths[position]) == (coco.imgs[image_id]["height"],
                                                                       coco.imgs[image_id]["width"])
        annotations = coco.imgToAnns.get(image_id, [])
        rows = index.annotation_rows(position)
        np.testing.assert_array_equal(index.boxes_xywh[rows], np.array([a["bbox"] for a in annotations]).reshape(-1, 4))
        assert index.category_ids[rows].tolist() == [a["category_id"] for a in annotations]
        assert index.iscrowd[rows].tolist() == [bool(a["iscrowd"]) for a in annotations]
        np.testing.assert_allclose(index.areas[rows], [a["area"] for a in annotations])
    assert index.positions_of([index.image_ids[5], index.image_ids[2]]).tolist() == [5, 2]


def test_the_data_set_builds_the_ground_truth_only_when_asked(tmp_path):
    json_file = write_synthetic_coco(tmp_path, SyntheticCocoConfig(num_images=6, boxes_per_image=3, seed=2))
    dataset = CocoDetection(tmp_path / "train2017", json_file)
    dataset[0], dataset.raw_sample(3)
    assert dataset._coco is None  # reading samples never builds pycocotools' index
    assert sorted(dataset.coco.getImgIds()) == dataset.ids == [1, 2, 3, 4, 5, 6]
    assert pickle.loads(pickle.dumps(dataset))._coco is None  # a spawned worker gets the arrays only
    dataset.ids = [2, 5]
    assert len(dataset) == 2 and dataset.image_path(1).name == "000000000005.jpg"
    assert dataset.leave_out({"000000000002.jpg"}) == 1 and dataset.ids == [5]


def test_boxes_of_an_image_without_json_size(tmp_path):
    (tmp_path / "images").mkdir()
    Image.new("RGB", (20, 10)).save(tmp_path / "images" / "a.png")
    data = {"images": [{"id": 7, "file_name": "a.png"}], "categories": [{"id": 1, "name": "x"}],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [2, 2, 30, 4]}]}
    (tmp_path / "a.json").write_text(json.dumps(data))
    raw = CocoDetection(tmp_path / "images", tmp_path / "a.json").raw_sample(0)
    np.testing.assert_allclose(raw.boxes_xyxy, [[2, 2, 20, 6]])  # clamped to the decoded width


def test_the_bulk_bbox_check_says_no_to_what_the_one_by_one_check_refuses():
    from detr.data.coco import all_coco_bboxes, is_coco_bbox

    good = [[0, 1, 2.5, 3], [1.0, 1, 1, 1]]
    assert all_coco_bboxes(good) and all_coco_bboxes([])
    for bad in ([0, 1, 2, True], [0, 1, 2, "3"], [0, 1, 2], [0, 1, 2, float("nan")], None, {"x": 1, "y": 2, "w": 3,
                                                                                           "h": 4}):
        assert not is_coco_bbox(bad) and not all_coco_bboxes([*good, bad]), bad
