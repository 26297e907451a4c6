"""Every YAML in deploy/ validates, both applications (GPU ones without running); bad configs are refused naming
the field."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig, DrafterSettings
from cluster import deploy_yaml
from cluster.config import DRAFTER_APP_NAME, DrafterPoolConfig, EagleClusterConfig
from tests.cluster.configs import CPU, POOL, app_args, config_error
from tests.conftest import EAGLE1, EAGLE3, ROOT, TARGET

YAMLS = sorted((ROOT / "deploy").glob("*.yaml"))
@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_deploy_yaml_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = EagleClusterConfig.model_validate(app_args(path))
    assert cfg.speculative_config.num_speculative_tokens >= 1
    assert cfg.speculative_config.num_speculative_tokens_per_batch_size == "auto"  # k per step, the shipped default
    pool = DrafterPoolConfig.model_validate(app_args(path, DRAFTER_APP_NAME))
    assert (pool.target, pool.head) == (cfg.verifier.model, cfg.speculative_config.model)  # the same models
    assert pool.max_model_len >= cfg.verifier.max_model_len


def test_there_are_cpu_and_gpu_configs():
    kinds = {EagleClusterConfig.model_validate(app_args(p)).verifier.accelerator for p in YAMLS}
    assert kinds == {"cpu", "gpu"}
    tp = {p.name: EagleClusterConfig.model_validate(app_args(p)).verifier.tensor_parallel_size for p in YAMLS}
    assert tp["llama4-scout-eagle-tp4.yaml"] == 4 and tp["llama4-maverick-eagle3-tp8.yaml"] == 8


def test_seed_json_pastes_as_is():
    """Seed PR #20591's speculative JSON, with its `prefill_token_shift`, which this vLLM no longer has."""
    args = copy.deepcopy(CPU)
    args["speculative_config"] = {"method": "eagle", "model": str(EAGLE1), "prefill_token_shift": False,
                                  "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1, "max_model_len": 1024}
    cfg = EagleClusterConfig.model_validate(args)
    assert "prefill_token_shift" not in cfg.speculative_config.for_vllm()


def _pool(**drafter) -> DrafterPoolConfig:
    return DrafterPoolConfig.model_validate({**POOL, **drafter})


def _pool_error(**drafter) -> str:
    return config_error({**POOL, **drafter}, DrafterPoolConfig)


@pytest.mark.parametrize(
    ("path", "value", "expect"),
    [
        (("speculative_config", "num_speculative_tokens"), 0, "speculative_config.num_speculative_tokens"),
        (("speculative_config", "method"), "medusa", "speculative_config.method"),
        (("speculative_config", "typo_key"), 1, "unknown key 'typo_key'"),
        (("verifier", "tensor_parallel_size"), 3, "tensor_parallel_size: 3 does not divide the target's 8"),
        (("verifier", "max_num_seqs"), -1, "verifier.max_num_seqs"),
        (("verifier", "nonsense"), 1, "verifier.nonsense"),
        (("speculative_config", "method"), "eagle", "but"),  # an EAGLE-3 head declared as EAGLE
        (("verifier", "engine_spin_s"), 0, "verifier.engine_spin_s"),  # a busy loop of 0 loses vLLM's wake-ups
        (("verifier", "hidden_transport"), "nvlink", "verifier.hidden_transport"),
    ],
)
def test_bad_config_names_the_field(path, value, expect):
    args = copy.deepcopy(CPU)
    args.setdefault(path[0], {})[path[1]] = value
    assert expect in config_error(args)


def test_drafter_for_another_target(toy_heads):
    _, heads = toy_heads
    args = copy.deepcopy(CPU)
    args["speculative_config"] = {"method": "eagle", "model": str(heads["eagle1"]), "num_speculative_tokens": 3}
    msg = config_error(args)
    assert "speculative_config.model" in msg and "vocab_size 300 != the target's vocab_size 4096" in msg
    msg = _pool_error(head=str(heads["eagle1"]))
    assert "head" in msg and "vocab_size 300 != the target's vocab_size 4096" in msg


@pytest.mark.parametrize(("field", "value"), [("num_gpus", -1), ("max_model_len", 8), ("timeout_s", 0),
                                              ("nonsense", 1)])
def test_bad_drafter_config_names_the_field(field, value):
    assert field in _pool_error(**{field: value})


def test_autoscaling_and_fixed_replicas_exclusive():
    assert "not both" in _pool_error(num_replicas=2, autoscaling_config={"min_replicas": 1, "max_replicas": 2})
    assert "min_replicas 3 > max_replicas 2" in _pool_error(autoscaling_config={"min_replicas": 3, "max_replicas": 2})


# The generator's own version, stamped into the stubs: it follows whatever grpcio-tools PyPI has today, so the
# comparison below is of what the .proto generates, not of which protoc generated it.
_GENERATOR_VERSION = re.compile(
    r"(?<=# Protobuf Python Version: )\S+"
    r"|(?<=GRPC_GENERATED_VERSION = ')[^']+"
    r"|(?<=_runtime_version\.Domain\.PUBLIC,\n)\s+\d+,\n\s+\d+,\n\s+\d+,\n\s+'[^']*',")


def _without_generator_version(text: str) -> str:
    return _GENERATOR_VERSION.sub("<version>", text)


def test_generator_version_is_masked():
    for name in ("eagle_cluster_pb2.py", "eagle_cluster_pb2_grpc.py"):
        shipped = (ROOT / "cluster/proto" / name).read_text()
        bumped = re.sub(r"(\d+)\.(\d+)\.(\d+)", r"\1.\2.99", shipped).replace("    35,\n", "    36,\n")
        assert bumped != shipped
        assert _without_generator_version(bumped) == _without_generator_version(shipped), name
        renamed = shipped.replace("eagle_cluster", "eagle_clutter")  # what the .proto generates: still compared
        assert _without_generator_version(renamed) != _without_generator_version(shipped), name


def test_grpc_stubs_are_current(tmp_path):
    from grpc_tools import protoc

    rc = protoc.main(["protoc", f"-Icluster/proto={ROOT / 'deploy'}", f"--python_out={tmp_path}",
                      f"--grpc_python_out={tmp_path}", "cluster/proto/eagle_cluster.proto"])
    assert rc == 0
    for name in ("eagle_cluster_pb2.py", "eagle_cluster_pb2_grpc.py"):
        generated = (tmp_path / "cluster/proto" / name).read_text()
        shipped = (ROOT / "cluster/proto" / name).read_text()
        assert _without_generator_version(generated) == _without_generator_version(shipped), name


def test_async_drafting_config():
    assert _pool().async_drafting.for_drafter() is None  # off by default
    assert _pool(async_drafting={"enabled": True}).async_drafting.for_drafter() == BranchConfig(
        bonus_fanout=2, recovered_fanout=1, max_branch_rows=32)
    assert "bonus_fanout" in _pool_error(async_drafting={"enabled": True, "bonus_fanout": 0})
    assert "max_branch_rows" in _pool_error(async_drafting={"enabled": True, "max_branch_rows": -1})


def test_pool_builds_the_drafter_settings():
    """One validated pool config gives the drafter's frozen settings, every field mapped (what each replica binds)."""
    pool = _pool(max_model_len=256, num_threads=2, cpu_affinity=[1, 3], dtype="float32", max_num_seqs=8,
                 kv_cache_gib=1.5, idle_slot_ttl_s=60, max_speculative_tokens=5,
                 async_drafting={"enabled": True, "bonus_fanout": 3}, enforce_eager=True, cuda_graph_max_batch=64)
    branches = BranchConfig(bonus_fanout=3, recovered_fanout=1, max_branch_rows=32)
    assert pool.for_drafter() == DrafterSettings(
        pool.head, pool.target, DrafterEngineConfig(max_model_len=256, max_num_seqs=8, kv_cache_gib=1.5,
                                                    idle_slot_ttl_s=60, max_k=5, branches=branches,
                                                    enforce_eager=True, cuda_graph_max_batch=64),
        num_threads=2, cpu_affinity=(1, 3), dtype="float32")
    assert "cuda_graph_max_batch" in _pool_error(cuda_graph_max_batch=0)
    assert _pool().for_drafter().engine == DrafterEngineConfig()  # the pool's defaults are the engine's


def test_drafter_cpu_affinity_is_checked():
    assert _pool(cpu_affinity=[1]).cpu_affinity == [1]
    for bad in ([], [-1]):
        assert "cpu_affinity" in _pool_error(cpu_affinity=bad)


def test_autoscaling_config_is_checked():
    assert "look_back_period_s" in _pool_error(autoscaling_config={"look_back_period_s": 1, "metrics_interval_s": 2})
    assert "target_sequences_per_replica" in _pool_error(autoscaling_config={"target_sequences_per_replica": 0})


def test_model_paths_resolve_wherever_ray_started(monkeypatch, tmp_path):
    """A YAML's relative model paths: the current directory first, else the project's folder; hub ids kept."""
    monkeypatch.chdir(tmp_path)  # as if `ray start` ran here
    cfg = EagleClusterConfig.model_validate(app_args(ROOT / "deploy" / "cpu.yaml"))
    assert cfg.verifier.model == str(ROOT / "models" / "llama4-tiny")
    assert cfg.speculative_config.model == str(ROOT / "models" / "eagle3-llama4-tiny")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "llama4-tiny").symlink_to(TARGET, target_is_directory=True)
    cfg = EagleClusterConfig.model_validate(app_args(ROOT / "deploy" / "cpu.yaml"))
    assert cfg.verifier.model == str(tmp_path / "models" / "llama4-tiny")  # a runtime_env working_dir wins
    hub = EagleClusterConfig.model_validate({**CPU, "verifier": {"model": "meta-llama/Llama-4-Scout-17B-16E"}})
    assert hub.verifier.model == "meta-llama/Llama-4-Scout-17B-16E"
    pool = DrafterPoolConfig.model_validate(app_args(ROOT / "deploy" / "cpu.yaml", DRAFTER_APP_NAME))
    assert (pool.target, pool.head) == (str(tmp_path / "models" / "llama4-tiny"), str(EAGLE3))


