"""Output tokens/s of (a) vLLM target-only, (b) vLLM colocated EAGLE, (c) the disaggregated path, side by side.

    python -m benchmarks.disaggregated_throughput [--method eagle|eagle3] [--concurrency 1 16]
        [--num-prompts 16] [--max-tokens 128] [--k 3]

Same prompts (held-out), same checkpoints, greedy, one run. Concurrency c = the engine's ``max_num_seqs``
with all prompts submitted at once (the offline engine keeps c sequences running). For each mode it prints
output tokens/s and mean acceptance length, and a median per-step split on the verifier side: target forward
(``execute_model``), sampling + propose (``sample_tokens``), and, for (c), inside propose: shipping
(numpy + ``ray.put``), waiting on the drafter (call to result, minus its compute) and drafter compute.
Then speedup (c)/(a), efficiency = speedup / mean acceptance length, and (c)/(b).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from cluster.harness import HEADS, TARGET, heldout_prompts

NAMESPACE = "bench-disaggregated"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_mode(mode: str, method: str, k: int, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    from vllm import SamplingParams

    from actors.metrics import from_vllm_metrics
    from actors.verifier.engine import make_verifier_llm

    head = HEADS[method]
    spec = {"method": method, "model": str(head), "num_speculative_tokens": k}
    client = {"actor": "bench-drafter", "namespace": NAMESPACE} if mode == "disaggregated" else None
    llm = make_verifier_llm(
        str(TARGET), None if mode == "target-only" else spec, client, max_num_seqs=concurrency
    )
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
        "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "seconds": seconds,
        "mal": stats.mean_acceptance_length if stats.num_drafts else 1.0,
        "forward_ms": med(rpc["forward_ms"]),
        "sample_ms": med(rpc["sample_ms"]),
        "ship_ms": med([x["ship_ms"] for x in t]),
        "wait_ms": med([x["wait_ms"] for x in t]),
        "compute_ms": med([x["compute_ms"] for x in t]),
        "overhead_ms": med([x["ship_ms"] + x["wait_ms"] for x in t]),
        "failures": rpc["failures"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=list(HEADS), default="eagle")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 16])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--drafter-threads", type=int, default=2, help="torch threads in the drafter actor")
    args = p.parse_args()

    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    prompts = heldout_prompts(args.num_prompts)
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    # Keep the handle: a named actor lives while a handle does.
    drafter = start_drafter_actor(DrafterSettings(str(HEADS[args.method]), str(TARGET),
                                                  num_threads=args.drafter_threads),
                                  name="bench-drafter", namespace=NAMESPACE)
    print(f"head {HEADS[args.method].name}, k={args.k}, {len(prompts)} prompts x {args.max_tokens} tokens, greedy, "
          f"drafter threads {args.drafter_threads}")
    header = ("conc", "mode", "tok/s", "MAL", "fwd ms", "sample ms", "ship ms", "wait ms", "draft ms", "ship+wait")
    print(" | ".join(header))
    for c in args.concurrency:
        res = {m: run_mode(m, args.method, args.k, prompts, args.max_tokens, c)
               for m in ("target-only", "colocated", "disaggregated")}
        for m, r in res.items():
            print(
                f"{c} | {m} | {r['tokens'] / r['seconds']:.1f} | {r['mal']:.2f} | {r['forward_ms']:.2f} | "
                f"{r['sample_ms']:.2f} | {r['ship_ms']:.2f} | {r['wait_ms']:.2f} | {r['compute_ms']:.2f} | "
                f"{r['overhead_ms']:.2f}"
            )
        tps = {m: r["tokens"] / r["seconds"] for m, r in res.items()}
        speedup = tps["disaggregated"] / tps["target-only"]
        eff = speedup / res["disaggregated"]["mal"]
        c_b = tps["disaggregated"] / tps["colocated"]
        b_a = tps["colocated"] / tps["target-only"]
        print(f"conc {c}: speedup (c)/(a) {speedup:.2f}, efficiency {eff:.2f}, (c)/(b) {c_b:.2f}, (b)/(a) {b_a:.2f}")
    ray.kill(drafter)
    ray.shutdown()


if __name__ == "__main__":
    main()
