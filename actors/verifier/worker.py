"""The vLLM worker class for the verifier (``worker_cls``): the platform's worker, with the remote proposer.

Every engine this project builds uses it (baselines too, with ``remote_drafter: False``), so that all of them
get the same CPU kernel fix (``actors.vllm_fixes``) and the same per-step timing.

``init_device`` builds the model runner as usual (model runner V1: ``require_v1_runner``), then replaces
``model_runner.drafter`` before ``load_model`` runs, so no draft weights are ever loaded here. The drafter client
comes from ``additional_config["eagle_cluster"]["draft_client"]`` (see ``actors.verifier.client.build_client``).

``take_draft_token_ids`` hands vLLM's scheduler each request's drafts cut to the length the proposer chose this step
(none at all when no drafter can draft it: vLLM then schedules and verifies no draft tokens for it). It is also where
the verifier waits for the drafters: ``propose`` (inside ``sample_tokens``) only sends the step, and vLLM's engine
core asks for the drafts (``post_step``) after it has sent the step's tokens to the clients, so a prompt step's first
token, and every step's tokens, go out while the drafter drafts.

RPCs (``LLM.collective_rpc`` / ``engine.collective_rpc``): ``eagle_cluster_stats`` returns the proposer's
counters, timings and per-request acceptance as plain dicts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from typing import Any

from vllm.platforms import current_platform
from vllm.v1.outputs import DraftTokenIds

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _PlatformWorker
else:  # pragma: no cover - GPU
    from vllm.v1.worker.gpu_worker import Worker as _PlatformWorker

from actors import vllm_fixes
from actors.metrics import COUNTER_KEYS
from actors.timing import ms_since
from actors.verifier.client import build_client
from actors.verifier.draft_handoff import mark_no_drafts
from actors.verifier.options import ASYNC_SCHEDULING, PIPELINE_PARALLEL
from actors.verifier.owner_watch import watch_owner
from actors.verifier.proposer import MAX_TIMINGS, ProposerState, RemoteEagleProposer

logger = logging.getLogger(__name__)

CONFIG_KEY = "eagle_cluster"


def _ensure_ray(address: str | None, namespace: str | None) -> None:
    """In an engine subprocess, join the running Ray cluster (else ``ray.put`` starts a private one).

    ``address``: the cluster's GCS address, from the process that built the engine. ``"auto"`` is not enough with
    several Ray nodes on one host: objects this process puts were then unreachable from other nodes
    (``OwnerDiedError``, reproduced with plain ``ray.put`` and ``ray.cluster_utils.Cluster``)."""
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS", "auto")
        ray.init(address=address, namespace=namespace, log_to_driver=False)


V2_RUNNER_PACKAGES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")  # V1 runners: gpu_model_runner, cpu_model_runner


def require_v1_runner(runner: Any) -> None:
    """Refuse vLLM's model runner V2: it drafts through ``runner.speculator`` and has no ``runner.drafter``, so
    neither the remote proposer nor the baselines' timing could hook it, and drafting would silently stay
    local (or absent). ``actors.vllm_engine.use_v1_model_runner`` sets the variable for the engines built here."""
    if hasattr(runner, "speculator") or type(runner).__module__.startswith(V2_RUNNER_PACKAGES):
        raise RuntimeError(
            f"eagle_cluster verifier: vLLM built model runner V2 ({type(runner).__module__}."
            f"{type(runner).__name__}); the remote drafter hooks runner V1 only: set VLLM_USE_V2_MODEL_RUNNER=0 in "
            "the environment of the process that builds the engine"
        )


@dataclasses.dataclass
class StepSplit:
    """The worker's time split of each step (for benchmarks), bounded; ``eagle_cluster_reset_stats`` clears it."""

    forward_ms: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))  # execute_model
    sample_ms: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))  # sample_tokens
    period_ms: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))  # step to step
    # vLLM's own drafter (colocated baselines): (batch size, rows, ms) of each propose call
    local_propose: deque[tuple[int, int, float]] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))

    def clear(self) -> None:
        for samples in (self.forward_ms, self.sample_ms, self.period_ms, self.local_propose):
            samples.clear()

    def to_dict(self) -> dict[str, list]:
        """``forward_ms``: the target forward; ``sample_ms``: rejection sampling + propose; ``period_ms``: step to
        step, while busy; ``local_propose``: vLLM's own drafter, (batch, rows, ms) per call."""
        return {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self)}


