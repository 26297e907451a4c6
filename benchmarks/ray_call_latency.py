"""What one drafting call costs on Ray, by the ways the verifier could make it (medians over 200 calls, idle).

    python -m benchmarks.ray_call_latency

A plain actor with ``max_concurrency=1`` (as ``DrafterActor``), called with a 200-byte message and hidden rows of
two shapes: the call waited for with the array inline (Ray inlines small arguments, and puts large ones in the
object store itself), with ``ray.put`` + ObjectRef, and the same through a streaming generator's first item;
a call submitted and not waited for (what a pipelined hit costs the verifier: ``propose`` and ``branches``);
and reading a ready result (the branch table, when the drafter drafted it in time).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import ray


@ray.remote(max_concurrency=1)
class Echo:
    def call(self, message: bytes, hidden) -> bytes:
        return message

    def table(self) -> bytes:
        return b"x" * 200

    def stream(self, message: bytes, hidden):
        yield message
        yield b"table"


def median_ms(fn, n: int = 200) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = Echo.remote()
    ray.get(actor.table.remote())
    message = b"s" * 200
    print("call | [4, 256] fp32 | [16, 768] fp32 (EAGLE-3 rows of the tiny target)")
    rows = {}
    for shape in ((4, 256), (16, 768)):
        hidden = np.random.rand(*shape).astype(np.float32)
        for name, fn in {
            "actor call, array inline, waited": lambda h=hidden: ray.get(actor.call.remote(message, h)),
            "actor call, ray.put + ObjectRef, waited": lambda h=hidden: ray.get(actor.call.remote(message, ray.put(h))),
            "streaming generator, first item": lambda h=hidden: ray.get(
                next(actor.stream.options(num_returns="streaming").remote(message, h))),
            "actor call submitted, not waited for": lambda h=hidden: actor.call.remote(message, h),
        }.items():
            rows.setdefault(name, []).append(median_ms(fn))
    ready = actor.table.remote()
    ray.get(ready)
    rows["a ready result: ray.wait(timeout=0) + ray.get"] = [median_ms(lambda: (ray.wait([ready], timeout=0),
                                                                                 ray.get(ready)))] * 2
    for name, (a, b) in rows.items():
        print(f"{name} | {a:.3f} ms | {b:.3f} ms")
    ray.shutdown()


if __name__ == "__main__":
    main()
