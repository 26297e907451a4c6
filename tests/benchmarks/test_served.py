"""``benchmarks.served``: the whole harness on fake servers (``tests.benchmarks.fake_server``; the launcher's command
replaced, ``ray stop`` not run): modes x workloads x concurrencies into one results JSON, CPU by process group, the
tables and their ratios, and a table file ``benchmarks.report`` renders. No vLLM, no Ray."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from benchmarks import modes, report, served
from tests.benchmarks.test_modes import fake_stop
from tests.conftest import ROOT

FAST = ["--num-prompts", "3", "--max-tokens", "4", "--concurrency", "1", "2"]


def fake_report(tok_s: float, ttft: float = 100.0, mal: float = 1.0, **extra: object) -> dict:
    drafts = 10 if mal > 1 else 0
    spec = {"num_drafts": drafts, "num_draft_tokens": 3 * drafts, "num_accepted_tokens": round((mal - 1) * drafts),
            "accepted_per_pos": [round((mal - 1) * drafts), 0, 0]} if drafts else None
    return {"tok_s": tok_s, "mal": mal, "spec": spec, "ttft_ms": {"median": ttft}, "tpot_ms": {"median": 10.0},
            "branches": None, **extra}


def test_throughput_rows_ratios_and_what_core_0_allows() -> None:
    per_tok = {"engine core": 2.0, "worker": 5.0, "serving path": 2.0, "drafter": 4.0, "control plane": 1.0}
    results = {"pinning": "strict", "runs": [
        {"mode": "target-only", "round": 1, "prompts": {"1": fake_report(50.0)}},
        {"mode": "colocated-eagle3", "round": 1, "prompts": {"1": fake_report(80.0, ttft=50.0, mal=2.0)}},
        {"mode": "cluster-eagle3-k3", "round": 1, "prompts": {"1": fake_report(
            60.0, ttft=100.0, mal=2.5, cpu_ms_per_token=per_tok, steps_per_k=[0, 0, 0, 7])}},
        {"mode": "cluster-eagle3-k3", "round": 2, "prompts": {"1": fake_report(70.0)}},  # no baseline in round 2
    ]}
    columns, rows = served.throughput_rows(results)
    row = dict(zip(columns, rows[2], strict=True))
    assert row["x target-only"] == "1.20" and row["x colocated"] == "0.75" and row["x the better baseline"] == "0.75"
    assert row["efficiency"] == f"{60 / 2.5 / 50:.2f}" and row["TTFT x colocated"] == "2.00"
    assert row["MAL"] == "2.50" and row["acceptance per position"] == "1.50 0.00 0.00"
    assert row["core 0 ms/token"] == "10.00"  # all but the drafter: Ray's control plane shares the verifier's core
    assert row["ceiling tok/s"] == "100.0" and row["ceiling x colocated"] == "1.25" and row["core 0 busy"] == "60%"
    assert row["steps per k (0..K)"] == "0 0 0 7"
    assert dict(zip(columns, rows[3], strict=True))["x target-only"] == ""
    assert "hit rate" not in columns and "prefix hit / miss tokens" not in columns  # empty in every row: left out
    assert "core 0 ms/token" not in served.throughput_rows({**results, "pinning": "none"})[0]


def test_pipeline_figures_and_periods() -> None:
    steps = {"forward_ms": [10.0, 12.0], "sample_ms": [2.0], "period_ms": [14.0, 16.0], "timings": [
        {"all_hits": True, "wait_ms": 0.1, "propose_ms": 0.5}, {"all_hits": True, "wait_ms": 0.3, "propose_ms": 0.7},
        {"all_hits": False, "wait_ms": 5.0, "propose_ms": 6.0}]}
    f = served.pipeline_figures(steps)
    assert f["all_hit_share"] == pytest.approx(2 / 3) and f["hit_wait_ms_median"] == pytest.approx(0.2)
    assert f["miss_wait_ms_median"] == 5.0 and f["forward_ms_median"] == 11.0 and f["steps"] == 3
    periods = [[1, 3, 30.0], [1, 3, 20.0], [1, 0, 15.0], [1, 3, 40.0], [8, 3, 99.0]]
    assert served.periods_by_run_position(periods, range(1, 2)) == {
        0: {"1 (n=1)": 15.0}, 3: {"1 (n=2)": 35.0, "2 (n=1)": 20.0}}


def test_an_endpoint_every_workload_but_agreement_and_shared_prefix(tmp_path: Path, capsys) -> None:
    from tests.benchmarks.fake_server import FakeServer

    with FakeServer() as server:
        assert served.main(["--base-url", server.base, "--label", "fake", "--workload", "prompts", "first-token",
                            "first-request", "idle", "--settle-s", "0", "--window-s", "0.05", *FAST,
                            "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["command"].startswith("python -m benchmarks.served --base-url") and results["date"]
    assert results["commit"] and results["hardware"] and results["pinning"] == "none"
    (run,) = results["runs"]
    assert run["mode"] == "fake" and set(run) >= {"first_request", "idle", "first_token", "prompts"}
    assert run["idle"]["processes"] == []  # an endpoint's processes are not this harness's to read
    c2 = run["prompts"]["2"]
    assert c2["successful"] == 3 and c2["output_tokens"] == 12 and c2["mal"] == 2.0
    assert c2["steps_per_k"] == [0, 3] and c2["prefix_tokens"] == {"hit": 30.0, "miss": 3.0}
    assert c2["cpu_s"] == {} and c2["branches"] == {"lookups": 6.0, "hits": 3.0}
    out = capsys.readouterr().out
    assert "Output tokens/s by mode and concurrency" in out and "first request ms" in out
    assert served.main(["--summary-from", str(tmp_path / "results.json")]) == 0
    assert "Where the first token's time goes" in capsys.readouterr().out


def test_modes_launched_measured_and_tabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cluster.harness

    def fake_server(mode: modes.Mode, pinning: str, tmp: Path, *a: object, **kw: object) -> modes.Server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return modes.Server([sys.executable, "-m", "tests.benchmarks.fake_server", str(port)],
                            f"http://127.0.0.1:{port}")

    monkeypatch.setattr(modes, "server", fake_server)
    monkeypatch.setattr(modes, "wait_for_group", lambda *a, **kw: None)  # the fake cluster has no drafter process
    monkeypatch.setattr(cluster.harness, "stop", fake_stop)
    monkeypatch.setattr(cluster.harness, "PROJECT_ROOT", ROOT)
    assert served.main(["--modes", "target-only", "colocated-eagle3", "cluster-eagle3-k3", *FAST,
                        "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["mode"] for r in results["runs"]] == ["target-only", "colocated-eagle3", "cluster-eagle3-k3"]
    assert results["pinning"] == "strict" and "core 1: the drafter (replica and actor) alone" in results["hardware"]
    run = results["runs"][2]
    assert run["pinned"] == {"serving path": 1} and run["first_request"]["first_s"] > 0
    cpu_s = run["prompts"]["1"]["cpu_s"]  # the fake server's own CPU, read from /proc (ticks of 10 ms: maybe 0)
    assert set(cpu_s) == set(run["prompts"]["1"]["cpu_ms_per_token"]) and cpu_s["serving path"] >= 0
    table = json.loads((tmp_path / "table-throughput.json").read_text())
    assert table["columns"][:4] == ["round", "mode", "workload", "c"] and len(table["rows"]) == 6
    assert "core 0 ms/token" in table["columns"] and table["plot"]["series"] == ["mode", "workload"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "01-run.json").write_text(json.dumps({**table, "question": "Is it fast?", "notes": "A test run."}))
    page = tmp_path / "page" / "BENCHMARKS.md"
    assert report.main(["--results", str(docs), "--out", str(page), "--img", str(tmp_path / "page" / "img")]) == 0
    assert "cluster-eagle3-k3" in page.read_text()


def test_a_bad_mode_is_refused_before_anything_starts(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        served.main(["--modes", "target-only", "cluster-eagle3-k9", "--out", str(tmp_path)])
    assert e.value.code == 2 and "mode 'cluster-eagle3-k9': unknown variant 'k9'" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_long_prompts_are_new_at_each_concurrency(tmp_path: Path, monkeypatch) -> None:
    """The prefix cache keeps a concurrency's prompts: the next concurrency must not see them again."""
    seen: dict[int, list[str]] = {}
    monkeypatch.setattr(served.load, "long_prompts", lambda n, tokens: [f"p{i}-{tokens}" for i in range(n)])
    monkeypatch.setattr(served.load, "drive", lambda *a, **k: None)  # the warm-up

    def at_concurrency(base, pid, prompts, c, args, label, verifier):
        seen[c] = prompts
        return {}

    monkeypatch.setattr(served, "at_concurrency", at_concurrency)
    args = served.parser().parse_args(["--workload", "long-prompts", "--num-prompts", "3", "--concurrency", "1", "4",
                                       "--long-prompt-tokens", "50"])
    run = served.measure_server("m", "http://unused", None, args, tmp_path, 1)
    assert set(run["long_prompts"]) == {"1", "4"}
    assert seen == {1: ["p0-50", "p1-50", "p2-50"], 4: ["p4-50", "p5-50", "p6-50", "p7-50"]}
