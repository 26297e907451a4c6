"""Attention of query rows over the draft KV cache as it lies, driven by per-sequence metadata on the device.

Where it sits: the drafter engine's passes (``actors.drafter.engine.CacheAttention``, and the fixed-shape decode
step of ``actors.drafter.decode_step``) write the new rows' K/V into the cache, then call ``slot_attention`` for
the rows' attention output. Nothing here reads a host value: the same call runs eagerly and inside a CUDA graph.

The cache is ``[num_slots, max_len, num_kv_heads, head_dim]`` per layer, one slot per sequence
(``actors.drafter.kv_cache``): a dense slot is already a page table of one page, so a sequence's keys are read
where they lie, with no gather and no mask tensor. Which keys a query row at position p of sequence b sees
(``SlotRows``; the same rules as the cache's docstring):

    lo(p) <= j <= p,  j >= known_from[b],  not gap_lo[b] <= j < gap_hi[b]

where lo(p) is the start of p's attention chunk on chunked layers (Llama 4's local attention: ``(p // C) * C``)
and 0 elsewhere. A row at position -1 is padding: it sees nothing and its output is 0. A sequence may read its keys
from two slots: positions from ``scratch_from[b]`` on come from slot ``scratch[b]`` (a branch of pipelined drafting
keeps its own rows in a scratch slot, over its sequence's cache up to the branch point: ``actors.drafter.branches``).

Two backends, chosen once per engine (``choose_backend``):

- ``triton`` (CUDA; on a CPU Triton's interpreter runs it, which the tests use): split-KV flash decoding.
  One program per (sequence and tile of its query rows, KV head, split of the key range); all query heads of a KV
  head's group and all of a sequence's rows in the tile share each K/V tile it loads, so the cache is read once per
  pass. The split count is fixed per batch size (never per context), so a captured graph replays at any length;
  each program finds its own key range from the metadata. Split results are merged by their log-sum-exp.
- ``torch`` (the CPU's, and the reference the kernel is tested against): each sequence's keys ``[0, width)``
  gathered from its slot, a mask built on the device from the same metadata, one SDPA call. ``width`` is the
  caller's (host-known) bound on the positions; under a CUDA graph it is part of the graph's key.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Backend = Literal["triton", "torch"]


@dataclass(frozen=True)
class SlotRows:
    """Where B sequences' query rows are and which cache entries each row sees (module docstring)."""

    slots: torch.Tensor  # [B] int64 each sequence's cache slot
    q_pos: torch.Tensor  # [B, R] int64 each query row's position; -1: padding
    known_from: torch.Tensor  # [B] int64 first position the slot holds
    gap_lo: torch.Tensor  # [B] int64 masked positions [gap_lo, gap_hi); gap_hi <= gap_lo: none
    gap_hi: torch.Tensor  # [B] int64
    scratch: torch.Tensor | None = None  # [B] int64 the slot keys at positions >= scratch_from are read from
    scratch_from: torch.Tensor | None = None  # [B] int64


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(device: str | torch.device) -> Backend:
    """The kernel an engine on ``device`` attends with: ``triton`` on CUDA where Triton is installed, else
    ``torch``. ``EAGLE_CLUSTER_SLOT_ATTENTION`` (``triton`` / ``torch``) forces one."""
    forced = os.environ.get("EAGLE_CLUSTER_SLOT_ATTENTION")
    if forced:
        if forced not in ("triton", "torch"):
            raise ValueError(f"EAGLE_CLUSTER_SLOT_ATTENTION: {forced!r} is not 'triton' or 'torch'")
        return forced  # type: ignore[return-value]
    return "triton" if torch.device(device).type == "cuda" and triton_available() else "torch"


def slot_attention(
    q: torch.Tensor,  # [B, R, num_heads, head_dim]
    cache_k: torch.Tensor,  # [num_slots, max_len, num_kv_heads, head_dim]
    cache_v: torch.Tensor,  # [num_slots, max_len, num_kv_heads, head_dim]
    rows: SlotRows,
    chunk: int | None,
    backend: Backend,
    width: int | None = None,  # torch backend: keys [0, width) are read (default: the whole slot)
) -> torch.Tensor:  # [B, R, num_heads * head_dim]
    if backend == "triton":
        return _triton_attention(q, cache_k, cache_v, rows, chunk)
    return _torch_attention(q, cache_k, cache_v, rows, chunk, width or cache_k.shape[1])


