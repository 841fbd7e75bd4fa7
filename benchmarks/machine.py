"""The machine a benchmark ran on, printed at the top of every benchmark's output.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported as ``machine``.
"""

from __future__ import annotations

import os
import platform

import torch


def describe_machine() -> str:
    """CPU model, usable cores, torch threads, AMX, load average, GPU, and torch / Python / OS versions."""
    cpu, amx = platform.processor() or "unknown CPU", "AMX unknown"
    try:
        with open("/proc/cpuinfo") as file:
            text = file.read()
        cpu = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        amx = "AMX" if "amx_bf16" in text else "no AMX"
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{value:.1f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        gpu = "none"
    return "\n".join([
        f"CPU: {cpu}, {cores} usable cores, torch threads {torch.get_num_threads()}, {amx}",
        f"load average {load} (other processes share these cores)",
        f"GPU: {gpu}",
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()} {platform.release()}",
    ])
