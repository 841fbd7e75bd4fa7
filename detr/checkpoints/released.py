"""The authors' released DETR models by name: where each file is, what it holds and what it scored.

    model = detr.load_checkpoint("detr-r50")      # downloaded on first use, then read from the cache

:data:`PRETRAINED_MODELS` maps each name to a :class:`PretrainedModel`. A file is downloaded once into
torch's hub cache (``torch.hub.get_dir()/checkpoints``, the folder the authors' own hubconf uses), with
a progress bar; its SHA-256 must start with the 8 hex digits of its file name (torch.hub's
``check_hash`` convention), otherwise it is refused and nothing is left in the cache. Offline, put the
file into that folder by hand: the error message names the URL and the folder.

``python -m detr.checkpoints.released`` (or ``--checkpoint list`` in the tools) prints the table.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import logging
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import torch

from detr.categories import COCO_PANOPTIC_NUM_CLASSES, CategoryMap, coco_panoptic_category_map, coco_panoptic_is_thing
from detr.checkpoints.formats import CheckpointContents, CheckpointError, infer_model_config, read_torch_file
from detr.models.config import AUTHORS_EVAL_SIZE, BackboneName, ModelMeta
from detr.models.detr_family import DetrConfig

logger = logging.getLogger(__name__)

Task = Literal["detection", "panoptic"]

_RELEASE_URL = "https://dl.fbaipublicfiles.com/detr/"


@dataclass(frozen=True)
class PretrainedModel:
    """One released checkpoint.

    name: what :func:`detr.load_checkpoint` accepts ("detr-r50"). url: where the file is; its file name
    ends in ``-<sha256_prefix>.pth``. backbone, dilation: the architecture (DC5 = dilated layer4);
    the transformer is the paper's (6 + 6 layers, hidden 256, 8 heads, 100 queries). num_classes:
    91 (COCO's raw category ids 1-90) for detection, 250 for panoptic (COCO panoptic ids).
    metrics: published COCO val2017 numbers (box AP etc.; panoptic adds segm AP and PQ).
    eval_size: the evaluation resize (shortest side, longest-side cap) the metrics were measured at.
    """

    name: str
    url: str
    sha256_prefix: str
    backbone: BackboneName
    dilation: bool
    metrics: Mapping[str, float] = field(compare=False)
    task: Task = "detection"
    num_classes: int = DetrConfig.num_classes
    eval_size: tuple[int, int] = AUTHORS_EVAL_SIZE

    @property
    def file_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def meta(self) -> ModelMeta:
        """COCO's 91-id map for the detectors; COCO panoptic's map and things/stuff for the panoptic models;
        the eval size the metrics were measured at."""
        if self.task == "detection":
            return ModelMeta(category_map=CategoryMap.coco(), eval_size=self.eval_size)
        return ModelMeta(category_map=coco_panoptic_category_map(), eval_size=self.eval_size,
                         is_thing=tuple(coco_panoptic_is_thing()))

    def config(self) -> DetrConfig:
        """The untrained detector's :class:`DetrConfig` (the paper's transformer: DetrConfig's defaults); a
        downloaded file's architecture is read from its weights."""
        return DetrConfig(backbone=self.backbone, dilation=self.dilation, num_classes=self.num_classes)


def _released(name: str, file_name: str, backbone: BackboneName, dilation: bool, task: Task = "detection",
              **metrics: float) -> PretrainedModel:
    return PretrainedModel(name=name, url=_RELEASE_URL + file_name, sha256_prefix=file_name[-12:-4],
                           backbone=backbone, dilation=dilation, metrics=MappingProxyType(metrics), task=task,
                           num_classes=DetrConfig.num_classes if task == "detection" else COCO_PANOPTIC_NUM_CLASSES)


#: The released checkpoints as data (name, file, architecture, published COCO val2017 numbers: 500-epoch schedule
#: for detection; the panoptic models add a mask head trained for 25 more epochs). ``--checkpoint list`` prints it
#: without importing this module (:func:`detr.inference.command_line.released_table`).
RELEASED_FILE = Path(__file__).with_name("released.json")

#: Every released checkpoint by name.
PRETRAINED_MODELS: Mapping[str, PretrainedModel] = MappingProxyType({row["name"]: _released(
    row["name"], row["file"], row["backbone"], row["dilation"], row["task"], **row["metrics"])
    for row in json.loads(RELEASED_FILE.read_text())["released"]})


#: The Hugging Face hub's models that README.md and docs/ name, by family (``*``: the sizes): transformers folders
#: that :func:`detr.load_checkpoint` reads (:func:`hub_directory` downloads them); released.json's "hub".
HUB_MODELS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    family: tuple(ids) for family, ids in json.loads(RELEASED_FILE.read_text())["hub"].items()})
#: "owner/name" as the hub spells a model id
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
#: file endings that make "a/b.ext" a path, never a hub id
_FILE_SUFFIXES = {".pth", ".pt", ".ckpt", ".bin", ".safetensors", ".onnx", ".xml", ".pt2", ".json", ".yaml"}
#: how close a misspelt name must be to a known one for it to be suggested (difflib's ratio)
_SUGGESTION_CUTOFF = 0.8


