"""``cluster.serve_env``: the Serve defaults every way of starting the product applies, and a value already set wins."""

from __future__ import annotations

import os
import subprocess
import sys

from cluster import serve_env
from tests.conftest import ROOT


def test_defaults_apply_where_unset_and_a_set_value_wins():
    env = serve_env.environment({"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1", "OTHER": "x"})
    assert env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1" and env["OTHER"] == "x"
    assert env[serve_env.HAPROXY] == "1" and env["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == "1000"
    assert serve_env.haproxy_enabled(env) and not serve_env.haproxy_enabled({serve_env.HAPROXY: "0"})


def test_serve_reads_every_default_by_name():
    """Serve reads each from the environment at import (``ray.serve._private.constants``); a name Serve dropped would
    leave its default silently unused."""
    import ray.serve._private.constants as constants

    assert {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"} <= set(serve_env.DEFAULTS)
    source = open(constants.__file__).read()
    assert all(f'"{name}"' in source for name in serve_env.DEFAULTS)


def test_module_runs_a_command_with_the_defaults_and_a_set_value_wins():
    name = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
    show = [sys.executable, "-m", "cluster.serve_env", sys.executable, "-c", f"import os; print(os.environ['{name}'])"]
    base = {k: v for k, v in os.environ.items() if k != name}
    out = subprocess.run(show, cwd=ROOT, env=base, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == serve_env.DEFAULTS[name], out.stderr
    out = subprocess.run(show, cwd=ROOT, env={**base, name: "30"}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "30", out.stderr
    usage = subprocess.run([sys.executable, "-m", "cluster.serve_env"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 1 and "usage" in usage.stderr
