"""``ServeFinder``: how a verifier finds the drafters of the drafter deployment, a pool of Serve replicas.

Runs inside vLLM's engine process, on the discovery thread of ``actors.verifier.drafters.Drafters`` (named by import
path in ``additional_config``, so ``actors/`` never imports Serve). Serve places, health-checks and autoscales the
drafter replicas; each replica owns one drafter actor (``cluster.drafter_pool.server``), and the per-step traffic
goes straight to that actor by its handle (``actors.verifier.remote_speculator``: no Serve call on a step's path).

Serve's part is to introduce drafters: ``attach`` on the deployment, routed by ``cluster.drafter_pool.router`` to the
least-loaded replica, answers that replica's id, its drafter's actor handle, the pool's draft-call timeout and its
target sequences per replica (drafter settings, so changing them redeploys the drafters, not the verifier). Only the
discovery thread calls it (``find``: every ``discover_period_s``, at once again after learning a new replica, and
up to ``MAX_ATTACHES`` calls a round until the router names a replica it knows, so it learns a pool of several
within a round). A step never waits for Serve: a drafter application that is absent (not deployed yet, deleted,
its deploy failed), scaled to zero or whose replica process hangs only means no drafter is found this round, and
the steps verify without drafts meanwhile.

The deployment handle is opened in the background too, and opened again after an ``attach`` failed: the drafter
application may not exist when the verifier starts (Serve refuses a handle to an unknown application), and may be
deleted and deployed again while it runs.
"""

from __future__ import annotations

import logging
from typing import Any

from cluster.drafter_pool.router import route_key

logger = logging.getLogger(__name__)
MAX_ATTACHES = 8  # attach calls in one discovery round (it learns the pool's replicas, up to this many)
ATTACH_TIMEOUT_S = 3.0  # one attach call waits at most this long (a hung replica, or no replica to route to)


class ServeFinder:
    def __init__(self, app_name: str, deployment_name: str) -> None:
        self.app_name, self.deployment_name = app_name, deployment_name
        self.handle: Any = None  # the drafter deployment's handle, opened by the discovery thread

    def _open_handle(self) -> Any:
        if self.handle is None:
            from ray import serve

            # Raises (KeyError) while the drafter application does not exist: nothing found this round.
            self.handle = serve.get_deployment_handle(self.deployment_name, app_name=self.app_name)
        return self.handle

    def _attach(self) -> tuple[str, Any, dict[str, Any]]:
        """(replica id, drafter actor handle, info) of the least-loaded drafter replica (background thread)."""
        call = self._open_handle().options(session_id=route_key(None, 1)).attach.remote()
        try:
            return call.result(timeout_s=ATTACH_TIMEOUT_S)
        except BaseException:
            cancel = getattr(call, "cancel", None)
            if cancel is not None:  # not left queued at a replica that is hung, or for one that will never come
                try:
                    cancel()
                except Exception:
                    pass
            self.handle = None  # opened again next round (the application may have been deleted and redeployed)
            raise

    def find(self, known: Any) -> list[tuple[str, Any, dict[str, Any]]]:
        """Ask the router until it names a replica the verifier knows (``known``) or found this round: the router
        counts what it sent, so it goes round the idle replicas."""
        found: list[tuple[str, Any, dict[str, Any]]] = []
        seen: set[str] = set()
        for _ in range(MAX_ATTACHES):
            try:
                drafter_id, actor, info = self._attach()
            except Exception as e:  # no drafter now: the steps verify without drafts; asked again next round
                if not found:
                    logger.info("no drafter replica answered attach (%s: %s)", type(e).__name__, str(e)[:200])
                break
            if drafter_id in seen or known(drafter_id):
                break
            seen.add(drafter_id)
            found.append((drafter_id, actor, info))
        return found


# vLLM's engine process builds its finder from an import path (``actors.verifier.drafters.build_finder``: ``actors/``
# never imports ``cluster/``); this is that path, beside the class it names.
SERVE_FINDER = f"{ServeFinder.__module__}:{ServeFinder.__qualname__}"
