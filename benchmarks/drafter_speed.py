"""The drafter engine's time per draft step against vLLM's own in-process draft of the same head, same batch.

    python -m benchmarks.drafter_speed [--heads eagle eagle3] [--batch 1 16] [--num-prompts 16]
        [--max-tokens 128]

One core each, as devices of their own would be: vLLM colocated runs with its OpenMP threads on core 0
(``VLLM_CPU_OMP_THREADS_BIND=0``, ``OMP_NUM_THREADS=1``), its ``propose`` timed in the worker
(``local_propose``); the project's drafter actor runs bound to core 1 with one torch thread, drafting
synchronously for an offline verifier on core 0, its compute timed inside the engine (``DraftResult.compute_ms``).
Same prompts, greedy, k=3. Only full-batch decode steps count (every sequence shipping 1..k+1 rows). Prints the
median milliseconds per step and the ratio drafter / vLLM (<= 1: the drafter is at least as fast).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics

from cluster.harness import HEADS, TARGET, add_head_args, heldout_prompts

PIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
NAMESPACE = "bench-drafter-speed"
K = 3


def run(method: str, remote: bool, prompts: list[str], concurrency: int, max_tokens: int) -> list[float]:
    """Per-step draft milliseconds of the full-batch decode steps."""
    from vllm import SamplingParams

    from actors.verifier.engine import make_verifier_llm

    spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": K}
    client = {"actor": f"drafter-{method}", "namespace": NAMESPACE} if remote else None
    llm = make_verifier_llm(str(TARGET), spec, client, max_num_seqs=concurrency)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)  # warm-up
    llm.collective_rpc("eagle_cluster_reset_stats")
    llm.generate(prompts, params, use_tqdm=False)
    rpc = next(r for r in llm.collective_rpc("eagle_cluster_stats") if r["is_driver"])
    del llm
    gc.collect()
    decode = concurrency * (K + 1)
    if remote:
        return [t["compute_ms"] for t in rpc["timings"] if t["batch_size"] == concurrency and t["num_tokens"] <= decode]
    return [ms for batch, rows, ms in rpc["local_propose"] if batch == concurrency and rows <= decode]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_head_args(p)  # --batch: the verifier's max_num_seqs, every prompt submitted at once
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    os.environ.update(PIN_ENV)  # before vLLM is imported

    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    prompts = heldout_prompts(args.num_prompts)
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    print(f"{len(prompts)} prompts x {args.max_tokens} tokens, k={K}, greedy; vLLM on core 0, drafter on core 1")
    print("method | batch | vLLM colocated draft ms (median) | drafter engine ms (median) | drafter / vLLM | steps")
    for method in args.heads:
        settings = DrafterSettings(str(HEADS[method]), str(TARGET), num_threads=1, cpu_affinity=(1,))
        actor = start_drafter_actor(settings, name=f"drafter-{method}", namespace=NAMESPACE)
        for c in args.batch:
            local = run(method, False, prompts, c, args.max_tokens)
            remote = run(method, True, prompts, c, args.max_tokens)
            a, b = statistics.median(local), statistics.median(remote)
            print(f"{method} | {c} | {a:.2f} | {b:.2f} | {b / a:.2f} | {len(local)} / {len(remote)}", flush=True)
        ray.kill(actor)
    ray.shutdown()


if __name__ == "__main__":
    main()
