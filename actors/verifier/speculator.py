"""The seam between vLLM's verifier and whatever drafts for it: a ``Speculator``, and the ``Drafts`` it hands back.

Where it sits: once per step, vLLM's model runner hands the proposer (``actors.verifier.vllm_adapter``) the rows it
verified; the adapter makes them one ``DraftStep`` (``actors.messages``), and ``actors.verifier.speculation`` hands
that to a speculator with the step's hidden rows:

    ticket = speculator.send(step, hidden)   # in vLLM's sample_tokens: nothing is waited for
    drafts = speculator.collect(ticket)      # in vLLM's take_draft_token_ids, after the step's tokens went out
    speculator.free(req_ids)                 # vLLM's scheduler finished these sequences

Terms, defined once here. A step's *k* is the number of draft tokens proposed to each of its sequences, the same
for all (0..K, ``actors.verifier.draft_length``). A sequence is *short* this step when it gets none: vLLM then
schedules and verifies no draft token for it, so its output is what target-only decoding gives, and
``Drafts.short`` says why. vLLM's rejection sampler does the rest: of a sequence's k drafts it *accepts* the
longest prefix the target agrees with, then emits one more token from the target: the *recovered* token (where a
draft was rejected) or the *bonus* token (all k accepted).

Implementations: ``actors.verifier.remote_speculator.RemoteSpeculator`` (drafter actors, one or a pool) and, for
tests, ``tests.actors.local_speculator.LocalSpeculator`` (a drafter engine in the same process).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from actors.messages import DraftStep


class Short(enum.StrEnum):
    """Why a sequence gets no draft tokens this step."""

    NO_DRAFTER = "no_drafter"  # no usable drafter to home it on
    FAILED = "failed"  # its drafter failed, timed out or answered badly this step
    CONTEXT = "context"  # a prompt step, or a branch miss not waited for: its drafter drafts its next step from it
    FULL = "full"  # its drafter had no room for it


@dataclass
class DraftTiming:
    ship_ms: float = 0.0  # packing and sending the calls
    wait_ms: float = 0.0  # blocked on drafters beyond their compute: late branch tables, answers awaited
    compute_ms: float = 0.0  # inside the drafter engines, for the answers waited for
    all_hits: bool = True  # no answer was waited for (every drafted sequence a branch hit, or a prompt step)


@dataclass
class Drafts:
    """A step's drafts, rows in the step's sequence order."""

    ids: np.ndarray  # [B, k] int64 token ids of the target's vocabulary; a short row holds zeros
    short: dict[int, Short] = field(default_factory=dict)  # row -> why it has no drafts this step
    hits: list[int] = field(default_factory=list)  # rows answered from a precomputed branch table (pipelined)
    lookups: int = 0  # rows that had a branch table entry for this step (the hits and the unguessed outcomes)
    errors: list[str] = field(default_factory=list)  # one per drafter that failed this step
    timing: DraftTiming = field(default_factory=DraftTiming)

    @classmethod
    def none(cls, batch_size: int, k: int, why: Short, error: str = "") -> Drafts:
        """No drafts for any sequence of the step."""
        return cls(np.zeros((batch_size, k), np.int64), dict.fromkeys(range(batch_size), why),
                   errors=[error] if error else [])

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def lengths(self) -> list[int]:  # [B]
        """How many draft tokens each sequence gets this step: k, or 0 when it is short. The one place that says
        so: vLLM schedules as many draft tokens for a sequence as its list holds (``vllm_adapter``)."""
        return [0 if i in self.short else self.k for i in range(len(self.ids))]


class Speculator(Protocol):
    """What the verifier drafts through. No method raises for a drafter's fault: a drafter that fails, hangs or
    answers badly makes its sequences short (``Short.FAILED``), never a request fail."""

    def ready(self) -> bool:
        """Whether some drafter can draft this step. Never blocks."""
        ...

    def send(self, step: DraftStep, hidden: torch.Tensor) -> Any:  # hidden: [num_tokens, fused_hidden_size]
        """Hands the step to the drafters and returns a ticket for ``collect``; waits for nothing."""
        ...

    def collect(self, ticket: Any) -> Drafts:
        """The drafts of the step ``ticket`` was sent for, waited for now."""
        ...

    def free(self, req_ids: Iterable[str]) -> None:
        """These sequences are finished: their draft state goes, on their drafters and in every table."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters for ``/metrics`` and benchmarks (``actors.metrics.COUNTER_KEYS`` among them)."""
        ...
