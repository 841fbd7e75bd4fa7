"""The decoded-image memory a server holds at once: :class:`DecodedBytesBudget`.

A request's body is small, its decoded image can be large: a 38 kB PNG of 39.6 MP decodes to 119 MB of RGB,
so sixteen such requests at once took a server from 1.3 to 3.8 GB although each passed every check on its
own. The batcher bounds how many requests wait, not how large their images are; so every request takes its
image's decoded size (:func:`detr.serving.inputs.decoded_bytes`, read from the header) from this budget
before it decodes and gives it back once answered. A request that does not fit waits for others to finish;
one larger than the whole budget runs alone; past ``max_waiting`` waiting requests the server is overloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class BudgetFull(RuntimeError):
    """``max_waiting`` requests already wait for decoded-image memory: refuse this one (HTTP 503)."""


class DecodedBytesBudget:
    """At most ``limit`` bytes of decoded images in flight; :meth:`hold` takes a request's share.

    Args:
        limit: the bytes of decoded images the server may hold at once (>= 1).
        max_waiting: the most requests that may wait for their share; more raise :class:`BudgetFull`
            (None: no limit).

    Attributes:
        in_flight: bytes held now; peak: the most held at once since the start.
    """

    def __init__(self, limit: int, *, max_waiting: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the decoded-bytes limit must be >= 1 byte, got {limit}")
        self.limit = int(limit)
        self.max_waiting = max_waiting
        self.in_flight = 0
        self.peak = 0
        self._waiting = 0
        self._condition = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` of the budget for the block, waiting until they fit (an image larger than the whole
        budget waits until nothing else is held).

        Raises:
            BudgetFull: ``max_waiting`` requests wait already and this one does not fit now.
        """
        share = min(int(nbytes), self.limit)
        async with self._condition:
            if self.in_flight + share > self.limit:
                if self.max_waiting is not None and self._waiting >= self.max_waiting:
                    raise BudgetFull(f"{self._waiting} requests wait for memory to decode their images already "
                                     f"(--max-decoded-mb {self.limit / 2**20:g} in flight); retry later")
                self._waiting += 1
                try:
                    await self._condition.wait_for(lambda: self.in_flight + share <= self.limit)
                finally:
                    self._waiting -= 1
            self.in_flight += share
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            async with self._condition:
                self.in_flight -= share
                self._condition.notify_all()

    def stats(self) -> dict[str, int]:
        """``{"limit", "in_flight", "peak"}`` in bytes (the server's ``/stats``)."""
        return {"limit": self.limit, "in_flight": self.in_flight, "peak": self.peak}
