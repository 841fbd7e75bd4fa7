"""What test modules share: the one tiny model config, small in-memory data, and loaders for the scripts of
tools/ and benchmarks/. Fixtures live in conftest.py (they import from here); test modules import from here,
never from conftest or from one another."""

from __future__ import annotations

import base64
import contextlib
import copy
import importlib.util
import io
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import torch
from pycocotools.coco import COCO
from torch.utils.data import DataLoader

from detr import build_detr
from detr.models.config import ModelConfig
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict
from detr.models.grounding.config import GroundingConfig
from detr.models.outputs import DetectorOutput
from detr.models.segmentation import build_detr_panoptic
from detr.visualize.explorer.data import POINT_UNITS, WEIGHT_UNITS

REPO = Path(__file__).resolve().parents[1]

#: The tiny detector every test and benchmark builds from: a few-second CPU model with the paper's layout.
TINY = DetrConfig(backbone="resnet18", hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
                  dim_feedforward=64, num_queries=10, num_classes=5)
#: The tiny Grounding DINO (a one-layer BERT of 32 wide, 16 text tokens): building it needs transformers (the BERT).
TINY_GROUNDING = GroundingConfig(
    backbone="resnet18", hidden_dim=32, encoder_layers=2, num_decoder_layers=2, encoder_ffn_dim=64, dim_feedforward=64,
    encoder_heads=4, num_heads=4, encoder_points=2, decoder_points=2, num_queries=8, num_classes=16, dropout=0.0,
    fusion_drop_path=0.0, text_config=dict(vocab_size=1040, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=37, max_position_embeddings=64))


def tiny_config_with(**changes: Any) -> ModelConfig:
    """:data:`TINY` with some fields changed, so a test module states only what it needs different; with
    ``architecture`` (another family, e.g. "deformable"), TINY's sizes in that family's config, read as the old
    one-record config would have been (:func:`detr.models.family.config_from_dict`)."""
    if "architecture" in changes:
        flat = {name: value for name, value in TINY.to_dict().items() if name != "family"}
        return config_from_dict({**flat, **changes})
    return TINY.replace(**changes)


#: Command-line overrides that shrink any config's model to :data:`TINY` for a few-second CPU fit (tiny shapes
#: images, hence layer3).
TINY_CLI_MODEL = [
    *(f"--model.detr.{name}={getattr(TINY, name)}" for name in ("backbone", "hidden_dim", "num_heads",
                                                               "num_encoder_layers", "num_decoder_layers",
                                                               "dim_feedforward", "num_queries")),
    "--model.detr.backbone_last_stage=layer3",
]


