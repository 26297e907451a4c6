"""How hidden rows travel between the verifier and a drafter: one encode / decode pair, used by both sides.

numpy has no bfloat16, so a bf16 tensor travels as its int16 bits and is viewed back as bf16 on arrival; anything
else travels as float32. ``HIDDEN_WIRE_DTYPES`` maps a step's ``hidden_dtype`` to the numpy dtype its arrays travel
as (``DraftStep.check_hidden`` and ``validate_mm`` check arrays against it). The same pair carries the target's
hidden rows (the call's array argument) and a step's image embeddings (``DraftStep.mm_embeds``).

Worked example: a ``[2, 4]`` bf16 tensor -> (a ``[2, 4]`` int16 array of its bits, ``"bfloat16"``) -> the same
``[2, 4]`` bf16 tensor, bit for bit; a float16 tensor -> (float32 array, ``"float32"``) -> a float32 tensor.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

HIDDEN_WIRE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.int16)}  # hidden_dtype -> array dtype


def wire_tensor(hidden: torch.Tensor) -> tuple[torch.Tensor, str]:
    """A tensor -> (the tensor it travels as, on its own device, its ``hidden_dtype``): bf16 as its int16 bits (a
    view), float32 as it is, anything else as float32 (a copy)."""
    hidden = hidden.detach()
    if hidden.dtype == torch.bfloat16:
        return hidden.contiguous().view(torch.int16), "bfloat16"
    return hidden.float().contiguous(), "float32"


def encode_hidden(hidden: torch.Tensor) -> tuple[np.ndarray, str]:
    """A tensor -> (the numpy array it travels as, its ``hidden_dtype``): bf16 as its int16 bits, else float32."""
    tensor, dtype = wire_tensor(hidden)
    return tensor.cpu().numpy(), dtype


def decode_hidden(array: np.ndarray, hidden_dtype: str, copy: bool = False) -> torch.Tensor:
    """The tensor ``encode_hidden`` encoded as ``array`` (already checked against ``HIDDEN_WIRE_DTYPES``).

    ``copy`` False: a view of ``array``'s buffer (usually a read-only view of the object store, never written to);
    True: a copy, for a buffer the tensor outlives (a message's bytes)."""
    if copy:
        array = np.array(array)
    with warnings.catch_warnings():  # a read-only buffer: torch warns, but nothing here writes to it
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if hidden_dtype == "bfloat16" else tensor