def test_grpc_needs_a_key_or_an_explicit_opt_in():
    """Serve's gRPC proxy listens on all interfaces: gRPC without a key is refused unless asked for by name."""
    args = copy.deepcopy(CPU)
    args["ingress"] = {"grpc": {"enabled": True}}
    msg = config_error(args)
    assert "ingress.api_key" in msg and "allow_unauthenticated" in msg
    args["ingress"] = {"grpc": {"enabled": True}, "api_key": "k"}
    assert EagleClusterConfig.model_validate(args).ingress.grpc.enabled
    args["ingress"] = {"grpc": {"enabled": True, "allow_unauthenticated": True}}
    assert EagleClusterConfig.model_validate(args).ingress.api_key is None
    args["ingress"] = {"api_key": ""}
    assert "ingress.api_key" in config_error(args)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_a_yaml_starts_grpc_only_for_an_app_that_serves_it(path, monkeypatch):
    """A YAML with Serve's ``grpc_options`` opens a port on all interfaces: its app must turn gRPC on (and so have
    a key or the opt-in); one without must not claim gRPC."""
    monkeypatch.chdir(ROOT)
    doc = yaml.safe_load(path.read_text())
    serves_grpc = bool((doc.get("grpc_options") or {}).get("grpc_servicer_functions"))
    assert EagleClusterConfig.model_validate(app_args(path)).ingress.grpc.enabled == serves_grpc


