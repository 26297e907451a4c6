"""How the verifier reaches its drafters: ``DraftClient``, pipelined over one or more drafter actors.

Runs in vLLM's driver worker (``actors.verifier.proposer`` calls it once per step). Every drafter is a Ray actor
(``actors.drafter.actor.DrafterActor``) called straight by its handle: one call per step and drafter, no proxy
in between. A sequence lives on one drafter, its *home*, which holds its draft KV cache.

One step, for each home's share of the batch (``DraftStep.select``):

1. the home's ``BranchTable`` for this step: the object ref the client kept from the home's last ``branches()``
   call. Usually it is ready (the drafter drafted it while the verifier verified): reading it costs no call.
   If the drafter is still drafting it, the client waits for it (``wait_ms``: time the verifier waited);
2. each sequence's real outcome is looked up in it locally (``BranchTable.lookup``); a *hit* has its drafts;
3. the sub-step goes to the home (``draft_step``, the hidden rows as the call's argument: Ray inlines small arrays
   and passes large ones through the object store), then ``branches()`` for every sequence homed there (one that
   vLLM did not schedule this step still has its branches when it is back); neither is waited for, unless enough
   of the step missed (``wait_for_misses``): then the client waits for ``draft_step``'s drafts of the misses.
   Otherwise the misses get no drafts this step (undrafted, below) and are sent as
   ``SeqRole.CONTEXT``, like prompt steps: their drafter drafts their next step from the context.

So a step whose sequences all (or mostly) hit never blocks on a drafter: the drafter folds the real hidden
states in and drafts the next branches while the verifier verifies. A drafter whose call fails or times out, or
whose answer does not hold up (``check_drafts``, ``check_table``: integer token ids of the target's vocabulary, in
the shape asked for; vLLM would index its logits with them), is dropped: its sequences get no drafts for
the step (the output does not change) and move to another drafter at the next step
(*re-homed*; their new drafter masks the context it never saw).

A sequence the client has no drafts for this step (no usable drafter, its home failed, a prompt step or a miss not
waited for, a drafter with no room) is *undrafted* (``DraftReply.undrafted``, with the reason): the proposer proposes
no draft tokens for it, so vLLM schedules and verifies none (``actors.verifier.proposer``), rather than placeholders
it would verify and reject. With no usable drafter at all (``usable()`` false) the proposer does not call
``draft_batch``: every sequence is undrafted and the verifier runs at target-only speed.

Prefix-aware homing: a new sequence whose first step carries its prompt (``DraftStep.prompts``, prefix caching)
goes to the drafter this client last sent the longest prefix of that prompt to, block for block by the drafters' own
block hashes (``actors.drafter.prefix_cache``), unless that drafter holds more than ``prefix_max_load`` sequences
(the pool's target per replica): then, as every other new sequence, to the least-loaded one. So two drafters keep
each system prompt's blocks once, not twice. The client's index of who holds what is a bounded guess (a drafter may
have evicted blocks since, which it counts as prefix misses); dropped drafters are never chosen from it.

Where drafters come from is the subclass's business (``_find``), and it happens in the background only: a
one-thread executor runs ``_find`` (which may block: a Serve call, a hung replica) every ``discover_period_s``,
and each step only picks up what it found (``_discover``, never blocking). ``ActorDraftClient`` has one named
actor; ``cluster.drafter_pool.client.ServeDraftClient`` finds the drafter replicas of a Ray Serve deployment. A
client is named by an import path in vLLM's ``additional_config`` (``build_client``), so this package never
imports Serve.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections import Counter, OrderedDict, defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from actors.drafter.prefix_cache import block_hashes
from actors.messages import BranchTable, DraftResult, DraftStatus, DraftStep, SeqRole
from actors.verifier.drafter_health import Quarantine, StepDeadline
from actors.wire import encode_hidden

logger = logging.getLogger(__name__)
DRAFT_TIMEOUT_S = 10.0  # a draft call slower than this drafts nothing (its drafter is dropped), unless configured
DISCOVER_PERIOD_S = 1.0  # background discovery asks for drafters this often (at once again after finding a new one)
PREFIX_INDEX_BLOCKS = 65536  # block hashes the client remembers a home for (the latest)
START_WAIT_S = 2.0  # the client's constructor waits this long for its first discovery (engine start, not a step)


class Undrafted:
    """Why a sequence gets no draft tokens this step (``DraftReply.undrafted``; the proposer counts them)."""

    NO_DRAFTER = "no_drafter"  # no usable drafter to home it on
    FAILED = "failed"  # its home failed, timed out or answered badly this step
    CONTEXT = "context"  # a prompt step, or a miss not waited for: its drafter drafts its next step from it
    FULL = "full"  # its drafter had no room for it


@dataclass
class BatchTiming:
    ship_ms: float  # tensor to numpy, packing, sending the calls
    wait_ms: float  # blocked on drafters: branch tables not yet ready, and answers to misses
    compute_ms: float  # inside the drafter engines, for the answers waited for
    all_hits: bool  # no answer was waited for: every drafted sequence was a hit (or a prompt step)


@dataclass
class DraftReply:
    """A step's drafts, gathered from the homes, in the step's sequence order."""

    status: DraftStatus
    draft_token_ids: np.ndarray  # [B, k] int32
    error: str = ""
    branch_lookups: int = 0  # sequences that had a branch table entry for this step
    hit_seqs: list[int] = field(default_factory=list)  # sequences (indices) answered from their branch table
    # sequence (index into the step's seqs) -> why it has no drafts this step (``Undrafted``): the proposer
    # proposes none for it
    undrafted: dict[int, str] = field(default_factory=dict)


@dataclass
class DrafterLink:
    """One drafter actor as this client sees it."""

    drafter_id: str
    actor: Any  # Ray actor handle of a DrafterActor
    drafts_branches: bool  # asynchronous drafting on: it answers branches()
    load: int = 0  # active sequences it last reported (all verifiers)
    placed: int = 0  # sequences this client placed on it since that report
    branches_ref: Any = None  # ObjectRef of the BranchTable being drafted for the next step
    unchecked: Any = None  # ObjectRef of the last draft_step() nobody waited for

    def report(self, active_sequences: int) -> None:
        self.load, self.placed = active_sequences, 0


@dataclass
class HomePlan:
    """One home's share of a step, from its branch table to its answer (``DraftClient.draft_batch``'s stages)."""

    link: DrafterLink
    idx: list[int]  # its sequences: indices into the step's seqs, in the sub-step's order
    sub: DraftStep  # their sub-step (``DraftStep.select``), as sent
    rows: np.ndarray  # [M] the step's token rows the sub-step covers (its hidden rows)
    missed: list[int]  # indices into ``sub.seqs``: sequences that missed their branch table
    waited: bool = False  # the misses' drafts are waited for this step (``_send``)
    ref: Any = None  # ObjectRef of the draft_step() call sent


@dataclass
class StepInFlight:
    """One step in flight through ``DraftClient.draft_batch``'s stages: the reply being filled and the time spent."""

    step: DraftStep
    req_ids: list[str]
    deadline: float  # time.perf_counter() past which nothing is waited for
    array: np.ndarray  # the step's hidden rows, as they travel (``encode_hidden``)
    dtype: str  # their ``hidden_dtype``
    reply: DraftReply
    errors: list[str] = field(default_factory=list)  # one per failed home
    plans: list[HomePlan] = field(default_factory=list)  # each home's share, once its table was read
    homes: int = 0
    waited_homes: int = 0  # homes whose answer was waited for
    drafted: int = 0  # sequences whose drafts the verifier proposes (not prompt steps)
    wait_ms: float = 0.0
    ship_ms: float = 0.0
    compute_ms: float = 0.0


