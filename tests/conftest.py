"""Shared fixtures: tiny random checkpoints in vLLM's layouts; the shipped models' paths are the harness's
(``cluster.harness``), named here too for the tests.

Collecting needs only torch: on a machine without the cluster's packages (the GPU machine has no Ray, vLLM or
pydantic) the ``gpu`` tests and the drafter's own tests still collect and run; the model paths are then unset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.drafter.slot_attention import import_triton_for_interpreter
from cluster import serve_env

if not torch.cuda.is_available():  # the drafter's Triton kernel is tested on a CPU through Triton's interpreter
    import_triton_for_interpreter()

# The product's Serve defaults (the HAProxy ingress) for every Ray a test starts; nothing here imports Ray.
serve_env.apply()

ROOT = Path(__file__).resolve().parent.parent
try:
    from cluster.harness import EAGLE1, EAGLE1_3L, EAGLE3, MODELS, TARGET
except ImportError:  # no pydantic / Ray here: only the tests that need neither can run
    EAGLE1 = EAGLE1_3L = EAGLE3 = MODELS = TARGET = None
__all__ = ["EAGLE1", "EAGLE1_3L", "EAGLE3", "MODELS", "ROOT", "TARGET", "toy_target_spec"]


def toy_target_spec():
    from training.target import TargetSpec

    return TargetSpec(
        vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, intermediate_size_mlp=96, attention_chunk_size=8, max_position_embeddings=256,
    )


@pytest.fixture(scope="session")
def toy_target():
    from training.target import build_model

    torch.manual_seed(0)
    return build_model(toy_target_spec(), seed=0).eval()


@pytest.fixture(scope="session")
def toy_heads(toy_target, tmp_path_factory):
    """(target dir, {name: head dir}) with random EAGLE-1 (1 and 2 layers) and EAGLE-3 heads."""
    from actors.eagle.checkpoint import save_head
    from actors.eagle.spec import head_spec_from_dict
    from training import heads

    root = tmp_path_factory.mktemp("toy")
    toy_target.save_pretrained(root / "target")
    tcfg = toy_target.config.to_dict()
    rows = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, cfg in {
        "eagle1": heads.eagle1_config(tcfg, 1),
        "eagle1_2l": heads.eagle1_config(tcfg, 2),
        "eagle3": heads.eagle3_config(tcfg, [1, 2, 3], 128),
    }.items():
        spec = head_spec_from_dict(cfg)
        d2t = heads.draft_vocab_from_counts(rows, 300, 128) if name == "eagle3" else None
        head = heads.init_head(spec, toy_target, seed=1, d2t=d2t)
        for p in head.parameters():  # random, but not the near-identity init: make every weight matter
            if p.ndim >= 2 and p.requires_grad:
                torch.nn.init.normal_(p, std=0.2)
        save_head(head, root / name, cfg, dtype=torch.float32)
        out[name] = root / name
    return root / "target", out


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A local Ray cluster (4 CPUs) for one test module, in the module's ``NS`` namespace (its named drafter
    actors live there)."""
    import ray

    # address "local": a cluster of its own, even where another one on the machine is Ray's "current" (``ray start``)
    ray.init(address="local", namespace=request.module.NS, num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def pytest_collection_modifyitems(session, config, items) -> None:
    """A test module that starts vLLM engines or a Ray cluster must be ``pytest.mark.isolated`` (its own process:
    ``tests.run_isolated``); collection fails naming the module and what starts them."""
    from tests.run_isolated import unisolated_starters

    paths = sorted({Path(str(item.fspath)) for item in items if Path(str(item.fspath)).name.startswith("test_")})
    if offenders := unisolated_starters(paths):
        lines = [f"{module}: {', '.join(what)}" for module, what in offenders.items()]
        raise pytest.UsageError("these test modules start vLLM engines or Ray but are not marked "
                                "pytest.mark.isolated:\n  " + "\n  ".join(lines))