def coco_ground_truth(dataset: dict) -> COCO:
    """A pycocotools ``COCO`` over a copy of ``dataset`` (images, annotations, categories), indexed without
    pycocotools' prints."""
    coco = COCO()
    coco.dataset = copy.deepcopy(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def collate_unpadded(samples: list) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Same-size ``(image [3, H, W], target)`` samples → the batch contract: images [B, 3, H, W], padding mask
    bool [B, H, W] (all False: nothing is padded) and the targets."""
    images = torch.stack([s[0] for s in samples])
    return images, torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool), [s[1] for s in samples]


class InMemoryData(L.LightningDataModule):
    """A data module over samples held in memory, batched with :func:`collate_unpadded`.

    Args:
        samples: ``(image, target)`` pairs for training, and for validation unless ``val_samples`` is given.
        coco: ground truth offered as ``val_dataset.coco``, as the real data module does (None: no
            ``val_dataset``).
        batch_size: of both loaders.
        shuffle: shuffle the training loader.
        train_repeats: the training loader goes over the samples this many times an epoch.
    """

    def __init__(self, samples: list, *, coco: Any = None, batch_size: int = 2, shuffle: bool = False,
                 train_repeats: int = 1, val_samples: list | None = None) -> None:
        super().__init__()
        self.samples = samples
        self.val_samples = samples if val_samples is None else val_samples
        self.batch_size, self.shuffle, self.train_repeats = batch_size, shuffle, train_repeats
        if coco is not None:
            self.val_dataset = SimpleNamespace(coco=coco)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.samples * self.train_repeats, batch_size=self.batch_size, shuffle=self.shuffle,
                          collate_fn=collate_unpadded)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_samples, batch_size=self.batch_size, collate_fn=collate_unpadded)


#: The categories of :func:`animal_samples` (COCO ids that are not contiguous; labels 0..2 map onto them).
ANIMALS = [{"id": 4, "name": "cat"}, {"id": 9, "name": "dog"}, {"id": 17, "name": "fish"}]
ANIMAL_IMAGE_SIZE = 64


def animal_samples() -> list[tuple[torch.Tensor, dict]]:
    """Four 64 × 64 random images with 0–2 boxes (one image has none); labels are contiguous 0..2."""
    size = ANIMAL_IMAGE_SIZE
    generator = torch.Generator().manual_seed(0)
    boxes = [[[0.3, 0.3, 0.2, 0.3]], [[0.6, 0.5, 0.4, 0.2], [0.2, 0.7, 0.2, 0.2]], [], [[0.5, 0.5, 0.5, 0.5]]]
    labels = [[0], [1, 2], [], [2]]
    samples = []
    for index, (b, l) in enumerate(zip(boxes, labels)):
        target = {"boxes": torch.tensor(b, dtype=torch.float32).reshape(-1, 4),
                  "labels": torch.tensor(l, dtype=torch.int64),
                  "image_id": torch.tensor(index + 1), "orig_size": torch.tensor([size, size]),
                  "size": torch.tensor([size, size])}
        samples.append((torch.randn(3, size, size, generator=generator), target))
    return samples


def animal_ground_truth(samples: list) -> COCO:
    """The COCO ground truth of :func:`animal_samples` (pixel ``xywh`` boxes, :data:`ANIMALS` ids)."""
    size = ANIMAL_IMAGE_SIZE
    annotations = []
    for image, target in samples:
        for (cx, cy, w, h), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": int(target["image_id"]),
                                "category_id": ANIMALS[label]["id"], "iscrowd": 0, "area": w * h * size * size,
                                "bbox": [(cx - w / 2) * size, (cy - h / 2) * size, w * size, h * size]})
    return coco_ground_truth({"images": [{"id": int(t["image_id"]), "width": size, "height": size} for _, t in samples],
                              "annotations": annotations, "categories": ANIMALS})


def animal_data() -> InMemoryData:
    """The four :func:`animal_samples` in batches of 2, with their ground truth as ``val_dataset.coco``."""
    samples = animal_samples()
    return InMemoryData(samples, coco=animal_ground_truth(samples))


def write_tiny_shapes(tmp_path_factory, *, num_train: int = 8, num_val: int = 4, seed: int = 3,
                      keypoints: bool = False) -> Path:
    """A COCO-layout shapes set of 64 px images (5 classes, at most 6 objects of 12 to 32 px) in a new
    temporary folder, with each shape's keypoints when ``keypoints``; returns the folder."""
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    root = tmp_path_factory.mktemp("tiny_shapes")
    write_shapes_dataset(root, ShapesConfig(num_train=num_train, num_val=num_val, image_size=64, min_object_size=12,
                                            max_object_size=32, seed=seed, keypoints=keypoints))
    return root


def tiny_fit_args(data_root, out_dir, *extra: str) -> list[str]:
    """``detr fit`` arguments for a few-step CPU run of the demo config on ``data_root`` into ``out_dir``:
    batch 4 (2 steps an epoch on the ``tiny_shapes_root`` fixture), validation every epoch, no progress bar."""
    config = REPO / "configs" / "demo_shapes_cpu.yaml"
    return [
        "fit", "--config", str(config), f"--data.root={data_root}", "--data.batch_size=4", "--data.val_batch_size=4",
        "--data.num_workers=0", *TINY_CLI_MODEL, f"--trainer.default_root_dir={out_dir}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=-1",
        *extra,
    ]


def tiny_square_fit_args(config: Path, model_args: list[str], data_root, out_dir, *extra: str) -> list[str]:
    """``detr fit`` arguments for a few-step CPU run of a real-time family's shapes ``config`` with a tiny model
    (``model_args``) on ``data_root`` into ``out_dir``: 64-px squares, batch 4, every step logged, no progress bar."""
    return ["fit", "--config", str(config), f"--data.root={data_root}", "--data.square_size=64",
            "--data.batch_size=4", "--data.val_batch_size=2", *model_args, f"--trainer.default_root_dir={out_dir}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--trainer.log_every_n_steps=1", *extra]


def load_script(relative_path: str):
    """Import a script of tools/ or benchmarks/ (folders of scripts, not packages) from its path in the
    repository, e.g. ``load_script("tools/predict.py")``; each call executes the file afresh."""
    path = REPO / relative_path
    name = f"script_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def load_tool(name: str):
    """The script ``tools/<name>.py`` as a module (see :func:`load_script`)."""
    return load_script(f"tools/{name}.py")


#: Embedding tables (ours and transformers' names), drawn standard normal by :func:`randomise`.
TABLES = {"query_embed", "query_position_embeddings", "row_embed", "col_embed", "row_embeddings", "column_embeddings"}


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Random weights, so that every query predicts a different box (transformers' init gives them all the
    same one): matrices with variance 1 / fan-in, embeddings standard normal, norm scales and batch-norm
    variances in [0.5, 1.5], other vectors small."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if "." in name and name.rsplit(".", 2)[-2] in TABLES:
                tensor.copy_(noise)
            elif tensor.dim() > 1:
                tensor.copy_(noise / tensor[0].numel() ** 0.5)
            elif name.endswith("running_var") or (name.endswith("weight") and ("norm" in name or "bn" in name)):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
            else:
                tensor.copy_(noise * 0.05)


PERSON, TREE = 1, 184  # a COCO panoptic thing and a stuff label


def tiny_coco_panoptic() -> torch.nn.Module:
    """A tiny DETRPanoptic in COCO panoptic's label space (250 classes) whose class head is confident: the
    logits of "person" and "tree-merged" (bias 12) differ along one direction of the decoder output, so
    every query is one of the two, most above the 0.85 panoptic threshold."""
    torch.manual_seed(0)
    # hidden_dim 128 is the smallest the mask head's GroupNorm(8) allows
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8, num_queries=6, dropout=0.0,
                                                   num_classes=250)).eval()
    with torch.no_grad():
        head = model.detr.class_embed
        head.weight.zero_()
        head.bias.zero_()
        direction = torch.randn(128)
        head.bias[[PERSON, TREE]] = 12.0
        head.weight[PERSON], head.weight[TREE] = 20 * direction / direction.norm(), -20 * direction / direction.norm()
    return model


