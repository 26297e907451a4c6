"""``benchmarks.modes``: every mode name the old scripts used parses to one ``Mode``, a bad one is refused with an
error naming it, each mode's YAML changes and server command are what it says, and the launcher starts, pins and
stops a server (a fake one: no vLLM, no Ray, no ``ray stop``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import cpu, modes
from cluster.harness import HEADS
from tests.conftest import ROOT

# Every name the five old mode lists held (serving_compare, serving_pinned, pipelined_drafting, prefix_sharing,
# first_token), each still a mode.
OLD_NAMES = [
    "target-only", "colocated-eagle", "colocated-eagle3", "cluster-eagle", "cluster-eagle3", "cluster-eagle-async",
    "cluster-eagle3-async", "cluster-eagle3-haproxy", "cluster-eagle3-async-haproxy", "cluster-eagle3-sched",
    "cluster-eagle3-k0", "cluster-eagle3-k1", "cluster-eagle3-k2", "cluster-eagle3-k3", "cluster-eagle3-auto",
    "cluster-eagle3-auto-haproxy", "cluster-eagle3-grpc", "cluster-eagle3-async-grpc", "cluster-eagle3-nospin",
    "cluster-eagle3-async-nospin", "cluster-eagle3-k0-nospin", "cluster-eagle3-nodrafter", "cluster-eagle3-pyproxy",
    "cluster-eagle3-async-pyproxy", "cluster-eagle3-sync", "cluster-eagle3-uni",
]


@pytest.mark.parametrize("name", OLD_NAMES)
def test_every_old_mode_name_parses(name: str) -> None:
    mode = modes.parse(name)
    assert mode.name == name and mode.server == name.split("-")[0].replace("target", "target-only")


def test_what_a_name_sets() -> None:
    assert modes.parse("target-only") == modes.Mode("target-only", "target-only")
    assert modes.parse("colocated-eagle") == modes.Mode("colocated-eagle", "colocated", "eagle")
    m = modes.parse("cluster-eagle3-k1-async-grpc-nospin-uni-d2")
    assert (m.method, m.draft_length, m.async_drafting, m.ingress, m.engine_spin, m.uni, m.drafters) == (
        "eagle3", "k1", True, "grpc", False, True, 2)
    assert modes.parse("cluster-eagle").async_drafting is None  # as shipped
    assert modes.parse("cluster-eagle3-sync").async_drafting is False
    assert not modes.parse("cluster-eagle3-nodrafter").drafter_app
    assert modes.parse("cluster-eagle3-greedy").greedy_spin and not modes.parse("cluster-eagle3").greedy_spin


@pytest.mark.parametrize(("name", "says"), [
    ("cluster-eagle4", "method 'eagle4'"),
    ("cluster", "method ''"),
    ("vllm-eagle3", "starts with target-only"),
    ("colocated-eagle3-async", "colocated modes take no variants"),
    ("cluster-eagle3-k4", "unknown variant 'k4'"),
    ("cluster-eagle3-fast", "unknown variant 'fast'"),
    ("cluster-eagle3-k1-auto", "'k1' and 'auto' both set the draft length"),
    ("cluster-eagle3-pyproxy-grpc", "both set the ingress"),
    ("cluster-eagle3-nodrafter-async", "nodrafter serves no drafter"),
    ("cluster-eagle3-d0", "unknown variant 'd0'"),
    ("cluster-eagle3-nospin-greedy", "'nospin' and 'greedy' both set the spin"),
])
def test_a_bad_name_is_refused_naming_it(name: str, says: str) -> None:
    with pytest.raises(modes.ModeError, match=f"mode '{name}'.*{says}"):
        modes.parse(name)


def test_parse_all_names_every_bad_mode() -> None:
    with pytest.raises(modes.ModeError) as e:
        modes.parse_all(["target-only", "cluster-x", "colocated-y"])
    assert "'cluster-x'" in str(e.value) and "'colocated-y'" in str(e.value)


@pytest.mark.parametrize(("variant", "length"), [
    ("k0", [[1, 1024, 0]]), ("k2", [[1, 1024, 2]]), ("k3", None), ("auto", "auto"), ("sched", modes.SCHEDULE)])
def test_draft_length_variants(variant: str, length: object) -> None:
    changes = modes.yaml_changes(modes.parse(f"cluster-eagle3-{variant}"), "none")
    assert changes["speculative_config"] == {"method": "eagle3", "model": str(HEADS["eagle3"]),
                                             modes.DRAFT_LENGTH_KEY: length}


def test_shipped_cluster_mode_changes_only_the_head() -> None:
    changes = modes.yaml_changes(modes.parse("cluster-eagle"), "none")
    assert changes == {"drafter": {}, "drafter_app": True,
                       "speculative_config": {"method": "eagle", "model": str(HEADS["eagle"])}}


def test_strict_pinning_async_settings_pool_and_engine_variants() -> None:
    changes = modes.yaml_changes(modes.parse("cluster-eagle3-async-nospin-uni-d2"), "strict", {"bonus_fanout": 3})
    assert changes["drafter"] == {"async_drafting": {"bonus_fanout": 3, "enabled": True}, "num_replicas": 2,
                                  "num_cpus": 0.5, "cpu_affinity": [1]}
    assert changes["verifier"] == {"engine_spin_s": None,
                                   "engine_kwargs": {"distributed_executor_backend": "uni"}}


def test_vllm_servers() -> None:
    target = modes.server(modes.parse("target-only"), "none", Path("/nonexistent"))
    assert "--speculative-config" not in target.cmd and target.base.endswith(f":{modes.VLLM_PORT}")
    assert target.env == modes.BASE_ENV
    colo = modes.server(modes.parse("colocated-eagle3"), "strict", Path("/nonexistent"))
    spec = colo.cmd[colo.cmd.index("--speculative-config") + 1]
    assert '"method": "eagle3"' in spec and '"num_speculative_tokens": 3' in spec
    assert colo.env == {**modes.BASE_ENV, **modes.STRICT_ENV}
    with pytest.raises(ValueError, match="YAML overrides are for cluster modes"):
        modes.server(modes.parse("target-only"), "none", Path("/x"), overrides={"ingress": {}})
    with pytest.raises(ValueError, match="pinning 'pinned'"):
        modes.server(modes.parse("target-only"), "pinned", Path("/x"))


def test_a_cluster_server_writes_its_yaml(tmp_path: Path) -> None:
    mode = modes.parse("cluster-eagle3-k1-pyproxy-nodrafter")
    s = modes.server(mode, "strict", tmp_path, overrides={"ingress": {"max_inflight_requests": 8},
                                                          "drafter": {"num_cpus": 0.25}})
    assert s.cmd[-2:] == ["run", str(tmp_path / "cluster-eagle3-k1-pyproxy-nodrafter-strict.yaml")]
    assert s.env["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and s.env["OMP_NUM_THREADS"] == "1"
    doc = yaml.safe_load(Path(s.cmd[-1]).read_text())
    assert [a["name"] for a in doc["applications"]] == ["eagle-cluster"]  # nodrafter
    args = doc["applications"][0]["args"]
    assert args["speculative_config"][modes.DRAFT_LENGTH_KEY] == [[1, 1024, 1]]
    assert args["ingress"]["max_inflight_requests"] == 8
    full = yaml.safe_load(Path(modes.server(modes.parse("cluster-eagle-d2"), "strict", tmp_path,
                                            overrides={"drafter": {"num_cpus": 0.25}}).cmd[-1]).read_text())
    pool = full["applications"][1]["args"]
    assert (pool["num_replicas"], pool["num_cpus"], pool["cpu_affinity"]) == (2, 0.25, [1])
    assert pool["head"] == str(HEADS["eagle"])


def test_max_model_len_in_every_mode(tmp_path: Path) -> None:
    from cluster import deploy_yaml

    shipped = deploy_yaml.app_args(deploy_yaml.load())["verifier"]["max_model_len"]
    target = modes.server(modes.parse("target-only"), "none", tmp_path).cmd
    assert int(target[target.index("--max-model-len") + 1]) == shipped == modes.CPU_MAX_MODEL_LEN
    target = modes.server(modes.parse("target-only"), "none", tmp_path, max_model_len=4096).cmd
    assert target[target.index("--max-model-len") + 1] == "4096"
    doc = yaml.safe_load(Path(modes.server(modes.parse("cluster-eagle3-nospin"), "strict", tmp_path,
                                           max_model_len=4096).cmd[-1]).read_text())
    verifier, pool = doc["applications"][0]["args"]["verifier"], doc["applications"][1]["args"]
    assert (verifier["max_model_len"], pool["max_model_len"]) == (4096, 4096)
    assert verifier["engine_spin_s"] is None and verifier["max_num_seqs"] == 32  # merged into, not replaced


def test_greedy_spins_through_contention(tmp_path: Path) -> None:
    env = modes.server(modes.parse("cluster-eagle3-greedy"), "none", tmp_path).env
    assert env["EAGLE_CLUSTER_ENGINE_GREEDY_SPIN"] == "1"
    assert "EAGLE_CLUSTER_ENGINE_GREEDY_SPIN" not in modes.server(modes.parse("cluster-eagle3"), "none", tmp_path).env


def test_ingress_env() -> None:
    assert modes.ingress_env("haproxy") == {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert modes.ingress_env("grpc") == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_PROXY_USE_GRPC": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_stop(proc: subprocess.Popen) -> float:
    """``cluster.harness.stop`` without its ``ray stop --force`` (which would end any Ray on this machine)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return 0.0


