"""The YOLO (Ultralytics) layout, read into a COCO instances dict and written from one.

What is read (Ultralytics' conventions)::

    data.yaml      path: .            # the data set's root (relative: to the yaml's folder, else, as Ultralytics
                                      # reads it, to the working directory; absent: the yaml's folder)
                   train: images/train # a folder of images, a .txt list of image paths, or a list of either
                   val: images/val
                   names: [cat, dog]   # or {0: cat, 1: dog}: class id → name
    images/train/x.jpg  ↔  labels/train/x.txt   # the last "images" folder of the path becomes "labels"

A label file holds one object a line, normalised to the image's width and height (0..1, displayed frame:
EXIF orientation applied): ``class cx cy w h`` for a box, ``class x1 y1 x2 y2 ...`` (three points or more) for a
segmentation polygon, which becomes the COCO ``segmentation`` and the box around it. With ``kpt_shape: [K, D]`` in
the yaml (YOLO-pose), a line is ``class cx cy w h`` then K points of D values, ``x y`` (D = 2: visible unless both
are 0) or ``x y v`` (D = 3: COCO's visibility 0/1/2), normalised as the box: they become COCO ``keypoints`` (pixels,
``num_keypoints``), each class a keypoint category named by ``kpt_names`` ({class: [names]}, else ``kpt_0`` ...)
whose ``flip_pairs`` come from ``flip_idx`` (the mirror permutation; :mod:`detr.data.keypoints`). An empty label
file, or none, is an image without
objects. Image sizes come from the files' headers (no decode). Relative list entries are relative to the list
file's folder; a split entry that does not exist but starts with ``../`` is also looked up without it (as
Ultralytics does for Roboflow's exports).

Category ids are the YOLO class ids, so a round trip keeps them; :func:`write_yolo` numbers a COCO json's categories
0..K-1 in order of increasing id (and, for a json with keypoints, pose lines with ``kpt_shape: [K, 3]``, K the most
points of any category, ``flip_idx`` and ``kpt_names``).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from detr.data.converted import ConvertedSplit, LabelFileError, LabelProblem, coco_dict
from detr.data.image_checks import default_cache_file, read_images
from detr.data.images import IMAGE_SUFFIXES
from detr.data.keypoints import flip_pairs_from_index, keypoint_categories

#: How far (normalised units) a coordinate may pass 0 or 1 from rounding before it counts as outside.
ROUNDING = 1e-6

#: The yaml names :func:`find_data_yaml` looks for in a folder, in order (then any other *.yaml with ``names``).
YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml")


@dataclass(frozen=True)
class YoloLayout:
    """What a data.yaml says.

    yaml_file: the yaml read.
    root: the data set's root folder (``path``).
    names: class id → name.
    splits: split ("train", "val", "test") → its entries, resolved: folders of images or list files.
    keypoint_shape: ``kpt_shape`` (K points, D = 2 or 3 values each) of a pose data set; None without keypoints.
    flip_index: ``flip_idx``, the points' mirror permutation (None: not given; the identity).
    keypoint_names: class id → its K point names (``kpt_names``; ``kpt_0`` ... where not given).
    """

    yaml_file: Path
    root: Path
    names: dict[int, str]
    splits: dict[str, list[Path]]
    keypoint_shape: tuple[int, int] | None = None
    flip_index: tuple[int, ...] | None = None
    keypoint_names: dict[int, list[str]] | None = None

    @property
    def keypoint_values(self) -> int:
        """Values after the box on a pose line (K × D), 0 without keypoints."""
        return 0 if self.keypoint_shape is None else self.keypoint_shape[0] * self.keypoint_shape[1]

    def categories(self) -> list[dict[str, Any]]:
        """The COCO categories of the classes: with keypoints, their names, no skeleton (YOLO has none) and the
        ``flip_pairs`` of ``flip_idx``."""
        categories: list[dict[str, Any]] = [{"id": i, "name": name} for i, name in sorted(self.names.items())]
        if self.keypoint_shape is None:
            return categories
        count = self.keypoint_shape[0]
        flip_pairs = flip_pairs_from_index(self.flip_index or range(count))
        for category in categories:
            names = (self.keypoint_names or {}).get(category["id"]) or [f"kpt_{k}" for k in range(count)]
            # a class named with fewer points than kpt_shape (a writer's padding) keeps the pairs among its own
            own = [pair for pair in flip_pairs if max(pair) < len(names)]
            category.update(keypoints=list(names), skeleton=[], flip_pairs=own)
        return categories


def find_data_yaml(source: str | Path) -> Path:
    """The data.yaml of ``source``: the file itself, or the one in the folder.

    Raises:
        LabelFileError: no yaml with ``names`` there (the message says what to write).
    """
    source = Path(source)
    if source.is_file():
        return source
    if not source.is_dir():
        raise LabelFileError(f"'{source}' does not exist; pass a YOLO data.yaml or the folder that holds it")
    for name in YAML_NAMES:
        if (source / name).is_file():
            return source / name
    for candidate in sorted(source.glob("*.y*ml")):
        try:
            if isinstance(read_yaml(candidate).get("names"), (list, dict)):
                return candidate
        except LabelFileError:
            continue
    raise LabelFileError(f"'{source}' holds no data.yaml: write one with `names: [class0, class1, ...]`, "
                         "`train: images/train` and `val: images/val` (Ultralytics' layout)")


def read_yaml(path: Path) -> dict[str, Any]:
    """A yaml file's top-level mapping (:class:`LabelFileError` naming the file and line if it is not one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise LabelFileError(f"{where}: not valid YAML ({getattr(error, 'problem', error)}); fix the file") from None
    except UnicodeDecodeError as error:
        raise LabelFileError(f"'{path}' is not UTF-8 text (byte {error.start}); is it really a data.yaml?") from None
    if not isinstance(data, dict):
        raise LabelFileError(f"'{path}' holds a YAML {type(data).__name__}, not a mapping with 'names', 'train' "
                             "and 'val'")
    return data


