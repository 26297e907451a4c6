"""``actors.eagle.layers``: the docstrings' worked examples."""

from __future__ import annotations

import torch

from actors.eagle.layers import permute_for_rotary, unpermute_for_rotary


def test_permute_for_rotary_worked_example():
    """head_dim 4: rows (r0, r1, r2, r3) -> neox order (r0, r2, r1, r3); two heads permute each alone."""
    w = torch.arange(4.0)[:, None].repeat(1, 3)  # row i holds i
    assert permute_for_rotary(w, n_heads=1)[:, 0].tolist() == [0, 2, 1, 3]
    w2 = torch.arange(8.0)[:, None]
    assert permute_for_rotary(w2, n_heads=2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert torch.equal(unpermute_for_rotary(permute_for_rotary(w2, 2), 2), w2)
