"""Offline comparisons, no HTTP server: vLLM's engines in this process (and the drafter as a Ray actor), or the
draft-length policy in simulation. One subcommand each:

    python -m benchmarks.offline colocated [--heads NAME ...] [--num-prompts 30] [--k 3] [--max-tokens 128]
    python -m benchmarks.offline disaggregated [--method eagle|eagle3] [--concurrency 1 16] [--k 3]
    python -m benchmarks.offline multimodal [--num-prompts 12] [--k 3] [--max-tokens 64]
    python -m benchmarks.offline drafter-speed [--heads eagle eagle3] [--batch 1 16]
    python -m benchmarks.offline draft-length-sim [--seeds 12] [--steps 1500] [--noise 0.25]
    python -m benchmarks.offline runners [--arms v1 v2 v2-async] [--concurrency 1 8] [--json FILE]

- ``colocated``: vLLM's own colocated speculative decoding on the shipped heads (greedy, held-out prompts, the
  seed PRs' acceptance table): the reference acceptance figures.
- ``disaggregated``: output tokens/s of vLLM target-only, vLLM colocated EAGLE and the disaggregated path (vLLM
  verifier + drafter actor), same prompts and checkpoints; concurrency c = the engine's ``max_num_seqs``, all prompts
  submitted at once. Per mode: tok/s, mean acceptance length, and the median step split on the verifier (target
  forward, sampling + propose; for the disaggregated path, shipping, waiting, drafter compute); then speedup,
  efficiency = speedup / acceptance length, and disaggregated / colocated.
- ``multimodal``: image prompts on the multimodal checkpoint (``cluster.image_runs``): target-only, vLLM colocated,
  the disaggregated path shipping image embeddings, and drafting from placeholder ids; exactness and acceptance.
- ``drafter-speed``: the drafter engine's time per draft step against vLLM's own in-process draft of the same
  head, same batch, one core each (vLLM on core 0, the drafter actor on core 1, one torch thread), full-batch decode
  steps only.
- ``draft-length-sim``: ``auto``'s rule (``actors.verifier.draft_length.AutoDraftLength``) against the best fixed k,
  driven as the proposer drives it on per-k step costs measured held on this machine, with its noise (log-normal
  per step, 3% pauses of 2.5x, a slow +-25% drift). No engine.
- ``runners``: vLLM's model runner V1 against V2 (synchronous and asynchronous scheduling) for target-only and the
  cluster, each arm in a process of its own (``runner-arm``); on a CPU, V2's kernels run in Triton's interpreter.

Each run prints ``benchmarks.stamp``'s line first (commit, date, hardware, the machine's other busy processes);
``--json`` files hold the same stamp with the figures under ``figures``. The runs that start Ray want a shared
machine's ``flock /work/ray.lock``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import stamp

NAMESPACE = "bench-offline"
PIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --- vLLM colocated on the shipped heads --------------------------------------------------------------------------
COLOCATED_HEADS = {"eagle-llama4-tiny-1l": "eagle", "eagle-llama4-tiny-3l": "eagle", "eagle3-llama4-tiny": "eagle3"}


def run_colocated(head: str, prompts: list[str], k: int, max_tokens: int) -> tuple[Any, int, float]:
    """(``SpecDecodeStats``, output tokens, seconds) of one colocated run of the shipped head ``head``."""
    from vllm import SamplingParams

    from actors.metrics import from_vllm_metrics
    from actors.vllm_engine import make_llm
    from cluster.harness import MODELS, TARGET

    config = json.loads((MODELS / head / "config.json").read_text())
    method = COLOCATED_HEADS.get(head) or ("eagle3" if "Eagle3" in config["architectures"][0] else "eagle")
    llm = make_llm(str(TARGET), speculative_config={"method": method, "model": str(MODELS / head),
                                                    "num_speculative_tokens": k})
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    stats = from_vllm_metrics(llm.get_metrics())
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    return stats, tokens, seconds


def colocated(args: argparse.Namespace) -> None:
    from cluster.harness import heldout_prompts

    prompts = heldout_prompts(args.num_prompts)
    summary = []
    for head in args.heads:
        stats, tokens, seconds = run_colocated(head, prompts, args.k, args.max_tokens)
        print(f"\n=== {head} (vLLM colocated, k={args.k}, {len(prompts)} held-out prompts, greedy) ===")
        print(stats.table(tokens))
        summary.append((head, stats.mean_acceptance_length, tokens / seconds))
    print("\nhead | mean acceptance length | output tok/s")
    for head, mal, tps in summary:
        print(f"{head} | {mal:.2f} | {tps:.0f}")


# --- target-only / colocated / disaggregated, offline ---------------------------------------------------------------
def run_mode(mode: str, method: str, k: int, prompts: list[str], max_tokens: int, concurrency: int,
             **engine: Any) -> dict:
    """One offline run: ``mode`` ``target-only``, ``colocated`` or ``disaggregated`` (the drafter actor
    ``bench-drafter``); ``engine``: more engine arguments (e.g. ``async_scheduling``)."""
    from vllm import SamplingParams

    from actors.metrics import from_vllm_metrics
    from actors.verifier.engine import make_verifier_llm
    from cluster.harness import HEADS, TARGET

    spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": k}
    client = {"actor": "bench-drafter", "namespace": NAMESPACE} if mode == "disaggregated" else None
    llm = make_verifier_llm(str(TARGET), None if mode == "target-only" else spec, client, max_num_seqs=concurrency,
                            **engine)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)  # warm-up
    llm.collective_rpc("eagle_cluster_reset_stats")
    before = from_vllm_metrics(llm.get_metrics())
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    stats = from_vllm_metrics(llm.get_metrics()) - before
    rpc = next(r for r in llm.collective_rpc("eagle_cluster_stats") if r["is_driver"])
    del llm
    gc.collect()
    t = rpc["timings"]
    return {
        "tokens": sum(len(o.outputs[0].token_ids) for o in outs), "seconds": seconds,
        "mal": stats.mean_acceptance_length, "forward_ms": med(rpc["forward_ms"]), "sample_ms": med(rpc["sample_ms"]),
        "ship_ms": med([x["ship_ms"] for x in t]), "wait_ms": med([x["wait_ms"] for x in t]),
        "compute_ms": med([x["compute_ms"] for x in t]),
        "overhead_ms": med([x["ship_ms"] + x["wait_ms"] for x in t]), "failures": rpc["failures"],
    }


def disaggregated(args: argparse.Namespace) -> None:
    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    from cluster.harness import HEADS, TARGET, heldout_prompts

    prompts = heldout_prompts(args.num_prompts)
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    # Keep the handle: a named actor lives while a handle does.
    drafter = start_drafter_actor(DrafterSettings(str(HEADS[args.method]), str(TARGET),
                                                  num_threads=args.drafter_threads),
                                  name="bench-drafter", namespace=NAMESPACE)
    print(f"head {HEADS[args.method].name}, k={args.k}, {len(prompts)} prompts x {args.max_tokens} tokens, greedy, "
          f"drafter threads {args.drafter_threads}")
    print("conc | mode | tok/s | MAL | fwd ms | sample ms | ship ms | wait ms | draft ms | ship+wait")
    for c in args.concurrency:
        res = {m: run_mode(m, args.method, args.k, prompts, args.max_tokens, c)
               for m in ("target-only", "colocated", "disaggregated")}
        for m, r in res.items():
            print(f"{c} | {m} | {r['tokens'] / r['seconds']:.1f} | {r['mal']:.2f} | {r['forward_ms']:.2f} | "
                  f"{r['sample_ms']:.2f} | {r['ship_ms']:.2f} | {r['wait_ms']:.2f} | {r['compute_ms']:.2f} | "
                  f"{r['overhead_ms']:.2f}")
        tps = {m: r["tokens"] / r["seconds"] for m, r in res.items()}
        speedup = tps["disaggregated"] / tps["target-only"]
        print(f"conc {c}: speedup (c)/(a) {speedup:.2f}, efficiency {speedup / res['disaggregated']['mal']:.2f}, "
              f"(c)/(b) {tps['disaggregated'] / tps['colocated']:.2f}, "
              f"(b)/(a) {tps['colocated'] / tps['target-only']:.2f}")
    ray.kill(drafter)
    ray.shutdown()


# --- model runner V1 against V2, side by side -------------------------------------------------------------------------
# arm -> (VLLM_USE_V2_MODEL_RUNNER, engine arguments). V2 runs on a CPU through Triton's interpreter.
RUNNER_ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "v1": ("0", {}), "v2": ("1", {}), "v2-async": ("1", {"async_scheduling": True})}


def runner_arm(args: argparse.Namespace) -> None:
    """One arm of ``runners`` in this process (the runner is fixed per process once an engine has started):
    target-only and the cluster at each concurrency, written as JSON to ``args.out``."""
    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    from cluster.harness import HEADS, TARGET, heldout_prompts

    _, engine = RUNNER_ARMS[args.arm]
    prompts = heldout_prompts(args.num_prompts)
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    drafter = start_drafter_actor(DrafterSettings(str(HEADS["eagle3"]), str(TARGET)), name="bench-drafter",
                                  namespace=NAMESPACE)
    out = {f"{mode}@{c}": run_mode(mode, "eagle3", args.k, prompts, args.max_tokens, c,
                                   **(engine if mode != "target-only" else {}))
           for c in args.concurrency for mode in ("target-only", "disaggregated")}
    ray.kill(drafter)
    ray.shutdown()
    Path(args.out).write_text(json.dumps(out))


def runners(args: argparse.Namespace) -> None:
    """Model runner V1 against V2 (synchronous and asynchronous scheduling) on this machine, one process per arm
    run one after the other, same prompts: tok/s of target-only and the cluster (EAGLE-3), and V2 / V1."""
    import subprocess
    import sys
    import tempfile

    print(f"EAGLE-3 k={args.k}, {args.num_prompts} held-out prompts x {args.max_tokens} tokens, greedy, all cores "
          f"shared; c = max_num_seqs, all prompts at once")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            flag, _ = RUNNER_ARMS[arm]
            env = {**os.environ, "VLLM_USE_V2_MODEL_RUNNER": flag}
            if flag == "1":
                env["TRITON_INTERPRET"] = "1"  # actors/triton_interpreter.py, installed by the Makefile
            out = Path(tmp) / f"{arm}.json"
            cmd = [sys.executable, "-m", "benchmarks.offline", "runner-arm", "--arm", arm, "--out", str(out),
                   "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens), "--k", str(args.k),
                   "--concurrency", *map(str, args.concurrency)]
            subprocess.run(cmd, env=env, check=True)
            results[arm] = json.loads(out.read_text())
    print("arm | mode | c | tok/s | MAL | x v1 (same mode, c)")
    for arm, res in results.items():
        for key, r in res.items():
            mode, c = key.split("@")
            base = results.get("v1", {}).get(key)
            ratio = (r["tokens"] / r["seconds"]) / (base["tokens"] / base["seconds"]) if base else float("nan")
            print(f"{arm} | {mode} | {c} | {r['tokens'] / r['seconds']:.1f} | {r['mal']:.2f} | {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({**args.stamp, "figures": results}, indent=2))


# --- image prompts --------------------------------------------------------------------------------------------------
def _mm_row(name: str, same: bool | str, s: Any) -> str:
    per_pos = " ".join(f"{a}" for a in s.accepted_per_pos)
    return (f"{name:<34} | {str(same):<5} | {s.num_drafts:>6} | {s.num_draft_tokens:>6} | {s.num_accepted_tokens:>6} "
            f"| {s.mean_acceptance_length:.3f} | {per_pos}")


def multimodal(args: argparse.Namespace) -> None:
    import ray

    from cluster.image_runs import TARGET, cluster, image_prompts, target_only
    from cluster.image_runs import colocated as mm_colocated

    prompts = image_prompts(args.num_prompts, max_text_chars=args.max_text_chars)
    ns = "bench-multimodal"
    ray.init(namespace=ns, num_cpus=4, include_dashboard=False, log_to_driver=False)
    ref, _ = target_only(prompts, args.max_tokens)
    results = {}
    print(f"\n{len(prompts)} image + text prompts ({sum(len(q['multi_modal_data']['image']) for q in prompts)} "
          f"images), greedy, {args.max_tokens} tokens, k={args.k}; target {TARGET.name}")
    print(f"{'run':<34} | same  | drafts | draft tokens | accepted | mean acc. len | accepted per position")
    for method in args.methods:
        colo_tokens, colo = mm_colocated(method, prompts, args.k, args.max_tokens)
        tokens, stats, rpc = cluster(method, prompts, args.k, args.max_tokens, ns)
        old_tokens, old, old_rpc = cluster(method, prompts, args.k, args.max_tokens, ns, mm_embeds=False)
        print(_mm_row(f"{method}: vLLM colocated", colo_tokens == ref, colo))
        print(_mm_row(f"{method}: cluster, image embeddings", tokens == ref, stats))
        print(_mm_row(f"{method}: cluster, placeholder ids", old_tokens == ref, old))
        rel = abs(stats.num_accepted_tokens - colo.num_accepted_tokens) / max(colo.num_accepted_tokens, 1)
        print(f"{method}: accepted tokens, cluster vs colocated: {100 * rel:.2f}% apart; image rows shipped "
              f"{rpc['mm_rows_shipped']} in {rpc['mm_steps']} of {rpc['steps']} steps (placeholder-id run: "
              f"{old_rpc['mm_rows_shipped']} rows, {old_rpc['mm_steps']} steps)")
        results[method] = {
            "colocated": vars(colo), "cluster": vars(stats), "placeholder_ids": vars(old),
            "identical": {"colocated": colo_tokens == ref, "cluster": tokens == ref,
                          "placeholder_ids": old_tokens == ref},
            "mm_rows_shipped": rpc["mm_rows_shipped"], "mm_steps": rpc["mm_steps"], "steps": rpc["steps"],
        }
    ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({**args.stamp, "figures": results}, indent=2, default=list))


# --- the drafter engine's step against vLLM's own draft step ------------------------------------------------------
SPEED_K = 3


def draft_step_ms(method: str, remote: bool, prompts: list[str], concurrency: int, max_tokens: int) -> list[float]:
    """Per-step draft milliseconds of the full-batch decode steps: vLLM's in-process ``propose`` (``local_propose``)
    or the drafter actor's compute (``DraftResult.compute_ms``)."""
    from vllm import SamplingParams

    from actors.verifier.engine import make_verifier_llm
    from cluster.harness import HEADS, TARGET

    spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": SPEED_K}
    client = {"actor": f"drafter-{method}", "namespace": NAMESPACE} if remote else None
    llm = make_verifier_llm(str(TARGET), spec, client, max_num_seqs=concurrency)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)  # warm-up
    llm.collective_rpc("eagle_cluster_reset_stats")
    llm.generate(prompts, params, use_tqdm=False)
    rpc = next(r for r in llm.collective_rpc("eagle_cluster_stats") if r["is_driver"])
    del llm
    gc.collect()
    decode = concurrency * (SPEED_K + 1)
    if remote:
        return [t["compute_ms"] for t in rpc["timings"] if t["batch_size"] == concurrency and t["num_tokens"] <= decode]
    return [ms for batch, rows, ms in rpc["local_propose"] if batch == concurrency and rows <= decode]


