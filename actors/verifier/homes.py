"""Where each sequence's draft state lives: its *home*, the one drafter that holds its draft KV cache.

Used by ``actors.verifier.remote_speculator`` once per step, before the step is split among the homes.

- A new sequence whose first step carries its prompt (``DraftStep.prompts``, prefix caching) goes to the drafter this
  verifier last sent the longest prefix of that prompt to, block by block by the drafters' own block hashes
  (``actors.drafter.prefix_cache``), unless that drafter holds ``Drafters.prefix_max_load`` sequences or more (the
  pool's ``target_sequences_per_replica``): so two drafters keep each system prompt's blocks once, not twice. The
  index is a bounded guess (a drafter may have evicted blocks since, which it counts as prefix misses).
- Every other new sequence goes to the least-loaded drafter, ``new_group_size`` at a time.
- A sequence whose home failed is *lost* until its next step places it again (*re-homed*): its new drafter masks
  the context it never saw.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterable

from actors.drafter.prefix_cache import block_hashes
from actors.messages import DraftStep
from actors.verifier.drafters import DrafterLink

PREFIX_INDEX_BLOCKS = 65536  # block hashes remembered with the drafter last sent them (the latest)
REHOMED_IDS = 1024  # the latest re-homed sequences' ids kept (``rehomed_ids``)


class Homes:
    def __init__(self, new_group_size: int = 4) -> None:
        self.new_group_size = new_group_size
        self.home: dict[str, str] = {}  # req_id -> drafter id
        self.lost: dict[str, str] = {}  # req_id -> the home it lost, until re-homed
        self.rehomed = 0  # sequences that moved to another drafter
        self.rehomed_ids: deque[str] = deque(maxlen=REHOMED_IDS)  # ... the latest of them, oldest first
        self.prefix_index: OrderedDict[bytes, str] = OrderedDict()  # block hash -> drafter last sent it, oldest first
        self.prefix_homed = 0  # new sequences homed by their prompt's prefix

    def groups(self, req_ids: list[str]) -> list[tuple[str, list[int]]]:
        """[(home, sequence indices)], one group per home, in order of first appearance; sequences without a home
        are left out (they get no drafts).

        Worked example: req_ids [a, b, c, d], home {a: R1, c: R2, d: R1} -> [(R1, [0, 3]), (R2, [2])]."""
        out: dict[str, list[int]] = defaultdict(list)
        for i, rid in enumerate(req_ids):
            if rid in self.home:
                out[self.home[rid]].append(i)
        return list(out.items())

    def on(self) -> dict[str, list[str]]:
        """Drafter id -> every sequence homed there."""
        out: dict[str, list[str]] = defaultdict(list)
        for rid, h in self.home.items():
            out[h].append(rid)
        return out

    def release(self, req_ids: Iterable[str]) -> dict[str, list[str]]:
        """Finished sequences leave their homes: drafter id -> the ones it held."""
        out: dict[str, list[str]] = defaultdict(list)
        for rid in req_ids:
            self.lost.pop(rid, None)
            h = self.home.pop(rid, None)
            if h is not None:
                out[h].append(rid)
        return out

    def lose(self, drafter_id: str) -> list[str]:
        """The sequences homed on a failed drafter: lost, re-homed at their next step."""
        lost = [rid for rid, h in self.home.items() if h == drafter_id]
        for rid in lost:
            self.lost[rid] = self.home.pop(rid)
        return lost

    def place(self, req_ids: list[str], links: dict[str, DrafterLink], step: DraftStep, max_load: float) -> int:
        """Give ``req_ids`` (without a home) one (see the module docstring); returns how many were re-homed."""
        if not req_ids or not links:
            return 0
        prompts = step.prompts if step.block_size > 0 else {}
        rest, unmatched = [], []
        for rid in req_ids:
            prompt = prompts.get(rid)
            hashes = block_hashes(prompt, step.block_size) if prompt is not None else []
            link = self._prefix_home(hashes, links, max_load) if hashes else None
            if link is None:
                rest.append(rid)
                unmatched.append((rid, hashes))
                continue
            link.placed += 1
            self._settle(rid, link.drafter_id)
            self.prefix_homed += 1
            self._remember(hashes, link.drafter_id)
        moved = 0
        for i in range(0, len(rest), self.new_group_size):
            link = min(links.values(), key=lambda lk: lk.load + lk.placed)
            group = rest[i : i + self.new_group_size]
            link.placed += len(group)
            moved += sum(self._settle(rid, link.drafter_id) for rid in group)
        for rid, hashes in unmatched:  # their blocks will be on the drafter they went to
            if hashes:
                self._remember(hashes, self.home[rid])
        self.rehomed += moved
        return moved

    def _settle(self, rid: str, drafter_id: str) -> bool:
        """Home ``rid`` on ``drafter_id``; True if it had lost its home."""
        self.home[rid] = drafter_id
        if self.lost.pop(rid, None) is None:
            return False
        self.rehomed_ids.append(rid)
        return True

    def _prefix_home(self, hashes: list[bytes], links: dict[str, DrafterLink], max_load: float) -> DrafterLink | None:
        """The usable drafter last sent the longest prefix of these block hashes, if not loaded past ``max_load``."""
        best = None
        for h in hashes:
            link = links.get(self.prefix_index.get(h, ""))
            if link is None or (best is not None and link is not best):
                break
            best = link
        if best is None or best.load + best.placed >= max_load:
            return None
        return best

    def _remember(self, hashes: list[bytes], drafter_id: str) -> None:
        for h in hashes:
            self.prefix_index[h] = drafter_id
            self.prefix_index.move_to_end(h)
        while len(self.prefix_index) > PREFIX_INDEX_BLOCKS:
            self.prefix_index.popitem(last=False)
