"""How the verifier reaches a drafter: the ``DraftClient`` protocol and its plain-Ray implementation.

The hidden states are put once into the Ray object store; the drafter actor receives the ``ObjectRef`` as a
top-level argument, so Ray hands it the array straight from the store (zero-copy on the same node) instead of
routing a copy through a third process. The metadata travels as msgpack bytes (``actors.messages``).

``cluster/`` provides a client that routes over a pool of Ray Serve drafter replicas; a client is named by
an import path in vLLM's ``additional_config`` so that this package never imports Serve.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from actors.messages import DraftResult, DraftStep


@dataclass
class ProposeTiming:
    ship_ms: float  # tensor to numpy + ray.put
    wait_ms: float  # from the call to the result, minus the drafter's own compute
    compute_ms: float  # inside the drafter engine


class DraftClient(Protocol):
    def propose(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftResult, ProposeTiming]: ...

    def free(self, req_ids: list[str]) -> None:
        """Drop finished sequences' draft state (when no further step would carry them in ``finished``)."""


def hidden_to_numpy(hidden: torch.Tensor) -> tuple[np.ndarray, str]:
    """[N, width] tensor -> numpy (bf16 travels as its int16 bits, since numpy has no bf16)."""
    hidden = hidden.detach()
    if hidden.dtype == torch.bfloat16:
        return hidden.contiguous().view(torch.int16).cpu().numpy(), "bfloat16"
    return hidden.float().contiguous().cpu().numpy(), "float32"


def timed_propose(
    step: DraftStep, hidden: torch.Tensor, call: Callable[[bytes, Any], bytes]
) -> tuple[DraftResult, ProposeTiming]:
    """Put the hidden states once, ``call(packed step, ObjectRef)`` a drafter, and time both halves."""
    import ray

    t0 = time.perf_counter()
    array, step.hidden_dtype = hidden_to_numpy(hidden)
    ref = ray.put(array)
    t1 = time.perf_counter()
    packed = call(step.pack(), ref)
    t2 = time.perf_counter()
    result = DraftResult.unpack(packed)
    return result, ProposeTiming((t1 - t0) * 1e3, (t2 - t1) * 1e3 - result.compute_ms, result.compute_ms)


class ActorDraftClient:
    """Calls one named drafter actor (``actors.drafter.actor.DrafterActor``)."""

    def __init__(self, actor: str | Any, namespace: str | None = None, timeout_s: float = 30.0) -> None:
        import ray

        self.actor = ray.get_actor(actor, namespace=namespace) if isinstance(actor, str) else actor
        self.timeout_s = timeout_s

    def propose(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftResult, ProposeTiming]:
        import ray

        return timed_propose(
            step, hidden, lambda packed, ref: ray.get(self.actor.propose.remote(packed, ref), timeout=self.timeout_s)
        )

    def free(self, req_ids: list[str]) -> None:
        import ray

        ray.get(self.actor.free.remote(req_ids), timeout=self.timeout_s)


def build_client(spec: dict[str, Any]) -> DraftClient:
    """``{"client": "module:Class", **kwargs}`` -> a client (``ActorDraftClient`` by default)."""
    spec = dict(spec)
    path = spec.pop("client", "actors.verifier.client:ActorDraftClient")
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(**spec)
