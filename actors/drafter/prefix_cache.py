"""The drafter's prefix cache: draft K/V of prompt blocks, keyed by block hashes as vLLM keys its own.

vLLM caches prompt prefixes by KV block: block b of a sequence holds positions ``[b * B, (b + 1) * B)`` (B: the
verifier's block size), keyed by a hash of the block's tokens chained on the previous block's hash
(``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``). With a hit, vLLM computes (and hands the proposer hidden
states for) only the positions past the cached prefix, so the drafter must find the draft K/V of the cached
positions itself. This module keeps them the same way:

- ``hash_block_tokens``: vLLM's scheme with vLLM's default hash (``sha256`` over the pickled
  ``(parent hash, block tokens, extra keys)``), re-implemented because the drafter's process does not import vLLM
  (seconds of start-up and hundreds of MB; GPU drafter machines may lack it);
  ``tests/actors/drafter/test_prefix_cache.py`` checks it against vLLM's function. The chain's root is
  ``root_hash(B)`` (vLLM's is a random per-process ``NONE_HASH``, which no other process can know): hashes are
  comparable within a drafter, block for block.
- ``PrefixBlockStore``: the cached blocks, ``[num_blocks, B, num_kv_heads, head_dim]`` per layer, shared by every
  sequence of this drafter whose prompt starts with them, bounded (``max_blocks``) and evicted least recently used
  (a chain's deeper blocks first, as vLLM frees its blocks). A hit copies the blocks into the sequence's slot of the
  draft KV cache (``actors.drafter.kv_cache``: one dense slot per sequence, addressed by position), so running
  sequences never depend on the store and any stored block may be evicted.
- ``SeqTokens``: a sequence's token ids from position 0 (its prompt, then the accepted tokens its rows carry), to
  hash its blocks as they fill.

What a block's draft K/V holds: as in vLLM's colocated EAGLE, the draft row at position p pairs the target's hidden
state at p with the token at p + 1, so a block's last row depends on the first token of the next block; vLLM's
cached draft layers carry the same dependence. Drafts are only proposals: a stale entry can cost acceptance, never
output.

Worked example, B = 4: prompt ``[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]`` -> blocks ``[5, 6, 7, 8]`` and
``[9, 10, 11, 12]`` (``[13, 14]`` is not full: never cached), hashes h0 = H(root, (5, 6, 7, 8)),
h1 = H(h0, (9, 10, 11, 12)). A second sequence whose prompt starts with the same 8 tokens arrives with vLLM's hit
at P = 8: both hashes are in the store, its slot gets positions 0..7 copied in, and it drafts as if it had sent
them (``hit`` 8 tokens). Had only h0 been stored: positions 0..3 are copied and 4..7 are masked (a gap; ``miss``
4 tokens).
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

ROOT_SEED = "eagle-cluster draft prefix cache"


def sha256(obj: object) -> bytes:
    """vLLM's ``vllm.utils.hashing.sha256``: SHA-256 of the object pickled with the highest protocol."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def root_hash(block_size: int) -> bytes:
    """The parent of a chain's first block (vLLM's ``NONE_HASH``), one per block size: blocks of different sizes
    never share a key."""
    return sha256((ROOT_SEED, block_size))


