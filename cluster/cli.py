"""``eagle-cluster serve MODEL [vLLM's flags] [pool flags]``: a ``vllm serve`` command line, served by the cluster.

The command line is parsed by vLLM's own parser (``vllm.entrypoints.launchers.cli_args.make_arg_parser`` on vLLM's
``FlexibleArgumentParser``, where vLLM 0.32 keeps what older releases had in ``vllm.entrypoints.openai.cli_args``),
so every vLLM flag parses as it does for ``vllm serve`` (``--speculative-config`` JSON, ``-tp``, ``--max_model_len=``,
``--config FILE``, ...) and a flag vLLM does not have is refused by vLLM's parser, naming it. Then each flag whose
value differs from vLLM's default is mapped onto the two applications' ``args`` (``cluster.config``):

    MODEL (or --model)                        verifier.model, the drafter pool's target
    --served-model-name NAME                  verifier.served_model_name (default: MODEL as given, as vLLM does)
    -tp/--tensor-parallel-size, --max-model-len, --max-num-seqs
                                              verifier.* (the pool's max_model_len follows --max-model-len)
    --speculative-config JSON                 speculative_config (required: its model is the pool's head)
    --host, --port                            Serve's http_options (default host: 127.0.0.1, not all interfaces)
    --api-key KEY                             ingress.api_key
    --no-enable-prefix-caching                verifier.engine_kwargs.enable_prefix_caching: false (on by default, as
                                              in vLLM; the drafters keep a prefix cache of their own)
    any other engine flag (--dtype, --max-num-batched-tokens, --trust-remote-code, --gpu-memory-utilization, ...)
                                              verifier.engine_kwargs, passed to vLLM's engine as the flag would be

and every other flag set away from its default is refused by name with the reason (``REFUSED``; vLLM's API-server
flags such as ``--chat-template`` or ``--ssl-keyfile`` configure a server the cluster does not run). The cluster's
own flags, named like the YAML ``args`` they set, each value read as YAML reads it (``1``, ``null``, ``[1]``,
``{min_replicas: 1, max_replicas: 4}``):

    --num-drafters N, --drafter-autoscaling '{...}', --async-drafting '{enabled: true}', --drafter-num-cpus,
    --drafter-num-gpus, --drafter-resources, ... (every field of the pool's args: ``--drafter-FIELD``)
    --verifier-num-replicas, --verifier-num-cpus, --verifier-resources, --accelerator cpu|gpu (``--verifier-FIELD``)
    --ingress-max-inflight-requests, --ingress-max-n, ... (``--ingress-FIELD``)
    --write-config FILE    write the two-application YAML (what ``serve deploy`` / ``serve run`` take) and exit
    --address URL          ``serve deploy`` it to a running Ray cluster (its dashboard, as ``serve deploy -a``)

Without ``--write-config`` / ``--address`` it runs ``serve run`` on the YAML in the foreground (Ctrl-C stops it within
``cluster.serve_cli.GRACE_S`` seconds).

    eagle-cluster serve models/llama4-tiny --max-model-len 1024 \\
        --speculative-config '{"method": "eagle3", "model": "models/eagle3-llama4-tiny", "num_speculative_tokens": 3}'
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from cluster import deploy_yaml
from cluster.config import (
    DrafterConfig,
    DrafterPoolConfig,
    EagleClusterConfig,
    IngressConfig,
    VerifierConfig,
)

PROG = "eagle-cluster serve"
DEFAULT_HOST = "127.0.0.1"  # vLLM's default (no --host) binds all interfaces; the cluster's default is loopback

# vLLM flags (by their argparse dest) that set a field of the verifier's section.
VERIFIER_FLAGS = ("tensor_parallel_size", "max_model_len", "max_num_seqs")
# vLLM flags this module reads itself (mapped below), not engine keyword arguments.
OWN_FLAGS = {"model", "model_tag", "served_model_name", "speculative_config", "host", "port", "api_key",
             "config"}  # --config FILE: vLLM's parser has already read the file's options into the others

_NOT_A_SERVER = "a vLLM API-server option; the cluster's OpenAI server is its own (cluster/ingress.py)"
REFUSED = {  # dest -> why the cluster cannot honour the flag
    "worker_cls": "the verifier runs the cluster's worker (actors.verifier.worker.RemoteDraftWorker)",
    "worker_extension_cls": "the verifier runs the cluster's worker (actors.verifier.worker.RemoteDraftWorker)",
    "additional_config": "the cluster's engine settings live there (additional_config.eagle_cluster)",
    "pipeline_parallel_size": "the remote drafter supports 1 only (actors/verifier/options.py); use -tp",
    "data_parallel_size": "use --verifier-num-replicas (Serve replicas, each its own engine)",
    "data_parallel_size_local": "use --verifier-num-replicas",
    "headless": "Serve places the engines; there is no headless mode",
    "api_server_count": "Serve's HTTP proxy fronts the cluster; there are no API-server processes to count",
    "grpc": "the cluster's gRPC is Serve's gRPC proxy (deploy/eagle_cluster.proto): set grpc_options in a "
            "--write-config YAML",
    "grpc_port": "the cluster's gRPC is Serve's gRPC proxy: set grpc_options in a --write-config YAML",
    "uds": "Serve's HTTP proxy listens on --host/--port",
}
DROPPED = {"enable_prefix_caching": True}  # flags whose value is what the cluster does anyway

# The cluster's own flags: (section, config model, flag prefix, fields left out, extra names for a field).
POOL_EXCLUDE = {"target", "head", "max_model_len"}  # from MODEL, --speculative-config, --max-model-len
OWN_SECTIONS: list[tuple[str, type[BaseModel], str, set[str], dict[str, list[str]]]] = [
    ("drafter", DrafterConfig, "--drafter-", POOL_EXCLUDE,
     {"num_replicas": ["--num-drafters"], "autoscaling_config": ["--drafter-autoscaling"],
      "async_drafting": ["--async-drafting"]}),
    ("verifier", VerifierConfig, "--verifier-",
     {"model", "served_model_name", "engine_kwargs", *VERIFIER_FLAGS}, {"accelerator": ["--accelerator"]}),
    ("ingress", IngressConfig, "--ingress-", {"api_key", "grpc"}, {}),
]
DEST_SEP = "__"  # own flags' dests: "drafter__num_cpus"


def _yaml_value(text: str) -> Any:
    """A flag's value as the YAML ``args`` would read it."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not a YAML value ({e})") from None


