"""The two applications ``cluster.app`` builds: what each deployment is bound with, and that the YAML's two
``args`` blocks are independent, so that ``serve deploy`` of a changed drafter block restarts no verifier (Serve
versions an application's deployments by a hash of that application's whole ``args``). The long-lived check with
real processes is ``test_serve_deploy.py``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeDeploySchema

from actors.engine_spin import DEFAULT_SPIN_S, SPIN_ENV
from cluster import deploy_yaml, serve_env
from cluster.app import DRAFTER_FRONT, build_app, build_drafter_app
from cluster.config import APP_NAME, DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT
from cluster.drafter_pool.router import SequenceAffinityRouter
from tests.cluster.configs import drafter_deployment


def _versions(doc: dict) -> dict[str, str]:
    """Serve's code version of each application of a deploy YAML (what decides whether its replicas restart)."""
    return {app.name: get_app_code_version(app) for app in ServeDeploySchema.model_validate(doc).applications}


def test_a_drafter_change_leaves_the_verifier_application_alone():
    doc = deploy_yaml.load()
    changed = deploy_yaml.with_changes(doc, drafter={"num_replicas": 2, "timeout_s": 3.0,
                                                     "async_drafting": {"enabled": True}})
    before, after = _versions(doc), _versions(changed)
    assert after[APP_NAME] == before[APP_NAME]
    assert after[DRAFTER_APP_NAME] != before[DRAFTER_APP_NAME]


def test_a_target_change_restarts_both_applications(tmp_path):
    doc = deploy_yaml.load()
    changed = deploy_yaml.with_changes(doc, verifier={"model": str(tmp_path / "target")})
    before, after = _versions(doc), _versions(changed)
    assert after[APP_NAME] != before[APP_NAME] and after[DRAFTER_APP_NAME] != before[DRAFTER_APP_NAME]


def test_the_verifier_reaches_the_drafter_application_by_name():
    doc = deploy_yaml.with_changes(deploy_yaml.load(), absolute=True)
    verifier = build_app(deploy_yaml.app_args(doc, APP_NAME))._bound_deployment  # Serve keeps it privately
    assert verifier.name == "Verifier" and verifier.init_args[0].drafter_app == DRAFTER_APP_NAME
    drafter = drafter_deployment(build_drafter_app(deploy_yaml.app_args(doc, DRAFTER_APP_NAME)))
    assert drafter.name == DRAFTER_DEPLOYMENT
    # the draft-call timeout and the target sequences per replica, handed to verifiers through attach
    assert drafter.init_args[2:] == (10.0, 16)


@pytest.mark.parametrize("haproxy", [True, False], ids=["haproxy", "python-proxy"])
def test_the_drafter_application_has_a_plain_front_under_haproxy_only(monkeypatch, haproxy):
    """Serve's HAProxy ingress refuses an application whose ingress has a custom router; the Python proxy routes
    to the drafters themselves."""
    monkeypatch.setenv(serve_env.HAPROXY, "1" if haproxy else "0")
    doc = deploy_yaml.with_changes(deploy_yaml.load(), absolute=True)
    ingress = build_drafter_app(deploy_yaml.app_args(doc, DRAFTER_APP_NAME))._bound_deployment
    if haproxy:
        assert ingress.name == DRAFTER_FRONT and ingress.ray_actor_options["num_cpus"] == 0
        assert ingress._deployment_config.request_router_config.get_request_router_class() is not SequenceAffinityRouter
        drafter = ingress.init_args[0]._bound_deployment
        assert drafter.name == DRAFTER_DEPLOYMENT
        assert drafter._deployment_config.request_router_config.get_request_router_class() is SequenceAffinityRouter
    else:
        assert ingress.name == DRAFTER_DEPLOYMENT


def test_drafter_application_args_are_checked():
    args = deploy_yaml.app_args(deploy_yaml.load(), DRAFTER_APP_NAME)
    with pytest.raises(ValidationError, match="head"):
        build_drafter_app({k: v for k, v in args.items() if k != "head"})
    with pytest.raises(ValidationError, match="num_replicas or autoscaling_config"):
        build_drafter_app({**args, "autoscaling_config": {"max_replicas": 2}})


def test_the_engine_spin_reaches_the_verifier_replicas_environment():
    doc = deploy_yaml.with_changes(deploy_yaml.load(), absolute=True)
    args = deploy_yaml.app_args(doc, APP_NAME)
    env = build_app(args)._bound_deployment.ray_actor_options["runtime_env"]["env_vars"]
    assert env[SPIN_ENV] == str(DEFAULT_SPIN_S)  # on unless the YAML says null
    args = {**args, "verifier": {**args["verifier"], "engine_spin_s": 0.01}}
    env = build_app(args)._bound_deployment.ray_actor_options["runtime_env"]["env_vars"]
    assert env[SPIN_ENV] == "0.01" and env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    args["verifier"]["engine_spin_s"] = None
    assert SPIN_ENV not in build_app(args)._bound_deployment.ray_actor_options["runtime_env"]["env_vars"]