def read_layout(source: str | Path) -> YoloLayout:
    """The layout a data.yaml (or the folder holding it) describes (module docstring).

    Raises:
        LabelFileError: no yaml, no usable ``names``, or ``nc`` that contradicts them (the message names the file).
    """
    yaml_file = find_data_yaml(source)
    data = read_yaml(yaml_file)
    names = _names(data.get("names"), yaml_file)
    count = data.get("nc")
    if count is not None and count != len(names):
        raise LabelFileError(f"'{yaml_file}': nc is {count} but 'names' lists {len(names)} classes; make them agree "
                             "(or drop nc)")
    root = Path(data["path"]) if data.get("path") else Path()
    if not root.is_absolute() and ((yaml_file.parent / root).is_dir() or not root.is_dir()):
        root = yaml_file.parent / root  # else Ultralytics' reading: relative to the working directory
    splits: dict[str, list[Path]] = {}
    for split in ("train", "val", "test"):
        entries = data.get(split)
        if not entries:
            continue
        entries = entries if isinstance(entries, list) else [entries]
        splits[split] = [_resolve(root, str(entry)) for entry in entries]
    shape, flip_index, keypoint_names = _keypoint_fields(data, yaml_file, names)
    return YoloLayout(yaml_file, root, names, splits, shape, flip_index, keypoint_names)