def plain_steps_without_drafts(runner: Any) -> list[int]:
    """A decode step none of whose requests was scheduled a draft token runs as a target-only runner's step.

    vLLM's V1 runner takes its speculative path on every step once a ``speculative_config`` is set
    (``_prepare_inputs``: ``use_spec_decode = self.speculative_config is not None``): spec-decode metadata, its
    rejection sampler, a ``[batch, 1 + k]`` output, also when no request has drafts. Measured at c = 16 with every
    step at k = 0 (``docs/BENCHMARKS.md``, issue 23), that is +8% of the worker's CPU per token against target-only. So
    for a step with no draft tokens and one token per request (decode only: a prompt chunk keeps the padded layout
    the proposer reads images in), ``_prepare_inputs`` runs as it does without a speculative config: logits at each
    request's last row, vLLM's plain sampler. Sampling one token from the target's logits is what the rejection
    sampler does with no drafts (its bonus token), so outputs are unchanged. The runner still calls the proposer
    after sampling (``propose_draft_token_ids``, which takes the ``spec_decode_metadata is None`` branch: every
    scheduled row is a real one), so the draft-length policy keeps choosing k for the next step.

    Returns a one-element list counting the steps that ran so (``eagle_cluster_stats``' ``plain_steps``).
    """
    prepare = runner._prepare_inputs
    count = [0]

    def _prepare_inputs(scheduler_output, *args: Any, **kwargs: Any):
        drafted = any(scheduler_output.scheduled_spec_decode_tokens.values())
        if drafted or scheduler_output.total_num_scheduled_tokens != len(scheduler_output.num_scheduled_tokens):
            return prepare(scheduler_output, *args, **kwargs)
        count[0] += 1
        spec, runner.speculative_config = runner.speculative_config, None
        try:
            return prepare(scheduler_output, *args, **kwargs)
        finally:
            runner.speculative_config = spec

    runner._prepare_inputs = _prepare_inputs
    return count


