"""``build_app`` hands each deployment only its own sections of the config, so that ``serve deploy`` of a
changed YAML restarts only what the change touches (Serve restarts a deployment whose constructor arguments
changed). The long-lived check with real processes is ``test_serve_deploy.py``."""

from __future__ import annotations

import copy

from cluster.app import build_app
from tests.cluster.test_config import CPU


def _init_args(args: dict) -> dict[str, tuple]:
    """Each deployment's constructor arguments, other deployments' handles left out."""
    ingress = build_app(args)._bound_deployment  # Serve's Application keeps the bound deployment privately
    verifier = ingress.init_args[0]._bound_deployment
    drafter = verifier.init_args[-1]._bound_deployment
    return {"Ingress": ingress.init_args[1:], "Verifier": verifier.init_args[:-1], "Drafter": drafter.init_args}


def test_a_drafter_change_leaves_verifier_and_ingress_args_alone():
    before = _init_args(CPU)
    changed = copy.deepcopy(CPU)
    changed["drafter"] = {"num_replicas": 2, "num_cpus": 0.25, "timeout_s": 3.0,
                          "async_drafting": {"enabled": True, "max_branch_rows": 8}}
    after = _init_args(changed)
    assert after["Verifier"] == before["Verifier"]
    assert after["Ingress"] == before["Ingress"]
    assert after["Drafter"] != before["Drafter"]
    assert 3.0 in after["Drafter"]  # the draft-call timeout reaches verifiers through the drafters' attach


def test_a_target_change_restarts_the_verifier_and_the_drafters(tmp_path):
    target = tmp_path / "target"
    target.symlink_to(CPU["verifier"]["model"], target_is_directory=True)
    before = _init_args(CPU)
    after = _init_args({**CPU, "verifier": {"model": str(target), "served_model_name": "llama4-tiny"}})
    assert after["Verifier"] != before["Verifier"]
    assert after["Drafter"] != before["Drafter"]
    assert after["Ingress"] == before["Ingress"]


def test_an_ingress_change_touches_the_ingress_only():
    before = _init_args(CPU)
    after = _init_args({**CPU, "ingress": {"api_key": "k"}})
    assert after["Ingress"] != before["Ingress"]
    assert (after["Verifier"], after["Drafter"]) == (before["Verifier"], before["Drafter"])
