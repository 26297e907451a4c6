"""``benchmarks.drafter``: ``device --small`` runs on a CPU with nothing but torch, numpy, msgpack and the drafter
code (the GPU machine has no vLLM, Ray, pydantic, transformers, safetensors, huggingface_hub or psutil; the whole
module imports there) and prints its stamp (without ``others``) and figures; ``step`` times the shipped heads on a
few steps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT  # the repository root: `benchmarks` there, not tests/benchmarks

ABSENT = ["vllm", "ray", "pydantic", "transformers", "safetensors", "huggingface_hub", "yaml", "cluster", "psutil"]
# Each absent package made unimportable, then the benchmark run as ``python -m`` would run it.
RUN = (
    "import runpy, sys\n"
    f"for name in {ABSENT!r}:\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['drafter', 'device', '--small', '--steps', '2', '--batch', '1', '3', '--context', '16', "
    "'--fixed-shape', 'on', '--branches']\n"
    "runpy.run_module('benchmarks.drafter', run_name='__main__')\n"
)


def test_small_mode_prints_figures_without_vllm_or_ray():
    out = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first = out.stdout.splitlines()[0]
    assert first.startswith("# stamp: ")
    stamped = json.loads(first.removeprefix("# stamp: "))
    assert set(stamped) == {"commit", "date", "hardware"} and "drafter engine alone" in stamped["hardware"]
    rows = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith("eagle")]
    assert [(r[0], r[1], r[2]) for r in rows] == [(h, b, "16") for h in ("eagle", "eagle3") for b in ("1", "3")]
    branches = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith("branches: eagle")]
    assert [(r[0], r[1], r[3]) for r in branches] == [(f"branches: {h}", b, "torch") for h in ("eagle", "eagle3")
                                                      for b in ("1", "3")]
    for *_, rows_drafted, answer, after, passes in branches:
        assert float(rows_drafted) > 0 and min(float(answer), float(after), float(passes)) > 0
    for row in rows:
        _, batch, _, kernel, engine, host, floor, graph_floor = row[:8]
        attention, tbs, roofline, recompute, ratio, goal, kv_seq, kv = row[8:]
        assert kernel == "torch"  # a CPU: torch's attention, no graphs
        assert min(float(engine), float(host), float(floor), float(recompute), float(ratio), float(goal)) > 0
        assert float(host) <= float(engine)
        assert graph_floor == attention == tbs == roofline == "-"  # CUDA-only columns
        # Dense per slot: 1 layer x (K, V) x max_len x 2 KV heads x head dim 16 x 4 bytes (float32 on a CPU), where
        # max_len = context 16 + 2 rows x (2 timed + 2) steps + k 3 + 1, plus the cache's one spare position.
        assert float(kv_seq) == pytest.approx(2 * (16 + 2 * 4 + 3 + 1 + 1) * 2 * 16 * 4 / 2**20, rel=1e-3)
        assert float(kv) == pytest.approx(float(kv_seq) * int(batch), rel=1e-3)  # the engine is capped at the batch


def test_step_times_a_shipped_head(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import drafter

    drafter.main(["step", "--heads", "eagle3", "--batch", "2", "--steps", "3", "--shuffled", "--gap-ms", "0", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("eagle3 |")]
    assert [(r[0], r[1], r[2]) for r in rows] == [("eagle3", "2", "0"), ("eagle3", "2", "1")]
    assert all(float(r[3]) > 0 for r in rows)


def test_the_command_line_has_one_subcommand_per_benchmark() -> None:
    from benchmarks import drafter

    for argv in (["device", "--small"], ["step"], ["ray-call"]):
        assert drafter.parser().parse_args(argv).run == argv[0]
    with pytest.raises(SystemExit):
        drafter.parser().parse_args([])
