"""vLLM's fused kernels for the draft head's inference passes, where vLLM is installed.

Where it sits: ``actors.eagle.layers`` calls these from a head that ``DraftHead.fuse`` prepared for inference (the
drafter engine's); training and a machine without vLLM run torch's ops, with the same numerics.

Why: a draft pass over a batch of a few rows is a string of small ops, and on a CPU each torch op costs several
microseconds of dispatch whatever its size. vLLM's own EAGLE heads run their RMSNorm and rotary through vLLM's
kernels (``torch.ops._C``, registered by the vLLM build installed: CUDA's, or the CPU build's for this CPU);
measured on this project's CPU (one thread, one row of 256): ``F.rms_norm`` ~20 us, vLLM's ``rms_norm`` ~4 us;
neox rotary on q and k in torch ~95 us (eleven ops each), vLLM's ``rotary_embedding`` ~4 us.

``rotary_`` rotates q and k in place, from a table of cos / sin computed in float32 and stored in the head's dtype,
as vLLM's ``RotaryEmbedding`` keeps its ``cos_sin_cache``. ``tests/actors/eagle/test_kernels.py``
checks each against the torch op it replaces.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def available() -> bool:
    """Whether vLLM's kernels can be called in this process. vLLM's platform loads the build for this CPU (on x86:
    ``_C`` with AVX-512 BF16, else ``_C_AVX512``, else ``_C_AVX2``; a plain ``import vllm._C`` dies of an illegal
    instruction on an AVX2-only CPU), and each registers its ops as ``torch.ops._C``."""
    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()
    except (ImportError, OSError):  # no vLLM, or a build whose native libraries do not load here
        return False
    ops = torch.ops._C
    return all(hasattr(ops, name) for name in ("rms_norm", "rotary_embedding", "silu_and_mul"))


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [..., hidden], a new tensor
    x = x.contiguous()  # the kernel reads rows as contiguous (a strided view gives wrong rows)
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, eps)
    return out


def rotary_(
    positions: torch.Tensor,  # [N] int64
    q: torch.Tensor,  # [N, num_heads * head_dim] (rows may be strided: a view of one qkv matmul's output)
    k: torch.Tensor,  # [N, num_kv_heads * head_dim]
    head_dim: int,
    cos_sin_cache: torch.Tensor,  # [max_positions, head_dim]: cos of each angle, then sin (``cos_sin_cache``)
) -> None:
    """Neox-style rotary on q and k, in place."""
    torch.ops._C.rotary_embedding(positions, q, k, head_dim, cos_sin_cache, True)


def cos_sin_cache(freqs: torch.Tensor, max_positions: int, dtype: torch.dtype) -> torch.Tensor:
    """[max_positions, head_dim]: angles position * freq in float32, then cos | sin in ``dtype``."""
    angles = torch.arange(max_positions, dtype=torch.float32, device=freqs.device)[:, None] * freqs.float()
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2 * d] (gate, then up) -> [..., d]
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    torch.ops._C.silu_and_mul(out, gate_up)
    return out
