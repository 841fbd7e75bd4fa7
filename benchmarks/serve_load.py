"""detr-serve under load: requests/s, latency percentiles and the batches the server formed, at several
concurrencies, against the Predictor called in a loop in one process.

    .venv/bin/python benchmarks/serve_load.py --checkpoint CKPT --image IMAGE
        [--requests 64] [--concurrency 1 4 16] [--max-batch-size 8] [--batch-timeout 0.01] [--time-limit 120]
        [--baseline-requests 16] [--random-r50 PATH] [--threshold 0.7] [--threads 1]

Starts ``python -m detr.commands.serve`` on a free port of 127.0.0.1 (one server for every concurrency;
its /stats before and after each level give the batch sizes it formed), then per concurrency C sends
``--requests`` POST /predict requests of the same image from C client threads (one keep-alive connection
each), stopping early at ``--time-limit`` seconds. Latency is from sending a request to reading its whole
response. The baseline runs ``Predictor.predict(image)`` ``--baseline-requests`` times in this process
(the same checkpoint, file decoding included, as the server decodes every request) before the server starts.
It runs again after the server has stopped, so that both rows bracket the server's in time: on a machine
shared with other jobs the speed drifts. ``--threads`` torch threads in the server and the baseline alike
(default 1: on 2 cores shared with other jobs, two OpenMP threads wait on each other whenever one is
descheduled, which made single-image latencies vary tenfold). ``--random-r50 PATH`` writes a randomly initialised R50 DETR (COCO's 91 labels) to PATH first and serves
that: speed does not depend on the weights. Prints the machine, then a markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Server:
    """A ``detr-serve`` process: its URL, the process and the file its log goes to."""

    url: str
    process: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait: the exit status (the server shuts down cleanly on SIGTERM)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


@contextlib.contextmanager
def running_server(checkpoint: str | Path, log: Path, *options: str, startup_timeout: float = 120.0,
                   threads: int | None = None) -> Iterator[Server]:
    """Start ``python -m detr.commands.serve --checkpoint CKPT --port P OPTIONS`` from this repository, wait
    until /health answers, yield it, stop it (SIGTERM) on exit. ``threads`` sets OMP_NUM_THREADS."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, "-m", "detr.commands.serve", "--checkpoint", str(checkpoint), "--port", str(port),
               *options]
    with open(log, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"detr-serve exited with status {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                get_json(server.url + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"detr-serve did not answer in {startup_timeout} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        yield server
    finally:
        server.stop()


@dataclass
class LoadResult:
    """What one load level measured: per-request latencies (seconds), status codes, the wall time."""

    concurrency: int
    latencies: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    batch_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile latency in milliseconds (nearest rank)."""
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run_load(url: str, body: bytes, *, requests: int, concurrency: int, time_limit: float = 120.0,
             path: str = "/predict", content_type: str = "application/octet-stream") -> LoadResult:
    """Send ``requests`` POSTs of ``body`` to ``url + path`` from ``concurrency`` threads (each one keep-alive
    connection), stopping early after ``time_limit`` seconds; the batch sizes come from /stats."""
    host, port = url.removeprefix("http://").split(":")
    result = LoadResult(concurrency)
    before = get_json(url + "/stats")["batch_sizes"]
    lock = threading.Lock()
    remaining = [requests]
    deadline = time.monotonic() + time_limit

    def client() -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=max(time_limit, 60))
        try:
            while time.monotonic() < deadline:
                with lock:
                    if remaining[0] == 0:
                        return
                    remaining[0] -= 1
                start = time.perf_counter()
                try:
                    connection.request("POST", path, body=body, headers={"Content-Type": content_type})
                    response = connection.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException):
                    status = 0  # connection refused or dropped
                    connection.close()
                    connection = http.client.HTTPConnection(host, int(port), timeout=max(time_limit, 60))
                elapsed = time.perf_counter() - start
                with lock:
                    result.latencies.append(elapsed)
                    result.statuses[status] += 1
        finally:
            connection.close()

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(client) for _ in range(concurrency)]:
            future.result()
    result.seconds = time.perf_counter() - start
    after = get_json(url + "/stats")["batch_sizes"]
    result.batch_sizes = {int(size): n - before.get(size, 0) for size, n in after.items() if n - before.get(size, 0)}
    return result


def baseline(checkpoint: str | Path, image: Path, *, requests: int, threshold: float) -> LoadResult:
    """``Predictor.predict(image)`` ``requests`` times in this process, after one warm-up call."""
    from detr.inference.predictor import Predictor

    predictor = Predictor.from_checkpoint(checkpoint, threshold=threshold)
    predictor.predict(image)
    result = LoadResult(concurrency=1)
    start = time.perf_counter()
    for _ in range(requests):
        begin = time.perf_counter()
        predictor.predict(image)
        result.latencies.append(time.perf_counter() - begin)
        result.statuses[200] += 1
    result.seconds = time.perf_counter() - start
    return result


def table(rows: Sequence[tuple[str, LoadResult]]) -> str:
    lines = ["| run | C | requests | requests/s | p50 ms | p95 ms | p99 ms | batch sizes formed (size×count) | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        batches = ", ".join(f"{size}×{n}" for size, n in sorted(r.batch_sizes.items())) or "-"
        lines.append(f"| {name} | {r.concurrency} | {len(r.latencies)} | {r.requests_per_second:.2f} | "
                     f"{r.percentile(50):.0f} | {r.percentile(95):.0f} | {r.percentile(99):.0f} | {batches} | "
                     f"{r.errors} |")
    return "\n".join(lines)


def write_random_r50(path: Path) -> Path:
    """A randomly initialised R50 DETR (build_detr's defaults: COCO's 91 labels, 100 queries), seed 0."""
    import torch

    from detr import build_detr
    from detr.categories import CategoryMap
    from detr.checkpoints import save_checkpoint
    from detr.models.config import ModelMeta

    torch.manual_seed(0)
    model = build_detr()
    model.meta = ModelMeta(category_map=CategoryMap.coco())
    return save_checkpoint(model, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="what to serve (any detr-serve checkpoint)")
    parser.add_argument("--random-r50", type=Path, default=None, help="write a random R50 DETR here and serve it")
    parser.add_argument("--image", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout", type=float, default=0.01)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per level at most")
    parser.add_argument("--baseline-requests", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server and the baseline")
    parser.add_argument("--log", type=Path, default=Path("outputs/serve_load.log"), help="the server's log")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe_machine

    checkpoint = write_random_r50(args.random_r50) if args.random_r50 is not None else args.checkpoint
    if checkpoint is None:
        parser.error("give --checkpoint or --random-r50")
    import torch

    torch.set_num_threads(args.threads)
    print(describe_machine(), flush=True)
    rows = [("Predictor in a loop (before)", baseline(checkpoint, args.image, requests=args.baseline_requests,
                                                      threshold=args.threshold))]
    print(table(rows), flush=True)
    body = args.image.read_bytes()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with running_server(checkpoint, args.log, "--max-batch-size", str(args.max_batch_size), "--batch-timeout",
                        str(args.batch_timeout), "--threshold", str(args.threshold), threads=args.threads) as server:
        run_load(server.url, body, requests=2, concurrency=1)  # warm-up
        for concurrency in args.concurrency:
            result = run_load(server.url, body, requests=args.requests, concurrency=concurrency,
                              time_limit=args.time_limit)
            rows.append((f"detr-serve (batch ≤ {args.max_batch_size}, {args.batch_timeout * 1000:g} ms)", result))
            print(f"C={concurrency}: {len(result.latencies)} requests, {result.requests_per_second:.2f}/s, "
                  f"errors {result.errors}", flush=True)
    rows.append(("Predictor in a loop (after)", baseline(checkpoint, args.image, requests=args.baseline_requests,
                                                         threshold=args.threshold)))
    print(f"\nserved {checkpoint}, image {args.image} ({len(body)} bytes), {args.threads} torch thread(s)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