def make_parser() -> argparse.ArgumentParser:
    """vLLM's ``vllm serve`` parser plus the cluster's own flags."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(
        prog=PROG, usage=f"{PROG} MODEL [vLLM's flags] [the cluster's flags]",
        description="vllm serve's command line, served by Eagle Cluster (cluster/cli.py)"))
    group = parser.add_argument_group("eagle-cluster", "the cluster's own flags (YAML values)")
    group.add_argument("--write-config", metavar="FILE", default=None,
                       help="write the two-application Serve YAML (serve deploy / serve run take it) and exit")
    group.add_argument("--address", default=None,
                       help="serve deploy to this running Ray cluster's dashboard (e.g. http://127.0.0.1:8265)")
    for section, model, prefix, exclude, extra in OWN_SECTIONS:
        for name, field in model.model_fields.items():
            if name in exclude:
                continue
            flags = [*extra.get(name, []), prefix + name.replace("_", "-")]
            text = f"{section} {name}: {field.description or ''}".rstrip(": ")
            group.add_argument(*flags, dest=f"{section}{DEST_SEP}{name}", type=_yaml_value, default=argparse.SUPPRESS,
                               metavar="YAML", help=text.replace("%", "%%"))  # argparse %-formats help text
    return parser


def _flag(parser: argparse.ArgumentParser, dest: str) -> str:
    """The flag a dest is set by, as users write it (its first long name)."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
    return dest


def _changed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The vLLM flags whose value differs from vLLM's default."""
    defaults = {a.dest: a.default for a in parser._actions}
    return {dest: value for dest, value in vars(args).items()
            if DEST_SEP not in dest and dest in defaults and value != defaults[dest]
            and dest not in ("write_config", "address")}


def _engine_fields() -> set[str]:
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def _plain(value: Any) -> bool:
    """Whether a parsed value can be written to YAML as is."""
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


class Refused(ValueError):
    """A flag the cluster cannot honour; the message starts with the flag."""


