"""vLLM's own colocated speculative decoding on the shipped checkpoints: the reference acceptance figures.

    python -m benchmarks.colocated_acceptance [--heads NAME ...] [--num-prompts 30] [--k 3] [--max-tokens 128]

For each head: greedy decoding of held-out prompts (Python standard library files the models never saw) with
``speculative_config={"method": ..., "model": head, "num_speculative_tokens": k}``, then the seed PRs' table
(num_drafts, num_draft_tokens, num_accepted_tokens, mean acceptance length, acceptance per position).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from actors.metrics import SpecDecodeStats, from_vllm_metrics
from actors.vllm_engine import make_llm
from cluster.harness import MODELS, TARGET, heldout_prompts

HEADS = {
    "eagle-llama4-tiny-1l": "eagle",
    "eagle-llama4-tiny-3l": "eagle",
    "eagle3-llama4-tiny": "eagle3",
}


def run_colocated(
    head: str, prompts: list[str], k: int, max_tokens: int, target: Path = TARGET
) -> tuple[SpecDecodeStats, int, float]:
    """(stats, output tokens, seconds) of one colocated run."""
    from vllm import SamplingParams

    method = json.loads((MODELS / head / "config.json").read_text())
    method = HEADS.get(head) or ("eagle3" if "Eagle3" in method["architectures"][0] else "eagle")
    llm = make_llm(
        str(target),
        speculative_config={"method": method, "model": str(MODELS / head), "num_speculative_tokens": k},
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    stats = from_vllm_metrics(llm.get_metrics())
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    return stats, tokens, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", nargs="*", default=list(HEADS))
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
