"""Several Ray nodes on one machine (``ray.cluster_utils.Cluster``): two verifier replicas on one node share one
drafter on another, placed by custom resources; hidden states cross nodes as object refs; outputs unchanged."""

from __future__ import annotations

import asyncio

import pytest

from cluster.config import APP_NAME as APP
from cluster.harness import drafter_stats, replica_actors
from tests.cluster.traffic import check_exact, send
from tests.conftest import EAGLE1, TARGET

pytestmark = [pytest.mark.slow, pytest.mark.isolated]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    from tests.actors import vllm_helpers as vh

    return vh.reference(12, MAX_TOKENS)


@pytest.fixture(scope="module")
def nodes(reference):
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from cluster.app import build_app, build_drafter_app
    from cluster.config import DRAFTER_APP_NAME

    # The verifiers go on the head node: vLLM's engine process joins Ray as a driver on its own host, and with
    # several simulated nodes on one host Ray connects drivers to the head's raylet (one raylet per host in a
    # real cluster). Objects it puts then live on the node its replica runs on, as they would for real.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"verifier_node": 2}})
    verifier_node = cluster.head_node
    drafter_node = cluster.add_node(num_cpus=1, resources={"drafter_node": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 8000})
        app = build_app({
            "verifier": {"model": str(TARGET), "served_model_name": "llama4-tiny", "max_model_len": 512,
                         "num_replicas": 2, "num_cpus": 0.5, "resources": {"verifier_node": 1}},
            "speculative_config": {"method": "eagle", "model": str(EAGLE1), "num_speculative_tokens": 3},
        })
        drafters = build_drafter_app({"target": str(TARGET), "head": str(EAGLE1), "max_model_len": 512,
                                      "num_cpus": 0.5, "num_replicas": 1, "resources": {"drafter_node": 1}})
        serve.run(drafters, name=DRAFTER_APP_NAME, route_prefix=None)
        serve.run(app, name=APP, route_prefix="/")
        yield {"verifier": verifier_node.node_id, "drafter": drafter_node.node_id}
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def test_verifiers_and_drafter_on_their_nodes_outputs_exact(nodes, reference):
    from ray import serve

    verifiers, drafters = replica_actors("Verifier"), replica_actors("Drafter")
    assert len(verifiers) == 2 and {v["node_id"] for v in verifiers} == {nodes["verifier"]}
    assert len(drafters) == 1 and drafters[0]["node_id"] == nodes["drafter"]

    results = asyncio.run(send(list(reference) * 2, 8, MAX_TOKENS))
    check_exact(results, reference)

    stats = drafter_stats(drafters[0]["replica_id"])
    assert stats["node_id"] == nodes["drafter"] and stats["steps"] > 0 and stats["failures"] == 0
    handle = serve.get_deployment_handle("Verifier", app_name=APP)
    per_replica = {}
    for _ in range(40):  # Serve spreads these calls over both verifier replicas
        s = handle.spec_stats.remote().result(timeout_s=30)
        per_replica[s.replica] = s
        if len(per_replica) == 2:
            break
    assert len(per_replica) == 2
    for s in per_replica.values():  # each verifier drafted through the shared drafter, across nodes
        # The drafter reported no failure (its own ``failures`` is 0, above), yet once in CI a verifier counted one
        # failed step of 16 on a loaded 2-core machine running two engines and the drafter, most likely a wait past
        # the step's deadline (1 s at least, ``StepDeadline``), which leaves the step undrafted by design (outputs
        # stay exact, checked above). So a rare failed step is allowed here; drafting across nodes is what is shown.
        assert s.steps > 0 and s.failures * 8 <= s.steps, (s.steps, s.failures)
        assert sum(r.num_accepted_tokens for r in s.per_request.values()) > 0
