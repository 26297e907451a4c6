"""``benchmarks.first_token`` reads vLLM's TTFT and prefill histograms from a ``/metrics`` page: the sums and counts
of every label set, and nothing from other metrics that share a prefix."""

from __future__ import annotations

from benchmarks.first_token import histogram_sums

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
"""


def test_sums_and_counts_over_label_sets():
    sums = histogram_sums(PAGE)
    assert sums["engine"][1] == 4.0 and abs(sums["engine"][0] - 0.14) < 1e-9
    assert sums["prefill"] == (0.06, 4.0)  # the kv_computed_tokens histogram is another metric


def test_a_page_without_them_reads_zero():
    assert histogram_sums("eagle_cluster_drafters 1\n") == {"engine": (0.0, 0.0), "prefill": (0.0, 0.0)}
