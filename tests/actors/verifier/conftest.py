"""The verifier's vLLM adapter built for real on the CPU from the shipped tiny checkpoints' vLLM config (no engine, no
model loaded), with a stand-in model runner: what ``RemoteEagleProposer`` reads of it and nothing more."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import EAGLE3, TARGET


@pytest.fixture(scope="session")
def vllm_config():
    from vllm.engine.arg_utils import EngineArgs

    from actors.verifier.engine import verifier_kwargs

    spec = {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3}
    kwargs = verifier_kwargs(str(TARGET), spec, {"actor": "unused"}, max_num_batched_tokens=4096)
    return EngineArgs(**kwargs).create_engine_config()


@pytest.fixture
def make_adapter(vllm_config):
    """``make_adapter(speculation, runner=None, **kwargs)``: a ``RemoteEagleProposer`` (speculation None: a rank
    other than the driver)."""
    from actors.verifier.vllm_adapter import RemoteEagleProposer
    from tests.actors.fake_speculator import fake_runner

    def make(speculation, run: SimpleNamespace | None = None, **kwargs: Any) -> RemoteEagleProposer:
        return RemoteEagleProposer(vllm_config, torch.device("cpu"), run if run is not None else fake_runner(),
                                   speculation, **kwargs)

    return make