def visible(
    rows: SlotRows,
    key_pos: torch.Tensor,  # [W] key positions
    chunk: int | None,
) -> torch.Tensor:  # [B, R, W] bool, True = the row sees the key
    """The module docstring's rule, as a mask."""
    q = rows.q_pos[:, :, None]
    k = key_pos[None, None, :]
    lo = (q // chunk) * chunk if chunk else torch.zeros_like(q)
    lo = torch.maximum(lo, rows.known_from[:, None, None])
    gap = (k >= rows.gap_lo[:, None, None]) & (k < rows.gap_hi[:, None, None])
    return (k <= q) & (k >= lo) & ~gap


def _torch_attention(q, cache_k, cache_v, rows: SlotRows, chunk: int | None, width: int) -> torch.Tensor:
    num_seqs, num_rows, num_heads, head_dim = q.shape
    keys = cache_k[:, :width].index_select(0, rows.slots)  # [B, W, kv_heads, head_dim]: the window only
    values = cache_v[:, :width].index_select(0, rows.slots)
    if rows.scratch is not None:
        later = (torch.arange(width, device=q.device) >= rows.scratch_from[:, None])[:, :, None, None]  # [B, W, 1, 1]
        keys = torch.where(later, cache_k[:, :width].index_select(0, rows.scratch), keys)
        values = torch.where(later, cache_v[:, :width].index_select(0, rows.scratch), values)
    mask = visible(rows, torch.arange(width, device=q.device), chunk)  # [B, R, W]
    seen = mask.any(-1, keepdim=True)  # [B, R, 1]: padding rows see nothing
    mask = mask | ~seen  # ... so let them see everything (kept finite), then zero them
    qh, kh, vh = q.transpose(1, 2), keys.to(q.dtype).transpose(1, 2), values.to(q.dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[:, None], scale=1 / math.sqrt(head_dim),
                                         enable_gqa=qh.shape[1] != kh.shape[1])
    return (out.transpose(1, 2) * seen[..., None]).flatten(-2)  # [B, R, heads * head_dim]


# --- the Triton kernel -------------------------------------------------------------------------------------------

# Launch settings: keys per loaded tile, warps, pipeline stages. The defaults were chosen on an H200 (Scout shapes:
# 8 KV heads, head dim 128; docs/BENCHMARKS.md); ``launch_config`` changes them (the device benchmark sweeps them).
_LAUNCH = {"block_n": 64, "num_warps": 4, "num_stages": 3}
MAX_SPLITS = 32
MAX_TILE_QUERIES = 64  # query vectors (rows x group heads) one program holds


def launch_config(block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> dict:
    """Set (any given) and return the kernel's launch settings."""
    for name, value in (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages)):
        if value is not None:
            _LAUNCH[name] = value
    return dict(_LAUNCH)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count  # cuda-only
    return 4  # the interpreter on a CPU: a few splits, so the split-merge path is tested too


def num_splits(programs: int, device: torch.device) -> int:
    """Splits of each key range: enough programs to fill the GPU twice over at small batches, one at large ones.
    Depends only on the batch's shape, so a graph captured for it replays at any context length."""
    return max(1, min(MAX_SPLITS, -(-2 * _num_sms(device) // programs)))


def _triton_attention(q, cache_k, cache_v, rows: SlotRows, chunk: int | None) -> torch.Tensor:
    num_seqs, num_rows, num_heads, head_dim = q.shape
    kv_heads = cache_k.shape[2]
    group = num_heads // kv_heads
    tile_rows = max(1, min(num_rows, MAX_TILE_QUERIES // group))  # query rows per program
    tiles = -(-num_rows // tile_rows)
    block_m = max(16, 1 << (tile_rows * group - 1).bit_length())
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    splits = num_splits(num_seqs * tiles * kv_heads, q.device)
    q = q.contiguous()
    out = torch.empty(num_seqs * tiles, kv_heads, splits, block_m, block_d, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_seqs * tiles, kv_heads, splits, block_m, dtype=torch.float32, device=q.device)
    q_pos = rows.q_pos.contiguous()
    has_scratch = rows.scratch is not None
    scratch, scratch_from = (rows.scratch, rows.scratch_from) if has_scratch else (rows.slots, rows.slots)
    attention_kernel, merge_kernel = _kernels(q.device.type == "cpu")
    with _interpreted(q.device.type == "cpu"):
        attention_kernel[(num_seqs * tiles, kv_heads, splits)](
            q, cache_k, cache_v, out, lse, rows.slots, q_pos, rows.known_from, rows.gap_lo, rows.gap_hi, scratch,
            scratch_from,
            q.stride(0), q.stride(1), q.stride(2),
            cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
            cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
            out.stride(0), out.stride(1), out.stride(2), out.stride(3),
            lse.stride(0), lse.stride(1), lse.stride(2),
            num_rows, tiles, 1 / math.sqrt(head_dim),
            GROUP=group, TILE_ROWS=tile_rows, BLOCK_M=block_m, BLOCK_N=_LAUNCH["block_n"], HEAD_DIM=head_dim,
            BLOCK_D=block_d, CHUNK=chunk or 0, NUM_SPLITS=splits, IEEE=q.dtype == torch.float32,
            HAS_SCRATCH=has_scratch,
            num_warps=_LAUNCH["num_warps"], num_stages=_LAUNCH["num_stages"],
        )
        merged = torch.empty(num_seqs, num_rows, num_heads * head_dim, dtype=q.dtype, device=q.device)
        merge_kernel[(num_seqs * tiles, kv_heads)](
            out, lse, merged,
            out.stride(0), out.stride(1), out.stride(2), out.stride(3),
            lse.stride(0), lse.stride(1), lse.stride(2),
            merged.stride(0), merged.stride(1),
            num_rows, tiles,
            GROUP=group, TILE_ROWS=tile_rows, BLOCK_M=block_m, HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=splits,
        )
    return merged


def import_triton_for_interpreter() -> None:
    """Import Triton with its interpreter on, then turn it off again: Triton defines its standard library
    (``tl.max``, ``tl.sum``, ...) in the mode it is first imported in, and the interpreter can only call functions
    defined for it. A process that runs this kernel on a CPU (the tests) calls this before anything imports Triton
    (vLLM does); kernels it defines afterwards are compiled or interpreted as ``_interpreted`` says."""
    if "triton" in sys.modules:
        return
    with _interpreted(True):
        import triton.language  # noqa: F401


@contextlib.contextmanager
def _interpreted(interpret: bool) -> Iterator[None]:
    """Tensors on a CPU go through Triton's interpreter: ``TRITON_INTERPRET``, which Triton reads as it defines a
    kernel and as the interpreter launches one, is set for that long only."""
    if not interpret:
        yield
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


@functools.cache
def _kernels(interpret: bool):
    """(attention, merge) kernels, defined on first use (Triton is imported only where it runs)."""
    with _interpreted(interpret):
        return _define_kernel(), _define_merge_kernel()


def _define_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def slot_attention_kernel(
        Q, K, V, Out, Lse, Slots, QPos, KnownFrom, GapLo, GapHi, Scratch, ScratchFrom,
        q_stride_b, q_stride_r, q_stride_h,
        k_stride_s, k_stride_l, k_stride_h,
        v_stride_s, v_stride_l, v_stride_h,
        o_stride_t, o_stride_h, o_stride_s, o_stride_m,
        l_stride_t, l_stride_h, l_stride_s,
        num_rows, tiles, scale,
        GROUP: tl.constexpr, TILE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, NUM_SPLITS: tl.constexpr,
        IEEE: tl.constexpr, HAS_SCRATCH: tl.constexpr,
    ):
        pid = tl.program_id(0)  # sequence b, tile t of its query rows
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        b = pid // tiles
        m = tl.arange(0, BLOCK_M)
        row = (pid % tiles) * TILE_ROWS + m // GROUP  # [BLOCK_M] query row of each program row
        head = kv_head * GROUP + m % GROUP
        row_ok = (m < TILE_ROWS * GROUP) & (row < num_rows)
        q_pos = tl.load(QPos + b * num_rows + row, mask=row_ok, other=-1)
        known = tl.load(KnownFrom + b)
        gap_lo = tl.load(GapLo + b)
        gap_hi = tl.load(GapHi + b)
        slot = tl.load(Slots + b).to(tl.int64)
        if CHUNK > 0:
            lo_row = (q_pos // CHUNK) * CHUNK
        else:
            lo_row = tl.zeros_like(q_pos)
        lo_row = tl.maximum(lo_row, known)
        seen = q_pos >= 0
        hi = tl.max(tl.where(seen, q_pos, -1), axis=0)  # the tile's key range [lo, hi]
        lo = tl.min(tl.where(seen, lo_row, 1 << 40), axis=0)
        count = tl.maximum(hi - lo + 1, 0)
        per_split = tl.cdiv(tl.cdiv(count, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = lo + split * per_split
        end = tl.minimum(start + per_split, hi + 1)

        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q = tl.load(Q + b * q_stride_b + row[:, None] * q_stride_r + head[:, None] * q_stride_h + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if HAS_SCRATCH:
            scratch = tl.load(Scratch + b).to(tl.int64)
            scratch_from = tl.load(ScratchFrom + b)
        for s in range(start, end, BLOCK_N):
            keys = s + tl.arange(0, BLOCK_N)
            in_range = keys < end
            if HAS_SCRATCH:
                key_slot = tl.where(keys >= scratch_from, scratch, slot)  # [BLOCK_N]
            else:
                key_slot = slot
            k_ptr = K + key_slot * k_stride_s + kv_head * k_stride_h
            v_ptr = V + key_slot * v_stride_s + kv_head * v_stride_h
            if HAS_SCRATCH:
                k_ptr = k_ptr[:, None]
                v_ptr = v_ptr[:, None]
            kt = tl.load(k_ptr + keys[:, None] * k_stride_l + d[None, :], mask=in_range[:, None] & d_ok[None, :],
                         other=0.0)
            vt = tl.load(v_ptr + keys[:, None] * v_stride_l + d[None, :], mask=in_range[:, None] & d_ok[None, :],
                         other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(kt), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(kt)) * scale
            in_gap = (keys >= gap_lo) & (keys < gap_hi)
            ok = (keys[None, :] <= q_pos[:, None]) & (keys[None, :] >= lo_row[:, None])
            ok = ok & (in_range & ~in_gap)[None, :]
            scores = tl.where(ok, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        has = l_i > 0
        acc = acc / tl.where(has, l_i, 1.0)[:, None]
        o_ptr = Out + pid * o_stride_t + kv_head * o_stride_h + split * o_stride_s
        tl.store(o_ptr + m[:, None] * o_stride_m + d[None, :], acc)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(Lse + pid * l_stride_t + kv_head * l_stride_h + split * l_stride_s + m, lse)

    return slot_attention_kernel


def _define_merge_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def merge_kernel(
        Out, Lse, Merged,
        o_stride_t, o_stride_h, o_stride_s, o_stride_m,
        l_stride_t, l_stride_h, l_stride_s,
        m_stride_b, m_stride_r,
        num_rows, tiles,
        GROUP: tl.constexpr, TILE_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
    ):
        """Each split's output is normalised by its own softmax sum: weight it by exp(lse - the largest lse), then
        write program row m = r * GROUP + g as query row (tile * TILE_ROWS + r), head (kv_head * GROUP + g)."""
        pid = tl.program_id(0)
        kv_head = tl.program_id(1)
        m = tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        lse_ptr = Lse + pid * l_stride_t + kv_head * l_stride_h
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for s in range(NUM_SPLITS):
            top = tl.maximum(top, tl.load(lse_ptr + s * l_stride_s + m))
        top = tl.where(top == float("-inf"), 0.0, top)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        o_ptr = Out + pid * o_stride_t + kv_head * o_stride_h + m[:, None] * o_stride_m + d[None, :]
        for s in range(NUM_SPLITS):
            weight = tl.exp(tl.load(lse_ptr + s * l_stride_s + m) - top)  # an empty split weighs 0
            total += weight
            acc += weight[:, None] * tl.load(o_ptr + s * o_stride_s)
        acc = acc / tl.where(total > 0, total, 1.0)[:, None]
        b = pid // tiles
        row = (pid % tiles) * TILE_ROWS + m // GROUP
        head = kv_head * GROUP + m % GROUP
        ok = (m < TILE_ROWS * GROUP) & (row < num_rows)
        ptr = Merged + b * m_stride_b + row[:, None] * m_stride_r + head[:, None] * HEAD_DIM + d[None, :]
        tl.store(ptr, acc.to(Merged.dtype.element_ty), mask=ok[:, None] & (d < HEAD_DIM)[None, :])

    return merge_kernel
