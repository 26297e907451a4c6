"""``LocalSpeculator``: a drafter engine in the verifier's own process, behind the same ``Speculator`` seam as the
drafter pool (``actors.verifier.speculator``). Synchronous drafting: every sequence is drafted for its step, as a
pool drafter without branches does. For tests of the verifier side against real drafts, with no Ray."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from actors.drafter.engine import DrafterEngine
from actors.messages import DraftResult, DraftStatus, DraftStep, SeqRole, check_drafts
from actors.verifier.speculator import Drafts, DraftTiming, Short
from actors.wire import encode_hidden


class LocalSpeculator:
    def __init__(self, engine: DrafterEngine, vocab_size: int | None = None) -> None:
        self.engine, self.vocab_size = engine, vocab_size
        self.steps = 0

    def ready(self) -> bool:
        return True

    def send(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftStep, DraftResult]:
        array, dtype = encode_hidden(hidden)  # as it travels to a drafter actor
        step = replace(step, seqs=[replace(s, role=SeqRole.DRAFT) for s in step.seqs], hidden_dtype=dtype)
        self.steps += 1
        return step, self.engine.draft(step, array)

    def collect(self, ticket: tuple[DraftStep, DraftResult]) -> Drafts:
        step, result = ticket
        k, rows = step.num_speculative_tokens, len(step.seqs)
        if result.status is not DraftStatus.OK:
            return Drafts.none(rows, k, Short.FAILED, result.error)
        ids = check_drafts(result.draft_token_ids, rows, k, self.vocab_size).astype(np.int64)
        short = {j: Short.FULL for j in result.full_seqs}
        ids[list(short)] = 0
        return Drafts(ids, short, timing=DraftTiming(compute_ms=result.compute_ms, all_hits=False))

    def free(self, req_ids: Iterable[str]) -> None:
        self.engine.free(list(req_ids))

    def stats(self) -> dict[str, Any]:
        return {"drafters": 1, "active_sequences": self.engine.num_active_sequences}
