"""``auto``'s rule (``actors.verifier.draft_length.AutoDraftLength``) against the best fixed k, in simulation.

No engine: a loop drives the policy as the proposer does (choose k, verify with per-position acceptance, time the
step) with step costs per k measured held on this machine (``docs/BENCHMARKS.md``, issue 23's sixth pass) and this
machine's noise: log-normal per step (``--noise``, sigma), 3% pauses of 2.5x, a slow +-25% drift. Prints, per
batch size, the rule's tokens per ms over the best fixed k's on the same seeds, and the steps it spent at each k.

    python -m benchmarks.draft_length_sim [--seeds 12] [--steps 1500] [--noise 0.25]
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence

from actors.verifier.draft_length import AutoDraftLength, DraftLength, FixedDraftLength

ACCEPT = (0.74, 0.43, 0.26)  # P(draft i accepted): mean acceptance lengths 1.74 / 2.17 / 2.43 at k = 1 / 2 / 3
COSTS = {  # step period ms by k = 0..3, measured held (strict pinning; c = 4 interpolated)
    1: [16.6, 28.0, 29.0, 30.0],
    4: [18.0, 33.0, 36.0, 39.0],
    8: [20.6, 42.6, 48.6, 54.5],
}


def drive(policy: DraftLength, batch: int, period: Callable[[int, int], float], steps: int, rng: random.Random,
          accept: Sequence[float] = ACCEPT, after_step: Callable[[], None] | None = None) -> tuple[list[int], float]:
    """Drive ``policy`` as the proposer does for ``steps`` steps: choose k, verify each sequence's drafts (draft i
    accepted with probability ``accept[i]``, drawn from ``rng``), then time the step (``period(t, k)`` ms, which may
    draw from ``rng`` after the acceptance draws). Returns the k per step and the output tokens per ms."""
    ks: list[int] = []
    tokens = time = 0.0
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
        time += ms
        policy.observe_period(batch, k, ms, previous_k=previous)
        if after_step is not None:
            after_step()
    return ks, tokens / time


def run(policy: DraftLength, batch: int, costs: list[float], steps: int, seed: int,
        noise: float) -> tuple[list[int], float]:
    """``drive`` with this machine's noise on ``costs`` (ms per step by k): log-normal per step, a slow +-25% drift,
    3% pauses of 2.5x."""
    rng = random.Random(seed)

    def period(t: int, k: int) -> float:
        ms = costs[k] * (1 + 0.25 * math.sin(t / 150.0)) * math.exp(rng.gauss(0.0, noise))
        return ms * 2.5 if rng.random() < 0.03 else ms  # a pause

    return drive(policy, batch, period, steps, rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--noise", type=float, default=0.25)
    args = ap.parse_args()
    seeds = range(args.seeds)
    for batch, costs in COSTS.items():
        fixed = {k: [run(FixedDraftLength(k), batch, costs, args.steps, s, args.noise)[1] for s in seeds]
                 for k in range(len(costs))}
        best = max(fixed, key=lambda k: sum(fixed[k]))
        ratios, steps_at = [], [0] * len(costs)
        for s in seeds:
            ks, rate = run(AutoDraftLength(len(costs) - 1), batch, costs, args.steps, s, args.noise)
            ratios.append(rate / fixed[best][s])
            for k in ks:
                steps_at[k] += 1
        print(f"batch {batch}: best fixed k = {best}; auto / best fixed = {sum(ratios) / len(ratios):.3f} "
              f"(min {min(ratios):.3f} over {len(ratios)} seeds); steps per k = {steps_at}")


if __name__ == "__main__":
    main()
