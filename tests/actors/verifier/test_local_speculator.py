"""The seam with a real drafter behind it, in one process (``tests.actors.local_speculator``): a ``Speculation``
drives a drafter engine step by step; its drafts are the engine's own for the same step, acceptance is counted from
the rows that follow them, and finishing a sequence frees its draft state on the engine."""

from __future__ import annotations

import numpy as np

from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.checkpoint import load_head
from actors.verifier.draft_length import FixedDraftLength
from tests.actors.fake_speculator import K, propose, speculation
from tests.actors.local_speculator import LocalSpeculator


def engine(toy_heads) -> DrafterEngine:
    target_dir, heads = toy_heads
    return DrafterEngine(load_head(heads["eagle1"], target_dir), DrafterEngineConfig(max_model_len=128))


def test_real_drafts_through_the_seam(toy_heads, monkeypatch):
    import tests.actors.fake_speculator as fake

    twin = engine(toy_heads)  # the same engine, driven directly with the steps the speculation sends
    width = twin.spec.fused_hidden_size
    monkeypatch.setattr(fake, "WIDTH", width)
    local = LocalSpeculator(engine(toy_heads), vocab_size=twin.spec.vocab_size)
    s = speculation(local, FixedDraftLength(K))
    sent = []
    send = local.send
    local.send = lambda step, hidden: sent.append((step, hidden)) or send(step, hidden)  # type: ignore[method-assign]

    propose(s, [("a", 0, 5), ("b", 0, 3)])  # prompt rows: drafted (a synchronous drafter drafts every sequence)
    first = s.collect()
    propose(s, [("a", 5, 2), ("b", 3, 1)])  # a accepted 1 of its drafts, b none
    second = s.collect()
    for (step, hidden), drafts in zip(sent, (first, second), strict=True):
        expected = twin.draft(step, hidden.numpy()).draft_token_ids
        assert np.array_equal(drafts.ids, expected) and drafts.lengths() == [K, K]
    a = s.acceptance.per_request["a"]
    assert (a.num_drafts, a.num_accepted_tokens) == (1, 1) and s.acceptance.per_request["b"].num_accepted_tokens == 0

    s.finish(["a", "b"])
    assert local.engine.num_active_sequences == 0 and not s.acceptance.pending
