"""Released models by name: the registry, the download into torch's hub cache (served from 127.0.0.1),
the hash check, the offline message, and the listing."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import socket
import threading
from pathlib import Path

import pytest
import torch

import detr
from detr import CategoryMap, build_detr
from detr.checkpoints import CheckpointError
from detr.checkpoints import released as pretrained
from detr.checkpoints.released import PRETRAINED_MODELS, PretrainedModel
from tests.helpers import tiny_config_with

ROOT = Path(__file__).resolve().parents[2]
TINY_COCO = tiny_config_with(num_classes=91)


def test_registry_lists_every_release_with_its_url_hash_and_numbers():
    assert list(PRETRAINED_MODELS) == ["detr-r50", "detr-r50-dc5", "detr-r101", "detr-r101-dc5",
                                       "detr-r50-panoptic", "detr-r50-dc5-panoptic", "detr-r101-panoptic"]
    for name, model in PRETRAINED_MODELS.items():
        assert model.name == name
        assert model.url == f"https://dl.fbaipublicfiles.com/detr/{model.file_name}"
        assert model.file_name == f"{name}-{model.sha256_prefix}.pth"
        assert len(model.sha256_prefix) == 8 and int(model.sha256_prefix, 16) >= 0
        assert model.dilation == ("dc5" in name) and model.backbone == ("resnet101" if "r101" in name else "resnet50")
        assert model.meta.eval_size == (800, 1333)
        assert model.task == ("panoptic" if "panoptic" in name else "detection")
    r50 = PRETRAINED_MODELS["detr-r50"]
    assert r50.sha256_prefix == "e632da11" and r50.metrics["box_ap"] == 42.0 and r50.metrics["box_ap50"] == 62.4
    assert r50.meta.category_map == CategoryMap.coco() and r50.num_classes == 91
    assert PRETRAINED_MODELS["detr-r101-dc5"].metrics["box_ap"] == 44.9
    assert PRETRAINED_MODELS["detr-r50-panoptic"].metrics["pq"] == 43.4
    assert PRETRAINED_MODELS["detr-r50-panoptic"].num_classes == 250


class _Server:
    """Serves one folder on 127.0.0.1 from a thread and counts the requests."""

    def __init__(self, folder: Path) -> None:
        self.requests = 0
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self):
                server.requests += 1
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 5
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def hub_dir(tmp_path):
    """torch.hub's cache pointed at a temporary folder, restored afterwards."""
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "hub"))
    yield tmp_path / "hub" / "checkpoints"
    torch.hub.set_dir(previous)


@pytest.fixture
def served_checkpoint(tmp_path):
    """A tiny checkpoint in the authors' release format, named like theirs (-<sha256 prefix>.pth), served."""
    torch.manual_seed(0)
    model = build_detr(TINY_COCO)
    folder = tmp_path / "site"
    folder.mkdir()
    staging = folder / "staging.pth"
    torch.save({"model": model.state_dict(), "epoch": 1}, staging)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    path = staging.rename(folder / f"tiny-{digest[:8]}.pth")
    server = _Server(folder)
    try:
        yield server, path, model
    finally:
        server.stop()


def _register(monkeypatch, entry: PretrainedModel) -> None:
    monkeypatch.setattr(pretrained, "PRETRAINED_MODELS", {entry.name: entry})


def _entry(url: str, sha256_prefix: str) -> PretrainedModel:
    return PretrainedModel(name="tiny-test", url=url, sha256_prefix=sha256_prefix, backbone="resnet18",
                           dilation=False, metrics={"box_ap": 1.0})


def test_first_load_downloads_then_the_cache_is_used(hub_dir, served_checkpoint, monkeypatch):
    server, path, original = served_checkpoint
    _register(monkeypatch, _entry(f"http://127.0.0.1:{server.port}/{path.name}", path.name[5:13]))
    model = detr.load_checkpoint("tiny-test")
    assert server.requests == 1
    assert (hub_dir / path.name).read_bytes() == path.read_bytes()
    assert sorted(p.name for p in hub_dir.iterdir()) == [path.name]  # no partial file left behind
    assert all(torch.equal(model.state_dict()[k], v) for k, v in original.state_dict().items())
    assert model.meta.category_map == CategoryMap.coco() and model.meta.eval_size == (800, 1333) and not model.training
    server.stop()  # from now on the network would fail
    again = detr.load_checkpoint("tiny-test")
    assert server.requests == 1
    assert torch.equal(again.query_embed.weight, original.query_embed.weight)


