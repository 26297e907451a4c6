"""Which drafter actors a verifier can draft on: found in the background, dropped when they fail, let back in once
they answer a health probe. Used by ``actors.verifier.remote_speculator`` in vLLM's driver worker.

- Discovery: a ``Finder`` names drafters (``ActorFinder``: one named actor; ``cluster.drafter_pool.finder``: the
  replicas of a Ray Serve deployment). It may block (a Serve call, a hung replica), so it only ever runs on a
  one-thread executor, every ``discover_period_s`` (at once again after it found a new drafter); a step only picks
  up what it found (``usable``), never waiting. A finder is named by an import path (``build_finder``), so this
  package never imports Serve.
- ``StepDeadline``: how long a step waits for a drafter. A drafter keeps pace with the verifier's steps, so a call
  still unanswered after many step periods is not coming soon: the deadline is ``factor`` times the median recent
  step period, within [``floor_s``, the pool's ``timeout_s``]; until ``min_samples`` steps were seen, ``timeout_s``.
- ``Quarantine``: a drafter that failed, timed out or answered badly is dropped: its queued calls are cancelled, and
  it stays out of use, whatever discovery says (a Serve router may still name it: its replica answers while its
  actor hangs), until it answers the health probe sent when it was dropped and ``min_hold_s`` passed. A drafter
  actor runs one call at a time, in order, so the probe's answer also says it worked through the calls that hung it.
"""

from __future__ import annotations

import importlib
import logging
import statistics
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.verifier.transport import HostRows, RowsTransport, Transports

logger = logging.getLogger(__name__)
DRAFT_TIMEOUT_S = 10.0  # a draft call slower than this drafts nothing (its drafter is dropped), unless configured
DISCOVER_PERIOD_S = 1.0  # background discovery asks for drafters this often (at once again after finding a new one)
START_WAIT_S = 2.0  # the engine's start waits this long for the first discovery (not a step)

Found = tuple[str, Any, dict[str, Any]]  # (drafter id, its actor handle, its info: drafts_branches, timeout_s, ...)


class Finder(Protocol):
    def find(self, known: Any) -> list[Found]:
        """Drafters to add; ``known(drafter_id)``: already in use or held out. Runs on the discovery thread, may
        block; raising means none found this time."""
        ...


@dataclass
class DrafterLink:
    """One drafter actor as this verifier sees it."""

    drafter_id: str
    actor: Any  # Ray actor handle of a DrafterActor
    drafts_branches: bool  # pipelined drafting: it answers branches()
    load: int = 0  # active sequences it last reported (all verifiers)
    placed: int = 0  # sequences this verifier placed on it since that report
    branches_ref: Any = None  # ObjectRef of the BranchTable being drafted for the next step
    unchecked: Any = None  # ObjectRef of the last draft_step() nobody waited for
    rows: RowsTransport = field(default_factory=HostRows)  # how its steps' hidden rows reach it (at attach)
    info: dict[str, Any] = field(default_factory=dict)  # what it said of itself at attach (node_id, ...)

    def report(self, active_sequences: int) -> None:
        self.load, self.placed = active_sequences, 0

    def cancel_calls(self, *refs: Any) -> None:
        """Calls given up on: a queued one never runs, a running one finishes unread."""
        import ray

        for ref in (*refs, self.branches_ref, self.unchecked):
            if ref is not None:
                try:
                    ray.cancel(ref)
                except Exception:
                    pass
        self.branches_ref = self.unchecked = None


class StepDeadline:
    def __init__(self, max_s: float, floor_s: float = 1.0, factor: float = 10.0, window: int = 64,
                 min_samples: int = 8) -> None:
        self.max_s, self.floor_s, self.factor, self.min_samples = max_s, floor_s, factor, min_samples
        self.periods: deque[float] = deque(maxlen=window)  # seconds between consecutive busy steps
        self._last: float | None = None

    def step_started(self, now: float) -> None:
        """Called at each step's start; an idle gap (longer than ``max_s``) is not a step period."""
        if self._last is not None and now - self._last < self.max_s:
            self.periods.append(now - self._last)
        self._last = now

    def seconds(self) -> float:
        """How long this step waits for a drafter.

        Worked example: max_s 10, floor 1, factor 10; periods of 30 ms -> max(1, 0.3) = 1 s; periods of 400 ms
        (a loaded GPU batch) -> 4 s; fewer than ``min_samples`` periods seen -> 10 s."""
        if len(self.periods) < self.min_samples:
            return self.max_s
        return min(self.max_s, max(self.floor_s, self.factor * statistics.median(self.periods)))


