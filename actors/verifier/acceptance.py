"""Acceptance accounting on the verifier's side, under vLLM's definitions (``actors.metrics``).

vLLM counts acceptance inside its rejection sampler, for the whole engine; this counts it per request and by where
the drafts came from (``"branch"``: precomputed by pipelined drafting, a hit; ``"on_demand"``: drafted for the step),
from what each step ships: a step that follows n drafts and ships 1 + a rows of a sequence accepted a of them
(positions 0..a-1), the last row being the recovered or bonus token's. It feeds the draft-length policy's
acceptance by position (``actors.verifier.draft_length``). Used by ``actors.verifier.speculation`` twice a step:
``verified`` when a step's rows arrive, ``proposed`` when its drafts are known.

Worked example: sequence s was proposed 3 drafts after position 9 (``proposed``); the next step ships s's rows from
position 10 with 3 rows: 2 drafts were accepted, so num_drafts += 1, num_draft_tokens += 3, num_accepted_tokens += 2,
accepted_per_pos [+1, +1, 0].
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NamedTuple

from actors.messages import SeqSlice
from actors.metrics import SpecDecodeStats
from actors.verifier.speculator import Drafts

MAX_PER_REQUEST = 4096  # requests whose acceptance is kept (the latest)


class Proposed(NamedTuple):
    """Drafts proposed for a sequence, awaiting the step that says how many were accepted."""

    num_drafts: int
    last_position: int  # of the row the drafts follow: the next step starts at last_position + 1
    source: str  # "on_demand" or "branch"


class Acceptance:
    def __init__(self, observe: Callable[[int, int], None] = lambda num_drafts, accepted: None) -> None:
        """``observe(num_drafts, accepted)``: told each verified draft run (the draft-length policy)."""
        self.observe = observe
        self.pending: dict[str, Proposed] = {}
        self.per_request: OrderedDict[str, SpecDecodeStats] = OrderedDict()
        self.by_source: dict[str, SpecDecodeStats] = {}
        self.branch_lookups = 0  # sequences with a branch table entry for their step (pipelined drafting)
        self.branch_hits = 0  # ... answered from it
        self.per_request_hits: dict[str, int] = {}

    def verified(self, seqs: list[SeqSlice]) -> None:
        """A step's rows (``seqs``: each sequence's slice) say how many of the drafts proposed before were accepted;
        each sequence's pending drafts are settled (or forgotten: a row that does not follow them)."""
        for s in seqs:
            sent = self.pending.pop(s.req_id, None)
            if sent is None or s.start_position != sent.last_position + 1:
                continue
            accepted = max(0, min(sent.num_drafts, s.num_tokens - 1))
            stats = self.per_request.get(s.req_id)
            if stats is None:
                stats = self.per_request[s.req_id] = SpecDecodeStats(accepted_per_pos=[0] * sent.num_drafts)
                if len(self.per_request) > MAX_PER_REQUEST:  # a server's lifetime of requests: keep the latest
                    oldest, _ = self.per_request.popitem(last=False)
                    self.per_request_hits.pop(oldest, None)
            self.observe(sent.num_drafts, accepted)
            by_source = self.by_source.setdefault(sent.source, SpecDecodeStats(accepted_per_pos=[0] * sent.num_drafts))
            for agg in (stats, by_source):
                agg.num_drafts += 1
                agg.num_draft_tokens += sent.num_drafts
                agg.num_accepted_tokens += accepted
                for i in range(min(accepted, len(agg.accepted_per_pos))):
                    agg.accepted_per_pos[i] += 1

    def proposed(self, seqs: list[SeqSlice], drafts: Drafts, in_prefill: list[bool]) -> None:
        """The step's drafts as vLLM will verify them: each sequence's ``Drafts.lengths``. Drafts made during a
        partial prefill are discarded by vLLM, so they are not counted."""
        hits = set(drafts.hits)
        for i, (s, n) in enumerate(zip(seqs, drafts.lengths(), strict=True)):
            if n and not in_prefill[i]:
                self.pending[s.req_id] = Proposed(n, s.start_position + s.num_tokens - 1,
                                                  "branch" if i in hits else "on_demand")
        self.branch_lookups += drafts.lookups
        self.branch_hits += len(hits)
        for i in hits:
            rid = seqs[i].req_id
            self.per_request_hits[rid] = self.per_request_hits.get(rid, 0) + 1

    def forget(self, req_ids: Iterable[str]) -> None:
        """Finished sequences: no drafts of theirs are awaited (their statistics stay)."""
        for rid in req_ids:
            self.pending.pop(rid, None)

    def reset_measurements(self) -> None:
        """Between a benchmark's runs: the per-request and per-source tables and the branch counters; the drafts
        awaiting their step stay."""
        self.per_request.clear()
        self.per_request_hits.clear()
        self.by_source.clear()
        self.branch_lookups = self.branch_hits = 0
