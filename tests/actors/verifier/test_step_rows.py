"""Which of a verified step's rows go to the drafters (``actors.verifier.step_rows``): the docstrings' worked examples,
and the row pairing of ``actors.messages`` as a step carries it. Pure functions: no vLLM. (``mm_rows``:
``tests/actors/drafter/test_multimodal_drafting.py``.)"""

from __future__ import annotations

import numpy as np
import torch

from actors.messages import SeqRole, SeqSlice
from actors.verifier.step_rows import prompt_roles
from tests.actors.fake_speculator import NEXT, run_step, speculation


def test_packed_step_rows_on_the_v1_padded_path():
    """Model runner V1's padded path, as ``RemoteEagleProposer.propose`` calls it: query_start_loc [0, 4, 5], last
    accepted rows [1, 4] (so 2 and 0 rejected), positions [7, 8, 9, 10, 3], tokens [t0, t1, t2, t3, u0], next
    [n0, n1] -> rows [0, 1, 4], counts [2, 1] (a: 2 rows from position 7; b: 1 from position 3), ids [t1, n0, n1]."""
    from actors.verifier.step_rows import packed_step_rows

    t0, t1, t2, t3, u0, n0, n1 = 10, 11, 12, 13, 20, 90, 91
    qsl, last = torch.tensor([0, 4, 5]), torch.tensor([1, 4])
    rows, counts, first, ids = packed_step_rows(qsl.numpy(), qsl, qsl[1:] - 1 - last, torch.tensor([7, 8, 9, 10, 3]),
                                                torch.tensor([t0, t1, t2, t3, u0]), torch.tensor([n0, n1]))
    assert rows.tolist() == [0, 1, 4] and counts.tolist() == [2, 1] and first.tolist() == [7, 3]
    assert ids.dtype == np.int32 and ids.tolist() == [t1, n0, n1]


def test_prompt_roles_worked_example():
    """Prompts of 10, 6 and 4 tokens; a ships positions 0-5, c positions 0-5, b positions 4-4 -> a PREFILL, c CONTEXT
    (its prompt's last chunk), b DRAFT."""
    seqs = [SeqSlice("a", 0, 6, 0), SeqSlice("c", 6, 6, 0), SeqSlice("b", 12, 1, 4)]
    roles, in_prefill = prompt_roles(seqs, np.array([10, 6, 4]))
    assert [s.role for s in roles] == [SeqRole.PREFILL, SeqRole.CONTEXT, SeqRole.DRAFT]
    assert in_prefill == [True, False, False]
    assert [(s.req_id, s.start, s.num_tokens, s.start_position) for s in roles] == [
        ("a", 0, 6, 0), ("c", 6, 6, 0), ("b", 12, 1, 4)]
    # the prompt's last chunk: CONTEXT, not a partial prefill; unknown prompt lengths: all decode
    roles, in_prefill = prompt_roles([SeqSlice("a", 0, 4, 6)], np.array([10]))
    assert roles[0].role is SeqRole.CONTEXT and in_prefill == [False]
    assert prompt_roles(seqs, None) == (seqs, [False, False, False])


def test_rows_pair_each_position_with_the_token_after_it():
    """``actors.messages``: accepted [a, b] at positions 7, 8 and bonus c -> rows (7: input b), (8: input c)."""
    b, c = 1, NEXT  # the batch's target token ids are a = 0, b = 1, and its sampled next token c
    s = speculation()
    run_step(s, [("s", 7, 2)])
    step = s.speculator.steps[-1]
    assert step.input_ids.tolist() == [b, c]
    assert [(x.start_position, x.num_tokens) for x in step.seqs] == [(7, 2)]


def test_packed_step_rows_worked_example():
    """Model runner V2's rows (rejected rows left in place) with one readback: the docstring's example."""
    from actors.verifier.step_rows import packed_step_rows

    qsl = np.array([0, 3, 5])
    positions, tokens = torch.tensor([10, 11, 12, 0, 1]), torch.tensor([100, 101, 102, 200, 201])
    rows, counts, first, ids = packed_step_rows(qsl, torch.from_numpy(qsl), torch.tensor([1, 0]), positions, tokens,
                                                torch.tensor([77, 55]))
    assert rows.tolist() == [0, 1, 3, 4] and counts.tolist() == [2, 2] and first.tolist() == [10, 0]
    assert ids.tolist() == [101, 77, 201, 55] and ids.dtype == np.int32
