"""Asynchronous drafting: next-step drafts precomputed for the likely outcomes of the step being verified.

Where it sits: ``actors.drafter.engine.DrafterEngine`` answers a step, then (off the critical path, while the
verifier verifies what it was given) extends each sequence's draft chain and drafts a *branch* per likely
outcome; the next step's request is answered from a matching branch at once. Any draft is lossless (the
verifier's rejection sampler decides), so a branch drafted from the head's own predicted features instead of
the target's is only a question of acceptance.

Notation for one sequence (terms: ``actors/eagle/__init__.py``). The step's last real row is at position L
(input: the token x at L+1). Pass 0 is that row's context pass; pass j (1 <= j <= s) is the draft pass at
position L+j, input ``T_j`` (the j-th served draft), feature ``f_j`` (the head's prediction of the target's
feature there); pass j gives ``logits_j`` (for the token at L+j+2) and ``f_{j+1}``. Pass s is one pass beyond
what drafting needs: it gives the bonus token's distribution. Usually s = k; s = 0 for a prompt step whose
drafts the verifier did not wait for (it proposed placeholders, so it accepts none: a = 0).

The verifier then accepts ``a`` drafts (0 <= a <= s) and emits token ``y`` at L+a+2: a recovered token if
a < s, the bonus token if a = s. Outcome (a, y)'s branch drafts k tokens from a row at position L+a+1 with
input y and feature ``f_a+1``, attending to the sequence's cache up to L+a (real entries up to L, the passes'
entries for L+1..L+a, whose inputs ``T_1..T_a`` are exactly the accepted tokens) and to its own new rows.
Guesses for y: the top ``bonus_fanout`` tokens of ``logits_s`` (a = s), and the top ``recovered_fanout`` of
``logits_a`` other than ``T_a+1`` (a < s), at most ``BranchConfig.branches_per_sequence`` in all (``guesses``).

Worked example, k = 2, L = 9, served T = [t1, t2]: outcome (a=1, y) is the next step shipping rows at
positions 10 (input t1) and 11 (input y); its branch row is position 11, input y, feature f_2, over cache
keys 0..10 (real 0..9, pass 1's entry at 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.drafter.kv_cache import DraftKVCache
from actors.eagle.layers import sdpa_attend
from actors.messages import BranchEntry

__all__ = ["BranchAttention", "BranchConfig", "BranchEntry", "guesses"]


@dataclass(frozen=True)
class BranchConfig:
    bonus_fanout: int = 2  # guesses for the bonus token (all k drafts accepted)
    recovered_fanout: int = 1  # guesses for the recovered token at each earlier rejection point; 0: none
    max_branch_rows: int | None = 32  # branches per step for the whole batch; None: no limit

    def __post_init__(self) -> None:
        if self.bonus_fanout < 1 or self.recovered_fanout < 0:
            raise ValueError(f"branches: bonus_fanout >= 1 and recovered_fanout >= 0, got {self}")
        if self.max_branch_rows is not None and self.max_branch_rows < 0:
            raise ValueError(f"branches: max_branch_rows >= 0, got {self.max_branch_rows}")

    def branches_per_sequence(self, k: int, batch_size: int = 1, budget: int | None = None) -> int:
        """Fan-out that adapts to load: the configured guesses per sequence, fewer as the batch grows so that a
        step drafts at most ``max_branch_rows`` branches (and at most ``budget``, the rows the drafter's spare time
        holds: ``actors.drafter.branch_budget``), and none once the batch alone exceeds that (the drafter then
        drafts on demand, as synchronous drafting does)."""
        full = self.bonus_fanout + k * self.recovered_fanout
        caps = [c for c in (self.max_branch_rows, budget) if c is not None]
        if not caps:
            return full
        return min(full, min(caps) // max(batch_size, 1))


def guesses(
    logits: torch.Tensor,  # [B, s + 1, draft_vocab] logits_0..logits_s
    served_draft_ids: torch.Tensor,  # [B, s] T_1..T_s in the head's draft vocabulary
    config: BranchConfig,
    per_sequence: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, n] outcome a, [B, n] guessed y in draft ids), n <= per_sequence
    """The ``per_sequence`` likeliest outcomes, best first: the bonus token's top guess (a = s), then the top
    recovered guess at each rejection point a < s (logits_a without T_a+1), then the second choices, and so on,
    up to ``bonus_fanout`` / ``recovered_fanout`` of each.

    Worked example, s = 1, fanouts 2 / 1: logits_0 top [T_1, u], logits_1 top [v, w] -> a = [1, 0, 1],
    y = [v, u, w]; with per_sequence 2: a = [1, 0], y = [v, u]."""
    num_seqs, s1, _ = logits.shape
    s = s1 - 1
    bonus = logits[:, s].topk(config.bonus_fanout, dim=-1).indices  # [B, bonus_fanout]
    recovered = None
    if config.recovered_fanout and s:
        masked = logits[:, :s].scatter(-1, served_draft_ids[:, :, None], float("-inf"))
        recovered = masked.topk(config.recovered_fanout, dim=-1).indices  # [B, s, recovered_fanout]
    outcomes, ys = [], []
    for rank in range(max(config.bonus_fanout, config.recovered_fanout)):
        if rank < config.bonus_fanout:
            outcomes.append(torch.full((num_seqs, 1), s, device=logits.device))
            ys.append(bonus[:, rank : rank + 1])
        if recovered is not None and rank < config.recovered_fanout:
            outcomes.append(torch.arange(s, device=logits.device).expand(num_seqs, -1))
            ys.append(recovered[:, :, rank])
    return torch.cat(outcomes, dim=1)[:, :per_sequence], torch.cat(ys, dim=1)[:, :per_sequence]


class BranchAttention:
    """``AttendFn`` for branch passes: each branch row attends to its sequence's cache slot up to its base
    position (L+a; chunk, ``known_from`` and gap rules as ``CacheAttention``) and to the branch's own rows so far,
    which live here, not in the cache (branches of one sequence would overwrite each other).

    ``slots`` and ``base`` are CPU tensors (window widths are read from them without a device round trip);
    masks are computed on the device of the cache, next to the queries' positions."""

    def __init__(
        self,
        cache: DraftKVCache,
        slots: torch.Tensor,  # [R] each branch's sequence slot (CPU)
        base: torch.Tensor,  # [R] L+a: the last cache position a branch may read (CPU)
        chunk_sizes: dict[int, int | None],
    ) -> None:
        self.cache, self.slots, self.base, self.chunks = cache, slots, base, chunk_sizes
        self.first_q = base + 1  # position of each branch's first row
        dev = cache.device
        self.base_d, self.first_q_d = self.base.to(dev), self.first_q.to(dev)
        self.known_from_d = cache.known_from[slots].to(dev)  # [R]
        self.gap_d = (cache.gap_lo[slots].to(dev), cache.gap_hi[slots].to(dev))  # [R] each: masked [lo, hi)
        self.local_k: dict[int, list[torch.Tensor]] = {}
        self.local_v: dict[int, list[torch.Tensor]] = {}
        self._slot_keys: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _slot_window(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(key positions [R, W] on the device, keys, values [R, W, kv_heads, head_dim]) read once per layer."""
        if layer not in self._slot_keys:
            chunk = self.chunks[layer]
            lo = (self.first_q // chunk) * chunk if chunk else torch.zeros_like(self.first_q)
            width = max(int((self.base - lo).max()) + 1, 1)
            key_pos = lo[:, None] + torch.arange(width)
            k, v = self.cache.read_window(layer, self.slots, key_pos.clamp(0, self.cache.max_len - 1))
            self._slot_keys[layer] = (key_pos.to(self.cache.device), k, v)
        return self._slot_keys[layer]

    def __call__(self, layer: int, q, k, v, positions) -> torch.Tensor:
        # q: [R, heads, head_dim]; k, v: [R, kv_heads, head_dim]; positions: [R] (this pass's row per branch)
        self.local_k.setdefault(layer, []).append(k)
        self.local_v.setdefault(layer, []).append(v)
        key_pos, slot_k, slot_v = self._slot_window(layer)
        n_local = len(self.local_k[layer])
        local_pos = self.first_q_d[:, None] + torch.arange(n_local, device=key_pos.device)  # [R, n_local]
        q_pos = positions[:, None]
        slot_mask = (key_pos <= self.base_d[:, None]) & (key_pos >= self.known_from_d[:, None])
        slot_mask &= (key_pos < self.gap_d[0][:, None]) | (key_pos >= self.gap_d[1][:, None])
        local_mask = torch.ones_like(local_pos, dtype=torch.bool)
        chunk = self.chunks[layer]
        if chunk:
            slot_mask &= (key_pos // chunk) == (q_pos // chunk)
            local_mask &= (local_pos // chunk) == (q_pos // chunk)
        keys = torch.cat([slot_k.to(q.dtype), torch.stack(self.local_k[layer], dim=1)], dim=1)
        values = torch.cat([slot_v.to(q.dtype), torch.stack(self.local_v[layer], dim=1)], dim=1)
        mask = torch.cat([slot_mask, local_mask], dim=1)[:, None, :]  # [R, 1, W + n_local]
        return sdpa_attend(q[:, None], keys, values, mask)[:, 0]
