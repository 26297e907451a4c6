"""``make demo``: the CPU default served for real, driven over HTTP, in one command.

Starts ``deploy/cpu.yaml``'s two applications in a local Ray cluster (an ingress, a vLLM-CPU verifier for the shipped
Llama 4 target, and a drafter pool with the shipped EAGLE-3 head, hidden states and drafts crossing through
Ray object refs), sends a few held-out prompts with the ``openai`` client to ``http://127.0.0.1:8000/v1``,
prints the generations and the seed PRs' acceptance table read from ``/metrics``, then shuts everything down.

    python -m cluster.demo [--keep] [--config deploy/cpu.yaml] [--num-prompts 4] [--max-tokens 64]

``--keep`` leaves it serving until Ctrl-C (also: ``serve run deploy/cpu.yaml``).
"""

from __future__ import annotations

import argparse
import logging
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "http://127.0.0.1:8000"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "deploy" / "cpu.yaml"))
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--keep", action="store_true", help="keep serving until Ctrl-C")
    args = p.parse_args(argv)

    from cluster import serve_env

    serve_env.apply()  # before Ray is imported and started: Serve's controller and proxy read it
    import ray
    from openai import OpenAI
    from ray import serve

    from actors.metrics import from_prometheus_text
    from cluster import deploy_yaml
    from cluster.app import build_app, build_drafter_app
    from cluster.config import APP_NAME, DRAFTER_APP_NAME
    from cluster.harness import heldout_prompts

    doc = deploy_yaml.load(Path(args.config))
    http = doc.get("http_options", {})
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": http.get("host", "127.0.0.1"), "port": http.get("port", 8000)})
        t0 = time.time()
        print("starting the CPU default (ingress, vLLM-CPU verifier, drafter pool) ...", flush=True)
        serve.run(build_drafter_app(deploy_yaml.app_args(doc, DRAFTER_APP_NAME)), name=DRAFTER_APP_NAME,
                  route_prefix=None)
        serve.run(build_app(deploy_yaml.app_args(doc, APP_NAME)), name=APP_NAME, route_prefix="/")
        print(f"serving at {BASE}/v1 after {time.time() - t0:.0f} s", flush=True)
        client = OpenAI(base_url=f"{BASE}/v1", api_key="none")
        model = client.models.list().data[0].id
        prompts = heldout_prompts(args.num_prompts)
        for prompt in prompts:
            out = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            print("-" * 72)
            print(prompt + "\033[1m" + out.choices[0].text + "\033[0m")
        print("=" * 72)
        with urllib.request.urlopen(f"{BASE}/metrics", timeout=10) as r:
            stats = from_prometheus_text(r.read().decode())
        print(stats.table())
        if args.keep:
            print(f"\nserving at {BASE}/v1 (model {model!r}); Ctrl-C to stop", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        shut_down_quietly()


def shut_down_quietly() -> None:
    """Both applications deleted (replicas and vLLM's engine stopped gracefully), then the local Ray cluster.

    Not ``serve.shutdown()``: it kills the Serve controller while this driver's calls to it (``graceful_shutdown``,
    the handles' ``listen_for_change`` long polls) are in flight, and Ray reports each as a failed task on the
    driver's terminal (``(raylet) Task ServeController.listen_for_change failed ...``) after the demo's table.
    ``ray.shutdown()`` stops the driver's listeners before it ends the cluster's processes, the controller's too."""
    import ray
    from ray import serve

    from cluster.config import APP_NAME, DRAFTER_APP_NAME

    if not ray.is_initialized():
        return
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # no "Deleting app ..." lines after the table
    try:
        for name in (APP_NAME, DRAFTER_APP_NAME):  # the verifier first: it calls the drafters until it stops
            serve.delete(name)
    except Exception as e:  # Serve never started, or the cluster is going: ray.shutdown() ends what is left
        print(f"(deleting the applications: {type(e).__name__}: {e})", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
