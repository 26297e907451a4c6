"""``ServeDraftClient``: the verifier's ``DraftClient`` over the drafter deployment's Serve handle.

Runs inside vLLM's engine process (named by import path in ``additional_config``, so ``actors/`` never imports
Serve). The hidden states are put once into the object store; the handle call carries the ``ObjectRef``.
"""

from __future__ import annotations

import torch

from actors.messages import DraftResult, DraftStep
from actors.verifier.client import ProposeTiming, timed_propose


class ServeDraftClient:
    def __init__(self, app_name: str, deployment_name: str, timeout_s: float = 10.0) -> None:
        from ray import serve

        self.handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        self.timeout_s = timeout_s

    def propose(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftResult, ProposeTiming]:
        return timed_propose(
            step, hidden, lambda packed, ref: self.handle.propose.remote(packed, ref).result(timeout_s=self.timeout_s)
        )