@dataclass
class Quarantined:
    actor: Any  # the drafter's Ray actor handle
    drafts_branches: bool
    probe: Any  # ObjectRef of the health probe sent when it was dropped
    since: float  # time.monotonic()
    info: dict[str, Any] = field(default_factory=dict)  # its info at attach, for when it is readmitted


class Quarantine:
    """Dropped drafters, each waiting for its probe's answer (see the module docstring)."""

    def __init__(self, min_hold_s: float = 5.0, forget_after_s: float = 600.0) -> None:
        self.min_hold_s = min_hold_s  # out of use at least this long (one that answered badly probes fine at once)
        self.forget_after_s = forget_after_s  # a drafter that never answers (dead) is forgotten after this long
        self.held: dict[str, Quarantined] = {}

    def __contains__(self, drafter_id: str) -> bool:
        return drafter_id in self.held

    def hold(self, drafter_id: str, actor: Any, drafts_branches: bool, info: dict[str, Any] | None = None) -> None:
        """Send the probe (never waited for; a dead actor's probe just fails)."""
        try:
            probe = actor.probe.remote()
        except Exception:  # the handle is unusable: the drafter is gone
            probe = None
        self.held[drafter_id] = Quarantined(actor, drafts_branches, probe, time.monotonic(), dict(info or {}))

    def recovered(self) -> list[tuple[str, Quarantined]]:
        """The drafters whose probe answered well since the last call (released); forgets the long-silent ones.
        Never blocks."""
        import ray

        out: list[tuple[str, Quarantined]] = []
        now = time.monotonic()
        for drafter_id, q in list(self.held.items()):
            if now - q.since < self.min_hold_s:
                continue
            if q.probe is not None and ray.wait([q.probe], timeout=0)[0]:
                try:
                    healthy = tuple(ray.get(q.probe)) == (1, 1)
                except Exception:  # dead, or failing: keep it out
                    healthy = False
                q.probe = None
                if healthy:
                    del self.held[drafter_id]
                    out.append((drafter_id, q))
                    continue
            if now - q.since > self.forget_after_s:
                del self.held[drafter_id]
        return out


