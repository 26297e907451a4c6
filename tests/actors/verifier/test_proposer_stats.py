"""``ProposerStats``: the worker RPC's plain dict round trip, and its Prometheus text."""

from __future__ import annotations

from actors.metrics import ProposerStats, SpecDecodeStats
from actors.verifier.proposer import ProposerState


def _stats() -> ProposerStats:
    st = ProposerState(steps=5, failures=1, branch_lookups=4, branch_hits=3)
    st.per_request["a"] = SpecDecodeStats(2, 6, 4, [2, 1, 1])
    st.per_request_hits["a"] = 3
    st.by_source["branch"] = SpecDecodeStats(1, 3, 3, [1, 1, 1])
    st.by_source["placeholder"] = SpecDecodeStats(1, 3, 0, [0, 0, 0])
    return st.stats({"rehomed": 2, "homes": {"d0": 1}})


def test_round_trip_through_the_rpc_dict():
    stats = _stats()
    rpc = [{"is_driver": False, **ProposerStats().to_dict()},
           {"is_driver": True, "timings": [], **stats.to_dict()}]  # the worker adds its timings
    back = ProposerStats.of_driver(rpc)
    assert back == stats
    assert back.per_request["a"].mean_acceptance_length == 3.0


def test_prometheus_text():
    text = _stats().prometheus()
    lines = set(text.splitlines())
    assert {"eagle_cluster_draft_steps_total 5", "eagle_cluster_draft_failures_total 1",
            "eagle_cluster_rehomed_sequences_total 2", "eagle_cluster_branch_lookups_total 4",
            "eagle_cluster_branch_hits_total 3", 'eagle_cluster_drafts_total{source="branch"} 1',
            'eagle_cluster_accepted_tokens_total{source="branch"} 3',
            'eagle_cluster_accepted_tokens_total{source="placeholder"} 0'} <= lines
    assert "# TYPE eagle_cluster_drafts_total counter" in lines and text.endswith("\n")
