"""How long vLLM's engine core spins while it waits for its workers: a ``vllm.general_plugins`` entry point
(``pyproject.toml``), so it runs in every vLLM process, the engine core's included.

vLLM's shared-memory message queue (``vllm/distributed/device_communicators/shm_broadcast.py``, ``SpinCondition``)
has a reader busy-loop on ``sched_yield`` for ``busy_loop_s`` (1 s) after each read before it sleeps on a ZMQ
socket: the engine core spins while the worker runs a step, the worker while the engine core schedules. On a core
of its own that costs nothing; on the cores the verifier's worker, its serving path and (on a small machine) a
drafter need, the engine core spins through every wait on a drafter. ``EAGLE_CLUSTER_ENGINE_SPIN_S`` sets that busy
loop in the engines the cluster's verifier starts (``cluster.app`` puts it in the verifier replica's environment)
for the steps that draft; unset (vLLM's own servers, the baselines), vLLM keeps its default.

A step that drafts nothing (k = 0, or no drafter ready) waits on no drafter, so it spins as vLLM target-only does
(vLLM's 1 s; ``EAGLE_CLUSTER_ENGINE_PLAIN_SPIN_S`` sets another), with one difference: a wait shares a contended
core. vLLM's reader spins on ``sched_yield``, and the scheduler gives a spinning process its fair share of a core
that others want: on two cores shared with the cluster's serving path (Serve's replica, HAProxy, Ray), the engine
core and the worker spinning for each other starved it, and at c = 8 every stream's tokens came in one burst after
~3 s (0.3x vLLM target-only, in half the runs). So once a ``sched_yield`` lasts ``CONTENDED_S`` (another process
ran on the core meanwhile), the rest of that wait sleeps on the writer's ZMQ wake-up, ``SLEEP_MS`` at most per turn
(a dropped wake-up costs a millisecond, not the 5 s vLLM rechecks after); an uncontended wait, or one of a process
bound to a single core, spins as vLLM's does.
``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1`` keeps vLLM's wait. Each process is told after every step whether the next
one drafts (``drafting``: the worker by its proposer, the engine core by the step's output,
``actors.verifier.draft_handoff``), and every queue reader of the process reads the busy loop from that (a property
on ``SpinCondition``); steps that draft keep the short loop and vLLM's wait. Figures: ``docs/BENCHMARKS.md``.

Not below ``MIN_SPIN_S``. The writer's wake-up is a ZMQ PUB message with a send high-water mark of 1, and a PUB
socket learns that its pipe has room again only when it processes its commands, which ZMQ throttles inside ``send``
to once per ``max_command_delay`` (3 million TSC cycles: 1-2 ms at 1.5-3 GHz). So a wake-up sent within that time of
the previous one is dropped, and a reader that went to sleep in between never wakes: with a busy loop of 0 the engine
core and its worker deadlocked (both asleep in ``Poller.poll``). A reader that spins ``MIN_SPIN_S`` after each read
only sleeps once the writer has been silent longer than the throttle, so the next wake-up gets through: the regime
vLLM's 1 s default runs in after every idle second.
"""

from __future__ import annotations

import logging
import os
import time

SPIN_ENV = "EAGLE_CLUSTER_ENGINE_SPIN_S"
PLAIN_SPIN_ENV = "EAGLE_CLUSTER_ENGINE_PLAIN_SPIN_S"  # the loop for steps without drafts (default: vLLM's)
MIN_SPIN_S = 0.005  # > ZMQ's command throttle (1-2 ms), with room: see above
DEFAULT_SPIN_S = MIN_SPIN_S  # the verifier's (``verifier.engine_spin_s``)
GREEDY_ENV = "EAGLE_CLUSTER_ENGINE_GREEDY_SPIN"  # 1: spin through contention, as vLLM does
CONTENDED_S = 0.5e-3  # a sched_yield this long: another process needed the core (not a brief wake-up)
SLEEP_MS = 1  # a contended wait sleeps on the writer's wake-up this long at most per turn

logger = logging.getLogger(__name__)


