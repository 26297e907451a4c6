"""``benchmarks.load`` against a fake OpenAI-compatible server (``tests.benchmarks.fake_server``): the load
generator's report (counts, latencies, the acceptance length through ``actors.metrics``, branch counters), the first
requests, the first-token split from vLLM's histograms, and the ``/metrics`` readers on pages written by hand. No
vLLM, no Ray."""

from __future__ import annotations

import pytest

from benchmarks import load
from tests.benchmarks.fake_server import FakeServer

PAGE = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
vllm:time_to_first_token_seconds_bucket{le="0.01",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.09
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.05
vllm:request_prefill_time_seconds_sum{model_name="m"} 0.06
vllm:request_prefill_time_seconds_count{model_name="m"} 4.0
vllm:request_prefill_kv_computed_tokens_sum{model_name="m"} 900.0
eagle_cluster_speculative_tokens_bucket{le="0.0"} 2
eagle_cluster_speculative_tokens_bucket{le="1.0"} 2
eagle_cluster_speculative_tokens_bucket{le="2.0"} 7
eagle_cluster_speculative_tokens_bucket{le="+Inf"} 7
eagle_cluster_estimated_goodput_by_draft_length{batch="1",k="0"} 60.0
eagle_cluster_estimated_goodput_by_draft_length{batch="1",k="2"} 90.5
eagle_cluster_draft_prefix_hit_tokens 12.0
"""


def test_a_run_reports_every_request_and_the_acceptance_length() -> None:
    with FakeServer() as server:
        report = load.drive(server.base, [f"def f{i}(x):" for i in range(6)], 8, 3, "fake", quiet=True)
    assert (report.successful, report.failed, report.output_tokens) == (6, 0, 48)
    assert report.concurrency == 3 and report.duration_s > 0
    assert 0 < report.ttft_ms["median"] <= report.ttft_ms["p99"]
    assert report.tpot_ms["median"] > 0 and report.itl_ms["mean"] > 0
    assert report.spec == {"num_drafts": 24, "num_draft_tokens": 72, "num_accepted_tokens": 24,
                           "accepted_per_pos": [24, 0]}
    assert report.mal == load.mal(report.spec) == 2.0  # 1 + accepted / drafts, by actors.metrics
    assert report.branches == {"lookups": 12.0, "hits": 6.0}
    assert "Output token throughput (tok/s):" in report.text() and "mean acceptance length: 2.00" in report.text()


def test_a_server_that_does_not_answer_counts_failures() -> None:
    import asyncio

    from openai import AsyncOpenAI

    async def one() -> load.RequestResult:
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0, timeout=2)
        try:
            return await load.one_request(client, "m", "p", 4)
        finally:
            await client.close()

    result = asyncio.run(one())
    assert not result.ok and result.error


def test_no_drafts_is_an_acceptance_length_of_one() -> None:
    assert load.mal(None) == 1.0
    assert load.mal({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}) == 1.0


def test_first_requests_and_first_tokens() -> None:
    with FakeServer() as server:
        first, rest = load.first_requests(server.base, n=3, max_tokens=4)
        row = load.first_tokens(server.base, ["a", "b", "c", "d"], max_tokens=4)
    assert first > 0 and rest > 0
    assert set(row) == {"client", "client_p50", "engine", "prefill", "serving"}
    assert row["client"] > 0 and row["engine"] > 0  # the fake server's own TTFT histogram moved
    assert row["serving"] == pytest.approx(row["client"] - row["engine"])
    assert row["prefill"] != row["prefill"]  # no prefill histogram on the fake page: NaN, not 0


def test_histogram_sums_over_label_sets_and_nothing_else() -> None:
    sums = load.histogram_sums(PAGE)
    assert sums["engine"][1] == 4.0 and abs(sums["engine"][0] - 0.14) < 1e-9
    assert sums["prefill"] == (0.06, 4.0)  # the kv_computed_tokens histogram is another metric
    assert load.histogram_sums("eagle_cluster_drafters 1\n") == {"engine": (0.0, 0.0), "prefill": (0.0, 0.0)}


def test_metrics_readers() -> None:
    assert load.chosen_k(PAGE) == [2, 0, 5]
    assert load.goodput_estimates(PAGE) == {"1": [60.0, None, 90.5]}
    assert load.goodput_estimates("") == {} and load.chosen_k("") == []
    assert load.counters(PAGE, load.PREFIX_COUNTERS) == {"hit": 12.0, "miss": 0.0}


def test_agreement_table_medians_ratios_and_spread() -> None:
    def side(tps: float) -> dict[str, float]:
        return {label: 1.0 for label, _, _ in load.AGREEMENT_METRICS} | {"output tokens/s": tps}

    rows = [{"ours": side(100.0), "vllm": side(99.0)}, {"ours": side(110.0), "vllm": side(108.9)}]
    columns, table = load.agreement_table(rows)
    assert columns[0] == "metric" and len(table) == len(load.AGREEMENT_METRICS)
    tps = next(r for r in table if r[0] == "output tokens/s")
    assert tps == ["output tokens/s", "105.00", "103.95", "0.990", "9.5%"]


def test_ours_flat_names_every_agreement_metric() -> None:
    with FakeServer() as server:
        report = load.drive(server.base, ["a", "b"], 4, 2, "fake", quiet=True)
    flat = load.ours_flat(report, 0.5)
    assert list(flat) == [label for label, _, _ in load.AGREEMENT_METRICS]
    assert flat["output tokens"] == 8 and flat["mean acceptance length"] == 2.0 and flat["client CPU s"] == 0.5


def test_the_command_line_names_what_it_runs() -> None:
    with pytest.raises(SystemExit, match="vllm-bench-serve"):
        load.main([])


def test_long_prompts_are_distinct_from_their_first_block() -> None:
    from transformers import AutoTokenizer

    from cluster.harness import TARGET

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    prompts = load.long_prompts(4, 600)
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    assert all(570 <= len(i) <= 600 for i in ids)  # decoded, re-encoded: a few tokens merge at the seams
    assert len({tuple(i[:16]) for i in ids}) == 4  # no two share vLLM's first KV block
