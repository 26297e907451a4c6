"""The served benchmarks' one entry: modes x workloads x concurrencies, each mode behind its real HTTP server, into
one results JSON and tables the results page (``benchmarks.report``) renders.

    python -m benchmarks.served --modes target-only colocated-eagle3 cluster-eagle3 [--pinning strict|none]
        [--workload first-request prompts] [--concurrency 1 8 16] [--num-prompts 16] [--max-tokens 128]
        [--rounds 1] [--verifier-timings] [--async-drafting JSON] [--max-model-len N] [--out results/served]
    python -m benchmarks.served --base-url http://127.0.0.1:8000 --workload prompts   # an endpoint already up
    python -m benchmarks.served --summary-from results/served/results.json           # the tables of a past run

Modes and pinning: ``benchmarks.modes`` (e.g. ``cluster-eagle3-k3-async-pyproxy``; ``--pinning strict``: the
verifier side on core 0, the drafter on core 1). Each mode's server is started once per round (``--rounds`` repeats
the mode list, so modes alternate) and runs the workloads in this order:

- ``first-request``: the first request after ready and the median of the next ten (32 greedy tokens each);
- ``idle``: one request, ``--settle-s`` of quiet, then CPU per second of every process over ``--window-s`` of
  idleness, by process and by group (``benchmarks.cpu``);
- ``first-token``: ``--num-prompts`` requests one at a time: client TTFT against vLLM's own engine TTFT and
  prefill from the server's histograms (the serving path's part of the first token);
- ``prompts``: at each concurrency c, ``max(--num-prompts, c)`` shipped prompts (``--prompts``), c streams open at
  once (``benchmarks.load``): the seed-style report, CPU per output token by process group, the cluster's steps per
  chosen k and ``auto``'s goodput table, branch hit rate (pipelined drafting);
- ``shared-prefix``: the same, on prompts that share a ``--prefix-tokens`` held-out prefix, with the drafter's prefix
  cache hit / miss tokens;
- ``long-prompts``: the same, on ``--num-prompts`` distinct held-out prompts of ``--long-prompt-tokens`` each (no
  shared first block: vLLM's prefix cache hits none), for the first token of prefill-heavy steps; with
  ``--max-model-len`` raised to fit (the verifier's and the drafter's, in every mode);
- ``agreement``: at each c, our client and ``vllm bench serve`` in ``--turns`` turns on the same prompts.

``--verifier-timings`` (cluster modes, through Ray): after each concurrency, the verifier's step split
(``VerifierServer.step_timings``): share of steps answered with no drafter awaited and the wait on those, target
forward and sampling + propose, and the draft-length policy's timed periods by k and position in a run of one k.

Writes ``--out``/``results.json`` (``RESULTS_SCHEMA``; the commit, date, hardware and the machine's other busy
processes from ``benchmarks.stamp``) and one ``table-NAME.json`` per table in the results page's format
(``docs/results/*.json``: fill in ``id``, ``question``, ``title`` and ``notes``, ``sources`` is ``SOURCES``, then
``python -m benchmarks.report``); prints the tables. Fault runs: ``benchmarks.faults``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from actors.metrics import SpecDecodeStats
from benchmarks import cpu, load, modes, stamp

ROOT = Path(__file__).resolve().parent.parent
# What a served figure measures (a table's ``sources``: ``benchmarks.report`` marks it stale once they change).
SOURCES = ["actors", "cluster", "deploy/cpu.yaml", "pyproject.toml", "benchmarks/served.py", "benchmarks/modes.py",
           "benchmarks/load.py", "benchmarks/cpu.py", "benchmarks/prompts.jsonl"]
WORKLOADS = ("first-request", "idle", "first-token", "prompts", "shared-prefix", "long-prompts",
             "agreement")  # in run order
LOAD_WORKLOADS = {"prompts": "prompts", "shared-prefix": "shared_prefix", "long-prompts": "long_prompts"}  # name: key
RESULTS_SCHEMA = """\
{"command", "commit", "date", "hardware", "others": [{"pid", "name", "cpu_pct"}] (benchmarks.stamp: "others" absent
 without psutil), "pinning", "workloads", "max_tokens", "num_prompts",
 "runs": [{"mode", "round", "pinned": {group: processes},
           "first_request": {"first_s", "next_median_s"}, "idle": {"groups": {group: ms/s}, "processes": [...]},
           "first_token": {"client", "client_p50", "engine", "prefill", "serving"},
           "prompts" | "shared_prefix" | "long_prompts": {c: {benchmarks.load.Report's fields, "tok_s", "mal",
               "cpu_s": {group: s}, "cpu_ms_per_token": {group: ms}, "steps_per_k", "goodput_estimates",
               "prefix_tokens", "verifier"}},
           "agreement": {c: [{"ours": {metric: value}, "vllm": {...}}]}}]}"""


# --- measuring one server ---------------------------------------------------------------------------------------
class VerifierTimings:
    """The cluster verifier's per-step timings, read and reset through Ray (``VerifierServer.step_timings``)."""

    def __init__(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address="auto", log_to_driver=False)

    def read(self, reset: bool = True) -> dict[str, list]:
        from ray import serve

        from cluster.config import APP_NAME

        handle = serve.get_deployment_handle("Verifier", app_name=APP_NAME)
        return handle.step_timings.remote(reset=reset).result(timeout_s=60)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pipeline_figures(steps: dict[str, list]) -> dict[str, float]:
    """Share of steps answered with no drafter answer awaited, what propose waited on those, and the median split
    of a step on the verifier (target forward; rejection sampling + propose)."""
    timings = steps["timings"]
    hits = [t for t in timings if t["all_hits"]]
    misses = [t for t in timings if not t["all_hits"]]
    return {
        "forward_ms_median": median(steps["forward_ms"]),
        "sample_ms_median": median(steps["sample_ms"]),
        "period_ms_median": median(steps["period_ms"]),
        "steps": len(timings),
        "all_hit_share": len(hits) / len(timings) if timings else 0.0,
        "hit_wait_ms_median": median([t["wait_ms"] for t in hits]),
        "hit_propose_ms_median": median([t["propose_ms"] for t in hits]),
        "miss_wait_ms_median": median([t["wait_ms"] for t in misses]),
    }


