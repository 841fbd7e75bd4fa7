"""DynamicBatcher: jobs that arrive together form one batch (at most max_batch_size), a job's exception fails
that job alone, a job waits no longer than batch_timeout for company, and exclusive work never overlaps a batch."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from detr.serving.batching import DynamicBatcher, QueueFull


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_jobs_form_batches_of_at_most_max_batch_size() -> None:
    seen: list[list[int]] = []

    def double(jobs):
        seen.append(list(jobs))
        return [2 * job for job in jobs]

    async def main():
        batcher = DynamicBatcher(double, max_batch_size=4, batch_timeout=0.2)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
        await batcher.stop()
        return results, batcher.batch_sizes

    results, sizes = run(main())
    assert results == [2 * i for i in range(10)]
    assert [len(batch) for batch in seen] == [4, 4, 2] and dict(sizes) == {4: 2, 2: 1}
    assert sorted(job for batch in seen for job in batch) == list(range(10))


def test_an_exception_fails_its_job_only() -> None:
    def check(jobs):
        return [ValueError(f"bad {job}") if job < 0 else job for job in jobs]

    async def main():
        batcher = DynamicBatcher(check, max_batch_size=8, batch_timeout=0.1)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(job) for job in (1, -1, 2, 3)), return_exceptions=True)
        await batcher.stop()
        return results, batcher.batch_sizes

    results, sizes = run(main())
    assert results[0] == 1 and results[2:] == [2, 3] and dict(sizes) == {4: 1}
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad -1"


def test_a_failing_batch_function_fails_its_batch_and_the_batcher_goes_on() -> None:
    def flaky(jobs):
        if "boom" in jobs:
            raise RuntimeError("the model crashed")
        return jobs

    async def main():
        batcher = DynamicBatcher(flaky, max_batch_size=2, batch_timeout=0.0)
        await batcher.start()
        with pytest.raises(RuntimeError, match="crashed"):
            await batcher.submit("boom")
        result = await batcher.submit("fine")
        await batcher.stop()
        return result

    assert run(main()) == "fine"


def test_a_lone_job_waits_at_most_the_batch_timeout() -> None:
    async def main():
        batcher = DynamicBatcher(lambda jobs: jobs, max_batch_size=8, batch_timeout=0.05)
        await batcher.start()
        start = time.perf_counter()
        await batcher.submit("alone")
        elapsed = time.perf_counter() - start
        await batcher.stop()
        return elapsed

    assert 0.04 < run(main()) < 1.0


def test_exclusive_work_runs_on_the_model_thread_between_batches() -> None:
    threads, busy, overlaps = set(), threading.Lock(), []

    def work(jobs):
        threads.add(threading.get_ident())
        if not busy.acquire(blocking=False):
            overlaps.append(jobs)
            return jobs
        time.sleep(0.01)
        busy.release()
        return jobs

    async def main():
        batcher = DynamicBatcher(work, max_batch_size=2, batch_timeout=0.0)
        await batcher.start()
        await asyncio.gather(*(batcher.submit(i) for i in range(6)),
                             *(batcher.run_exclusive(lambda: work(["page"])) for _ in range(3)))
        await batcher.stop()

    run(main())
    assert not overlaps and len(threads) == 1


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(lambda jobs: jobs, max_batch_size=0)
    with pytest.raises(ValueError, match="batch_timeout"):
        DynamicBatcher(lambda jobs: jobs, batch_timeout=-1)
    with pytest.raises(ValueError, match="batch_timeout"):
        DynamicBatcher(lambda jobs: jobs, batch_timeout=float("nan"))


def test_jobs_beyond_max_queue_are_refused_at_once() -> None:
    release = threading.Event()

    def slow(jobs):
        release.wait(10)
        return jobs

    async def main():
        batcher = DynamicBatcher(slow, max_batch_size=1, batch_timeout=0.0, max_queue=2)
        await batcher.start()
        running = asyncio.ensure_future(batcher.submit("running"))
        await asyncio.sleep(0.05)  # taken by the batch loop: it no longer counts as waiting
        waiting = [asyncio.ensure_future(batcher.submit(name)) for name in ("first", "second")]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull, match="2 requests are waiting"):
            await batcher.submit("third")
        release.set()
        results = [await running, *[await job for job in waiting]]
        await batcher.stop()
        return results

    assert run(main()) == ["running", "first", "second"]
