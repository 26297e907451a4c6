"""What keeps replayed CUDA graphs valid (``actors.drafter.cuda_graphs``): a graph holds the draft KV cache's tensors
as they were when it was captured, so it must never replay against a cache that reallocated them since.

Two rules keep that: every reallocation of the cache's tensors (growing for more sequences, shrinking back once idle)
bumps ``DraftKVCache.generation`` (a cache allocated whole, as the engine allocates it where graphs run, never
reallocates: a sequence past it is refused), and
``GraphRunner`` drops its graphs and recaptures when the generation it captured at is not the cache's.

On a CPU graphs are always off, so the runner's bookkeeping runs here with a fake capture that records the tensors
its forward would bake in and checks, at every replay, that they are still the cache's. The ``gpu`` tests (skipped
without one) replay real graphs across a reallocation, and check the engine's cache never reallocates."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
import torch

from actors.drafter.cuda_graphs import GraphRunner
from actors.drafter.kv_cache import CacheFullError, DraftKVCache

ON_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def small_cache(initial_slots: int = 2, max_slots: int = 8) -> DraftKVCache:
    return DraftKVCache(num_layers=2, num_kv_heads=1, head_dim=4, max_len=8, initial_slots=initial_slots,
                        max_slots=max_slots, scratch_slots=1)


def tensors(cache: DraftKVCache) -> list[torch.Tensor]:
    return [*cache.k, *cache.v]


class FakeGraph:
    """A captured graph: the cache tensors the forward read at capture; replaying checks they are still the cache's
    (a real graph would read and write freed memory)."""

    def __init__(self, cache: DraftKVCache, shape: Hashable) -> None:
        self.cache, self.shape, self.held = cache, shape, tensors(cache)
        self.replays = 0

    def replay(self) -> None:
        assert all(a is b for a, b in zip(self.held, tensors(self.cache), strict=True)), \
            f"graph {self.shape!r} replayed against reallocated cache tensors"
        self.replays += 1


class FakeCaptureRunner(GraphRunner):
    """``GraphRunner`` with the capture replaced (no CUDA): its bookkeeping, the real one."""

    def _capture(self, shape: Hashable) -> FakeGraph:
        self.forward(shape)
        self.captures += 1
        return FakeGraph(self.cache, shape)


@pytest.fixture
def runner(monkeypatch):
    """(a ``FakeCaptureRunner`` whose forward records the shapes it ran, over a 2-slot cache growing to 8; the
    cache; those shapes)."""
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)  # CPU torch cannot make a pool
    cache = small_cache()
    ran: list[Hashable] = []
    return FakeCaptureRunner(ran.append, cache, torch.device("cpu")), cache, ran


def test_each_shape_is_captured_once_then_replayed(runner):
    runner, _, ran = runner
    for shape in ["a", "a", "b", "a", "b"]:
        runner.run(shape)
    assert (runner.captures, runner.replays) == (2, 5) and set(runner.graphs) == {"a", "b"}
    assert ran == ["a", "b"]  # the forward ran at the captures only


def test_a_reallocated_cache_drops_every_graph_and_recaptures(runner):
    runner, cache, _ = runner
    runner.run("a")
    runner.run("b")
    before = cache.generation
    cache.slots_for(["s0", "s1", "s2"], [0, 0, 0])  # 3 sequences in 2 slots: the cache grows (reallocates)
    assert cache.num_slots == 4 and cache.generation > before
    runner.run("a")  # replaying the old graph would fail FakeGraph's check
    assert runner.captures == 3 and set(runner.graphs) == {"a"} and runner.generation == cache.generation
    runner.run("b")
    runner.run("a")
    assert runner.captures == 4 and runner.graphs["a"].replays == 2
    cache.free(["s0", "s1", "s2"])  # idle after a burst: back to its initial size (reallocates again)
    assert cache.num_slots == 2
    runner.run("a")
    assert runner.captures == 5 and set(runner.graphs) == {"a"}


def test_what_does_not_reallocate_keeps_the_graphs(runner):
    runner, cache, _ = runner
    cache.slots_for(["s0"], [0])
    runner.run("a")
    cache.slots_for(["s0", "s1"], [3, 0])  # fits: no growth
    cache.write(0, torch.tensor([0, 1]), torch.tensor([3, 0]), torch.ones(2, 1, 4), torch.ones(2, 1, 4))
    cache.free(["s0"])
    cache.evict_idle(before=1e9)
    runner.run("a")
    assert runner.captures == 1 and runner.graphs["a"].replays == 2


def test_every_reallocation_bumps_the_generation():
    cache = small_cache(initial_slots=1, max_slots=4)
    held, generations = tensors(cache), [cache.generation]
    for n in (2, 3, 4):  # 1 -> 2 -> 4 slots
        cache.slots_for([f"s{i}" for i in range(n)], [0] * n)
        now = tensors(cache)
        if any(a is not b for a, b in zip(held, now, strict=True)):
            assert cache.generation != generations[-1], "tensors reallocated, generation unchanged"
        generations.append(cache.generation)
        held = now
    assert cache.num_slots == 4 and len(set(generations)) == 3  # two growths, two bumps


def test_a_cache_allocated_whole_never_reallocates():
    """Where graphs run, the engine allocates the cache whole (``initial_slots == max_slots``): one sequence too
    many is refused (``CacheFullError``: it gets no drafts), the tensors the graphs hold stay the cache's."""
    cache = small_cache(initial_slots=4, max_slots=4)
    held, generation = tensors(cache), cache.generation
    cache.slots_for(["s0", "s1", "s2", "s3"], [0] * 4)
    with pytest.raises(CacheFullError):
        cache.slots_for(["s4"], [0])
    cache.free(["s0", "s1", "s2", "s3"])  # idle: nothing to give back
    assert cache.generation == generation and all(a is b for a, b in zip(held, tensors(cache), strict=True))


