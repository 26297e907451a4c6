"""A synchronous decode step with shapes that do not change from step to step, replayed from CUDA graphs on CUDA.

Where it sits: ``actors.drafter.engine.DrafterEngine.draft_tensors`` hands it a decode step (every sequence ships at
most ``max_k + 1`` rows: accepted drafts and the bonus or recovered token) once the engine has claimed the
sequences' cache slots; it returns the drafts. Prefill steps, steps with images, pipelined drafting's on-demand
misses (its branch passes: ``actors.drafter.branch_passes``) and batches past the largest captured size take the
engine's eager passes instead (the same head, the same attention kernel).

One step for B sequences of at most R rows, on persistent buffers (``_Buffers``):

1. the host packs the step's small integers (token ids, positions, slots, which rows are real) into one pinned
   buffer and its hidden rows into one of two pinned staging buffers (alternating); one ``non_blocking`` copy each;
2. on the device, with no host value read until the drafts: the batch is padded to a captured size ``Bp`` (vLLM's
   ladder: 1, 2, 4, then steps of 8) and its rows to ``[Bp, R]``; the context pass writes every real row's K/V
   into its slot and attends (``actors.drafter.slot_attention``); each sequence's last real row gives draft 1;
   k - 1 chain passes follow at positions last + 1, last + 2, ..., each a tensor computed from the last one;
3. the drafts ``[B, k]`` come back in one copy.

Padding: a padding row (a sequence with fewer than R rows, or a padding sequence past B) writes its K/V at position
``max_len - 1`` of its slot (slot 0 for padding sequences), a position the engine never uses (real positions are
clamped to ``max_model_len - 1 = max_len - 2``), and attends to nothing. Worked example, R = 3, max_len = 65:
sequence 0 ships rows at positions [7, 8], sequence 1 one row at 20 -> write positions [[7, 8, 64], [20, 64, 64]],
query positions [[7, 8, -1], [20, -1, -1]], last rows [1, 3] (flat index b * R + rows - 1).

Graphs (``actors.drafter.cuda_graphs``) are keyed by (Bp, R, k) and, for the ``torch`` attention backend, the key
width it reads, and replay while positions and lengths grow in place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from actors.drafter.cuda_graphs import GraphRunner
from actors.drafter.kv_cache import DraftKVCache
from actors.drafter.slot_attention import Backend, SlotRows, slot_attention
from actors.eagle.heads import DraftHead
from actors.messages import DraftStep


def batch_sizes(largest: int) -> list[int]:
    """Captured batch sizes: 1, 2, 4, then steps of 8 up to ``largest`` (vLLM's ladder)."""
    return sorted({s for s in (1, 2, 4) if s <= largest} | set(range(8, largest + 1, 8)) | {largest})


# The per-row and per-sequence integer fields of one step, in the order they lie in the one metadata buffer.
ROW_FIELDS = ("ids", "row_src", "write_pos", "q_pos", "write_slot")  # [Bp * R] each
SEQ_FIELDS = ("slot", "known_from", "gap_lo", "gap_hi", "last_row", "last_pos")  # [Bp] each


class PinnedInts:
    """Named int64 fields, each a fixed view of one device buffer and of its pinned host mirror: filled on the host
    (``put``), they cross to the device in one ``non_blocking`` copy (``upload``)."""

    def __init__(self, sizes: dict[str, int], device: torch.device) -> None:
        total = sum(sizes.values())
        self.device_buffer = torch.zeros(total, dtype=torch.long, device=device)
        self.host_buffer = torch.zeros(total, dtype=torch.long, pin_memory=device.type == "cuda")
        self.fields: dict[str, torch.Tensor] = {}  # device views
        self.host: dict[str, np.ndarray] = {}  # numpy views of the pinned mirror
        offset = 0
        for name, size in sizes.items():
            self.fields[name] = self.device_buffer[offset : offset + size]
            self.host[name] = self.host_buffer[offset : offset + size].numpy()
            offset += size

    def put(self, name: str, values: np.ndarray, padded: int, pad: int = 0) -> None:
        """``values`` [n] into the first n entries of field ``name``, ``pad`` in the rest up to ``padded``."""
        field = self.host[name]
        field[:padded] = pad
        field[: len(values)] = values

    def put_slots(self, cache: DraftKVCache, slots: torch.Tensor, padded: int) -> None:
        """Fields ``slot``, ``known_from``, ``gap_lo``, ``gap_hi`` of these slots [n] (CPU): what attention reads
        (``SlotRows``); padding entries 0."""
        self.put("slot", slots.numpy(), padded)
        for name in ("known_from", "gap_lo", "gap_hi"):
            self.put(name, getattr(cache, name)[slots].numpy(), padded)

    def upload(self) -> None:
        self.device_buffer.copy_(self.host_buffer, non_blocking=True)


def read_back(drafts: torch.Tensor, drafts_host: torch.Tensor, num: int, k: int) -> torch.Tensor:
    """The first ``num`` rows, ``k`` columns of a persistent device buffer of drafts, on the host: one copy of whole
    rows into its pinned mirror, then the one wait of the step."""
    if drafts.device.type != "cuda":
        return drafts[:num, :k].clone()
    drafts_host[:num].copy_(drafts[:num], non_blocking=True)  # cuda-only
    torch.cuda.current_stream(drafts.device).synchronize()  # cuda-only
    return drafts_host[:num, :k].clone()  # cuda-only


class _Buffers:
    """Persistent device buffers for up to ``max_batch`` sequences of ``max_rows`` rows, and their pinned host
    mirrors."""

    def __init__(self, max_batch: int, max_rows: int, hidden_width: int, max_k: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.max_batch, self.max_rows = max_batch, max_rows
        rows = max_batch * max_rows
        pinned = device.type == "cuda"
        self.meta = PinnedInts({**dict.fromkeys(ROW_FIELDS, rows), **dict.fromkeys(SEQ_FIELDS, max_batch)}, device)
        self.hidden = torch.zeros(rows, hidden_width, dtype=dtype, device=device)  # [rows, fused_hidden_size]
        # Two pinned staging buffers, alternating: a step's rows are copied in while the last one's copy may run.
        self.staging = [torch.zeros(rows, hidden_width, dtype=dtype, pin_memory=True) for _ in range(2)] \
            if pinned else []
        self.next_staging = 0
        self.drafts = torch.zeros(max_batch, max_k, dtype=torch.long, device=device)  # [max_batch, max_k]
        self.drafts_host = torch.zeros(max_batch, max_k, dtype=torch.long, pin_memory=pinned)


@dataclass(frozen=True)
class StepShape:
    """What a captured graph is specialised to."""

    batch: int  # Bp: sequences, padded to a captured size
    rows: int  # R: rows per sequence
    k: int  # draft tokens
    width: int | None  # keys each sequence reads (the torch backend only; None: the whole key range, in place)


class DecodeStep:
    def __init__(self, head: DraftHead, cache: DraftKVCache, chunks: dict[int, int | None], *, max_model_len: int,
                 max_k: int, backend: Backend, use_graphs: bool, max_batch: int, device: str | torch.device,
                 dtype: torch.dtype) -> None:
        """``max_batch``: the largest batch it takes (captured on CUDA); ``use_graphs``: replay CUDA graphs (else
        the same passes run eagerly, as on a CPU)."""
        self.head, self.cache, self.chunks = head, cache, chunks
        self.max_model_len, self.max_k, self.backend = max_model_len, max_k, backend
        self.device = torch.device(device)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.sizes = batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.buffers = _Buffers(self.max_batch, max_k + 1, head.spec.fused_hidden_size, max_k, dtype, self.device)
        self.graphs = GraphRunner(self._forward, cache, self.device) if self.use_graphs else None
        self.steps = 0  # steps run (tests read it; graphs.captures / graphs.replays: CUDA graphs)
        self.started_at = self.launched_at = 0.0  # perf_counter as the last step came in, and once its device work
        #                                           was all launched (the device check reads them)

    def accepts(self, step: DraftStep) -> bool:
        """Whether this step is a decode step it can run: 1 <= k <= max_k, no images, at most ``max_batch``
        sequences of at most ``max_k + 1`` rows each."""
        k = step.num_speculative_tokens
        return (1 <= k <= self.max_k and 0 < len(step.seqs) <= self.max_batch and not step.num_mm_rows
                and max(s.num_tokens for s in step.seqs) <= self.max_k + 1)

    def shape_of(self, step: DraftStep) -> StepShape:
        batch = next(s for s in self.sizes if s >= len(step.seqs))
        rows = max(s.num_tokens for s in step.seqs)
        width = None
        if self.backend == "torch":  # keys [0, width): past every position this step reads, rounded up
            reach = max(s.start_position + s.num_tokens for s in step.seqs) + step.num_speculative_tokens
            width = min(max(64, 1 << (reach - 1).bit_length()), self.cache.max_len)
        return StepShape(batch, rows, step.num_speculative_tokens, width)

    def run(
        self,
        step: DraftStep,
        hidden: torch.Tensor,  # [N, fused_hidden_size] on the host
        slots: torch.Tensor,  # [B] each sequence's cache slot (claimed by the engine)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, k] target ids, [B] each sequence's last real position), CPU
        self.started_at = time.perf_counter()
        shape = self.shape_of(step)
        self.steps += 1
        last_pos = self._pack(step, slots, shape)
        self._stage_hidden(hidden)
        if self.graphs is not None:
            self.graphs.run(shape)  # cuda-only
        else:
            self._forward(shape)
        self.launched_at = time.perf_counter()  # the host's part of the step ends here (the device check reads it)
        return read_back(self.buffers.drafts, self.buffers.drafts_host, len(step.seqs), shape.k), last_pos

    # --- host side ----------------------------------------------------------------------------------------------
    def _pack(self, step: DraftStep, slots: torch.Tensor, shape: StepShape) -> torch.Tensor:
        """Fill the pinned metadata for ``shape`` (module docstring's worked example) and copy it to the device.
        Returns each sequence's last real position [B] (CPU)."""
        num_seqs, bp, r = len(step.seqs), shape.batch, shape.rows
        meta = self.buffers.meta
        f = meta.host
        trash = self.cache.max_len - 1
        counts = np.fromiter((s.num_tokens for s in step.seqs), np.int64, num_seqs)
        starts = np.fromiter((s.start for s in step.seqs), np.int64, num_seqs)
        first = np.fromiter((s.start_position for s in step.seqs), np.int64, num_seqs)
        slot_np = slots.numpy()
        local = np.arange(r)
        real = local[None, :] < counts[:, None]  # [B, R]
        pos = np.minimum(first[:, None] + local, self.max_model_len - 1)  # [B, R]
        n = bp * r
        ids, row_src, write_pos, q_pos, write_slot = (f[name][:n].reshape(bp, r) for name in ROW_FIELDS)
        ids[:] = 0
        src = (starts[:, None] + local)[real]  # each real row's index in the step's flat rows
        ids[:num_seqs][real] = step.input_ids[src]
        row_src[:] = 0
        row_src[:num_seqs][real] = src
        write_pos[:] = trash
        write_pos[:num_seqs] = np.where(real, pos, trash)
        q_pos[:] = -1
        q_pos[:num_seqs] = np.where(real, pos, -1)
        write_slot[:] = 0
        write_slot[:num_seqs] = slot_np[:, None]
        meta.put_slots(self.cache, slots, bp)
        last = pos[np.arange(num_seqs), counts - 1]
        f["last_row"][:bp] = np.arange(bp) * r
        f["last_row"][:num_seqs] += counts - 1
        meta.put("last_pos", last, bp, pad=-1)
        meta.upload()
        return torch.from_numpy(last.copy())

    def _stage_hidden(self, hidden: torch.Tensor) -> None:
        buf, n = self.buffers, hidden.shape[0]
        if not buf.staging:
            buf.hidden[:n].copy_(hidden)
            return
        stage = buf.staging[buf.next_staging]
        buf.next_staging ^= 1
        stage[:n].copy_(hidden)
        buf.hidden[:n].copy_(stage[:n], non_blocking=True)

    # --- device side ---------------------------------------------------------------------------------------------
    def _forward(self, shape: StepShape) -> None:
        """The step's passes over the buffers' views for ``shape``; drafts into ``buffers.drafts[:Bp, :k]``."""
        bp, r, k = shape.batch, shape.rows, shape.k
        f, n, head = self.buffers.meta.fields, shape.batch * shape.rows, self.head
        seq = {name: f[name][:bp] for name in SEQ_FIELDS}
        rows = SlotRows(seq["slot"], f["q_pos"][:n].view(bp, r), seq["known_from"], seq["gap_lo"], seq["gap_hi"])
        attend = StepAttention(self.cache, self.chunks, self.backend, f["write_slot"][:n], f["write_pos"][:n], rows,
                               shape.width)
        hidden = self.buffers.hidden.index_select(0, f["row_src"][:n])  # [Bp * R, fused_hidden_size]
        out, fed = head(f["ids"][:n], head.combine(hidden), f["write_pos"][:n], attend)
        out, fed = out.index_select(0, seq["last_row"]), fed.index_select(0, seq["last_row"])  # [Bp, hidden]
        last_pos, real = seq["last_pos"], seq["last_pos"] >= 0
        tokens = []
        for j in range(k):
            tokens.append(head.greedy(out))  # [Bp] target ids
            if j + 1 < k:
                pos = torch.where(real, (last_pos + j + 1).clamp(max=self.max_model_len - 1), self.cache.max_len - 1)
                rows = SlotRows(seq["slot"], torch.where(real, pos, -1)[:, None], seq["known_from"], seq["gap_lo"],
                                seq["gap_hi"])
                attend = StepAttention(self.cache, self.chunks, self.backend, seq["slot"], pos, rows, shape.width)
                out, fed = head(tokens[-1], fed, pos, attend)
        self.buffers.drafts[:bp, :k].copy_(torch.stack(tokens, dim=1))


class StepAttention:
    """``AttendFn`` of one fixed-shape pass: write the rows' K/V into the cache, then ``slot_attention`` over it.
    ``rows.q_pos`` is ``[B, R]``: the pass's ``B * R`` query rows, sequence by sequence."""

    def __init__(self, cache: DraftKVCache, chunks: dict[int, int | None], backend: Backend,
                 write_slots: torch.Tensor,  # [B * R]
                 write_pos: torch.Tensor,  # [B * R]
                 rows: SlotRows, width: int | None) -> None:
        self.cache, self.chunks, self.backend = cache, chunks, backend
        self.write_slots, self.write_pos, self.rows, self.width = write_slots, write_pos, rows, width

    def __call__(self, layer: int, q, k, v, positions) -> torch.Tensor:  # q [B * R, heads, hd] -> [B * R, h * hd]
        self.cache.write(layer, self.write_slots, self.write_pos, k, v)
        num_seqs, num_rows = self.rows.q_pos.shape
        out = slot_attention(q.view(num_seqs, num_rows, *q.shape[1:]), self.cache.k[layer], self.cache.v[layer],
                             self.rows, self.chunks[layer], self.backend, self.width)
        return out.view(num_seqs * num_rows, -1)
