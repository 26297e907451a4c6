"""The vLLM worker class for the verifier (``worker_cls``): the platform's worker, with the remote proposer.

Every engine this project builds uses it (baselines too, with ``remote_drafter: False``), so that all of them
get the same CPU kernel fix (``actors.vllm_fixes``) and the same per-step timing.

``init_device`` builds the model runner vLLM chose (``actors.vllm_engine.choose_model_runner``) with the adapter in its
drafter slot, before ``load_model`` runs: runner V1's ``drafter`` becomes ``actors.verifier.vllm_adapter.
RemoteEagleProposer``; runner V2 is built with ``actors.verifier.vllm_v2_adapter.RemoteSpeculatorV2`` as its
``speculator``. The driver rank's adapter drafts through a ``Speculation`` over a ``RemoteSpeculator`` built from
``additional_config["eagle_cluster"]["draft_client"]`` (``actors.verifier.remote_speculator.build_speculator``).

The step's three hooks: ``execute_model`` frees what the scheduler finished (``begin_step``; runner V2: writes the
step's drafts on the device first); ``propose`` (inside ``sample_tokens``) sends the step and waits for nothing;
``take_draft_token_ids``, which vLLM's engine core calls after it has sent the step's tokens to the clients
(``post_step``; not called under asynchronous scheduling, which runner V2 alone supports here), reads the drafts.
A step with none to hand (k = 0, no drafter) says so with its output, and the engine core skips that call
(``actors.verifier.draft_handoff``).

RPCs (``LLM.collective_rpc`` / ``engine.collective_rpc``): ``eagle_cluster_stats`` returns the proposer's
counters, timings and per-request acceptance as plain dicts; ``eagle_cluster_counters`` the counters only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from vllm.platforms import current_platform
from vllm.v1.outputs import DraftTokenIds

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _PlatformWorker
else:  # cuda-only: vLLM's GPU worker
    from vllm.v1.worker.gpu_worker import Worker as _PlatformWorker

from actors import engine_spin, vllm_fixes
from actors.metrics import ProposerStats
from actors.timing import DeviceSpans, ms_since
from actors.verifier.draft_handoff import mark_no_drafts
from actors.verifier.draft_length import StepDraftLength, build_draft_length
from actors.verifier.options import (
    ASYNC_SCHEDULING,
    LEGACY_RAY_EXECUTOR,
    PIPELINE_PARALLEL,
    RAY_V2_EXECUTOR_ENV,
    legacy_ray_executor,
)
from actors.verifier.owner_watch import watch_owner
from actors.verifier.remote_speculator import build_speculator
from actors.verifier.speculation import Speculation
from actors.verifier.step_stats import MAX_TIMINGS
from actors.verifier.vllm_adapter import RemoteEagleProposer, check_vllm
from actors.verifier.vllm_v2_adapter import RemoteSpeculatorV2, check_vllm_v2

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


def is_v2_runner(runner: Any) -> bool:
    """Whether vLLM built model runner V2 (it drafts through ``runner.speculator``; V1 through ``runner.drafter``)."""
    return hasattr(runner, "speculator") or type(runner).__module__.startswith(V2_RUNNER_PACKAGES)


@contextlib.contextmanager
def _remote_speculator_v2() -> Iterator[None]:
    """While runner V2 is built: its ``init_speculator`` builds ``RemoteSpeculatorV2``, so no draft model, buffers or
    weights are made here (V2 builds its speculator inside the runner's constructor; the CPU worker builds the
    runner inside ``init_device``, the GPU worker in ``_make_model_runner``)."""
    import vllm.v1.worker.gpu.model_runner as v2

    original = v2.init_speculator
    v2.init_speculator = lambda vllm_config, device, req_states, *a, **kw: RemoteSpeculatorV2(
        vllm_config, device, req_states)
    try:
        yield
    finally:
        v2.init_speculator = original


@dataclasses.dataclass
class StepSplit:
    """The worker's time split of each step (for benchmarks), bounded; ``eagle_cluster_reset_stats`` clears it."""

    forward_ms: DeviceSpans = dataclasses.field(default_factory=lambda: DeviceSpans(MAX_TIMINGS))  # execute_model
    sample_ms: DeviceSpans = dataclasses.field(default_factory=lambda: DeviceSpans(MAX_TIMINGS))  # sample_tokens
    period_ms: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))  # step to step
    # vLLM's own drafter (colocated baselines): (batch size, rows, ms) of each propose call
    local_propose: deque[tuple[int, int, float]] = dataclasses.field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))

    def clear(self) -> None:
        for samples in (self.forward_ms, self.sample_ms, self.period_ms, self.local_propose):
            samples.clear()

    def to_dict(self) -> dict[str, list]:
        """``forward_ms``: the target forward; ``sample_ms``: rejection sampling + propose; ``period_ms``: step to
        step, while busy; ``local_propose``: vLLM's own drafter, (batch, rows, ms) per call."""
        return {f.name: v.values() if isinstance(v := getattr(self, f.name), DeviceSpans) else list(v)
                for f in dataclasses.fields(self)}


