"""The drafter's own KV cache: one slot per sequence, addressed by position.

``k[layer]`` / ``v[layer]``: ``[num_slots, max_len, num_kv_heads, head_dim]``. A sequence's entry at position p
is simply overwritten when p is written again, which covers the three cases the verifier produces:
accepted tokens replacing the speculative entries of the last step, a preempted sequence restarting at
position 0, and draft steps writing ahead. Attention only reads positions <= the query's, so stale entries
further right are never seen.

A sequence first seen mid-stream (re-homed here after its drafter died or scaled down) has no entries before
its first position: ``known_from[slot]`` records that position, and attention masks keys before it, so the
sequence drafts from the context it has here rather than from another sequence's stale entries.

``next_pos[slot]``: the position after the last *real* row written (``DrafterEngine._context``; draft passes
write ahead but do not count). A step that starts further right (``start_position > next_pos``: rows that never
reached this drafter: the verifier's target-only steps (k = 0, which ship nothing), or a step whose call failed)
would read entries that are missing or drafts': positions ``[next_pos, start_position)`` become the slot's gap,
masked, so the sequence keeps drafting from everything else it has. A slot holds one gap: a second one widens it
to ``[gap_lo, start_position)`` (the real rows between the two are masked too, still more context than none).
Worked example: rows 0-4 arrive, k = 0 steps at positions 5-7 ship nothing, then a step starts at 8: it attends
to 0-4 and 8 on (gap [5, 8)); after rows 8-9, k = 0 again at 10-11 and a step at 12: gap [5, 12), it attends to
0-4 and 12 on.

A sequence whose first step starts at P > 0 because vLLM found its prefix in its own prefix cache gets positions
[0, m * B) copied in from the drafter's prefix cache (``actors.drafter.prefix_cache``; m blocks found of size B).
If m * B < P, positions ``[gap_lo, gap_hi) = [m * B, P)`` hold nothing and attention masks them too; a step that
rewrites them (a restart) shrinks the gap. With m = 0 it is treated like a re-homed sequence (``known_from = P``).

Scratch slots (``scratch_slots``, after the sequences' slots in each tensor) belong to no sequence: pipelined drafting's
fixed-shape branch passes write each branch's own rows into one (``actors.drafter.branch_passes``).

Slots are also reclaimed from sequences nobody steps or frees any more (a verifier that died, a free that was
lost): ``evict_idle`` frees those not used for a while, oldest first (``last_used``, in use order), so leaked
slots do not inflate the load that routers and autoscalers read (``num_active``).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class CacheFullError(RuntimeError):
    pass


def consecutive(slots: list[int]) -> bool:
    """Whether each slot is the one after the previous (one sequence: True): their entries are one view."""
    return all(b == a + 1 for a, b in zip(slots, slots[1:], strict=False))


def device_budget_gib(device: str | torch.device, fraction: float) -> float | None:
    """GiB the draft KV cache may take on ``device`` when no budget is configured: ``fraction`` of the memory
    free now (call it once the weights are there; the rest is for activations and whoever shares the GPU).
    ``None`` (no cap but the slot count) on a CPU."""
    if torch.device(device).type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(device))  # cuda-only
    return fraction * free / 2**30  # cuda-only


class DraftKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        initial_slots: int = 8,
        max_slots: int = 1024,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        scratch_slots: int = 0,
    ) -> None:
        self.num_layers, self.initial_slots, self.scratch_slots = num_layers, initial_slots, scratch_slots
        self.shape_tail = (max_len, num_kv_heads, head_dim)
        self.max_len = max_len
        self.max_slots = max_slots
        self.dtype, self.device = dtype, device
        self.generation = 0  # bumped whenever the K/V tensors are reallocated (captured CUDA graphs hold them)
        self._allocate(initial_slots)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype) -> int:
        """Memory one sequence's slot takes: K and V, ``[max_len, num_kv_heads, head_dim]`` per layer."""
        return 2 * num_layers * max_len * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    def _allocate(self, num_slots: int) -> None:
        self.generation += 1
        self.k = [torch.zeros(num_slots + self.scratch_slots, *self.shape_tail, dtype=self.dtype, device=self.device)
                  for _ in range(self.num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.slot_of: dict[str, int] = {}
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.known_from = torch.zeros(num_slots, dtype=torch.long)  # [num_slots] on the CPU: read per step
        self.next_pos = torch.zeros(num_slots, dtype=torch.long)  # [num_slots] after the last real row (CPU)
        self.gap_lo = torch.zeros(num_slots, dtype=torch.long)  # [num_slots] masked positions [gap_lo, gap_hi) (CPU)
        self.gap_hi = torch.zeros(num_slots, dtype=torch.long)  # [num_slots]; gap_hi <= gap_lo: no gap
        self.last_used: OrderedDict[str, float] = OrderedDict()  # req_id -> when last stepped, oldest first

    @property
    def num_slots(self) -> int:
        """Slots for sequences (the scratch slots follow them)."""
        return self.k[0].shape[0] - self.scratch_slots

    def scratch_slot(self, i: int) -> int:
        """The index of scratch slot ``i`` (< ``scratch_slots``) in the K/V tensors."""
        return self.num_slots + i

    @property
    def num_active(self) -> int:
        return len(self.slot_of)

    def _grow(self) -> None:
        old = self.num_slots
        new = min(self.max_slots, old * 2)
        if new == old:
            raise CacheFullError(f"draft KV cache: all {old} slots in use")
        self.generation += 1
        for lst in (self.k, self.v):
            for i, t in enumerate(lst):
                extra = torch.zeros(new - old + self.scratch_slots, *self.shape_tail, dtype=self.dtype,
                                    device=self.device)
                lst[i] = torch.cat([t[:old], extra])  # scratch slots stay last (their contents are per call)
        self.known_from = torch.cat([self.known_from, self.known_from.new_zeros(new - old)])
        self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(new - old)])
        self.gap_lo = torch.cat([self.gap_lo, self.gap_lo.new_zeros(new - old)])
        self.gap_hi = torch.cat([self.gap_hi, self.gap_hi.new_zeros(new - old)])
        self.free_slots = list(range(new - 1, old - 1, -1)) + self.free_slots

    def slots_for(
        self, req_ids: list[str], start_positions: list[int], now: float = 0.0,
        prefixed: set[str] | frozenset[str] = frozenset(),
    ) -> tuple[torch.Tensor, int]:  # ([B] slot indices (CPU), allocating new sequences; how many arrived mid-stream)
        """``now``: the time of this use (``last_used``; ``evict_idle`` compares it). ``prefixed``: new sequences
        whose start past 0 is a prefix-cache hit (their prompt came with the step), not counted cold."""
        out, cold = [], 0
        # numpy views of the per-slot tensors: a numpy scalar read or write costs ~0.1 us, a torch one several (a
        # decode step of 128 sequences spent ~1 ms here); views are taken after any _grow, which replaces them.
        new = sum(rid not in self.slot_of for rid in req_ids)
        while len(self.free_slots) < new:  # grown before anything changes (CacheFullError past max_slots)
            self._grow()
        known, nxt_pos, gap_lo, gap_hi = (t.numpy() for t in (self.known_from, self.next_pos, self.gap_lo,
                                                              self.gap_hi))
        for rid, pos in zip(req_ids, start_positions, strict=True):
            slot = self.slot_of.get(rid)
            if slot is None:
                slot = self.free_slots.pop()
                self.slot_of[rid] = slot
                known[slot] = nxt_pos[slot] = pos
                gap_lo[slot] = gap_hi[slot] = 0
                cold += pos > 0 and rid not in prefixed
            elif pos < known[slot]:  # restarted (preempted): everything from pos is rewritten
                known[slot] = pos
                gap_hi[slot] = min(gap_hi[slot], pos)
            elif pos > (nxt := int(nxt_pos[slot])):  # rows it never got: masked as the slot's gap
                if gap_hi[slot] <= gap_lo[slot]:  # none yet
                    gap_lo[slot] = nxt
                gap_hi[slot] = pos
            else:  # continues, or restarts inside what it has: a gap past pos is rewritten from here
                gap_hi[slot] = min(gap_hi[slot], pos)
            self.last_used[rid] = now
            self.last_used.move_to_end(rid)
            out.append(slot)
        return torch.tensor(out, dtype=torch.long), cold

    def restore_prefix(self, slot: int, known: int, start_position: int) -> None:
        """A new sequence starting at ``start_position`` whose positions [0, ``known``) were copied in from the
        prefix cache: it attends to them, and positions [known, start_position) are masked (a gap, if any)."""
        if known <= 0:
            return
        self.known_from[slot] = 0
        self.gap_lo[slot], self.gap_hi[slot] = (known, start_position) if known < start_position else (0, 0)

    def full_context(self, slot: int) -> bool:
        """Whether a slot's entries from position 0 are all real rows (no masked start, no gap)."""
        return int(self.known_from[slot]) == 0 and int(self.gap_hi[slot]) <= int(self.gap_lo[slot])

    def wrote(
        self,
        slots: torch.Tensor,  # [B] (CPU)
        last_positions: torch.Tensor,  # [B] each sequence's last real row written (CPU)
    ) -> None:
        """Real rows (not drafts) were written up to ``last_positions``: the next step continues after them."""
        self.next_pos[slots] = last_positions + 1

    def evict_idle(self, before: float, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Free the sequences last used before ``before`` (except ``keep``); returns them. Cheap when nothing is
        idle: ``last_used`` is in use order, so the scan stops at the first recent one."""
        idle = []
        for rid, used in self.last_used.items():
            if used >= before:
                break
            if rid not in keep:
                idle.append(rid)
        self.free(idle)
        return idle

    def free(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            slot = self.slot_of.pop(rid, None)
            self.last_used.pop(rid, None)
            if slot is not None:
                self.free_slots.append(slot)
        if not self.slot_of and self.num_slots > self.initial_slots:  # idle: give back what a burst grew
            self._allocate(self.initial_slots)

    def write(
        self,
        layer: int,
        slots: torch.Tensor,  # [N] slot of each row (on the cache's device)
        positions: torch.Tensor,  # [N] (on the cache's device)
        k: torch.Tensor,  # [N, num_kv_heads, head_dim]
        v: torch.Tensor,  # [N, num_kv_heads, head_dim]
    ) -> None:
        self.k[layer][slots, positions] = k.to(self.dtype)
        self.v[layer][slots, positions] = v.to(self.dtype)

    def read_shared(
        self,
        layer: int,
        slots: list[int],  # [B]
        lo: int,
        width: int,  # lo + width <= max_len
    ) -> tuple[torch.Tensor, torch.Tensor]:  # each [B, width, num_kv_heads, head_dim], on the cache's device
        """``read_window`` for a window every sequence reads at the same positions [lo, lo + width) (a global layer,
        or one attention chunk): for consecutive slots (one sequence, or a batch placed together) a view of the
        cache, no copy; else one block copy per slot, ~3x faster than ``read_window``'s gather."""
        first, num = slots[0], len(slots)
        k, v = self.k[layer], self.v[layer]
        if consecutive(slots):
            return k[first : first + num, lo : lo + width], v[first : first + num, lo : lo + width]
        index = torch.tensor(slots, device=self.device)
        return k[:, lo : lo + width].index_select(0, index), v[:, lo : lo + width].index_select(0, index)

    def read_window(
        self,
        layer: int,
        slots: torch.Tensor,  # [B] (CPU)
        positions: torch.Tensor,  # [B, width]: each row consecutive positions (CPU)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # each [B, width, num_kv_heads, head_dim], on the cache's device
        lo, width = int(positions[0, 0]), positions.shape[1]
        if int(positions[-1, -1]) == lo + width - 1 and bool((positions[:, 0] == lo).all()):
            return self.read_shared(layer, slots.tolist(), lo, width)  # every row reads the same positions
        idx = (slots.to(self.device)[:, None], positions.to(self.device))
        return self.k[layer][idx], self.v[layer][idx]