def test_init_checkpoint_by_name_goes_through_the_same_download(hub_dir, served_checkpoint, monkeypatch):
    from detr.lightning.system import DetrSystem

    server, path, original = served_checkpoint
    _register(monkeypatch, _entry(f"http://127.0.0.1:{server.port}/{path.name}", path.name[5:13]))
    system = DetrSystem(detr=TINY_COCO.replace(num_classes=3), init_checkpoint="tiny-test")
    assert torch.equal(system.model.query_embed.weight, original.query_embed.weight)
    assert system.model.class_embed.weight.shape[0] == 4  # another data set's classes: head re-initialised
    assert server.requests == 1


def test_wrong_hash_is_refused_and_nothing_stays_in_the_cache(hub_dir, served_checkpoint, monkeypatch):
    server, path, _ = served_checkpoint
    _register(monkeypatch, _entry(f"http://127.0.0.1:{server.port}/{path.name}", "00000000"))
    with pytest.raises(CheckpointError, match="refused the download of tiny-test"):
        detr.load_checkpoint("tiny-test")
    assert server.requests == 1
    assert not hub_dir.exists() or list(hub_dir.iterdir()) == []


def test_a_corrupt_file_in_the_cache_is_refused(hub_dir, served_checkpoint, monkeypatch):
    server, path, _ = served_checkpoint
    _register(monkeypatch, _entry(f"http://127.0.0.1:{server.port}/{path.name}", path.name[5:13]))
    hub_dir.mkdir(parents=True)
    (hub_dir / path.name).write_bytes(path.read_bytes()[:1000])  # e.g. a truncated copy put there by hand
    with pytest.raises(CheckpointError, match="is not the released tiny-test file.*Delete it"):
        detr.load_checkpoint("tiny-test")
    assert server.requests == 0


def test_offline_error_names_the_url_the_file_and_the_cache_folder(hub_dir, monkeypatch):
    with socket.socket() as probe:  # a port that nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/tiny-0badc0de.pth"
    _register(monkeypatch, _entry(url, "0badc0de"))
    with pytest.raises(CheckpointError) as error:
        detr.load_checkpoint("tiny-test")
    message = str(error.value)
    assert url in message and "tiny-0badc0de.pth" in message and str(hub_dir) in message
    assert not hub_dir.exists() or list(hub_dir.iterdir()) == []


def test_unknown_names_suggest_released_ones(hub_dir):
    with pytest.raises(CheckpointError, match="did you mean detr-r50"):
        detr.load_checkpoint("detr-r5")
    assert not hub_dir.exists()


def test_a_panoptic_release_loads_by_name(hub_dir, tmp_path, monkeypatch):
    from detr.models.segmentation import DETRPanoptic, build_detr_panoptic

    torch.manual_seed(0)
    original = build_detr_panoptic(TINY_COCO.replace(hidden_dim=128, num_heads=8, num_classes=250))
    folder = tmp_path / "site"
    folder.mkdir()
    torch.save({"model": original.state_dict()}, folder / "staging.pth")
    digest = hashlib.sha256((folder / "staging.pth").read_bytes()).hexdigest()[:8]
    (folder / "staging.pth").rename(folder / f"tiny-panoptic-{digest}.pth")
    server = _Server(folder)
    try:
        entry = PretrainedModel(name="tiny-panoptic", url=f"http://127.0.0.1:{server.port}/tiny-panoptic-{digest}.pth",
                                sha256_prefix=digest, backbone="resnet18", dilation=False, metrics={"pq": 1.0},
                                task="panoptic", num_classes=250)
        _register(monkeypatch, entry)
        model = detr.load_checkpoint("tiny-panoptic")
    finally:
        server.stop()
    assert isinstance(model, DETRPanoptic) and model.num_classes == 250 and model.meta.eval_size == (800, 1333)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in original.state_dict().items())


def test_an_existing_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"model": build_detr(TINY_COCO).state_dict()}, tmp_path / "detr-r50")
    assert detr.load_checkpoint("detr-r50").config.backbone == "resnet18"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checkpoint_list_prints_the_names(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _tool("predict").main(["--checkpoint", "list"])  # no inputs or --out needed
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in PRETRAINED_MODELS)
    assert "detr-r50-e632da11.pth" in printed and "box AP 42.0" in printed
    assert pretrained.main([]) == 0
    assert "detr-r101-dc5-a2e86def.pth" in capsys.readouterr().out