def test_test_servers_grpc_config_validates(tmp_path):
    from cluster.harness import cpu_yaml

    for ingress in ({}, {"api_key": "k"}):
        doc = yaml.safe_load(cpu_yaml(tmp_path / "app.yaml", grpc=True, ingress=ingress).read_text())
        cfg = EagleClusterConfig.model_validate(deploy_yaml.app_args(doc))
        assert cfg.ingress.grpc.enabled and doc["grpc_options"]["grpc_servicer_functions"]
        assert cfg.ingress.grpc.allow_unauthenticated == (ingress == {})


def test_metrics_behind_a_key_needs_a_key():
    args = copy.deepcopy(CPU)
    args["ingress"] = {"metrics_require_api_key": True}
    assert "ingress.metrics_require_api_key" in config_error(args)
    args["ingress"]["api_key"] = "k"
    assert EagleClusterConfig.model_validate(args).ingress.metrics_require_api_key


@pytest.mark.parametrize("field", ["max_body_bytes", "max_n", "max_inflight_requests", "retry_after_s"])
def test_admission_limits_name_the_field(field):
    args = copy.deepcopy(CPU)
    args["ingress"] = {field: 0}
    assert f"ingress.{field}" in config_error(args)


def test_drafter_engine_options():
    """dtype, slot cap and memory cap reach ``DrafterActor`` in the settings the pool builds (``auto``: it decides);
    the actor takes those settings whole."""
    import inspect

    from actors.drafter.actor import DrafterActor

    default = _pool().for_drafter()
    assert default.dtype is None
    assert (default.engine.max_num_seqs, default.engine.kv_cache_gib, default.engine.idle_slot_ttl_s,
            default.engine.max_k) == (1024, None, 300, 16)
    opts = _pool(dtype="bfloat16", max_num_seqs=64, kv_cache_gib=2.5, idle_slot_ttl_s=None,
                 max_speculative_tokens=4).for_drafter()
    assert opts.dtype == "bfloat16"
    assert (opts.engine.max_num_seqs, opts.engine.kv_cache_gib, opts.engine.idle_slot_ttl_s,
            opts.engine.max_k) == (64, 2.5, None, 4)
    assert inspect.signature(DrafterActor).parameters["settings"].annotation in (DrafterSettings, "DrafterSettings")
    for bad in ({"dtype": "int8"}, {"max_num_seqs": 0}, {"kv_cache_gib": 0}, {"idle_slot_ttl_s": 0},
                {"max_speculative_tokens": 17}):
        assert next(iter(bad)) in _pool_error(**bad)


def test_gpu_engines_leave_the_cpu_settings_behind():
    """float32 and eager mode are vLLM-CPU settings (``actors.vllm_engine``); a GPU verifier gets the model's dtype
    and CUDA graphs unless its ``engine_kwargs`` say otherwise."""
    cpu = EagleClusterConfig.model_validate(CPU).verifier
    assert cpu.vllm_engine_kwargs() == {}
    gpu = EagleClusterConfig.model_validate({**CPU, "verifier": {"model": str(TARGET), "accelerator": "gpu"}}).verifier
    assert gpu.vllm_engine_kwargs() == {"dtype": "auto", "enforce_eager": False}
    scout = EagleClusterConfig.model_validate(app_args(ROOT / "deploy" / "llama4-scout-eagle-tp4.yaml")).verifier
    assert scout.vllm_engine_kwargs() == {"dtype": "bfloat16", "enforce_eager": False, "max_num_batched_tokens": 80000,
                                          "distributed_executor_backend": "ray"}