def download_command(repo_id: str) -> str:
    """huggingface_hub's command that downloads the hub model ``repo_id`` into a folder of its name."""
    return f"huggingface-cli download {repo_id} --local-dir {repo_id.rsplit('/', 1)[-1]}"


def hub_directory(source: object) -> Path | None:
    """The local folder of a Hugging Face hub id (``"PekingU/rtdetr_r50vd"``) that is no path here: downloaded
    into huggingface_hub's cache (once) when that package is installed; without it a :class:`CheckpointError`
    gives the download command. None for anything else (an existing path, a file name)."""
    if isinstance(source, Path):  # load_checkpoint hands ids on as paths
        source = str(source)
    if (not isinstance(source, str) or Path(source).exists() or not _HUB_ID.fullmatch(source)
            or Path(source).suffix in _FILE_SUFFIXES):
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{source!r} is no file or folder here; as a Hugging Face hub id, download it first: "
                              f"{download_command(source)} (pip install huggingface_hub), then pass the folder"
                              ) from None
    logger.info("%s is no path here: downloading it from the Hugging Face hub", source)
    try:
        return Path(snapshot_download(repo_id=source))
    except (OSError, ValueError) as error:  # offline, no such model, a gated one, an invalid id
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{source!r} is no file or folder here, and its download from the Hugging Face hub "
                              f"failed ({reason}); check the path or the id, or download it elsewhere: "
                              f"{download_command(source)}, then pass the folder") from error


def find(source: object) -> PretrainedModel | None:
    """The released model that ``source`` names, or None when it is a path.

    An existing file or folder always wins over a name. A string that looks like a name (no folder, no
    file extension) but is neither a file nor a released model raises :class:`CheckpointError`
    suggesting the closest names.
    """
    if isinstance(source, PretrainedModel):
        return source
    if isinstance(source, Path):  # load_checkpoint hands names on as paths
        source = str(source)
    if not isinstance(source, str) or Path(source).exists():
        return None
    if source in PRETRAINED_MODELS:
        return PRETRAINED_MODELS[source]
    if "/" not in source and "\\" not in source and not Path(source).suffix:
        # the hub's ids by their model name too ("rtdetr_r50vd" → PekingU/rtdetr_r50vd); far-off names are no hint
        hub = {repo_id.rsplit("/", 1)[-1]: repo_id for ids in HUB_MODELS.values() for repo_id in ids
               if "*" not in repo_id}
        close = difflib.get_close_matches(source, [*PRETRAINED_MODELS, *hub], n=3, cutoff=_SUGGESTION_CUTOFF)
        hint = ", ".join(f"{hub[name]} (a hub id: {download_command(hub[name])})" if name in hub else name
                         for name in close)
        hint = f"did you mean {hint}? " if close else ""
        raise CheckpointError(f"{source!r} is neither a file nor a released model's name; {hint}released models: "
                              f"{', '.join(PRETRAINED_MODELS)} (python -m detr.checkpoints.released lists them)")
    return None