class Drafters:
    """The usable drafters (``links``), the dropped ones (``quarantine``), and the discovery that finds more."""

    def __init__(self, finder: Finder | None, timeout_s: float = DRAFT_TIMEOUT_S,
                 discover_period_s: float = DISCOVER_PERIOD_S, transports: Transports | None = None) -> None:
        """``transports``: picks each new link's hidden-row transport (default: ``auto``)."""
        self.finder = finder
        self.transports = transports or Transports()
        self.deadline = StepDeadline(timeout_s)
        self.quarantine = Quarantine()
        self.discover_period_s = discover_period_s
        self.links: dict[str, DrafterLink] = {}
        self.prefix_max_load = float("inf")  # prefix homing: not onto a drafter past this (the pool's target)
        self.events: deque[tuple[float, str, int]] = deque(maxlen=1000)  # (time.time(), kind, sequences)
        # kind: "attached" (found by discovery), "failed" (dropped), "readmitted" (its probe answered), "rehomed"
        self._finder: ThreadPoolExecutor | None = None  # created at the first discovery
        self._finding: Future | None = None
        self._next_discovery = 0.0  # time.monotonic()

    def known(self, drafter_id: str) -> bool:
        """In use or held out."""
        return drafter_id in self.links or drafter_id in self.quarantine

    def start(self, wait_s: float = START_WAIT_S) -> None:
        """At the engine's start: the first discovery, waited for up to ``wait_s`` (so a pool that is up drafts from
        the first request); one that takes longer goes on in the background."""
        deadline = time.monotonic() + wait_s
        self._discover()
        if self._finding is not None:
            wait_futures([self._finding], timeout=wait_s)
            self._discover()
        for link in self.links.values():  # so the first steps' rows already go by shared memory
            wait_open = getattr(link.rows, "wait_open", None)
            if wait_open is not None:
                wait_open(max(0.0, deadline - time.monotonic()))

    def usable(self) -> bool:
        """Whether some drafter can draft this step. Never blocks: readmits drafters whose probe answered, adds what
        the background discovery found, and starts the next one when it is due."""
        for drafter_id, q in self.quarantine.recovered():
            self.add(drafter_id, q.actor, {**q.info, "drafts_branches": q.drafts_branches})
            self.events.append((time.time(), "readmitted", 0))
        self._discover()
        return bool(self.links)

    def _discover(self) -> None:
        if self.finder is None:
            return
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
            self._finding = self._finder.submit(self.finder.find, self.known)

    def _learn(self, drafter_id: str, actor: Any, info: dict[str, Any]) -> bool:
        """Add a found drafter (and the pool's settings it carries); True if it was new."""
        new = not self.known(drafter_id)
        self.add(drafter_id, actor, info)
        if "timeout_s" in info:  # the pool's setting, redeployed with it
            self.deadline.max_s = float(info["timeout_s"])
        if "target_sequences" in info:
            self.prefix_max_load = float(info["target_sequences"])
        if new:
            self.events.append((time.time(), "attached", 0))
            logger.info("drafter %s attached", drafter_id)
        return new

    def add(self, drafter_id: str, actor: Any, info: dict[str, Any]) -> None:
        """A drafter in use, unless it is already, or held out."""
        if not self.known(drafter_id):
            self.links[drafter_id] = DrafterLink(drafter_id, actor, bool(info.get("drafts_branches")),
                                                 int(info.get("active_sequences", 0)),
                                                 rows=self.transports.attach(actor, info), info=dict(info))

    def close(self) -> None:
        """The verifier goes away: every link's transport closed (shared-memory regions unlinked)."""
        for link in self.links.values():
            link.rows.close()

    def drop(self, link: DrafterLink, lost: list[str], error: str, waited: Any = None) -> None:
        """A drafter failed: out of use until its probe answers, its calls cancelled (``waited``: the one this step
        gave up on). It may still hold the ``lost`` sequences' draft KV slots (they count as its load for the router
        and the autoscaler): it is sent ``free`` for them, never waited for; a drafter that never gets it evicts
        them once idle (``DraftKVCache.evict_idle``)."""
        self.links.pop(link.drafter_id, None)
        link.cancel_calls(waited)
        link.rows.close()  # its shared-memory region unlinked; a readmitted drafter gets a new one
        self.quarantine.hold(link.drafter_id, link.actor, link.drafts_branches, link.info)
        if lost:
            try:
                link.actor.free.remote(list(lost))
            except Exception as e:  # the actor handle is unusable: the drafter is gone, and its slots with it
                logger.info("freeing %d sequences on dropped drafter %s failed (%s)", len(lost), link.drafter_id, e)
        self.events.append((time.time(), "failed", len(lost)))
        logger.warning("drafter %s failed (%s); %d sequences will be re-homed", link.drafter_id, error, len(lost))


class ActorFinder:
    """One named drafter actor (``actors.drafter.actor.start_drafter_actor``), or its handle."""

    def __init__(self, actor: str | Any, namespace: str | None = None, timeout_s: float = DRAFT_TIMEOUT_S) -> None:
        self.actor, self.namespace, self.timeout_s = actor, namespace, timeout_s
        self.drafter_id = ""  # once known

    def find(self, known: Any) -> list[Found]:
        """The actor, unless it is in use or held out (then no call is made)."""
        if self.drafter_id and known(self.drafter_id):
            return []
        import ray

        actor = ray.get_actor(self.actor, namespace=self.namespace) if isinstance(self.actor, str) else self.actor
        info = ray.get(actor.info.remote(), timeout=self.timeout_s)  # dead or hung: raises; nothing found
        self.drafter_id = info.get("drafter_id") or str(self.actor)
        return [(self.drafter_id, actor, info)]


def build_finder(spec: dict[str, Any]) -> Finder:
    """``{"finder": "module:Class", **kwargs}`` -> a finder (``ActorFinder`` by default)."""
    spec = dict(spec)
    module, _, name = spec.pop("finder", f"{__name__}:ActorFinder").partition(":")
    return getattr(importlib.import_module(module), name)(**spec)
