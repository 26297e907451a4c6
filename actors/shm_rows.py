"""A step's hidden rows through shared memory, verifier -> drafter on one node: the region's layout, the verifier's
writes into it and the drafter's reads from it. No Ray here.

Where it sits in the data flow: ``RemoteSpeculator.send`` hands each home's rows to that link's transport
(``actors.verifier.transport``); on the shared-memory path it writes them into a free slot of the pair's region
(``ShmRegion.write``, one host copy, straight from the step's hidden tensor) and calls
``DrafterActor.draft_step_shm(step bytes, ShmRows bytes)``: only the metadata (``actors.messages.ShmRows``) travels
over Ray. The actor finds the rows in place (``RowsReader.view``) and hands them to ``DrafterEngine.draft`` as it
would a host array, then checks that nobody rewrote them meanwhile (``RowsReader.check_unchanged``).

One region per (verifier, drafter) pair, a file in ``/dev/shm`` the verifier creates at attach (allocated up front:
a full tmpfs fails there, not later with SIGBUS) and the drafter opens once (``RowsReader.open``, which checks the
region's nonce, so it is the memory the verifier wrote, and unlinks the name: from then on nothing is left in
``/dev/shm`` whoever dies first; the memory goes with the last mapping). The verifier unlinks it too when it drops
the drafter, closes, or exits before the drafter opened it.

Layout (little-endian, every offset a multiple of 64)::

    [0, 64)                       magic b"ECROWS01", nonce (16 bytes), slots (u64), slot_bytes (u64)
    slot i at 64 + i * (64 + slot_bytes):
      [0, 64)                     writing (u64), ready (u64): generations
      [64, 64 + slot_bytes)       the rows, [rows, width] in the dtype they travel as (bf16 as int16), C order

Ordering. Generations count up from 1, one per write in the region. Writing generation g to a slot: ``writing = g``,
the rows, ``ready = g``. A read of (slot, g) needs ``ready == writing == g`` before and ``writing == g`` once the
drafter is done with the rows (a rewrite sets ``writing`` first), else ``StaleRows``. The verifier reuses a slot only
once the drafter call that read it has answered (``actors.verifier.transport``); the generations make any breach of
that an error the verifier treats as a failed drafter, never wrong drafts.

Worked example: 2 slots of 1 MiB. Step 7 writes slot 0 as generation 1 (``writing = ready = 1``) and sends
``ShmRows(slot=0, generation=1, rows=3, ...)``; step 8 writes slot 1 as generation 2; step 9 finds slot 0's call
answered and writes it as generation 3. A drafter still holding step 7's metadata then reads ``writing = 3 != 1``:
``StaleRows``.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from actors.messages import BadStep, ShmRows
from actors.wire import HIDDEN_WIRE_DTYPES

SHM_DIR = "/dev/shm"
REGION_PREFIX = "eagle-cluster-rows-"
NAME_RE = re.compile(r"eagle-cluster-rows-[0-9a-f]{32}")
MAGIC = b"ECROWS01"
HEADER = 64  # region header and each slot header, bytes
ALIGN = 64
MAX_OPEN_REGIONS = 64  # a drafter keeps at most this many verifiers' regions mapped (least recently used closed)


class StaleRows(BadStep):
    """Shared-memory rows that are not (or no longer) the ones the step's metadata names."""


