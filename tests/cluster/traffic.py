"""Load against a served app, for the tests that serve it for real: greedy completions sent at a concurrency, and the
check that every output equals the target-only reference token for token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from cluster.harness import HTTP, MODEL


async def _one(client, prompt: str, max_tokens: int,
               spans: list[tuple[float, float]] | None = None) -> tuple[str, list[int] | str]:
    start = time.time()
    try:
        out = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return prompt, list(out.choices[0].token_ids)
    except Exception as e:
        return prompt, f"{type(e).__name__}: {e}"
    finally:
        if spans is not None:
            spans.append((start, time.time()))


async def send(prompts: list[str], concurrency: int, max_tokens: int, during=None,
               spans: list[tuple[float, float]] | None = None,
               until: Callable[[], bool] | None = None) -> list[tuple[str, list[int] | str]]:
    """Send ``prompts`` at ``concurrency`` (greedy, ``max_tokens`` each): (prompt, token ids or the error) each;
    ``during(elapsed_s)`` is polled every 0.2 s meanwhile. ``spans`` gets each request's (start, end) wall times.
    ``until``: the prompts are sent over and over, ``concurrency`` always in flight, until it returns True (asked
    before each request, once every prompt was sent at least once), so the load has no gap."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=HTTP + "/v1", api_key="unused", max_retries=0, timeout=300)
    sem = asyncio.Semaphore(concurrency)

    async def guarded(p):
        try:
            return await _one(client, p, max_tokens, spans)
        finally:
            sem.release()

    tasks: list[asyncio.Task] = []

    async def feed() -> None:
        i = 0
        while i < len(prompts) or (until is not None and not until()):
            await sem.acquire()
            tasks.append(asyncio.create_task(guarded(prompts[i % len(prompts)])))
            i += 1

    start = time.time()
    feeder = asyncio.create_task(feed())
    while during is not None and (not feeder.done() or not all(t.done() for t in tasks)):
        await asyncio.to_thread(during, time.time() - start)
        await asyncio.sleep(0.2)
    await feeder
    results = await asyncio.gather(*tasks)
    await client.close()
    return results


def spanning(spans: list[tuple[float, float]], first: float, last: float) -> int:
    """How many requests of ``spans`` started before ``first`` and finished after ``last`` (in flight throughout)."""
    return sum(1 for start, end in spans if start < first and end > last)


def check_exact(results, reference: dict[str, list[int]]) -> None:
    """Every request answered, each with the reference's token ids (``vllm_helpers.reference``)."""
    failed = [r for _, r in results if isinstance(r, str)]
    assert not failed, failed[:3]
    wrong = [p for p, ids in results if ids != reference[p]]
    assert not wrong, f"{len(wrong)} outputs differ from target-only"
