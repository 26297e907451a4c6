"""``eagle-cluster serve``'s command line (no engine): vLLM's flags parsed by vLLM's parser and mapped onto the two
applications' ``args``, every flag the cluster cannot honour refused by name, the pool's own flags, and the
``--write-config`` YAML validated by ``cluster.config`` and Serve's own schema."""

from __future__ import annotations

import tomllib

import pytest
import yaml

from cluster import cli, deploy_yaml
from cluster.config import APP_NAME, DRAFTER_APP_NAME, DrafterPoolConfig, EagleClusterConfig
from tests.conftest import EAGLE1, EAGLE3, ROOT, TARGET

SPEC = '{"method": "eagle3", "model": "models/eagle3-llama4-tiny", "num_speculative_tokens": 3}'
BASE = ["models/llama4-tiny", "--speculative-config", SPEC, "--max-model-len", "1024"]


@pytest.fixture(scope="module")
def parser():
    return cli.make_parser()


def config(parser, *extra: str) -> dict:
    return cli.to_config(parser, parser.parse_args([*BASE, *extra]))


def both(doc: dict) -> tuple[EagleClusterConfig, DrafterPoolConfig]:
    return (EagleClusterConfig.model_validate(deploy_yaml.app_args(doc, APP_NAME)),
            DrafterPoolConfig.model_validate(deploy_yaml.app_args(doc, DRAFTER_APP_NAME)))


def test_the_issue_command_line_is_the_cpu_default(parser):
    doc = config(parser)
    main, pool = both(doc)
    assert doc["http_options"] == {"host": "127.0.0.1", "port": 8000}
    assert main.verifier.model == str(TARGET) and main.verifier.max_model_len == 1024
    assert main.verifier.name == "models/llama4-tiny"  # vLLM's default served name: the model as given
    assert main.speculative_config.for_vllm() == {"method": "eagle3", "model": str(EAGLE3),
                                                  "num_speculative_tokens": 3}
    assert main.verifier.engine_kwargs == {}  # no flag set away from vLLM's default
    assert (pool.target, pool.head, pool.max_model_len) == (str(TARGET), str(EAGLE3), 1024)
    cpu = both(deploy_yaml.load())  # deploy/cpu.yaml: the same verifier and head, and k per step (``auto``)
    shipped = cpu[0].speculative_config.for_vllm()
    assert shipped.pop("num_speculative_tokens_per_batch_size") == "auto"
    assert (cpu[0].verifier.model, shipped) == (main.verifier.model, main.speculative_config.for_vllm())


def test_the_readme_command_line_is_the_cpu_default(parser):
    """The one line in README: the issue's, with the shipped draft-length key in the JSON (vLLM's meaning of a JSON
    without it is kept: k = num_speculative_tokens at every step)."""
    spec = SPEC[:-1] + ', "num_speculative_tokens_per_batch_size": "auto"}'
    main, _ = both(cli.to_config(parser, parser.parse_args(["models/llama4-tiny", "--speculative-config", spec,
                                                             "--max-model-len", "1024"])))
    cpu, _ = both(deploy_yaml.load())
    assert main.speculative_config.for_vllm() == cpu.speculative_config.for_vllm()
    assert (main.verifier.model, main.verifier.max_model_len) == (cpu.verifier.model, cpu.verifier.max_model_len)


def test_the_draft_length_key_passes_through(parser):
    """``num_speculative_tokens_per_batch_size`` in ``--speculative-config`` (``auto``, or vLLM's schedule) reaches
    the config as given; a bad one is refused naming the key."""
    for value, expect in (('"auto"', "auto"), ("[[1, 4, 3], [5, 64, 0]]", [(1, 4, 3), (5, 64, 0)])):
        spec = SPEC[:-1] + f', "num_speculative_tokens_per_batch_size": {value}}}'
        main, _ = both(config(parser, "--speculative-config", spec))
        assert main.speculative_config.for_vllm()["num_speculative_tokens_per_batch_size"] == expect
    with pytest.raises((SystemExit, ValueError)) as e:
        both(config(parser, "--speculative-config", SPEC[:-1] + ', "num_speculative_tokens_per_batch_size": "x"}'))
    assert "num_speculative_tokens_per_batch_size" in str(e.value)


def test_vllm_flags_map_onto_the_config(parser):
    doc = config(parser, "-tp", "1", "--max-num-seqs", "8", "--max_num_batched_tokens=4096", "--dtype", "float32",
                 "--trust-remote-code", "--no-enable-prefix-caching", "--served-model-name", "tiny",
                 "--host", "0.0.0.0", "--port", "8100", "--api-key", "sekret", "--seed", "7")
    main, _ = both(doc)
    assert main.verifier.max_num_seqs == 8 and main.verifier.name == "tiny"
    assert main.verifier.engine_kwargs == {"max_num_batched_tokens": 4096, "dtype": "float32",
                                           "trust_remote_code": True, "seed": 7, "enable_prefix_caching": False}
    assert main.ingress.api_key == "sekret"
    assert doc["http_options"] == {"host": "0.0.0.0", "port": 8100}