#: transformers' ResNetConfig for the ResNets both sides build: (layer type, depths, widths).
RESNET_SPECS = {"resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
                "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])}


def padded_photo_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two photos of data/photos at different sizes (chelsea 144 × 96, astronaut 112 × 128 px), ImageNet-
    normalised and zero-padded bottom/right into one batch; mask True on padding (each image is padded)."""
    import numpy as np
    from PIL import Image

    from detr.data.collate import pad_images

    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    tensors = []
    for name, size in (("chelsea.png", (144, 96)), ("astronaut.png", (112, 128))):  # (width, height)
        image = Image.open(REPO / "data" / "photos" / name).convert("RGB").resize(size, Image.BILINEAR)
        tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255
        tensors.append((tensor - mean) / std)
    return pad_images(tensors)


def model_output(logits: torch.Tensor | None = None, boxes: torch.Tensor | None = None,
                 **fields: Any) -> DetectorOutput:
    """A :class:`DetectorOutput` made by hand for tests of the loss and the post-processing: logits default
    to zeros [B, Q, 1] and boxes to centred boxes [B, Q, 4], with B and Q from whichever tensor is given."""
    reference = next(t for t in (logits, boxes, fields.get("masks")) if t is not None)
    batch, queries = reference.shape[:2]
    logits = logits if logits is not None else torch.zeros(batch, queries, 1)
    boxes = boxes if boxes is not None else torch.tensor([0.5, 0.5, 0.2, 0.2]).repeat(batch, queries, 1)
    return DetectorOutput(logits, boxes, **fields)


def huggingface_outputs(model, images: torch.Tensor, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, normalised cxcywh boxes) of a transformers DETR-family detector on a padded batch (mask True
    on padding)."""
    with torch.no_grad():
        out = model(pixel_values=images, pixel_mask=(~padding_mask).long())
    return out.logits, out.pred_boxes


def detr_outputs(model, images: torch.Tensor, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two tensors from this project's detector."""
    with torch.no_grad():
        out = model(images, padding_mask)
    return out.logits, out.boxes


def read_sampling_page(path: Path) -> dict[str, Any]:
    """A Deformable DETR explorer page's embedded data (detr.visualize.explorer.data), its sampling points
    decoded as the page's script decodes them: points float64 [L, Q, heads, levels, P, 2] in fractions of the
    image's width and height, weights [L, Q, heads, levels, P]."""
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>',
                      Path(path).read_text(encoding="utf-8"), re.DOTALL)
    assert match, f"no data block in {path}"
    data = json.loads(match.group(1))
    shape = data["sampling"]["shape"]
    points = np.frombuffer(base64.b64decode(data["sampling"]["points"]), "<i2").reshape(*shape, 2)
    weights = np.frombuffer(base64.b64decode(data["sampling"]["weights"]), "<u2").reshape(shape)
    data["sampling"]["points"] = points / POINT_UNITS
    data["sampling"]["weights"] = weights / WEIGHT_UNITS
    return data


def save_project_checkpoint(model, path: Path, eval_size: tuple[int, int], category_map) -> Path:
    """This project's Lightning checkpoint layout (what detr.load_checkpoint reads back with config,
    category map and eval size)."""
    torch.save({
        "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
        "detr": {"model_config": model.config.to_dict(), "category_map": category_map.to_dict()},
        "datamodule_hyper_parameters": {"eval_min_size": eval_size[0], "eval_max_size": eval_size[1]},
    }, path)
    return path


def padded(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    height, width = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    batch = torch.zeros(len(images), 3, height, width)
    mask = torch.ones(len(images), height, width, dtype=torch.bool)
    for index, image in enumerate(images):
        batch[index, :, : image.shape[1], : image.shape[2]] = image
        mask[index, : image.shape[1], : image.shape[2]] = False
    return batch, mask


class RecordTrainingBatches(L.Callback):
    """Appends one json line per training batch to ``path``: its epoch, the side of its images and how many of its
    images are the plain flip and resize of their file (the data module's evaluation transform, or its mirror),
    i.e. were not touched by the authors' random operations (photometric distortion, zoom-out, IoU crop)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._plain: Any = None
        self._index_of: dict[int, int] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
                             ) -> None:
        from detr.data.coco import CocoDetection

        data = trainer.datamodule
        if self._plain is None:
            self._plain = CocoDetection(*data.paths["train"], transform=data.eval_transform,
                                        category_map=data.category_map)
            self._index_of = {image_id: index for index, image_id in enumerate(self._plain.ids)}
        images, _, targets = batch
        plain = 0
        for image, target in zip(images.cpu(), targets, strict=True):
            reference = self._plain[self._index_of[int(target["image_id"])]][0]
            plain += image.shape == reference.shape and any(
                torch.allclose(image, version, atol=2 / 255) for version in (reference, reference.flip(-1)))
        with self.path.open("a") as file:
            file.write(json.dumps({"epoch": trainer.current_epoch, "side": int(images.shape[-1]),
                                   "images": len(targets), "plain": int(plain)}) + "\n")


def fixed_box_model(tiny_config: dict, box_cxcywh: tuple[float, float, float, float], label: int) -> torch.nn.Module:
    """A tiny model whose every query predicts ``box_cxcywh`` (normalised) with class ``label`` at ~1."""
    torch.manual_seed(0)
    model = build_detr(tiny_config, dropout=0.0).eval()
    with torch.no_grad():
        last = model.bbox_embed.layers[-1]
        last.weight.zero_()
        last.bias.copy_(torch.logit(torch.tensor(box_cxcywh)))
        model.class_embed.weight.zero_()
        model.class_embed.bias.fill_(-10.0)
        model.class_embed.bias[label] = 10.0
    return model


#: The YOLO fixture (:func:`write_yolo_set`): classes, and per image its size (width, height) and label lines;
#: None: no label file. 64 × 48 images, so that a width and a height mixed up show.
YOLO_NAMES = ["cat", "dog", "bird"]
YOLO_IMAGES: dict[str, dict[str, tuple[tuple[int, int], str | None]]] = {
    "train": {"a.png": ((64, 48), "0 0.5 0.5 0.25 0.5\n2 0.25 0.25 0.125 0.25\n"),
              "b.jpg": ((64, 48), ""),              # an empty label file: no objects
              "sub/c.png": ((48, 64), None),        # no label file at all, in a subfolder
              "d.png": ((64, 48), "1 0.25 0.25 0.75 0.25 0.75 0.75 0.25 0.75\n0 0.75 0.5 0.25 0.5\n")},  # polygon
    "val": {"e.png": ((64, 48), "1 0.5 0.5 0.5 0.5\n\n"), "f.png": ((64, 48), "2 0.5 0.25 0.25 0.25\n")},
}


#: COCO's 17 person keypoint names, in its order (left before right).
COCO_PERSON_KEYPOINTS = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                         "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip",
                         "left_knee", "right_knee", "left_ankle", "right_ankle"]


def _write_image(path: Path, size: tuple[int, int]) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)


def write_yolo_set(root: Path, *, names_as_dict: bool = False, list_files: bool = False) -> Path:
    """The YOLO fixture (:data:`YOLO_IMAGES`) in ``root``: images/<split>/, labels/<split>/ and data.yaml (names as
    a list, or as ``{id: name}``; splits as folders, or as .txt lists of image paths); returns the data.yaml."""
    for split, images in YOLO_IMAGES.items():
        for name, (size, labels) in images.items():
            _write_image(root / "images" / split / name, size)
            if labels is not None:
                label_file = (root / "labels" / split / name).with_suffix(".txt")
                label_file.parent.mkdir(parents=True, exist_ok=True)
                label_file.write_text(labels)
        if list_files:
            (root / f"{split}.txt").write_text("".join(f"./images/{split}/{name}\n" for name in images))
    names = dict(enumerate(YOLO_NAMES)) if names_as_dict else YOLO_NAMES
    splits = {split: f"{split}.txt" if list_files else f"images/{split}" for split in YOLO_IMAGES}
    import yaml

    (root / "data.yaml").write_text(yaml.safe_dump({"path": ".", **splits, "names": names}))
    return root / "data.yaml"


#: The VOC fixture (:func:`write_voc_set`): per split, image id → size and objects (name, xmin, ymin, xmax, ymax,
#: difficult), corners 1-based and inclusive.
VOC_IMAGES: dict[str, dict[str, tuple[tuple[int, int], list[tuple[str, int, int, int, int, int]]]]] = {
    "train": {"2008_000001": ((64, 48), [("dog", 1, 1, 32, 24, 0), ("person", 10, 5, 40, 45, 1)]),
              "2008_000002": ((48, 64), [])},
    "val": {"2008_000003": ((64, 48), [("cat", 5, 6, 64, 48, 0)])},
}


def write_voc_set(root: Path) -> Path:
    """The VOC fixture (:data:`VOC_IMAGES`) in ``root``: Annotations/, JPEGImages/, ImageSets/Main/; returns root."""
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    for split, images in VOC_IMAGES.items():
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{stem}\n" for stem in images))
        for stem, ((width, height), objects) in images.items():
            _write_image(root / "JPEGImages" / f"{stem}.jpg", (width, height))
            xml_objects = "".join(
                f"<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>"
                f"<difficult>{difficult}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
                f"<ymax>{y1}</ymax></bndbox></object>" for name, x0, y0, x1, y1, difficult in objects)
            (root / "Annotations" / f"{stem}.xml").write_text(
                f"<annotation><folder>VOC2012</folder><filename>{stem}.jpg</filename><size><width>{width}</width>"
                f"<height>{height}</height><depth>3</depth></size>{xml_objects}</annotation>")
    return root


def error_lines(err: str) -> list[str]:
    """The ``error:`` lines of a command's stderr, beside the INFO lines the package may print there, failing on a
    traceback."""
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]
