"""Do our client's figures agree with ``vllm bench serve``'s? Both clients, same endpoint, same prompts, in turns.

    python -m benchmarks.client_agreement [--base-url http://127.0.0.1:8000] [--num-prompts 32] [--concurrency 4]
        [--max-tokens 64] [--rounds 4]

Without ``--base-url`` it serves the CPU default (``serve run`` of ``deploy/cpu.yaml``) for the run. Each round
runs ``benchmarks.serving`` and vLLM's client (``vllm.benchmarks.serve``, ``custom`` dataset over the same JSONL,
greedy, ``ignore_eos``, no shuffle, no chat template) one after the other, taking turns at going first.
Prints per metric: ours, vLLM's, and vLLM / ours (medians over rounds). Token counts must match exactly; timings
agree within the run-to-run noise, which the table also shows (ours, round to round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import tempfile
from pathlib import Path

from benchmarks.serving import run
from benchmarks.serving_compare import cluster_server
from benchmarks.vllm_bench_serve import main as vllm_bench
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import SHIPPED_PROMPTS, TARGET, load_prompts, start, stop, wait_healthy

# (label, our Report field path, vLLM result key)
METRICS = [
    ("successful requests", ("successful",), "completed"),
    ("output tokens", ("output_tokens",), "total_output_tokens"),
    ("output tokens/s", ("output_throughput",), "output_throughput"),
    ("mean TTFT ms", ("ttft_ms", "mean"), "mean_ttft_ms"),
    ("median TTFT ms", ("ttft_ms", "median"), "median_ttft_ms"),
    ("mean TPOT ms", ("tpot_ms", "mean"), "mean_tpot_ms"),
    ("median TPOT ms", ("tpot_ms", "median"), "median_tpot_ms"),
    ("p99 TPOT ms", ("tpot_ms", "p99"), "p99_tpot_ms"),
    ("mean ITL ms", ("itl_ms", "mean"), "mean_itl_ms"),
    ("median ITL ms", ("itl_ms", "median"), "median_itl_ms"),
    ("mean acceptance length", ("mal",), "spec_decode_acceptance_length"),
    ("client CPU s", ("client_cpu_s",), "client_cpu_s"),
]


def cpu_s() -> float:
    """CPU seconds this process (the client) has used: on 2 shared cores a client's own work slows the server."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ours_flat(report, client_cpu_s: float) -> dict[str, float]:
    d = {"client_cpu_s": client_cpu_s,
        "successful": report.successful, "output_tokens": report.output_tokens,
        "output_throughput": report.output_throughput, "ttft_ms": report.ttft_ms, "tpot_ms": report.tpot_ms,
        "itl_ms": report.itl_ms,
        "mal": 1 + report.spec["num_accepted_tokens"] / report.spec["num_drafts"] if report.spec else 1.0,
    }
    out = {}
    for label, path, _ in METRICS:
        v = d[path[0]]
        out[label] = float(v[path[1]] if len(path) > 1 else v)
    return out


def vllm_flat(result: dict) -> dict[str, float]:
    return {label: float(result.get(key) or 0.0) for label, _, key in METRICS}


def vllm_run(base_url: str, prompts_file: Path, n: int, concurrency: int, max_tokens: int, out: Path) -> dict:
    vllm_bench([
        "--backend", "openai", "--base-url", base_url, "--model", "llama4-tiny",
        "--tokenizer", str(TARGET), "--dataset-name", "custom",
        "--dataset-path", str(prompts_file), "--num-prompts", str(n), "--custom-output-len", str(max_tokens),
        "--skip-chat-template", "--disable-shuffle", "--ignore-eos", "--temperature", "0",
        "--max-concurrency", str(concurrency), "--save-result", "--result-dir", str(out),
        "--result-filename", "vllm.json", "--disable-tqdm",
    ])
    return json.loads((out / "vllm.json").read_text())


def compare(base_url: str, n: int, concurrency: int, max_tokens: int, rounds: int, tmp: Path) -> list[dict]:
    prompts = load_prompts(None, n)
    prompts_file = tmp / "prompts.jsonl"  # exactly the n prompts ours sends, in order
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    asyncio.run(run(base_url, prompts[:4], 8, 4, None, "warm-up", quiet=True))
    rows = []
    for i in range(rounds):
        row = {}
        for who in ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours"):  # alternate who goes first
            t0 = cpu_s()
            if who == "ours":
                report = asyncio.run(run(base_url, prompts, max_tokens, concurrency, None, f"ours, round {i + 1}"))
                row["ours"] = ours_flat(report, cpu_s() - t0)
            else:
                result = vllm_run(base_url, prompts_file, n, concurrency, max_tokens, tmp)
                result["client_cpu_s"] = cpu_s() - t0
                row["vllm"] = vllm_flat(result)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["metric | ours | vllm bench serve | vllm / ours | ours, round-to-round spread",
             "--- | ---: | ---: | ---: | ---:"]
    for label, _, _ in METRICS:
        ours = [r["ours"][label] for r in rows]
        theirs = [r["vllm"][label] for r in rows]
        o, t = statistics.median(ours), statistics.median(theirs)
        spread = (max(ours) - min(ours)) / o if o else 0.0
        ratio = f"{t / o:.3f}" if o else "n/a"
        lines.append(f"{label} | {o:.2f} | {t:.2f} | {ratio} | {spread:.1%}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", help="an endpoint already up (default: serve deploy/cpu.yaml for the run)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "results" / "client_agreement"))
    args = p.parse_args()
    print(f"prompts: {SHIPPED_PROMPTS.relative_to(ROOT)} (first {args.num_prompts}), c={args.concurrency}, "
          f"max_tokens={args.max_tokens}, rounds={args.rounds}")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        proc = None
        base = args.base_url
        if base is None:
            cmd, base = cluster_server("eagle3", tmp)
            proc = start(cmd)
        try:
            if proc is not None:
                wait_healthy(proc, base)
            rows = compare(base, args.num_prompts, args.concurrency, args.max_tokens, args.rounds, tmp)
        finally:
            if proc is not None:
                stop(proc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
