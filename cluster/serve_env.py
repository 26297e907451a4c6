"""Serve's settings that live in the environment of its own processes (controller, proxies), where a deploy YAML
cannot reach: the defaults that every way of starting the product applies before Ray starts (``cluster.demo``,
``eagle-cluster serve``, ``make serve`` / ``make deploy``, and the harness that tests and benchmarks start servers
with). A value already in the environment wins, so each is turned off by setting it. For a command started by hand:

    python -m cluster.serve_env ray start --head    # CMD [ARGS...] run with these defaults in its environment

- ``RAY_SERVE_ENABLE_HA_PROXY=1``: Serve's HAProxy ingress in front of the verifier replicas instead of Serve's
  Python proxy (measured: the serving path's CPU per output token 1.59 -> 0.63 ms at c=1 with HAProxy's own CPU
  counted, TTFT p50 0.7-0.8x). ``RAY_SERVE_ENABLE_HA_PROXY=0`` keeps the
  Python proxy. With it the drafter application gets a plain front deployment (``cluster.drafter_pool.front``).
- ``RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5`` (Serve's default 0.1) and ``RAY_SERVE_METRICS_EXPORT_INTERVAL_MS=1000``
  (100): Ray's processes share the verifier's cores, and an idle served cluster spent 339 ms of CPU per second,
  64 of them in the Serve controller's loop; with these 277, the controller 29, the GCS 28 -> 15 (a one-off
  ``/proc`` split). Serve's autoscaling delays are in seconds, so
  they keep their meaning; a replica's state change is seen up to 0.4 s later.
- ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S=2`` (Serve's default 30): with the HAProxy ingress, a stopping
  ingress replica (the verifier, the drafter pool's front) first stays reachable this long so that an external load
  balancer can deregister it, then refuses new connections (HAProxy retries them on another replica) and drains its
  in-flight requests, which stay bounded by ``graceful_shutdown_timeout_s`` as before. The balancer here is Serve's
  own HAProxy, reloaded by the controller within a control-loop tick or two; at 30 s, every Ctrl-C of ``serve run``,
  ``serve shutdown`` and verifier redeploy held each ingress replica 30 s with nothing left to drain (seen: a served
  test's teardown took 56 s, "Controller failed to shut down within 30.0s"). Put a cloud load balancer in front of
  Serve and set it back to that balancer's deregistration delay.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
DEFAULTS: dict[str, str] = {
    HAPROXY: "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
}


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) over the defaults."""
    return {**DEFAULTS, **(os.environ if base is None else base)}


def apply() -> None:
    """The defaults into this process's environment, where unset (call it before Ray starts or ``serve`` runs)."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)


def haproxy_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Serve's processes started with this environment use the HAProxy ingress (Serve's own test)."""
    return (os.environ if environ is None else environ).get(HAPROXY) == "1"


def main(argv: list[str]) -> None:
    """Run ``argv`` (a command and its arguments) in place of this process, the defaults in its environment."""
    if not argv:
        sys.exit("usage: python -m cluster.serve_env CMD [ARGS...]")
    apply()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