@pytest.mark.gpu
@ON_GPU
def test_real_graphs_read_the_cache_they_were_captured_on_after_it_grows():
    """A graph whose forward sums the cache's K: after the cache grows (new tensors), the runner recaptures, and
    the replay reads the new tensor (the old graph would read the freed one)."""
    cache = DraftKVCache(1, 1, 4, 8, initial_slots=2, max_slots=8, device="cuda")
    out = torch.zeros(1, device="cuda")

    def forward(shape: Hashable) -> None:
        out.copy_(cache.k[0].sum().reshape(1))

    runner = GraphRunner(forward, cache, torch.device("cuda"))
    cache.k[0].fill_(1.0)
    runner.run("s")
    runner.run("s")
    torch.cuda.synchronize()
    assert out.item() == cache.k[0].numel() and (runner.captures, runner.replays) == (1, 2)
    cache.slots_for(["a", "b", "c"], [0, 0, 0])  # grows to 4 slots: new tensors
    cache.k[0].fill_(2.0)
    runner.run("s")
    torch.cuda.synchronize()
    assert out.item() == 2.0 * cache.k[0].numel() and runner.captures == 2


@pytest.mark.gpu
@ON_GPU
@pytest.mark.parametrize("pipelined", [False, True], ids=["sync", "pipelined"])
def test_the_engine_on_cuda_never_reallocates_its_cache(pipelined):
    """The drafter engine with graphs: its cache is whole from the start (``max_num_seqs`` slots), so over every
    scenario step the graphs replay on the tensors they were captured on."""
    from actors.drafter.branches import BranchConfig
    from tests.actors.drafter import scenarios

    branches = BranchConfig(bonus_fanout=2, recovered_fanout=1) if pipelined else None
    _, engine = scenarios.run("cuda", "eagle", branches, max_num_seqs=16)
    runners = [engine.decode.graphs] + ([engine.branch_passes.graphs] if pipelined else [])
    assert engine.cache.num_slots == engine.cache.max_slots == 16 and engine.cache.generation == 1
    for runner in runners:
        assert runner.replays > 0 and runner.generation == engine.cache.generation
