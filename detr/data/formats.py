"""Which format a data set is in, and its splits as COCO dicts, whatever the format.

A COCO data set is an image folder plus an instances json (:mod:`detr.data.coco`); a YOLO one a data.yaml (or
the folder that holds it: :mod:`detr.data.yolo`); a Pascal VOC one a folder with ``Annotations/``
(:mod:`detr.data.voc`). :func:`detect_format` tells them apart from the path alone; :func:`read_split` reads a
split of the two others into the :class:`~detr.data.converted.ConvertedSplit` that the data set, the checks and
``detr-convert-data`` take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detr.data.converted import ConvertedSplit, DataFormat, LabelFileError
from detr.data.voc import is_voc_folder, read_voc_split
from detr.data.yolo import YAML_NAMES, label_path, read_layout, read_yolo_split

#: Every format, for messages and choices.
FORMATS: tuple[DataFormat, ...] = ("coco", "yolo", "voc")


def detect_format(path: str | Path) -> DataFormat:
    """The format of the data set at ``path``: "coco" for a .json or a folder in COCO's layout (annotations/),
    "yolo" for a .yaml or a folder with a data.yaml, "voc" for a folder with Annotations/.

    Raises:
        ValueError: none of these (the message says what each format needs).
    """
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() == ".json":
            return "coco"
        if path.suffix.lower() in (".yaml", ".yml"):
            return "yolo"
    elif path.is_dir():
        if is_voc_folder(path):
            return "voc"
        if any((path / name).is_file() for name in YAML_NAMES):
            return "yolo"
        if (path / "annotations").is_dir():
            return "coco"
        if (path / "images").is_dir() and (path / "labels").is_dir():
            return "yolo"  # without its data.yaml: read_layout says what to write
        labels = label_path(path / "x.jpg").parent
        if labels != path and labels.is_dir():
            raise ValueError(f"'{path}' looks like a split folder of a YOLO data set (its labels are in '{labels}'): "
                             "pass the data.yaml, or the folder that holds it")
    elif not path.exists():
        raise ValueError(f"'{path}' does not exist; pass a COCO json, a YOLO data.yaml (or its folder) or a Pascal "
                         "VOC folder")
    raise ValueError(f"cannot tell the format of '{path}': a COCO instances .json (or a folder with annotations/), a "
                     "YOLO data.yaml (or a folder with one) or a Pascal VOC folder (with Annotations/) is needed")


def dataset_splits(path: str | Path, data_format: DataFormat) -> list[str]:
    """The splits a YOLO or VOC data set has ("train", "val", "test" as present)."""
    if data_format == "yolo":
        return list(read_layout(path).splits)
    main = Path(path) / "ImageSets" / "Main"
    if not main.is_dir():
        return ["train"]
    names = {file.stem for file in main.glob("*.txt")}
    return [split for split, files in (("train", ("train", "trainval")), ("val", ("val", "test")))
            if names & set(files)]


def read_split(path: str | Path, split: str, data_format: DataFormat | None = None, *,
               cache: bool = False) -> ConvertedSplit:
    """Split ``split`` of the YOLO or VOC data set at ``path`` as a COCO dict (problems listed, not raised);
    ``cache``: a YOLO split's image sizes are remembered (:func:`detr.data.yolo.read_yolo_split`).

    Raises:
        LabelFileError: the data set cannot be read at all (no data.yaml, no Annotations/, no such split), or
            ``path`` is a COCO json (it is a COCO dict already).
    """
    data_format = data_format or detect_format(path)
    if data_format == "yolo":
        return read_yolo_split(path, split, cache=cache)
    if data_format == "voc":
        return read_voc_split(path, split)
    raise LabelFileError(f"'{path}' is a COCO data set: read it with detr.data.coco.load_coco_json")


def load_split(path: str | Path, split: str, data_format: DataFormat, cache: bool = False) -> dict[str, Any]:
    """The COCO dict of a YOLO or VOC split that has no label problem (a data set's ``read_annotations``).

    Raises:
        LabelFileError: the split cannot be read, or has lines or files that cannot be (the first few named).
    """
    return read_split(path, split, data_format, cache=cache).require_clean().data
