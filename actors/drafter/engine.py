"""The drafter engine: proposes k draft tokens for a whole batch of sequences per verification step.

Where it sits: the verifier's proposer (``actors.verifier.proposer``) sends a ``DraftStep`` and the target
hidden states; ``DrafterEngine.propose`` returns a ``DraftResult``. No Ray, no Serve here: the Ray actor
wrapper is ``actors.drafter.actor``.

One step, for B sequences holding N new rows in all (see ``actors.messages`` for the row layout):

1. context pass: the head runs over all N rows at once (``hidden`` fused by ``combine`` for EAGLE-3),
   writing their K/V into each sequence's slot of the draft KV cache, attending over the cache;
2. the last row of each sequence gives draft token 1 (greedy) and the hidden state fed back;
3. k - 1 draft passes, one row per sequence, at positions last + 1, last + 2, ...

All of it is batched: the only Python loop is over the k draft positions.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from actors.drafter.kv_cache import DraftKVCache
from actors.eagle.checkpoint import load_head
from actors.eagle.heads import DraftHead
from actors.eagle.layers import sdpa_attend
from actors.messages import DraftResult, DraftStatus, DraftStep


@dataclass
class _Batch:
    """Padded view of a step: query rows of B sequences laid out as ``[B, max_rows]``."""

    slots: torch.Tensor  # [B]
    row_seq: torch.Tensor  # [N] sequence index of each flat row
    row_local: torch.Tensor  # [N] index of each row within its sequence
    positions: torch.Tensor  # [N]
    max_rows: int


class CacheAttention:
    """``AttendFn`` over the draft KV cache for one pass (writes the new rows, then attends).

    Keys are read per sequence from a window ``[lo, lo + width)`` of positions: from 0 for global layers, and
    for chunked-attention layers from the start of the chunk holding the sequence's first query row, so a
    decode pass at position 1000 with chunk 128 reads at most 128 keys, not 1000.
    """

    def __init__(self, cache: DraftKVCache, batch: _Batch, chunk_sizes: dict[int, int | None]) -> None:
        self.cache, self.b, self.chunks = cache, batch, chunk_sizes
        b = batch
        num_seqs = b.slots.numel()
        # Query positions, padded: [B, max_rows]; padding rows get position -1 (masked out below).
        self.q_pos = torch.full((num_seqs, b.max_rows), -1, dtype=torch.long)
        self.q_pos[b.row_seq, b.row_local] = b.positions
        self.first_pos = self.q_pos[:, 0]  # [B] rows of a sequence are consecutive positions
        self.last_pos = self.q_pos.max(dim=1).values  # [B]
        self._windows: dict[int | None, tuple[torch.Tensor, torch.Tensor]] = {}

    def window(self, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(key positions [B, width], mask [B, max_rows, width]) for layers with this chunk size."""
        if chunk not in self._windows:
            lo = (self.first_pos // chunk) * chunk if chunk else torch.zeros_like(self.first_pos)
            width = int((self.last_pos - lo).max()) + 1
            key_pos = lo[:, None] + torch.arange(width)  # [B, width]
            q = self.q_pos[:, :, None]
            k = key_pos[:, None, :]
            m = (k <= q) & (q >= 0) & (k >= self.cache.known_from[self.b.slots][:, None, None])
            if chunk:
                m &= (k // chunk) == (q // chunk)
            m[:, :, 0] |= self.q_pos < 0  # padding rows see one key, to keep softmax finite
            self._windows[chunk] = (key_pos.clamp(max=self.cache.max_len - 1), m)
        return self._windows[chunk]

    def __call__(self, layer: int, q, k, v, positions) -> torch.Tensor:
        b = self.b
        self.cache.write(layer, b.slots[b.row_seq], b.positions, k, v)
        key_pos, mask = self.window(self.chunks[layer])
        keys, values = self.cache.read_window(layer, b.slots, key_pos)
        num_seqs = b.slots.numel()
        qp = q.new_zeros(num_seqs, b.max_rows, *q.shape[1:])
        qp[b.row_seq, b.row_local] = q
        out = sdpa_attend(qp, keys.to(q.dtype), values.to(q.dtype), mask)
        return out[b.row_seq, b.row_local]  # [N, heads * head_dim]


class DrafterEngine:
    def __init__(
        self,
        head: DraftHead,
        max_model_len: int = 4096,
        max_num_seqs: int = 1024,
        device: str | torch.device = "cpu",
    ) -> None:
        self.head = head.to(device).eval()
        self.device = device
        spec = head.spec
        self.spec = spec
        self.max_model_len = max_model_len
        self.cache = DraftKVCache(
            spec.num_layers, spec.num_kv_heads, spec.head_dim, max_len=max_model_len + 1,
            max_slots=max_num_seqs, device=device,
        )
        self.chunks = {i: layer.self_attn.chunk_size for i, layer in enumerate(head.layers)}

    @classmethod
    def from_checkpoint(cls, head_dir: str | Path, target_dir: str | Path | None = None, **kw) -> DrafterEngine:
        return cls(load_head(head_dir, target_dir), **kw)

    @property
    def num_active_sequences(self) -> int:
        return self.cache.num_active

    def free(self, req_ids: list[str]) -> None:
        self.cache.free(req_ids)

    def _pass(self, ids, hidden, batch: _Batch):
        return self.head(ids, hidden, batch.positions, CacheAttention(self.cache, batch, self.chunks))

    @torch.inference_mode()
    def propose_tensors(
        self,
        step: DraftStep,
        hidden: torch.Tensor,  # [N, fused_hidden_size]
    ) -> tuple[torch.Tensor, int]:  # ([B, k] int64 draft token ids, sequences that arrived mid-stream)
        self.free(step.finished)
        k = step.num_speculative_tokens
        num_seqs = len(step.seqs)
        if num_seqs == 0:
            return torch.zeros(0, k, dtype=torch.long), 0
        step.validate(hidden.shape[0], hidden.shape[1], self.spec.fused_hidden_size)
        slots, cold = self.cache.slots_for([s.req_id for s in step.seqs], [s.start_position for s in step.seqs])
        counts = torch.tensor([s.num_tokens for s in step.seqs])
        starts = torch.tensor([s.start for s in step.seqs])
        first_pos = torch.tensor([s.start_position for s in step.seqs])
        row_seq = torch.repeat_interleave(torch.arange(num_seqs), counts)
        row_local = torch.arange(step.num_tokens) - starts[row_seq]
        positions = (first_pos[row_seq] + row_local).clamp(max=self.max_model_len - 1)
        batch = _Batch(slots, row_seq, row_local, positions, int(counts.max()))
        ids = torch.from_numpy(step.input_ids.astype(np.int64)).to(self.device)
        x = self.head.combine(hidden.to(self.device, torch.float32))
        out, fed = self._pass(ids, x, batch)
        last = starts + counts - 1
        drafts = [self.head.greedy(out[last])]
        hid, pos = fed[last], positions[last]
        one = torch.zeros(num_seqs, dtype=torch.long)
        for _ in range(k - 1):
            pos = (pos + 1).clamp(max=self.max_model_len - 1)
            b = _Batch(slots, torch.arange(num_seqs), one, pos, 1)
            out, hid = self._pass(drafts[-1], hid, b)
            drafts.append(self.head.greedy(out))
        return torch.stack(drafts, dim=1)[:, :k], cold  # k == 0: the context pass still ran, no drafts

    def propose(self, step: DraftStep, hidden: np.ndarray) -> DraftResult:
        start = time.perf_counter()
        with warnings.catch_warnings():  # a read-only view of the object store: we never write to it
            warnings.simplefilter("ignore", UserWarning)
            h = torch.from_numpy(hidden)
        if step.hidden_dtype == "bfloat16":
            h = h.view(torch.bfloat16)
        drafts, cold = self.propose_tensors(step, h)
        return DraftResult(
            step.step_id, DraftStatus.OK, drafts.to(torch.int32).cpu().numpy(), (time.perf_counter() - start) * 1e3,
            active_sequences=self.num_active_sequences, cold_sequences=cold,
        )
