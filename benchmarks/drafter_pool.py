"""The drafter pool's size against throughput, and how fast the pool grows under load.

    python -m benchmarks.drafter_pool [--concurrency 16 32] [--num-prompts 64] [--max-tokens 96]

1. Fixed pools of 1 and 2 drafter replicas (``serve run`` of ``deploy/cpu.yaml``, EAGLE-3, each replica 0.5
   CPU), the same prompts at each concurrency: output tokens/s, median TPOT, acceptance length, and 2 / 1.
2. An autoscaled pool (min 1, max 2, 8 sequences per replica): the seconds from the start of a concurrency-32
   load to the second replica drafting its first step (polled through its stats every 0.5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.serving import run
from benchmarks.serving_compare import cluster_server
from cluster.config import PROJECT_ROOT as ROOT
from cluster.harness import load_prompts, start, stop, wait_healthy

AUTOSCALED = {"num_replicas": None, "autoscaling_config": {
    "min_replicas": 1, "max_replicas": 2, "target_sequences_per_replica": 8, "upscale_delay_s": 0,
    "downscale_delay_s": 600, "look_back_period_s": 4, "metrics_interval_s": 0.5}}


def drafters_serving() -> dict[str, int]:
    """Drafter replica id -> steps drafted, for every live replica (a Ray driver in this process)."""
    from ray import serve
    from ray.util.state import list_actors

    from cluster.config import DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT
    from cluster.drafter_pool.router import route_key

    handle = serve.get_deployment_handle(DRAFTER_DEPLOYMENT, app_name=DRAFTER_APP_NAME)
    steps = {}
    for a in list_actors(filters=[("class_name", "=", "ServeReplica:eagle-cluster:Drafter"), ("state", "=", "ALIVE")]):
        rid = a.name.rsplit("#", 1)[-1]
        try:
            steps[rid] = handle.options(session_id=route_key(rid, 0)).stats.remote().result(timeout_s=10)["steps"]
        except Exception:  # still starting
            steps[rid] = 0
    return steps


def time_to_scale(base: str, prompts: list[str], max_tokens: int) -> float | None:
    import ray

    ray.init(address="auto", log_to_driver=False)
    found: dict[str, float] = {}
    done = threading.Event()
    start = time.time()

    def poll() -> None:
        while not done.is_set() and len(found) < 2:
            for rid, steps in drafters_serving().items():
                if steps > 0 and rid not in found:
                    found[rid] = time.time() - start
            time.sleep(0.5)

    t = threading.Thread(target=poll)
    t.start()
    asyncio.run(run(base, prompts, max_tokens, 32, None, "autoscaled pool, c=32"))
    done.set()
    t.join()
    ray.shutdown()
    return max(found.values()) if len(found) == 2 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="*", default=[16, 32])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "results" / "drafter_pool"))
    args = p.parse_args()
    prompts = load_prompts(None, args.num_prompts)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in (1, 2):
            cmd, base = cluster_server("eagle3", Path(tmp), {"num_replicas": replicas, "num_cpus": 0.5},
                                       name=f"-{replicas}")
            proc = start(cmd)
            try:
                wait_healthy(proc, base)
                asyncio.run(run(base, prompts[:8], 8, 8, None, "warm-up", quiet=True))
                for c in args.concurrency:
                    report = asyncio.run(run(base, prompts, args.max_tokens, c, None, f"{replicas} drafter(s) c={c}"))
                    results[f"{replicas}-{c}"] = asdict(report)
            finally:
                stop(proc)
        cmd, base = cluster_server("eagle3", Path(tmp), AUTOSCALED, name="-autoscaled")
        proc = start(cmd)
        try:
            wait_healthy(proc, base)
            scale_s = time_to_scale(base, load_prompts(None, 128), args.max_tokens)
        finally:
            stop(proc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"fixed": results, "time_to_scale_s": scale_s}, indent=2))
    print("\ndrafters | concurrency | output tok/s | median TPOT ms | acceptance length | vs 1 drafter")
    for key, r in results.items():
        replicas, c = key.split("-")
        tps = r["output_tokens"] / r["duration_s"]
        one = results[f"1-{c}"]
        spec = r["spec"] or {"num_drafts": 0}
        mal = 1 + spec["num_accepted_tokens"] / spec["num_drafts"] if spec["num_drafts"] else float("nan")
        print(f"{replicas} | {c} | {tps:.1f} | {r['tpot_ms']['median']:.2f} | {mal:.2f} | "
              f"{tps / (one['output_tokens'] / one['duration_s']):.2f}")
    print(f"\nload increase (c=32) -> second drafter replica drafting: "
          f"{'did not scale' if scale_s is None else f'{scale_s:.1f} s'}")


if __name__ == "__main__":
    main()
