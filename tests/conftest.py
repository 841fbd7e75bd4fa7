"""Fixtures: the tiny model, a padded batch, one torch thread, a tiny shapes set and Chromium; the tiers of
tests/tiers.py as markers. What test modules share besides fixtures lives in tests/helpers.py (test modules import
from there, not from here)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from detr import build_detr
from detr.models.detr_family import DetrConfig
from tests.browser import find_chromium
from tests.helpers import TINY, write_tiny_shapes
from tests.tiers import classify


@pytest.fixture(autouse=True, scope="session")
def no_nncf_in_the_test_process():
    """NNCF stays out of the process that runs the suite: its quantize imports nncf.torch and leaves thread
    pools behind, and CI's sequential run crashed (SIGSEGV) a few tests after the first in-process INT8 export.
    The tests that quantise run detr-export (or a script) in a child process, as a user does."""
    yield
    assert "nncf" not in sys.modules, "a test imported nncf in the pytest process: quantise in a child process"


@pytest.fixture
def tiny_config() -> DetrConfig:
    """:data:`tests.helpers.TINY`, for tests that build their own variant of the tiny model."""
    return TINY


@pytest.fixture
def one_thread():
    """One torch thread: tiny models run faster on one, and far faster when other processes share the 2 cores
    (forked DDP processes keep it too: an OpenMP pool does not survive a fork). Use it per module with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def bare_argv(monkeypatch):
    """``sys.argv`` of a bare ``detr`` call: LightningCLI warns when sys.argv and its args both hold arguments."""
    monkeypatch.setattr("sys.argv", ["detr"])


@pytest.fixture
def tiny_model():
    """:data:`tests.helpers.TINY` built with seed 0, without dropout, in eval mode."""
    torch.manual_seed(0)
    return build_detr(TINY, dropout=0.0).eval()


@pytest.fixture
def padded_batch():
    """Two images of different sizes, zero-padded to 96 × 128 (bottom/right), mask True on padding."""
    torch.manual_seed(1)
    images = torch.zeros(2, 3, 96, 128)
    mask = torch.ones(2, 96, 128, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, 96, 128), False
    images[1, :, :64, :96], mask[1, :64, :96] = torch.randn(3, 64, 96), False
    return images, mask


@pytest.fixture(scope="session")
def tiny_shapes_root(tmp_path_factory):
    """A COCO-layout shapes set: 8 training and 4 validation images of 64 px (5 classes, at most 6 objects)."""
    return write_tiny_shapes(tmp_path_factory)


@pytest.fixture(scope="session")
def grounding_directory(tmp_path_factory):
    """A tiny random transformers Grounding DINO directory with its processor (tests/helpers_grounding.py; its
    resize 160 / 240 px), shared by the commands, the server and the explorer that read a prompt."""
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from tests.helpers_grounding import write_directory

    directory = tmp_path_factory.mktemp("grounding") / "model"
    write_directory(directory, "gdino", seed=3, image_size=(160, 240))
    return directory


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary (tests/browser.py); skips the test without one, unless CI is set: then it fails."""
    binary = find_chromium()
    if binary is None:
        message = ("Chromium not found (install Debian's package: apt-get install -y chromium, or set CHROMIUM "
                   "to the browser binary)")
        if os.environ.get("CI"):
            pytest.fail(message + "; CI is set, so the browser test must run")
        pytest.skip(message)
    return binary



def pytest_configure(config) -> None:
    """Under pytest-xdist, the CPUs shared among the workers: each worker's torch (and the processes its tests
    start) gets its share of threads, unless OMP_NUM_THREADS says otherwise, so that two workers on two cores do
    not run four threads."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cpus // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items) -> None:
    """The tiers, from what each test uses (tests/tiers.py): ``parity`` on a test that compares with another
    implementation, ``integration`` on one that drives the CLI or a Trainer, exports, starts a server, a browser,
    a subprocess or DDP, or is marked slow. ``make test`` runs ``-m "not integration"``."""
    for item in items:
        reasons, parity = classify(item)
        if parity:
            item.add_marker(pytest.mark.parity)
        elif reasons:
            item.add_marker(pytest.mark.integration(*sorted(reasons)))