@dataclass(frozen=True)
class Layout:
    slots: int
    slot_bytes: int  # a multiple of ALIGN

    @property
    def size(self) -> int:
        return HEADER + self.slots * (HEADER + self.slot_bytes)

    def header_offset(self, slot: int) -> int:
        return HEADER + slot * (HEADER + self.slot_bytes)

    def data_offset(self, slot: int) -> int:
        return self.header_offset(slot) + HEADER


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ShmRegion:
    """One pair's region, mapped: the verifier's (``create``, writable) or the drafter's (``open``, read-only)."""

    def __init__(self, path: str, mm: mmap.mmap, layout: Layout, nonce: bytes, writable: bool) -> None:
        self.path, self.mm, self.layout, self.nonce, self.writable = path, mm, layout, nonce, writable
        self._gens = [np.frombuffer(mm, np.uint64, 2, layout.header_offset(i)) for i in range(layout.slots)]
        # [slot_bytes] uint8 each: the slots' rows as torch sees them (the writer's only)
        self._data = [torch.frombuffer(mm, dtype=torch.uint8, count=layout.slot_bytes, offset=layout.data_offset(i))
                      for i in range(layout.slots)] if writable else []
        self._finalizer = weakref.finalize(self, _unlink, path) if writable else None  # at exit too

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @classmethod
    def create(cls, slots: int, slot_bytes: int, directory: str = SHM_DIR) -> ShmRegion:
        """A new region of ``slots`` slots of at least ``slot_bytes`` each; ``OSError`` when ``directory`` has no
        room (allocated here, so a full tmpfs fails now rather than with SIGBUS at a write)."""
        layout = Layout(slots, -(-slot_bytes // ALIGN) * ALIGN)
        nonce = secrets.token_bytes(16)
        path = os.path.join(directory, REGION_PREFIX + secrets.token_hex(16))
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, layout.size)
            mm = mmap.mmap(fd, layout.size)
        except BaseException:
            _unlink(path)
            raise
        finally:
            os.close(fd)
        mm[:HEADER] = (MAGIC + nonce + np.array([slots, layout.slot_bytes], "<u8").tobytes()).ljust(HEADER, b"\0")
        return cls(path, mm, layout, nonce, writable=True)

    @classmethod
    def open(cls, name: str, nonce_hex: str, directory: str = SHM_DIR) -> ShmRegion:
        """The drafter's mapping of a region a verifier created (read-only), checked against its nonce, and its name
        unlinked. ``ValueError`` for a name or nonce that is not one, a file that is not that region."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(f"shared-memory region name {str(name)[:60]!r} is not one this project makes")
        try:
            nonce = bytes.fromhex(nonce_hex)
        except (TypeError, ValueError):
            nonce = b""
        if len(nonce) != 16:
            raise ValueError("shared-memory region nonce must be 32 hex digits")
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER:
                raise ValueError(f"shared-memory region {name}: {size} bytes, no header")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        head = mm[:HEADER]
        slots, slot_bytes = (int(x) for x in np.frombuffer(head, "<u8", 2, len(MAGIC) + 16))
        layout = Layout(slots, slot_bytes)
        if head[:len(MAGIC)] != MAGIC or head[len(MAGIC):len(MAGIC) + 16] != nonce or layout.size != size \
                or slot_bytes % ALIGN:
            mm.close()
            raise ValueError(f"shared-memory region {name}: not the region this verifier created")
        _unlink(path)  # both ends have it mapped: nothing to leak in /dev/shm from here on
        return cls(path, mm, layout, nonce, writable=False)

    # --- the verifier's side ---------------------------------------------------------------------------------------
    def write(self, slot: int, generation: int, src: torch.Tensor, rows: np.ndarray) -> ShmRows:
        """Rows ``rows`` of ``src`` (``[N, width]``, the dtype they travel as) into ``slot`` as ``generation``: one
        copy, straight from ``src`` (a slice copy when ``rows`` are consecutive, else an index-select into the
        slot; from a device tensor, the select on the device and one copy down). Returns the metadata to send."""
        n, width = len(rows), int(src.shape[1])
        nbytes = n * width * src.element_size()
        if nbytes > self.layout.slot_bytes:
            raise ValueError(f"{nbytes} bytes of rows do not fit a {self.layout.slot_bytes}-byte slot")
        gens = self._gens[slot]
        gens[0] = generation  # writing
        dst = self._data[slot][:nbytes].view(src.dtype).view(n, width)  # [n, width] in the slot
        if n and rows[-1] - rows[0] == n - 1 and (n < 3 or bool(np.all(np.diff(rows) == 1))):
            dst.copy_(src[int(rows[0]):int(rows[0]) + n])
        elif src.device.type == "cpu":
            torch.index_select(src, 0, torch.from_numpy(np.asarray(rows, np.int64)), out=dst)
        else:  # cuda-only
            dst.copy_(src.index_select(0, torch.as_tensor(rows, device=src.device)))
        gens[1] = generation  # ready
        return ShmRows(self.name, slot, generation, self.layout.data_offset(slot), n, width)

    # --- the drafter's side ----------------------------------------------------------------------------------------
    def check(self, meta: ShmRows, itemsize: int) -> None:
        """``meta`` names rows inside one of this region's slots; else ``BadStep``."""
        lay = self.layout
        if not 0 <= meta.slot < lay.slots:
            raise BadStep(f"shared-memory rows: slot {meta.slot} of a region of {lay.slots}")
        if meta.offset != lay.data_offset(meta.slot):
            raise BadStep(f"shared-memory rows: offset {meta.offset} is not slot {meta.slot}'s")
        if meta.rows < 0 or meta.width < 1 or meta.rows * meta.width * itemsize > lay.slot_bytes:
            raise BadStep(f"shared-memory rows: [{meta.rows}, {meta.width}] x {itemsize} bytes do not fit a "
                          f"{lay.slot_bytes}-byte slot")
        if meta.generation < 1:
            raise BadStep(f"shared-memory rows: generation {meta.generation}")

    def generations(self, slot: int) -> tuple[int, int]:
        """(writing, ready) of ``slot``."""
        g = self._gens[slot]
        return int(g[0]), int(g[1])

    def close(self) -> None:
        """Unmaps (once the last view of it is gone) and, for the verifier's, unlinks the name if still there."""
        if self._finalizer is not None:
            self._finalizer()
        self._gens, self._data = [], []
        try:
            self.mm.close()
        except BufferError:  # a view still exported (rows a caller holds): unmapped when it goes
            pass


class RowsReader:
    """The drafter's regions, by name (one per verifier that attached to it), at most ``max_regions``."""

    def __init__(self, max_regions: int = MAX_OPEN_REGIONS) -> None:
        self.regions: OrderedDict[str, ShmRegion] = OrderedDict()
        self.max_regions = max_regions

    def open(self, name: str, nonce_hex: str, directory: str = SHM_DIR) -> None:
        region = ShmRegion.open(name, nonce_hex, directory)
        old = self.regions.pop(region.name, None)
        if old is not None:
            old.close()
        self.regions[region.name] = region
        while len(self.regions) > self.max_regions:
            self.regions.popitem(last=False)[1].close()

    def close(self, name: str) -> None:
        region = self.regions.pop(name, None) if isinstance(name, str) else None
        if region is not None:
            region.close()

    def view(self, meta: ShmRows, hidden_dtype: str) -> np.ndarray:
        """The rows ``meta`` names, in place (read-only, ``[rows, width]`` in the dtype ``hidden_dtype`` travels
        as), or ``BadStep`` / ``StaleRows``: an unknown region, metadata outside it, a slot not (or no longer) at
        ``meta.generation``."""
        region = self.regions.get(meta.region)
        if region is None:
            raise BadStep(f"shared-memory rows: region {meta.region[:60]!r} was never opened here")
        self.regions.move_to_end(meta.region)
        dtype = HIDDEN_WIRE_DTYPES.get(hidden_dtype)
        if dtype is None:
            raise BadStep(f"draft step: hidden_dtype {hidden_dtype[:40]!r} is none of {sorted(HIDDEN_WIRE_DTYPES)}")
        region.check(meta, dtype.itemsize)
        writing, ready = region.generations(meta.slot)
        if not writing == ready == meta.generation:
            raise StaleRows(f"shared-memory rows: slot {meta.slot} holds generation {ready} (writing {writing}), "
                            f"the step names {meta.generation}")
        rows = np.frombuffer(region.mm, dtype, meta.rows * meta.width, meta.offset).reshape(meta.rows, meta.width)
        return rows  # read-only: the mapping is

    def check_unchanged(self, meta: ShmRows) -> None:
        """After the rows were used: ``StaleRows`` if the slot was rewritten meanwhile."""
        region = self.regions.get(meta.region)
        writing = region.generations(meta.slot)[0] if region is not None else -1
        if writing != meta.generation:
            raise StaleRows(f"shared-memory rows: slot {meta.slot} was rewritten (generation {writing}) while "
                            f"generation {meta.generation} was read")
