"""``benchmarks.offline``: the draft-length simulation end to end on a few steps (no engine), and one subcommand per
comparison. (The vLLM comparisons themselves start engines: their parts run in ``tests/actors`` and
``tests/cluster``.)"""

from __future__ import annotations

import random

import pytest

from benchmarks import offline


def test_draft_length_sim_prints_each_batch(capsys: pytest.CaptureFixture[str]) -> None:
    offline.main(["draft-length-sim", "--seeds", "1", "--steps", "60"])
    stamped, *lines = capsys.readouterr().out.splitlines()
    assert stamped.startswith("# stamp: {") and '"commit": ' in stamped
    assert [line.split(":")[0] for line in lines] == [f"batch {b}" for b in offline.COSTS]
    for line in lines:
        assert "auto / best fixed = " in line and "steps per k = [" in line


def test_drive_counts_tokens_per_ms_of_a_fixed_k() -> None:
    from actors.verifier.draft_length import FixedDraftLength

    ks, rate = offline.drive(FixedDraftLength(0), 4, lambda t, k: 10.0, 5, random.Random(0))
    assert ks == [0] * 5 and rate == pytest.approx(4 / 10.0)  # k = 0: one token per sequence and step


def test_the_command_line_has_one_subcommand_per_comparison() -> None:
    p = offline.parser()
    for run in ("colocated", "disaggregated", "multimodal", "drafter-speed", "draft-length-sim", "runners"):
        assert p.parse_args([run]).run == run
    assert set(offline.RUNS) == {"colocated", "disaggregated", "multimodal", "drafter-speed", "draft-length-sim",
                                 "runners", "runner-arm"}


def test_runners_arms_name_a_runner_each() -> None:
    """``runners`` starts one ``runner-arm`` process per arm: V1, V2, and V2 with asynchronous scheduling."""
    p = offline.parser()
    assert p.parse_args(["runners"]).arms == ["v1", "v2", "v2-async"]
    arm = p.parse_args(["runner-arm", "--arm", "v2-async", "--out", "x.json"])
    assert (arm.arm, arm.out, arm.concurrency) == ("v2-async", "x.json", [1, 8])
    assert {name: flag for name, (flag, _) in offline.RUNNER_ARMS.items()} == {"v1": "0", "v2": "1", "v2-async": "1"}
    assert offline.RUNNER_ARMS["v2-async"][1] == {"async_scheduling": True}
    with pytest.raises(SystemExit):
        p.parse_args(["runner-arm", "--out", "x.json"])  # which arm is required
