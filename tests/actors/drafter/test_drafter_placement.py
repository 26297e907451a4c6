"""Where a drafter computes and in which dtype (``actors.drafter.placement``), and that ``DrafterActor`` builds
its engine that way. The decision is a plain function, so the GPU cases are checked here without a GPU."""

from __future__ import annotations

import pytest
import torch

from actors.drafter import placement
from actors.drafter.placement import Placement, choose_placement

BF16_HEAD = {"torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    "has_gpu, cuda_usable, config, device, dtype, expected",
    [
        (True, True, BF16_HEAD, None, None, Placement("cuda", torch.bfloat16)),  # a GPU actor, a published head
        (True, True, {"dtype": "float16"}, None, None, Placement("cuda", torch.float16)),  # newer transformers' key
        (True, True, {}, None, None, Placement("cuda", torch.bfloat16)),  # no dtype named: bfloat16 on a GPU
        (False, True, BF16_HEAD, None, None, Placement("cpu", torch.float32)),  # Ray gave it no GPU
        (False, False, BF16_HEAD, None, None, Placement("cpu", torch.float32)),
        (False, False, BF16_HEAD, "auto", "bf16", Placement("cpu", torch.bfloat16)),  # configured
        (True, True, BF16_HEAD, None, "float32", Placement("cuda", torch.float32)),
        (True, True, BF16_HEAD, "cpu", None, Placement("cpu", torch.float32)),  # forced onto the CPU
    ],
)
def test_choose_placement(has_gpu, cuda_usable, config, device, dtype, expected):
    assert choose_placement(config, has_gpu=has_gpu, cuda_usable=cuda_usable, device=device, dtype=dtype) == expected


def test_gpu_that_torch_cannot_use_is_an_error():
    with pytest.raises(RuntimeError, match="cannot use CUDA"):
        choose_placement(BF16_HEAD, has_gpu=True, cuda_usable=False)
    with pytest.raises(ValueError, match="dtype"):
        choose_placement(BF16_HEAD, has_gpu=False, cuda_usable=False, dtype="int8")


def test_detect_placement_outside_ray_follows_torch(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # outside Ray, whatever an earlier test left running
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement.detect_placement(BF16_HEAD) == Placement("cuda", torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement.detect_placement(BF16_HEAD) == Placement("cpu", torch.float32)


def test_detect_placement_inside_ray_follows_the_gpus_ray_gave(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU on the node...
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])  # ...but none for this actor
    assert placement.detect_placement(BF16_HEAD) == Placement("cpu", torch.float32)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [0])
    assert placement.detect_placement(BF16_HEAD) == Placement("cuda", torch.bfloat16)


def test_actor_builds_its_engine_as_decided(toy_heads):
    from dataclasses import replace

    from actors.drafter.actor import DrafterActor
    from actors.drafter.config import DrafterEngineConfig, DrafterSettings

    target_dir, heads = toy_heads
    settings = DrafterSettings(str(heads["eagle3"]), str(target_dir), engine=DrafterEngineConfig(max_model_len=64))
    default = DrafterActor(settings)  # no GPU here: CPU, float32
    assert (default.engine.device, default.engine.dtype) == ("cpu", torch.float32)
    assert default.probe() == (1, 1)
    bf16 = DrafterActor(replace(settings, dtype="bfloat16"))
    assert bf16.engine.dtype == bf16.engine.cache.dtype == torch.bfloat16
    assert bf16.engine.head.fc.weight.dtype == torch.bfloat16
    assert bf16.probe() == (1, 1)
    assert bf16.stats()["dtype"] == "bfloat16"
