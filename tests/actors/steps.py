"""Draft steps for the drafter engine's tests: sequences at given positions, random input ids and hidden rows."""

from __future__ import annotations

import numpy as np
import torch

from actors.messages import DraftStep, SeqSlice


def random_step(step_id: int, k: int, seqs: list[tuple[str, int, int]], width: int, seed: int = 0
                ) -> tuple[DraftStep, torch.Tensor]:
    """seqs: (req_id, first position, rows); random input ids (< 300) and hidden rows ([N, width])."""
    g = torch.Generator().manual_seed(seed)
    slices, off = [], 0
    for rid, pos, n in seqs:
        slices.append(SeqSlice(rid, off, n, pos))
        off += n
    ids = torch.randint(0, 300, (off,), generator=g).numpy().astype(np.int32)
    return DraftStep(step_id, k, slices, ids), torch.randn(off, width, generator=g)
