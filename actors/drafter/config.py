"""A drafter's settings: two frozen dataclasses, built once and taken whole by every layer below.

- ``DrafterSettings``: everything a drafter actor is started with (``actors.drafter.actor.DrafterActor``): the head
  and target, the process's threads and cores, the forced device / dtype, and ``engine``;
- ``DrafterEngineConfig``: what ``actors.drafter.engine.DrafterEngine`` takes (sequence length, room, prefix cache,
  idle eviction, the largest k, asynchronous drafting).

A deployed pool builds them once from its validated YAML (``cluster.config.DrafterPoolConfig.for_drafter``), binds
them to its Serve deployment (``cluster.drafter_pool.server.DrafterServer``), which hands them as they are to its
actor, which hands ``engine`` to its engine; tests and benchmarks build them directly (``start_drafter_actor``). As
actors are used without ``cluster``'s pydantic models, each dataclass checks its own fields when built, with errors
naming the field. Plain frozen dataclasses: Ray pickles them into an actor's constructor call.

Adding a drafter setting: a field here (and its check), its use in the actor or the engine, and, to set it from a
YAML, a field of ``cluster.config.DrafterConfig`` that ``DrafterPoolConfig.for_drafter`` maps onto it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.drafter.branches import BranchConfig
from actors.drafter.placement import check_device, parse_dtype
from actors.messages import MAX_SPECULATIVE_TOKENS

DEFAULT_MAX_MODEL_LEN = 4096  # the longest sequence a drafter drafts for, unless configured


def _require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"drafter: {name} {rule}, got {value!r}")


@dataclass(frozen=True)
class DrafterEngineConfig:
    """A drafter engine's settings (what each means: ``DrafterEngine.__init__``)."""

    max_model_len: int = DEFAULT_MAX_MODEL_LEN  # the longest sequence drafted for (a dense slot each)
    max_num_seqs: int = 1024  # sequences the draft KV cache holds; more get no drafts
    kv_cache_gib: float | None = None  # the draft KV cache's memory cap; None: on CUDA a share of the free memory
    kv_cache_free_fraction: float = 0.6  # that share, when kv_cache_gib is None
    prefix_cache_fraction: float = 0.2  # the share of the draft KV memory for the prefix cache's blocks; 0: none
    idle_slot_ttl_s: float | None = 300.0  # a sequence not stepped for this long loses its slot; None: never
    max_k: int = MAX_SPECULATIVE_TOKENS  # the most draft tokens a step may ask for
    branches: BranchConfig | None = None  # asynchronous drafting (actors.drafter.branches); None: off
    fixed_shape_steps: bool | None = None  # decode steps on fixed-shape buffers (actors.drafter.decode_step); None:
    #                                        on CUDA only (a CPU's default keeps the eager passes, tuned for it)
    enforce_eager: bool = False  # no CUDA graphs for fixed-shape steps (vLLM's name)
    cuda_graph_max_batch: int = 128  # the largest fixed-shape batch; larger ones take the eager passes

    def __post_init__(self) -> None:
        _require(self.max_model_len >= 1, "max_model_len", "must be >= 1", self.max_model_len)
        _require(self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1", self.max_num_seqs)
        _require(self.kv_cache_gib is None or self.kv_cache_gib > 0, "kv_cache_gib", "must be > 0 or None",
                 self.kv_cache_gib)
        _require(0 < self.kv_cache_free_fraction <= 1, "kv_cache_free_fraction", "outside (0, 1]",
                 self.kv_cache_free_fraction)
        _require(0 <= self.prefix_cache_fraction < 1, "prefix_cache_fraction", "outside [0, 1)",
                 self.prefix_cache_fraction)
        _require(self.idle_slot_ttl_s is None or self.idle_slot_ttl_s > 0, "idle_slot_ttl_s", "must be > 0 or None",
                 self.idle_slot_ttl_s)
        _require(1 <= self.max_k <= MAX_SPECULATIVE_TOKENS, "max_k", f"outside [1, {MAX_SPECULATIVE_TOKENS}]",
                 self.max_k)
        _require(self.branches is None or isinstance(self.branches, BranchConfig), "branches",
                 "must be a BranchConfig or None", self.branches)
        _require(self.fixed_shape_steps in (None, True, False), "fixed_shape_steps", "must be a bool or None",
                 self.fixed_shape_steps)
        _require(isinstance(self.enforce_eager, bool), "enforce_eager", "must be a bool", self.enforce_eager)
        _require(isinstance(self.cuda_graph_max_batch, int) and 1 <= self.cuda_graph_max_batch <= 1024,
                 "cuda_graph_max_batch", "outside [1, 1024]", self.cuda_graph_max_batch)


@dataclass(frozen=True)
class DrafterSettings:
    """A drafter actor's settings (what each means: ``DrafterActor.__init__``)."""

    head_dir: str  # the EAGLE / EAGLE-3 head: a folder or a hub id
    target_dir: str | None = None  # the target (its embeddings / lm_head, if the head has none): a folder or hub id
    engine: DrafterEngineConfig = field(default_factory=DrafterEngineConfig)
    num_threads: int | None = None  # torch threads of the actor's process; None: as the process has them
    cpu_affinity: tuple[int, ...] | None = None  # bind the actor's process to these cores; None: any
    device: str | None = None  # forced; None or "auto": decided (actors.drafter.placement)
    dtype: str | None = None  # forced; None or "auto": decided (actors.drafter.placement)

    def __post_init__(self) -> None:
        _require(isinstance(self.head_dir, str) and bool(self.head_dir), "head_dir", "must be a non-empty str",
                 self.head_dir)
        _require(self.target_dir is None or isinstance(self.target_dir, str), "target_dir", "must be a str or None",
                 self.target_dir)
        _require(isinstance(self.engine, DrafterEngineConfig), "engine", "must be a DrafterEngineConfig",
                 self.engine)
        _require(self.num_threads is None or self.num_threads >= 1, "num_threads", "must be >= 1 or None",
                 self.num_threads)
        if self.cpu_affinity is not None:
            cores = tuple(self.cpu_affinity)  # a list (from YAML) becomes a tuple: the settings stay immutable
            _require(bool(cores) and all(isinstance(c, int) and c >= 0 for c in cores), "cpu_affinity",
                     "must be a non-empty list of core numbers >= 0, or None", self.cpu_affinity)
            object.__setattr__(self, "cpu_affinity", cores)
        if self.device not in (None, "auto"):
            check_device(self.device)  # errors name "drafter device"
        if self.dtype not in (None, "auto"):
            _require(isinstance(self.dtype, str), "dtype", "must be a str or None", self.dtype)
            parse_dtype(self.dtype)  # errors name "drafter dtype"
