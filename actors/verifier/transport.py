"""How a step's hidden rows reach each drafter: the seam between ``RemoteSpeculator.send`` and the drafter call.

Runs in vLLM's driver worker. ``RemoteSpeculator.send`` encodes the step's hidden tensor once (``StepRows``: bf16 as
its int16 bits, no copy) and, for each home's share, calls ``link.rows.send(actor, sub-step bytes, step rows, the
home's row indices)``, which makes the ``draft_step`` call and returns its ObjectRef. Two paths:

- ``HostRows`` (the fallback, and what every step did before): the home's rows fancy-indexed out of the step's host
  array (host copy 1) and passed as the call's argument, which Ray serialises into the call (under 100 KiB) or into
  the object store (host copy 2; the drafter reads it there in place).
- ``ShmTransport`` (both actors on one node): the rows written once into a free slot of the pair's shared-memory
  region (``actors.shm_rows``: straight from the hidden tensor, host copy 1), only their metadata over Ray
  (``DrafterActor.draft_step_shm``); the drafter reads them in place. A slot is free once the call that last read it
  has answered (``ray.wait``, no blocking), so a step never overwrites rows the drafter has not read; the
  generation in each slot's header makes any breach an error on the drafter's side (a ``FAILED`` answer: the
  verifier drops that drafter, its sequences short this step). A sub-step takes the host path instead, counted by
  reason (``TransportStats.fallbacks``), when its rows do not fit a slot (``too_big``: a long prompt chunk), no
  slot is free (``busy``), the drafter has not mapped the region yet (``opening``) or could not (``open_failed``,
  from then on always).

Which path, at attach (``Transports.attach``, from ``TransportConfig.mode``, the draft client's
``hidden_transport``): ``host``; ``shm`` (forced: whatever the drafter's node, still host if it cannot map the
region); ``auto`` (the default): shared memory when the drafter reports this process's Ray node id, else host. The
region is created there, once per (verifier, drafter) link, and closed (unlinked) when the drafter is dropped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from actors.shm_rows import ShmRegion
from actors.wire import wire_tensor

logger = logging.getLogger(__name__)
TRANSPORT_MODES = ("auto", "host", "shm")
# Host copies of a home's rows on each path once they are in host memory (``StepRows``): the host path's fancy index
# (left out when one home takes the whole step) and Ray's object store; the shared-memory slot.
COPIES = {"host": 2, "host, one home": 1, "shm": 1}


def host_copies(path: str, whole_step: bool) -> int:
    return COPIES["host, one home"] if path == "host" and whole_step else COPIES[path]


@dataclass(frozen=True)
class TransportConfig:
    """The draft client's transport settings (``draft_client.hidden_transport``, ``shm_slots``, ``shm_slot_mib``);
    errors name the field."""

    mode: str = "auto"
    shm_slots: int = 4  # slots per pair: steps whose rows the drafter may still be reading, plus one
    shm_slot_mib: float = 16.0  # a step's rows for one drafter past this go by the host path (Scout EAGLE-3: 546 rows)

    def __post_init__(self) -> None:
        if self.mode not in TRANSPORT_MODES:
            raise ValueError(f"draft_client.hidden_transport: {str(self.mode)[:40]!r} is none of "
                             f"{', '.join(TRANSPORT_MODES)}")
        if not isinstance(self.shm_slots, int) or isinstance(self.shm_slots, bool) or self.shm_slots < 2:
            raise ValueError(f"draft_client.shm_slots: {self.shm_slots!r}, must be an integer >= 2")
        if not isinstance(self.shm_slot_mib, int | float) or not 0 < self.shm_slot_mib <= 64 * 1024:
            raise ValueError(f"draft_client.shm_slot_mib: {self.shm_slot_mib!r}, must be in (0, 65536]")

    @property
    def slot_bytes(self) -> int:
        return int(self.shm_slot_mib * 2**20)


@dataclass
class TransportStats:
    """Per verifier, over all its drafters: sub-steps and bytes sent by path, host-path fallbacks by reason."""

    sent: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)
    ship_ms: Counter[str] = field(default_factory=Counter)  # copies + call submission, summed, by path

    def count(self, path: str, nbytes: int, start: float) -> None:
        self.sent[path] += 1
        self.bytes[path] += nbytes
        self.ship_ms[path] += (time.perf_counter() - start) * 1e3

    def as_dict(self) -> dict[str, Any]:
        return {"sent": dict(self.sent), "bytes": dict(self.bytes), "fallbacks": dict(self.fallbacks),
                "ship_ms": {k: round(v, 3) for k, v in self.ship_ms.items()}, "copies": dict(COPIES)}


class StepRows:
    """A step's hidden rows as they travel (``actors.wire.wire_tensor``: bf16 as its int16 bits), leaving the device
    once and not waited for where the copy starts: ``.to("cpu", non_blocking=True)`` (on CUDA into pinned memory from
    PyTorch's caching host allocator, queued after the forward that made the rows, an event recorded behind it; on the
    CPU the rows are in host memory already and nothing is copied). ``host`` waits for that event the first time a
    transport reads the rows."""

    def __init__(self, hidden: torch.Tensor) -> None:
        tensor, self.dtype = wire_tensor(hidden)  # [num_tokens, fused_hidden_size]
        self.width, self.element_size = int(tensor.shape[1]), tensor.element_size()
        self._host = tensor.to("cpu", non_blocking=True)
        self._copied: Any = None
        if tensor.is_cuda:
            self._copied = torch.cuda.Event()  # cuda-only
            self._copied.record()  # cuda-only

    def host(self) -> torch.Tensor:  # [num_tokens, fused_hidden_size] on the host
        if self._copied is not None:
            self._copied.synchronize()  # cuda-only: the copy, once
            self._copied = None  # cuda-only
        return self._host

    def array(self) -> np.ndarray:
        return self.host().numpy()

    def nbytes(self, rows: np.ndarray) -> int:
        return len(rows) * self.width * self.element_size


def _all_rows(idx: np.ndarray, n: int) -> bool:
    """Whether ``idx`` is every one of ``n`` rows in order (one home takes the step: no index copy needed)."""
    return len(idx) == n and bool(np.array_equal(idx, np.arange(n)))


class RowsTransport(Protocol):
    path: str

    def send(self, actor: Any, step_bytes: bytes, rows: StepRows, idx: np.ndarray) -> Any:
        """Calls ``actor``'s draft step for the sub-step ``step_bytes`` with rows ``idx`` of ``rows``; its ref."""
        ...

    def close(self) -> None: ...


