"""What the verifier's steps counted (``actors.verifier.step_stats``), reported as one ``ProposerStats``: the worker
RPC's plain dict round trip, its Prometheus text, and the short-sequence counters."""

from __future__ import annotations

import numpy as np

from actors.metrics import ProposerStats, SpecDecodeStats
from actors.verifier.acceptance import Acceptance
from actors.verifier.draft_length import FixedDraftLength, StepDraftLength
from actors.verifier.speculator import Drafts, DraftTiming, Short
from actors.verifier.step_stats import StepStats


def _stats() -> ProposerStats:
    st = StepStats(steps=5, failures=1)
    a = Acceptance()
    a.branch_lookups, a.branch_hits = 4, 3
    a.per_request["a"] = SpecDecodeStats(2, 6, 4, [2, 1, 1])
    a.per_request_hits["a"] = 3
    a.by_source["branch"] = SpecDecodeStats(1, 3, 3, [1, 1, 1])
    a.by_source["placeholder"] = SpecDecodeStats(1, 3, 0, [0, 0, 0])
    lengths = StepDraftLength(FixedDraftLength(3))
    lengths.chosen = [0, 0, 1, 4]
    return st.report(a, lengths, {"rehomed": 2, "homes": {"d0": 1}})


def test_round_trip_through_the_rpc_dict():
    stats = _stats()
    rpc = [{"is_driver": False, **ProposerStats().to_dict()},
           {"is_driver": True, "timings": [], **stats.to_dict()}]  # the worker adds its timings
    back = ProposerStats.of_driver(rpc)
    assert back == stats
    assert back.per_request["a"].mean_acceptance_length == 3.0
    assert back.speculative_tokens == [0, 0, 1, 4] and back.client == {"rehomed": 2, "homes": {"d0": 1}}


def test_prometheus_text():
    text = _stats().prometheus()
    lines = set(text.splitlines())
    assert {"eagle_cluster_draft_steps_total 5", "eagle_cluster_draft_failures_total 1",
            "eagle_cluster_rehomed_sequences_total 2", "eagle_cluster_branch_lookups_total 4",
            "eagle_cluster_branch_hits_total 3", 'eagle_cluster_drafts_total{source="branch"} 1',
            'eagle_cluster_accepted_tokens_total{source="branch"} 3',
            'eagle_cluster_accepted_tokens_total{source="placeholder"} 0'} <= lines
    assert "# TYPE eagle_cluster_drafts_total counter" in lines and text.endswith("\n")


def test_counters_only_leave_the_per_request_tables_out():
    st = StepStats(steps=1)
    a = Acceptance()
    a.per_request["a"] = SpecDecodeStats(1, 2, 1, [1, 0])
    a.per_request_hits["a"] = 1
    a.by_source["on_demand"] = SpecDecodeStats(1, 2, 1, [1, 0])
    got = st.report(a, StepDraftLength(FixedDraftLength(2)), {"drafters": 1}, counters_only=True)
    assert got.per_request == {} and got.per_request_branch_hits == {}
    assert got.acceptance_by_source == {"on_demand": SpecDecodeStats(1, 2, 1, [1, 0])}


def test_short_sequences_by_reason():
    """Each short sequence counted by why; a step none of whose sequences drafted because no drafter could (none
    ready, or all failed) is a step without drafts; prompt steps (``CONTEXT``) and a full drafter are not."""
    st = StepStats()
    st.count_short(Drafts.none(2, 2, Short.NO_DRAFTER))
    st.count_short(Drafts(np.zeros((2, 2), np.int64), {0: Short.FAILED}))
    st.count_short(Drafts.none(3, 2, Short.CONTEXT))
    st.count_short(Drafts(np.zeros((1, 2), np.int64), {0: Short.FULL}))
    assert st.short == {"no_drafter": 2, "failed": 1, "context": 3, "full": 1} and st.steps_without_drafts == 1
    st.count_short(Drafts(np.zeros((2, 2), np.int64), {0: Short.FAILED, 1: Short.CONTEXT}))
    assert st.steps_without_drafts == 2 and st.short["failed"] == 2


def test_drafted_records_the_steps_timing():
    st = StepStats()
    drafts = Drafts(np.zeros((2, 2), np.int64), {1: Short.FAILED}, errors=["d1 timed out"],
                    timing=DraftTiming(ship_ms=1.0, wait_ms=30.0, compute_ms=4.0, all_hits=False))
    st.drafted(drafts, num_tokens=7, propose_ms=2.5)
    t = st.timings[-1]
    assert (t.batch_size, t.num_tokens, t.propose_ms, t.ship_ms, t.wait_ms, t.compute_ms, t.all_hits) == (
        2, 7, 2.5, 1.0, 30.0, 4.0, False)
    assert st.failures == 1 and st.short == {"failed": 1} and st.steps_without_drafts == 0
    assert sum(st.waits.counts) == 1 and abs(st.waits.sum_s - 0.03) < 1e-9


def test_counters_on_metrics():
    text = ProposerStats(steps=3, steps_without_drafts=5, undrafted={"no_drafter": 9, "failed": 2},
                         client={"drafters": 0}).prometheus()
    lines = set(text.splitlines())
    assert {"eagle_cluster_steps_without_drafts_total 5", 'eagle_cluster_undrafted_sequences_total{reason="failed"} 2',
            'eagle_cluster_undrafted_sequences_total{reason="no_drafter"} 9', "eagle_cluster_drafters 0"} <= lines
    back = ProposerStats.from_dict(ProposerStats(steps_without_drafts=5, undrafted={"failed": 2}).to_dict())
    assert back.steps_without_drafts == 5 and back.undrafted == {"failed": 2}
