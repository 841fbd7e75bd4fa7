"""The decoded-bytes budget: requests whose images do not fit wait for others to be answered, an image larger
than the whole budget runs alone, and too many waiting requests are refused."""

from __future__ import annotations

import asyncio

import pytest

from detr.serving.budget import BudgetFull, DecodedBytesBudget


async def _settle() -> None:
    for _ in range(5):  # let every ready task run up to its next wait
        await asyncio.sleep(0)


def test_a_request_that_does_not_fit_waits_until_others_are_answered() -> None:
    async def scenario() -> list[str]:
        budget, events, release = DecodedBytesBudget(100), [], asyncio.Event()

        async def request(name: str, nbytes: int, hold: asyncio.Event | None = None) -> None:
            async with budget.hold(nbytes):
                events.append(f"{name} decodes ({budget.in_flight} in flight)")
                if hold is not None:
                    await hold.wait()
            events.append(f"{name} answered")

        first = asyncio.create_task(request("first", 60, release))
        await _settle()
        second = asyncio.create_task(request("second", 60))
        await _settle()
        assert events == ["first decodes (60 in flight)"]  # 120 > 100: the second waits
        release.set()
        await asyncio.gather(first, second)
        assert (budget.in_flight, budget.peak) == (0, 60)
        return events

    assert asyncio.run(scenario()) == ["first decodes (60 in flight)", "first answered",
                                       "second decodes (60 in flight)", "second answered"]


def test_an_image_larger_than_the_budget_runs_alone() -> None:
    async def scenario() -> None:
        budget = DecodedBytesBudget(100)
        async with budget.hold(10_000):
            assert budget.in_flight == 100
        async with budget.hold(30), budget.hold(70):
            assert budget.in_flight == 100

    asyncio.run(scenario())


def test_waiting_requests_beyond_the_limit_are_refused() -> None:
    async def scenario() -> None:
        budget, release = DecodedBytesBudget(100, max_waiting=1), asyncio.Event()

        async def request(nbytes: int) -> None:
            async with budget.hold(nbytes):
                await release.wait()

        tasks = [asyncio.create_task(request(100)), asyncio.create_task(request(50))]  # one held, one waiting
        await _settle()
        with pytest.raises(BudgetFull, match="retry later"):
            async with budget.hold(50):
                pass
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