def drafter_speed(args: argparse.Namespace) -> None:
    os.environ.update(PIN_ENV)  # before vLLM is imported
    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    from cluster.harness import HEADS, TARGET, heldout_prompts

    prompts = heldout_prompts(args.num_prompts)
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    print(f"{len(prompts)} prompts x {args.max_tokens} tokens, k={SPEED_K}, greedy; vLLM on core 0, drafter on "
          "core 1")
    print("method | batch | vLLM colocated draft ms (median) | drafter engine ms (median) | drafter / vLLM | steps")
    for method in args.heads:
        settings = DrafterSettings(str(HEADS[method]), str(TARGET), num_threads=1, cpu_affinity=(1,))
        actor = start_drafter_actor(settings, name=f"drafter-{method}", namespace=NAMESPACE)
        for c in args.batch:
            local = draft_step_ms(method, False, prompts, c, args.max_tokens)
            remote = draft_step_ms(method, True, prompts, c, args.max_tokens)
            a, b = med(local), med(remote)
            print(f"{method} | {c} | {a:.2f} | {b:.2f} | {b / a:.2f} | {len(local)} / {len(remote)}", flush=True)
        ray.kill(actor)
    ray.shutdown()


# --- the draft-length policy in simulation ------------------------------------------------------------------------
ACCEPT = (0.74, 0.43, 0.26)  # P(draft i accepted): mean acceptance lengths 1.74 / 2.17 / 2.43 at k = 1 / 2 / 3
COSTS = {  # step period ms by k = 0..3, measured held (strict pinning; c = 4 interpolated)
    1: [16.6, 28.0, 29.0, 30.0],
    4: [18.0, 33.0, 36.0, 39.0],
    8: [20.6, 42.6, 48.6, 54.5],
}


