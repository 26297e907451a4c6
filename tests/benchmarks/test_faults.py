"""``benchmarks.faults``: its clients on a fake server (``tests.benchmarks.fake_server``): streams checked against
reference tokens, overload's statuses and exactness, the ``/metrics`` scraper; memory by command line; and the
command line (every run's default mode is a cluster mode; anything else is refused). No vLLM, no Ray."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from benchmarks import faults, modes
from tests.benchmarks.fake_server import FakeServer


def fake_ids(prompt: str, n: int) -> list[int]:
    return [(len(prompt) + i) % 100 for i in range(n)]


def test_streams_count_requests_and_outputs_that_differ() -> None:
    prompts = ["a", "bb", "ccc"]
    ref = {p: fake_ids(p, 4) for p in prompts}
    ref["bb"] = [0, 0, 0, 0]  # this one will differ
    ticks = []
    with FakeServer(token_delay_s=0.01) as server:
        out = asyncio.run(faults.streams(server.base, prompts, ref, 3, 4, lambda: float("inf"),
                                         lambda: ticks.append(1), per_stream=2))
    assert out["requests"] == 6 and out["failed"] == [] and out["wrong"] == 2
    assert 0 < out["max_gap_s"] < 5 and ticks


def test_overload_takes_reference_tokens_first_and_checks_every_200() -> None:
    with FakeServer() as server:
        out = asyncio.run(faults.overload(server.base, ["a", "bb"], None, 4, 10, 3))
    assert out["statuses"] == {200: 10} and out["wrong"] == 0 and out["retry_after"] == []


def test_requests_and_the_scraper() -> None:
    done = []
    with FakeServer() as server:
        scraper = faults.Scraper(server.base, period_s=0.05)
        scraper.start()
        out = asyncio.run(faults.requests(server.base, ["a"], 5, 2, 3, done.append))
        time.sleep(0.2)
        scraper.done.set()
        scraper.join()
    assert out == {"ok": 5, "failed": 0} and sorted(done) == [1, 2, 3, 4, 5]
    assert len(scraper.scrapes) >= 2 and scraper.errors == 0 and all(size > 0 for _, _, size in scraper.scrapes)


def test_rss_by_command_line_marker() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)  # rss-marker-7f3a"])
    try:
        deadline = time.time() + 10
        while faults.rss_mb("rss-marker-7f3a") == 0:
            assert time.time() < deadline
            time.sleep(0.05)
        assert 1 < faults.rss_mb("rss-marker-7f3a") < 1000
    finally:
        child.kill()
        child.wait()
    assert faults.rss_mb("rss-marker-nothing-has-this") == 0


@pytest.mark.parametrize("run", list(faults.RUNS))
def test_every_run_defaults_to_a_cluster_mode(run: str) -> None:
    args = faults.parser().parse_args([run])
    assert modes.parse(args.mode).is_cluster


def test_a_mode_that_is_not_a_cluster_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        faults.main(["overload", "--mode", "target-only"])
    assert "fault runs need a cluster mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        faults.main(["overload", "--mode", "cluster-eagle3-k7"])
    assert "unknown variant 'k7'" in capsys.readouterr().err