def periods_by_run_position(periods: list[list[float]], batch: range) -> dict[int, dict[str, float]]:
    """Median period (ms) by k and by position in a run of steps at one k (1, 2, 3, 4+), over steps whose batch size
    is in ``batch``: whether a k's first steps after a change cost more than its steady ones."""
    cells: dict[tuple[int, int], list[float]] = {}
    run, last = 0, None
    for b, k, ms in periods:
        run = run + 1 if k == last else 1
        last = k
        if int(b) in batch:
            cells.setdefault((int(k), min(run, 4)), []).append(ms)
    out: dict[int, dict[str, float]] = {}
    for (k, pos), v in sorted(cells.items()):
        out.setdefault(k, {})[f"{pos}{'+' if pos == 4 else ''} (n={len(v)})"] = statistics.median(v)
    return out


def at_concurrency(base: str, pid: int | None, prompts: list[str], c: int, args: argparse.Namespace, label: str,
                   verifier: VerifierTimings | None) -> dict[str, Any]:
    """One load run at concurrency ``c``, with the CPU it cost by process group (the tree under ``pid``) and what
    the server's ``/metrics`` (and, with ``verifier``, its step timings) say about it."""
    text = load.metrics_text(base)
    procs = cpu.server_processes(pid) if pid else []
    before = cpu.snapshot(procs)
    if verifier:
        verifier.read(reset=True)
    report = load.drive(base, prompts, args.max_tokens, c or None, label, quiet=True, request_rate=args.request_rate)
    cpu_s = cpu.split(procs, before, cpu.snapshot(procs)) if procs else {}
    after = load.metrics_text(base)
    ks = [b - a for a, b in zip(load.chosen_k(text), load.chosen_k(after), strict=False)]
    prefix_before, prefix_after = load.counters(text, load.PREFIX_COUNTERS), load.counters(after, load.PREFIX_COUNTERS)
    out = {**asdict(report), "tok_s": report.output_throughput, "mal": report.mal, "cpu_s": cpu_s,
           "cpu_ms_per_token": {g: 1000 * s / max(report.output_tokens, 1) for g, s in cpu_s.items()},
           "steps_per_k": ks, "goodput_estimates": load.goodput_estimates(after),
           "prefix_tokens": {k: prefix_after[k] - prefix_before[k] for k in prefix_after}}
    print(report.text(), flush=True)
    if cpu_s:
        print("CPU ms per output token: " + ", ".join(f"{g} {v:.2f}" for g, v in out["cpu_ms_per_token"].items()))
    if ks:
        print(f"steps per chosen k (0..K): {ks}")
    if verifier:
        steps = verifier.read(reset=True)
        low = c // 2 + 1  # the batch sizes of c's bucket (``actors.verifier.draft_length``)
        out["verifier"] = {**pipeline_figures(steps), "periods": steps.get("draft_length_periods", []),
                           "periods_by_run_position": periods_by_run_position(
                               steps.get("draft_length_periods", []), range(low, c + 1))}
    return out