def cache_dir() -> Path:
    """Where released files are kept: torch's hub cache, ``torch.hub.get_dir()/checkpoints``."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download(model: PretrainedModel, *, progress: bool = True) -> Path:
    """The model's file in :func:`cache_dir`, downloaded first if it is not there; returns its path.

    The download goes to a temporary file beside the target and is moved into place only once its
    SHA-256 matches, so an interrupted or corrupt download never sits in the cache. A file already in
    the cache (a finished download, or one put there by hand) is checked the same way.

    Raises:
        CheckpointError: when the file cannot be downloaded (naming the URL and the folder to put it
            in by hand) or its hash does not match.
    """
    path = cache_dir() / model.file_name
    if path.is_file():
        digest = _sha256(path)
        if not digest.startswith(model.sha256_prefix):
            raise CheckpointError(
                f"{path} is not the released {model.name} file: its SHA-256 starts with {digest[:8]}, expected "
                f"{model.sha256_prefix}. Delete it to download it again from {model.url}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s from %s to %s", model.name, model.url, path)
    try:
        torch.hub.download_url_to_file(model.url, str(path), hash_prefix=model.sha256_prefix, progress=progress)
    except RuntimeError as error:  # torch.hub's hash check; it has removed its temporary file
        raise CheckpointError(f"refused the download of {model.name} from {model.url}: {error}. Nothing was kept "
                              f"in {path.parent}; try again, or get the file another way") from error
    except OSError as error:  # no network, DNS failure, HTTP error (URLError and HTTPError are OSErrors)
        raise CheckpointError(
            f"could not download {model.name} from {model.url}: {error}. Offline, download {model.file_name} "
            f"elsewhere and put it into torch's hub cache folder {path.parent} (torch.hub.get_dir()/checkpoints, "
            f"set by $TORCH_HOME), then load it by name again; or pass the file's path instead of the name"
        ) from error
    return path


def is_url(source: object) -> bool:
    """Whether ``source`` is an http(s) URL (a str: ``Path`` would fold its ``//``)."""
    return isinstance(source, str) and source.lower().startswith(("http://", "https://"))


def download_url(url: str, *, progress: bool = True) -> Path:
    """A checkpoint (or exported file) at an http(s) ``url``, downloaded once into :func:`cache_dir` under the
    file name the URL ends in, with a progress bar, as ``torch.hub.load_state_dict_from_url`` keeps its files
    (a file of that name already there is used as it is). A name ending in ``-<hex digits>.<ext>`` is checked
    as torch.hub does: the file's SHA-256 must start with those digits.

    Raises:
        CheckpointError: the URL names no file, or it cannot be downloaded (naming the folder to put the file
            in by hand) or fails its hash check.
    """
    name = urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]
    if not name:
        raise CheckpointError(f"{url} names no file: give the URL of the checkpoint file itself (…/model.pth)")
    path = cache_dir() / name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    found = re.search(r"-([a-f0-9]{8,})\.\w+$", name)
    logger.info("downloading %s to %s", url, path)
    try:
        torch.hub.download_url_to_file(url, str(path), hash_prefix=found.group(1) if found else None,
                                       progress=progress)
    except RuntimeError as error:  # torch.hub's hash check; it has removed its temporary file
        raise CheckpointError(f"refused the download of {url}: {error}. Nothing was kept in {path.parent}") from error
    except (OSError, ValueError) as error:  # no network, an HTTP error, a URL urllib cannot open
        raise CheckpointError(f"could not download {url}: {error}. Download the file another way and pass its "
                              f"path, or put it into torch's hub cache folder {path.parent} and pass the URL again"
                              ) from error
    return path


def read_released(model: PretrainedModel, *, progress: bool = True) -> CheckpointContents:
    """Download (once) and read a released checkpoint, with its architecture, categories and eval size.

    The panoptic files hold the detector under ``detr.`` beside the mask head; the architecture is read
    from the detector's weights (the model's ``dilation`` added, which no weight shows).
    """
    path = download(model, progress=progress)
    contents = read_torch_file(path)
    detector = contents.state_dict
    if model.task == "panoptic":
        detector = {key[len("detr."):]: value for key, value in detector.items() if key.startswith("detr.")}
    config = infer_model_config(detector, path.name, class_head="softmax").replace(dilation=model.dilation)
    if config.backbone != model.backbone:
        raise CheckpointError(f"{path} holds a {config.backbone} model, but {model.name} is a {model.backbone}")
    return CheckpointContents(contents.state_dict, config, model.meta)


def describe() -> str:
    """The table that ``python -m detr.checkpoints.released`` and ``--checkpoint list`` print: name, file,
    published AP, and the cache folder."""
    from detr.inference.command_line import released_table

    return released_table(json.loads(RELEASED_FILE.read_text()), cache_dir())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m detr.checkpoints.released", description="List the released DETR models.")
    parser.parse_args(argv)
    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
