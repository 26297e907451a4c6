"""The Grafana dashboard and the Prometheus scrape config (no engine): the JSON parses, every panel queries, the
metric names are read out of PromQL right, each ``eagle_cluster_*`` name is one the project renders and each
``vllm:*`` name one vLLM registers. That a live cluster's ``/metrics`` exposes them all is checked in
``tests/cluster/test_cli_serve.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from actors.metrics import ProposerStats, SpecDecodeStats
from cluster import dashboard
from cluster.admission import REJECTIONS_METRIC, InflightLimit, Overloaded
from tests.conftest import ROOT


@pytest.mark.parametrize(("expr", "names"), [
    ('1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{instance=~"$instance"}[$__rate_interval])) / '
     'sum(rate(vllm:spec_decode_num_drafts_total[5m]))',
     {"vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"}),
    ('histogram_quantile(0.99, sum by (le) (rate(eagle_cluster_step_wait_seconds_bucket{le!="+Inf"}[1m])))',
     {"eagle_cluster_step_wait_seconds_bucket"}),
    ("sum by (position) (rate(a_total[1m])) / scalar(sum(rate(b_total[1m]))) > bool 1e3",
     {"a_total", "b_total"}),
    ("foo offset 5m and on (job) bar", {"foo", "bar"}),
])
def test_metric_names_from_promql(expr, names):
    assert dashboard.metric_names(expr) == names


def test_every_panel_queries_a_metric():
    d = dashboard.load()
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len(panels) >= 12 and len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in panels:
        assert p["targets"] and all(dashboard.metric_names(t["expr"]) for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}"
    titles = {p["title"] for p in panels}
    for wanted in ("Mean acceptance length", "Acceptance rate per draft position", "Drafts by source",
                   "Branch hits (async drafting)", "Drafters and quarantined drafters", "Admission rejections",
                   "Per-step wait for the drafters"):
        assert wanted in titles


def test_the_pools_metrics_are_the_ones_the_project_renders():
    d = dashboard.load()
    named = set().union(*(dashboard.metric_names(e) for _, e in dashboard.queries(d)))
    stats = ProposerStats(acceptance_by_source={"branch": SpecDecodeStats(2, 6, 3), "on_demand": SpecDecodeStats()},
                          client={"drafters": 1, "quarantined": 0, "rehomed": 0})
    stats.step_waits.observe(3.0)
    limit = InflightLimit(0)
    with pytest.raises(Overloaded), limit.admit():
        pass
    from prometheus_client import REGISTRY, generate_latest

    text = stats.prometheus() + generate_latest(REGISTRY).decode()
    ours = {n for n in named if n.startswith("eagle_cluster_")}
    assert ours and not ours - dashboard.exposed(text)
    assert REJECTIONS_METRIC in ours and limit.rejected == 1
    assert 'eagle_cluster_step_wait_seconds_bucket{le="0.005"} 1' in text  # 3 ms lands in the 5 ms bucket
    assert "eagle_cluster_step_wait_seconds_count 1" in text


def test_the_vllm_metrics_are_ones_vllm_registers():
    import vllm

    source = "".join(p.read_text(errors="replace") for p in (Path(vllm.__file__).parent / "v1").rglob("*.py"))
    named = set().union(*(dashboard.metric_names(e) for _, e in dashboard.queries(dashboard.load())))
    for name in sorted(n for n in named if n.startswith("vllm:")):
        base = name.removesuffix("_total").removesuffix("_bucket")
        assert f'"{base}"' in source, name


def test_prometheus_scrape_config_targets_the_serve_proxy():
    cfg = yaml.safe_load((ROOT / "deploy" / "observability" / "prometheus.yaml").read_text())
    job = cfg["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