def _keypoint_fields(data: dict[str, Any], yaml_file: Path, names: dict[int, str]
                     ) -> tuple[tuple[int, int] | None, tuple[int, ...] | None, dict[int, list[str]] | None]:
    """A pose yaml's ``kpt_shape``, ``flip_idx`` and ``kpt_names``, checked (:class:`LabelFileError` naming the
    yaml and the fix); (None, None, None) without ``kpt_shape``."""
    shape = data.get("kpt_shape")
    if shape is None:
        return None, None, None
    if (not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(v, int) for v in shape)
            or shape[0] < 1 or shape[1] not in (2, 3)):
        raise LabelFileError(f"'{yaml_file}': kpt_shape is {shape!r}; it must be [K, 2] or [K, 3] (K points of "
                             "x y, or x y visibility)")
    count = shape[0]
    flip = data.get("flip_idx")
    flip_index = None
    if flip is not None:
        if not isinstance(flip, list) or sorted(flip) != list(range(count)) or any(flip[flip[k]] != k
                                                                                   for k in range(count)):
            raise LabelFileError(f"'{yaml_file}': flip_idx {flip!r} is not a mirror permutation of the {count} points "
                                 "(point k's mirror twin at position k, each pair both ways, e.g. [0, 2, 1, ...])")
        flip_index = tuple(int(v) for v in flip)
    given = data.get("kpt_names") or {}
    if isinstance(given, list):
        given = {class_id: given for class_id in names}
    keypoint_names: dict[int, list[str]] = {}
    for class_id, point_names in given.items() if isinstance(given, dict) else ():
        if not isinstance(point_names, list) or not 0 < len(point_names) <= count:
            raise LabelFileError(f"'{yaml_file}': kpt_names of class {class_id} must list up to {count} names "
                                 f"(kpt_shape), got {point_names!r}")
        keypoint_names[int(class_id)] = [str(name) for name in point_names]
    return (count, shape[1]), flip_index, keypoint_names


def _names(names: Any, yaml_file: Path) -> dict[int, str]:
    if isinstance(names, list) and names:
        return {index: str(name) for index, name in enumerate(names)}
    if isinstance(names, dict) and names:
        try:
            return {int(key): str(name) for key, name in names.items()}
        except (TypeError, ValueError):
            pass
        raise LabelFileError(f"'{yaml_file}': the keys of 'names' must be class ids (0, 1, ...), got "
                             f"{list(names)[:5]}")
    raise LabelFileError(f"'{yaml_file}' has no 'names': list the classes, `names: [cat, dog]` or "
                         "`names: {0: cat, 1: dog}`")


def _resolve(root: Path, entry: str) -> Path:
    path = Path(entry)
    if path.is_absolute():
        return path
    resolved = root / path
    if not resolved.exists() and entry.startswith("../") and (root / entry[3:]).exists():
        return root / entry[3:]  # Roboflow's exports: "../train/images" beside the yaml
    return resolved


def split_images(layout: YoloLayout, split: str) -> tuple[list[Path], list[LabelProblem]]:
    """The image files of ``split``, sorted, and what could not be listed (a missing folder or list file, a listed
    image that does not exist is kept: the checks name it).

    Raises:
        LabelFileError: the yaml has no such split.
    """
    if split not in layout.splits:
        raise LabelFileError(f"'{layout.yaml_file}' has no '{split}' split (it has "
                             f"{', '.join(layout.splits) or 'none'}); add `{split}: images/{split}`")
    images: list[Path] = []
    problems: list[LabelProblem] = []
    for entry in layout.splits[split]:
        if entry.is_dir():
            images += [path for path in entry.rglob("*") if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()]
        elif entry.is_file():
            for line in entry.read_text(encoding="utf-8-sig").splitlines():
                if line.strip():
                    path = Path(line.strip())
                    images.append(path if path.is_absolute() else entry.parent / path)
        else:
            problems.append(LabelProblem(layout.yaml_file, None, f"the {split} split's '{entry}' does not exist; "
                                         "fix the path (relative paths start at the yaml's 'path')", "missing_split"))
    return sorted(set(images)), problems


