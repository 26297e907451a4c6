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
(vLLM's 1 s; ``EAGLE_CLUSTER_ENGINE_PLAIN_SPIN_S`` sets another). Each process is told after every step whether the
next one drafts (``drafting``: the worker by its proposer, the engine core by the step's output,
``actors.verifier.draft_handoff``), and every queue reader of the process reads the busy loop from that (a property
on ``SpinCondition``). Measured on this project's 2-core machines: with k = 0 held (strict pinning) 1.01-1.08x vLLM
target-only's tok/s at c = 1 / 8 / 32, where a 20 ms loop gave 0.83-0.89x; with no drafter application on shared
cores, 0.89-1.0x at c = 1 where the 5 ms loop gave 0.5-0.75x, but at c = 8 two runs in four collapsed to 0.3x
(every stream's tokens held back for seconds: two spinning processes starve the cluster's heavier serving path on
two shared cores, which vLLM's lighter API server survives). A small machine without a drafter can set the plain
loop shorter (0.02 s: 0.56-0.97x at c = 8, no collapse seen).

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

SPIN_ENV = "EAGLE_CLUSTER_ENGINE_SPIN_S"
PLAIN_SPIN_ENV = "EAGLE_CLUSTER_ENGINE_PLAIN_SPIN_S"  # the loop for steps without drafts (default: vLLM's)
MIN_SPIN_S = 0.005  # > ZMQ's command throttle (1-2 ms), with room: see above
DEFAULT_SPIN_S = MIN_SPIN_S  # the verifier's (``verifier.engine_spin_s``)

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


def _busy_loop_s(condition: object) -> float:
    return _Spin.current


def _ignore(condition: object, value: float) -> None:  # vLLM's constructor assigns it; the process decides it
    return None


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
    SpinCondition.busy_loop_s = property(_busy_loop_s, _ignore)


def drafting(yes: bool) -> None:
    """Whether this process's next step drafts: ``EAGLE_CLUSTER_ENGINE_SPIN_S`` if so, the plain loop (vLLM's) if
    not (a no-op where the variable is unset)."""
    if _Spin.drafting_s is not None:
        _Spin.current = _Spin.drafting_s if yes else _Spin.plain_s
