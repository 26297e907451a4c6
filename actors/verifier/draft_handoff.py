"""No draft round trip for a step without drafts: the engine core skips ``take_draft_token_ids`` when the worker
said, with the step's sampled tokens, that it has no draft token for any request.

Where it sits: vLLM's engine core asks its executor for the drafts after every step that ran the model
(``EngineCore.post_step`` -> ``take_draft_token_ids``): one more RPC to the worker and back, through the
shared-memory queues (``MultiprocExecutor``), besides ``execute_model`` and ``sample_tokens``. vLLM target-only has no
such call; at k = 0 (the draft-length policy's choice, or no drafter to reach) the cluster's verifier would pay it on
every step for nothing.

- In the worker (``actors.verifier.worker.RemoteDraftWorker.sample_tokens``): when the proposer shipped nothing this
  step and every request's draft length is 0 (``RemoteEagleProposer.nothing_to_take``), the step's
  ``ModelRunnerOutput`` carries ``NO_DRAFTS`` (an attribute; the executor pickles the object whole).
- In the engine core (``register``, a ``vllm.general_plugins`` entry point, so it runs in every vLLM process): the
  executors' ``sample_tokens`` notes the mark, and the ``take_draft_token_ids`` after it returns None without the
  RPC. vLLM's scheduler clears each request's draft tokens when it schedules them, so no update leaves every request
  with none: what the skipped call would have set. Any step without the mark (vLLM's own drafters, a step that
  drafts, an output that is a future) asks as vLLM does. The mark also sets the engine core's busy loop
  (``actors.engine_spin.drafting``).
"""

from __future__ import annotations

import functools
from typing import Any

from actors import engine_spin

NO_DRAFTS = "eagle_cluster_no_drafts"  # on a ModelRunnerOutput: no request has a draft token for the next step
_SKIP = "_eagle_cluster_skip_take"  # on an executor: the last sample_tokens output carried NO_DRAFTS


def mark_no_drafts(output: Any) -> None:
    """Marks a step's ``ModelRunnerOutput`` (the worker's ``sample_tokens`` answer) as having no drafts to take."""
    if output is not None:
        setattr(output, NO_DRAFTS, True)


def _sample_tokens(original):
    @functools.wraps(original)
    def sample_tokens(self, *args: Any, **kwargs: Any):
        output = original(self, *args, **kwargs)
        no_drafts = bool(getattr(output, NO_DRAFTS, False))
        setattr(self, _SKIP, no_drafts)
        engine_spin.drafting(not no_drafts)  # a step without drafts waits on no drafter: vLLM's busy loop
        return output

    return sample_tokens


def _execute_model(original):
    @functools.wraps(original)
    def execute_model(self, *args: Any, **kwargs: Any):
        setattr(self, _SKIP, False)  # a step whose sampling ran inside execute_model asks as vLLM does
        return original(self, *args, **kwargs)

    return execute_model


def _take_draft_token_ids(original):
    @functools.wraps(original)
    def take_draft_token_ids(self):
        if getattr(self, _SKIP, False):
            setattr(self, _SKIP, False)
            return None
        return original(self)

    return take_draft_token_ids


def patch(cls: type) -> None:
    """Wraps ``cls``'s own ``execute_model``, ``sample_tokens`` and ``take_draft_token_ids`` (once)."""
    if cls.__dict__.get(_SKIP + "_patched"):
        return
    for name, wrap in (("execute_model", _execute_model), ("sample_tokens", _sample_tokens),
                       ("take_draft_token_ids", _take_draft_token_ids)):
        if name in cls.__dict__:
            setattr(cls, name, wrap(cls.__dict__[name]))
    setattr(cls, _SKIP + "_patched", True)


def register() -> None:
    """The executors an engine core drives here: multiprocess (a worker process per rank) and in-process."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    for cls in (MultiprocExecutor, UniProcExecutor):
        patch(cls)