def test_the_launcher_starts_pins_and_stops_a_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cluster.harness

    port = free_port()
    fake = modes.Server([sys.executable, "-m", "tests.benchmarks.fake_server", str(port)], f"http://127.0.0.1:{port}",
                        {"FAKE": "1"})
    monkeypatch.setattr(modes, "server", lambda *a, **kw: fake)
    monkeypatch.setattr(cluster.harness, "stop", fake_stop)
    monkeypatch.setattr(cluster.harness, "PROJECT_ROOT", ROOT)
    with modes.launch(modes.parse("target-only"), "strict", tmp_path) as srv:
        assert srv.base == fake.base and srv.log == tmp_path / "target-only-strict.log"
        assert srv.pinned == {"serving path": [srv.proc.pid]}  # the server root is the serving path: core 0
        assert os.sched_getaffinity(srv.proc.pid) == cpu.STRICT["serving path"]
        proc = srv.proc
    assert proc.poll() is not None  # stopped on exit
    with modes.launch(modes.parse("target-only"), "none", tmp_path) as srv:
        assert srv.pinned == {}


def test_a_cluster_is_pinned_once_its_drafter_process_exists() -> None:
    """``launch`` waits for the drafter's processes before pinning: one started late is found; none is an error."""
    late_child = ("import subprocess, sys, time\nsys.stdin.readline()\n"  # the drafter starts when the test says
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', 'ray::Drafter' + 'Actor'])\n"
                  "time.sleep(30)\n")
    parent = subprocess.Popen([sys.executable, "-c", late_child], stdin=subprocess.PIPE, start_new_session=True)
    try:
        assert not any(p.group == "drafter" for p in cpu.server_processes(parent.pid))
        with pytest.raises(RuntimeError, match="no drafter process under pid"):
            modes.wait_for_group(parent.pid, "drafter", timeout_s=0.3, poll_s=0.1)
        assert parent.stdin is not None
        parent.stdin.write(b"start\n")
        parent.stdin.flush()
        modes.wait_for_group(parent.pid, "drafter", timeout_s=120, poll_s=0.1)
        assert any(p.group == "drafter" for p in cpu.server_processes(parent.pid))
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
