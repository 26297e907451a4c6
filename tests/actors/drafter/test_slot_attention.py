"""``actors.drafter.slot_attention``: the torch backend equals attention computed row by row from the rule in the
module's docstring, and the Triton kernel (run by Triton's interpreter on the CPU) equals the torch backend:
chunks, ``known_from``, gaps, padding rows, one split and several, query rows tiled over programs."""

from __future__ import annotations

import math

import pytest
import torch

from actors.drafter import slot_attention as sa
from actors.drafter.slot_attention import SlotRows, slot_attention

SLOTS, MAX_LEN, KV_HEADS, HEAD_DIM, HEADS = 5, 48, 2, 16, 4


def cache(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (SLOTS, MAX_LEN, KV_HEADS, HEAD_DIM)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def by_hand(q, k, v, rows: SlotRows, chunk: int | None) -> torch.Tensor:  # [B, R, heads * head_dim]
    """One row, one head at a time, the keys listed by the docstring's rule."""
    num_seqs, num_rows, num_heads, head_dim = q.shape
    out = torch.zeros(num_seqs, num_rows, num_heads, head_dim)
    for b in range(num_seqs):
        slot, known = int(rows.slots[b]), int(rows.known_from[b])
        gap = range(int(rows.gap_lo[b]), int(rows.gap_hi[b]))
        scratch_from = int(rows.scratch_from[b]) if rows.scratch is not None else MAX_LEN

        def key_slot(j: int, b: int = b, slot: int = slot, scratch_from: int = scratch_from) -> int:
            return int(rows.scratch[b]) if j >= scratch_from else slot

        for r in range(num_rows):
            p = int(rows.q_pos[b, r])
            if p < 0:
                continue
            lo = (p // chunk) * chunk if chunk else 0
            keys = [j for j in range(max(lo, known), p + 1) if j not in gap]
            for h in range(num_heads):
                kv = h // (num_heads // KV_HEADS)
                scores = torch.stack([q[b, r, h] @ k[key_slot(j), j, kv] for j in keys]) / math.sqrt(head_dim)
                out[b, r, h] = torch.softmax(scores, 0) @ torch.stack([v[key_slot(j), j, kv] for j in keys])
    return out.flatten(-2)


def decode_rows() -> tuple[torch.Tensor, SlotRows]:
    """Three sequences of up to four rows: one with a gap, one re-homed (known from 5) crossing a chunk of 8, one
    all padding."""
    q = torch.randn(3, 4, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    q_pos = torch.tensor([[10, 11, 12, -1], [14, 15, 16, 17], [-1, -1, -1, -1]])
    rows = SlotRows(torch.tensor([3, 0, 4]), q_pos, torch.tensor([0, 5, 0]), torch.tensor([2, 0, 0]),
                    torch.tensor([6, 0, 0]))
    return q, rows


@pytest.mark.parametrize("chunk", [None, 8])
def test_torch_backend_equals_attention_by_hand(chunk):
    k, v = cache()
    q, rows = decode_rows()
    got = slot_attention(q, k, v, rows, chunk, "torch", width=24)
    torch.testing.assert_close(got, by_hand(q, k, v, rows, chunk), atol=1e-5, rtol=1e-5)
    assert not got[2].any() and not got[0, 3].any()  # padding rows: zeros


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("chunk", [None, 8])
def test_triton_kernel_equals_torch_backend(chunk, splits, monkeypatch):
    monkeypatch.setattr(sa, "num_splits", lambda programs, device: splits)
    k, v = cache()
    q, rows = decode_rows()
    torch.testing.assert_close(slot_attention(q, k, v, rows, chunk, "triton"),
                               slot_attention(q, k, v, rows, chunk, "torch"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_keys_past_a_branch_point_come_from_a_scratch_slot(backend):
    """Two branches of one sequence (slot 3) past its position 12, each writing its own rows into a scratch slot."""
    k, v = cache(4)
    q = torch.randn(2, 1, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(5))
    rows = SlotRows(torch.tensor([3, 3]), torch.tensor([[14], [15]]), torch.zeros(2, dtype=torch.long),
                    torch.tensor([2, 2]), torch.tensor([5, 5]), scratch=torch.tensor([0, 1]),
                    scratch_from=torch.tensor([13, 13]))
    for chunk in (None, 8):
        torch.testing.assert_close(slot_attention(q, k, v, rows, chunk, backend, width=24),
                                   by_hand(q, k, v, rows, chunk), atol=1e-5, rtol=1e-5)


def test_triton_kernel_tiles_many_rows_per_sequence():
    """A prefill: 40 rows per sequence span several programs (``MAX_TILE_QUERIES``); the last rows are padding."""
    k, v = cache(2)
    q = torch.randn(2, 40, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(3))
    q_pos = torch.arange(40).repeat(2, 1)
    q_pos[1, 30:] = -1
    zeros = torch.zeros(2, dtype=torch.long)
    rows = SlotRows(torch.tensor([1, 2]), q_pos, zeros, zeros, zeros)
    torch.testing.assert_close(slot_attention(q, k, v, rows, 8, "triton"), slot_attention(q, k, v, rows, 8, "torch"),
                               atol=1e-5, rtol=1e-5)


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("EAGLE_CLUSTER_SLOT_ATTENTION", raising=False)
    assert sa.choose_backend("cpu") == "torch"  # the CPU keeps torch's kernels
    monkeypatch.setenv("EAGLE_CLUSTER_SLOT_ATTENTION", "triton")
    assert sa.choose_backend("cpu") == "triton"
    monkeypatch.setenv("EAGLE_CLUSTER_SLOT_ATTENTION", "flash")
    with pytest.raises(ValueError, match="EAGLE_CLUSTER_SLOT_ATTENTION"):
        sa.choose_backend("cpu")


def test_splits_fill_the_device_and_do_not_depend_on_context():
    cpu = torch.device("cpu")
    assert sa.num_splits(1, cpu) == 8 and sa.num_splits(64, cpu) == 1  # 2 x the interpreter's 4 "SMs"
    assert 1 <= sa.num_splits(1, cpu) <= sa.MAX_SPLITS
