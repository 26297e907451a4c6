"""The drafter engine on CUDA drafts what it drafts on the CPU (synchronous and asynchronous drafting). Marked
``gpu`` and skipped without one; the engine's logic itself is checked on the CPU in ``test_drafter_engine``.

Needs only torch, numpy and msgpack (the GPU machine has no transformers or safetensors): the head is built from
a config dict with random weights, not from files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.heads import DraftHead
from actors.eagle.spec import head_spec_from_dict
from actors.messages import DraftStep, SeqSlice

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300,
            intermediate_size=96, num_hidden_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
CONFIGS = {
    "eagle": dict(TINY, architectures=["EagleLlama4ForCausalLM"], no_rope_layers=[1], use_qk_norm=True,
                  attention_chunk_size=8),
    "eagle3": dict(TINY, architectures=["Eagle3LlamaForCausalLM"], draft_vocab_size=128, target_hidden_size=64,
                   eagle_aux_hidden_state_layer_ids=[1, 2, 3]),
}


def random_head(method: str) -> DraftHead:
    torch.manual_seed(0)
    head = DraftHead(head_spec_from_dict(CONFIGS[method]))
    with torch.no_grad():
        for p in head.parameters():
            if p.ndim >= 2:
                torch.nn.init.normal_(p, std=0.2)
        if method == "eagle3":
            head.d2t.copy_(torch.randperm(300)[:128].sort().values - torch.arange(128))
    return head


def steps(width: int) -> list[tuple[DraftStep, torch.Tensor]]:
    """A prefill of three sequences (one crossing an attention chunk), then a decode step of two of them."""
    g = torch.Generator().manual_seed(0)
    out, seqs = [], [[("a", 0, 5), ("b", 0, 11), ("c", 0, 1)], [("b", 11, 2), ("a", 5, 3)]]
    for i, step_seqs in enumerate(seqs):
        slices, off = [], 0
        for rid, pos, n in step_seqs:
            slices.append(SeqSlice(rid, off, n, pos))
            off += n
        ids = torch.randint(0, 300, (off,), generator=g).numpy().astype(np.int32)
        out.append((DraftStep(i, 3, slices, ids), torch.randn(off, width, generator=g)))
    return out


def drafts_on(device: str, method: str, branches: BranchConfig | None) -> list[tuple[list, dict]]:
    """Per step: (drafts, the branch table's drafts by sequence) of an engine on ``device``."""
    engine = DrafterEngine(random_head(method), DrafterEngineConfig(max_model_len=64, branches=branches), device=device)
    assert engine.cache.k[0].device.type == engine.head.fc.weight.device.type == device
    out = []
    for step, hidden in steps(engine.spec.fused_hidden_size):
        drafts = engine.draft_tensors(step, hidden).drafts.tolist()
        table = engine.after_step() if branches is not None else {}
        out.append((drafts, {rid: entry.drafts for rid, entry in table.items()}))
    return out


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("branches", [None, BranchConfig(bonus_fanout=2, recovered_fanout=1)], ids=["sync", "async"])
def test_cuda_drafts_equal_cpu_drafts(method, branches):
    assert drafts_on("cuda", method, branches) == drafts_on("cpu", method, branches)