class BadDrafts(ValueError):
    """A drafter's answer that the verifier must not use: the drafter is treated as failed."""


def check_drafts(drafts: Any, rows: int, k: int, vocab_size: int | None) -> np.ndarray:
    """A drafter's ``[rows, k]`` draft token ids, checked: an integer array of that shape, every id in
    ``[0, vocab_size)`` (``vocab_size`` None: only ``>= 0``). Else ``BadDrafts`` saying what is wrong."""
    if not isinstance(drafts, np.ndarray) or not np.issubdtype(drafts.dtype, np.integer):
        raise BadDrafts(f"drafts are {type(drafts).__name__} of {getattr(drafts, 'dtype', '?')}, not integer ids")
    if drafts.shape != (rows, k):
        raise BadDrafts(f"drafts of shape {list(drafts.shape)} for [{rows}, {k}]")
    if drafts.size and (int(drafts.min()) < 0 or (vocab_size is not None and int(drafts.max()) >= vocab_size)):
        raise BadDrafts(f"draft token ids in [{int(drafts.min())}, {int(drafts.max())}], outside the target's "
                        f"vocabulary [0, {vocab_size})")
    return drafts


def check_table(table: BranchTable, vocab_size: int | None) -> BranchTable:
    """A drafter's branch table, checked as ``check_drafts`` checks drafts: every branch's ids in the vocabulary
    (a branch shorter or longer than a step's k is only a miss, ``BranchTable.lookup``)."""
    for rid, entry in table.entries.items():
        for (a, y), drafts in entry.drafts.items():
            if a < 0 or not drafts:
                raise BadDrafts(f"branch table for {rid!r}: branch {(a, y)} with {len(drafts)} drafts")
            check_drafts(np.asarray([drafts], np.int64), 1, len(drafts), vocab_size)
    return table