class HostRows:
    """The rows as the call's array argument."""

    path = "host"

    def __init__(self, stats: TransportStats | None = None) -> None:
        self.stats = stats if stats is not None else TransportStats()

    def send(self, actor: Any, step_bytes: bytes, rows: StepRows, idx: np.ndarray) -> Any:
        start = time.perf_counter()
        array = rows.array()
        ref = actor.draft_step.remote(step_bytes, array if _all_rows(idx, len(array)) else array[idx])  # [M, width]
        self.stats.count(self.path, rows.nbytes(idx), start)
        return ref

    def close(self) -> None:
        pass


class ShmTransport:
    """One (verifier, drafter) pair's region and its slots (see the module docstring)."""

    path = "shm"

    def __init__(self, actor: Any, config: TransportConfig, stats: TransportStats) -> None:
        """Creates the region (``OSError`` if there is no room) and asks the drafter to map it (not waited for)."""
        self.actor, self.stats = actor, stats
        self.region = ShmRegion.create(config.shm_slots, config.slot_bytes)
        self.host = HostRows(stats)
        self.slot_refs: list[Any] = [None] * config.shm_slots  # the draft call that last read each slot
        self.generation = 0  # the last written
        self.next_slot = 0
        self.state = "opening"  # -> "open" | "open_failed" | "closed"
        try:
            self.open_ref: Any = actor.open_rows.remote(self.region.name, self.region.nonce.hex())
        except Exception as e:  # an actor without the method, or a handle gone
            self._open_failed(e)

    def wait_open(self, timeout_s: float) -> bool:
        """At start-up only (never in a step): wait up to ``timeout_s`` for the drafter to map the region."""
        import ray

        if self.state == "opening":
            ray.wait([self.open_ref], timeout=timeout_s)
        return self._is_open()

    def _is_open(self) -> bool:
        """Whether the drafter mapped the region; never blocks."""
        import ray

        if self.state == "opening" and ray.wait([self.open_ref], timeout=0)[0]:
            try:
                ok = ray.get(self.open_ref) is True
                error: Exception = RuntimeError("the drafter could not map it")
            except Exception as e:
                ok, error = False, e
            if ok:
                self.state = "open"
            else:
                self._open_failed(error)
        return self.state == "open"

    def _open_failed(self, error: Exception) -> None:
        logger.warning("drafter did not map shared-memory region %s (%s): its rows go by the host path",
                       self.region.name, str(error)[:200])
        self.state = "open_failed"
        self.region.close()

    def _free_slot(self) -> int | None:
        """A slot whose last reader has answered (round robin from the one after the last written), or None."""
        import ray

        n = len(self.slot_refs)
        for i in range(n):
            slot = (self.next_slot + i) % n
            ref = self.slot_refs[slot]
            if ref is None or ray.wait([ref], timeout=0)[0]:
                return slot
        return None

    def send(self, actor: Any, step_bytes: bytes, rows: StepRows, idx: np.ndarray) -> Any:
        start = time.perf_counter()
        nbytes = rows.nbytes(idx)
        slot = None
        if not self._is_open():
            reason = self.state
        elif nbytes > self.region.layout.slot_bytes:
            reason = "too_big"
        elif (slot := self._free_slot()) is None:
            reason = "busy"
        if slot is None:
            self.stats.fallbacks[reason] += 1
            return self.host.send(actor, step_bytes, rows, idx)
        self.generation += 1
        meta = self.region.write(slot, self.generation, rows.host(), idx)
        ref = actor.draft_step_shm.remote(step_bytes, meta.pack())
        self.slot_refs[slot] = ref
        self.next_slot = (slot + 1) % len(self.slot_refs)
        self.stats.count(self.path, nbytes, start)
        return ref

    def close(self) -> None:
        """The drafter was dropped (or the verifier closes): the region unlinked, the drafter told to unmap it."""
        if self.state == "open":
            try:
                self.actor.close_rows.remote(self.region.name)
            except Exception:
                pass
        if self.state != "open_failed":
            self.region.close()
        self.state = "closed"
        self.slot_refs = [None] * len(self.slot_refs)


def this_node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class Transports:
    """Chooses each new drafter link's transport (``attach``) and keeps the verifier's ``TransportStats``."""

    def __init__(self, config: TransportConfig | None = None) -> None:
        self.config = config or TransportConfig()
        self.stats = TransportStats()
        self._node: str | None = None

    def attach(self, actor: Any, info: dict[str, Any]) -> RowsTransport:
        mode = self.config.mode
        if mode == "auto":
            if self._node is None:
                self._node = this_node_id() or ""
            node = info.get("node_id")
            mode = "shm" if node and node == self._node else "host"
        if mode == "shm":
            try:
                return ShmTransport(actor, self.config, self.stats)
            except OSError as e:  # no /dev/shm, or no room in it
                self.stats.fallbacks["create_failed"] += 1
                logger.warning("no shared-memory region for a drafter (%s): its rows go by the host path", e)
        return HostRows(self.stats)
