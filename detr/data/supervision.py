"""supervision's ``DetectionDataset`` in and out: one written as a COCO json that ``detr fit`` trains on, and any
data set this package reads (a COCO json and its images, a YOLO data.yaml, a Pascal VOC folder) as one.

supervision (``pip install detr-lightning[supervision]``) is imported inside the functions only, so that
``import detr`` works without it.

The two sides' conventions: a ``DetectionDataset`` holds image paths, its ``classes`` (class id = index) and one
``sv.Detections`` per image (``xyxy`` float pixel corners, ``class_id`` int, ``mask`` bool ``[N, H, W]`` or None);
a COCO dict holds ``[x, y, width, height]`` pixel boxes, category ids and RLE or polygon segmentations. Out of a
``DetectionDataset`` the category ids are its class ids (0..K-1, as the YOLO reader keeps them); into one the
categories become classes in order of increasing id, as ``sv.DetectionDataset.from_coco`` numbers them. COCO's
crowd boxes have no supervision form and are left out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pycocotools import mask as mask_utils

from detr.data.converted import DataFormat, coco_dict
from detr.data.images import read_image_header
from detr.data.instance_masks import decode_segmentations

if TYPE_CHECKING:
    import supervision as sv

#: What to install when supervision is missing.
INSTALL_HINT = "pip install 'detr-lightning[supervision]' (or pip install supervision)"


def import_supervision() -> Any:
    """The ``supervision`` module, or an ImportError that says what to install."""
    try:
        import supervision
    except ImportError as error:
        raise ImportError(f"this needs the supervision package: {INSTALL_HINT}") from error
    return supervision


def coco_from_detection_dataset(dataset: sv.DetectionDataset) -> tuple[dict[str, Any], Path]:
    """A ``DetectionDataset`` as a COCO instances dict, and the folder its ``file_name`` entries are relative to.

    The folder is the one that holds all the data set's images (their common parent), so that images of the same
    name in different folders stay apart; image sizes are read from the files' headers (displayed size: EXIF
    orientation applied, as supervision's ``cv2.imread`` applies it). A detection's mask, when the data set has
    them, becomes a compressed RLE ``segmentation`` (and its ``area``).

    Raises:
        ValueError: the data set holds images in memory rather than as files (there is nothing to train on), or
            one of its detections has no class id.
    """
    paths = [Path(path) for path in dataset.image_paths]
    if getattr(dataset, "_images_in_memory", None):
        raise ValueError("the DetectionDataset holds its images in memory: write them to files and build it from "
                         "their paths (DetectionDataset(classes, images=[paths], annotations=...)) to convert it")
    images_dir = Path(os.path.commonpath([str(path.resolve().parent) for path in paths])) if paths else Path(".")
    images, annotations = [], []
    for image_id, (key, path) in enumerate(zip(dataset.image_paths, paths), start=1):
        height, width = read_image_header(path).size
        images.append({"id": image_id, "file_name": path.resolve().relative_to(images_dir).as_posix(),
                       "height": height, "width": width})
        detections = dataset.annotations[key]
        if len(detections) and detections.class_id is None:
            raise ValueError(f"the detections of '{path}' have no class_id: every object needs its class to be "
                             "trained on")
        for index, (x0, y0, x1, y1) in enumerate(np.asarray(detections.xyxy, dtype=np.float64).tolist()):
            annotation: dict[str, Any] = {"image_id": image_id, "category_id": int(detections.class_id[index]),
                                          "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                          "iscrowd": 0}
            if detections.mask is not None:
                rle = mask_utils.encode(np.asfortranarray(detections.mask[index].astype(np.uint8)))
                annotation["segmentation"] = {"size": [int(size) for size in rle["size"]],
                                              "counts": rle["counts"].decode("ascii")}
                annotation["area"] = float(mask_utils.area(rle))
            annotations.append(annotation)
    for annotation_id, annotation in enumerate(annotations, start=1):
        annotation["id"] = annotation_id
    names = dict(enumerate(dataset.classes))
    return coco_dict(images, annotations, names, Path("a supervision DetectionDataset")), images_dir


def write_coco_json(dataset: sv.DetectionDataset, out: str | Path) -> Path:
    """Write a ``DetectionDataset`` as the COCO json ``out`` (:func:`coco_from_detection_dataset`); returns the
    image folder its ``file_name`` entries are relative to, for ``detr fit --data.train_images FOLDER
    --data.train_annotations OUT`` (and ``detr-check-data FOLDER OUT``)."""
    import json

    from detr.atomic_files import write_atomically

    data, images_dir = coco_from_detection_dataset(dataset)
    text = json.dumps(data, ensure_ascii=False).encode()
    write_atomically(out, lambda file: file.write(text))
    return images_dir


def detection_dataset_from_coco(data: dict[str, Any], images_dir: str | Path, *,
                                masks: bool = False) -> sv.DetectionDataset:
    """A COCO instances dict (``file_name`` entries relative to ``images_dir``) as a ``DetectionDataset``.

    Classes are the categories' names in order of increasing id; crowd boxes are left out; ``masks``: each
    image's detections carry their segmentations as bool ``[N, H, W]`` masks (every object of an image needs
    one then: supervision holds masks for all of an image's detections or none).

    Raises:
        ValueError: ``masks`` and an object without a segmentation.
    """
    sv = import_supervision()
    categories = sorted(data["categories"], key=lambda category: category["id"])
    class_ids = {category["id"]: index for index, category in enumerate(categories)}
    by_image: dict[int, list[dict[str, Any]]] = {image["id"]: [] for image in data["images"]}
    for annotation in data.get("annotations", []):
        if not annotation.get("iscrowd", 0):
            by_image[annotation["image_id"]].append(annotation)
    image_paths, annotations = [], {}
    for image in data["images"]:
        path = str(Path(images_dir) / image["file_name"])
        objects = by_image[image["id"]]
        xyxy = np.array([[x, y, x + w, y + h] for x, y, w, h in (obj["bbox"] for obj in objects)],
                        dtype=np.float32).reshape(-1, 4)
        mask = None
        if masks:
            missing = [obj["id"] for obj in objects if not obj.get("segmentation")]
            if missing:
                raise ValueError(f"annotation {missing[0]} of image '{image['file_name']}' has no segmentation: "
                                 "pass masks=False to read boxes only")
            mask = decode_segmentations([obj["segmentation"] for obj in objects], image["height"],
                                        image["width"]).astype(bool)
        image_paths.append(path)
        annotations[path] = sv.Detections(
            xyxy=xyxy, mask=mask,
            class_id=np.array([class_ids[obj["category_id"]] for obj in objects], dtype=np.int64))
    return sv.DetectionDataset(classes=[category["name"] for category in categories], images=image_paths,
                               annotations=annotations)


def load_detection_dataset(source: str | Path, *, split: str = "train", images: str | Path | None = None,
                           data_format: DataFormat | None = None, masks: bool = False) -> sv.DetectionDataset:
    """Any data set this package reads, as a ``DetectionDataset``: a COCO json (with ``images``, the folder its
    ``file_name`` entries are relative to), or split ``split`` of a YOLO data.yaml (or its folder) or a Pascal
    VOC folder, read as ``detr fit`` reads it (:mod:`detr.data.formats`).

    Raises:
        ValueError: the source cannot be read, or has label lines that cannot (named), or a COCO json without
            ``images``.
    """
    from detr.data.coco import load_coco_json
    from detr.data.formats import detect_format, read_split

    data_format = data_format or detect_format(source)
    if data_format == "coco":
        if images is None:
            raise ValueError(f"'{source}' is a COCO json: pass images=FOLDER, the folder its file_name entries are "
                             "relative to")
        return detection_dataset_from_coco(load_coco_json(source), images, masks=masks)
    converted = read_split(source, split, data_format).require_clean()
    return detection_dataset_from_coco(converted.data, converted.images_dir, masks=masks)