def plan_groups(req_ids: list[str], home: dict[str, str]) -> list[tuple[str, list[int]]]:
    """[(home, sequence indices)], one group per home, in order of first appearance; sequences without a home
    are left out (they get no drafts).

    Worked example: req_ids [a, b, c, d], home {a: R1, c: R2, d: R1} -> [(R1, [0, 3]), (R2, [2])]."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, rid in enumerate(req_ids):
        if rid in home:
            groups[home[rid]].append(i)
    return list(groups.items())


class DraftClient:
    """The pipelined client over a set of drafter links (see the module docstring). Subclasses find drafters
    (``_find``, in the background)."""

    def __init__(self, timeout_s: float = DRAFT_TIMEOUT_S, new_group_size: int = 4, wait_for_misses: float = 0.5,
                 vocab_size: int | None = None, discover_period_s: float = DISCOVER_PERIOD_S,
                 prefix_max_load: float = 16) -> None:
        """``vocab_size``: the target's; drafts outside it make their drafter a failed one.

        ``wait_for_misses``: wait for drafts made on demand when more than this share of a step's sequences
        missed their branch table (else those get no drafts this step). Waiting W ms for a step of
        T ms gains (MAL - 1) tokens per missed sequence; it pays while the missed share exceeds
        MAL * W / ((MAL - 1) * (T + W)): about 0.5 with MAL 2.3 and W / (T + W) 0.3, as measured here."""
        self.deadline = StepDeadline(timeout_s)  # how long a step waits for a drafter
        self.quarantine = Quarantine()  # dropped drafters, out of use until their health probe answers
        self.new_group_size = new_group_size  # new sequences placed together on one drafter
        self.wait_for_misses = wait_for_misses
        self.vocab_size = vocab_size
        self.links: dict[str, DrafterLink] = {}
        self.home: dict[str, str] = {}  # req_id -> drafter id
        self.lost: dict[str, str] = {}  # req_id -> the home it lost (its drafter failed), until re-homed
        self.to_free: dict[str, list[str]] = defaultdict(list)  # drafter id -> finished req_ids not yet sent
        self.rehomed = 0  # sequences that moved to another drafter (their home died or was drained)
        self.events: deque[tuple[float, str, int]] = deque(maxlen=1000)  # (time.time(), kind, sequences)
        # kind: "failed" (a drafter dropped), "rehomed", "readmitted" (a dropped drafter healthy again),
        # "attached" (a drafter found by discovery)
        self.discover_period_s = discover_period_s
        self.prefix_max_load = prefix_max_load  # prefix-aware homing: not onto a drafter holding more than this
        self.prefix_index: OrderedDict[bytes, str] = OrderedDict()  # block hash -> drafter last sent it, oldest first
        self.prefix_tokens = {"hit": 0, "miss": 0}  # as the drafters reported them (DraftResult.prefix_*_tokens)
        self.prefix_homed = 0  # new sequences homed by their prompt's prefix
        self._finder: ThreadPoolExecutor | None = None  # created at the first discovery
        self._finding: Future | None = None  # the background discovery in flight
        self._next_discovery = 0.0  # time.monotonic() of the next one

    @property
    def timeout_s(self) -> float:
        """The longest a step waits for a drafter (the pool's ``timeout_s``); usually it waits less
        (``StepDeadline``)."""
        return self.deadline.max_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.deadline.max_s = value

    # --- drafters ------------------------------------------------------------------------------------
    def _find(self) -> list[tuple[str, Any, dict[str, Any]]]:
        """Drafters to add: ``[(drafter id, actor handle, info)]``. Runs in the background thread and may block
        (a Serve call, a hung replica); raising means none found this time."""
        raise NotImplementedError

    def _known(self, drafter_id: str) -> bool:
        """In use or held out (a dropped drafter stays out until its health probe answers, ``Quarantine``)."""
        return drafter_id in self.links or drafter_id in self.quarantine

    def _discover(self) -> None:
        """Never blocks: adds what the background discovery found, and starts the next one when it is due."""
        now = time.monotonic()
        if self._finding is not None and self._finding.done():
            done, self._finding = self._finding, None
            try:
                found = done.result()
            except Exception as e:
                logger.info("finding drafters failed (%s)", e)
                found = []
            if any([self._learn(*f) for f in found]):
                self._next_discovery = now  # there may be more: ask again at once
        if self._finding is None and now >= self._next_discovery:
            self._next_discovery = now + self.discover_period_s
            if self._finder is None:
                self._finder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-discovery")
            self._finding = self._finder.submit(self._find)

    def start(self, wait_s: float = START_WAIT_S) -> None:
        """At the engine's start (not on a step's path; subclasses' constructors call it): the first discovery,
        waited for up to ``wait_s`` (so a pool that is up drafts from the first request); one that takes longer
        goes on in the background."""
        self._discover()
        if self._finding is not None:
            wait_futures([self._finding], timeout=wait_s)
            self._discover()

    def _learn(self, drafter_id: str, actor: Any, info: dict[str, Any]) -> bool:
        """Add a drafter; True if it was new. One the client dropped stays out until its health probe answers
        (``Quarantine``), whatever discovery says."""
        new = not self._known(drafter_id)
        self._add_link(drafter_id, actor, info)
        if "timeout_s" in info:  # the pool's setting, redeployed with it
            self.timeout_s = float(info["timeout_s"])
        if new:
            self.events.append((time.time(), "attached", 0))
            logger.info("drafter %s attached", drafter_id)
        return new

    def usable(self) -> bool:
        """Whether some drafter can draft this step. Never blocks: readmits drafters whose health probe answered,
        adds what the background discovery found (and starts the next one)."""
        for drafter_id, q in self.quarantine.recovered():  # healthy again: back in use for new sequences
            self._add_link(drafter_id, q.actor, {"drafts_branches": q.drafts_branches})
            self.events.append((time.time(), "readmitted", 0))
        self._discover()
        return bool(self.links)

    def _add_link(self, drafter_id: str, actor: Any, info: dict[str, Any]) -> None:
        if drafter_id not in self.links and drafter_id not in self.quarantine:
            self.links[drafter_id] = DrafterLink(drafter_id, actor, bool(info.get("drafts_branches")),
                                                 int(info.get("active_sequences", 0)))

    def _drop(self, link: DrafterLink, req_ids: list[str], error: str, waited: Any = None) -> None:
        """A drafter failed: forget it; its sequences lose their home and are re-homed at their next step.

        A drafter that timed out or answered badly may still be alive: its calls still queued are cancelled
        (``waited``: the one this step gave up on), and it is not used again until it answers a health probe
        (``Quarantine``). It may hold the lost sequences' draft KV slots (which count as its load for the router
        and the autoscaler): it is sent ``free`` for them, and for the finished sequences not yet freed there,
        without waiting (``_free_on_lost_home``)."""
        import ray

        self.links.pop(link.drafter_id, None)
        for ref in (waited, link.branches_ref, link.unchecked):
            if ref is not None:
                try:
                    ray.cancel(ref)  # a queued call never runs; a running one finishes unread
                except Exception:
                    pass
        link.branches_ref = link.unchecked = None
        self.quarantine.hold(link.drafter_id, link.actor, link.drafts_branches)
        unsent = self.to_free.pop(link.drafter_id, [])
        lost = [rid for rid, h in self.home.items() if h == link.drafter_id]
        for rid in lost:
            self.lost[rid] = self.home.pop(rid)
        self._free_on_lost_home(link, unsent + lost)
        self.events.append((time.time(), "failed", len(set(lost) | set(req_ids))))
        logger.warning("drafter %s failed (%s); %d sequences will be re-homed", link.drafter_id, error, len(lost))

    @staticmethod
    def _free_on_lost_home(link: DrafterLink, req_ids: list[str]) -> None:
        """Fire and forget: ``free(req_ids)`` on a dropped drafter. Never waits, never raises (a dead actor's call
        just fails, and nobody reads it); a drafter that never gets it evicts the slots once idle
        (``DraftKVCache.evict_idle``)."""
        if not req_ids:
            return
        try:
            link.actor.free.remote(list(req_ids))
        except Exception as e:  # the actor handle is unusable: the drafter is gone, and its slots with it
            logger.info("freeing %d sequences on dropped drafter %s failed (%s)", len(req_ids), link.drafter_id, e)

    def _prefix_home(self, hashes: list[bytes]) -> DrafterLink | None:
        """The usable drafter last sent the longest prefix of these block hashes, if not loaded past
        ``prefix_max_load``."""
        best = None
        for h in hashes:
            link = self.links.get(self.prefix_index.get(h, ""))
            if link is None or (best is not None and link is not best):
                break
            best = link
        if best is None or best.load + best.placed >= self.prefix_max_load:
            return None
        return best

    def _remember_prefix(self, hashes: list[bytes], drafter_id: str) -> None:
        for h in hashes:
            self.prefix_index[h] = drafter_id
            self.prefix_index.move_to_end(h)
        while len(self.prefix_index) > PREFIX_INDEX_BLOCKS:
            self.prefix_index.popitem(last=False)

    def _place(self, req_ids: list[str], step: DraftStep | None = None) -> None:
        """Give sequences without a home one: by prefix (see the module docstring) when ``step`` carries their
        prompt, else the least-loaded drafter, ``new_group_size`` at a time."""
        if not req_ids or not self.links:
            return
        prompts = step.prompts if step is not None and step.block_size > 0 else {}
        unmatched: list[tuple[str, list[bytes]]] = []
        if prompts:
            rest = []
            for rid in req_ids:
                prompt = prompts.get(rid)
                hashes = block_hashes(prompt, step.block_size) if prompt is not None else []
                link = self._prefix_home(hashes) if hashes else None
                if link is None:
                    rest.append(rid)
                    unmatched.append((rid, hashes))
                    continue
                link.placed += 1
                self.home[rid] = link.drafter_id
                self.lost.pop(rid, None)
                self.prefix_homed += 1
                self._remember_prefix(hashes, link.drafter_id)
            req_ids = rest
        for i in range(0, len(req_ids), self.new_group_size):
            link = min(self.links.values(), key=lambda lk: lk.load + lk.placed)
            group = req_ids[i : i + self.new_group_size]
            link.placed += len(group)
            moved = 0
            for rid in group:
                self.home[rid] = link.drafter_id
                moved += self.lost.pop(rid, None) is not None
            if moved:
                self.rehomed += moved
                self.events.append((time.time(), "rehomed", moved))
        for rid, hashes in unmatched:  # their blocks will be on the drafter they went to
            if hashes and rid in self.home:
                self._remember_prefix(hashes, self.home[rid])

    def _table(self, link: DrafterLink, deadline: float) -> BranchTable:
        """The branch table the drafter drafted for this step (waits if it is still drafting it); an empty one
        when none was asked for."""
        import ray

        self._read_unchecked(link)
        if link.branches_ref is None:
            return BranchTable({})
        ref, link.branches_ref = link.branches_ref, None
        table = BranchTable.unpack(ray.get(ref, timeout=max(0.0, deadline - time.perf_counter())))
        check_table(table, self.vocab_size)
        link.report(table.active_sequences)
        self._read_unchecked(link)  # answered before branches() was: ready now (its prefix counts)
        return table

    def _read_unchecked(self, link: DrafterLink) -> None:
        """The last step's answer that nobody waited for, if it is there (a failure raises)."""
        import ray

        if link.unchecked is None:  # the last step's answer, not waited for: it ran before branches()
            return
        ready, _ = ray.wait([link.unchecked], timeout=0)
        if ready:
            result = DraftResult.unpack(ray.get(link.unchecked))
            link.unchecked = None
            if result.status is not DraftStatus.OK:
                raise RuntimeError(result.error or "drafter failed")
            self._count_prefix(result)

    def _count_prefix(self, result: DraftResult) -> None:
        self.prefix_tokens["hit"] += result.prefix_hit_tokens
        self.prefix_tokens["miss"] += result.prefix_miss_tokens

    # --- one step ------------------------------------------------------------------------------------
    def _finish(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            self.lost.pop(rid, None)
            h = self.home.pop(rid, None)
            if h is not None:
                self.to_free[h].append(rid)

    def _send_frees(self) -> None:
        for drafter_id, ids in self.to_free.items():
            link = self.links.get(drafter_id)
            if link is not None and ids:
                link.actor.free.remote(ids)  # in order with this client's steps; nothing to wait for
        self.to_free.clear()

    def free(self, req_ids: list[str]) -> None:
        """Free finished sequences on their homes now (the engine is idle: no step will carry them)."""
        self._finish(req_ids)
        self._send_frees()

    def draft_batch(self, step: DraftStep, hidden: torch.Tensor) -> tuple[DraftReply, BatchTiming]:
        """``hidden``: ``[N, fused_hidden_size]``, the step's rows. Three stages over each home's share of the step
        (a ``HomePlan``): read its branch table and look the step up in it (``_read_tables``), send the sub-step and
        ask for the next branches (``_send``), read the answers waited for (``_collect``). The same as
        ``collect_batch(send_batch(step, hidden))``."""
        return self.collect_batch(self.send_batch(step, hidden))

    def send_batch(self, step: DraftStep, hidden: torch.Tensor) -> StepInFlight:
        """Stages 1 and 2 of ``draft_batch``: every home's sub-step sent, nothing waited for but late branch tables.
        The verifier does its own work meanwhile (vLLM's engine core sends the step's tokens to the clients) and
        reads the drafts with ``collect_batch``."""
        run = self._start_step(step, hidden)
        run.plans = self._read_tables(run)
        self._send(run, run.plans)
        return run

    def collect_batch(self, run: StepInFlight) -> tuple[DraftReply, BatchTiming]:
        """Stage 3 of ``draft_batch``: the answers waited for, within the step's deadline (counted from
        ``send_batch``), and the reply."""
        self._collect(run, [p for p in run.plans if p.waited])
        return self._end_step(run)

    def _start_step(self, step: DraftStep, hidden: torch.Tensor) -> StepInFlight:
        """Frees, drafters found meanwhile, homes for new sequences, the rows encoded; every sequence undrafted
        that has no home."""
        start = time.perf_counter()
        self.deadline.step_started(start)
        self._finish(step.finished)
        req_ids = [s.req_id for s in step.seqs]
        self.usable()
        self._place([rid for rid in req_ids if rid not in self.home], step)
        array, dtype = encode_hidden(hidden)
        reply = DraftReply(DraftStatus.OK, np.zeros((len(req_ids), step.num_speculative_tokens), np.int32))
        reply.undrafted = {i: Undrafted.NO_DRAFTER for i, rid in enumerate(req_ids) if rid not in self.home}
        return StepInFlight(step, req_ids, start + self.deadline.seconds(), array, dtype, reply)

    def _read_tables(self, run: StepInFlight) -> list[HomePlan]:
        """1. Each home's branch table for this step (``_table``: usually ready, else waited for), and each of its
        sequences' real outcome looked up in it (``BranchTable.lookup``): the hits get their drafts now."""
        plans = []
        groups = plan_groups(run.req_ids, self.home)
        run.homes = len(groups)
        for drafter_id, idx in groups:
            link = self.links[drafter_id]
            t = time.perf_counter()
            try:
                table = self._table(link, run.deadline)
            except Exception as e:
                self._home_failed(run, link, idx, e)
                continue
            finally:
                run.wait_ms += (time.perf_counter() - t) * 1e3
            sub, rows = run.step.select(idx)
            sub.finished, sub.hidden_dtype = self.to_free.pop(drafter_id, []), run.dtype
            if not link.drafts_branches:  # no branches to draft from the context: it drafts, and we wait
                sub.seqs = [replace(s, role=SeqRole.DRAFT) for s in sub.seqs]
            found = table.lookup(sub)
            reply = run.reply
            reply.undrafted.update({idx[j]: Undrafted.CONTEXT for j in found.context})
            for j, drafts in zip(found.hits, found.drafts, strict=True):
                reply.draft_token_ids[idx[j]] = drafts
                reply.hit_seqs.append(idx[j])
            reply.branch_lookups += found.lookups
            run.drafted += len(sub.seqs) - len(found.context)
            plans.append(HomePlan(link, idx, sub, rows, found.misses))
        return plans

    def _send(self, run: StepInFlight, plans: list[HomePlan]) -> None:
        """2. Each home's sub-step (``draft_step``) and its next branches (``branches()``), neither waited for here.
        The misses' drafts are waited for (``HomePlan.waited``) only when enough of the step missed (see
        ``wait_for_misses``), or their drafter drafts no branches; otherwise the misses get no drafts this step,
        and their drafter drafts their next step from the context, as for a prompt step (``SeqRole.CONTEXT``)."""
        wait = sum(len(p.missed) for p in plans) > self.wait_for_misses * run.drafted
        # The branches asked for: every sequence homed on the drafter, not only this step's, so that one vLLM did
        # not schedule this step (it keeps its drafter state) finds its branches when it comes back.
        homed: dict[str, list[str]] = defaultdict(list)
        for rid, h in self.home.items():
            homed[h].append(rid)
        for plan in plans:
            t = time.perf_counter()
            link, sub = plan.link, plan.sub
            plan.waited = bool(plan.missed) and (wait or not link.drafts_branches)
            if plan.missed and not plan.waited:
                for j in plan.missed:
                    sub.seqs[j] = replace(sub.seqs[j], role=SeqRole.CONTEXT)
                    run.reply.undrafted[plan.idx[j]] = Undrafted.CONTEXT
            plan.ref = link.actor.draft_step.remote(sub.pack(), run.array[plan.rows])
            link.branches_ref = (link.actor.branches.remote(homed[link.drafter_id])
                                 if link.drafts_branches else None)
            if not plan.waited:
                link.unchecked = plan.ref
            run.ship_ms += (time.perf_counter() - t) * 1e3
        self._send_frees()  # homes with finished sequences but nothing to draft this step

    def _collect(self, run: StepInFlight, waiting: list[HomePlan]) -> None:
        """3. The answers waited for: the misses' drafts, checked (``check_drafts``)."""
        import ray

        k, reply = run.step.num_speculative_tokens, run.reply
        run.waited_homes = len(waiting)
        for plan in waiting:
            t = time.perf_counter()
            try:
                r = DraftResult.unpack(ray.get(plan.ref, timeout=max(0.0, run.deadline - time.perf_counter())))
                if r.status is not DraftStatus.OK:
                    raise RuntimeError(r.error or "drafter failed")
                check_drafts(r.draft_token_ids, len(plan.idx), k, self.vocab_size)
            except Exception as e:  # no drafts for these sequences this step; re-homed next step
                self._home_failed(run, plan.link, plan.idx, e, waited=plan.ref)
                continue
            finally:
                run.wait_ms += (time.perf_counter() - t) * 1e3
            reply.draft_token_ids[plan.idx] = r.draft_token_ids
            reply.undrafted.update({plan.idx[j]: Undrafted.FULL for j in r.full_seqs})
            self._count_prefix(r)
            plan.link.report(r.active_sequences)
            run.compute_ms = max(run.compute_ms, r.compute_ms)

    def _home_failed(self, run: StepInFlight, link: DrafterLink, idx: list[int], error: Exception,
                     waited: Any = None) -> None:
        """A home failed this step (its table, its call, its answer): its sequences get no drafts, it is dropped."""
        run.errors.append(f"{len(idx)} sequences: {type(error).__name__}: {str(error)[:200]}")
        self._drop(link, [run.req_ids[i] for i in idx], str(error)[:200], waited=waited)
        run.reply.undrafted.update(dict.fromkeys(idx, Undrafted.FAILED))

    @staticmethod
    def _end_step(run: StepInFlight) -> tuple[DraftReply, BatchTiming]:
        reply = run.reply
        if run.errors:
            reply.status = DraftStatus.PARTIAL if len(run.errors) < run.homes else DraftStatus.FAILED
            reply.error = "; ".join(run.errors)
        for i in reply.undrafted:
            reply.draft_token_ids[i] = 0
        reply.hit_seqs.sort()
        return reply, BatchTiming(run.ship_ms, max(0.0, run.wait_ms - run.compute_ms), run.compute_ms,
                                    not run.waited_homes)

    def stats(self) -> dict[str, Any]:
        return {"rehomed": self.rehomed, "homes": dict(Counter(self.home.values())), "events": list(self.events),
                "drafters": len(self.links), "quarantined": len(self.quarantine.held),
                "deadline_s": self.deadline.seconds(), "prefix_hit_tokens": self.prefix_tokens["hit"],
                "prefix_miss_tokens": self.prefix_tokens["miss"], "prefix_homed": self.prefix_homed}


class ActorDraftClient(DraftClient):
    """One named drafter actor (``actors.drafter.actor.start_drafter_actor``)."""

    def __init__(self, actor: str | Any, namespace: str | None = None, timeout_s: float = DRAFT_TIMEOUT_S,
                 start_wait_s: float = START_WAIT_S, **kw: Any) -> None:
        super().__init__(timeout_s=timeout_s, **kw)
        self.actor_name, self.namespace = actor, namespace
        self.actor_id = ""  # its drafter id, once known
        self.start(start_wait_s)

    def _find(self) -> list[tuple[str, Any, dict[str, Any]]]:
        """The actor, unless it is already in use or held out (background thread)."""
        if self.actor_id and self._known(self.actor_id):
            return []
        import ray

        actor = self.actor_name
        if isinstance(actor, str):
            actor = ray.get_actor(actor, namespace=self.namespace)
        info = ray.get(actor.info.remote(), timeout=self.timeout_s)  # dead or hung: raises; nothing found
        self.actor_id = info.get("drafter_id") or str(self.actor_name)
        return [(self.actor_id, actor, info)]


def build_client(spec: dict[str, Any]) -> DraftClient:
    """``{"client": "module:Class", **kwargs}`` -> a client (``ActorDraftClient`` by default)."""
    spec = dict(spec)
    path = spec.pop("client", "actors.verifier.client:ActorDraftClient")
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(**spec)
