"""Helpers for the tests that serve the app for real: ``serve run`` a YAML as a subprocess, plain HTTP calls,
and the Serve replica actors of a running app (for killing one, or reading one drafter's stats)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.serving_compare import stop
from cluster import deploy_yaml
from cluster.config import APP_NAME as APP
from cluster.config import DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT
from tests.conftest import ROOT

HTTP = "http://127.0.0.1:8000"
GRPC = "127.0.0.1:9000"  # Serve's gRPC proxy listens on all interfaces; the tests call it on loopback
MODEL = "llama4-tiny"


def get(path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(HTTP + path, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(path: str, body: bytes, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    """(status, JSON body), or ``{"raw": text}`` for a body that is not JSON (server-sent events)."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(HTTP + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")[:2000]}


def cpu_config(tmp: Path, grpc: bool = False, **args: Any) -> Path:
    """``deploy/cpu.yaml`` with its ``args`` sections updated (``drafter={...}`` merges into the drafter
    application's ``args``; see ``cluster.deploy_yaml.with_changes``), model paths absolute.

    ``grpc=True`` adds Serve's gRPC proxy on ``GRPC`` and turns the app's gRPC on, without a key unless ``ingress``
    sets one (``allow_unauthenticated``: a test server, up for minutes on a CI machine)."""
    doc = deploy_yaml.with_changes(deploy_yaml.load(), absolute=True, **args)
    if grpc:
        doc["grpc_options"] = {"port": int(GRPC.rsplit(":", 1)[1]), "grpc_servicer_functions": [
            "cluster.proto.eagle_cluster_pb2_grpc.add_EagleClusterServicer_to_server"]}
        keyless = "api_key" not in args.get("ingress", {})
        deploy_yaml.app_args(doc)["ingress"]["grpc"] = {"enabled": True, "allow_unauthenticated": keyless}
    return deploy_yaml.write(doc, tmp / "app.yaml")


@contextlib.contextmanager
def serve_run(config: Path, timeout_s: float = 600) -> Iterator[subprocess.Popen]:
    """``serve run CONFIG`` until the app is healthy; SIGINT (then SIGKILL) afterwards."""
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "serve"), "run", str(config)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("serve run exited:\n" + proc.stdout.read().decode()[-5000:])
            try:
                if get("/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        else:
            raise TimeoutError(f"the app did not become healthy in {timeout_s} s")
        yield proc
    finally:
        stop(proc)


def replica_actors(deployment: str) -> list[dict[str, Any]]:
    """The alive replica actors of one deployment of the app: ``[{"name", "pid", "replica_id", "node_id"}]``.
    Needs ``ray.init(address="auto")`` first."""
    from ray.util.state import list_actors

    app = DRAFTER_APP_NAME if deployment == DRAFTER_DEPLOYMENT else APP
    actors = list_actors(filters=[("class_name", "=", f"ServeReplica:{app}:{deployment}"), ("state", "=", "ALIVE")])
    return [{"name": a.name, "pid": a.pid, "replica_id": a.name.rsplit("#", 1)[-1], "node_id": a.node_id}
            for a in actors]


def drafter_stats(replica_id: str) -> dict[str, Any]:
    """One drafter replica's stats, routed to it by the pool's own router (``cluster.drafter_pool.router``)."""
    from ray import serve

    from cluster.drafter_pool.router import route_key

    handle = serve.get_deployment_handle(DRAFTER_DEPLOYMENT, app_name=DRAFTER_APP_NAME)
    return handle.options(session_id=route_key(replica_id, 0)).stats.remote().result(timeout_s=30)
