"""Why detr-serve batches on its own instead of through LitServe: one bad request in a LitServe batch fails
every request batched with it.

    pip install litserve   # not a dependency of this project
    .venv/bin/python benchmarks/litserve_batch_errors.py [--trials 3]

Serves a trivial LitAPI (max_batch_size 8, batch_timeout 0.2 s; decode_request raises HTTPException(400) for
a negative input, predict doubles) with LitServe on a free port of 127.0.0.1, sends 7 good requests and 1
bad one concurrently, and prints the status of each: 200 × 7 and one 400 would mean the bad request cost
only itself. LitServe's batched loop (loops/simple_loops.py, run_batched_loop) decodes the whole batch in
one try block, so with 0.2.19 it prints 400 eight times. detr-serve's batcher
(detr.serving.batching.DynamicBatcher) fails only the bad one (tests/serving/test_server.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import litserve as ls
from fastapi import HTTPException


class Doubler(ls.LitAPI):
    """Doubles ``x``; a negative ``x`` is a bad request (400 from decode_request)."""

    def setup(self, device):
        pass

    def decode_request(self, request):
        if request["x"] < 0:
            raise HTTPException(400, "bad input")
        return request["x"]

    def predict(self, xs):
        time.sleep(0.05)
        return [2 * x for x in xs]

    def encode_response(self, y):
        return {"y": y}


def serve(port: int) -> None:
    ls.LitServer(Doubler(max_batch_size=8, batch_timeout=0.2), accelerator="cpu").run(
        port=port, generate_client_file=False)


def post(port: int, x: int) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=json.dumps({"x": x}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # a session of its own: LitServe's API server and inference worker are child processes, stopped with it
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("LitServe did not start in 60 s") from None
                time.sleep(0.3)
        print(f"litserve {ls.__version__}: 8 concurrent requests, the 4th one bad")
        inputs = [1, 2, 3, -1, 4, 5, 6, 7]
        for trial in range(args.trials):
            with concurrent.futures.ThreadPoolExecutor(len(inputs)) as pool:
                statuses = list(pool.map(lambda x: post(port, x), inputs))
            good_failed = sum(status != 200 for x, status in zip(inputs, statuses) if x >= 0)
            print(f"trial {trial}: statuses {statuses}; good requests failed: {good_failed} of 7")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