def test_a_hub_id_is_downloaded_with_huggingface_hub_and_read(tmp_path, monkeypatch):
    # the README's "PekingU/rtdetr_r50vd" said "checkpoint file ... does not exist"; here the download is faked
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from detr.checkpoints import save_huggingface
    from tests.helpers_realtime import tiny_model

    folder = save_huggingface(tiny_model("rtdetr"), tmp_path / "snapshot")
    asked = []

    def snapshot_download(repo_id, **_):
        asked.append(repo_id)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    model = detr.load_checkpoint("PekingU/rtdetr_r50vd")
    assert asked == ["PekingU/rtdetr_r50vd"] and model.config.family == "rtdetr"


def test_a_hub_id_that_cannot_be_downloaded_gives_the_command(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def offline(repo_id, **_):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as error:
        detr.load_checkpoint("PekingU/rtdetr_r50vd")
    message = str(error.value)
    assert "couldn't connect" in message and "does not exist" not in message
    assert "huggingface-cli download PekingU/rtdetr_r50vd --local-dir rtdetr_r50vd" in message


def test_without_huggingface_hub_a_hub_id_gives_the_command(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"download it first: huggingface-cli download PekingU/rtdetr_r50vd "
                                              r"--local-dir rtdetr_r50vd \(pip install huggingface_hub\)"):
        detr.load_checkpoint("PekingU/rtdetr_r50vd")


def test_a_missing_file_or_folder_is_no_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        detr.load_checkpoint("runs/last.ckpt")


def test_a_hub_model_name_suggests_its_id_and_far_off_names_suggest_nothing(hub_dir):
    with pytest.raises(CheckpointError) as error:
        detr.load_checkpoint("rtdetr_r50vd")
    message = str(error.value)
    assert "did you mean PekingU/rtdetr_r50vd (a hub id: huggingface-cli download PekingU/rtdetr_r50vd" in message
    assert "detr-r50" not in message.split("did you mean")[1].split("?")[0]
    with pytest.raises(CheckpointError) as error:
        detr.load_checkpoint("yolov8n")
    assert "did you mean" not in str(error.value)


def test_checkpoint_list_names_the_hub_models_the_docs_name(capsys):
    printed = pretrained.describe()
    docs = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    for ids in pretrained.HUB_MODELS.values():
        for repo_id in ids:
            assert repo_id in printed and repo_id.split("/")[0] + "/" in docs, repo_id
    assert "PekingU/rtdetr_r50vd" in printed and "Roboflow/rf-detr-*" in printed


def test_a_url_is_downloaded_once_into_the_hub_cache(hub_dir, served_checkpoint):
    """X9: Predictor.from_checkpoint("http://...") read the URL as a path, its // folded ("http:/..."), and said
    the file did not exist. A URL is downloaded once into torch's hub cache (its -<sha256 prefix> checked)."""
    from detr.inference.predictor import Predictor

    server, path, original = served_checkpoint
    url = f"http://127.0.0.1:{server.port}/{path.name}"
    predictor = Predictor.from_checkpoint(url, device="cpu")
    assert server.requests == 1 and (hub_dir / path.name).read_bytes() == path.read_bytes()
    assert torch.equal(predictor.model.query_embed.weight, original.query_embed.weight)
    assert torch.equal(detr.load_checkpoint(url).query_embed.weight, original.query_embed.weight)
    assert server.requests == 1  # the cache
    (path.parent / "other-0123abcd.pth").write_bytes(path.read_bytes())  # its name's hash prefix is wrong
    with pytest.raises(CheckpointError, match=rf"refused the download of {url[:-len(path.name)]}other"):
        detr.load_checkpoint(f"http://127.0.0.1:{server.port}/other-0123abcd.pth")
    assert not (hub_dir / "other-0123abcd.pth").exists()
    with pytest.raises(CheckpointError, match=r"could not download .*/missing\.pth: HTTP Error 404"):
        detr.load_checkpoint(f"http://127.0.0.1:{server.port}/missing.pth")
    with pytest.raises(CheckpointError, match="names no file"):
        detr.load_checkpoint(f"http://127.0.0.1:{server.port}/")