def to_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The two-application Serve YAML (as a dict) for a parsed command line. Raises ``Refused`` naming the flag
    the cluster cannot honour, or ``ValueError`` naming the YAML field a value is wrong for."""
    changed = _changed(parser, args)
    engine_fields = _engine_fields()
    main: dict[str, Any] = {"verifier": {}, "ingress": {}}
    engine: dict[str, Any] = {}
    for dest, value in changed.items():
        flag = _flag(parser, dest)
        if dest in OWN_FLAGS:
            continue
        if dest in DROPPED and value == DROPPED[dest]:
            continue
        if dest in REFUSED:
            raise Refused(f"{flag} {value!r}: {REFUSED[dest]}")
        if dest in VERIFIER_FLAGS:
            main["verifier"][dest] = value
        elif dest in engine_fields:
            if not _plain(value):
                raise Refused(f"{flag}: its value ({type(value).__name__}) cannot be written to the YAML")
            engine[dest] = value
        else:
            raise Refused(f"{flag} {value!r}: {_NOT_A_SERVER}")

    model = args.model_tag or (args.model if "model" in changed else None)
    if not model:
        raise Refused("MODEL: required (the target checkpoint: a folder or a Hugging Face id)")
    if args.speculative_config is None:
        raise Refused("--speculative-config: required (its model is the drafter pool's EAGLE / EAGLE-3 head)")
    names = args.served_model_name or [model]
    if len(names) != 1:
        raise Refused(f"--served-model-name {names!r}: the cluster serves one name")
    main["verifier"].update(model=model, served_model_name=names[0])
    if engine:
        main["verifier"]["engine_kwargs"] = engine
    main["speculative_config"] = dict(args.speculative_config)
    if args.api_key:
        keys = args.api_key if isinstance(args.api_key, list) else [args.api_key]
        if len(keys) != 1:
            raise Refused("--api-key: the cluster takes one key")
        main["ingress"]["api_key"] = keys[0]
    own: dict[str, dict[str, Any]] = {"drafter": {}, "verifier": {}, "ingress": {}}
    for dest, value in vars(args).items():
        if DEST_SEP in dest:
            section, name = dest.split(DEST_SEP, 1)
            own[section][name] = value
    main["verifier"].update(own["verifier"])
    main["ingress"].update(own["ingress"])
    if not main["ingress"]:
        del main["ingress"]

    try:
        cfg = EagleClusterConfig.model_validate(main)
    except ValidationError as e:
        raise ValueError(_errors(e)) from None
    pool_args = {"target": cfg.verifier.model, "head": cfg.speculative_config.model,
                 "max_model_len": cfg.verifier.max_model_len, **own["drafter"]}
    try:
        pool = DrafterPoolConfig.model_validate(pool_args)
    except ValidationError as e:
        raise ValueError(_errors(e, "eagle-drafters")) from None
    pool_dump = pool.model_dump(mode="json", exclude_unset=True)
    pool_dump = {**{k: pool_dump.pop(k) for k in ("target", "head", "max_model_len")}, **pool_dump}  # as cpu.yaml
    doc = deploy_yaml.document(cfg.model_dump(mode="json", exclude_unset=True), pool_dump,
                               host=args.host or DEFAULT_HOST, port=args.port)
    _check_serve_schema(doc)
    return doc


def _errors(e: ValidationError, app: str = "eagle-cluster") -> str:
    """pydantic's errors as ``app: field.path: message`` lines (a check of several fields names them itself)."""
    lines = []
    for err in e.errors():
        loc, msg = ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")
        lines.append(f"{app}: {loc}: {msg}" if loc else f"{app}: {msg}")
    return "\n".join(lines)


def _check_serve_schema(doc: dict[str, Any]) -> None:
    """What ``serve deploy`` checks first: the YAML's Serve layout."""
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(doc)


def _serve_cli(*argv: str) -> None:
    """Become Ray's ``serve`` command (a fresh process: nothing of vLLM imported), with ``cluster.serve_cli``'s
    bound on Ctrl-C and the product's Serve defaults (``cluster.serve_env``, applied there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "cluster.serve_cli", *argv])


def serve(argv: list[str]) -> int:
    """``eagle-cluster serve ...``: write the YAML, or ``serve deploy`` / ``serve run`` it."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        doc = to_config(parser, args)
    except (Refused, ValueError) as e:
        parser.error(str(e))
    text = deploy_yaml.dump(doc, header=f"written by: {PROG} {' '.join(argv)}")
    if args.write_config:
        Path(args.write_config).write_text(text)
        print(f"wrote {args.write_config}: serve run {args.write_config}  (or serve deploy)", flush=True)
        return 0
    fd, path = tempfile.mkstemp(prefix="eagle-cluster-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    print(f"serving {path}", flush=True)
    if args.address:
        _serve_cli("deploy", path, "--address", args.address)
    _serve_cli("run", path)
    return 0  # not reached: _serve_cli replaces this process


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "serve":
        print(f"usage: {PROG} MODEL [vLLM's flags] [the cluster's flags]  (--help for all)", file=sys.stderr)
        return 2
    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
