"""The data side at COCO's size: build time, memory of the main process and of each loader worker over an
epoch, the start-up checks and a `detr fit`-style start-up, on a synthetic set (detr-make-synthetic-coco).

    .venv/bin/python -m detr.commands.make_synthetic_coco --out /tmp/coco-synthetic     # 118,287 + 5,000 images
    .venv/bin/python benchmarks/coco_scale.py --root /tmp/coco-synthetic [--images N] [--phases build workers ...]

Each phase runs in a fresh process (its peak memory is its own) and prints one row:

- build: ``CocoDetection(train2017)``, json read included: seconds, peak RSS, private memory (USS) after.
- workers: one shuffled epoch (``--images`` samples, default all) of the data set's own ``__getitem__`` (decode,
  annotations, the default normalising transform) through a DataLoader with ``--workers`` workers; the USS of
  each worker at 2 %, 25 %, 50 % and 100 % of the epoch.
- checks: the start-up data checks of ``detr fit`` (``CheckData``: train headers, val full decode), timed alone
  on an already built data module: run twice, the first without the image cache the checks leave beside the
  jsons, the second with it, as a resumed run or the next run on the data sees it.
- startup: a ``detr fit``-style start-up: ``DetrDataModule(root)``, ``Trainer.fit`` with the real ``CheckData``
  callback and the real loaders (2 workers, the authors' train transform) up to the first ``training_step``
  of a system without a model (its step does nothing): seconds from the process start, imports included,
  CPU seconds of the main process and with its finished children (the checks' reading pool; the loader
  workers still run), and peak RSS. Run twice, as for the checks.

USS (unique set size) = Private_Clean + Private_Dirty of /proc/PID/smaps_rollup: the pages only that process
holds, i.e. what copy-on-read turned from shared into private.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

MIB = 1024 * 1024


def uss_mib(pid: int | str = "self") -> float:
    """Private_Clean + Private_Dirty of a process, MiB."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (less sensitive to a shared machine's
    load than wall time)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def count_samples(batch: list) -> int:
    return len(batch)


def phase_build(args: argparse.Namespace) -> dict:
    from detr.data.coco import CocoDetection

    before, cpu = uss_mib(), cpu_seconds()
    start = time.perf_counter()
    dataset = CocoDetection(f"{args.root}/train2017", f"{args.root}/annotations/instances_train2017.json")
    seconds = time.perf_counter() - start
    return {"images": len(dataset), "seconds": seconds, "cpu_s": cpu_seconds() - cpu, "peak_rss_mib": peak_rss_mib(),
            "uss_before_mib": before, "uss_after_mib": uss_mib()}


def phase_workers(args: argparse.Namespace) -> dict:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from detr.data.coco import CocoDetection

    torch.set_num_threads(1)
    dataset = CocoDetection(f"{args.root}/train2017", f"{args.root}/annotations/instances_train2017.json")
    samples = args.images or len(dataset)
    sampler = RandomSampler(dataset, num_samples=samples, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        collate_fn=count_samples)
    batches = len(loader)
    marks = {max(1, round(batches * f)): label for f, label in ((0.02, "2%"), (0.25, "25%"), (0.5, "50%"))}
    marks[batches] = "100%"
    iterator = iter(loader)
    pids = [w.pid for w in iterator._workers]
    uss: dict[str, list[float]] = {}
    start = time.perf_counter()
    for number, _ in enumerate(iterator, start=1):
        if number in marks:
            uss[marks[number]] = [round(uss_mib(pid), 1) for pid in pids]
    seconds = time.perf_counter() - start
    return {"samples": samples, "epoch_seconds": seconds, "worker_uss_mib": uss, "main_uss_mib": uss_mib(),
            "main_peak_rss_mib": peak_rss_mib()}


def _data_module(args: argparse.Namespace):
    from detr.lightning.datamodule import DetrDataModule

    return DetrDataModule(root=args.root, batch_size=2, num_workers=args.workers)


def phase_checks(args: argparse.Namespace) -> dict:
    from types import SimpleNamespace

    from detr.lightning.data_checks import CheckData

    data = _data_module(args)
    data.setup("fit")
    built, cpu = time.perf_counter(), cpu_seconds()
    trainer = SimpleNamespace(datamodule=data, is_global_zero=True, local_rank=0, global_rank=0, world_size=1,
                              strategy=SimpleNamespace(broadcast=lambda value, src=0: value, barrier=lambda *a: None),
                              default_root_dir=args.run_dir)
    CheckData().setup(trainer, SimpleNamespace(detector=SimpleNamespace(num_queries=100)), "fit")
    return {"seconds": time.perf_counter() - built, "cpu_s": cpu_seconds() - cpu, "peak_rss_mib": peak_rss_mib()}


def phase_startup(args: argparse.Namespace) -> dict:
    import lightning as L
    import torch

    from detr.lightning.data_checks import CheckData

    class NoModel(L.LightningModule):
        """Stands in for DetrSystem: a detector with num_queries, a step that records the time and stops."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.detector = torch.nn.Module()
            self.detector.num_queries = 100
            self.first_step = None

        def training_step(self, batch, batch_idx):
            if self.first_step is None:
                self.first_step = time.perf_counter()
            self.trainer.should_stop = True
            return self.weight.sum() * 0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    torch.set_num_threads(1)
    system = NoModel()
    trainer = L.Trainer(default_root_dir=args.run_dir, max_steps=1, limit_val_batches=0, num_sanity_val_steps=0,
                        callbacks=[CheckData()], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(system, datamodule=_data_module(args))
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds_to_first_step": system.first_step - START, "main_cpu_s": own.ru_utime + own.ru_stime,
            "cpu_s": cpu_seconds(), "peak_rss_mib": peak_rss_mib()}


PHASES = {"build": phase_build, "workers": phase_workers, "checks": phase_checks, "startup": phase_startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="/tmp/coco-synthetic", help="COCO-layout folder (detr-make-synthetic-coco)")
    parser.add_argument("--images", type=int, default=0, help="samples of the worker epoch (0: the whole set)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="of the worker epoch")
    parser.add_argument("--run-dir", default="/tmp/coco-scale-run", help="the runs' default_root_dir")
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=list(PHASES))
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)  # one phase, in this process
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](args)))
        return
    from machine import describe_machine

    print(describe_machine())
    base = [sys.executable, __file__, "--root", args.root, "--images", str(args.images), "--workers",
            str(args.workers), "--batch-size", str(args.batch_size), "--run-dir", args.run_dir]
    for phase in args.phases:
        for run in (1, 2) if phase in ("checks", "startup") else (1,):
            if run == 1:  # a first run: no start-up cache yet (the checks' image reads, beside the jsons)
                for cache in Path(args.root, "annotations").glob("*.imagecache"):
                    cache.unlink()
            result = subprocess.run(base + ["--phase", phase], capture_output=True, text=True, check=False)
            if result.returncode:
                print(f"{phase}: failed\n{result.stderr[-3000:]}")
                continue
            row = json.loads(result.stdout.strip().splitlines()[-1])
            label = f"{phase} (run {run})" if phase in ("checks", "startup") else phase
            print(f"{label:16s} " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
