"""``verifier.engine_kwargs`` that the remote drafter cannot work with are refused by the config, naming the key
(``actors.verifier.options``)."""

from __future__ import annotations

import copy

import pytest

from tests.cluster.configs import CPU, config_error


@pytest.mark.parametrize(("key", "value"), [("async_scheduling", True), ("pipeline_parallel_size", 2)])
def test_refused(key, value):
    args = copy.deepcopy(CPU)
    args["verifier"]["engine_kwargs"] = {key: value}
    assert f"verifier.engine_kwargs.{key}: " in config_error(args)


def test_off_and_one_pass():
    from cluster.config import EagleClusterConfig

    args = copy.deepcopy(CPU)
    args["verifier"]["engine_kwargs"] = {"async_scheduling": False, "pipeline_parallel_size": 1}
    EagleClusterConfig.model_validate(args)