def label_path(image: Path) -> Path:
    """The label file of an image: its path with the last ``images`` folder replaced by ``labels`` and ``.txt`` as
    the suffix (Ultralytics' ``img2label_paths``)."""
    parts = list(image.parts)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def parse_label_lines(path: Path, text: str, names: dict[int, str], width: int, height: int,
                      keypoint_shape: tuple[int, int] | None = None) -> tuple[list[dict[str, Any]], list[LabelProblem]]:
    """A label file's objects as COCO annotations (no ids yet: ``category_id``, ``bbox`` [x, y, w, h] in pixels,
    ``area``, ``iscrowd`` 0, ``segmentation`` for a polygon line, ``keypoints`` and ``num_keypoints`` for a pose
    line of a data set with ``keypoint_shape`` (K, D)) in an image of ``width`` × ``height`` pixels, and a problem
    for each line that is not one (the line left out)."""
    keypoint_values = 0 if keypoint_shape is None else keypoint_shape[0] * keypoint_shape[1]
    annotations, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        try:
            values = [float(token) for token in tokens]
        except ValueError:
            problems.append(LabelProblem(path, number, f"'{line.strip()}' holds something that is not a number",
                                         "invalid_label_line"))
            continue
        class_id, coordinates = values[0], values[1:]
        pose: list[float] | None = None
        if keypoint_shape is not None and len(coordinates) == 4 + keypoint_values:
            coordinates, pose = coordinates[:4], coordinates[4:]  # a pose line: the box, then the points
        elif keypoint_shape is not None and len(coordinates) == 4:
            problems.append(LabelProblem(path, number, f"a box without its {keypoint_shape[0]} keypoints; a pose "
                                         f"line is `class cx cy w h` then {keypoint_values} values (kpt_shape "
                                         f"{list(keypoint_shape)})", "invalid_label_line"))
            continue
        if len(coordinates) != 4 and (len(coordinates) < 6 or len(coordinates) % 2):
            problems.append(LabelProblem(path, number, f"{len(tokens)} values; a box line is `class cx cy w h` (5 "
                                         "values) and a polygon line `class x1 y1 x2 y2 x3 y3 ...` (3 points or more)",
                                         "invalid_label_line"))
            continue
        if not class_id.is_integer() or int(class_id) not in names:
            problems.append(LabelProblem(path, number, f"class {tokens[0]} is not a class of the data.yaml's names "
                                         f"(ids {min(names)}..{max(names)}); fix the line or add the class",
                                         "unknown_class"))
            continue
        if pose is not None:
            keypoints, problem = _pose_keypoints(pose, keypoint_shape, width, height)
            if problem is not None:
                problems.append(LabelProblem(path, number, problem, "invalid_keypoints"))
                continue
        if not all(math.isfinite(v) and -ROUNDING <= v <= 1 + ROUNDING for v in coordinates):
            problems.append(LabelProblem(path, number, f"coordinates {tokens[1:]} are not all within [0, 1]: YOLO "
                                         "labels are fractions of the image's width and height, not pixels",
                                         "coordinates_outside"))
            continue
        coordinates = [min(max(v, 0.0), 1.0) for v in coordinates]
        annotation: dict[str, Any] = {"category_id": int(class_id), "iscrowd": 0}
        if len(coordinates) == 4:
            cx, cy, w, h = coordinates
            bbox = [(cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height]
            area = bbox[2] * bbox[3]
        else:
            xs, ys = [x * width for x in coordinates[0::2]], [y * height for y in coordinates[1::2]]
            bbox = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
            area = 0.5 * abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs))))  # shoelace
            annotation["segmentation"] = [[v for point in zip(xs, ys) for v in point]]
        if bbox[2] <= 0 or bbox[3] <= 0:
            problems.append(LabelProblem(path, number, f"'{line.strip()}' has no width or height; fix or remove the "
                                         "line", "zero_size_box"))
            continue
        if pose is not None:
            annotation.update(keypoints=keypoints, num_keypoints=sum(1 for v in keypoints[2::3] if v > 0))
        annotations.append({**annotation, "bbox": bbox, "area": area})
    return annotations, problems