def parse_spin_s(value: str, name: str = SPIN_ENV) -> float:
    """A busy loop in seconds (``name``: the variable it came from); a message naming it unless a number >=
    ``MIN_SPIN_S``."""
    try:
        spin_s = float(value)
    except ValueError:
        raise ValueError(f"{name}: a number of seconds, got {value!r}") from None
    if not spin_s >= MIN_SPIN_S:
        raise ValueError(f"{name}: at least {MIN_SPIN_S} s (shorter loses vLLM's wake-ups), got {value!r}")
    return spin_s


class _Spin:
    """This process's busy loop: ``drafting_s`` while steps draft, ``plain_s`` while they do not."""

    drafting_s: float | None = None  # None: not set (vLLM's own loop, whatever the steps do)
    plain_s = 1.0
    current = 1.0
    greedy = True  # vLLM's wait through the plain loop too (``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1``)
    sharing = False  # the waits of this step sleep once their core is contended (steps without drafts)


def _busy_loop_s(condition: object) -> float:
    return _Spin.current


def _ignore(condition: object, value: float) -> None:  # vLLM's constructor assigns it; the process decides it
    return None


def _sharing_wait(vllm_wait):
    """vLLM's ``SpinCondition.wait`` (one turn of a reader's wait: ``sched_yield`` within the busy loop, else a ZMQ
    sleep until the writer's wake-up), except that a wait whose ``sched_yield`` once took ``CONTENDED_S`` (another
    process ran on the core meanwhile) sleeps on the wake-up instead, ``SLEEP_MS`` at most per turn, for the rest of
    that wait: the core goes to whoever wanted it, and a dropped wake-up costs a millisecond. A process bound to one
    core keeps vLLM's wait: there the reader's yield goes to its writer on that same core, and a sleep only adds the
    wake-up's trip through both processes' ZMQ threads (k = 0 on one core: 0.77-0.92x target-only sleeping, 0.84-0.99x
    spinning, in one run)."""

    import zmq

    def wait(self, timeout_ms: int | None = None) -> None:
        if not _Spin.sharing or time.monotonic() > self.last_read + self.busy_loop_s:
            return vllm_wait(self, timeout_ms)
        if self.__dict__.get("_contended_after") == self.last_read:  # contended since this wait began
            if self.local_notify_socket in dict(self.poller.poll(timeout=SLEEP_MS)):
                self.local_notify_socket.recv(flags=zmq.NOBLOCK, copy=False)  # conflated: the one wake-up
            return
        began = time.perf_counter()
        vllm_wait(self, timeout_ms)
        if time.perf_counter() - began >= CONTENDED_S and len(os.sched_getaffinity(0)) > 1:
            self._contended_after = self.last_read

    wait.__wrapped__ = vllm_wait
    return wait


def register() -> None:
    """Makes every ``SpinCondition`` of this process read its busy loop from ``drafting`` (vLLM loads general plugins
    when an engine core or a worker starts, before any queue is built), if ``EAGLE_CLUSTER_ENGINE_SPIN_S`` is set."""
    value = os.environ.get(SPIN_ENV)
    if value is None:
        return
    spin_s = parse_spin_s(value)
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    defaults = SpinCondition.__init__.__defaults__
    if defaults is None or len(defaults) != 1:  # vLLM changed the signature: keep its default
        logger.warning("%s ignored: SpinCondition.__init__ has defaults %r", SPIN_ENV, defaults)
        return
    plain = os.environ.get(PLAIN_SPIN_ENV)
    _Spin.drafting_s = spin_s
    _Spin.plain_s = float(defaults[0]) if plain is None else parse_spin_s(plain, PLAIN_SPIN_ENV)
    _Spin.current = spin_s
    _Spin.greedy = os.environ.get(GREEDY_ENV, "0") == "1"
    SpinCondition.busy_loop_s = property(_busy_loop_s, _ignore)
    SpinCondition.wait = _sharing_wait(getattr(SpinCondition.wait, "__wrapped__", SpinCondition.wait))


def drafting(yes: bool) -> None:
    """Whether this process's next step drafts: ``EAGLE_CLUSTER_ENGINE_SPIN_S`` if so, the plain loop (vLLM's) if
    not (a no-op where the variable is unset)."""
    if _Spin.drafting_s is not None:
        _Spin.current = _Spin.drafting_s if yes else _Spin.plain_s
        _Spin.sharing = not yes and not _Spin.greedy