def measure_server(label: str, base: str, pid: int | None, args: argparse.Namespace, tmp: Path, round_: int,
                   pinned: dict[str, list[int]] | None = None, verifier: VerifierTimings | None = None
                   ) -> dict[str, Any]:
    """Every workload of ``args.workload`` (in ``WORKLOADS``' order) on one server that is up: one run's results."""
    from cluster.harness import load_prompts

    run: dict[str, Any] = {"mode": label, "round": round_, "pinned": {g: len(v) for g, v in (pinned or {}).items()}}
    wanted = [w for w in WORKLOADS if w in args.workload]
    n = max([args.num_prompts, *args.concurrency])
    if "first-request" in wanted:
        first, rest = load.first_requests(base)
        run["first_request"] = {"first_s": first, "next_median_s": rest}
        print(f"{label}: first request {first * 1000:.0f} ms, next ten median {rest * 1000:.0f} ms", flush=True)
    if "idle" in wanted:
        load.drive(base, load_prompts(args.prompts, 1), 16, 1, "idle: one request", quiet=True)
        time.sleep(args.settle_s)
        rows = cpu.idle_rates(pid, args.window_s) if pid else []
        run["idle"] = {"groups": cpu.by_group(rows), "processes": rows}
    if "first-token" in wanted:
        run["first_token"] = load.first_tokens(base, load_prompts(args.prompts, args.num_prompts))
    if {*LOAD_WORKLOADS, "agreement"} & set(wanted):
        load.drive(base, load_prompts(None, 4), 8, 4, f"{label} warm-up", quiet=True)
    for workload, key in LOAD_WORKLOADS.items():
        if workload not in wanted:
            continue
        prompts = (load.shared_prefix_prompts(n, args.prefix_tokens, args.suffix_tokens) if workload == "shared-prefix"
                   else load.long_prompts(n * len(args.concurrency), args.long_prompt_tokens)
                   if workload == "long-prompts" else load_prompts(args.prompts, n))
        run[key] = {}
        for i, c in enumerate(args.concurrency):
            # long-prompts: each concurrency its own prompts, or the prefix cache would serve the later ones
            start = i * n if workload == "long-prompts" else 0
            run[key][str(c)] = at_concurrency(base, pid, prompts[start: start + max(args.num_prompts, c)], c, args,
                                              f"{label} {workload} c={c}", verifier)
    if "agreement" in wanted:
        prompts = load_prompts(args.prompts, args.num_prompts)
        run["agreement"] = {str(c): load.agreement(base, prompts, c, args.max_tokens, args.turns, tmp)
                            for c in args.concurrency}
    return run


