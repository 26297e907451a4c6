"""The drafter engine alone: median milliseconds per synchronous draft step, one torch thread, synthetic steps.

    python -m benchmarks.drafter_step [--heads eagle eagle3] [--batch 1 16] [--steps 200] [--k 3] [--shuffled]
        [--gap-ms 0 20]
    taskset -c 1 python -m benchmarks.drafter_step      # on one core of its own

Each sequence first ships a 100-row prompt, then decode steps of 2 rows each (one accepted draft and the bonus /
recovered token: positions advance by 2), random ids and hidden states, the shipped heads. ``--shuffled`` lists the
decode steps' sequences in a fixed shuffled order, not the order they arrived in (vLLM's persistent batch reorders
its requests as others finish, so a live drafter's slots come shuffled). ``--gap-ms`` sleeps that long after each
step, as a served drafter idles while the verifier verifies (a step after an idle gap costs more than the same step
back to back: ``docs/BENCHMARKS.md``, issue 20, "Seventh pass"). With ``--profile``,
prints cProfile's top functions over 100 more steps (where a step's time goes). No Ray, no vLLM: this is the
number ``benchmarks.drafter_speed`` puts beside vLLM's own draft step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.messages import DraftStep, SeqSlice
from cluster.harness import HEADS, TARGET, add_head_args


def make_step(step_id: int, batch: int, position: int, rows: int, k: int, width: int,
              order: list[int] | None = None) -> tuple[DraftStep, torch.Tensor]:
    seqs = [SeqSlice(f"s{b}", i * rows, rows, position) for i, b in enumerate(order or range(batch))]
    ids = np.random.randint(0, 4000, batch * rows).astype(np.int32)
    return DraftStep(step_id, k, seqs, ids), torch.randn(batch * rows, width)


def measure(method: str, batch: int, steps: int, k: int, profile: bool, shuffled: bool = False,
            gap_ms: float = 0.0) -> float:
    engine = DrafterEngine.from_checkpoint(HEADS[method], TARGET, DrafterEngineConfig(max_model_len=1032))
    width = engine.spec.fused_hidden_size
    engine.draft_tensors(*make_step(0, batch, 0, 100, k, width))
    order = list(np.random.RandomState(batch).permutation(batch)) if shuffled else None
    times, position = [], 100
    for i in range(steps):
        step, hidden = make_step(i + 1, batch, position, 2, k, width, order)
        position += 2
        start = time.perf_counter()
        engine.draft_tensors(step, hidden)
        times.append((time.perf_counter() - start) * 1e3)
        if gap_ms:
            time.sleep(gap_ms / 1e3)  # idle between steps, as a served drafter waits for the verifier's next one
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for i in range(100):
            engine.draft_tensors(*make_step(steps + i + 1, batch, position + 2 * i, 2, k, width, order))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_head_args(p)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--shuffled", action="store_true", help="decode steps list their sequences shuffled")
    p.add_argument("--gap-ms", type=float, nargs="*", default=[0.0],
                   help="idle milliseconds after each step (a served drafter idles while the verifier verifies); "
                        "several: one row each")
    args = p.parse_args()
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    print("head | batch | idle ms between steps | ms per step (median)")
    for method in args.heads:
        for batch in args.batch:
            for gap in args.gap_ms:
                ms = measure(method, batch, args.steps, args.k, args.profile, args.shuffled, gap)
                print(f"{method} | {batch} | {gap:g} | {ms:.2f}", flush=True)


if __name__ == "__main__":
    main()
