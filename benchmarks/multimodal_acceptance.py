"""Image prompts on the multimodal checkpoint: the cluster's drafts against vLLM's colocated EAGLE.

    python -m benchmarks.multimodal_acceptance [--num-prompts 12] [--k 3] [--max-tokens 64]

For each head (EAGLE-1 and EAGLE-3, ``models/*-mm``), greedy, on image + text prompts (seeded random images of
several sizes, one or two per prompt, before held-out text): target-only vLLM; vLLM's colocated EAGLE; the
disaggregated path (vLLM verifier + drafter Ray actor) shipping the target's image embeddings; and the same path
drafting from the image placeholder ids (``mm_embeds: false``, what the project did before). Prints whether each
run's tokens equal target-only's, and the acceptance counters side by side.

Starts Ray: run it under ``flock /work/ray.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from actors.metrics import SpecDecodeStats
from cluster.image_runs import HEADS, TARGET, cluster, colocated, image_prompts, target_only


def _row(name: str, same: bool | str, s: SpecDecodeStats) -> str:
    per_pos = " ".join(f"{a}" for a in s.accepted_per_pos)
    return (f"{name:<34} | {str(same):<5} | {s.num_drafts:>6} | {s.num_draft_tokens:>6} | {s.num_accepted_tokens:>6} "
            f"| {s.mean_acceptance_length:.3f} | {per_pos}")


def main() -> None:
    import ray

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--methods", nargs="*", default=list(HEADS))
    p.add_argument("--max-text-chars", type=int, help="cut each prompt's text (so drafting stays near the images)")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    prompts = image_prompts(args.num_prompts, max_text_chars=args.max_text_chars)
    ns = "bench-multimodal"
    ray.init(namespace=ns, num_cpus=4, include_dashboard=False, log_to_driver=False)
    ref, _ = target_only(prompts, args.max_tokens)
    results = {}
    print(f"\n{len(prompts)} image + text prompts ({sum(len(q['multi_modal_data']['image']) for q in prompts)} "
          f"images), greedy, {args.max_tokens} tokens, k={args.k}; target {TARGET.name}")
    print(f"{'run':<34} | same  | drafts | draft tokens | accepted | mean acc. len | accepted per position")
    for method in args.methods:
        colo_tokens, colo = colocated(method, prompts, args.k, args.max_tokens)
        tokens, stats, rpc = cluster(method, prompts, args.k, args.max_tokens, ns)
        old_tokens, old, old_rpc = cluster(method, prompts, args.k, args.max_tokens, ns, mm_embeds=False)
        print(_row(f"{method}: vLLM colocated", colo_tokens == ref, colo))
        print(_row(f"{method}: cluster, image embeddings", tokens == ref, stats))
        print(_row(f"{method}: cluster, placeholder ids", old_tokens == ref, old))
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
        Path(args.json).write_text(json.dumps(results, indent=2, default=list))


if __name__ == "__main__":
    main()