def _pose_keypoints(values: list[float], shape: tuple[int, int], width: int, height: int
                    ) -> tuple[list[float], str | None]:
    """A pose line's K × D normalised values → COCO's flat pixel ``[x1, y1, v1, ...]`` (D = 2: v 2, or 0 at
    (0, 0)), or the problem that keeps them from being points."""
    count, dimensions = shape
    keypoints: list[float] = []
    for k in range(count):
        x, y = values[k * dimensions], values[k * dimensions + 1]
        v = values[k * dimensions + 2] if dimensions == 3 else (0.0 if x == 0 and y == 0 else 2.0)
        if v not in (0, 1, 2):
            return [], f"keypoint {k} has visibility {v:g}; it must be 0 (not labelled), 1 (hidden) or 2 (visible)"
        if v > 0 and not all(math.isfinite(c) and -ROUNDING <= c <= 1 + ROUNDING for c in (x, y)):
            return [], (f"keypoint {k} ({x:g}, {y:g}) is not within [0, 1]: YOLO keypoints are fractions of the "
                        "image's width and height, not pixels")
        keypoints += [min(max(x, 0.0), 1.0) * width, min(max(y, 0.0), 1.0) * height, int(v)] if v > 0 else [0, 0, 0]
    return keypoints, None


def read_yolo_split(source: str | Path, split: str, *, cache: bool = False) -> ConvertedSplit:
    """Split ``split`` of the YOLO data set ``source`` (a data.yaml or its folder) as a COCO dict.

    Every image of the split is an entry (width and height from its header; a file that cannot be read has
    none, and the checks name it); each readable line of its label file an annotation. ``cache``: remember the
    header reads where the image checks keep theirs (beside the split's folder or list file:
    :mod:`detr.data.image_checks`), so that the checks and the next run read only changed files.

    Raises:
        LabelFileError: no data.yaml, unusable ``names``, or no such split. Bad lines are listed in ``problems``.
    """
    layout = read_layout(source)
    image_paths, problems = split_images(layout, split)
    folders = [str(path.parent) for path in image_paths] or [str(layout.root)]
    images_dir = Path(os.path.commonpath(folders))
    cache_file = default_cache_file(layout.splits[split][0]) if cache else None
    readings = read_images(image_paths, decode=False, annotations_file=layout.yaml_file, cache_file=cache_file)
    images, annotations = [], []
    for image_id, (path, reading) in enumerate(zip(image_paths, readings, strict=True), start=1):
        image: dict[str, Any] = {"id": image_id, "file_name": path.relative_to(images_dir).as_posix()}
        images.append(image)
        if reading.size is None:
            continue  # the checks name the file; its labels cannot be placed without its size
        image["height"], image["width"] = reading.size
        labels = label_path(path)
        if not labels.is_file():
            continue  # an image without objects
        try:
            text = labels.read_text(encoding="utf-8-sig")  # a byte-order mark from Windows editors: not a value
        except (OSError, UnicodeDecodeError) as error:
            problems.append(LabelProblem(labels, None, f"cannot be read ({error})", "unreadable_label_file"))
            continue
        found, bad = parse_label_lines(labels, text, layout.names, image["width"], image["height"],
                                       layout.keypoint_shape)
        problems += bad
        annotations += [{**annotation, "image_id": image_id} for annotation in found]
    for annotation_id, annotation in enumerate(annotations, start=1):
        annotation["id"] = annotation_id
    data = coco_dict(images, annotations, layout.names, layout.yaml_file)
    data["categories"] = layout.categories()
    counts = {category["id"]: len(category.get("keypoints", [])) for category in data["categories"]}
    for annotation in annotations:  # a class with fewer named points than kpt_shape: its own points only
        if "keypoints" in annotation and len(annotation["keypoints"]) > 3 * counts[annotation["category_id"]]:
            annotation["keypoints"] = annotation["keypoints"][:3 * counts[annotation["category_id"]]]
            annotation["num_keypoints"] = sum(1 for v in annotation["keypoints"][2::3] if v > 0)
    return ConvertedSplit("yolo", split, layout.yaml_file, images_dir, layout.splits[split][0], data, problems)


