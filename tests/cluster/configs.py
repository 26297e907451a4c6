"""Config documents and built applications that several cluster tests read: the least CPU config, the deploy
YAMLs' application args, a refused config's message, and a built drafter application's ``Drafter`` deployment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster import deploy_yaml
from cluster.app import DRAFTER_FRONT
from cluster.config import APP_NAME, EagleClusterConfig
from tests.conftest import EAGLE3, TARGET

CPU = {
    "verifier": {"model": str(TARGET)},
    "speculative_config": {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3},
}
POOL = {"target": str(TARGET), "head": str(EAGLE3)}  # the drafter application's args, at their least


def app_args(path: Path, name: str = APP_NAME) -> dict:
    doc = deploy_yaml.load(path)
    assert [a["import_path"] for a in doc["applications"]] == ["cluster.app:build_app", "cluster.app:build_drafter_app"]
    return deploy_yaml.app_args(doc, name)


def config_error(args, schema: type = EagleClusterConfig) -> str:
    """The message of the ValidationError that ``schema`` raises for ``args`` (fails if none)."""
    with pytest.raises(ValidationError) as e:
        schema.model_validate(args)
    return str(e.value)


def drafter_deployment(app):
    """The ``Drafter`` deployment of a built drafter application, behind its plain front when Serve's HAProxy
    ingress is on (``cluster.app.build_drafter_app``)."""
    bound = app._bound_deployment  # Serve keeps it privately
    return bound.init_args[0]._bound_deployment if bound.name == DRAFTER_FRONT else bound
