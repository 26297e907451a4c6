"""The application builders for ``serve run`` / ``serve deploy``: two Serve applications.

    eagle-cluster (cluster.app:build_app)                           eagle-drafters (cluster.app:build_drafter_app)
    Verifier = the ingress (HTTP, gRPC, handle; vLLM AsyncLLM, TP bundles) ──actor calls──► drafter actors
                                                                 ──handle (attach)──► Drafter (1..M replicas)

The verifier deployment is the application's ingress, as vLLM's API server is one process with its engine: Serve's
proxy routes HTTP and gRPC to the verifier replicas, and nothing sits between parsing a request and the engine.

Each drafter replica owns the drafter actor its bundle's resources go to (``cluster.drafter_pool.server``); verifiers
learn the actors through ``attach`` on the drafter application's deployment, routed by
``cluster.drafter_pool.router.SequenceAffinityRouter``, and call them straight. With ``autoscaling_config`` the pool
scales with ``cluster.drafter_pool.autoscaling.DrafterLoadPolicy``.

Why two applications: Serve versions every deployment of an application by a hash of the application's whole
``args`` (``ray.serve._private.deploy_utils.get_app_code_version``), so in one application any drafter change
would restart the verifier and its vLLM engine. Apart, ``serve deploy`` of a changed YAML restarts only the
application whose ``args`` changed:

    change                                          restarts
    eagle-drafters args (replicas, autoscaling,     the Drafter replicas (rolling); the verifier's engine stays up,
      resources, timeout_s, async_drafting, ...)    in-flight requests finish (their sequences re-home)
    eagle-cluster args (verifier, speculative_      the Verifier (a new vLLM engine)
      config, ingress)
    the target or head path                         both applications (both name it)

Both builders validate their ``args`` (errors name the field; model paths come out absolute, ``cluster.config``) and
bind what validation built: the verifier its ``EagleClusterConfig``, each drafter replica the pool's
``actors.drafter.config.DrafterSettings`` (``DrafterPoolConfig.for_drafter``), handed whole to its actor and engine.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from actors.engine_spin import SPIN_ENV
from cluster import serve_env
from cluster.config import DRAFTER_DEPLOYMENT, AutoscalingConfig, DrafterPoolConfig, EagleClusterConfig
from cluster.drafter_pool.front import DrafterPoolFront
from cluster.drafter_pool.router import SequenceAffinityRouter
from cluster.drafter_pool.server import DrafterServer
from cluster.verifier_server import VerifierServer

VERIFIER = "Verifier"
DRAFTER_FRONT = "DrafterPoolFront"
# The verifier replica's user code runs on the replica's own event loop, not a thread of its own: one thread hop
# fewer per request and per streamed chunk (its methods only await). The draft client's synchronous handle calls run
# in vLLM's engine process, not here, so Serve's router keeps its own loop (RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP).
VERIFIER_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def verifier_env(engine_spin_s: float | None) -> dict[str, str]:
    """The verifier replica's environment (inherited by the vLLM engine it starts): ``VERIFIER_ENV``, and the engine
    core's busy loop when set (``verifier.engine_spin_s``, read by the ``actors.engine_spin`` vLLM plugin)."""
    env = dict(VERIFIER_ENV)
    if engine_spin_s is not None:
        env[SPIN_ENV] = str(engine_spin_s)
    return env


def build_drafter_app(args: dict[str, Any]) -> Application:
    """The drafter pool: one deployment, each replica owning a drafter actor."""
    d = DrafterPoolConfig.model_validate(args)
    # Each replica owns a drafter actor that does the drafting: the replica's placement group holds the
    # configured resources in one bundle, the replica itself takes none of them, the actor takes them all.
    actor_opts: dict[str, Any] = {"num_cpus": d.num_cpus, "num_gpus": d.num_gpus, "resources": dict(d.resources)}
    drafter_bundle = {k: v for k, v in {"CPU": d.num_cpus, "GPU": d.num_gpus, **d.resources}.items() if v}
    replica_opts: dict[str, Any] = {"num_cpus": 0}
    drafter_opts: dict[str, Any] = {
        "name": DRAFTER_DEPLOYMENT,
        "ray_actor_options": replica_opts,
        "health_check_period_s": 5,
        "max_ongoing_requests": d.max_ongoing_requests,
        "request_router_config": RequestRouterConfig(
            request_router_class=SequenceAffinityRouter,
            request_routing_stats_period_s=1.0,
            request_routing_stats_timeout_s=5.0,
        ),
    }
    if drafter_bundle:
        drafter_opts["placement_group_bundles"] = [drafter_bundle]
    if d.autoscaling_config is not None:
        drafter_opts["autoscaling_config"] = d.autoscaling_config.for_serve()
        interval = str(d.autoscaling_config.metrics_interval_s)
        replica_opts["runtime_env"] = {"env_vars": {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": interval}}
    else:
        drafter_opts["num_replicas"] = d.num_replicas or 1
    target = (d.autoscaling_config or AutoscalingConfig()).target_sequences_per_replica  # the default 16 if fixed
    drafters = serve.deployment(DrafterServer).options(**drafter_opts).bind(
        d.for_drafter(), actor_opts, d.timeout_s, target)
    if not serve_env.haproxy_enabled():  # read where the application is built: the Serve node's environment
        return drafters
    # Serve's HAProxy ingress refuses an application ingress with a custom router: a plain front instead.
    front = serve.deployment(DrafterPoolFront).options(name=DRAFTER_FRONT, ray_actor_options={"num_cpus": 0})
    return front.bind(drafters)


def build_app(args: dict[str, Any]) -> Application:
    """The verifier, which is the ingress; drafts come from the drafter application named ``drafter_app``."""
    cfg = EagleClusterConfig.model_validate(args)
    v = cfg.verifier
    bundle = {"GPU": 1, "CPU": v.num_cpus} if v.accelerator == "gpu" else {"CPU": v.num_cpus}
    bundle.update(v.resources)
    verifier = serve.deployment(serve.ingress()(VerifierServer)).options(
        name=VERIFIER,
        num_replicas=v.num_replicas,
        ray_actor_options={"num_cpus": v.num_cpus, "num_gpus": v.replica_gpus,  # the replica runs in bundle 0
                           "runtime_env": {"env_vars": verifier_env(v.engine_spin_s)}},
        placement_group_bundles=[dict(bundle) for _ in range(v.tensor_parallel_size)],
        placement_group_strategy="STRICT_PACK",
        health_check_period_s=10,
        # Admission is the replica's own (ingress.max_inflight_requests: 503 with Retry-After); past this Serve
        # would queue requests in its proxy instead.
        max_ongoing_requests=max(1000, 2 * cfg.ingress.max_inflight_requests),
        logging_config={"enable_access_log": cfg.ingress.access_log},
    )
    return verifier.bind(cfg)
