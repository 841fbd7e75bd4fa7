import json
import os

import numpy as np
import pytest
from PIL import Image

from detr.data import image_checks
from detr.data.image_checks import ImageReading, default_cache_file, read_images


@pytest.fixture
def files(tmp_path):
    paths = []
    for k, (height, width) in enumerate([(10, 20), (30, 15), (8, 8)]):
        path = tmp_path / f"{k}.jpg"
        Image.fromarray(np.full((height, width, 3), 40 * k, np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture
def reads(monkeypatch):
    """The files each call really reads (not served from the cache)."""
    seen = []
    original = image_checks.read_image

    def counting(path, decode, annotations_file):
        seen.append((path.name, decode))
        return original(path, decode, annotations_file)

    monkeypatch.setattr(image_checks, "read_image", counting)
    return seen


def test_the_cache_serves_unchanged_files_and_rereads_changed_ones(files, tmp_path, reads):
    cache = tmp_path / "instances.json.imagecache"
    first = read_images(files, decode=False, cache_file=cache)
    assert [r.size for r in first] == [(10, 20), (30, 15), (8, 8)] and len(reads) == 3
    reads.clear()
    assert read_images(files, decode=False, cache_file=cache) == first and reads == []
    # A rewritten file (new size and mtime) is read again; the others still come from the cache.
    Image.fromarray(np.zeros((12, 7, 3), np.uint8)).save(files[1])
    os.utime(files[1], ns=(1, 1))
    again = read_images(files, decode=False, cache_file=cache)
    assert reads == [("1.jpg", False)] and again[1].size == (12, 7)


def test_a_header_read_does_not_stand_for_a_decode_but_a_decode_for_a_header(files, tmp_path, reads):
    cache = tmp_path / "c.imagecache"
    read_images(files, decode=False, cache_file=cache)
    reads.clear()
    read_images(files, decode=True, cache_file=cache)
    assert reads == [(p.name, True) for p in files]
    reads.clear()
    read_images(files, decode=False, cache_file=cache)
    read_images(files, decode=True, cache_file=cache)
    assert reads == []


def test_failures_are_not_cached_and_a_bad_cache_is_ignored(files, tmp_path, reads):
    cache = tmp_path / "c.imagecache"
    files[2].write_bytes(b"not an image")
    readings = read_images(files, decode=False, cache_file=cache)
    assert readings[2].size is None and "2.jpg" in readings[2].error
    assert set(json.loads(cache.read_text())["entries"]) == {"0.jpg", "1.jpg"}
    reads.clear()
    read_images(files, decode=False, cache_file=cache)
    assert reads == [("2.jpg", False)]
    cache.write_text("{truncated")
    reads.clear()
    assert read_images(files[:2], decode=False, cache_file=cache)[0] == ImageReading((10, 20), None, (10, 20), 1)
    assert len(reads) == 2


def test_an_unwritable_cache_folder_only_loses_the_cache(files, tmp_path):
    cache = tmp_path / "no" / "such" / "folder"
    cache.parent.parent.write_text("a file where the folder should be")
    assert [r.size for r in read_images(files, decode=True, cache_file=cache)] == [(10, 20), (30, 15), (8, 8)]


def test_workers_read_the_same_as_this_process(files, tmp_path):
    assert read_images(files, decode=True, workers=2) == read_images(files, decode=True)
    assert default_cache_file(tmp_path / "a" / "instances.json") == tmp_path / "a" / "instances.json.imagecache"


def test_a_copied_data_set_keeps_its_cache_and_files_no_longer_listed_leave_it(files, tmp_path, reads):
    import shutil

    read_images(files, decode=False, cache_file=tmp_path / "c.imagecache")
    copy = tmp_path.parent / (tmp_path.name + "_copy")
    shutil.copytree(tmp_path, copy)  # copy2: sizes and mtimes kept
    reads.clear()
    copied = [copy / p.name for p in files]
    assert [r.size for r in read_images(copied, decode=False, cache_file=copy / "c.imagecache")] == [
        (10, 20), (30, 15), (8, 8)] and reads == []
    (copy / "3.jpg").write_bytes(files[0].read_bytes())
    read_images([copy / "3.jpg"], decode=False, cache_file=copy / "c.imagecache")
    assert set(json.loads((copy / "c.imagecache").read_text())["entries"]) == {"3.jpg"}


def test_a_progress_bar_over_many_files(files, monkeypatch, capsys):
    monkeypatch.setattr(image_checks, "PROGRESS_MIN_FILES", 3)
    read_images(files, decode=False, progress=True)
    assert "reading headers" in capsys.readouterr().err
    read_images(files[:2], decode=True, progress=True)
    assert "decoding" not in capsys.readouterr().err  # too few files to be worth a bar
