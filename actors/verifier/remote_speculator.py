"""``RemoteSpeculator``: the ``Speculator`` over drafter actors, one or a pool, with pipelined drafting.

Runs in vLLM's driver worker. Every drafter is a Ray actor (``actors.drafter.actor.DrafterActor``) called straight by
its handle: one call per step and drafter, no proxy in between. Which drafters are usable is ``Drafters``' business
(``actors.verifier.drafters``), which drafter holds which sequence ``Homes``' (``actors.verifier.homes``).

One step, for each home's share of it (``DraftStep.select``), a ``HomePlan``:

1. ``send``: the home's ``BranchTable`` for this step, the object ref kept from its last ``branches()`` call. Usually
   ready (the drafter drafted it while the verifier verified), so reading it costs no call; if the drafter is still
   drafting it, the step waits (``wait_ms``). Each sequence's real outcome is looked up in it
   (``BranchTable.lookup``): a *hit* has its drafts now. Then the sub-step goes to the home (``draft_step``; its
   hidden rows through the link's transport, ``actors.verifier.transport``: shared memory on one node, else the
   call's argument), and ``branches()`` for every sequence homed there (one vLLM did not schedule
   this step still has its branches when it is back). Neither is waited for here.
2. ``collect``: the misses' drafts are waited for only when enough of the step missed (``wait_for_misses``) or the
   drafter drafts no branches; otherwise the misses are short this step (``Short.CONTEXT``) and were sent as
   ``SeqRole.CONTEXT``, like prompt steps: their drafter drafts their next step from the context.

A drafter without branches (synchronous drafting) gets a step's prompt chunks in a call of their own, sent after
the call whose drafts are waited for and never waited for itself: it caches their rows while the verifier runs its
next step, so a prefill-heavy step costs what target-only's does. A prompt's last chunk is context too, and its
drafting starts at its first decode step, unless ``wait_for_prompt_drafts`` (then it is drafted and waited for, as
vLLM's colocated EAGLE drafts it: the same counters, the drafter's pass over the prompt on the critical path).

So a step whose sequences mostly hit never blocks on a drafter. A drafter whose call fails or times out, or whose
answer does not hold up (``check_drafts``, ``BranchTable.check``), is dropped (``Drafters.drop``): its sequences are
short this step (``Short.FAILED``) and move to another drafter at their next step.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from actors.messages import BranchTable, DraftResult, DraftStatus, DraftStep, SeqRole, check_drafts
from actors.verifier.drafters import DRAFT_TIMEOUT_S, DrafterLink, Drafters, Finder
from actors.verifier.homes import Homes
from actors.verifier.speculator import Drafts, Short
from actors.verifier.transport import StepRows, TransportConfig, Transports

logger = logging.getLogger(__name__)


@dataclass
class HomePlan:
    """One home's share of a step, from its branch table to its answer."""

    link: DrafterLink
    idx: list[int]  # its sequences: indices into the step's seqs, in the sub-step's order
    missed: list[int]  # indices into idx: sequences that missed their branch table
    waited: bool = False  # the misses' drafts are waited for this step
    ref: Any = None  # ObjectRef of the draft_step() call sent


@dataclass
class Ticket:
    """A step sent, until ``collect`` reads it."""

    req_ids: list[str]
    deadline: float  # time.perf_counter() past which nothing is waited for
    drafts: Drafts  # being filled
    plans: list[HomePlan] = field(default_factory=list)
    homes: int = 0  # homes the step went to


