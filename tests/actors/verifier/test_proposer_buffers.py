"""``RemoteEagleProposer`` allocates none of vLLM's draft-model buffers (``hidden_states``, ``inputs_embeds``:
``[max_num_batched_tokens, H]`` each, ~1.6 GB per rank on Scout at 80k batched tokens); it keeps only what the
inherited step preparation reads. Built on the CPU from the shipped tiny checkpoints' vLLM config (no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.conftest import EAGLE3, TARGET


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.engine.arg_utils import EngineArgs

    from actors.verifier.engine import verifier_kwargs

    spec = {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3}
    kwargs = verifier_kwargs(str(TARGET), spec, {"client": "unused"}, max_num_batched_tokens=4096)
    return EngineArgs(**kwargs).create_engine_config()


@pytest.fixture(scope="module")
def proposer(vllm_config):
    from actors.verifier.proposer import RemoteEagleProposer

    return RemoteEagleProposer(vllm_config, torch.device("cpu"), None, None, is_driver=False)


def _tensors(obj) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}
    for k, v in vars(obj).items():
        if hasattr(v, "cpu") and hasattr(v, "gpu"):  # vLLM's CpuGpuBuffer
            out[f"{k}.gpu"] = v.gpu
    return out


def test_no_draft_model_buffers(vllm_config, proposer):
    for name in ("hidden_states", "inputs_embeds", "positions", "arange", "_slot_mapping_buffer"):
        assert getattr(proposer, name, None) is None, name
    tensors = _tensors(proposer)
    assert set(tensors) == {"input_ids", "backup_next_token_ids.gpu"}
    assert all(t.device == torch.device("cpu") for t in tensors.values())
    max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
    assert sum(t.numel() * t.element_size() for t in tensors.values()) <= 4 * (max_tokens + 1024)  # int32 ids only
    assert proposer.device == torch.device("cpu")


def test_step_preparation_still_works(proposer):
    """``prepare_next_token_ids_cpu`` (the runner's non-padded path) makes its tensor on ``input_ids``' device;
    ``backup_next_token_ids`` is a real buffer of ``max_num_seqs`` rows."""
    batch = SimpleNamespace(req_ids=["a", "b"])
    requests = {"b": SimpleNamespace(num_computed_tokens=5, get_token_id=lambda i: 100 + i)}
    ids = proposer.prepare_next_token_ids_cpu([[7, 8], []], requests, batch, {"a": 3, "b": 2})
    assert ids.tolist() == [8, 107] and ids.device == torch.device("cpu")
    buf = proposer.backup_next_token_ids
    assert buf.gpu.shape == (proposer.max_batch_size,) and not buf.gpu.is_meta
    buf.np[:2] = [3, 4]
    assert buf.copy_to_gpu(2).tolist() == [3, 4]