class RemoteDraftWorker(_PlatformWorker):
    """The platform worker plus the remote proposer, and a time split of each step (for benchmarks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        vllm_fixes.apply()
        self.split = StepSplit()
        self._last_start: float | None = None
        self._plain_steps = [0]
        self._skipped_takes = 0  # steps whose output said "no drafts", so the engine core asked for none
        super().__init__(*args, **kwargs)

    def _timed(self, samples: deque[float], method, *args: Any, **kwargs: Any):
        """``method``'s result; its time until the device finished its work goes to ``samples`` (``ms_since``)."""
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            samples.append(ms_since(start, getattr(self, "device", None)))

    def execute_model(self, scheduler_output, *args: Any, **kwargs: Any):
        drafter = getattr(self.model_runner, "drafter", None)
        if isinstance(drafter, RemoteEagleProposer):
            drafter.settle()
            drafter.draft_lengths = {}  # this step's, set by propose (the runner may not call it)
            if scheduler_output.total_num_scheduled_tokens == 0:
                # The engine's last step before going idle carries the requests that just finished: free their
                # draft state now, since no propose() follows to carry them.
                drafter.free_now(sorted(scheduler_output.finished_req_ids))
                drafter.note_idle()  # the draft-length policy does not time a step across an idle gap
            else:  # freed with the next propose(); requests merely not scheduled keep theirs
                drafter.scheduler_finished(scheduler_output.finished_req_ids)
        now = time.perf_counter()
        if self._last_start is not None and scheduler_output.total_num_scheduled_tokens:
            self.split.period_ms.append((now - self._last_start) * 1e3)
        self._last_start = now if scheduler_output.total_num_scheduled_tokens else None
        return self._timed(self.split.forward_ms, super().execute_model, scheduler_output, *args, **kwargs)

    def sample_tokens(self, *args: Any, **kwargs: Any):
        output = self._timed(self.split.sample_ms, super().sample_tokens, *args, **kwargs)
        drafter = getattr(self.model_runner, "drafter", None)
        if isinstance(drafter, RemoteEagleProposer) and drafter.nothing_to_take(self.model_runner.input_batch.req_ids):
            mark_no_drafts(output)  # the engine core skips take_draft_token_ids (actors.verifier.draft_handoff)
            self._skipped_takes += 1
        return output

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts vLLM's scheduler schedules for the next step (engine core: ``post_step``), each request's cut
        to the length the proposer chose for it this step (``RemoteEagleProposer.trim_drafts``): a request with none
        (no usable drafter, its drafter failed, ...) is scheduled no draft tokens, so vLLM verifies none for it, and
        a step with none at all costs what a target-only step costs. The scheduler reads the output rank's answer:
        tensor-parallel rank 0, the driver."""
        drafts = super().take_draft_token_ids()  # the runner's: the step's req_ids, and the placeholders propose gave
        drafter = getattr(self.model_runner, "drafter", None)
        if not isinstance(drafter, RemoteEagleProposer):
            return drafts
        ids = drafter.collect_drafts()  # [batch_size, k], the drafters' answers, waited for only now
        if drafts is None:
            return None
        if ids is not None and len(ids) == len(drafts.req_ids):
            drafts = DraftTokenIds(drafts.req_ids, ids.tolist())
        elif ids is not None:  # not the batch propose saw: schedule no drafts rather than wrong ones
            logger.warning("drafts for %d requests, the runner has %d: none scheduled", len(ids), len(drafts.req_ids))
            return DraftTokenIds(drafts.req_ids, [[] for _ in drafts.req_ids])
        return drafter.trim_drafts(drafts)

    def init_device(self) -> None:
        super().init_device()
        runner = self.model_runner
        require_v1_runner(runner)
        cfg: dict[str, Any] = (self.vllm_config.additional_config or {}).get(CONFIG_KEY, {})
        if cfg.get("owner_pid"):
            watch_owner(int(cfg["owner_pid"]))
        if not cfg.get("remote_drafter", True):
            # timing only: vLLM's own drafter (colocated) or none (target-only), for benchmarks
            if getattr(runner, "drafter", None) is not None:
                runner.drafter.propose = self._timed_local_propose(runner.drafter.propose)
            return
        pc = self.vllm_config.parallel_config
        if self.vllm_config.scheduler_config.async_scheduling:
            raise RuntimeError(f"eagle_cluster verifier: async_scheduling is on; {ASYNC_SCHEDULING}")
        if pc.pipeline_parallel_size > 1:  # before the drafter check: stages but the last have no drafter
            raise RuntimeError(f"eagle_cluster verifier: pipeline_parallel_size {pc.pipeline_parallel_size}; "
                               f"{PIPELINE_PARALLEL}")
        if self.vllm_config.speculative_config is None or not hasattr(runner, "drafter"):
            raise RuntimeError("eagle_cluster verifier: the engine needs an EAGLE / EAGLE-3 speculative_config")
        is_driver = self.rank % pc.tensor_parallel_size == 0  # TP rank 0 (one pipeline stage: see above)
        client = None
        if is_driver:
            spec = dict(cfg.get("draft_client", {}))
            spec.setdefault("vocab_size", self.vllm_config.model_config.get_vocab_size())  # drafts are checked
            _ensure_ray(cfg.get("ray_address"), spec.get("namespace"))
            client = build_client(spec)
        runner.drafter = RemoteEagleProposer(self.vllm_config, self.device, runner, client, is_driver)
        self._plain_steps = plain_steps_without_drafts(runner)
        # False only to measure drafting from image placeholder ids (what this project did before it shipped them)
        runner.drafter.ship_mm_embeds = bool(cfg.get("mm_embeds", True))

    def _timed_local_propose(self, propose):
        def timed(**kwargs):  # the runner passes everything by keyword
            start = time.perf_counter()
            out = propose(**kwargs)
            self.split.local_propose.append((int(out.shape[0]), int(kwargs["target_token_ids"].shape[0]),
                                        ms_since(start, getattr(self, "device", None))))
            return out

        return timed

    def eagle_cluster_stats(self) -> dict[str, Any]:
        drafter, st, is_driver, client, goodput = self._proposer()
        return {
            "is_driver": is_driver,
            **st.stats(client, goodput_by_k=goodput).to_dict(),
            # image rows shipped, and steps that were handed image embeddings (vLLM gathered them)
            "mm_rows_shipped": st.mm_rows_shipped,
            "mm_steps": st.mm_steps,
            "plain_steps": self._plain_steps[0],  # decode steps without drafts run as target-only steps
            "steps_without_take": self._skipped_takes,  # ... whose drafts the engine core did not ask for
            # (batch size, k, period ms) of each step the draft-length policy timed (``auto`` only)
            "draft_length_periods": list(getattr(getattr(drafter, "draft_length", None), "history", ())),
            "timings": [dataclasses.asdict(t) for t in st.timings],
            **self.split.to_dict(),
        }

    def eagle_cluster_counters(self) -> dict[str, Any]:
        """``ProposerStats`` with the counters only (no per-request table, no per-step timings, the client's counts
        but not its events): what ``/metrics`` reads on every scrape, so a scrape costs the same after a day as
        after a minute."""
        _, st, is_driver, client, goodput = self._proposer()
        counts = {k: client[k] for k in COUNTER_KEYS if k in client}
        return {"is_driver": is_driver, **st.stats(counts, counters_only=True, goodput_by_k=goodput).to_dict()}

    def _proposer(self) -> tuple[Any, ProposerState, bool, dict[str, Any], dict[str, list[float | None]]]:
        """(the runner's drafter, its proposer state, whether this rank is the driver, its draft client's stats, its
        draft-length policy's goodput estimates, read now rather than at every step); an empty state, no client
        stats and no estimates where the drafter is not the remote proposer."""
        drafter = getattr(self.model_runner, "drafter", None)
        if not isinstance(drafter, RemoteEagleProposer):
            return drafter, ProposerState(), self.rank == 0, {}, {}
        client = drafter.client.stats() if hasattr(drafter.client, "stats") else {}
        return drafter, drafter.state, drafter.is_driver, client, drafter.draft_length.goodput_table()

    def eagle_cluster_reset_stats(self) -> None:
        drafter = getattr(self.model_runner, "drafter", None)
        if isinstance(drafter, RemoteEagleProposer):
            drafter.state.reset_measurements()
            if hasattr(drafter.draft_length, "history"):
                drafter.draft_length.history.clear()
        self.split.clear()
