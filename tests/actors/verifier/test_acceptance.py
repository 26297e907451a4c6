"""Per-request acceptance on the verifier's side (``actors.verifier.acceptance``) over hand-built steps: a step's
rows settle the drafts proposed before them (``verified``), its drafts as vLLM will verify them are then awaited
(``proposed``, with ``Drafts.lengths``); as ``Speculation`` calls them, once each per step. No vLLM."""

from __future__ import annotations

import numpy as np

from actors.messages import SeqSlice
from actors.verifier import acceptance
from actors.verifier.acceptance import Acceptance, Proposed
from actors.verifier.speculator import Drafts, Short
from tests.actors.fake_speculator import K, propose, run_step, speculation


def step(a: Acceptance, seqs: list[SeqSlice], k: int = 2, in_prefill: list[bool] | None = None,
         hits: list[int] | None = None, short: dict[int, Short] | None = None, lookups: int = 0) -> None:
    """A step of ``seqs`` verified, then proposed k drafts each (``hits``: rows answered from a branch table)."""
    a.verified(seqs)
    drafts = Drafts(np.zeros((len(seqs), k), np.int64), short or {}, hits or [], lookups)
    a.proposed(seqs, drafts, in_prefill or [False] * len(seqs))


def test_account_two_steps():
    """Step 1 ships positions 0-3 after no drafts and proposes k = 2 drafts after position 3; step 2 ships 3 rows
    from position 4: 2 drafts accepted (positions 0 and 1). Step 3 ships 1 row: none accepted."""
    seen: list[tuple[int, int]] = []
    a = Acceptance(lambda num_drafts, accepted: seen.append((num_drafts, accepted)))
    step(a, [SeqSlice("a", 0, 4, 0)])
    assert a.pending["a"] == Proposed(2, 3, "on_demand") and "a" not in a.per_request
    step(a, [SeqSlice("a", 0, 3, 4)])
    st = a.per_request["a"]
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, st.accepted_per_pos) == (1, 2, 2, [1, 1])
    assert st.mean_acceptance_length == 3.0 and a.pending["a"].last_position == 6
    step(a, [SeqSlice("a", 0, 1, 7)])
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, st.accepted_per_pos) == (2, 4, 2, [1, 1])
    assert a.by_source["on_demand"].num_drafts == 2
    assert seen == [(2, 2), (2, 0)]  # the draft-length policy is told each verified draft run


def test_account_skips_what_vllm_discards():
    """Drafts after a partial prefill are discarded by vLLM (not counted); a step that does not follow the drafts
    (a preempted sequence restarting earlier) counts nothing; a finished sequence's drafts are forgotten; a short
    sequence (no drafts this step) awaits none."""
    a = Acceptance()
    step(a, [SeqSlice("a", 0, 4, 0)], in_prefill=[True])  # partial prefill
    assert "a" not in a.pending
    step(a, [SeqSlice("a", 0, 2, 4)])
    assert "a" not in a.per_request and a.pending["a"].last_position == 5
    step(a, [SeqSlice("a", 0, 3, 0)])  # restarted from position 0
    assert "a" not in a.per_request
    a.forget(["a"])
    assert "a" not in a.pending
    step(a, [SeqSlice("b", 0, 2, 0), SeqSlice("c", 2, 2, 0)], short={1: Short.FULL})
    assert set(a.pending) == {"b"}


def test_account_by_source():
    """Acceptance counted by where the drafts came from: a hit's drafts are the branch table's."""
    a = Acceptance()
    seqs = [SeqSlice("a", 0, 2, 0), SeqSlice("b", 2, 2, 0)]
    step(a, seqs, hits=[0], lookups=2)
    assert a.pending["a"].source == "branch" and a.pending["b"].source == "on_demand"
    assert (a.branch_lookups, a.branch_hits, a.per_request_hits) == (2, 1, {"a": 1})
    step(a, [SeqSlice("a", 0, 2, 2), SeqSlice("b", 2, 1, 2)])
    assert a.by_source["branch"].num_accepted_tokens == 1
    assert a.by_source["on_demand"].num_accepted_tokens == 0
    a.reset_measurements()  # between a benchmark's runs: the tables go, the drafts awaited stay
    assert (a.per_request, a.by_source, a.per_request_hits, a.branch_lookups, a.branch_hits) == ({}, {}, {}, 0, 0)
    assert set(a.pending) == {"a", "b"}


def test_per_request_keeps_the_latest(monkeypatch):
    monkeypatch.setattr(acceptance, "MAX_PER_REQUEST", 2)
    a = Acceptance()
    for rid in "xyz":
        step(a, [SeqSlice(rid, 0, 1, 0)], hits=[0])
        step(a, [SeqSlice(rid, 0, 2, 1)])
    assert list(a.per_request) == ["y", "z"] and set(a.per_request_hits) == {"y", "z"}


def test_pending_is_what_vllm_verifies():
    """Through ``Speculation``: drafts are awaited when collected, with the step's real lengths, not when proposed."""
    s = speculation()
    run_step(s, [("a", 0, 4)])
    propose(s, [("a", 4, 3)])
    assert "a" not in s.acceptance.pending and s.acceptance.per_request["a"].num_accepted_tokens == 2
    s.collect()
    assert s.acceptance.pending["a"] == Proposed(K, 6, "on_demand")
