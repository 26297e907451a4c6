"""Random tiny heads and one run of draft steps that visits every case a drafter's decode step meets, shared by the
CPU tests of the fixed-shape step (``test_decode_step``) and the CUDA ones (``test_drafter_cuda``).

Needs only torch, numpy and msgpack (the GPU machine has no transformers or safetensors): heads are built from a
config dict with random weights, not from files."""

from __future__ import annotations

import numpy as np
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.heads import DraftHead
from actors.eagle.spec import head_spec_from_dict
from actors.messages import DraftStep, SeqSlice

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300,
            intermediate_size=96, num_hidden_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
CONFIGS = {
    "eagle": dict(TINY, architectures=["EagleLlama4ForCausalLM"], no_rope_layers=[1], use_qk_norm=True,
                  attention_chunk_size=8),
    "eagle3": dict(TINY, architectures=["Eagle3LlamaForCausalLM"], draft_vocab_size=128, target_hidden_size=64,
                   eagle_aux_hidden_state_layer_ids=[1, 2, 3]),
}
MAX_MODEL_LEN = 64
BLOCK = 4  # the prefix cache's block size
PROMPT_P = list(range(10, 22))  # "p"'s prompt; "q" shares its first 8 tokens (two blocks)
PROMPT_Q = PROMPT_P[:8] + [7, 8]

# Per step: k, then (req_id, first position, rows). Each case it visits:
STEPS: list[tuple[int, list[tuple[str, int, int]]]] = [
    (3, [("a", 0, 5), ("b", 0, 11), ("c", 0, 1), ("p", 0, 12)]),  # prefill ("b" crosses a chunk of 8; "p" hashed)
    (3, [("b", 11, 2), ("a", 5, 3), ("c", 1, 4), ("p", 12, 1)]),  # decode, sequences in another order than slots
    (3, [("c", 5, 1), ("b", 13, 4), ("a", 8, 2), ("q", 8, 2)]),  # "q" starts at 8: its prefix comes from "p"'s blocks
    (3, [("a", 14, 1), ("c", 6, 3), ("q", 10, 1)]),  # "a" skips 10-13 (k = 0 steps shipped nothing): a gap
    (2, [("d", 20, 2), ("c", 9, 2), ("b", 17, 1)]),  # "d" arrives mid-stream (re-homed); k = 2
    (3, [("b", 0, 3), ("a", 15, 4), ("q", 11, 4)]),  # "b" restarts at 0 (preempted)
    (3, [("e", 62, 2), ("d", 22, 3), ("c", 11, 1)]),  # "e" would draft past max_model_len: no room, no drafts
]


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
    """``STEPS`` as draft steps with random ids and hidden rows [N, width] (seeded: the same every call)."""
    g = torch.Generator().manual_seed(0)
    out, seen = [], set()
    for i, (k, seqs) in enumerate(STEPS):
        slices, ids, off, prompts = [], [], 0, {}
        for rid, pos, n in seqs:
            slices.append(SeqSlice(rid, off, n, pos))
            off += n
            first, seen = rid not in seen, seen | {rid}
            if rid in ("p", "q") and first:  # a sequence's first step carries its prompt
                prompt = PROMPT_P if rid == "p" else PROMPT_Q
                prompts[rid] = np.array(prompt, dtype=np.int32)
                ids += prompt[pos + 1 : pos + n + 1] if pos + n < len(prompt) else prompt[pos + 1 :] + [5]
            else:
                ids += torch.randint(0, 300, (n,), generator=g).tolist()
        hidden = torch.randn(off, width, generator=g)
        step = DraftStep(i, k, slices, np.array(ids, dtype=np.int32), prompts=prompts,
                         block_size=BLOCK if prompts else 0)
        out.append((step, hidden))
    return out


def run(device: str, method: str, branches: BranchConfig | None = None, **config) -> tuple[list, DrafterEngine]:
    """Each step's drafts from an engine on ``device`` (``config``: more ``DrafterEngineConfig`` fields) and, with
    ``branches``, the branch table ``after_step`` made (sequence -> {(a, y): drafts}); and the engine."""
    engine = make_engine(device, method, branches, **config)
    out = []
    for step, hidden in steps(engine.spec.fused_hidden_size):
        out.append(engine.draft_tensors(step, hidden).drafts.tolist())
        if branches is not None:
            out.append({rid: entry.drafts for rid, entry in engine.after_step().items()})
    return out, engine


def make_engine(device: str, method: str, branches: BranchConfig | None = None, **config) -> DrafterEngine:
    """An engine for ``STEPS``: k <= 3, so a step of more than 4 rows a sequence (a prefill) takes the eager passes."""
    config = {"max_model_len": MAX_MODEL_LEN, "max_k": 3, **config}
    return DrafterEngine(random_head(method), DrafterEngineConfig(branches=branches, **config), device=device)
