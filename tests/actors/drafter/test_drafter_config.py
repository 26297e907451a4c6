"""The drafter's settings (``actors.drafter.config``): frozen, checked when built with errors naming the field (actors
are used without ``cluster``'s pydantic models), and carried whole through Ray's pickling."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DEFAULT_MAX_MODEL_LEN, DrafterEngineConfig, DrafterSettings
from actors.messages import MAX_SPECULATIVE_TOKENS


def test_defaults():
    engine = DrafterEngineConfig()
    assert (engine.max_model_len, engine.max_num_seqs, engine.kv_cache_gib, engine.idle_slot_ttl_s, engine.max_k,
            engine.prefix_cache_fraction, engine.branches) == (DEFAULT_MAX_MODEL_LEN, 1024, None, 300.0,
                                                                MAX_SPECULATIVE_TOKENS, 0.2, None)
    settings = DrafterSettings("head")
    assert settings.engine == engine and settings.target_dir is None and settings.num_threads is None


@pytest.mark.parametrize("field, value", [
    ("max_model_len", 0), ("max_num_seqs", 0), ("kv_cache_gib", 0), ("kv_cache_free_fraction", 0),
    ("kv_cache_free_fraction", 1.5), ("prefix_cache_fraction", 1.0), ("prefix_cache_fraction", -0.1),
    ("idle_slot_ttl_s", 0), ("max_k", 0), ("max_k", MAX_SPECULATIVE_TOKENS + 1),
    ("branches", {"bonus_fanout": 2}), ("fixed_shape_steps", "yes"), ("enforce_eager", 1),
    ("cuda_graph_max_batch", 0), ("cuda_graph_max_batch", 2048),
])
def test_engine_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DrafterEngineConfig(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("head_dir", ""), ("target_dir", 3), ("engine", {"max_k": 3}), ("num_threads", 0), ("cpu_affinity", ()),
    ("cpu_affinity", [-1]), ("device", "tpu"), ("dtype", "int8"),
])
def test_settings_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DrafterSettings(**{"head_dir": "head", field: value})


def test_frozen_immutable_and_picklable():
    settings = DrafterSettings("head", "target", DrafterEngineConfig(max_model_len=64, branches=BranchConfig()),
                               num_threads=2, cpu_affinity=[0, 1], device="cpu", dtype="bfloat16")
    assert settings.cpu_affinity == (0, 1)  # a YAML's list, kept as a tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.engine.max_k = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(settings)) == settings  # as Ray sends it to an actor's constructor
    assert dataclasses.replace(settings, dtype="auto").dtype == "auto"


def test_engine_and_actor_refuse_anything_else(toy_heads):
    from actors.drafter.actor import DrafterActor
    from actors.drafter.engine import DrafterEngine
    from actors.eagle.checkpoint import load_head

    target_dir, heads = toy_heads
    with pytest.raises(TypeError, match="DrafterEngineConfig"):
        DrafterEngine(load_head(heads["eagle1"], target_dir), {"max_model_len": 64})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DrafterSettings"):
        DrafterActor(str(heads["eagle1"]), str(target_dir))  # type: ignore[arg-type]
