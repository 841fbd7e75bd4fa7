"""Pascal VOC, read into a COCO instances dict.

What is read (the VOC devkit's layout, e.g. ``VOCdevkit/VOC2012``)::

    Annotations/<id>.xml        <filename>, <size><width><height>, one <object> each: <name>, <difficult>,
                                <bndbox><xmin><ymin><xmax><ymax> (pixels, 1-based, inclusive)
    JPEGImages/<filename>
    ImageSets/Main/<split>.txt  the ids of a split, one a line

Boxes: the corners are 1-based pixel indices, inclusive, so a box over the whole image reads xmin = 1, xmax = W;
as detectron2 (and supervision) read them, ``x0 = xmin - 1``, ``x1 = xmax``: COCO's ``bbox`` is
``[xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1]``.

``difficult`` objects become ``iscrowd = 1`` (with ``"difficult": 1`` kept beside it): VOC's evaluation ignores
them, neither a hit nor a miss, and a crowd box is what COCO evaluation ignores; training leaves them out of the
targets, as mmdetection does. (COCOeval matches a detection to an ignored box by the share of the detection inside
it, not by IoU: a small difference from VOC's own evaluation.)

Categories: every class named in ``Annotations/`` (all splits, so train and val agree), sorted by name (VOC's
20 classes in their usual order), ids 0..K-1. Splits: "train" reads ``train.txt`` (else ``trainval.txt``),
"val" ``val.txt`` (else ``test.txt``), any other name its own file; a folder without ``ImageSets/Main`` has one
split, "train", of every xml.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detr.data.converted import ConvertedSplit, LabelFileError, LabelProblem, coco_dict

#: The split files a split name falls back to, in order.
SPLIT_FILES = {"train": ("train", "trainval"), "val": ("val", "test")}


@dataclass(frozen=True)
class VocObject:
    """One ``<object>``: its class, ``bbox`` COCO [x, y, w, h] in pixels, ``difficult``."""

    name: str
    bbox: list[float]
    difficult: bool


@dataclass(frozen=True)
class VocImage:
    """One annotation xml: the image file (relative to JPEGImages/), its size (0 where the xml has none) and its
    objects."""

    xml_file: Path
    file_name: str
    width: int
    height: int
    objects: list[VocObject]


def is_voc_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder with ``Annotations/`` (a VOC data set)."""
    return (Path(path) / "Annotations").is_dir()


def parse_annotation(xml_file: Path) -> tuple[VocImage | None, list[LabelProblem]]:
    """One xml file → its image and objects, and a problem (file and line) for what cannot be read: a malformed
    file (None), an object without a name or with corners that are not numbers or not in order (left out)."""
    try:
        root = ElementTree.parse(xml_file).getroot()
    except ElementTree.ParseError as error:
        line = error.position[0] if getattr(error, "position", None) else None
        return None, [LabelProblem(xml_file, line, f"not well-formed XML ({error}); fix the file", "invalid_xml")]
    except OSError as error:
        return None, [LabelProblem(xml_file, None, f"cannot be read ({error})", "invalid_xml")]
    problems: list[LabelProblem] = []
    file_name = (root.findtext("filename") or "").strip() or xml_file.stem + ".jpg"
    size = root.find("size")
    width, height = (_integer(size, "width"), _integer(size, "height")) if size is not None else (0, 0)
    objects = []
    for position, element in enumerate(root.iter("object"), start=1):
        name = (element.findtext("name") or "").strip()
        box = element.find("bndbox")
        where = f"object {position}" + (f" ('{name}')" if name else "")
        if not name or box is None:
            problems.append(LabelProblem(xml_file, None, f"{where} has no <name> or no <bndbox>; add it or remove the "
                                         "object", "invalid_object"))
            continue
        try:
            xmin, ymin, xmax, ymax = (float(box.findtext(tag) or "nan") for tag in ("xmin", "ymin", "xmax", "ymax"))
        except ValueError:
            xmin = ymin = xmax = ymax = float("nan")
        if not xmin <= xmax or not ymin <= ymax:  # also NaN: a missing or non-numeric corner
            corners = [box.findtext(tag) for tag in ("xmin", "ymin", "xmax", "ymax")]
            problems.append(LabelProblem(xml_file, None, f"{where} has <bndbox> xmin, ymin, xmax, ymax = {corners}: "
                                         "four numbers with xmin <= xmax and ymin <= ymax are needed", "invalid_bbox"))
            continue
        difficult = (element.findtext("difficult") or "0").strip() in ("1", "true", "True")
        objects.append(VocObject(name, [xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1], difficult))
    return VocImage(xml_file, file_name, width, height, objects), problems


