"""``actors.eagle.kernels``: each of vLLM's kernels against the torch op it replaces, and a head prepared with them
(``DraftHead.fuse``) against the same head on torch's ops, for EAGLE-1 (QK-norm, chunked attention) and EAGLE-3."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from actors.eagle import kernels
from actors.eagle.checkpoint import load_head
from actors.eagle.layers import apply_neox_rotary, rms_norm, rotary_cos_sin, sdpa_attend
from tests.conftest import EAGLE1, EAGLE3, TARGET

pytestmark = pytest.mark.skipif(not kernels.available(), reason="vLLM's kernels (vllm._C) are not installed")


def test_rms_norm_matches_torch_also_on_a_strided_view():
    x = torch.randn(3, 512)[:, 256:]  # rows 512 apart: the kernel needs them made contiguous
    w = torch.randn(256)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), rms_norm(x, 1e-5, w))


def test_rotary_in_place_on_views_of_one_qkv_output():
    n, heads, kv_heads, d = 5, 8, 2, 32
    freqs = 1.0 / (5e5 ** (torch.arange(0, d, 2).float() / d))
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d)
    q, k, _ = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    positions = torch.tensor([0, 1, 2, 700, 4095])
    cos_sin = rotary_cos_sin(positions, freqs)
    want_q = apply_neox_rotary(q.unflatten(-1, (-1, d)), cos_sin)
    want_k = apply_neox_rotary(k.unflatten(-1, (-1, d)), cos_sin)
    kernels.rotary_(positions, q, k, d, kernels.cos_sin_cache(freqs, 4096, torch.float32))
    torch.testing.assert_close(q.unflatten(-1, (-1, d)), want_q)
    torch.testing.assert_close(k.unflatten(-1, (-1, d)), want_k)


def test_silu_and_mul_matches_torch():
    gate_up = torch.randn(4, 2 * 96)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_and_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("head_dir", [EAGLE1, EAGLE3], ids=["eagle", "eagle3"])
def test_a_fused_head_computes_what_the_torch_head_does(head_dir):
    """One pass over 6 flat rows at positions up to the rotary table's last, each row attending to itself only."""
    plain = load_head(head_dir, TARGET).eval()
    fused = copy.deepcopy(plain).fuse(max_positions=2048)
    assert fused.norm.use_kernel and fused.layers[0].self_attn.cos_sin is not None
    spec = plain.spec
    n = 6
    ids = torch.randint(0, spec.vocab_size, (n,))
    positions = torch.tensor([0, 1, 2, 1030, 1031, 2047])
    hidden = plain.combine(torch.randn(n, spec.fused_hidden_size))

    def attend(layer, q, k, v, pos):  # [N, heads, hd] each: every row sees its own key only
        return sdpa_attend(q[:, None], k[:, None], v[:, None], torch.ones(n, 1, 1, dtype=torch.bool))[:, 0]

    with torch.inference_mode():
        want = plain(ids, hidden, positions, attend)
        got = fused(ids, hidden, positions, attend)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
