"""The drafter as a Ray actor: a ``DrafterEngine`` behind msgpack-in, msgpack-out methods, started with one
``actors.drafter.config.DrafterSettings``.

It runs one call at a time, in the order each caller sent them (a Ray actor with ``max_concurrency=1``), so a
verifier can send a step and not wait for it: everything it sends later is handled after it.

- ``draft_step(step_bytes, hidden)``: answer a ``DraftStep``; ``hidden`` arrives as a numpy array (Ray inlines a
  small one into the call, and passes a large one through the object store). Errors come back as a ``FAILED``
  result, so the verifier carries on without drafts: a malformed or out-of-bounds step (``BadStep``, from
  unpacking or validation) with the reason, anything else with a short traceback.
- ``draft_step_shm(step_bytes, rows_bytes)``: the same, with the hidden rows in the shared-memory region of the
  calling verifier (one node): ``rows_bytes`` is an ``actors.messages.ShmRows`` naming where; the rows are read in
  place (``actors.shm_rows.RowsReader``), and a slot not, or no longer, at the generation named is a ``FAILED``
  answer (``StaleRows``), never drafts from other rows. ``open_rows`` maps a verifier's region once, at attach
  (and unlinks its name); ``close_rows`` unmaps it.
- ``branches(req_ids)``: with asynchronous drafting, the engine's ``after_step`` (fold the step's real hidden
  states, draft the next step's branches), answered with a ``BranchTable`` of those sequences. The verifier
  calls it right after each ``draft_step`` without waiting, and keeps the reply's object ref for its next step.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from actors.drafter.config import DrafterSettings
from actors.drafter.engine import DrafterEngine
from actors.drafter.placement import detect_placement
from actors.eagle.checkpoint import SHARED_TENSOR_NAMES
from actors.eagle.compat import check_head_fits_target, target_text_config
from actors.eagle.hub import HEAD_FILES, resolve_model_dir, resolve_target_dir
from actors.eagle.spec import load_head_spec
from actors.messages import (
    BadStep,
    BranchTable,
    DraftResult,
    DraftStatus,
    DraftStep,
    ShmRows,
)
from actors.shm_rows import RowsReader, StaleRows
from actors.timing import ms_since

logger = logging.getLogger(__name__)


def req_id_list(value: object) -> list[str]:
    """The sequence ids of a ``branches`` / ``free`` call: a list of strings; anything else in it is dropped
    (logged), so that a malformed call answers for the ids it holds instead of raising."""
    ids = value if isinstance(value, list | tuple) else []
    out = [r for r in ids if isinstance(r, str)]
    if len(out) != len(ids) or ids is not value:
        logger.warning("drafter: sequence ids must be a list of strings, got %s", type(value).__name__)
    return out


class DrafterActor:
    def __init__(self, settings: DrafterSettings, drafter_id: str = "") -> None:
        """``settings``: the drafter's (``actors.drafter.config.DrafterSettings``, checked when it was built);
        ``drafter_id``: answered with every result, so a pool's client knows who drafted.

        ``settings.cpu_affinity``: bind this process to these cores (a drafter with cores of its own);
        ``settings.num_threads``: torch's threads in it. ``settings.device`` / ``settings.dtype``: forced, or
        ``None`` to decide from the resources this actor was given and the head (``actors.drafter.placement``): a
        GPU and the head's dtype when it has a GPU, else the CPU in float32. ``settings.engine``: the engine's
        (``DrafterEngine``): among them ``max_k``, the most draft tokens a step may ask for (more: a ``FAILED``
        answer), and ``max_num_seqs`` / ``kv_cache_gib``, the most sequences the draft KV cache holds and its
        memory cap (sequences past either get no drafts, ``DraftResult.full_seqs``, never an error)."""
        if not isinstance(settings, DrafterSettings):
            raise TypeError(f"drafter: settings must be a DrafterSettings, got {type(settings).__name__}")
        if settings.cpu_affinity:
            os.sched_setaffinity(0, settings.cpu_affinity)
        if settings.num_threads:
            import torch

            torch.set_num_threads(settings.num_threads)
        # Hub ids, as vLLM takes them, become their snapshot folders (with only what the drafter reads).
        head_dir = str(resolve_model_dir(settings.head_dir, HEAD_FILES))
        target_dir = settings.target_dir
        if target_dir is not None:
            target_dir = str(resolve_target_dir(target_dir, SHARED_TENSOR_NAMES))
        spec = load_head_spec(head_dir)
        if target_dir is not None:
            check_head_fits_target(spec, target_text_config(target_dir))
        self.settings = settings
        self.placement = detect_placement(spec.raw, settings.device, settings.dtype)
        self.engine = DrafterEngine.from_checkpoint(head_dir, target_dir, settings.engine,
                                                    device=self.placement.device, dtype=self.placement.dtype)
        self.head_dir = head_dir
        self.drafter_id = drafter_id
        self.steps = 0
        self.failures = 0
        self.cold_sequences = 0
        self.full_sequences = 0  # sequence-steps answered without drafts for lack of room
        self.branch_hits = 0
        self.branch_lookups = 0
        self.compute_ms: deque[float] = deque(maxlen=1024)  # per step, since the last load_window() read
        self.rows = RowsReader()  # verifiers' shared-memory regions (one node)
        self.stale_rows = 0  # steps refused for rows rewritten under them (StaleRows)

    def info(self) -> dict[str, Any]:
        """What a verifier's client needs to know about this drafter."""
        return {"drafter_id": self.drafter_id, "drafts_branches": self.engine.branch_config is not None,
                "node_id": _node_id()}

    def draft_step(self, step_bytes: bytes, hidden: np.ndarray) -> bytes:
        return self._answer(step_bytes, lambda step: self.engine.draft(step, hidden))

    def draft_step_shm(self, step_bytes: bytes, rows_bytes: bytes) -> bytes:
        def draft(step: DraftStep) -> DraftResult:
            meta = ShmRows.unpack(rows_bytes)
            result = self.engine.draft(step, self.rows.view(meta, step.hidden_dtype))  # in place, read-only
            try:
                self.rows.check_unchanged(meta)
            except StaleRows:  # drafted from rows that changed under it: nothing of this step is kept
                self.engine.discard_step([s.req_id for s in step.seqs])
                self.stale_rows += 1
                raise
            return result

        return self._answer(step_bytes, draft)

    def open_rows(self, name: str, nonce_hex: str) -> bool:
        """Map a verifier's shared-memory region (``actors.shm_rows.ShmRegion.open``); False (logged) if it cannot:
        that verifier then sends this drafter its rows by the host path."""
        try:
            self.rows.open(name, nonce_hex)
            return True
        except Exception as e:
            logger.warning("drafter: cannot map shared-memory region %s (%s)", str(name)[:60], e)
            return False

    def close_rows(self, name: str) -> None:
        self.rows.close(name)

    def _answer(self, step_bytes: bytes, draft) -> bytes:
        """``draft(step)`` for the step in ``step_bytes``, packed; its failures as a ``FAILED`` result."""
        step_id = -1
        try:
            step = DraftStep.unpack(step_bytes)
            step_id = step.step_id
            result = draft(step)
        except BadStep as e:  # the sender's fault: the reason, no traceback
            self.failures += 1
            logger.warning("drafter refused a step: %s", e)
            result = DraftResult(step_id, DraftStatus.FAILED, np.zeros((0, 0), np.int32), error=str(e))
        except Exception as e:
            self.failures += 1
            logger.warning("drafter step failed: %s", e)
            result = DraftResult(step_id, DraftStatus.FAILED, np.zeros((0, 0), np.int32),
                                 error=traceback.format_exc(limit=3))
        self.steps += 1
        self.cold_sequences += result.cold_sequences
        self.full_sequences += len(result.full_seqs)
        self.branch_hits += result.branch_hits
        self.branch_lookups += result.branch_lookups
        self.compute_ms.append(result.compute_ms)
        result.drafter_id = self.drafter_id
        result.active_sequences = self.engine.num_active_sequences
        return result.pack()

    def branches(self, req_ids: list[str]) -> bytes:
        """Fold the last step and draft the next step's branches; the entries of ``req_ids`` (the caller's
        sequences). Asked by sequence, not "the last step's", because another verifier's step may have come in
        between (the engine then drafted this caller's branches before it, and keeps them by sequence)."""
        req_ids = req_id_list(req_ids)
        start = time.perf_counter()
        try:
            self.engine.after_step()
        except Exception:  # the next step drafts on demand
            logger.exception("drafter: precomputing the next step failed")
        ms = ms_since(start, self.engine.device)  # after_step may end with work queued and nothing read back
        table = self.engine.branch_table
        entries = {rid: table[rid] for rid in req_ids if rid in table}
        return BranchTable(entries, self.engine.num_active_sequences, ms).pack()

    def free(self, req_ids: list[str]) -> int:
        self.engine.free(req_id_list(req_ids))
        return self.engine.num_active_sequences

    def probe(self) -> tuple[int, int]:
        """A health check: one draft token through the head, with no slot of the draft KV cache taken
        (``DrafterEngine.probe``); returns the drafts' shape."""
        return self.engine.probe()

    def stats(self) -> dict[str, Any]:
        import ray

        return {
            "head": self.head_dir,
            "method": self.engine.spec.method.value,
            "drafter_id": self.drafter_id,
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else "",
            "pid": os.getpid(),
            "device": self.placement.device,
            "dtype": str(self.placement.dtype).removeprefix("torch."),
            "active_sequences": self.engine.num_active_sequences,
            "steps": self.steps,
            "failures": self.failures,
            "cold_sequences": self.cold_sequences,
            "full_sequences": self.full_sequences,
            "evicted_sequences": self.engine.evicted,  # slots reclaimed from idle sequences
            "max_sequences": self.engine.cache.max_slots,
            "async_drafting": self.engine.branch_config is not None,
            "branch_hits": self.branch_hits,
            "branch_lookups": self.branch_lookups,
            "prefix_hit_tokens": self.engine.prefix_hit_tokens,
            "prefix_miss_tokens": self.engine.prefix_miss_tokens,
            "prefix_cached_blocks": self.engine.prefix_store.num_cached if self.engine.prefix_store else 0,
            "prefix_evicted_blocks": self.engine.prefix_store.evicted if self.engine.prefix_store else 0,
            "shm_regions": len(self.rows.regions),
            "stale_rows": self.stale_rows,
        }

    def load_window(self) -> dict[str, float]:
        """Load since the last call: active sequences now and the mean draft compute per step (ms)."""
        window = list(self.compute_ms)
        self.compute_ms.clear()
        return {
            "active_sequences": float(self.engine.num_active_sequences),
            "draft_ms": sum(window) / len(window) if window else 0.0,
        }

    def ping(self) -> bool:
        return True


def _node_id() -> str:
    """This process's Ray node id ("" outside Ray): a verifier on the same node sends rows by shared memory."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:
        return ""


def drafter_actor_class(**options: Any):
    """``DrafterActor`` as a Ray actor class: one call at a time, in each caller's order."""
    import ray

    return ray.remote(DrafterActor).options(max_concurrency=1, **options)


def start_drafter_actor(
    settings: DrafterSettings,
    *,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float = 0,
    num_gpus: float = 0,
    resources: dict[str, float] | None = None,
):
    """A named ``DrafterActor`` with ``settings`` on its own resources; returns its handle once the head is loaded.
    A process of its own, as a pool's drafter: one torch thread unless ``settings.num_threads`` says otherwise.

    Keep the handle: a named actor is still reference-counted, and goes away with its last handle."""
    import ray

    if settings.num_threads is None:
        settings = replace(settings, num_threads=1)
    opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if name:
        opts.update(name=name, namespace=namespace, lifetime=None)
    if resources:
        opts["resources"] = resources
    handle = drafter_actor_class(**opts).remote(settings, name or "")
    ray.get(handle.ping.remote())
    return handle
