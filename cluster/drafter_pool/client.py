"""``ServeDraftClient``: the verifier's ``DraftClient`` over the drafter deployment, a pool of Serve replicas.

Runs inside vLLM's engine process (named by import path in ``additional_config``, so ``actors/`` never imports
Serve). Serve places, health-checks and autoscales the drafter replicas; each replica owns one drafter actor
(``cluster.drafter_pool.server``), and the per-step traffic goes straight to that actor by its handle
(``actors.verifier.client.DraftClient``: no Serve call on a step's path).

Serve's part is to introduce drafters: ``attach`` on the deployment, routed by ``cluster.drafter_pool.router`` to the
least-loaded replica, answers that replica's id, its drafter's actor handle, and the pool's draft-call timeout
(a drafter setting, so changing it redeploys the drafters, not the verifier). The client asks, blocking, when
it knows no drafter (until the router names one it knows: the router counts what it sent, so it goes round the
idle replicas), then every ``discover_period_s`` in the background (at once again after learning a new one),
so replicas the pool grows are found within about that long; new sequences go to the least-loaded drafter it
knows.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from actors.verifier.client import DRAFT_TIMEOUT_S, DraftClient
from cluster.drafter_pool.router import route_key

logger = logging.getLogger(__name__)
MAX_BLOCKING_ATTACHES = 8  # attach calls when the client knows no drafter (it learns the pool, up to this many)
BLOCKING_ATTACH_TIMEOUT_S = 2.0  # a step waits at most this long for a first drafter...
BLOCKING_BACKOFF_S = 10.0  # ...and, when none answered (the drafter application is not up), not again this soon


class ServeDraftClient(DraftClient):
    def __init__(self, app_name: str, deployment_name: str, timeout_s: float = DRAFT_TIMEOUT_S, new_group_size: int = 4,
                 discover_period_s: float = 1.0, vocab_size: int | None = None) -> None:
        from ray import serve

        super().__init__(timeout_s=timeout_s, new_group_size=new_group_size, vocab_size=vocab_size)
        self.handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        self.discover_period_s = discover_period_s
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-discovery")
        self._attaching: Future | None = None
        self._next_discovery = 0.0
        self._next_blocking = 0.0

    def _attach(self, timeout_s: float | None = None) -> tuple[str, Any, dict[str, Any]]:
        """(replica id, drafter actor handle, info) of the least-loaded drafter replica."""
        call = self.handle.options(session_id=route_key(None, 1)).attach.remote()
        return call.result(timeout_s=timeout_s or self.timeout_s)

    def _learn(self, drafter_id: str, actor: Any, info: dict[str, Any]) -> bool:
        """Add a drafter; True if it was new (then there may be more: ask again at once). One the client dropped
        stays out until its health probe answers (``Quarantine``), whatever the router says."""
        new = drafter_id not in self.links and drafter_id not in self.quarantine
        self._add_link(drafter_id, actor, info)
        self.timeout_s = float(info.get("timeout_s", self.timeout_s))  # the pool's setting, redeployed with it
        return new

    def _discover(self, blocking: bool) -> None:
        now = time.monotonic()
        if self._attaching is not None and self._attaching.done():
            done, self._attaching = self._attaching, None
            try:
                if self._learn(*done.result()):
                    self._next_discovery = now
            except Exception as e:
                logger.info("finding a drafter replica failed (%s)", e)
        if blocking and now >= self._next_blocking:  # the router answers the least-loaded replica: ask until it
            for _ in range(MAX_BLOCKING_ATTACHES):      # names one we know
                try:
                    if not self._learn(*self._attach(BLOCKING_ATTACH_TIMEOUT_S)):
                        break
                except Exception as e:  # no drafter now: this step drafts nothing; the background keeps asking
                    logger.warning("no drafter replica answered (%s)", e)
                    self._next_blocking = now + BLOCKING_BACKOFF_S
                    break
            if not self.links:  # every replica named is out of use: not again before the next discovery
                self._next_blocking = max(self._next_blocking, now + self.discover_period_s)
            self._next_discovery = now + self.discover_period_s
        elif self._attaching is None and now >= self._next_discovery:
            self._next_discovery = now + self.discover_period_s
            self._attaching = self._background.submit(self._attach)


# vLLM's engine process builds its draft client from an import path (``actors.verifier.client.build_client``:
# ``actors/`` never imports ``cluster/``); this is that path, beside the class it names.
SERVE_DRAFT_CLIENT = f"{ServeDraftClient.__module__}:{ServeDraftClient.__qualname__}"
