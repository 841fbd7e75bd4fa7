"""Shared by the CUDA tests (tests/test_cuda.py, tests/test_cuda_families.py): their skip marker, the device, plain
fp32 matrix products on it and the relative error they compare with; and the rehearsal of the GPU session's script
(tests/commands/test_gpu_session*.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

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