def _integer(element: ElementTree.Element, tag: str) -> int:
    try:
        return int(float(element.findtext(tag) or 0))
    except ValueError:
        return 0


def split_ids(root: Path, split: str) -> tuple[list[str], Path]:
    """The image ids of ``split`` and the file that lists them (the Annotations folder when there is no
    ImageSets/Main: every xml, for "train").

    Raises:
        LabelFileError: no split file for ``split``.
    """
    main = root / "ImageSets" / "Main"
    if not main.is_dir():
        if split != "train":
            raise LabelFileError(f"'{root}' has no ImageSets/Main/: every xml of Annotations/ is the train split; "
                                 f"write ImageSets/Main/{split}.txt (one image id a line) for a {split} split")
        return sorted(path.stem for path in (root / "Annotations").glob("*.xml")), root / "Annotations"
    for name in SPLIT_FILES.get(split, (split,)):
        listed = main / f"{name}.txt"
        if listed.is_file():
            ids = [line.split()[0] for line in listed.read_text(encoding="utf-8").splitlines() if line.strip()]
            return ids, listed
    raise LabelFileError(f"'{main}' has no {' or '.join(f'{n}.txt' for n in SPLIT_FILES.get(split, (split,)))}: "
                         f"list the {split} split's image ids there, one a line")


def class_names(root: Path) -> dict[int, str]:
    """Every class named in ``root/Annotations/*.xml``, sorted by name, as ``{id: name}`` with ids 0..K-1."""
    names = set()
    for xml_file in (root / "Annotations").glob("*.xml"):
        try:
            names.update((element.text or "").strip() for element in ElementTree.parse(xml_file).iter("name"))
        except (ElementTree.ParseError, OSError):
            continue  # named by the split that lists it
    return dict(enumerate(sorted(name for name in names if name)))


def read_voc_split(source: str | Path, split: str) -> ConvertedSplit:
    """Split ``split`` of the VOC data set in folder ``source`` as a COCO dict (module docstring).

    Raises:
        LabelFileError: no Annotations/ folder, or no file that lists the split. Unreadable xml files and objects
            are listed in ``problems`` and left out.
    """
    root = Path(source)
    if not is_voc_folder(root):
        raise LabelFileError(f"'{root}' has no Annotations/ folder: pass a Pascal VOC folder (Annotations/, "
                             "JPEGImages/, ImageSets/Main/)")
    ids, listing = split_ids(root, split)
    names = class_names(root)
    category_of = {name: category_id for category_id, name in names.items()}
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    problems: list[LabelProblem] = []
    for image_id, stem in enumerate(ids, start=1):
        xml_file = root / "Annotations" / f"{stem}.xml"
        if not xml_file.is_file():
            problems.append(LabelProblem(listing, None, f"image id '{stem}' has no {xml_file}", "missing_annotation"))
            continue
        parsed, bad = parse_annotation(xml_file)
        problems += bad
        if parsed is None:
            continue
        file_name = parsed.file_name
        if not (root / "JPEGImages" / file_name).is_file() and (root / "JPEGImages" / f"{stem}.jpg").is_file():
            file_name = f"{stem}.jpg"  # a <filename> without its suffix, or from before a rename: the id's image
        image: dict[str, Any] = {"id": image_id, "file_name": file_name}
        if parsed.width > 0 and parsed.height > 0:
            image["width"], image["height"] = parsed.width, parsed.height
        images.append(image)
        for voc_object in parsed.objects:
            x, y, w, h = voc_object.bbox
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": category_of[voc_object.name], "bbox": [x, y, w, h], "area": w * h,
                                "iscrowd": int(voc_object.difficult), "difficult": int(voc_object.difficult)})
    return ConvertedSplit("voc", split, root, root / "JPEGImages", listing,
                          coco_dict(images, annotations, names, root), problems)