def write_yolo(data: dict[str, Any], images_dir: str | Path, out_dir: str | Path, split: str, *,
               link: bool = False, segments: bool = False) -> dict[str, int]:
    """Write a COCO instances dict and its images as split ``split`` of a YOLO data set in ``out_dir``.

    ``out_dir/images/<split>/`` gets the images (copied, or hard-linked with ``link`` where the file system
    allows), ``out_dir/labels/<split>/`` one ``class cx cy w h`` line per box (normalised to the image's size;
    class ids: the categories numbered 0..K-1 by increasing id), and ``out_dir/data.yaml`` the names and this split
    (added to the splits an existing one lists). Crowd annotations have no YOLO form and are left out. With
    ``segments``, an annotation with a polygon ``segmentation`` is written as a polygon line ``class x1 y1 x2 y2 ...``
    (the parts of a polygon in several parts one after another; an RLE stays a box). A json whose categories name
    keypoints is written as YOLO-pose: ``kpt_shape: [K, 3]`` (K the most points of any category), ``flip_idx`` (the
    first keypoint category's mirror: YOLO has one for all classes), ``kpt_names``, and each line's box followed by
    its K points (normalised x y and v; a point not labelled, or beyond its category's count, 0 0 0).

    Returns:
        counts: "images", "boxes" (lines written, polygons included), "polygons", "crowd_left_out".
    """
    images_dir, out_dir = Path(images_dir), Path(out_dir)
    categories = sorted(data["categories"], key=lambda category: category["id"])
    class_of = {category["id"]: index for index, category in enumerate(categories)}
    by_image: dict[Any, list[dict[str, Any]]] = {}
    for annotation in data.get("annotations", []):
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    counts = {"images": 0, "boxes": 0, "polygons": 0, "crowd_left_out": 0}
    with_keypoints = keypoint_categories(categories)
    num_keypoints = max((spec.num_keypoints for spec in with_keypoints.values()), default=0)
    for image in data["images"]:
        source = images_dir / image["file_name"]
        target = out_dir / "images" / split / image["file_name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            try:
                if not link:
                    raise OSError
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
        width, height = image.get("width"), image.get("height")
        if not width or not height:
            from detr.data.images import read_image_header

            height, width = read_image_header(source).size
        lines = []
        for annotation in by_image.get(image["id"], []):
            if annotation.get("iscrowd", 0):
                counts["crowd_left_out"] += 1
                continue
            class_id = class_of[annotation["category_id"]]
            polygon = annotation.get("segmentation")
            if segments and isinstance(polygon, list) and polygon and all(isinstance(p, list) for p in polygon):
                points = [v for part in polygon for v in part]
                lines.append(f"{class_id} " + " ".join(f"{v / (width if i % 2 == 0 else height):.6f}"
                                                       for i, v in enumerate(points)))
                counts["polygons"] += 1
                continue
            x, y, w, h = (float(v) for v in annotation["bbox"])
            line = f"{class_id} {(x + w / 2) / width:.6f} {(y + h / 2) / height:.6f} {w / width:.6f} {h / height:.6f}"
            if num_keypoints:
                points = list(annotation.get("keypoints") or [])[:3 * num_keypoints]
                points += [0] * (3 * num_keypoints - len(points))
                line += "".join(f" {points[i] / width:.6f} {points[i + 1] / height:.6f} {int(points[i + 2])}"
                                if points[i + 2] > 0 else " 0 0 0" for i in range(0, len(points), 3))
            lines.append(line)
        labels = out_dir / "labels" / split / Path(image["file_name"]).with_suffix(".txt")
        labels.parent.mkdir(parents=True, exist_ok=True)
        labels.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        counts["images"] += 1
        counts["boxes"] += len(lines)
    yaml_file = out_dir / "data.yaml"
    config = read_yaml(yaml_file) if yaml_file.is_file() else {"path": "."}
    config[split] = f"images/{split}"
    config["names"] = {index: str(category.get("name", category["id"])) for index, category in enumerate(categories)}
    if num_keypoints:
        first = next(iter(with_keypoints.values()))
        config["kpt_shape"] = [num_keypoints, 3]
        config["flip_idx"] = list(first.flip_index) + list(range(first.num_keypoints, num_keypoints))
        config["kpt_names"] = {class_of[category_id]: list(spec.names) for category_id, spec in with_keypoints.items()}
    yaml_file.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return counts