class RemoteDraftWorker(_PlatformWorker):
    """The platform worker plus the remote proposer, and a time split of each step (for benchmarks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        vllm_fixes.apply()
        self.split = StepSplit()
        self._last_start: float | None = None
        self._marked_no_drafts = 0  # steps whose output said "no drafts" (the engine core should not ask for them)
        self._take_calls = 0  # take_draft_token_ids calls that reached this worker (the engine core asked)
        self._sampled_steps = 0  # sample_tokens calls: steps after which the engine core asks, unless marked
        super().__init__(*args, **kwargs)

    @property
    def adapter(self) -> RemoteEagleProposer | RemoteSpeculatorV2 | None:
        runner = self.model_runner
        slot = getattr(runner, "speculator", None) if is_v2_runner(runner) else getattr(runner, "drafter", None)
        return slot if isinstance(slot, RemoteEagleProposer | RemoteSpeculatorV2) else None

    def _timed(self, spans: DeviceSpans, method, *args: Any, **kwargs: Any):
        """``method``'s result; on tensor-parallel rank 0 its device span goes to ``spans``, taken without waiting
        for the device (``actors.timing.DeviceSpans``: a step never stalls for its own timing)."""
        if getattr(self, "rank", 0) != 0:
            return method(*args, **kwargs)
        return spans.time(getattr(self, "device", None), method, *args, **kwargs)

    def execute_model(self, scheduler_output, *args: Any, **kwargs: Any):
        if (adapter := self.adapter) is not None:
            adapter.begin_step(scheduler_output)
        now = time.perf_counter()
        if self._last_start is not None and scheduler_output.total_num_scheduled_tokens:
            self.split.period_ms.append((now - self._last_start) * 1e3)
        self._last_start = now if scheduler_output.total_num_scheduled_tokens else None
        return self._timed(self.split.forward_ms, super().execute_model, scheduler_output, *args, **kwargs)

    def sample_tokens(self, *args: Any, **kwargs: Any):
        output = self._timed(self.split.sample_ms, super().sample_tokens, *args, **kwargs)
        self._sampled_steps += 1
        if (adapter := self.adapter) is not None and adapter.speculation is not None:
            no_drafts = adapter.nothing_to_take()
            if no_drafts:
                mark_no_drafts(output)  # the engine core skips take_draft_token_ids (actors.verifier.draft_handoff)
                self._marked_no_drafts += 1
            engine_spin.drafting(not no_drafts)  # a step without drafts waits on no drafter: vLLM's busy loop
        return output

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts vLLM's scheduler schedules for the next step (``RemoteEagleProposer.take``). The scheduler reads
        the output rank's answer: tensor-parallel rank 0, the driver."""
        self._take_calls += 1
        placeholders = super().take_draft_token_ids()
        adapter = self.adapter
        return placeholders if adapter is None else adapter.take(placeholders)

    def init_device(self) -> None:
        cfg: dict[str, Any] = (self.vllm_config.additional_config or {}).get(CONFIG_KEY, {})
        remote = bool(cfg.get("remote_drafter", True))
        with _remote_speculator_v2() if remote and self.vllm_config.speculative_config else contextlib.nullcontext():
            super().init_device()
        runner = self.model_runner
        v2 = is_v2_runner(runner)
        if cfg.get("owner_pid"):
            watch_owner(int(cfg["owner_pid"]))
        if not remote:
            # timing only: vLLM's own drafter (colocated) or none (target-only), for benchmarks
            if not v2 and getattr(runner, "drafter", None) is not None:
                runner.drafter.propose = self._timed_local_propose(runner.drafter.propose)
            return
        (check_vllm_v2 if v2 else check_vllm)()
        pc = self.vllm_config.parallel_config
        if self.vllm_config.scheduler_config.async_scheduling and not v2:
            raise RuntimeError(f"eagle_cluster verifier: async_scheduling is on with model runner V1; "
                               f"{ASYNC_SCHEDULING}")
        if pc.distributed_executor_backend == "ray" and legacy_ray_executor():  # its steps bypass these hooks
            raise RuntimeError(f"eagle_cluster verifier: {RAY_V2_EXECUTOR_ENV}={os.environ[RAY_V2_EXECUTOR_ENV]!r}; "
                               f"{LEGACY_RAY_EXECUTOR}")
        if pc.pipeline_parallel_size > 1:  # before the drafter check: stages but the last have no drafter
            raise RuntimeError(f"eagle_cluster verifier: pipeline_parallel_size {pc.pipeline_parallel_size}; "
                               f"{PIPELINE_PARALLEL}")
        spec_config = self.vllm_config.speculative_config
        if spec_config is None or not hasattr(runner, "speculator" if v2 else "drafter"):
            raise RuntimeError("eagle_cluster verifier: the engine needs an EAGLE / EAGLE-3 speculative_config")
        speculation = None
        if self.rank % pc.tensor_parallel_size == 0:  # the driver: TP rank 0 (one pipeline stage: see above)
            spec = dict(cfg.get("draft_client", {}))
            spec.setdefault("vocab_size", self.vllm_config.model_config.get_vocab_size())  # drafts are checked
            _ensure_ray(cfg.get("ray_address"), spec.get("namespace"))
            policy = build_draft_length(cfg.get("draft_length"), spec_config.num_speculative_tokens,
                                        self.vllm_config.scheduler_config.max_num_seqs)
            speculation = Speculation(build_speculator(spec), StepDraftLength(policy))
        # mm_embeds False only to measure drafting from image placeholder ids
        if v2:
            if speculation is not None:
                runner.speculator.attach(speculation, ship_mm_embeds=bool(cfg.get("mm_embeds", True)))
            return
        runner.drafter = RemoteEagleProposer(self.vllm_config, self.device, runner, speculation,
                                             ship_mm_embeds=bool(cfg.get("mm_embeds", True)))

    def compile_or_warm_up_model(self, *args: Any, **kwargs: Any):
        """vLLM's warm-up and graph capture run steps of made-up requests: the drafters see none of them (runner V2
        sends steps only once this returned)."""
        result = super().compile_or_warm_up_model(*args, **kwargs)
        if isinstance(adapter := self.adapter, RemoteSpeculatorV2):
            adapter.live = True
        return result

    def _timed_local_propose(self, propose):
        def timed(**kwargs):  # the runner passes everything by keyword
            start = time.perf_counter()
            out = propose(**kwargs)
            self.split.local_propose.append((int(out.shape[0]), int(kwargs["target_token_ids"].shape[0]),
                                        ms_since(start, getattr(self, "device", None))))
            return out

        return timed

    def _report(self, counters_only: bool) -> tuple[bool, ProposerStats]:
        """(whether this rank is the driver, its proposer's statistics: empty where it does not draft)."""
        adapter = self.adapter
        if adapter is None or adapter.speculation is None:
            return adapter is None and self.rank == 0, ProposerStats()
        return True, adapter.speculation.report(counters_only)

    def eagle_cluster_stats(self) -> dict[str, Any]:
        is_driver, stats = self._report(counters_only=False)
        adapter = self.adapter
        speculation = adapter.speculation if adapter is not None else None
        st = speculation.stats if speculation is not None else None
        policy = speculation.lengths.policy if speculation is not None else None
        v2 = isinstance(adapter, RemoteSpeculatorV2)
        return {
            "is_driver": is_driver,
            **stats.to_dict(),
            "model_runner": "v2" if is_v2_runner(self.model_runner) else "v1",
            "async_scheduling": bool(self.vllm_config.scheduler_config.async_scheduling),
            # runner V2: steps whose drafts this rank wrote on its device, and the sum of their ids (equal on
            # every rank when every rank verified the same drafts)
            "draft_writes": adapter.writes if v2 else 0,
            "draft_digest": adapter.digest() if v2 else 0,
            # image rows shipped, and steps that were handed image embeddings (vLLM gathered them)
            "mm_rows_shipped": st.mm_rows_shipped if st else 0,
            "mm_steps": st.mm_steps if st else 0,
            "plain_steps": adapter.plain_steps[0] if adapter else 0,  # decode steps without drafts run target-only
            "steps_marked_no_drafts": self._marked_no_drafts,  # steps whose output said "no drafts" (draft_handoff)
            "sampled_steps": self._sampled_steps,  # steps this worker sampled
            "take_calls": self._take_calls,  # the engine core's asks for drafts that reached this worker
            # (batch size, k, period ms) of each step the draft-length policy timed (``auto`` only)
            "draft_length_periods": list(getattr(policy, "history", ())),
            "timings": [dataclasses.asdict(t) for t in st.timings] if st else [],
            **self.split.to_dict(),
        }

    def eagle_cluster_counters(self) -> dict[str, Any]:
        """``ProposerStats`` with the counters only (no per-request table, no per-step timings, the speculator's
        counts but not its events): what ``/metrics`` reads on every scrape, so a scrape costs the same after a day
        as after a minute."""
        is_driver, stats = self._report(counters_only=True)
        return {"is_driver": is_driver, **stats.to_dict()}

    def eagle_cluster_reset_stats(self) -> None:
        adapter = self.adapter
        if adapter is not None and adapter.speculation is not None:
            adapter.speculation.reset_measurements()
        self.split.clear()
