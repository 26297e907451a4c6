"""Engine options the remote drafter cannot work with, refused before an engine is built.

Checked where engine arguments are made (``actors.verifier.engine.verifier_kwargs``), by the YAML config
(``cluster.config.VerifierConfig``: ``verifier.engine_kwargs``), and in the worker itself
(``actors.verifier.worker.RemoteDraftWorker.init_device``) for engines built some other way. No vLLM import here:
the Serve config validates without it.
"""

from __future__ import annotations

from typing import Any

ASYNC_SCHEDULING = (
    "the remote drafter needs it off: with async scheduling each tensor-parallel rank feeds the draft tokens of "
    "its own runner into the next step, and only rank 0's come from the drafters (the others' are placeholders)")
PIPELINE_PARALLEL = (
    "the remote drafter supports 1 only: vLLM builds the drafter hook on the last pipeline stage only, and vLLM's "
    "scheduler takes draft tokens from that stage; use tensor_parallel_size")


def refuse_unsupported(engine: dict[str, Any]) -> None:
    """A ``ValueError`` starting with the option's name when ``engine`` (vLLM engine keyword arguments) asks for
    something the remote drafter cannot do: ``async_scheduling``, ``pipeline_parallel_size`` > 1."""
    if engine.get("async_scheduling"):
        raise ValueError(f"async_scheduling: {engine['async_scheduling']!r}; {ASYNC_SCHEDULING}")
    pp = engine.get("pipeline_parallel_size") or 1
    if pp != 1:
        raise ValueError(f"pipeline_parallel_size: {pp}; {PIPELINE_PARALLEL}")