def drive(policy: Any, batch: int, period: Callable[[int, int], float], steps: int, rng: random.Random,
          accept: Sequence[float] = ACCEPT, after_step: Callable[[], None] | None = None) -> tuple[list[int], float]:
    """Drive ``policy`` (an ``actors.verifier.draft_length.DraftLength``) as the proposer does for ``steps`` steps:
    choose k, verify each sequence's drafts (draft i accepted with probability ``accept[i]``, drawn from ``rng``),
    then time the step (``period(t, k)`` ms, which may draw from ``rng`` after the acceptance draws). Returns the k
    per step and the output tokens per ms."""
    ks: list[int] = []
    tokens = elapsed = 0.0
    for t in range(steps):
        k = policy.choose(batch)
        previous = ks[-1] if ks else None
        ks.append(k)
        for _ in range(batch):
            a = 0
            while a < k and rng.random() < accept[a] / (accept[a - 1] if a else 1.0):
                a += 1
            policy.observe_acceptance(k, a)
            tokens += 1 + a
        ms = period(t, k)
        elapsed += ms
        policy.observe_period(batch, k, ms, previous_k=previous)
        if after_step is not None:
            after_step()
    return ks, tokens / elapsed


def simulate(policy: Any, batch: int, costs: list[float], steps: int, seed: int, noise: float
             ) -> tuple[list[int], float]:
    """``drive`` with this machine's noise on ``costs`` (ms per step by k): log-normal per step, a slow +-25% drift,
    3% pauses of 2.5x."""
    rng = random.Random(seed)

    def period(t: int, k: int) -> float:
        ms = costs[k] * (1 + 0.25 * math.sin(t / 150.0)) * math.exp(rng.gauss(0.0, noise))
        return ms * 2.5 if rng.random() < 0.03 else ms  # a pause

    return drive(policy, batch, period, steps, rng)


