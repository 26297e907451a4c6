"""Building blocks of the draft heads, with vLLM's numerics: RMSNorm in float32, neox rotary on q/k rows that
are already in neox order (Llama 4 checkpoints are permuted on load, as vLLM does), QK-norm after rotary,
chunked local attention on Llama 4 RoPE layers.

Attention is split in two so that the caller owns the keys and values: ``DraftAttention.qkv`` projects the new
tokens, the caller's ``AttendFn`` places their K/V (a training mask, or the drafter's KV cache) and returns the
attention output, and ``DraftAttention.out`` projects it back. The same layer weights thus serve the training
loop (``training.heads``) and the drafter engine.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from actors.eagle import kernels
from actors.eagle.spec import HeadSpec, RopeSpec

# (layer index, q [..., num_heads, head_dim], k/v [..., num_kv_heads, head_dim], positions [...]) -> [..., heads*dim]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.use_kernel = False  # vLLM's kernel (``actors.eagle.kernels``), for inference: see ``DraftHead.fuse``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel:
            return kernels.rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.eps, self.weight)


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """In float32, one fused op (``F.rms_norm``)."""
    return F.rms_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(), eps).to(x.dtype)


def inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim // 2]; scaled variants come from ``transformers``' rope functions."""
    base = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if rope.rope_type in ("default", None):
        return base
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope.rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_parameters.rope_type: {rope.rope_type!r} is not supported")
    cfg = PretrainedConfig()
    cfg.rope_parameters = dict(rope.params)
    cfg.head_dim = head_dim
    cfg.hidden_size = head_dim
    cfg.num_attention_heads = 1
    cfg.max_position_embeddings = int(rope.params.get("original_max_position_embeddings", 8192)) * 2
    freqs, _ = ROPE_INIT_FUNCTIONS[rope.rope_type](cfg, torch.device("cpu"))
    return freqs.float()