def measure(mode: modes.Mode, args: argparse.Namespace, tmp: Path, round_: int) -> dict[str, Any]:
    """``mode``'s server launched (``benchmarks.modes.launch``), measured, stopped."""
    with modes.launch(mode, args.pinning, tmp, args.async_drafting, max_model_len=args.max_model_len) as srv:
        verifier = VerifierTimings() if args.verifier_timings and mode.is_cluster else None
        try:
            return measure_server(mode.name, srv.base, srv.proc.pid, args, tmp, round_, srv.pinned, verifier)
        finally:
            if verifier:
                import ray

                ray.shutdown()


def measure_apart(mode: modes.Mode, args: argparse.Namespace, tmp: Path, round_: int) -> dict[str, Any]:
    """``measure`` in a process of its own: Serve's client state (``--verifier-timings``) does not survive one Ray
    cluster being stopped and another started."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, mode, args, tmp, round_).result()


# --- tables -----------------------------------------------------------------------------------------------------
Table = tuple[str, str, list[str], list[list[str]]]  # (name, title, columns, rows)


def _method(mode: str) -> str:
    try:
        return modes.parse(mode).method or "eagle3"
    except modes.ModeError:  # an endpoint's label
        return "eagle3"


def _ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else ""


def throughput_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per run, load workload and concurrency: tok/s, latencies, acceptance, the ratios to vLLM's
    target-only and colocated (same round; colocated with the same head), CPU per token by group and what core 0
    allows (strict pinning), branch hit rate, steps per k. Columns empty in every row are left out."""
    strict = results.get("pinning") == "strict"
    runs = [(r, w, c, v) for r in results["runs"] for w in LOAD_WORKLOADS.values() for c, v in r.get(w, {}).items()]
    tps = {(r["round"], w, c, r["mode"]): v["tok_s"] for r, w, c, v in runs}
    ttft = {(r["round"], w, c, r["mode"]): v["ttft_ms"]["median"] for r, w, c, v in runs}
    columns = ["round", "mode", "workload", "c", "tok/s", "TTFT p50 ms", "TPOT p50 ms", "MAL",
               "acceptance per position", "x target-only", "efficiency", "x colocated", "x the better baseline",
               "TTFT x colocated",
               *(f"{g} CPU ms/token" for g in cpu.GROUPS), "core 0 ms/token", "core 0 busy", "ceiling tok/s",
               "ceiling x colocated", "hit rate", "steps per k (0..K)", "prefix hit / miss tokens"]
    rows = []
    for r, w, c, v in runs:
        colocated = (r["round"], w, c, f"colocated-{_method(r['mode'])}")
        base, colo = tps.get((r["round"], w, c, "target-only")), tps.get(colocated)
        better = max(base or 0.0, colo or 0.0)
        spec, per_tok = v.get("spec"), v.get("cpu_ms_per_token") or {}
        stats = SpecDecodeStats(**spec) if spec else None
        per_pos = " ".join(f"{stats.acceptance_at(i):.2f}" for i in range(len(stats.accepted_per_pos))) if stats else ""
        core0 = cpu.core0_ms_per_token(per_tok) if strict and per_tok else None
        ceiling = 1000 / core0 if core0 else None
        b = v.get("branches")
        prefix = v.get("prefix_tokens") or {}
        rows.append([
            str(r["round"]), r["mode"], w.replace("_", "-"), c, f"{v['tok_s']:.1f}",
            f"{v['ttft_ms']['median']:.0f}", f"{v['tpot_ms']['median']:.2f}", f"{v['mal']:.2f}", per_pos,
            _ratio(v["tok_s"], base), _ratio(v["tok_s"] / v["mal"], base), _ratio(v["tok_s"], colo),
            _ratio(v["tok_s"], better), _ratio(v["ttft_ms"]["median"], ttft.get(colocated)),
            *(f"{per_tok[g]:.2f}" if g in per_tok else "" for g in cpu.GROUPS),
            f"{core0:.2f}" if core0 else "", f"{core0 * v['tok_s'] / 1000:.0%}" if core0 else "",
            f"{ceiling:.1f}" if ceiling else "", _ratio(ceiling, colo) if ceiling else "",
            f"{b['hits'] / b['lookups']:.2f}" if b and b["lookups"] else "",
            " ".join(map(str, v.get("steps_per_k") or [])),
            f"{prefix['hit']:.0f} / {prefix['miss']:.0f}" if any(prefix.values()) else "",
        ])
    keep = [i for i in range(len(columns)) if any(row[i] for row in rows)]
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in rows]


