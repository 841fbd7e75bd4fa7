"""Dynamic batching: requests that arrive together run through the model together.

:class:`DynamicBatcher` holds a queue of jobs. One asyncio task takes the first job, waits at most
``batch_timeout`` seconds for more (up to ``max_batch_size``), and hands the batch to ``run_batch`` on one
worker thread, so the model never runs twice at once and the event loop keeps accepting requests meanwhile.
Jobs that arrive while a batch runs form the next batch: under load, batches fill up without any wait.

``run_batch`` returns one result per job, in order; a result that is an exception fails that job alone,
so one bad request never costs the requests batched with it (unlike LitServe 0.2.19's batched loop, where
an exception in one request's decode or encode fails the whole batch: docs/guides/serve.md).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

class QueueFull(RuntimeError):
    """More jobs wait than the batcher's ``max_queue``: the caller should refuse the job (HTTP 503)."""


#: A batch function: jobs in, one result (or the exception that failed it) per job out, in order.
BatchFunction = Callable[[Sequence[Any]], Sequence[Any]]


class DynamicBatcher:
    """Collect jobs into batches of at most ``max_batch_size`` within ``batch_timeout`` seconds.

    Args:
        run_batch: called on the worker thread with a list of jobs; returns one result or exception per job.
        max_batch_size: the most jobs per call of ``run_batch`` (1: no batching).
        batch_timeout: how long (seconds) the first job of a batch waits for others; 0 takes what is queued.
        max_queue: the most jobs that may wait (the batch running not counted); :meth:`submit` raises
            :class:`QueueFull` beyond it, so an overloaded server refuses at once instead of answering minutes
            late. None: no limit.

    Use :meth:`start` and :meth:`stop` inside the event loop (the server's lifespan), :meth:`submit` per request
    and :meth:`run_exclusive` for work that must not overlap a batch (e.g. an attention page on the same model).
    """

    def __init__(self, run_batch: BatchFunction, *, max_batch_size: int = 8, batch_timeout: float = 0.01,
                 max_queue: int | None = None) -> None:
        if max_queue is not None and max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (or None: no limit), got {max_queue}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not batch_timeout >= 0:  # NaN fails this too
            raise ValueError(f"batch_timeout is in seconds and must be >= 0, got {batch_timeout}")
        self.run_batch = run_batch
        self.max_batch_size = int(max_batch_size)
        self.batch_timeout = float(batch_timeout)
        self.max_queue = max_queue
        #: batch size → how many batches of that size ran
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future]] | None = None
        self._task: asyncio.Task | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Start the batching task and the model thread (in the running event loop)."""
        self._queue = asyncio.Queue()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="detr-model")
        self._task = asyncio.create_task(self._loop(), name="detr-batcher")

    async def stop(self) -> None:
        """Let the running batch finish, fail the queued jobs with ``RuntimeError`` and stop the thread."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._queue is not None:
            while not self._queue.empty():
                _, future = self._queue.get_nowait()
                if not future.done():
                    future.set_exception(RuntimeError("the server is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def submit(self, job: Any) -> Any:
        """Queue ``job``; return its result, or raise the exception ``run_batch`` gave for it.

        Raises:
            QueueFull: ``max_queue`` jobs are waiting already.
        """
        if self._queue is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        if self.max_queue is not None and self._queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self._queue.qsize()} requests are waiting for the model already (--max-queue "
                            f"{self.max_queue}); retry later")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((job, future))
        return await future

    async def run_exclusive(self, function: Callable[[], Any]) -> Any:
        """Run ``function()`` on the model thread, between batches; return its result."""
        if self._executor is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    async def _collect(self) -> list[tuple[Any, asyncio.Future]]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.batch_timeout
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            batch = [(job, future) for job, future in batch if not future.cancelled()]  # clients that left
            if not batch:
                continue
            self.batch_sizes[len(batch)] += 1
            jobs = [job for job, _ in batch]
            try:
                results = await loop.run_in_executor(self._executor, self.run_batch, jobs)
                if len(results) != len(jobs):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(jobs)} jobs")
            except Exception as error:  # a bug in run_batch: every job of the batch gets it, the loop goes on
                logger.exception("a batch of %d failed", len(jobs))
                results = [error] * len(jobs)
            for (_, future), result in zip(batch, results):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
