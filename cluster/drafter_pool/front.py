"""``DrafterPoolFront``: the drafter application's ingress when Serve's HAProxy ingress is on.

With ``RAY_SERVE_ENABLE_HA_PROXY=1`` Serve refuses an application whose ingress deployment has a custom request
router (HAProxy would bypass it), and the drafter deployment has one (``cluster.drafter_pool.router``). The
application then gets this plain front deployment as its ingress, with the drafter deployment bound below it:
verifiers still reach the drafter deployment by name (``attach``, routed by the affinity router), and nothing is
routed to the front but Serve's health checks. No route, no resources.
"""

from __future__ import annotations

from typing import Any


class DrafterPoolFront:
    def __init__(self, drafters: Any) -> None:
        self.drafters = drafters  # the drafter deployment's handle: bound here only so Serve deploys it

    async def check_health(self) -> None:
        return None
