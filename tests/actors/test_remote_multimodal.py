"""Image prompts on the disaggregated path (vLLM verifier + drafter Ray actor) with the multimodal checkpoint:
greedy outputs identical to vLLM target-only, EAGLE-1 and EAGLE-3; acceptance counters within 1% of vLLM's own
colocated EAGLE on the same head (which merges the target's image embeddings at image positions); the image rows
travel once (only prefill steps are handed image embeddings), and text-only requests ship none."""

from __future__ import annotations

import pytest
import ray

from benchmarks import multimodal_acceptance as mm
from tests.actors import vllm_helpers as vh

pytestmark = pytest.mark.slow
NS = "test-remote-multimodal"
K = 3
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(namespace=NS, num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def prompts():
    return mm.image_prompts(10)


@pytest.fixture(scope="module")
def reference(prompts):
    tokens, _ = mm.target_only(prompts, MAX_TOKENS)
    return tokens


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_image_prompts_exact_and_counters_match_colocated(ray_cluster, method, prompts, reference):
    tokens, stats, rpc = mm.cluster(method, prompts, K, MAX_TOKENS, NS)
    assert tokens == reference  # every prompt, token for token
    colo_tokens, colo = mm.colocated(method, prompts, K, MAX_TOKENS)
    assert colo_tokens == reference
    assert rpc["failures"] == 0
    assert stats.mean_acceptance_length > 1.3, stats.table()
    for a, b in [(stats.num_drafts, colo.num_drafts), (stats.num_draft_tokens, colo.num_draft_tokens),
                 (stats.num_accepted_tokens, colo.num_accepted_tokens),
                 *zip(stats.accepted_per_pos, colo.accepted_per_pos, strict=True)]:
        assert vh.within(a, b), (stats, colo)
    # image rows shipped: every image's <|patch|> rows, once; image embeddings only in the prompt steps
    assert rpc["mm_rows_shipped"] > 0
    assert 0 < rpc["mm_steps"] < rpc["steps"] / 4, rpc


def test_text_only_requests_ship_no_image_rows(ray_cluster):
    text = [{"prompt": p} for p in vh.prompts(4)]
    tokens, stats, rpc = mm.cluster("eagle3", text, K, 16, NS)
    assert len(tokens) == 4 and rpc["mm_rows_shipped"] == 0 and rpc["mm_steps"] == 0
