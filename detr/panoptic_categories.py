"""COCO panoptic's 133 categories (80 things, 53 stuff) and the label space of the authors' panoptic models.

The released panoptic checkpoints predict 250 classes + "no object": COCO panoptic's raw category ids
(1–200, with gaps) are the labels, as for detection (paper §4.4; the unused ids are never targets).
"""

from __future__ import annotations

from detr.categories import UNUSED_NAME, CategoryMap

#: (id, name, isthing) as in COCO panoptic 2017's panoptic_coco_categories.json / panoptic_val2017.json.
COCO_PANOPTIC_CATEGORIES: tuple[tuple[int, str, bool], ...] = (
    (1, "person", True), (2, "bicycle", True), (3, "car", True), (4, "motorcycle", True), (5, "airplane", True),
    (6, "bus", True), (7, "train", True), (8, "truck", True), (9, "boat", True), (10, "traffic light", True),
    (11, "fire hydrant", True), (13, "stop sign", True), (14, "parking meter", True), (15, "bench", True),
    (16, "bird", True), (17, "cat", True), (18, "dog", True), (19, "horse", True), (20, "sheep", True),
    (21, "cow", True), (22, "elephant", True), (23, "bear", True), (24, "zebra", True), (25, "giraffe", True),
    (27, "backpack", True), (28, "umbrella", True), (31, "handbag", True), (32, "tie", True),
    (33, "suitcase", True), (34, "frisbee", True), (35, "skis", True), (36, "snowboard", True),
    (37, "sports ball", True), (38, "kite", True), (39, "baseball bat", True), (40, "baseball glove", True),
    (41, "skateboard", True), (42, "surfboard", True), (43, "tennis racket", True), (44, "bottle", True),
    (46, "wine glass", True), (47, "cup", True), (48, "fork", True), (49, "knife", True), (50, "spoon", True),
    (51, "bowl", True), (52, "banana", True), (53, "apple", True), (54, "sandwich", True), (55, "orange", True),
    (56, "broccoli", True), (57, "carrot", True), (58, "hot dog", True), (59, "pizza", True),
    (60, "donut", True), (61, "cake", True), (62, "chair", True), (63, "couch", True),
    (64, "potted plant", True), (65, "bed", True), (67, "dining table", True), (70, "toilet", True),
    (72, "tv", True), (73, "laptop", True), (74, "mouse", True), (75, "remote", True), (76, "keyboard", True),
    (77, "cell phone", True), (78, "microwave", True), (79, "oven", True), (80, "toaster", True),
    (81, "sink", True), (82, "refrigerator", True), (84, "book", True), (85, "clock", True), (86, "vase", True),
    (87, "scissors", True), (88, "teddy bear", True), (89, "hair drier", True), (90, "toothbrush", True),
    (92, "banner", False), (93, "blanket", False), (95, "bridge", False), (100, "cardboard", False),
    (107, "counter", False), (109, "curtain", False), (112, "door-stuff", False), (118, "floor-wood", False),
    (119, "flower", False), (122, "fruit", False), (125, "gravel", False), (128, "house", False),
    (130, "light", False), (133, "mirror-stuff", False), (138, "net", False), (141, "pillow", False),
    (144, "platform", False), (145, "playingfield", False), (147, "railroad", False), (148, "river", False),
    (149, "road", False), (151, "roof", False), (154, "sand", False), (155, "sea", False),
    (156, "shelf", False), (159, "snow", False), (161, "stairs", False), (166, "tent", False),
    (168, "towel", False), (171, "wall-brick", False), (175, "wall-stone", False), (176, "wall-tile", False),
    (177, "wall-wood", False), (178, "water-other", False), (180, "window-blind", False),
    (181, "window-other", False), (184, "tree-merged", False), (185, "fence-merged", False),
    (186, "ceiling-merged", False), (187, "sky-other-merged", False), (188, "cabinet-merged", False),
    (189, "table-merged", False), (190, "floor-other-merged", False), (191, "pavement-merged", False),
    (192, "mountain-merged", False), (193, "grass-merged", False), (194, "dirt-merged", False),
    (195, "paper-merged", False), (196, "food-other-merged", False), (197, "building-other-merged", False),
    (198, "rock-merged", False), (199, "wall-other-merged", False), (200, "rug-merged", False),
)

#: Classes of the authors' COCO panoptic models (logits: this + 1).
COCO_PANOPTIC_NUM_CLASSES = 250


def coco_panoptic_category_map(num_classes: int = COCO_PANOPTIC_NUM_CLASSES) -> CategoryMap:
    """Labels 0 … num_classes − 1 are COCO panoptic category ids; ids no category uses are named "N/A"."""
    if num_classes <= max(cid for cid, _, _ in COCO_PANOPTIC_CATEGORIES):
        raise ValueError(f"COCO panoptic's raw ids go up to 200: num_classes must be at least 201, got {num_classes}")
    names = {cid: name for cid, name, _ in COCO_PANOPTIC_CATEGORIES}
    return CategoryMap(tuple(range(num_classes)), tuple(names.get(i, UNUSED_NAME) for i in range(num_classes)))


def coco_panoptic_is_thing(num_classes: int = COCO_PANOPTIC_NUM_CLASSES) -> list[bool]:
    """Per label (= COCO panoptic id), whether it is a thing (countable object) rather than stuff: id ≤ 90,
    the rule of the authors' panoptic evaluation (every thing id is ≤ 90 and every stuff id above; it also
    decides for the unused ids, should a model predict one)."""
    return [label <= 90 for label in range(num_classes)]


def coco_panoptic_categories_json() -> list[dict]:
    """The ``categories`` list of a COCO panoptic json (id, name, isthing), e.g. for PQ."""
    return [{"id": cid, "name": name, "isthing": int(isthing)} for cid, name, isthing in COCO_PANOPTIC_CATEGORIES]