def rotary_cos_sin(positions: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [..., 1, head_dim // 2], for positions [...]: computed once, applied to q and k."""
    angles = positions.float()[..., None] * freqs  # [..., head_dim // 2]
    return angles.cos()[..., None, :], angles.sin()[..., None, :]


def apply_neox_rotary(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [..., heads, head_dim] in neox order (first half, second half); ``cos_sin`` from ``rotary_cos_sin``."""
    cos, sin = cos_sin
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def permute_for_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Interleaved (Llama 4 / Meta) q/k rows -> neox rows, as vLLM's ``permute_qk_weight_for_rotary``.

    Worked example, head_dim 4: rows (r0, r1, r2, r3) hold pairs (r0, r1), (r2, r3) rotated together; neox
    order wants the pair members half a head apart, so the rows become (r0, r2, r1, r3).
    """
    f_out, f_in = w.shape
    return w.view(n_heads, f_out // n_heads // 2, 2, f_in).transpose(1, 2).reshape(f_out, f_in)


def unpermute_for_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of ``permute_for_rotary`` (for saving in the checkpoint's own layout)."""
    f_out, f_in = w.shape
    return w.view(n_heads, 2, f_out // n_heads // 2, f_in).transpose(1, 2).reshape(f_out, f_in)


class DraftAttention(nn.Module):
    def __init__(self, spec: HeadSpec, layer: int, input_size: int) -> None:
        super().__init__()
        self.spec = spec
        self.layer = layer
        h, d = spec.num_heads, spec.head_dim
        kv = spec.num_kv_heads
        bias = spec.attention_bias
        self.q_proj = nn.Linear(input_size, h * d, bias=bias)
        self.k_proj = nn.Linear(input_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(input_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, spec.hidden_size, bias=False)
        self.use_rope = spec.use_rope[layer] if spec.use_rope else True
        self.use_qk_norm = spec.use_qk_norm and self.use_rope
        self.temperature_tuning = spec.attn_temperature_tuning and not self.use_rope
        self.register_buffer("freqs", inv_freq(spec.rope, d), persistent=False)
        self.fused_qkv: torch.Tensor | None = None  # [(heads + 2 * kv_heads) * head_dim, input_size], see fuse()
        self.fused_qkv_bias: torch.Tensor | None = None
        self.cos_sin: torch.Tensor | None = None  # [max_positions, head_dim] for vLLM's rotary kernel, see fuse()

    def reset_freqs(self) -> None:
        """Rotary frequencies in float32 again, after a cast of the whole module (``DraftHead.cast``)."""
        self.freqs = inv_freq(self.spec.rope, self.spec.head_dim).to(self.freqs.device)

    def fuse(self, max_positions: int | None = None, use_kernels: bool = False) -> None:
        """For inference: one matmul for q, k and v (the weights stay as they are, for saving and training), and
        with ``max_positions`` and ``use_kernels``, rotary by vLLM's kernel for positions below it."""
        self.fused_qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).detach()
        if self.q_proj.bias is not None:
            self.fused_qkv_bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]).detach()
        if max_positions and self.use_rope and use_kernels:
            self.cos_sin = kernels.cos_sin_cache(self.freqs, max_positions, self.fused_qkv.dtype)

    @property
    def chunk_size(self) -> int | None:
        """Chunked local attention applies to Llama 4 RoPE layers only."""
        return self.spec.attention_chunk_size if self.use_rope else None

    def qkv(
        self,
        x: torch.Tensor,  # [..., input_size]
        positions: torch.Tensor,  # [...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.spec.head_dim
        if self.fused_qkv is not None:
            h, kv = self.spec.num_heads * d, self.spec.num_kv_heads * d
            q, k, v = F.linear(x, self.fused_qkv, self.fused_qkv_bias).split([h, kv, kv], dim=-1)
            # Flat int64 rows, the kernel's layout; positions must lie below the table's length (the drafter engine
            # clamps them to max_model_len - 1, and its table has max_model_len + 1 rows): the kernel does not check.
            rotated = self.cos_sin is not None and positions.ndim == 1 and positions.dtype == torch.long
            if rotated:
                kernels.rotary_(positions, q, k, d, self.cos_sin)  # in place, on the matmul's output
            q, k, v = q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)), v.unflatten(-1, (-1, d))
        else:
            rotated = False
            q = self.q_proj(x).unflatten(-1, (-1, d))  # [..., num_heads, head_dim]
            k = self.k_proj(x).unflatten(-1, (-1, d))  # [..., num_kv_heads, head_dim]
            v = self.v_proj(x).unflatten(-1, (-1, d))
        if self.use_rope and not rotated:
            cos_sin = rotary_cos_sin(positions, self.freqs)
            q = apply_neox_rotary(q, cos_sin)
            k = apply_neox_rotary(k, cos_sin)
        if self.use_qk_norm:
            q = rms_norm(q, self.spec.rms_norm_eps)
            k = rms_norm(k, self.spec.rms_norm_eps)
        if self.temperature_tuning:
            floor = torch.floor((positions.float() + 1.0) / self.spec.floor_scale)
            q = q * (torch.log(floor + 1.0) * self.spec.attn_scale + 1.0)[..., None, None]
        return q, k, v

    def out(self, attn: torch.Tensor) -> torch.Tensor:  # [..., num_heads * head_dim] -> [..., hidden]
        return self.o_proj(attn)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.fused_gate_up: torch.Tensor | None = None  # [2 * intermediate, hidden], see fuse()
        self.use_kernel = False

    def fuse(self, use_kernels: bool = False) -> None:
        """For inference: one matmul for gate and up (and with ``use_kernels`` vLLM's ``silu_and_mul`` after it)."""
        self.fused_gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight]).detach()
        self.use_kernel = use_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_gate_up is not None:
            if self.use_kernel:
                return self.down_proj(kernels.silu_and_mul(F.linear(x, self.fused_gate_up)))
            gate, up = F.linear(x, self.fused_gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def sdpa_attend(
    q: torch.Tensor,  # [B, Tq, num_heads, head_dim]
    k: torch.Tensor,  # [B, Tk, num_kv_heads, head_dim]
    v: torch.Tensor,  # [B, Tk, num_kv_heads, head_dim]
    mask: torch.Tensor,  # [B or 1, Tq, Tk] bool, True = may attend
) -> torch.Tensor:  # [B, Tq, num_heads * head_dim]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with sdpa_kernel(_NO_CUDNN) if q.is_cuda else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask[:, None], scale=1 / math.sqrt(q.shape[-1]),
            enable_gqa=qh.shape[1] != kh.shape[1],
        )
    return out.transpose(1, 2).flatten(-2)


# cuDNN's SDPA builds an execution plan for every new shape (~40-115 ms of host time each on an H200), and these
# callers' shapes change every step: every other backend, none of which plans per shape.
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
