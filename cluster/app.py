"""The app builder for ``serve run`` / ``serve deploy`` (``import_path: cluster.app:build_app``).

    Ingress (HTTP, gRPC, handle) ──handle──► Verifier (vLLM AsyncLLM, TP bundles) ──actor calls──► drafter actors
                                                                                 ──handle (attach)──► Drafter (1..M)

Each drafter replica owns the drafter actor its bundle's resources go to (``cluster.drafter_server``); verifiers
learn the actors through ``attach``, routed by ``cluster.drafter_router.SequenceAffinityRouter``, and call them
straight. With ``autoscaling_config`` the pool scales with ``cluster.drafter_autoscaling.DrafterLoadPolicy``.

``build_app(args)`` validates the YAML ``args:`` block into ``EagleClusterConfig`` (errors name the field), turns
relative model paths into absolute ones (replicas do not share the CLI's working directory), and binds the three
deployments, handing each its downstream handle as a constructor argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from cluster.config import EagleClusterConfig
from cluster.drafter_server import DrafterServer
from cluster.ingress import Ingress, app
from cluster.verifier_server import VerifierServer

APP_NAME = "eagle-cluster"  # the name deploy/*.yaml gives the application
DRAFTER = "Drafter"
VERIFIER = "Verifier"
INGRESS = "Ingress"


def _absolute(path: str) -> str:
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else path  # a hub id stays as it is


def resolve_paths(cfg: EagleClusterConfig) -> EagleClusterConfig:
    cfg = cfg.model_copy(deep=True)
    cfg.verifier.model = _absolute(cfg.verifier.model)
    cfg.speculative_config.model = _absolute(cfg.speculative_config.model)
    return cfg


def build_app(args: dict[str, Any]) -> Application:
    cfg = resolve_paths(EagleClusterConfig.model_validate(args))
    v, d = cfg.verifier, cfg.drafter

    # Each replica owns a drafter actor that does the drafting: the replica's placement group holds the
    # configured resources in one bundle, the replica itself takes none of them, the actor takes them all.
    actor_opts: dict[str, Any] = {"num_cpus": d.num_cpus, "num_gpus": d.num_gpus, "resources": dict(d.resources)}
    drafter_bundle = {k: v for k, v in {"CPU": d.num_cpus, "GPU": d.num_gpus, **d.resources}.items() if v}
    replica_opts: dict[str, Any] = {"num_cpus": 0}
    drafter_opts: dict[str, Any] = {
        "name": DRAFTER,
        "ray_actor_options": replica_opts,
        "health_check_period_s": 5,
        "max_ongoing_requests": d.max_ongoing_requests,
        "request_router_config": RequestRouterConfig(
            request_router_class="cluster.drafter_router:SequenceAffinityRouter",
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
    drafter = serve.deployment(DrafterServer).options(**drafter_opts).bind(
        cfg.speculative_config.model, v.model, d.max_model_len or v.max_model_len + 8, d.num_threads,
        d.async_drafting.for_drafter(), actor_opts, d.cpu_affinity, d.for_engine(),
    )

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
    ).bind(cfg.model_dump(), drafter)

    ingress = serve.deployment(serve.ingress(app)(Ingress)).options(
        name=INGRESS,
        num_replicas=cfg.ingress.num_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1000,
    ).bind(verifier, cfg.model_dump())
    return ingress
