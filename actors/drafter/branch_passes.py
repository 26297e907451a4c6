"""Pipelined drafting's branch passes on fixed-shape buffers, replayed from CUDA graphs on CUDA.

Where it sits: ``actors.drafter.engine.DrafterEngine._branches`` has chosen the branches of a step's sequences
(notation: ``actors.drafter.branches``): R rows, each a branch point L+a of a sequence, its first input y and feature
f_a+1. Here the k passes draft each branch's k tokens: pass i writes every branch's row at position L+a+1+i and
attends to its sequence's cache up to L+a and to its own rows so far.

Branches of one sequence would overwrite each other's rows in the sequence's slot, so each branch row r writes into
scratch slot r of the cache (``DraftKVCache.scratch_slots``) and reads keys past L+a from there
(``SlotRows.scratch``): one attention call over two slots, no copies, no mask, shapes fixed by the padded row count
(``decode_step.batch_sizes``). Padding rows write position ``max_len - 1`` of their own scratch slot and attend to
nothing. On a GPU a pass over 128 rows costs about what one over 2 rows costs (the weights are read once either way),
which is what makes a wide fan-out of branches nearly free.
"""

from __future__ import annotations

import numpy as np
import torch

from actors.drafter.cuda_graphs import GraphRunner
from actors.drafter.decode_step import PinnedInts, StepAttention, batch_sizes, read_back
from actors.drafter.kv_cache import DraftKVCache
from actors.drafter.slot_attention import Backend, SlotRows
from actors.eagle.heads import DraftHead

FIELDS = ("slot", "base", "known_from", "gap_lo", "gap_hi", "scratch")  # [rows] int64 each, one buffer


class BranchPasses:
    def __init__(self, head: DraftHead, cache: DraftKVCache, chunks: dict[int, int | None], *, max_model_len: int,
                 max_k: int, backend: Backend, use_graphs: bool, device: str | torch.device,
                 dtype: torch.dtype) -> None:
        """Takes up to ``cache.scratch_slots`` branch rows a call (padded to ``batch_sizes``)."""
        self.head, self.cache, self.chunks = head, cache, chunks
        self.max_model_len, self.max_k, self.backend = max_model_len, max_k, backend
        self.device = torch.device(device)
        self.sizes = batch_sizes(cache.scratch_slots)
        rows = self.max_rows = self.sizes[-1]
        pinned = self.device.type == "cuda"
        self.meta = PinnedInts(dict.fromkeys(FIELDS, rows), self.device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=self.device)  # [rows] y (target ids)
        self.feats = torch.zeros(rows, head.spec.hidden_size, dtype=dtype, device=self.device)  # [rows, hidden]
        self.drafts = torch.zeros(rows, max_k, dtype=torch.long, device=self.device)  # [rows, max_k]
        self.drafts_host = torch.zeros(rows, max_k, dtype=torch.long, pin_memory=pinned)
        self.graphs = GraphRunner(self._forward, cache, self.device) if use_graphs and pinned else None
        self.calls = 0

    def accepts(self, num_rows: int, k: int) -> bool:
        return 0 < num_rows <= self.max_rows and 1 <= k <= self.max_k

    def run(
        self,
        slots: torch.Tensor,  # [R] each branch's sequence slot (CPU)
        base: torch.Tensor,  # [R] L+a: the last position of its sequence's slot a branch reads (CPU)
        first: torch.Tensor,  # [R] y, target ids (device)
        feats: torch.Tensor,  # [R, hidden_size] f_a+1 (device)
        k: int,
    ) -> torch.Tensor:  # [R, k] target ids (CPU)
        num, padded = slots.shape[0], next(s for s in self.sizes if s >= slots.shape[0])
        self.calls += 1
        meta = self.meta
        meta.put_slots(self.cache, slots, padded)
        meta.put("base", base.numpy(), padded, pad=-1)  # -1: a padding row
        meta.put("scratch", self.cache.scratch_slot(0) + np.arange(padded), padded)
        meta.upload()
        self.tokens[:num].copy_(first)
        self.feats[:num].copy_(feats)
        shape = (padded, k)
        if self.graphs is not None:
            self.graphs.run(shape)  # cuda-only
        else:
            self._forward(shape)
        return read_back(self.drafts, self.drafts_host, num, k)

    def _forward(self, shape: tuple[int, int]) -> None:
        """k passes over the buffers' first ``rows`` branch rows; drafts into ``drafts[:rows, :k]``."""
        rows, k = shape
        f = {name: t[:rows] for name, t in self.meta.fields.items()}
        real = f["base"] >= 0
        tok, hid, drafts = self.tokens[:rows], self.feats[:rows], []
        for i in range(k):
            pos = torch.where(real, (f["base"] + 1 + i).clamp(max=self.max_model_len - 1), self.cache.max_len - 1)
            q_pos = torch.where(real, pos, -1)[:, None]
            sees = SlotRows(f["slot"], q_pos, f["known_from"], f["gap_lo"], f["gap_hi"], scratch=f["scratch"],
                            scratch_from=f["base"] + 1)
            attend = StepAttention(self.cache, self.chunks, self.backend, f["scratch"], pos, sees, self.width)
            out, hid = self.head(tok, hid, pos, attend)
            tok = self.head.greedy(out)
            drafts.append(tok)
        self.drafts[:rows, :k].copy_(torch.stack(drafts, dim=1))

    @property
    def width(self) -> int | None:
        """Keys the torch backend reads: every position (a graph's width must not depend on the call); the Triton
        kernel reads each row's own range."""
        return self.cache.max_len if self.backend == "torch" else None