def tables(results: dict[str, Any]) -> list[Table]:
    """Every table a results JSON holds, by workload."""
    runs = results["runs"]
    out: list[Table] = []
    columns, rows = throughput_rows(results)
    if rows:
        out.append(("throughput", f"Output tokens/s by mode and concurrency, pinning {results.get('pinning')}",
                    columns, rows))
    first = [[str(r["round"]), r["mode"], f"{r['first_request']['first_s'] * 1000:.0f}",
              f"{r['first_request']['next_median_s'] * 1000:.0f}",
              f"{r['first_request']['first_s'] / r['first_request']['next_median_s']:.2f}"]
             for r in runs if "first_request" in r]
    if first:
        out.append(("first-request", "The first request after ready (32 greedy tokens)",
                    ["round", "mode", "first request ms", "median of the next ten ms", "ratio"], first))
    idle = [[str(r["round"]), r["mode"], g, f"{ms:.1f}",
             "; ".join(f"{t[:40]} {rate:.1f}" for grp, t, rate in r["idle"]["processes"][:3] if grp == g) or ""]
            for r in runs if "idle" in r for g, ms in r["idle"]["groups"].items()]
    if idle:
        out.append(("idle", "CPU while idle, by process group", ["round", "mode", "group", "ms of CPU per s idle",
                                                                "largest processes (ms/s)"], idle))
    ttft = [[str(r["round"]), r["mode"], *(f"{r['first_token'][k]:.1f}" for k in
                                           ("client", "client_p50", "engine", "prefill", "serving"))]
            for r in runs if "first_token" in r]
    if ttft:
        out.append(("first-token", "Where the first token's time goes (mean ms, one request at a time)",
                    ["round", "mode", "client TTFT", "client TTFT p50", "engine TTFT", "prefill",
                     "serving path (client - engine)"], ttft))
    for r in runs:
        for c, turns in r.get("agreement", {}).items():
            columns, rows = load.agreement_table(turns)
            out.append((f"agreement-{r['mode']}-c{c}-r{r['round']}",
                        f"Our client against vllm bench serve: {r['mode']}, c = {c}", columns, rows))
    return out


def report_table(results: dict[str, Any], name: str, title: str, columns: list[str], rows: list[list[str]]
                 ) -> dict[str, Any]:
    """A table in the results page's format (``benchmarks.report``): ``question`` and ``notes`` left to fill in."""
    table = {"id": name, "question": "", "title": title, "command": results["command"],
             "hardware": results["hardware"], "date": results["date"], "commit": results["commit"],
             "sources": SOURCES, "columns": columns, "rows": rows, "notes": ""}
    if name == "throughput":
        table["plot"] = {"x": "c", "y": ["tok/s"], "series": [c for c in ("mode", "workload") if c in columns],
                         "kind": "line", "logx": True, "ylabel": "output tokens/s"}
    return table


def markdown(columns: list[str], rows: list[list[str]]) -> str:
    return "\n".join([" | ".join(columns), " | ".join("---" for _ in columns), *(" | ".join(r) for r in rows)])


def summary(results: dict[str, Any], out: Path | None = None) -> None:
    """Prints every table (and, with ``out``, writes each as ``table-NAME.json``)."""
    for name, title, columns, rows in tables(results):
        print(f"\n## {title}\n\n{markdown(columns, rows)}")
        if name == "throughput":
            for r in results["runs"]:
                for w in LOAD_WORKLOADS.values():
                    for c, v in r.get(w, {}).items():
                        if v.get("verifier"):
                            print(f"{r['mode']} {w} c={c} verifier: " + ", ".join(
                                f"{k} {x:.2f}" for k, x in v["verifier"].items() if isinstance(x, float | int)))
        if out is not None:
            path = out / f"table-{name}.json"
            path.write_text(json.dumps(report_table(results, name, title, columns, rows), indent=2) + "\n")


