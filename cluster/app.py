"""The application builders for ``serve run`` / ``serve deploy``: two Serve applications.

    eagle-cluster (cluster.app:build_app)                             eagle-drafters (cluster.app:build_drafter_app)
    Ingress (HTTP, gRPC, handle) ──handle──► Verifier (vLLM AsyncLLM, TP bundles) ──actor calls──► drafter actors
                                                                      ──handle (attach)──► Drafter (1..M replicas)

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
    eagle-cluster args (verifier, speculative_      the Verifier (a new vLLM engine) and the Ingress
      config, ingress)
    the target or head path                         both applications (both name it)

Both builders validate their ``args`` (errors name the field; model paths come out absolute, ``cluster.config``).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from cluster.config import DRAFTER_DEPLOYMENT, DrafterPoolConfig, EagleClusterConfig
from cluster.drafter_pool.router import SequenceAffinityRouter
from cluster.drafter_pool.server import DrafterServer
from cluster.ingress import Ingress
from cluster.verifier_server import VerifierServer

VERIFIER = "Verifier"
INGRESS = "Ingress"


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
    return serve.deployment(DrafterServer).options(**drafter_opts).bind(
        d.head, d.target, d.max_model_len, d.num_threads,
        d.async_drafting.for_drafter(), actor_opts, d.cpu_affinity, d.for_engine(), d.timeout_s,
    )


def build_app(args: dict[str, Any]) -> Application:
    """The verifier and its ingress; drafts come from the drafter application named ``drafter_app``."""
    cfg = EagleClusterConfig.model_validate(args)
    v = cfg.verifier
    bundle = {"GPU": 1, "CPU": v.num_cpus} if v.accelerator == "gpu" else {"CPU": v.num_cpus}
    bundle.update(v.resources)
    verifier = serve.deployment(VerifierServer).options(
        name=VERIFIER,
        num_replicas=v.num_replicas,
        ray_actor_options={"num_cpus": v.num_cpus, "num_gpus": v.replica_gpus},  # the replica runs in bundle 0
        placement_group_bundles=[dict(bundle) for _ in range(v.tensor_parallel_size)],
        placement_group_strategy="STRICT_PACK",
        health_check_period_s=10,
        max_ongoing_requests=max(64, 2 * v.max_num_seqs),
    ).bind(v.model_dump(), cfg.speculative_config.model_dump(), cfg.drafter_app)

    ingress = serve.deployment(serve.ingress()(Ingress)).options(
        name=INGRESS,
        num_replicas=cfg.ingress.num_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(1000, 2 * cfg.ingress.max_inflight_requests),  # over it, Serve would queue
    ).bind(verifier, ingress_args(cfg), v.name)
    return ingress


def ingress_args(cfg: EagleClusterConfig) -> dict[str, Any]:
    """The ingress section, with the image limit defaulting to the verifier engine's ``limit_mm_per_prompt``."""
    out = cfg.ingress.model_dump()
    limit = (cfg.verifier.engine_kwargs.get("limit_mm_per_prompt") or {})
    if out["max_images_per_request"] is None and isinstance(limit, dict) and isinstance(limit.get("image"), int):
        out["max_images_per_request"] = limit["image"]
    return out
