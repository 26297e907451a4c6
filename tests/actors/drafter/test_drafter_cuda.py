"""The drafter engine on CUDA drafts what it drafts on the CPU. Marked ``gpu`` and skipped without one; the same
logic runs on the CPU in ``test_decode_step`` (fixed-shape steps, either attention backend) and
``test_slot_attention`` (the Triton kernel through Triton's interpreter).

On CUDA the engine's defaults are the fast path: decode steps on fixed-shape buffers replayed from CUDA graphs, the
Triton kernel over the cache in place. Each case of ``scenarios.STEPS`` (shuffled batches, a chunk crossed, a prefix
hit, a gap, a re-homed sequence, a restart, rows past ``max_model_len``) drafts the same, synchronous and pipelined.
Needs only torch, triton, numpy and msgpack (the GPU machine has no Ray, vLLM or transformers)."""

from __future__ import annotations

import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.slot_attention import SlotRows, slot_attention
from tests.actors.drafter import scenarios

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

METHODS = ["eagle", "eagle3"]


@pytest.mark.parametrize("method", METHODS)
def test_cuda_graph_steps_draft_what_the_cpu_drafts(method):
    got, engine = scenarios.run("cuda", method)
    want, _ = scenarios.run("cpu", method)
    assert got == want
    assert engine.attention_backend == "triton"
    assert engine.decode.graphs.replays == len(scenarios.STEPS) - 1 and engine.decode.graphs.captures >= 1


@pytest.mark.parametrize("method", METHODS)
def test_pipelined_drafting_on_cuda_drafts_what_the_cpu_drafts(method):
    """Drafts and branch tables; the branch passes replayed from CUDA graphs."""
    branches = BranchConfig(bonus_fanout=2, recovered_fanout=1)
    got, engine = scenarios.run("cuda", method, branches)
    assert got == scenarios.run("cpu", method, branches)[0]
    assert engine.branch_passes.graphs.replays == len(scenarios.STEPS)
    eager, _ = scenarios.run("cuda", method, branches, enforce_eager=True)
    assert eager == got


@pytest.mark.parametrize("method", METHODS)
def test_graph_replay_equals_eager_on_the_same_backend(method):
    replayed, engine = scenarios.run("cuda", method)
    eager, eager_engine = scenarios.run("cuda", method, enforce_eager=True)
    assert replayed == eager
    assert engine.decode.graphs.replays > 0 and eager_engine.decode.graphs is None and eager_engine.decode.steps > 0


@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_graph_replay_equals_eager(method):
    """In the published heads' dtype: replay and eager run the same kernels on the same inputs."""
    def run(**config):
        engine = scenarios.make_engine("cuda", method, **config)
        engine = type(engine)(scenarios.random_head(method), engine.config, device="cuda", dtype=torch.bfloat16)
        return [engine.draft_tensors(step, hidden).drafts.tolist()
                for step, hidden in scenarios.steps(engine.spec.fused_hidden_size)]

    assert run() == run(enforce_eager=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 64])
def test_triton_kernel_equals_torch_backend_on_cuda(dtype, chunk):
    """Scout's head shape (40 query heads over 8 KV heads, dim 128), 3 sequences of 4 rows past a chunk boundary."""
    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(4, 300, 8, 128, generator=g, device="cuda", dtype=dtype) for _ in range(2))
    q = torch.randn(3, 4, 40, 128, generator=g, device="cuda", dtype=dtype)
    q_pos = torch.tensor([[60, 61, 62, 63], [250, 251, -1, -1], [5, 6, 7, 8]], device="cuda")
    rows = SlotRows(torch.tensor([2, 0, 3], device="cuda"), q_pos, torch.tensor([0, 100, 0], device="cuda"),
                    torch.tensor([10, 0, 0], device="cuda"), torch.tensor([30, 0, 0], device="cuda"))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(slot_attention(q, k, v, rows, chunk, "triton"),
                               slot_attention(q, k, v, rows, chunk, "torch"), atol=tol, rtol=tol)
