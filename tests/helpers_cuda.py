"""Shared by the CUDA tests (tests/test_cuda.py, tests/test_cuda_families.py): their skip marker, the device, plain
fp32 matrix products on it and the relative error they compare with; the rehearsal of the GPU session's script
(tests/commands/test_gpu_session*.py); and :class:`DeviceReads`, which finds on the CPU the operations that would make
a GPU step wait for the host (tests/loss/test_host_syncs.py, benchmarks/realtime_training.py --count-ops)."""

from __future__ import annotations

import os
import subprocess
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).parents[1]

#: Skips a module where no GPU is at hand (CI has none).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def no_tf32():
    """Plain fp32 matrix products on the GPU, so that CPU and GPU differ by rounding only."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.double().cpu(), reference.double().cpu()
    return float((value - reference).norm() / reference.norm())


def rehearse_gpu_session(tmp_path: Path, parts: str, expected: dict[str, list[str]], **env: str) -> Path:
    """Run ``benchmarks/gpu_session.sh --rehearse PARTS`` (the GPU session's commands on the CPU at tiny sizes)
    with ``env`` added; assert that every step exited 0 and that each part's log holds its ``expected`` lines.
    Returns the folder of the logs."""
    out = tmp_path / "out"
    environment = os.environ | {"OUT": str(out), "RUNS": str(tmp_path / "runs")} | env
    environment.pop("PYTHON", None)
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--rehearse", parts], cwd=ROOT, env=environment,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=2400)
    failed = [line for line in result.stdout.splitlines() if line.startswith("===") and "exit " in line
              and "exit 0 " not in line]
    assert result.returncode == 0, f"{failed}\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
    assert result.stdout.rstrip().splitlines()[-1].endswith(", 0 failed steps")
    for part, lines in expected.items():
        log = (out / f"{part}.log").read_text()
        for text in lines:
            assert text in log, f"{part}.log lacks {text!r}"
    return out


#: Operations whose result the host must read (or whose output size depends on the values).
READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_dim", "unique_consecutive",
         "repeat_interleave", "equal", "is_nonzero", "bincount", "histc", "masked_scatter"}
#: Indexing operations, which read the values back when an index is a boolean mask.
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}
#: (file in the package, function): the reads that are meant, and why.
BY_DESIGN = {
    ("loss/matcher.py", "assign"): "the Hungarian assignment on the host copy of the costs (the one copy)",
    ("loss/criterion.py", "matching_union"): "GO-LSD's union of the matcher's indices, which are host tensors",
    ("loss/keypoint_terms.py", "check_keypoint_labels"): "labels on the CPU only (a GPU batch's are checked on the "
                                                         "host before they move: DetrSystem.on_before_batch_transfer)",
    ("models/transformer.py", "flatten_feature_map"): "DETR drops an all-real mask so SDPA can run its fastest kernel",
}


class DeviceReads(TorchDispatchMode):
    """Records (operation, innermost package frame) of every operation that would read a device value back, other
    than :data:`BY_DESIGN`'s (all of them with ``exempt=False``) in ``found``, and counts every operation dispatched
    (``operations``: views included, which launch no kernel)."""

    def __init__(self, exempt: bool = True) -> None:
        super().__init__()
        self.exempt = exempt  # False: record BY_DESIGN's reads too
        self.found: list[tuple[str, str]] = []
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        self.operations += 1
        reads = name in READS or (name in INDEXING and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1] if index is not None))
        if reads:
            frames = [(frame.filename.replace("\\", "/").split("/detr/", 1)[-1], frame.name, frame.lineno)
                      for frame in traceback.extract_stack() if "/detr/" in frame.filename.replace("\\", "/")
                      and "/tests/" not in frame.filename.replace("\\", "/")]
            if not (self.exempt and any((path, function) in BY_DESIGN for path, function, _ in frames)):
                where = f"{frames[-1][0]}:{frames[-1][2]} ({frames[-1][1]})" if frames else "outside the package"
                self.found.append((name, where))
        return func(*args, **(kwargs or {}))
