"""Image prompts on the disaggregated path (vLLM verifier + drafter Ray actor) with the multimodal checkpoint:
greedy outputs identical to vLLM target-only, EAGLE-1 and EAGLE-3; the image rows travel once (only prefill steps
are handed image embeddings), and text-only requests ship none.

Acceptance against vLLM's own colocated EAGLE on the same head: vLLM 0.32's EAGLE-1 Llama 4 head merges the
target's image embeddings (``SupportsMultiModalEmbeddings``): the cluster's counters are within 1%, and the prompts
are short enough (text cut, 32 tokens) that drafting sees the images through the head's chunked attention, so
drafting from the placeholder ids gives other counters. vLLM's ``Eagle3LlamaForCausalLM`` does not merge (it drafts
from the placeholder ids): the cluster with ``mm_embeds: false`` matches it within 1%, the cluster as shipped
(merging, as the EAGLE-1 head does) is within 2% in accepted tokens."""

from __future__ import annotations

import pytest

from cluster import image_runs as mm
from tests.actors import vllm_helpers as vh

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-remote-multimodal"
K = 3
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def prompts():
    return mm.image_prompts(12, max_text_chars=24)


@pytest.fixture(scope="module")
def reference(prompts):
    tokens, _ = mm.target_only(prompts, MAX_TOKENS)
    return tokens


def _same_counters(a, b) -> bool:
    return all(vh.within(x, y) for x, y in [
        (a.num_drafts, b.num_drafts), (a.num_draft_tokens, b.num_draft_tokens),
        (a.num_accepted_tokens, b.num_accepted_tokens), *zip(a.accepted_per_pos, b.accepted_per_pos, strict=True)])


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_image_prompts_exact_and_counters_match_colocated(ray_cluster, method, prompts, reference):
    tokens, stats, rpc = mm.cluster(method, prompts, K, MAX_TOKENS, NS, wait_for_prompt_drafts=True)  # as vLLM
    assert tokens == reference  # every prompt, token for token
    old_tokens, old, _ = mm.cluster(method, prompts, K, MAX_TOKENS, NS, mm_embeds=False, wait_for_prompt_drafts=True)
    assert old_tokens == reference
    colo_tokens, colo = mm.colocated(method, prompts, K, MAX_TOKENS)
    assert colo_tokens == reference
    assert rpc["failures"] == 0
    assert stats.mean_acceptance_length > 1.3, stats.table()
    if method == "eagle":  # vLLM merges: so does the cluster, and the images matter to the drafts here
        assert _same_counters(stats, colo), (stats, colo)
        assert (old.num_accepted_tokens, old.accepted_per_pos) != (colo.num_accepted_tokens, colo.accepted_per_pos)
    else:  # vLLM drafts from the placeholder ids
        assert _same_counters(old, colo), (old, colo)
        assert vh.within(stats.num_accepted_tokens, colo.num_accepted_tokens, 0.02), (stats, colo)
    # image rows shipped: every image's <|patch|> rows, once; image embeddings only in the prompt steps
    assert rpc["mm_rows_shipped"] > 0
    assert 0 < rpc["mm_steps"] < rpc["steps"] / 4, rpc


def test_text_only_requests_ship_no_image_rows(ray_cluster):
    text = [{"prompt": p} for p in vh.prompts(4)]
    tokens, stats, rpc = mm.cluster("eagle3", text, K, 16, NS)
    assert len(tokens) == 4 and rpc["mm_rows_shipped"] == 0 and rpc["mm_steps"] == 0
