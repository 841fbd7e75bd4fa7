"""The GPU session's script, rehearsed: ``benchmarks/gpu_session.sh --rehearse all`` runs every command of a
lent GPU's session on the CPU at tiny sizes, so the paths, flags and configs it uses cannot go stale between
the days a GPU is at hand (the earlier script called test files that had moved)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers_cuda import rehearse_gpu_session

ROOT = Path(__file__).parents[2]

# What each part's log must hold: its table's header and rows, or its result lines.
EXPECTED = {
    "tests": ["=== CUDA tests: exit 0", "=== model, loss and matcher tests on this machine's torch: exit 0"],
    "sdpa": ["without cuDNN attention (shipped): finite for 3 steps", "with cuDNN attention (torch's default): finite"],
    "train": ["| setting | synthetic img/s | real-data img/s | peak memory |", "| fp32 |", "| tf32 |", "| bf16 |"],
    "infer": ["| setting | batch 1 img/s |", "| fp32 |", "| bf16 |"],
    "loss": ["fp32: first-step loss", "bf16: first-step loss"],
    "commands": ["=== detr validate (authors' release layout): exit 0", "=== detr fit (R50 bf16-mixed",
                 "| predict fp32 vs bf16 | 50 images |", "=== explorer: exit 0"],
    "compile": ["| bf16 compile |", "=== inference, compiled: exit 0", "=== training, compiled: exit 0"],
}


@pytest.mark.slow
def test_rehearsal_runs_every_part_of_the_gpu_session(tmp_path):
    out = rehearse_gpu_session(tmp_path, "all", EXPECTED)
    train = (out / "train.log").read_text()
    # The authors' rows where a checkout of facebookresearch/detr is at hand (.authors/detr), else the reason.
    if (ROOT / ".authors" / "detr" / "models").is_dir():
        assert "| authors fp32 |" in train and "ours bf16 / authors fp32" in train
        assert "authors fp32: first-step loss" in (out / "loss.log").read_text()
    else:
        assert "authors' code: not measured" in train


def test_an_unknown_part_is_named_and_fails(tmp_path):
    env = os.environ | {"OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs")}
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--rehearse", "trian"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "unknown part 'trian'" in result.stdout
