"""benchmarks/realtime_training.py --count-ops: one step's operations, split where backward starts and ends, and the
reads of device values among them (tests/helpers_cuda.py's DeviceReads, with nothing exempt)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers import REPO, load_script


@pytest.fixture(scope="module")
def realtime_training():
    sys.path.insert(0, str(REPO / "benchmarks"))  # its sibling modules, as when it runs as a script
    try:
        yield load_script("benchmarks/realtime_training.py")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_a_step_s_operations_are_counted_by_phase_with_its_reads(realtime_training) -> None:
    linear = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    x = torch.randn(5, 4)

    def step() -> torch.Tensor:
        loss = linear(x).relu().sum()
        if loss > 0:  # a read of the loss's value (a GPU would wait here)
            loss = loss * 2
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    forward, backward, update, reads = realtime_training.count_operations(step)
    assert forward >= 4 and backward >= 3 and update >= 1 and reads == 1
    assert torch.Tensor.backward.__name__ == "backward"  # put back
