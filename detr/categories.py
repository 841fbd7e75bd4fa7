"""Category maps: how the model's integer labels relate to a data set's category ids and names.

DETR predicts ``num_classes + 1`` logits; label ``i`` is a model class and the last logit is "no object".
For COCO the authors use COCO's raw category ids (1..90) as labels, so ``num_classes = 91`` and the
unused ids are simply never targets (the authors' models/detr.py). Other data sets usually want contiguous
labels ``0..K-1``. A :class:`CategoryMap` records which convention a model uses, and travels with data
modules, checkpoints and prediction files, so outputs always carry the data set's own ids and names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# COCO 2017's 80 categories (id, name), as in instances_val2017.json.
COCO_CATEGORIES: tuple[tuple[int, str], ...] = (
    (1, "person"), (2, "bicycle"), (3, "car"), (4, "motorcycle"), (5, "airplane"), (6, "bus"),
    (7, "train"), (8, "truck"), (9, "boat"), (10, "traffic light"), (11, "fire hydrant"),
    (13, "stop sign"), (14, "parking meter"), (15, "bench"), (16, "bird"), (17, "cat"), (18, "dog"),
    (19, "horse"), (20, "sheep"), (21, "cow"), (22, "elephant"), (23, "bear"), (24, "zebra"),
    (25, "giraffe"), (27, "backpack"), (28, "umbrella"), (31, "handbag"), (32, "tie"),
    (33, "suitcase"), (34, "frisbee"), (35, "skis"), (36, "snowboard"), (37, "sports ball"),
    (38, "kite"), (39, "baseball bat"), (40, "baseball glove"), (41, "skateboard"),
    (42, "surfboard"), (43, "tennis racket"), (44, "bottle"), (46, "wine glass"), (47, "cup"),
    (48, "fork"), (49, "knife"), (50, "spoon"), (51, "bowl"), (52, "banana"), (53, "apple"),
    (54, "sandwich"), (55, "orange"), (56, "broccoli"), (57, "carrot"), (58, "hot dog"),
    (59, "pizza"), (60, "donut"), (61, "cake"), (62, "chair"), (63, "couch"), (64, "potted plant"),
    (65, "bed"), (67, "dining table"), (70, "toilet"), (72, "tv"), (73, "laptop"), (74, "mouse"),
    (75, "remote"), (76, "keyboard"), (77, "cell phone"), (78, "microwave"), (79, "oven"),
    (80, "toaster"), (81, "sink"), (82, "refrigerator"), (84, "book"), (85, "clock"), (86, "vase"),
    (87, "scissors"), (88, "teddy bear"), (89, "hair drier"), (90, "toothbrush"),
)

#: Name given to labels of the raw-id space that no category uses (COCO's gaps).
UNUSED_NAME = "N/A"


def class_name_key(name: str) -> str | None:
    """What two class names are matched by (a fine-tune's class rows, the checker's report of them): the name
    without case or surrounding spaces; None for :data:`UNUSED_NAME`, which matches nothing."""
    return None if name == UNUSED_NAME else name.strip().lower()


def ambiguous_class_names(data_names: list[str], checkpoint_names: list[str]) -> str | None:
    """Why a data set's classes (``data_names``, one per label) cannot be matched to a checkpoint's
    (``checkpoint_names``) by name (:func:`class_name_key`), with the fix; None when they can. Two classes of the
    data under one name would share one row; a name of the data that the checkpoint has twice has no one row."""
    def labels_by_key(names: list[str]) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for label, name in enumerate(names):
            key = class_name_key(name)
            if key is not None:
                found.setdefault(key, []).append(label)
        return found

    ours, theirs = labels_by_key(data_names), labels_by_key(checkpoint_names)
    for key, labels in ours.items():
        if len(labels) > 1:
            return (f"the data names {len(labels)} classes {key!r} (labels {', '.join(map(str, labels))}; names match "
                    "without case): the checkpoint's rows cannot be matched to them by name; merge them into one "
                    "category or rename them in the data")
    for key, labels in theirs.items():
        if len(labels) > 1 and key in ours:
            return (f"the checkpoint names {len(labels)} classes {key!r} (its labels {', '.join(map(str, labels))}): "
                    f"the data's {key!r} cannot be matched to one of its rows by name; fine-tune with "
                    "--model.init_classes by_label (rows by position) or fresh")
    return None


@dataclass(frozen=True)
class CategoryMap:
    """Label ``i`` of the model is category ``category_ids[i]`` of the data set, named ``names[i]``.

    Build one with :meth:`from_coco_categories` or :meth:`coco`; store it with :meth:`to_dict`.

    ``skeletons``: a keypoint model's drawing of each label's keypoints: per label its 0-based keypoint index pairs
    (COCO's 1-based ``skeleton`` minus 1; empty: points only), from the data it trained on (:meth:`with_skeletons`),
    kept in checkpoints and exported files so that ``detr-predict`` draws the lines; empty for a model without
    keypoints. Two maps of the same classes are equal whatever their skeletons.
    """

    category_ids: tuple[int, ...]
    names: tuple[str, ...]
    skeletons: tuple[tuple[tuple[int, int], ...], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if len(self.category_ids) != len(self.names):
            raise ValueError(
                f"CategoryMap needs one name per category id, got {len(self.category_ids)} ids "
                f"and {len(self.names)} names"
            )
        if self.skeletons and len(self.skeletons) != len(self.category_ids):
            raise ValueError(f"CategoryMap needs a skeleton per class or none, got {len(self.skeletons)} for "
                             f"{len(self.category_ids)} classes")
        if len(set(self.category_ids)) != len(self.category_ids):
            raise ValueError(f"CategoryMap category ids must be unique, got {list(self.category_ids)}")

    @property
    def num_classes(self) -> int:
        """Number of model classes (logits minus the no-object logit)."""
        return len(self.category_ids)

    def label_to_category_id(self, labels: torch.Tensor | int) -> torch.Tensor | int:
        """Model label(s) → data set category id(s); a tensor comes back as an int64 tensor."""
        if isinstance(labels, torch.Tensor):
            table = torch.tensor(self.category_ids, dtype=torch.int64, device=labels.device)
            return table[labels.long()]
        return self.category_ids[int(labels)]

    def category_id_to_label(self, category_id: int) -> int:
        """Data set category id → model label; ``KeyError`` naming the id if the map lacks it."""
        lookup = {cid: label for label, cid in enumerate(self.category_ids)}
        if category_id not in lookup:
            raise KeyError(f"category id {category_id} is not in this category map ({self.num_classes} classes)")
        return lookup[category_id]

    def name(self, label: int) -> str:
        """Name of model label ``label``; the no-object label (``num_classes``) is called "no object"."""
        return "no object" if label == self.num_classes else self.names[label]

    def renamed(self, other: CategoryMap) -> list[tuple[int, str, str]]:
        """``(category id, this map's name, other's name)`` for every id both maps hold whose names differ
        (compared by :func:`class_name_key`: case and surrounding spaces aside), in this map's label order."""
        theirs = dict(zip(other.category_ids, other.names))
        return [(category_id, name, theirs[category_id]) for category_id, name in zip(self.category_ids, self.names)
                if category_id in theirs and class_name_key(name) != class_name_key(theirs[category_id])]

    def with_skeletons(self, edges: dict[int, tuple[tuple[int, int], ...]]) -> CategoryMap:
        """This map with each category's skeleton (category id → 0-based index pairs; a category not given: none)."""
        by_label = tuple(tuple(edges.get(category_id, ())) for category_id in self.category_ids)
        return CategoryMap(self.category_ids, self.names, by_label if any(by_label) else ())

    def skeleton_by_label(self) -> dict[int, tuple[tuple[int, int], ...]]:
        """Label → its skeleton's 0-based index pairs (empty without skeletons), as the drawing functions take it."""
        return dict(enumerate(self.skeletons))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, for checkpoints and prediction files (``skeletons`` only when there are any)."""
        data: dict[str, Any] = {"category_ids": list(self.category_ids), "names": list(self.names)}
        if self.skeletons:
            data["skeletons"] = [[list(edge) for edge in edges] for edges in self.skeletons]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CategoryMap:
        """Inverse of :meth:`to_dict` (a dict written before skeletons were kept: none)."""
        skeletons = tuple(tuple((int(a), int(b)) for a, b in edges) for edges in data.get("skeletons") or ())
        return cls(tuple(int(i) for i in data["category_ids"]), tuple(str(n) for n in data["names"]), skeletons)

    @classmethod
    def from_coco_categories(cls, categories: list[dict[str, Any]], contiguous: bool) -> CategoryMap:
        """Build from a COCO json's ``categories`` list.

        contiguous=False keeps raw ids as labels (``num_classes = max id + 1``; unused ids are named
        ``"N/A"`` and map to themselves), which is how the released COCO checkpoints are labelled.
        contiguous=True gives labels ``0..K-1`` in order of increasing category id.
        """
        if not categories:
            raise ValueError("the annotation json has no 'categories'; add at least one {'id', 'name'} entry")
        by_id = {int(c["id"]): str(c.get("name", c["id"])) for c in categories}
        if contiguous:
            ids = tuple(sorted(by_id))
            return cls(ids, tuple(by_id[i] for i in ids))
        if min(by_id) < 0:
            raise ValueError(f"raw category ids must be >= 0 to serve as labels, got {min(by_id)}")
        size = max(by_id) + 1
        return cls(tuple(range(size)), tuple(by_id.get(i, UNUSED_NAME) for i in range(size)))

    @classmethod
    def coco(cls) -> CategoryMap:
        """COCO 2017 in the raw 91-id space used by the authors' released checkpoints."""
        return cls.from_coco_categories([{"id": i, "name": n} for i, n in COCO_CATEGORIES], contiguous=False)

    @staticmethod
    def is_coco_like(categories: list[dict[str, Any]]) -> bool:
        """True if ``categories`` are COCO 2017's (same ids and names), so raw ids should be kept."""
        return sorted((int(c["id"]), str(c.get("name"))) for c in categories) == list(COCO_CATEGORIES)


# --- COCO panoptic ---
# COCO panoptic's 133 categories (80 things, 53 stuff) and the label space of the authors' panoptic models.
#
# The released panoptic checkpoints predict 250 classes + "no object": COCO panoptic's raw category ids
# (1–200, with gaps) are the labels, as for detection (paper §4.4; the unused ids are never targets).
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