def test_pool_flags_named_like_the_pool_args(parser):
    doc = config(parser, "--num-drafters", "2", "--drafter-num-cpus", "0.5", "--drafter-num-gpus", "0",
                 "--async-drafting", "{enabled: true, bonus_fanout: 3}", "--drafter-idle-slot-ttl-s", "null",
                 "--drafter-cpu-affinity", "[1]", "--drafter-timeout-s", "2.5", "--verifier-num-cpus", "0.5",
                 "--ingress-max-inflight-requests", "16")
    main, pool = both(doc)
    assert (pool.num_replicas, pool.num_cpus, pool.num_gpus, pool.idle_slot_ttl_s, pool.cpu_affinity,
            pool.timeout_s) == (2, 0.5, 0.0, None, [1], 2.5)
    assert pool.async_drafting.enabled and pool.async_drafting.bonus_fanout == 3
    assert main.verifier.num_cpus == 0.5 and main.ingress.max_inflight_requests == 16
    doc = config(parser, "--drafter-autoscaling", "{min_replicas: 1, max_replicas: 4}", "--accelerator", "cpu")
    assert both(doc)[1].autoscaling_config.max_replicas == 4


@pytest.mark.parametrize(("extra", "named"), [
    (["-pp", "2"], "--pipeline-parallel-size"),
    (["--data-parallel-size", "2"], "--data-parallel-size"),
    (["--chat-template", "x.jinja"], "--chat-template"),
    (["--ssl-keyfile", "k.pem"], "--ssl-keyfile"),
    (["--worker-cls", "my.Worker"], "--worker-cls"),
    (["--additional-config", '{"a": 1}'], "--additional-config"),
    (["--served-model-name", "a", "b"], "--served-model-name"),
    (["--grpc"], "--grpc"),
])
def test_flags_the_cluster_cannot_honour_are_refused_by_name(parser, extra, named):
    with pytest.raises(cli.Refused, match=f"^{named}"):
        config(parser, *extra)


def test_async_scheduling_follows_the_model_runner(parser, monkeypatch):
    """``--async-scheduling`` reaches vLLM with model runner V2 (the GPU default), and is refused by the config,
    naming the field, where the verifier runs V1 (the CPU default)."""
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    doc = config(parser, "--async-scheduling", "--accelerator", "gpu")
    assert both(doc)[0].verifier.engine_kwargs["async_scheduling"] is True
    with pytest.raises(ValueError, match="verifier.engine_kwargs.async_scheduling: True; .*model runner V1"):
        config(parser, "--async-scheduling", "--accelerator", "cpu")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert both(config(parser, "--async-scheduling", "--accelerator", "cpu"))[0].verifier.engine_kwargs[
        "async_scheduling"] is True


def test_unknown_flags_are_refused_by_vllms_parser(capsys):
    with pytest.raises(SystemExit) as e:  # the seed PR's flag that vLLM 0.32 no longer has
        cli.main(["serve", *BASE, "--num-lookahead-slots=3", "--write-config", "/dev/null"])
    assert e.value.code == 2 and "--num-lookahead-slots" in capsys.readouterr().err


def test_required_and_invalid_values_name_the_field(parser, capsys):
    with pytest.raises(cli.Refused, match="--speculative-config"):
        cli.to_config(parser, parser.parse_args(["models/llama4-tiny"]))
    with pytest.raises(cli.Refused, match="MODEL"):
        cli.to_config(parser, parser.parse_args(["--speculative-config", SPEC]))
    with pytest.raises(ValueError, match=r"eagle-drafters: num_replicas"):
        config(parser, "--num-drafters", "0")
    with pytest.raises(ValueError, match=r"eagle-cluster: speculative_config.method"):  # an EAGLE-1 head as eagle3
        cli.to_config(parser, parser.parse_args(["models/llama4-tiny", "--speculative-config", SPEC.replace(
            "models/eagle3-llama4-tiny", str(EAGLE1))]))
    with pytest.raises(SystemExit):  # main() prints the reason and exits 2, as argparse does
        cli.main(["serve", *BASE, "--drafter-num-cpus", "-1", "--write-config", "/dev/null"])
    assert "eagle-drafters: num_cpus" in capsys.readouterr().err


def test_write_config_writes_a_yaml_serve_deploy_takes(tmp_path, capsys):
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "app.yaml"
    assert cli.main(["serve", *BASE, "--num-drafters", "2", "--write-config", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(doc)
    main, pool = both(doc)
    assert pool.num_replicas == 2 and main.verifier.max_model_len == 1024
    assert [a["import_path"] for a in doc["applications"]] == ["cluster.app:build_app", "cluster.app:build_drafter_app"]
    assert out.read_text().startswith("# written by: eagle-cluster serve models/llama4-tiny")


def test_without_write_config_it_runs_serve_run_or_deploy(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "_serve_cli", lambda *argv: calls.append(argv))
    cli.main(["serve", *BASE])
    cli.main(["serve", *BASE, "--address", "http://127.0.0.1:8265"])
    assert calls[0][0] == "run" and calls[1][0] == "deploy" and calls[1][2:] == ("--address", "http://127.0.0.1:8265")
    for argv in calls:  # each names a YAML that validates
        both(yaml.safe_load(open(argv[1]).read()))


def test_console_script_entry():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["eagle-cluster"] == "cluster.cli:main"


def test_help_lists_every_group_and_each_group_prints(parser, capsys):
    """``--help`` lists the groups (vLLM's way); ``--help=all`` and ``--help=GROUP`` print them, the cluster's group
    included, whose help texts hold a ``%`` (argparse formats help text with ``%``)."""
    groups = [g.title for g in parser._action_groups if g.title and g._group_actions]
    assert "eagle-cluster" in groups
    for arg in ["--help", "--help=all", *(f"--help={title}" for title in groups)]:
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([arg])
        out = capsys.readouterr().out
        assert stop.value.code == 0, arg
        assert out.strip(), arg
    with pytest.raises(SystemExit):
        parser.parse_args(["--help=eagle-cluster"])
    assert "--drafter-num-gpus" in capsys.readouterr().out
