"""The drafter engine: proposes k draft tokens for a whole batch of sequences per verification step.

Where it sits: the verifier (``actors.verifier.remote_speculator``) sends a ``DraftStep`` and the target
hidden states; ``DrafterEngine.draft`` returns a ``DraftResult``. No Ray, no Serve here: the Ray actor
wrapper is ``actors.drafter.actor``.

One step, for B sequences holding N new rows in all (see ``actors.messages`` for the row layout):

1. context pass: the head runs over all N rows at once (``hidden`` fused by ``combine`` for EAGLE-3),
   writing their K/V into each sequence's slot of the draft KV cache, attending over the cache;
2. the last row of each sequence gives draft token 1 (greedy) and the hidden state fed back;
3. k - 1 draft passes, one row per sequence, at positions last + 1, last + 2, ...

All of it is batched: the only Python loop is over the k draft positions.

Devices: the head, the draft KV cache and the activations live on ``device`` (in ``dtype``); the small index
bookkeeping of a step (slots, positions, masks) is computed on the CPU, where it costs no device round trip, and
copied to the device once per pass. ``actors.drafter.placement`` decides device and dtype for the actor. On CUDA
a decode step runs on fixed-shape buffers replayed from CUDA graphs (``actors.drafter.decode_step``; pipelined
drafting's branch passes: ``actors.drafter.branch_passes``), and every pass attends through the Triton kernel of
``actors.drafter.slot_attention``; a CPU keeps the eager passes below (``DrafterEngineConfig.fixed_shape_steps``).

Prefix caching (``actors.drafter.prefix_cache``): a sequence's first step carries its prompt; the engine hashes its
blocks, and when the step starts past 0 (vLLM's own prefix-cache hit) copies the cached blocks into the sequence's
slot before the context pass. As its rows fill blocks, they are stored for the sequences that come after.

Settings: one ``actors.drafter.config.DrafterEngineConfig``, taken whole. With asynchronous drafting (its
``branches``), sequences whose outcome was guessed skip all of that (their drafts were precomputed), and
``after_step`` does the rest off the critical path: ``actors.drafter.branches``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from actors.drafter.branch_budget import BranchBudget
from actors.drafter.branch_passes import BranchPasses
from actors.drafter.branches import BranchAttention, BranchEntry, guesses
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.decode_step import DecodeStep
from actors.drafter.kv_cache import DraftKVCache, consecutive, device_budget_gib
from actors.drafter.prefix_cache import PrefixBlockStore, SeqTokens
from actors.drafter.slot_attention import Backend, SlotRows, choose_backend, slot_attention
from actors.eagle.heads import DraftHead
from actors.eagle.layers import sdpa_attend
from actors.messages import (
    BadStep,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
)
from actors.timing import ms_since
from actors.wire import decode_hidden


@dataclass
class _Batch:
    """Padded view of a step: query rows of B sequences laid out as ``[B, max_rows]``. The fields are CPU
    tensors; ``on_device`` holds the copies that device tensors are indexed with."""

    slots: torch.Tensor  # [B]
    row_seq: torch.Tensor  # [N] sequence index of each flat row
    row_local: torch.Tensor  # [N] index of each row within its sequence
    positions: torch.Tensor  # [N]
    max_rows: int
    device: str | torch.device = "cpu"
    on_device: dict[str, torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        on_cpu = torch.device(self.device).type == "cpu"
        row_slots = self.slots if self.max_rows == 1 and self.row_seq.numel() == self.slots.numel() \
            else self.slots[self.row_seq]
        self.on_device = {  # [N] slot of each row, and the rest as they are
            name: t if on_cpu else t.to(self.device)
            for name, t in (("row_slots", row_slots), ("row_seq", self.row_seq), ("row_local", self.row_local),
                            ("positions", self.positions))
        }


# Attention scores one sdpa call may hold ([B, heads, query rows, keys]): a long prompt's context pass attends in
# blocks of query rows under this, so a 32k-token prefill does not ask for 40 x 32k x 32k scores at once.
MAX_SCORES = 2**28
# A sequence with more query rows than this in a pass (a prompt chunk) attends in a group of its own, and the rest
# are padded only to the longest of them: a step mixing one 8k-token chunk with decode rows pads to 8k once, not
# once per sequence (``CacheAttention.groups``). Above a draft step's rows (k + 1 <= 17) and below a chunk's.
PACKED_ROWS = 32


class CacheAttention:
    """``AttendFn`` over the draft KV cache for one pass (writes the new rows, then attends).

    Keys are read per sequence from a window ``[lo, lo + width)`` of positions: from 0 for global layers, and
    for chunked-attention layers from the start of the chunk holding the sequence's first query row, so a
    decode pass at position 1000 with chunk 128 reads at most 128 keys, not 1000. Masks are made on the device
    from the query and key positions, one block of query rows at a time (``MAX_SCORES``).

    Queries are padded to ``[B, max_rows]``. When some sequence has more than ``PACKED_ROWS`` rows and others share
    the pass, the batch attends in ``groups``: each long sequence alone, the short ones together, so the padding,
    the masks and the key windows grow with each group's own rows. Worked example: rows per sequence [3, 2500, 2, 4]
    -> groups (sequences [0, 2, 3], padded to 4 rows, keys up to their own positions) and ([1], 2500 rows): 2512
    query rows attended, not 4 x 2500.
    """

    def __init__(self, cache: DraftKVCache, batch: _Batch, chunk_sizes: dict[int, int | None],
                 backend: Backend = "torch") -> None:
        self.cache, self.b, self.chunks, self.backend = cache, batch, chunk_sizes, backend
        self._slot_rows: SlotRows | None = None  # the Triton kernel's metadata (``_slot_attention``)
        b = batch
        num_seqs = b.slots.numel()
        # (flat rows of the group on the device [n], the group's own pass) for a mixed pass; else None
        self.groups: list[tuple[torch.Tensor, CacheAttention]] | None = None
        if b.max_rows > PACKED_ROWS and num_seqs > 1:
            counts = torch.bincount(b.row_seq, minlength=num_seqs)  # [B] rows of each sequence
            long = torch.nonzero(counts > PACKED_ROWS).flatten().tolist()
            short = torch.nonzero(counts <= PACKED_ROWS).flatten()
            self.groups = [self._group(seqs, counts) for seqs in
                           ([short] if short.numel() else []) + [torch.tensor([i]) for i in long]]
            return
        # A decode pass (one row per sequence, in sequence order) needs no padding and no scatter of its rows.
        self.one_row = b.max_rows == 1 and b.row_seq.numel() == num_seqs
        if self.one_row:
            self.q_pos = b.positions[:, None]  # [B, 1]
            self.first_pos = self.last_pos = b.positions
        else:
            # Query positions, padded: [B, max_rows]; padding rows get position -1 (masked out below).
            self.q_pos = torch.full((num_seqs, b.max_rows), -1, dtype=torch.long)
            self.q_pos[b.row_seq, b.row_local] = b.positions
            self.first_pos = self.q_pos[:, 0]  # [B] rows of a sequence are consecutive positions
            self.last_pos = self.q_pos.max(dim=1).values  # [B]
        self.padded = not self.one_row and b.row_seq.numel() < num_seqs * b.max_rows
        # The few per-sequence numbers a pass branches on, as Python ints: on a CPU each torch op on a [B] tensor
        # costs microseconds of dispatch, and a draft step is a few hundred of them.
        self.slot_list: list[int] = b.slots.tolist()
        self.first_list: list[int] = self.first_pos.tolist()
        self.last_list: list[int] = self.last_pos.tolist()
        self.q_pos_d = self.q_pos.to(b.device)
        self.known_from_d = cache.known_from[b.slots].to(b.device)  # [B]
        gap_lo, gap_hi = cache.gap_lo[b.slots], cache.gap_hi[b.slots]
        gapped = any(hi > lo for lo, hi in zip(gap_lo.tolist(), gap_hi.tolist(), strict=True))
        self.gap_d = (gap_lo.to(b.device), gap_hi.to(b.device)) if gapped else None
        self._windows: dict[int | None, tuple[torch.Tensor, torch.Tensor]] = {}
        self._masks: dict[int | None, torch.Tensor] = {}  # when one block holds all query rows
        self._shared: dict[int | None, int | None] = {}  # per chunk size: the window's start when every sequence's
        #                                                  window is at the same positions, inside the cache; else None
        self.slot_order = self._slot_order(self.slot_list)
        self.sorted_slot_list = self.slot_list if self.slot_order is None else sorted(self.slot_list)
        if self.slot_order is not None:
            self.order_d = self.slot_order.to(b.device)
            self.unorder_d = torch.argsort(self.slot_order).to(b.device)

    def _group(self, seqs: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, CacheAttention]:
        """The pass of sequences ``seqs`` [G] (indices into the batch) alone, and their flat rows."""
        b = self.b
        rows = torch.nonzero(torch.isin(b.row_seq, seqs)).flatten()  # [n]
        local = torch.full((b.slots.numel(),), -1, dtype=torch.long)
        local[seqs] = torch.arange(seqs.numel())  # batch index -> index in the group
        sub = _Batch(b.slots[seqs], local[b.row_seq[rows]], b.row_local[rows], b.positions[rows],
                     int(counts[seqs].max()), b.device)
        return rows.to(b.device), CacheAttention(self.cache, sub, self.chunks, self.backend)

    @staticmethod
    def _slot_order(slots: list[int]) -> torch.Tensor | None:  # [B] slot of each sequence
        """The batch's sequences in slot order, when their slots are consecutive ones in another order; else None.

        A window every sequence reads from the same positions is then a view of the cache, not a copy: attention
        runs with the batch in slot order (queries and masks permuted, a few rows each) and its output is put back.
        vLLM's persistent batch reorders its requests as others finish, so a batch's slots are often a shuffle.
        Worked example: slots [5, 3, 4] -> order [1, 2, 0] (slots[order] = [3, 4, 5], a view of slots 3..5)."""
        num = len(slots)
        if num < 2 or max(slots) - min(slots) + 1 != num or consecutive(slots):
            return None  # one sequence, not consecutive (a copy either way), or already in order (a view already)
        return torch.tensor(sorted(range(num), key=slots.__getitem__))  # num distinct slots spanning num values

    def window(self, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Key positions [B, width] for layers with this chunk size: clamped to the cache, on the CPU (to read
        it), and as they are, on the device (for masks)."""
        if chunk not in self._windows:
            lo = [(f // chunk) * chunk for f in self.first_list] if chunk else [0] * len(self.first_list)
            width = max(last - start for last, start in zip(self.last_list, lo, strict=True)) + 1
            if all(start == lo[0] for start in lo):  # every sequence reads the same positions
                key_pos = torch.arange(lo[0], lo[0] + width).expand(len(lo), width)  # [B, width]
                self._shared[chunk] = lo[0] if lo[0] + width <= self.cache.max_len else None
            else:
                key_pos = torch.tensor(lo)[:, None] + torch.arange(width)  # [B, width]
                self._shared[chunk] = None
            self._windows[chunk] = (key_pos.clamp(max=self.cache.max_len - 1), key_pos.to(self.b.device))
        return self._windows[chunk]

    def mask(self, chunk: int | None, key_pos: torch.Tensor, rows: slice) -> torch.Tensor:
        """[B, len(rows), width] bool, True = may attend, for query rows ``rows`` and device key positions."""
        q = self.q_pos_d[:, rows, None]
        k = key_pos[:, None, :]
        m = (k <= q) & (k >= self.known_from_d[:, None, None])
        if self.gap_d is not None:  # some sequence has a gap (none: lo >= hi)
            m &= (k < self.gap_d[0][:, None, None]) | (k >= self.gap_d[1][:, None, None])
        if chunk:
            m &= (k // chunk) == (q // chunk)
        if self.padded:
            m &= q >= 0
            m[:, :, 0] |= q[:, :, 0] < 0  # padding rows see one key, to keep softmax finite
        return m

    def _padded_queries(self, q: torch.Tensor) -> torch.Tensor:  # [N, heads, hd] -> [B, max_rows, heads, hd]
        b, dev = self.b, self.b.on_device
        if self.one_row:
            return q[:, None]
        qp = q.new_zeros(b.slots.numel(), b.max_rows, *q.shape[1:])
        qp[dev["row_seq"], dev["row_local"]] = q
        return qp

    def _slot_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """The Triton kernel over the cache in place (``actors.drafter.slot_attention``): on CUDA, no window copy,
        no mask, no per-shape plan."""
        b, dev, cache = self.b, self.b.on_device, self.cache
        if self._slot_rows is None:  # once per pass, not per layer
            self._slot_rows = SlotRows(b.slots.to(b.device), self.q_pos_d, self.known_from_d,
                                       cache.gap_lo[b.slots].to(b.device), cache.gap_hi[b.slots].to(b.device))
        out = slot_attention(self._padded_queries(q), cache.k[layer], cache.v[layer], self._slot_rows,
                             self.chunks[layer], "triton")
        return out[:, 0] if self.one_row else out[dev["row_seq"], dev["row_local"]]  # [N, heads * head_dim]

    def __call__(self, layer: int, q, k, v, positions) -> torch.Tensor:
        dev = self.b.on_device
        self.cache.write(layer, dev["row_slots"], dev["positions"], k, v)
        if self.groups is None:
            return self.attend(layer, q)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])  # [N, heads * head_dim]
        for rows, group in self.groups:
            out.index_copy_(0, rows, group.attend(layer, q.index_select(0, rows)))
        return out

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:  # q [N, heads, head_dim], its K/V written
        b, dev = self.b, self.b.on_device
        chunk = self.chunks[layer]
        if self.backend == "triton":
            return self._slot_attention(layer, q)
        key_pos, key_pos_d = self.window(chunk)
        lo = self._shared[chunk]
        if lo is None:
            order = None
            keys, values = self.cache.read_window(layer, b.slots, key_pos)
        else:  # attend in slot order (_slot_order)
            order = self.slot_order
            keys, values = self.cache.read_shared(layer, self.sorted_slot_list, lo, key_pos.shape[1])
        if keys.dtype != q.dtype:
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        num_seqs, width = b.slots.numel(), key_pos.shape[1]
        qp = self._padded_queries(q)  # [B, max_rows, heads, head_dim]
        if order is not None:
            qp = qp.index_select(0, self.order_d)

        def mask(rows: slice) -> torch.Tensor:  # [B, rows, width], in the order keys are in
            m = self.mask(chunk, key_pos_d, rows)
            return m if order is None else m.index_select(0, self.order_d)

        block = max(1, MAX_SCORES // (num_seqs * q.shape[-2] * width))
        if block >= b.max_rows:
            if chunk not in self._masks:
                self._masks[chunk] = mask(slice(None))
            out = sdpa_attend(qp, keys, values, self._masks[chunk])
        else:
            out = torch.cat([sdpa_attend(qp[:, r : r + block], keys, values, mask(slice(r, r + block)))
                             for r in range(0, b.max_rows, block)], dim=1)
        if order is not None:
            out = out.index_select(0, self.unorder_d)  # back to the batch's order
        return out[:, 0] if self.one_row else out[dev["row_seq"], dev["row_local"]]  # [N, heads * head_dim]


class TensorDrafts(NamedTuple):
    """``DrafterEngine.draft_tensors``' answer: the drafts, and which sequences (indices into the step's seqs) were
    hits or had no room."""

    drafts: torch.Tensor  # [B, k] int64 target token ids
    cold: int = 0  # sequences that arrived mid-stream (re-homed)
    hit_seqs: list[int] = []  # sequences answered from a precomputed branch (asynchronous drafting)
    branch_lookups: int = 0  # sequences that had branches for this step
    full_seqs: list[int] = []  # sequences with no room here (``DrafterEngine.no_room``): placeholder drafts


@dataclass
class _Chain:
    """One step's drafting state for B sequences (notation: ``actors.drafter.branches``)."""

    req_ids: list[str]
    slots: torch.Tensor  # [B] (CPU)
    last_pos: torch.Tensor  # [B] L: each sequence's last real row (CPU)
    logits: list[torch.Tensor]  # logits_0, logits_1, ...: each [B, draft_vocab] (device, as below)
    feats: list[torch.Tensor]  # f_1, f_2, ...: each [B, hidden_size]
    tokens: list[torch.Tensor] = field(default_factory=list)  # T_1, T_2, ...: each [B] target ids
    draft_ids: list[torch.Tensor] = field(default_factory=list)  # the same in the head's draft vocabulary


class _Rows(NamedTuple):
    """Some sequences of a step, kept for ``after_step``: their sub-step, hidden rows and the drafts served."""

    step: DraftStep
    hidden: torch.Tensor
    served: torch.Tensor | None = None  # [H, k] (hits); None: nothing was served (CONTEXT sequences)


@dataclass
class _Pending:
    """What ``after_step`` has to do for the step just answered."""

    k: int
    chains: list[_Chain] = field(default_factory=list)  # sequences drafted on demand (their drafts were served)
    fold: _Rows | None = None  # hits: their real rows replace the predicted features, and the served drafts replay
    context: _Rows | None = None  # CONTEXT sequences: rows added to the cache


class DrafterEngine:
    def __init__(
        self,
        head: DraftHead,
        config: DrafterEngineConfig | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``config``: the engine's settings (``actors.drafter.config.DrafterEngineConfig``; default: its defaults),
        checked when it was built. ``device`` / ``dtype``: where the weights, activations and draft KV cache live,
        and in which dtype (default: the head's as given); for an actor, ``actors.drafter.placement`` decides them.
        ``clock``: what idle slots are timed by.

        ``config.branches``: asynchronous drafting (``actors.drafter.branches``); ``after_step`` then does the
        off-critical-path work of each step, and must run before the next ``draft``.

        Room: the draft KV cache holds a dense ``max_model_len`` slot per sequence, for at most ``max_num_seqs``
        sequences and no more slots than fit in ``kv_cache_gib`` (default on CUDA: ``kv_cache_free_fraction`` of
        the memory free once the weights are loaded; on a CPU, no memory cap). Sequences beyond either limit get
        no drafts (``TensorDrafts.full_seqs``) instead of an error or an out-of-memory. The cache grows by doubling,
        one layer's K or V at a time, so while growing it briefly holds up to 1.25x its budget (one-layer heads).

        ``idle_slot_ttl_s``: a sequence not stepped for this long (by ``clock``) loses its slot, checked at each
        step (``evicted`` counts them; ``None``: never): a sequence whose verifier died, or whose free never came,
        would otherwise hold it for good and count as load. One that comes back later is drafted as re-homed.

        ``max_k``: the most draft tokens a step may ask for; a step asking for more is refused (``BadStep``).

        ``prefix_cache_fraction``: the share of ``kv_cache_gib`` (or of the CUDA default) the prefix cache's blocks
        may take (``actors.drafter.prefix_cache``; the slots get the rest); with no memory cap (a CPU) it may hold
        as many blocks as ``prefix_cache_fraction * max_num_seqs`` slots, allocated as they fill. 0: no prefix
        cache (a sequence starting past 0 is drafted from what follows, as a re-homed one)."""
        config = DrafterEngineConfig() if config is None else config
        if not isinstance(config, DrafterEngineConfig):
            raise TypeError(f"drafter: config must be a DrafterEngineConfig, got {type(config).__name__}")
        self.config = config
        max_model_len, max_num_seqs, kv_cache_gib = config.max_model_len, config.max_num_seqs, config.kv_cache_gib
        prefix_cache_fraction = config.prefix_cache_fraction
        self.dtype = dtype or head.embed_tokens.weight.dtype
        self.head = head.cast(self.dtype).to(device).eval().fuse(max_positions=config.max_model_len + 1)
        self.device = device
        spec = head.spec
        self.spec = spec
        self.max_model_len = max_model_len
        self.max_k = config.max_k
        slot_bytes = DraftKVCache.bytes_per_slot(spec.num_layers, spec.num_kv_heads, spec.head_dim,
                                                 max_model_len + 1, self.dtype)
        if kv_cache_gib is None:
            kv_cache_gib = device_budget_gib(device, config.kv_cache_free_fraction)
        if kv_cache_gib is not None:
            self.prefix_cache_bytes = int(prefix_cache_fraction * kv_cache_gib * 2**30)
            kv_cache_gib *= 1 - prefix_cache_fraction
            max_num_seqs = min(max_num_seqs, int(kv_cache_gib * 2**30 // slot_bytes))
            if max_num_seqs < 1:
                raise ValueError(f"drafter: kv_cache_gib {kv_cache_gib} holds no sequence of max_model_len "
                                 f"{max_model_len} ({slot_bytes / 2**30:.3f} GiB each)")
        else:
            self.prefix_cache_bytes = int(prefix_cache_fraction * max_num_seqs * slot_bytes)
        on_cuda = torch.device(device).type == "cuda"
        fixed_shape = on_cuda if config.fixed_shape_steps is None else config.fixed_shape_steps
        graphs = fixed_shape and on_cuda and not config.enforce_eager
        branches = config.branches
        branch_rows = 0  # fixed-shape branch passes: a scratch slot per branch row (actors.drafter.branch_passes)
        if fixed_shape and branches is not None and branches.max_branch_rows != 0:
            branch_rows = min(config.cuda_graph_max_batch, branches.max_branch_rows or config.cuda_graph_max_batch)
        self.cache = DraftKVCache(  # allocated whole up front where CUDA graphs will hold its tensors
            spec.num_layers, spec.num_kv_heads, spec.head_dim, max_len=max_model_len + 1,
            initial_slots=max_num_seqs if graphs else min(8, max_num_seqs), max_slots=max_num_seqs,
            dtype=self.dtype, device=device, scratch_slots=branch_rows,
        )
        self.chunks = {i: layer.self_attn.chunk_size for i, layer in enumerate(head.layers)}
        self.attention_backend: Backend = choose_backend(device)  # chosen once: actors.drafter.slot_attention
        self.decode: DecodeStep | None = None  # fixed-shape decode steps (actors.drafter.decode_step)
        if fixed_shape:
            self.decode = DecodeStep(self.head, self.cache, self.chunks, max_model_len=max_model_len,
                                     max_k=config.max_k, backend=self.attention_backend, use_graphs=graphs,
                                     max_batch=min(config.cuda_graph_max_batch, max_num_seqs), device=device,
                                     dtype=self.dtype)
        self.branch_passes: BranchPasses | None = None  # pipelined drafting's branch passes, fixed-shape
        if branch_rows:
            self.branch_passes = BranchPasses(self.head, self.cache, self.chunks, max_model_len=max_model_len,
                                              max_k=config.max_k, backend=self.attention_backend, use_graphs=graphs,
                                              device=device, dtype=self.dtype)
        self.prefix_store: PrefixBlockStore | None = None  # made at the first step naming a block size
        self.seq_tokens: dict[str, SeqTokens] = {}  # sequences whose blocks are hashed (their prompt came)
        self.prefix_hit_tokens = self.prefix_miss_tokens = 0  # since start
        self._prefix_unreported = [0, 0]  # (hit, miss) since the last DraftResult
        self.branch_config = config.branches
        # the rows after_step may draft, following the drafter's spare time (pipelined drafting only)
        self.branch_budget = BranchBudget(config.branches.max_branch_rows if config.branches else None)
        self.branch_table: dict[str, BranchEntry] = {}
        self.idle_slot_ttl_s, self.clock = config.idle_slot_ttl_s, clock
        self.evicted = 0  # sequences whose slot was reclaimed for idleness
        self._pending: _Pending | None = None  # what after_step() has to do for the last step

    @classmethod
    def from_checkpoint(cls, head_dir: str | Path, target_dir: str | Path | None = None,
                        config: DrafterEngineConfig | None = None, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> DrafterEngine:
        from actors.eagle.checkpoint import load_head  # safetensors: only for engines built from files

        return cls(load_head(head_dir, target_dir, dtype=dtype or torch.float32), config, device=device, dtype=dtype)

    @property
    def num_active_sequences(self) -> int:
        return self.cache.num_active

    def discard_step(self, req_ids: list[str]) -> None:
        """The step just drafted must not count (its rows were not the verifier's): what ``after_step`` would do for
        it dropped, and its sequences freed (their cache holds those rows)."""
        self._pending = None
        self.free(req_ids)

    def free(self, req_ids: list[str]) -> None:
        self.cache.free(req_ids)
        for rid in req_ids:
            self.branch_table.pop(rid, None)
            self.seq_tokens.pop(rid, None)

    # --- prefix cache ---------------------------------------------------------------------------------
    def _store(self, block_size: int) -> PrefixBlockStore | None:
        """The prefix cache for blocks of ``block_size`` (the first block size a step names; None: off, or
        another size)."""
        if self.prefix_store is None and self.prefix_cache_bytes > 0 and block_size > 0:
            spec = self.spec
            per_block = PrefixBlockStore.bytes_per_block(spec.num_layers, block_size, spec.num_kv_heads,
                                                         spec.head_dim, self.dtype)
            if self.prefix_cache_bytes >= per_block:
                self.prefix_store = PrefixBlockStore(spec.num_layers, block_size, spec.num_kv_heads, spec.head_dim,
                                                     self.prefix_cache_bytes // per_block, self.dtype, self.device)
        store = self.prefix_store
        return store if store is not None and store.block_size == block_size else None

    def _prefix_start(self, rid: str, slot: int, prompt: np.ndarray, block_size: int, start: int) -> None:
        """A new sequence whose prompt came with its first step: track its tokens and, when vLLM skipped
        [0, start) (its own prefix-cache hit), copy what this drafter caches of that prefix into its slot."""
        store = self._store(block_size)
        if store is None:
            return
        t = self.seq_tokens[rid] = SeqTokens(int(prompt.shape[0]), prompt.tolist(), block_size)
        if start <= 0:
            return
        blocks = store.longest(t.hashes_up_to(min(start, self.cache.max_len) // block_size))
        store.copy_into(blocks, self.cache.k, self.cache.v, slot)
        known = len(blocks) * block_size
        self.cache.restore_prefix(slot, known, start)
        t.stored = len(blocks)
        t.broken = known < start  # a gap: the blocks past it were drafted without their whole context
        hit, miss = known, start - known
        self.prefix_hit_tokens += hit
        self.prefix_miss_tokens += miss
        self._prefix_unreported[0] += hit
        self._prefix_unreported[1] += miss

    def _prefix_store_rows(self, step: DraftStep, slots: torch.Tensor) -> None:
        """After a context pass: the tracked sequences' new tokens, and their blocks now whole, into the store."""
        for i, s in enumerate(step.seqs):
            t = self.seq_tokens.get(s.req_id)
            if t is None or t.broken:
                continue
            t.add_rows(s.start_position, step.input_ids[s.start : s.start + s.num_tokens])
            slot = int(slots[i])
            store = self.prefix_store
            if t.broken or store is None or not self.cache.full_context(slot):
                continue
            whole = int(self.cache.next_pos[slot]) // t.block_size
            if whole > t.stored:
                hashes = t.hashes_up_to(whole)
                for b in range(t.stored, len(hashes)):
                    store.put(hashes[b], self.cache.k, self.cache.v, slot, b * t.block_size)
                store.touch(hashes)
                t.stored = max(t.stored, len(hashes))

    def take_prefix_counts(self) -> tuple[int, int]:
        """(hit, miss) prefix tokens since the last call (what a ``DraftResult`` reports)."""
        counts, self._prefix_unreported = tuple(self._prefix_unreported), [0, 0]
        return counts

    def evict_idle(self, keep: set[str]) -> list[str]:
        """Free the sequences idle past ``idle_slot_ttl_s``, except ``keep`` (those of the step at hand)."""
        if self.idle_slot_ttl_s is None:
            return []
        idle = self.cache.evict_idle(self.clock() - self.idle_slot_ttl_s, keep)
        for rid in idle:
            self.branch_table.pop(rid, None)
            self.seq_tokens.pop(rid, None)
        self.evicted += len(idle)
        return idle

    @torch.inference_mode()
    def probe(self) -> tuple[int, int]:
        """A health check: one row through the head and one draft token from it, attending to that row alone, so
        it takes no slot of the draft KV cache (never counted as a sequence, never refused when the cache is
        full) and leaves the branch table and a pending ``after_step`` alone. Returns the drafts' shape."""
        dev = self.device
        ids = torch.zeros(1, dtype=torch.long, device=dev)
        hidden = torch.zeros(1, self.spec.fused_hidden_size, dtype=self.dtype, device=dev)
        everything = torch.ones(1, 1, 1, dtype=torch.bool, device=dev)

        def attend(layer: int, q, k, v, positions) -> torch.Tensor:  # q [1, heads, hd]; k, v [1, kv_heads, hd]
            return sdpa_attend(q[:, None], k[:, None], v[:, None], everything)[:, 0]  # [1, heads * hd]

        out, _ = self.head(ids, self.head.combine(hidden), torch.zeros(1, dtype=torch.long, device=dev), attend)
        drafts = self.head.to_target_ids(self.head.draft_logits(out).argmax(-1))[:, None]  # [1, 1]
        return tuple(drafts.shape)

    def no_room(self, step: DraftStep) -> list[int]:
        """The sequences of ``step`` (indices) this drafter has no room for: those whose drafting would reach
        past ``max_model_len`` (k - 1 positions past the last row; 2k with branches), then new ones once every
        slot is taken (in step order). They get no drafts, and any draft state they had here is dropped."""
        k = step.num_speculative_tokens
        reach = 2 * k if self.branch_config is not None and k else max(k - 1, 0)
        too_long = [i for i, s in enumerate(step.seqs)
                    if s.start_position + s.num_tokens - 1 + reach >= self.max_model_len]
        slot_of = self.cache.slot_of
        room = self.cache.max_slots - self.cache.num_active + sum(step.seqs[i].req_id in slot_of for i in too_long)
        full, skip = [], set(too_long)
        for i, s in enumerate(step.seqs):
            if i in skip:
                full.append(i)
            elif s.req_id not in slot_of:
                if room > 0:
                    room -= 1
                else:
                    full.append(i)
        return full

    def _draft_with_room(self, step: DraftStep, hidden: torch.Tensor, full: list[int], precompute: bool
                           ) -> TensorDrafts:
        """``draft_tensors`` for the sequences that have room; placeholder drafts (zeros) for ``full``."""
        self.free([step.seqs[i].req_id for i in full])
        refused = set(full)
        keep = [i for i in range(len(step.seqs)) if i not in refused]
        drafts = torch.zeros(len(step.seqs), step.num_speculative_tokens, dtype=torch.long)
        if not keep:
            return TensorDrafts(drafts, full_seqs=full)
        sub, rows = step.select(keep)
        p = self.draft_tensors(sub, hidden[torch.from_numpy(rows)], precompute)
        drafts[keep] = p.drafts
        return TensorDrafts(drafts, p.cold, [keep[i] for i in p.hit_seqs], p.branch_lookups, full)

    def _pass(self, ids, hidden, batch: _Batch, mm: tuple[torch.Tensor, torch.Tensor] | None = None):
        attend = CacheAttention(self.cache, batch, self.chunks, self.attention_backend)
        return self.head(ids, hidden, batch.on_device["positions"], attend, mm=mm)

    def _mm_inputs(self, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's multimodal rows and embeddings on the device (None for a text-only step)."""
        if not step.num_mm_rows:
            return None
        emb = decode_hidden(step.mm_embeds, step.hidden_dtype, copy=True)  # the message's buffer is read-only
        rows = torch.from_numpy(np.asarray(step.mm_rows, dtype=np.int64)).to(self.device)
        return rows, emb.to(self.device, self.dtype)

    def _claim_slots(self, step: DraftStep) -> tuple[torch.Tensor, int]:
        """Each sequence's cache slot [B] (CPU), new ones allocated (and their cached prefix copied in), and how
        many arrived mid-stream."""
        slot_of = self.cache.slot_of
        new = [i for i, s in enumerate(step.seqs) if s.req_id not in slot_of and s.req_id in step.prompts]
        prefixed = {step.seqs[i].req_id for i in new} if self._store(step.block_size) is not None else set()
        slots, cold = self.cache.slots_for([s.req_id for s in step.seqs], [s.start_position for s in step.seqs],
                                           self.clock(), prefixed)
        for i in new:
            s = step.seqs[i]
            self._prefix_start(s.req_id, int(slots[i]), step.prompts[s.req_id], step.block_size, s.start_position)
        return slots, cold

    def _rows_written(self, step: DraftStep, slots: torch.Tensor, last_positions: torch.Tensor) -> None:
        """After a context pass: the slots' real rows end at ``last_positions`` [B]; whole blocks go to the prefix
        cache."""
        self.cache.wrote(slots, last_positions)
        if self.seq_tokens:
            self._prefix_store_rows(step, slots)

    def _decode_step(self, step: DraftStep, hidden: torch.Tensor) -> TensorDrafts:
        """A decode step through the fixed-shape passes (``actors.drafter.decode_step``)."""
        slots, cold = self._claim_slots(step)
        drafts, last_positions = self.decode.run(step, hidden, slots)
        self._rows_written(step, slots, last_positions)
        return TensorDrafts(drafts, cold)

    def _context(self, step: DraftStep, hidden: torch.Tensor) -> tuple[_Chain, int]:
        """Pass 0: all rows of all sequences at once, writing their K/V; each sequence's last row starts a chain."""
        num_seqs = len(step.seqs)
        slots, cold = self._claim_slots(step)
        counts = torch.tensor([s.num_tokens for s in step.seqs])
        starts = torch.tensor([s.start for s in step.seqs])
        first_pos = torch.tensor([s.start_position for s in step.seqs])
        row_seq = torch.repeat_interleave(torch.arange(num_seqs), counts)
        row_local = torch.arange(step.num_tokens) - starts[row_seq]
        positions = (first_pos[row_seq] + row_local).clamp(max=self.max_model_len - 1)
        batch = _Batch(slots, row_seq, row_local, positions, int(counts.max()), self.device)
        ids = torch.from_numpy(step.input_ids.astype(np.int64)).to(self.device)
        out, fed = self._pass(ids, self.head.combine(hidden.to(self.device, self.dtype)), batch, self._mm_inputs(step))
        last = starts + counts - 1
        self._rows_written(step, slots, positions[last])
        last_d = last.to(self.device)
        chain = _Chain([s.req_id for s in step.seqs], slots, positions[last],
                       [self.head.draft_logits(out[last_d])], [fed[last_d]])
        return chain, cold

    def _chain_pass(self, chain: _Chain, j: int) -> None:
        """Pass j + 1: position L + j + 1, input T_j+1, feature f_j+1 -> logits_j+1, f_j+2."""
        num_seqs = len(chain.req_ids)
        pos = (chain.last_pos + j + 1).clamp(max=self.max_model_len - 1)
        b = _Batch(chain.slots, torch.arange(num_seqs), torch.zeros(num_seqs, dtype=torch.long), pos, 1, self.device)
        out, fed = self._pass(chain.tokens[j], chain.feats[j], b)
        chain.logits.append(self.head.draft_logits(out))
        chain.feats.append(fed)

    def _draft_chain(self, chain: _Chain, k: int, forced: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Choose T_1..T_k (greedy, or ``forced`` ([B, k] target ids, [B, k] draft ids)), with k - 1 passes."""
        for j in range(k):
            if forced is None:
                d = chain.logits[j].argmax(-1)
                t = self.head.to_target_ids(d)
            else:
                t, d = forced[0][:, j], forced[1][:, j]
            chain.tokens.append(t)
            chain.draft_ids.append(d)
            if j + 1 < k:
                self._chain_pass(chain, j)

    def _branches(self, chains: list[_Chain], k: int) -> dict[str, BranchEntry]:
        """For every sequence of ``chains`` (each having served s = len(chain.tokens) drafts): the extra pass s
        (when s > 0), the guesses, then every branch of every sequence in k batched passes; fills and returns
        the sequences' ``branch_table`` entries."""
        num_seqs = sum(len(c.req_ids) for c in chains)
        rows: list[tuple[_Chain, torch.Tensor, torch.Tensor, int]] = []  # (chain, outcome a, guess y, n)
        for chain in chains:
            s = len(chain.tokens)
            n = self.branch_config.branches_per_sequence(s, num_seqs, self.branch_budget.rows)
            if n == 0:
                for rid in chain.req_ids:
                    self.branch_table.pop(rid, None)
                continue
            if s:
                self._chain_pass(chain, s - 1)
            logits = torch.stack(chain.logits[: s + 1], dim=1)  # [B, s + 1, draft_vocab]
            served = (torch.stack(chain.draft_ids, dim=1) if s
                      else torch.zeros(len(chain.req_ids), 0, dtype=torch.long, device=logits.device))
            outcome, guess = guesses(logits, served, self.branch_config, n)  # [B, n] each
            rows.append((chain, outcome.cpu(), guess, outcome.shape[1]))
        if not rows:
            return {}
        slots, base, first, feats = [], [], [], []
        for chain, outcome, guess, n in rows:
            seq = torch.arange(len(chain.req_ids)).repeat_interleave(n)
            a = outcome.flatten()
            slots.append(chain.slots[seq])
            base.append(chain.last_pos[seq] + a)  # [R] L + a
            first.append(self.head.to_target_ids(guess.flatten()))  # [R] y
            feats.append(torch.stack(chain.feats, dim=1)[seq.to(self.device), a.to(self.device)])  # [R, hidden] f_a+1
        base_all, slots_all = torch.cat(base), torch.cat(slots)
        tok, hid = torch.cat(first), torch.cat(feats)
        if self.branch_passes is not None and self.branch_passes.accepts(len(base_all), k):
            table = self.branch_passes.run(slots_all, base_all, tok, hid, k).tolist()  # [R, k]
        else:
            attend = BranchAttention(self.cache, slots_all, base_all, self.chunks)
            drafts = []
            for i in range(k):
                pos = (base_all + 1 + i).clamp(max=self.max_model_len - 1).to(self.device)
                out, hid = self.head(tok, hid, pos, attend)
                tok = self.head.greedy(out)
                drafts.append(tok)
            table = torch.stack(drafts, dim=1).tolist()  # [R, k]
        made: dict[str, BranchEntry] = {}
        r = 0
        for (chain, outcome, _, n), y in zip(rows, first, strict=True):
            served_tokens = torch.stack(chain.tokens, dim=1).tolist() if chain.tokens else [[]] * len(chain.req_ids)
            outcomes, ys, last = outcome.tolist(), y.view(-1, n).tolist(), chain.last_pos.tolist()
            for b, rid in enumerate(chain.req_ids):
                branches = {(a, yy): table[r + j] for j, (a, yy) in enumerate(zip(outcomes[b], ys[b], strict=True))}
                made[rid] = self.branch_table[rid] = BranchEntry(last[b], served_tokens[b], branches)
                r += n
        return made

    @torch.inference_mode()
    def draft_tensors(
        self,
        step: DraftStep,
        hidden: torch.Tensor,  # [N, fused_hidden_size]
        precompute: bool = True,
    ) -> TensorDrafts:
        """Drafts for every sequence of the step. With branches: sequences whose outcome was precomputed are
        answered at once (hits), ``SeqRole.CONTEXT`` sequences get no drafts, the rest are drafted now, and
        ``after_step`` is left to do the rest (``precompute``). A step that does not hold up (``DraftStep.validate``)
        raises ``BadStep`` before anything changes here."""
        if hidden.ndim != 2:
            raise BadStep(f"draft step: hidden must be [rows, width], got {list(hidden.shape)}")
        step.validate(hidden.shape[0], hidden.shape[1], self.spec.fused_hidden_size, self.spec.vocab_size,
                      self.max_k, embed_width=self.spec.hidden_size)
        if self._pending is not None:
            self.after_step()
        self.free(step.finished)
        self.evict_idle({s.req_id for s in step.seqs})
        k = step.num_speculative_tokens
        num_seqs = len(step.seqs)
        if num_seqs == 0:
            return TensorDrafts(torch.zeros(0, k, dtype=torch.long))
        full = self.no_room(step)
        if full:
            return self._draft_with_room(step, hidden, full, precompute)
        if self.branch_config is None or k == 0:
            if self.decode is not None and self.decode.accepts(step):
                return self._decode_step(step, hidden)
            chain, cold = self._context(step, hidden)
            self._draft_chain(chain, k)
            drafts = torch.stack(chain.tokens, dim=1).cpu() if k else torch.zeros(num_seqs, 0, dtype=torch.long)
            return TensorDrafts(drafts, cold)

        drafts = torch.zeros(num_seqs, k, dtype=torch.long)
        found = BranchTable(self.branch_table).lookup(step)
        hits, misses, context = found.hits, found.misses, found.context
        cold, pending = 0, _Pending(k)
        if misses:
            sub, rows = step.select(misses)
            miss_chain, cold = self._context(sub, hidden[torch.from_numpy(rows)])
            self._draft_chain(miss_chain, k)
            drafts[misses] = torch.stack(miss_chain.tokens, dim=1).cpu()
            pending.chains.append(miss_chain)
        if hits:
            drafts[hits] = torch.tensor(found.drafts, dtype=torch.long)
            sub, rows = step.select(hits)
            pending.fold = _Rows(sub, hidden[torch.from_numpy(rows)].clone(), drafts[hits])
        if context:
            sub, rows = step.select(context)
            pending.context = _Rows(sub, hidden[torch.from_numpy(rows)].clone())
        self._pending = pending if precompute else None
        return TensorDrafts(drafts, cold, hits, found.lookups)

    @torch.inference_mode()
    def after_step(self) -> dict[str, BranchEntry]:
        """Off the critical path: fold the real hidden states of sequences answered from a branch into the
        cache (and replay their served drafts), add the rows of ``CONTEXT`` sequences, then draft the next
        step's branches for every sequence of the step. Returns those sequences' new branch entries."""
        if self._pending is None:
            return {}
        start = time.perf_counter()
        p, self._pending = self._pending, None
        chains = list(p.chains)
        if p.fold is not None:
            chain, _ = self._context(p.fold.step, p.fold.hidden)
            served = p.fold.served.to(self.device)
            self._draft_chain(chain, p.k, forced=(served, self.head.to_draft_ids(served)))
            chains.append(chain)
        if p.context is not None:
            chain, _ = self._context(p.context.step, p.context.hidden)  # s = 0: nothing was served
            chains.append(chain)
        made = self._branches(chains, p.k)
        rows = sum(len(entry.drafts) for entry in made.values())
        self.branch_budget.branches_done(time.perf_counter(), ms_since(start, self.device), rows)
        return made

    def draft(self, step: DraftStep, hidden: np.ndarray, precompute: bool = True) -> DraftResult:
        """``draft_tensors`` for a step and its hidden states as they came over the wire (checked first:
        ``DraftStep.check_hidden``)."""
        start = time.perf_counter()
        self.branch_budget.step_arrived(start, len(step.seqs))
        step.check_hidden(hidden)
        p = self.draft_tensors(step, decode_hidden(hidden, step.hidden_dtype), precompute)
        hit, miss = self.take_prefix_counts()
        return DraftResult(
            step.step_id, DraftStatus.OK, p.drafts.to(torch.int32).cpu().numpy(), ms_since(start, self.device),
            active_sequences=self.num_active_sequences, cold_sequences=p.cold, branch_lookups=p.branch_lookups,
            hit_seqs=list(p.hit_seqs), full_seqs=list(p.full_seqs), prefix_hit_tokens=hit, prefix_miss_tokens=miss,
        )
