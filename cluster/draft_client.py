"""``ServeDraftClient``: the verifier's ``DraftClient`` over the drafter deployment, a pool of Serve replicas.

Runs inside vLLM's engine process (named by import path in ``additional_config``, so ``actors/`` never imports
Serve). One verification step:

1. group the step's sequences by home replica (``home``, learnt from earlier answers); sequences with no home
   go in groups of at most ``new_group_size``, so that a burst of new sequences spreads over the pool;
2. per group: ``DraftStep.select`` the sub-step, ``ray.put`` its hidden rows once, and call the replica with the
   ``ObjectRef`` and a routing key (``cluster.drafter_router``); all groups go out before any answer is awaited;
3. gather the answers into one ``[B, k]`` draft array in the step's order. A group whose drafter failed or died
   gets placeholder drafts (vLLM rejects them) and loses its home, so it is re-homed next step.

Finished sequences are freed on their home: with the next sub-step sent there, or at once through ``free``
when the engine goes idle (the verifier's worker calls it with the scheduler's finished requests).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict, deque
from typing import Any

import numpy as np
import ray
import torch

from actors.messages import DraftResult, DraftStatus, DraftStep
from actors.verifier.client import ProposeTiming, hidden_to_numpy
from cluster.drafter_router import route_key

logger = logging.getLogger(__name__)


def plan_groups(
    req_ids: list[str], home: dict[str, str], new_group_size: int
) -> list[tuple[str | None, list[int]]]:
    """[(home or None, sequence indices)]: one group per home, then the homeless in groups of new_group_size.

    Worked example: req_ids [a, b, c, d, e], home {a: R1, c: R2, d: R1}, new_group_size 1
    -> [(R1, [0, 3]), (R2, [2]), (None, [1]), (None, [4])]."""
    by_home: dict[str, list[int]] = defaultdict(list)
    homeless: list[int] = []
    for i, rid in enumerate(req_ids):
        h = home.get(rid)
        if h is None:
            homeless.append(i)
        else:
            by_home[h].append(i)
    groups: list[tuple[str | None, list[int]]] = list(by_home.items())
    groups += [(None, homeless[i : i + new_group_size]) for i in range(0, len(homeless), new_group_size)]
    return groups


class ServeDraftClient:
    def __init__(
        self, app_name: str, deployment_name: str, timeout_s: float = 10.0, new_group_size: int = 4
    ) -> None:
        from ray import serve

        self.handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        self.timeout_s = timeout_s
        self.new_group_size = new_group_size
        self.home: dict[str, str] = {}  # req_id -> drafter replica id
        self.to_free: dict[str, list[str]] = defaultdict(list)  # replica id -> finished req_ids not yet sent
        self.lost: dict[str, str] = {}  # req_id -> the home it lost (its drafter failed), until re-homed
        self.rehomed = 0  # sequences that moved to another replica (their home died or was drained)
        self.events: deque[tuple[float, str, int]] = deque(maxlen=1000)  # (time.time(), "failed"|"rehomed", seqs)

    def stats(self) -> dict[str, Any]:
        return {"rehomed": self.rehomed, "homes": dict(Counter(self.home.values())), "events": list(self.events)}

    def _finish(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            self.lost.pop(rid, None)
            h = self.home.pop(rid, None)
            if h is not None:
                self.to_free[h].append(rid)

    def _send_frees(self) -> list[Any]:
        calls = [self.handle.options(session_id=route_key(h, 0)).free.remote(ids) for h, ids in self.to_free.items()]
        self.to_free.clear()
        return calls

    @staticmethod
    def _await_frees(calls: list[Any], timeout_s: float) -> None:
        for call in calls:
            try:
                call.result(timeout_s=timeout_s)
            except Exception as e:  # a dead home took its sequences' state with it
                logger.info("free on a drafter failed (%s)", e)

    def free(self, req_ids: list[str]) -> None:
        """Free finished sequences on their homes now (the engine is idle, no step will carry them)."""
        self._finish(req_ids)
        self._await_frees(self._send_frees(), self.timeout_s)

    def propose(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftResult, ProposeTiming]:
        start = time.perf_counter()
        deadline = start + self.timeout_s
        self._finish(step.finished)
        req_ids = [s.req_id for s in step.seqs]
        ship_ms = 0.0
        calls: list[tuple[list[int], Any]] = []
        for home, idx in plan_groups(req_ids, self.home, self.new_group_size):
            sub, rows = step.select(idx)
            if home is not None:
                sub.finished = self.to_free.pop(home, [])
            t = time.perf_counter()
            array, sub.hidden_dtype = hidden_to_numpy(hidden[torch.from_numpy(rows).to(hidden.device)])
            ref = ray.put(array)
            ship_ms += (time.perf_counter() - t) * 1e3
            handle = self.handle.options(session_id=route_key(home, len(idx)))
            calls.append((idx, handle.propose.remote(sub.pack(), ref)))
        frees = self._send_frees()  # homes with finished sequences but nothing to draft this step

        drafts = np.zeros((len(req_ids), step.num_speculative_tokens), np.int32)
        compute_ms, errors, lookups, hit_rows = 0.0, [], 0, []
        for idx, call in calls:
            try:
                r = DraftResult.unpack(call.result(timeout_s=max(0.0, deadline - time.perf_counter())))
                if r.status is not DraftStatus.OK:
                    raise RuntimeError(r.error or "drafter failed")
            except Exception as e:  # placeholders for these sequences; re-homed next step
                errors.append(f"{len(idx)} sequences: {type(e).__name__}: {str(e)[:200]}")
                self.events.append((time.time(), "failed", len(idx)))
                for i in idx:
                    lost = self.home.pop(req_ids[i], None)
                    if lost is not None:
                        self.lost[req_ids[i]] = lost
                continue
            drafts[idx] = r.draft_token_ids
            compute_ms = max(compute_ms, r.compute_ms)
            lookups += r.branch_lookups
            hit_rows += [idx[i] for i in r.hit_rows]
            moved = 0
            for i in idx:
                before = self.home.get(req_ids[i]) or self.lost.pop(req_ids[i], None)
                moved += before is not None and before != r.drafter_id
                self.home[req_ids[i]] = r.drafter_id
            if moved:
                self.rehomed += moved
                self.events.append((time.time(), "rehomed", moved))
        self._await_frees(frees, max(0.0, deadline - time.perf_counter()))
        total_ms = (time.perf_counter() - start) * 1e3
        status = DraftStatus.OK
        if errors:
            status = DraftStatus.PARTIAL if len(errors) < len(calls) else DraftStatus.FAILED
        result = DraftResult(step.step_id, status, drafts, compute_ms, "; ".join(errors), branch_lookups=lookups,
                             hit_rows=sorted(hit_rows))
        return result, ProposeTiming(ship_ms, total_ms - ship_ms - compute_ms, compute_ms)
