"""CUDA graphs of the drafter's fixed-shape passes: captured on first use, one per shape, replayed after.

Where it sits: ``actors.drafter.decode_step`` (a decode step's passes) and ``actors.drafter.branch_passes``
(pipelined drafting's branch passes) each hold one ``GraphRunner`` over their own ``forward(shape)``, which reads
and writes only persistent buffers and the draft KV cache, and reads no host value.

A shape is captured on a side stream after two eager warm-up runs of the same forward (Triton compiles, the
allocator settles); warm-ups run the current call's own inputs, whose writes (K/V at the call's positions) are the
same again, so running them is harmless. All graphs share one memory pool. They hold the cache's tensors, so when
the cache reallocates (``DraftKVCache.generation``) they are dropped and recaptured.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from actors.drafter.kv_cache import DraftKVCache


class GraphRunner:
    def __init__(self, forward: Callable[[Hashable], None], cache: DraftKVCache, device: torch.device) -> None:
        self.forward, self.cache, self.device = forward, cache, device
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.generation = cache.generation
        self.captures = self.replays = 0

    def run(self, shape: Hashable) -> None:
        if self.generation != self.cache.generation:  # the cache reallocated: graphs point at its old tensors
            self.graphs.clear()
            self.generation = self.cache.generation
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self.graphs[shape] = self._capture(shape)
        graph.replay()
        self.replays += 1

    def _capture(self, shape: Hashable) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward(shape)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.forward(shape)
        self.captures += 1
        return graph
