"""The verifier's proposer without vLLM: the docstrings' worked examples (``step_rows``, ``step_seqs``,
``step_input_ids``; the row pairing in ``actors.messages``) and per-request acceptance (``_account``) over
hand-built steps."""

from __future__ import annotations

import numpy as np
import torch

from actors.messages import SeqSlice
from actors.verifier.proposer import SentDrafts, step_input_ids, step_rows, step_seqs
from tests.actors.fake_proposer import proposer, run_step


def test_step_rows_worked_example():
    """query_start_loc [0, 4, 5], last rows [1, 4] -> keep rows [0, 1, 4], counts [2, 1]."""
    rows, counts = step_rows(torch.tensor([0, 4, 5]), torch.tensor([1, 4]))
    assert rows.tolist() == [0, 1, 4] and counts.tolist() == [2, 1]


def test_step_seqs_worked_example():
    """req_ids [a, b], query_start_loc [0, 4, 5], last rows [1, 4], positions [7, 8, 9, 10, 3] -> rows [0, 1, 4];
    a: start 0, 2 rows from position 7; b: start 2, 1 row from position 3."""
    rows, seqs = step_seqs(["a", "b"], torch.tensor([0, 4, 5]), torch.tensor([1, 4]), torch.tensor([7, 8, 9, 10, 3]))
    assert rows.tolist() == [0, 1, 4]
    assert seqs == [SeqSlice("a", 0, 2, 7), SeqSlice("b", 2, 1, 3)]


def test_step_input_ids_worked_example():
    """tokens [t0, t1, t2, t3, u0], next [n0, n1], query_start_loc [0, 4, 5], last rows [1, 4], rows [0, 1, 4]
    -> [t1, n0, n1]."""
    t0, t1, t2, t3, u0, n0, n1 = 10, 11, 12, 13, 20, 90, 91
    ids = step_input_ids(torch.tensor([t0, t1, t2, t3, u0]), torch.tensor([n0, n1]), torch.tensor([0, 4, 5]),
                         torch.tensor([1, 4]), torch.tensor([0, 1, 4]))
    assert ids.dtype == np.int32 and ids.tolist() == [t1, n0, n1]


def test_rows_pair_each_position_with_the_token_after_it():
    """``actors.messages``: accepted [a, b] at positions 7, 8 and bonus c -> rows (7: input b), (8: input c)."""
    b, c = 1, 9  # run_step's target token ids are a = 0, b = 1, and its sampled next token c = 9
    step = run_step(proposer(), [("s", 7, 2)])
    assert step.input_ids.tolist() == [b, c]
    assert [(s.start_position, s.num_tokens) for s in step.seqs] == [(7, 2)]


def test_account_two_steps():
    """Step 1 ships positions 0-3 after no drafts and proposes k = 2 drafts after position 3; step 2 ships 3 rows
    from position 4: 2 drafts accepted (positions 0 and 1). Step 3 ships 1 row: none accepted."""
    p = proposer()
    p._account([SeqSlice("a", 0, 4, 0)], [], 2, [False])
    assert p.state.pending["a"] == SentDrafts(2, 3, "on_demand") and "a" not in p.state.per_request
    p._account([SeqSlice("a", 0, 3, 4)], [], 2, [False])
    st = p.state.per_request["a"]
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, st.accepted_per_pos) == (1, 2, 2, [1, 1])
    assert st.mean_acceptance_length == 3.0 and p.state.pending["a"].last_position == 6
    p._account([SeqSlice("a", 0, 1, 7)], [], 2, [False])
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, st.accepted_per_pos) == (2, 4, 2, [1, 1])
    assert p.state.by_source["on_demand"].num_drafts == 2


def test_account_skips_what_vllm_discards():
    """Drafts after a partial prefill are discarded by vLLM (not counted); a step that does not follow the drafts
    (a preempted sequence restarting earlier) counts nothing; a finished sequence's drafts are forgotten."""
    p = proposer()
    p._account([SeqSlice("a", 0, 4, 0)], [], 2, [True])  # partial prefill
    assert "a" not in p.state.pending
    p._account([SeqSlice("a", 0, 2, 4)], [], 2, [False])
    assert "a" not in p.state.per_request and p.state.pending["a"].last_position == 5
    p._account([SeqSlice("a", 0, 3, 0)], [], 2, [False])  # restarted from position 0
    assert "a" not in p.state.per_request
    p._account([], ["a"], 2, [])
    assert "a" not in p.state.pending


def test_account_by_source():
    """Acceptance counted by where the drafts came from: a hit's drafts are the branch table's."""
    p = proposer()
    seqs = [SeqSlice("a", 0, 2, 0), SeqSlice("b", 2, 2, 0)]
    p._account(seqs, [], 2, [False, False])
    p._set_source(seqs, [0], "branch")
    p._account([SeqSlice("a", 0, 2, 2), SeqSlice("b", 2, 1, 2)], [], 2, [False, False])
    assert p.state.by_source["branch"].num_accepted_tokens == 1
    assert p.state.by_source["on_demand"].num_accepted_tokens == 0
