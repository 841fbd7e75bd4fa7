"""The real-time families' parts of the GPU session, rehearsed: ``benchmarks/gpu_session.sh --rehearse realtime``
runs the CUDA tests (skipped here), the training and inference benchmark beside transformers
(benchmarks/realtime_gpu.py), a short ``detr fit`` in bf16-mixed on the shapes set, the accuracy gate of that
model in fp32, bf16, fp16 and ONNX, and the compiled rows, all on the CPU at tiny sizes, so that the commands a
lent GPU runs cannot go stale. (A file of its own: it runs beside tests/commands/test_gpu_session.py.)"""

from __future__ import annotations

import pytest

from tests.helpers_cuda import rehearse_gpu_session

# What each part's log must hold: its table's header and rows, or its result lines.
EXPECTED = {
    "rt_tests": ["=== CUDA tests, every family: exit 0"],
    "rt_train": ["rtdetr_r18: 12 weighted terms compared", "| model | batch | mode | transformers img/s |",
                 "| host syncs / step (t / o) |", "| RT-DETR R18, 3 decoder layers | 2 | eager |"],
    "rt_infer": ["| rtdetr_r18 | 1 × 128 × 128 | transformers | eager | fp32 |",
                 "| rtdetr_r18 | 1 × 128 × 128 | ours | eager | fp16 |",
                 "| deimv2_l | 1 × 128 × 128 | ours | eager |"],
    "rt_fit": ["=== shapes set: exit 0", "=== detr fit rtdetr shapes (bf16-mixed, 2 steps): exit 0"],
    "rt_gate": ["### fit_rtdetr", "pytorch-bf16: pytorch (cpu, bf16)", "pytorch-fp16: pytorch (cpu, fp16)",
                "fit_rtdetr.onnx: onnxruntime"],
    "rt_compile": ["| rtdetr_r18 | 1 × 128 × 128 | ours | compiled | bf16 |",
                   "| RT-DETR R18, 3 decoder layers | 2 | compiled |"],
}


@pytest.mark.slow
def test_rehearsal_runs_every_realtime_part_of_the_gpu_session(tmp_path):
    # no trained models carried (a clone's .gpu/ may hold some): the gate takes rt_fit's run
    rehearse_gpu_session(tmp_path, "realtime", EXPECTED, CARRIED=str(tmp_path / "carried"))
