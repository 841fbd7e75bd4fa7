"""A split of a data set in another format (YOLO, Pascal VOC), read into a COCO instances dict.

The readers (:mod:`detr.data.yolo`, :mod:`detr.data.voc`) hand the rest of the pipeline what a COCO json would
give it, so the data set, the transforms, the checks and the evaluator need no branch per format: a
:class:`ConvertedSplit` holds the image folder the dict's ``file_name`` entries are relative to, the dict itself
and what the reader found wrong, each a :class:`LabelProblem` naming its file and line. A line or a file that
cannot be read is left out of the dict (and listed); :meth:`ConvertedSplit.require_clean` raises for a run,
which must not train on a set with parts missing, while ``detr-check-data`` lists every problem at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from detr.data.coco import AnnotationFileError

DataFormat = Literal["coco", "yolo", "voc"]

#: How many problems an error message lists before "... and N more".
MAX_LISTED = 5


class LabelFileError(AnnotationFileError):
    """A label file of a YOLO or Pascal VOC data set cannot be read as it is (a bad line, an unknown class)."""


@dataclass(frozen=True)
class LabelProblem:
    """One thing a reader could not use.

    path: the label file (a YOLO ``.txt``, a VOC ``.xml``, a ``data.yaml``, a split list).
    line: the 1-based line in it, None when the problem is about the whole file.
    message: what is wrong and how to fix it.
    kind: short machine name ("invalid_label_line", "unknown_class", "coordinates_outside", "invalid_xml", ...).
    """

    path: Path
    line: int | None
    message: str
    kind: str = "invalid_label"

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return f"{where}: {self.message}"


@dataclass
class ConvertedSplit:
    """One split of a data set as a COCO instances dict.

    format: the format read ("yolo" or "voc").
    split: the split's name ("train", "val", ...).
    dataset: what ``detr-check-data`` takes for the whole data set (a data.yaml, a VOC folder).
    images_dir: the folder the dict's ``file_name`` entries are relative to.
    source: the file or folder that lists the split (a YOLO split folder or list file, a VOC
        ``ImageSets/Main/<split>.txt``): where messages point, and beside which the image checks keep their cache.
    data: the COCO dict: ``images`` (id, file_name, width, height in pixels), ``annotations`` (id, image_id,
        category_id, ``bbox`` [x, y, width, height] in pixels from the top-left corner, area, iscrowd, and
        ``segmentation`` polygons where the labels have them), ``categories`` (id, name).
    problems: what was left out, file by file and line by line.
    """

    format: DataFormat
    split: str
    dataset: Path
    images_dir: Path
    source: Path
    data: dict[str, Any]
    problems: list[LabelProblem] = field(default_factory=list)

    def require_clean(self) -> ConvertedSplit:
        """This split, or :class:`LabelFileError` listing the first problems (one line) and the command that lists
        them all."""
        if not self.problems:
            return self
        shown = "; ".join(str(problem) for problem in self.problems[:MAX_LISTED])
        more = f"; ... and {len(self.problems) - MAX_LISTED} more" if len(self.problems) > MAX_LISTED else ""
        raise LabelFileError(f"the {self.format} {self.split} split ('{self.source}') has {len(self.problems)} "
                             f"label problem(s): {shown}{more}. Fix them (`detr-check-data {self.dataset}` "
                             "lists every one)")


def coco_dict(images: list[dict[str, Any]], annotations: list[dict[str, Any]], names: dict[int, str],
              dataset: Path) -> dict[str, Any]:
    """The COCO instances dict of a converted split; ``names`` is ``{category id: name}``."""
    return {"info": {"description": f"converted from {dataset}"},
            "licenses": [], "images": images, "annotations": annotations,
            "categories": [{"id": category_id, "name": name} for category_id, name in sorted(names.items())]}
