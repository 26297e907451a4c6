"""The drafter as a plain Ray actor: a ``DrafterEngine`` behind msgpack-in, msgpack-out methods.

``propose(step_bytes, hidden)``: ``hidden`` arrives resolved from its ``ObjectRef`` (a numpy array read from
the object store). Errors are caught and returned as a ``FAILED`` result, so the verifier can carry on
without drafts; they are also counted for ``health``.

With asynchronous drafting (``branches``), ``propose`` answers and returns at once, and the engine's
``after_step`` (fold the real hidden states, draft the next step's branches) runs on the actor's engine thread
while the verifier verifies. Every engine call goes through that one thread, in order, so the next
``propose`` (or ``free``) starts after it.
"""

from __future__ import annotations

import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from actors.drafter.branches import BranchConfig
from actors.drafter.engine import DrafterEngine
from actors.eagle.compat import check_head_fits_target, target_text_config
from actors.eagle.spec import load_head_spec
from actors.messages import DraftResult, DraftStatus, DraftStep, SeqSlice

logger = logging.getLogger(__name__)


class DrafterActor:
    def __init__(self, head_dir: str, target_dir: str | None = None, max_model_len: int = 4096,
                 num_threads: int | None = None, drafter_id: str = "",
                 branches: BranchConfig | dict[str, int] | None = None) -> None:
        if num_threads:
            import torch

            torch.set_num_threads(num_threads)
        if target_dir is not None:
            check_head_fits_target(load_head_spec(head_dir), target_text_config(target_dir))
        if isinstance(branches, dict):
            branches = BranchConfig(**branches)
        self.engine = DrafterEngine.from_checkpoint(head_dir, target_dir, max_model_len=max_model_len,
                                                    branches=branches)
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-engine")
        self.head_dir = head_dir
        self.drafter_id = drafter_id  # answered with every result, so a pool's router can send sequences back
        self.steps = 0
        self.failures = 0
        self.cold_sequences = 0
        self.branch_hits = 0
        self.branch_lookups = 0
        self.compute_ms: list[float] = []  # per step, since the last load_window() read
        self.started = time.time()

    def _on_engine_thread(self, fn, *args):
        return self._engine_thread.submit(fn, *args).result()

    def _after_step(self) -> None:
        try:
            self.engine.after_step()
        except Exception:  # the next step drafts on demand
            logger.exception("drafter: precomputing the next step failed")

    def propose(self, step_bytes: bytes, hidden: np.ndarray) -> bytes:
        step = DraftStep.unpack(step_bytes)
        try:
            result = self._on_engine_thread(self.engine.propose, step, hidden)
            if self.engine.has_pending_work:
                self._engine_thread.submit(self._after_step)  # runs while the verifier verifies
        except Exception as e:
            self.failures += 1
            logger.warning("drafter step %d failed: %s", step.step_id, e)
            result = DraftResult(
                step.step_id, DraftStatus.FAILED, np.zeros((0, 0), np.int32), error=traceback.format_exc(limit=3)
            )
        self.steps += 1
        self.cold_sequences += result.cold_sequences
        self.branch_hits += result.branch_hits
        self.branch_lookups += result.branch_lookups
        self.compute_ms.append(result.compute_ms)
        result.drafter_id = self.drafter_id
        return result.pack()

    def free(self, req_ids: list[str]) -> int:
        self._on_engine_thread(self.engine.free, req_ids)
        return self.engine.num_active_sequences

    def probe(self) -> tuple[int, int]:
        """Draft one token for a throwaway sequence (a health check); returns the drafts' shape."""
        spec = self.engine.spec
        step = DraftStep(-1, 1, [SeqSlice("__health__", 0, 1, 0)], np.zeros(1, np.int32))
        hidden = np.zeros((1, spec.fused_hidden_size), np.float32)

        def run() -> tuple[int, int]:
            drafts = self.engine.propose(step, hidden, precompute=False).draft_token_ids
            self.engine.free(["__health__"])
            return drafts.shape

        return self._on_engine_thread(run)

    def stats(self) -> dict[str, Any]:
        return {
            "head": self.head_dir,
            "method": self.engine.spec.method.value,
            "drafter_id": self.drafter_id,
            "active_sequences": self.engine.num_active_sequences,
            "steps": self.steps,
            "failures": self.failures,
            "cold_sequences": self.cold_sequences,
            "async_drafting": self.engine.branch_config is not None,
            "branch_hits": self.branch_hits,
            "branch_lookups": self.branch_lookups,
        }

    def load_window(self) -> dict[str, float]:
        """Load since the last call: active sequences now and the mean draft compute per step (ms)."""
        window, self.compute_ms = self.compute_ms, []
        return {
            "active_sequences": float(self.engine.num_active_sequences),
            "draft_ms": sum(window) / len(window) if window else 0.0,
        }

    def ping(self) -> bool:
        return True


def start_drafter_actor(
    head_dir: str,
    target_dir: str | None,
    *,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float = 0,
    num_gpus: float = 0,
    resources: dict[str, float] | None = None,
    max_model_len: int = 4096,
    num_threads: int | None = 1,
    branches: dict[str, int] | None = None,
):
    """A named ``DrafterActor`` on its own resources; returns its handle once the head is loaded.

    Keep the handle: a named actor is still reference-counted, and goes away with its last handle."""
    import ray

    opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 1}
    if name:
        opts.update(name=name, namespace=namespace, lifetime=None)
    if resources:
        opts["resources"] = resources
    handle = ray.remote(DrafterActor).options(**opts).remote(
        head_dir, target_dir, max_model_len, num_threads, branches=branches
    )
    ray.get(handle.ping.remote())
    return handle