# --- the run ----------------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="*", default=["target-only", "colocated-eagle3", "cluster-eagle3"],
                   help="benchmarks.modes names, e.g. cluster-eagle3-k3-async")
    p.add_argument("--base-url", help="measure this endpoint (already up) instead of launching --modes")
    p.add_argument("--label", default="endpoint", help="--base-url: the run's mode label")
    p.add_argument("--pinning", choices=modes.PINNINGS, default="strict")
    p.add_argument("--workload", nargs="*", choices=WORKLOADS, default=["first-request", "prompts"])
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 16], help="0: no cap (with --request-rate)")
    p.add_argument("--request-rate", type=float, help="requests/s, Poisson arrivals (default: all at once)")
    p.add_argument("--num-prompts", type=int, default=16,
                   help="prompts per concurrency, at least the concurrency (so c streams are really open)")
    p.add_argument("--prompts", help="a JSONL prompt file (default: the shipped benchmarks/prompts.jsonl)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1, help="repeat the mode list (modes alternate)")
    p.add_argument("--prefix-tokens", type=int, default=700, help="shared-prefix: the shared prefix's tokens")
    p.add_argument("--suffix-tokens", type=int, default=24, help="shared-prefix: each prompt's own suffix")
    p.add_argument("--long-prompt-tokens", type=int, default=2500, help="long-prompts: each prompt's tokens")
    p.add_argument("--max-model-len", type=int, help="every mode's max_model_len (verifier and drafter; default: "
                   "deploy/cpu.yaml's)")
    p.add_argument("--settle-s", type=float, default=20.0, help="idle: quiet before the window")
    p.add_argument("--window-s", type=float, default=20.0, help="idle: the measured window")
    p.add_argument("--turns", type=int, default=4, help="agreement: turns of the two clients")
    p.add_argument("--verifier-timings", action="store_true",
                   help="cluster modes: the verifier's step split and draft-length periods, through Ray")
    p.add_argument("--async-drafting", type=json.loads, default={},
                   help='drafter.async_drafting settings of *-async modes, e.g. \'{"bonus_fanout": 3}\'')
    p.add_argument("--out", type=Path, default=ROOT / "results" / "served")
    p.add_argument("--summary-from", type=Path, metavar="RESULTS_JSON", help="print an earlier run's tables, exit")
    return p


def main(argv: list[str] | None = None,
         measure_mode: Callable[[modes.Mode, argparse.Namespace, Path, int], dict[str, Any]] | None = None) -> int:
    """``measure_mode``: what measures one mode (default: ``measure``, or ``measure_apart`` with
    ``--verifier-timings``)."""
    p = parser()
    args = p.parse_args(argv)
    if args.summary_from:
        summary(json.loads(args.summary_from.read_text()))
        return 0
    if args.settle_s < 0 or args.window_s <= 0 or args.rounds < 1 or args.turns < 1 or not args.concurrency:
        p.error("--settle-s >= 0, --window-s > 0, --rounds >= 1, --turns >= 1 and a --concurrency are needed")
    try:
        todo = [] if args.base_url else modes.parse_all(args.modes)
    except modes.ModeError as e:
        p.error(str(e))
    measure_mode = measure_mode or (measure_apart if args.verifier_timings else measure)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "benchmarks.served", *(argv if argv is not None else sys.argv[1:])]),
        **stamp.stamp("none" if args.base_url else args.pinning),
        "pinning": "none" if args.base_url else args.pinning, "workloads": args.workload,
        "max_tokens": args.max_tokens, "num_prompts": args.num_prompts, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            if args.base_url:
                results["runs"].append(measure_server(args.label, args.base_url, None, args, Path(tmp), round_))
            for mode in todo:
                results["runs"].append(measure_mode(mode, args, Path(tmp), round_))
                (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    summary(results, args.out)
    print(f"\nresults and tables in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