class RemoteSpeculator:
    def __init__(self, finder: Finder | None, timeout_s: float = DRAFT_TIMEOUT_S, new_group_size: int = 4,
                 wait_for_misses: float = 0.5, vocab_size: int | None = None, discover_period_s: float = 1.0,
                 hidden_transport: str = "auto", shm_slots: int = 4, shm_slot_mib: float = 16.0,
                 wait_for_prompt_drafts: bool = False) -> None:
        """``vocab_size``: the target's; drafts outside it make their drafter a failed one.

        ``hidden_transport``: how each step's hidden rows reach a drafter (``actors.verifier.transport``): ``auto``
        (shared memory with a drafter on this node, else the host path), ``host`` or ``shm``; ``shm_slots`` and
        ``shm_slot_mib``: each pair's region (a drafter's rows of a step past a slot go by the host path).

        ``wait_for_misses``: wait for drafts made on demand when more than this share of a step's drafted sequences
        missed their branch table. Waiting W ms for a step of T ms gains (MAL - 1) tokens per missed sequence; it
        pays while the missed share exceeds MAL * W / ((MAL - 1) * (T + W)): about 0.5 with MAL 2.3 and
        W / (T + W) 0.3, as measured here."""
        self.transports = Transports(TransportConfig(hidden_transport, shm_slots, shm_slot_mib))
        self.drafters = Drafters(finder, timeout_s, discover_period_s, self.transports)
        self.homes = Homes(new_group_size)
        self.wait_for_misses = wait_for_misses
        self.wait_for_prompt_drafts = wait_for_prompt_drafts
        self.vocab_size = vocab_size
        self.prefix_tokens = {"hit": 0, "miss": 0}  # as the drafters reported them (DraftResult.prefix_*_tokens)

    def ready(self) -> bool:
        return self.drafters.usable()

    def free(self, req_ids: Iterable[str]) -> None:
        for drafter_id, ids in self.homes.release(req_ids).items():
            link = self.drafters.links.get(drafter_id)
            if link is not None:
                link.actor.free.remote(ids)  # in order with this verifier's calls to it; nothing to wait for

    # --- one step ------------------------------------------------------------------------------------------------
    def send(self, step: DraftStep, hidden: torch.Tensor) -> Ticket:  # hidden: [num_tokens, fused_hidden_size]
        start = time.perf_counter()
        d = self.drafters
        d.deadline.step_started(start)
        req_ids = [s.req_id for s in step.seqs]
        moved = self.homes.place([r for r in req_ids if r not in self.homes.home], d.links, step, d.prefix_max_load)
        if moved:
            d.events.append((time.time(), "rehomed", moved))
        k = step.num_speculative_tokens
        drafts = Drafts(np.zeros((len(req_ids), k), np.int64),
                        {i: Short.NO_DRAFTER for i, rid in enumerate(req_ids) if rid not in self.homes.home})
        ticket = Ticket(req_ids, start + d.deadline.seconds(), drafts)
        rows_out = StepRows(hidden)  # leaves the device now, waited for when first read
        groups = self.homes.groups(req_ids)
        ticket.homes = len(groups)
        subs = []
        for drafter_id, idx in self._parts(step, groups):  # 1. branch tables and lookups
            link = d.links[drafter_id]
            t = time.perf_counter()
            try:
                table = self._table(link, ticket.deadline)
            except Exception as e:
                self._home_failed(ticket, link, idx, e)
                continue
            finally:
                drafts.timing.wait_ms += (time.perf_counter() - t) * 1e3
            sub, rows = step.select(idx)
            sub.hidden_dtype = rows_out.dtype
            if not link.drafts_branches and self.wait_for_prompt_drafts:  # a prompt's last chunk drafted, waited
                sub.seqs = [s if s.role is SeqRole.PREFILL else replace(s, role=SeqRole.DRAFT) for s in sub.seqs]
            found = table.lookup(sub)
            drafts.short.update({idx[j]: Short.CONTEXT for j in found.context})
            for j, ids in zip(found.hits, found.drafts, strict=True):
                drafts.ids[idx[j]] = ids
                drafts.hits.append(idx[j])
            drafts.lookups += found.lookups
            ticket.plans.append(HomePlan(link, idx, found.misses))
            subs.append((sub, rows))
        drafted = len(req_ids) - len(drafts.short)
        wait = sum(len(p.missed) for p in ticket.plans) > self.wait_for_misses * drafted
        homed = self.homes.on()
        for plan, (sub, rows) in zip(ticket.plans, subs, strict=True):  # 2. the sub-steps, and the next branches
            t = time.perf_counter()
            link = plan.link
            plan.waited = bool(plan.missed) and (wait or not link.drafts_branches)
            if plan.missed and not plan.waited:
                for j in plan.missed:
                    sub.seqs[j] = replace(sub.seqs[j], role=SeqRole.CONTEXT)
                    drafts.short[plan.idx[j]] = Short.CONTEXT
            plan.ref = link.rows.send(link.actor, sub.pack(), rows_out, rows)  # the home's rows: one host copy or two
            link.branches_ref = link.actor.branches.remote(homed[link.drafter_id]) if link.drafts_branches else None
            if not plan.waited:
                link.unchecked = plan.ref
            drafts.timing.ship_ms += (time.perf_counter() - t) * 1e3
        return ticket

    def _parts(self, step: DraftStep, groups: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
        """Each home's sequences (indices into ``step.seqs``), a home without branches split in two: the ones
        drafted and waited for, then its prompt chunks (context). Worked example: roles [DRAFT, PREFILL, CONTEXT,
        DRAFT] on one such home -> [(home, [0, 3]), (home, [1, 2])]; with ``wait_for_prompt_drafts``, CONTEXT goes
        with the drafted ones: [(home, [0, 2, 3]), (home, [1])]."""
        waited = (SeqRole.DRAFT, SeqRole.CONTEXT) if self.wait_for_prompt_drafts else (SeqRole.DRAFT,)
        parts = []
        for drafter_id, idx in groups:
            link = self.drafters.links[drafter_id]
            if link.drafts_branches:
                parts.append((drafter_id, idx))
                continue
            drafted = [i for i in idx if step.seqs[i].role in waited]
            context = [i for i in idx if step.seqs[i].role not in waited]
            parts += [(drafter_id, p) for p in (drafted, context) if p]
        return parts

    def collect(self, ticket: Ticket) -> Drafts:
        """3. The answers waited for, within the step's deadline (counted from ``send``)."""
        import ray

        drafts = ticket.drafts
        for plan in (p for p in ticket.plans if p.waited):
            drafts.timing.all_hits = False
            t = time.perf_counter()
            try:
                r = DraftResult.unpack(ray.get(plan.ref, timeout=max(0.0, ticket.deadline - time.perf_counter())))
                if r.status is not DraftStatus.OK:
                    raise RuntimeError(r.error or "drafter failed")
                check_drafts(r.draft_token_ids, len(plan.idx), drafts.k, self.vocab_size)
            except Exception as e:
                self._home_failed(ticket, plan.link, plan.idx, e, waited=plan.ref)
                continue
            finally:
                drafts.timing.wait_ms += (time.perf_counter() - t) * 1e3
            drafts.ids[plan.idx] = r.draft_token_ids
            drafts.short.update({plan.idx[j]: Short.FULL for j in r.full_seqs})
            self._count_prefix(r)
            plan.link.report(r.active_sequences)
            drafts.timing.compute_ms = max(drafts.timing.compute_ms, r.compute_ms)
        drafts.timing.wait_ms = max(0.0, drafts.timing.wait_ms - drafts.timing.compute_ms)
        for i in drafts.short:
            drafts.ids[i] = 0
        drafts.hits.sort()
        return drafts

    def _table(self, link: DrafterLink, deadline: float) -> BranchTable:
        """The branch table the drafter drafted for this step (waited for if still being drafted); an empty one when
        none was asked for."""
        import ray

        self._read_unchecked(link)
        if link.branches_ref is None:
            return BranchTable({})
        ref, link.branches_ref = link.branches_ref, None
        table = BranchTable.unpack(ray.get(ref, timeout=max(0.0, deadline - time.perf_counter())))
        table.check(self.vocab_size)
        link.report(table.active_sequences)
        self._read_unchecked(link)  # answered before branches() was: ready now (its prefix counts)
        return table

    def _read_unchecked(self, link: DrafterLink) -> None:
        """The last step's answer that nobody waited for, if it is there (a failure raises)."""
        import ray

        if link.unchecked is None or not ray.wait([link.unchecked], timeout=0)[0]:
            return
        result = DraftResult.unpack(ray.get(link.unchecked))
        link.unchecked = None
        if result.status is not DraftStatus.OK:
            raise RuntimeError(result.error or "drafter failed")
        self._count_prefix(result)

    def _count_prefix(self, result: DraftResult) -> None:
        self.prefix_tokens["hit"] += result.prefix_hit_tokens
        self.prefix_tokens["miss"] += result.prefix_miss_tokens

    def _home_failed(self, ticket: Ticket, link: DrafterLink, idx: list[int], error: Exception,
                     waited: Any = None) -> None:
        """A home failed this step (its table, its call, its answer): its sequences are short, it is dropped."""
        ticket.drafts.errors.append(f"{len(idx)} sequences: {type(error).__name__}: {str(error)[:200]}")
        ticket.drafts.short.update(dict.fromkeys(idx, Short.FAILED))
        self.drafters.drop(link, self.homes.lose(link.drafter_id), str(error)[:200], waited=waited)

    def stats(self) -> dict[str, Any]:
        d, h = self.drafters, self.homes
        return {"rehomed": h.rehomed, "homes": dict(Counter(h.home.values())), "events": list(d.events),
                "drafters": len(d.links), "quarantined": len(d.quarantine.held), "deadline_s": d.deadline.seconds(),
                "prefix_hit_tokens": self.prefix_tokens["hit"], "prefix_miss_tokens": self.prefix_tokens["miss"],
                "prefix_homed": h.prefix_homed, "rehomed_ids": list(h.rehomed_ids),
                "transport": self.transports.stats.as_dict()}

    def close(self) -> None:
        """The verifier goes away: the drafters' shared-memory regions unlinked (also done at exit)."""
        self.drafters.close()


SPECULATOR_KEYS = frozenset({"timeout_s", "new_group_size", "wait_for_misses", "vocab_size", "discover_period_s",
                             "hidden_transport", "shm_slots", "shm_slot_mib", "wait_for_prompt_drafts"})


def build_speculator(spec: dict[str, Any]) -> RemoteSpeculator:
    """A speculator from vLLM's ``additional_config["eagle_cluster"]["draft_client"]``: ``RemoteSpeculator``'s
    settings (``SPECULATOR_KEYS``), ``start_wait_s`` (its first discovery is waited for this long), and the finder's
    (``{"finder": "module:Class", **its kwargs}``, ``actors.verifier.drafters.build_finder``; default: one named
    actor, ``{"actor": name, "namespace": ns}``)."""
    from actors.verifier.drafters import START_WAIT_S, build_finder

    spec = dict(spec)
    start_wait_s = spec.pop("start_wait_s", START_WAIT_S)
    settings = {k: spec.pop(k) for k in SPECULATOR_KEYS & set(spec)}
    speculator = RemoteSpeculator(build_finder(spec), **settings)  # what is left of spec is the finder's
    speculator.drafters.start(start_wait_s)
    return speculator