def hash_block_tokens(parent_block_hash: bytes, curr_block_token_ids: Sequence[int],
                      extra_keys: tuple | None = None) -> bytes:
    """vLLM's ``hash_block_tokens(sha256, parent_block_hash, curr_block_token_ids, extra_keys)``."""
    return sha256((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def block_hashes(tokens: Sequence[int], block_size: int, num_blocks: int | None = None,
                 parent: bytes | None = None) -> list[bytes]:
    """The chained hashes of the full blocks of ``tokens`` (at most ``num_blocks``), from ``parent`` (default: the
    root). Worked example in the module docstring."""
    h = root_hash(block_size) if parent is None else parent
    n = len(tokens) // block_size if num_blocks is None else min(num_blocks, len(tokens) // block_size)
    out = []
    for b in range(n):
        h = hash_block_tokens(h, [int(t) for t in tokens[b * block_size : (b + 1) * block_size]])
        out.append(h)
    return out


@dataclass
class SeqTokens:
    """One sequence's token ids from position 0, and how many of its blocks are hashed and stored.

    ``tokens[p]``: the token at position p: the prompt's (authoritative: a chunked prefill's last row carries a
    stand-in next token), then those the sequence's rows carry (row p's input is the token at p + 1)."""

    prompt_len: int
    tokens: list[int]
    block_size: int
    hashes: list[bytes] = field(default_factory=list)  # of blocks 0, 1, ...: as far as tokens reach
    stored: int = 0  # blocks 0..stored-1 are in the store (or were, when the sequence put them there)
    broken: bool = False  # a gap in the tokens or the context: stores nothing more

    def add_rows(self, first_position: int, input_ids: Sequence[int]) -> None:
        """Rows at ``first_position``, ``first_position + 1``, ... with these input ids (tokens at p + 1)."""
        q0 = max(first_position + 1, self.prompt_len)
        new = [int(t) for t in input_ids[q0 - first_position - 1 :]]
        if not new:
            return
        if q0 > len(self.tokens):  # positions it never got: nothing to hash past them
            self.broken = True
            return
        if q0 < len(self.tokens):  # rewritten (a preempted sequence, a replayed step): later hashes may change
            del self.tokens[q0:]
            del self.hashes[q0 // self.block_size :]
            self.stored = min(self.stored, q0 // self.block_size)
        self.tokens.extend(new)

    def hashes_up_to(self, num_blocks: int) -> list[bytes]:
        """Hashes of blocks 0..num_blocks-1 (as far as the tokens reach), computed once."""
        want = min(num_blocks, len(self.tokens) // self.block_size)
        if len(self.hashes) < want:
            parent = self.hashes[-1] if self.hashes else None
            start = len(self.hashes)
            self.hashes += block_hashes(self.tokens[start * self.block_size :], self.block_size, want - start, parent)
        return self.hashes[:want]


class PrefixBlockStore:
    """Cached draft K/V blocks by hash, least recently used evicted first, at most ``max_blocks``."""

    def __init__(self, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, max_blocks: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 initial_blocks: int = 16) -> None:
        self.num_layers, self.block_size = num_layers, block_size
        self.shape_tail = (block_size, num_kv_heads, head_dim)
        self.max_blocks = max(1, max_blocks)
        self.dtype, self.device = dtype, device
        n = min(initial_blocks, self.max_blocks)
        self.k = [torch.zeros(n, *self.shape_tail, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.index: OrderedDict[bytes, int] = OrderedDict()  # hash -> block, least recently used first
        self.free_blocks = list(range(n - 1, -1, -1))
        self.evicted = 0

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    @property
    def num_cached(self) -> int:
        return len(self.index)

    def longest(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest stored prefix of ``hashes`` (touched: most recently used, the first block
        last, so a chain's tail is evicted before its head)."""
        blocks = []
        for h in hashes:
            b = self.index.get(h)
            if b is None:
                break
            blocks.append(b)
        self.touch(hashes[: len(blocks)])
        return blocks

    def touch(self, hashes: Sequence[bytes]) -> None:
        """A chain's stored blocks become the most recently used, its first block last (evicted last)."""
        for h in reversed(hashes):
            if h in self.index:
                self.index.move_to_end(h)

    def _allocate(self) -> int:
        if not self.free_blocks:
            old = self.k[0].shape[0]
            new = min(self.max_blocks, old * 2)
            if new > old:
                for lst in (self.k, self.v):
                    for i, t in enumerate(lst):
                        lst[i] = torch.cat([t, t.new_zeros(new - old, *self.shape_tail)])
                self.free_blocks = list(range(new - 1, old - 1, -1))
            else:  # full: the least recently used block goes
                _, b = self.index.popitem(last=False)
                self.evicted += 1
                return b
        return self.free_blocks.pop()

    def put(
        self,
        h: bytes,
        cache_k: list[torch.Tensor],  # per layer [num_slots, max_len, num_kv_heads, head_dim]
        cache_v: list[torch.Tensor],
        slot: int,
        first_position: int,
    ) -> None:
        """Store positions ``[first_position, first_position + block_size)`` of ``slot`` under ``h`` (a block
        already stored is only touched)."""
        if h in self.index:
            self.index.move_to_end(h)
            return
        b = self._allocate()
        end = first_position + self.block_size
        for layer in range(self.num_layers):
            self.k[layer][b] = cache_k[layer][slot, first_position:end]
            self.v[layer][b] = cache_v[layer][slot, first_position:end]
        self.index[h] = b

    def copy_into(self, blocks: list[int], cache_k: list[torch.Tensor], cache_v: list[torch.Tensor],
                  slot: int) -> None:
        """Blocks 0..len(blocks)-1 of a sequence into its slot: positions ``[0, len(blocks) * block_size)``."""
        if not blocks:
            return
        idx = torch.tensor(blocks, dtype=torch.long, device=self.k[0].device)
        end = len(blocks) * self.block_size
        for layer in range(self.num_layers):
            cache_k[layer][slot, :end] = self.k[layer].index_select(0, idx).flatten(0, 1)
            cache_v[layer][slot, :end] = self.v[layer].index_select(0, idx).flatten(0, 1)