def draft_length_sim(args: argparse.Namespace) -> None:
    from actors.verifier.draft_length import AutoDraftLength, FixedDraftLength

    seeds = range(args.seeds)
    for batch, costs in COSTS.items():
        fixed = {k: [simulate(FixedDraftLength(k), batch, costs, args.steps, s, args.noise)[1] for s in seeds]
                 for k in range(len(costs))}
        best = max(fixed, key=lambda k: sum(fixed[k]))
        ratios, steps_at = [], [0] * len(costs)
        for s in seeds:
            ks, rate = simulate(AutoDraftLength(len(costs) - 1), batch, costs, args.steps, s, args.noise)
            ratios.append(rate / fixed[best][s])
            for k in ks:
                steps_at[k] += 1
        print(f"batch {batch}: best fixed k = {best}; auto / best fixed = {sum(ratios) / len(ratios):.3f} "
              f"(min {min(ratios):.3f} over {len(ratios)} seeds); steps per k = {steps_at}", flush=True)


# --- the command line -----------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="run", required=True)
    s = sub.add_parser("colocated", help="vLLM colocated on the shipped heads: the reference acceptance")
    s.add_argument("--heads", nargs="*", default=list(COLOCATED_HEADS))
    s.add_argument("--num-prompts", type=int, default=30)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--max-tokens", type=int, default=128)
    s = sub.add_parser("disaggregated", help="target-only vs colocated vs disaggregated, tok/s and step split")
    s.add_argument("--method", choices=["eagle", "eagle3"], default="eagle")
    s.add_argument("--concurrency", type=int, nargs="*", default=[1, 16])
    s.add_argument("--num-prompts", type=int, default=16)
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--drafter-threads", type=int, default=2, help="torch threads in the drafter actor")
    s = sub.add_parser("multimodal", help="image prompts: cluster vs vLLM colocated vs placeholder ids")
    s.add_argument("--num-prompts", type=int, default=12)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--methods", nargs="*", default=["eagle", "eagle3"])
    s.add_argument("--max-text-chars", type=int, help="cut each prompt's text (so drafting stays near the images)")
    s.add_argument("--json", help="write the figures here too")
    s = sub.add_parser("drafter-speed", help="the drafter engine's step vs vLLM's own draft step, one core each")
    s.add_argument("--heads", nargs="*", choices=["eagle", "eagle3"], default=["eagle", "eagle3"])
    s.add_argument("--batch", type=int, nargs="*", default=[1, 16], help="max_num_seqs, all prompts at once")
    s.add_argument("--num-prompts", type=int, default=16)
    s.add_argument("--max-tokens", type=int, default=128)
    for name, help_ in (("runners", "model runner V1 vs V2 (sync and async scheduling), one process per arm"),
                        ("runner-arm", "one arm of runners (its own process)")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--concurrency", type=int, nargs="*", default=[1, 8])
        s.add_argument("--num-prompts", type=int, default=16)
        s.add_argument("--max-tokens", type=int, default=64)
        s.add_argument("--k", type=int, default=3)
        if name == "runners":
            s.add_argument("--arms", nargs="*", choices=list(RUNNER_ARMS), default=list(RUNNER_ARMS))
            s.add_argument("--json", help="write the figures here too")
        else:
            s.add_argument("--arm", choices=list(RUNNER_ARMS), required=True)
            s.add_argument("--out", required=True)
    s = sub.add_parser("draft-length-sim", help="auto's rule against the best fixed k, in simulation")
    s.add_argument("--seeds", type=int, default=12)
    s.add_argument("--steps", type=int, default=1500)
    s.add_argument("--noise", type=float, default=0.25)
    return p


RUNS: dict[str, Callable[[argparse.Namespace], None]] = {
    "colocated": colocated, "disaggregated": disaggregated, "multimodal": multimodal,
    "drafter-speed": drafter_speed, "draft-length-sim": draft_length_sim, "runners": runners,
    "runner-arm": runner_arm}


# Where each run's processes are (the stamp's hardware); the rest share every core.
PLACEMENT = {"drafter-speed": "vLLM on core 0, the drafter actor on core 1, one torch thread each",
             "draft-length-sim": "a simulation in this process (no engine)"}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.run != "runner-arm":  # an arm is a child of ``runners``, which stamps the run
        args.stamp = stamp.stamp(PLACEMENT.get(args.run, "none"))
        print(stamp.line(args.stamp), flush=True)
    RUNS[args.run](args)


if __name__ == "__main__":
    main()
