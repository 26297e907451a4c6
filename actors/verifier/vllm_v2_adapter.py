"""The vLLM adapter for model runner V2 (vLLM's default on CUDA): ``RemoteSpeculatorV2`` fills V2's speculator slot,
turns the rows V2 verified into one ``DraftStep``, and writes the ``Drafts`` that come back where V2 reads drafts:
``req_states.draft_tokens`` on the device.

Where it sits: ``actors.verifier.worker`` builds it in place of V2's own speculator (``build_runner_v2``), so no draft
weights are loaded here. What happens to a step is ``actors.verifier.speculation``'s, as with runner V1
(``actors.verifier.vllm_adapter``); this module is the V2 side of the same seam.

A step, on tensor-parallel rank 0 (the driver), for V2 without and with asynchronous scheduling:

    sample_tokens -> propose(input_batch, ...)     the step's rows sent to the drafters; nothing waited for; returns
                                                   placeholders, which V2 writes into req_states.draft_tokens
    synchronous:  take_draft_token_ids -> take()   after the step's tokens went out: the drafts waited for, handed
                                                   to vLLM's scheduler as lists (a short sequence's is empty, so
                                                   the scheduler schedules no draft slot for it)
                  execute_model -> begin_step()    every rank writes the scheduled drafts into req_states.draft_tokens
    asynchronous: execute_model -> begin_step()    the scheduler already scheduled K placeholder slots per sequence
                                                   (it cannot wait for drafts); the drafts are waited for here, before
                                                   V2 prepares the step's inputs, broadcast from rank 0 to the other
                                                   ranks over the tensor-parallel group, written on the device

A short sequence under asynchronous scheduling still has its K slots: they hold ``FILLER_TOKEN``, a valid token that
vLLM's rejection sampler verifies like any draft. Output stays exact (rejection sampling is lossless for any proposal);
the slots cost verify compute, and vLLM's ``spec_decode`` counters count them as drafts. V2 itself writes -1 only
past a step's k, where it never reads; a -1 inside the scheduled slots would reach the target's embedding.

``VLLM_V2_INTERNALS`` lists what this module relies on; ``check_vllm_v2`` fails loudly at start where one moved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from actors.messages import DraftStep, SeqSlice
from actors.verifier import vllm_internals
from actors.verifier.prefix import PromptAnnouncer
from actors.verifier.speculation import Speculation
from actors.verifier.speculator import Drafts
from actors.verifier.step_rows import mm_rows, packed_step_rows, prompt_roles
from actors.wire import encode_hidden

logger = logging.getLogger(__name__)

FILLER_TOKEN = 0  # the draft slots of a short sequence under asynchronous scheduling (see the module docstring)

# (module:class, attribute): what this module relies on in model runner V2.
VLLM_V2_INTERNALS = (
    ("vllm.v1.worker.gpu.model_runner:GPUModelRunner", "sample_tokens"),  # calls propose, writes draft_tokens
    ("vllm.v1.worker.gpu.model_runner:GPUModelRunner", "take_draft_token_ids"),
    ("vllm.v1.worker.gpu.model_runner:GPUModelRunner", "prepare_inputs"),  # reads req_states.draft_tokens
    ("vllm.v1.worker.gpu.model_runner", "init_speculator"),  # replaced while the runner is built
    ("vllm.v1.worker.gpu.spec_decode.speculator:BaseSpeculator", "propose"),
    ("vllm.v1.worker.gpu.input_batch:InputBatch", "idx_mapping_np"),
    ("vllm.v1.worker.gpu.input_batch:InputBatch", "query_start_loc_np"),
    ("vllm.v1.worker.gpu.input_batch:InputBatch", "prefill_len_np"),
    ("vllm.v1.worker.gpu.input_batch:InputBatch", "positions"),
    ("vllm.v1.worker.gpu.input_batch:InputBatch", "input_ids"),
    ("vllm.v1.worker.gpu.states:RequestState", "draft_tokens"),
    ("vllm.v1.worker.gpu.states:RequestState", "req_id_to_index"),
    ("vllm.v1.worker.gpu.states:RequestState", "next_prefill_tokens"),
    ("vllm.v1.worker.gpu.states:RequestState", "num_computed_tokens_np"),
)


def check_vllm_v2() -> None:
    """``RuntimeError`` naming each of ``VLLM_V2_INTERNALS`` this vLLM lacks."""
    vllm_internals.check(VLLM_V2_INTERNALS, "model runner V2 (see actors.verifier.vllm_v2_adapter)")


@dataclass
class _Batch:
    """The batch of the last ``propose``: where its drafts go in ``req_states.draft_tokens``."""

    req_ids: list[str]
    idx: np.ndarray  # [B] int64 request-state slot of each sequence (V2's idx_mapping)


class RemoteSpeculatorV2(BaseSpeculator):
    """V2's ``BaseSpeculator`` with the drafters behind the seam. ``speculation`` is set on the driver rank only
    (``attach``); the other ranks propose placeholders and receive the drafts."""

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any) -> None:
        spec = vllm_config.speculative_config
        self.device, self.req_states = device, req_states
        self.num_speculative_steps = spec.num_speculative_tokens
        self.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.eagle3 = spec.method == "eagle3"
        self.speculation: Speculation | None = None
        self.ship_mm_embeds = True
        self.live = False  # warm-up and profiling steps propose nothing (``RemoteDraftWorker``)
        self.prompts = PromptAnnouncer(vllm_config.cache_config.block_size,
                                       bool(vllm_config.cache_config.enable_prefix_caching))
        self.new_requests: dict[str, Any] = {}  # req_id -> vLLM's NewRequestData (prompt, images), until finished
        self._mm_capable = bool(vllm_config.model_config.supports_multimodal_inputs)
        self._placeholders = torch.zeros(vllm_config.scheduler_config.max_num_seqs, self.num_speculative_steps,
                                         dtype=torch.int64, device=device)
        self._batch: _Batch | None = None  # awaiting its drafts (asynchronous scheduling)
        self.plain_steps = [0]  # steps without drafts (read by the worker's statistics)
        # Steps whose drafts were written, and a running sum of the ids written: equal on every rank when every
        # rank verified the same drafts (kept on the device: read only with the statistics).
        self.writes = 0
        self._digest = torch.zeros((), dtype=torch.int64, device=device)
        # Read by V2's runner.
        self.draft_logits = None  # drafts are greedy tokens: vLLM's rejection sampler treats them as such
        self.draft_token_confidence_probs = None
        self.pcp_manager = None

    def attach(self, speculation: Speculation, ship_mm_embeds: bool = True) -> None:
        self.speculation, self.ship_mm_embeds = speculation, ship_mm_embeds

    # --- V2's interface besides propose: nothing to build, capture or load here ----------------------------------
    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        return None

    def capture(self) -> None:
        return None

    @property
    def supports_mm_inputs(self) -> bool:
        """V2 gathers image embeddings for the drafter when this says so: while a running request still has image
        positions ahead of what it computed."""
        if not (self._mm_capable and self.ship_mm_embeds and self.speculation is not None):
            return False
        computed = self.req_states.num_computed_tokens_np
        for rid, state in self.new_requests.items():
            idx = self.req_states.req_id_to_index.get(rid)
            if idx is not None and any(f.mm_position.offset + f.mm_position.length > computed[idx] + 1
                                       for f in state.mm_features or ()):
                return True
        return False

    # --- one step --------------------------------------------------------------------------------------------------
    def propose(
        self,
        input_batch: Any,
        attn_metadata: dict[str, Any],
        slot_mappings: dict[str, torch.Tensor],
        last_hidden_states: torch.Tensor,  # [num_tokens, hidden_size]
        aux_hidden_states: list[torch.Tensor] | None,  # EAGLE-3: layers x [num_tokens, hidden_size]
        num_sampled: torch.Tensor,  # [num_reqs] tokens sampled this step (0: a prompt chunk before its end)
        num_rejected: torch.Tensor,  # [num_reqs] draft slots rejected this step
        last_sampled: torch.Tensor,  # [max_num_reqs, 1] each request-state slot's last sampled token
        next_prefill_tokens: torch.Tensor,  # [lookahead, max_num_reqs] each slot's next prompt token
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        dp_sync_state: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs: tuple[list[torch.Tensor], torch.Tensor] | None = None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:  # [num_reqs, K] placeholders: the drafts reach req_states.draft_tokens in begin_step
        num_reqs = input_batch.num_reqs
        placeholders = self._placeholders[:num_reqs]
        if dummy_run or not self.live:
            return placeholders
        self._batch = _Batch(list(input_batch.req_ids[:num_reqs]),
                             np.asarray(input_batch.idx_mapping_np[:num_reqs], dtype=np.int64))
        speculation = self.speculation
        if speculation is None or speculation.without_drafter(num_reqs):
            return placeholders
        # Sequence i's rows: its scheduled tokens up to its last accepted one (V2 keeps rejected rows in place). The
        # token after its last row: the sampled one, or the next prompt token of a prompt chunk.
        idx = input_batch.idx_mapping[:num_reqs]
        next_ids = torch.where(num_sampled[:num_reqs] > 0, last_sampled[idx, 0].long(),
                               next_prefill_tokens.view(-1, last_sampled.shape[0])[0][idx].long())
        qsl = np.asarray(input_batch.query_start_loc_np[: num_reqs + 1], dtype=np.int64)
        rows_np, counts, first, input_ids = packed_step_rows(  # the step's one device-to-host copy
            qsl, input_batch.query_start_loc, num_rejected, input_batch.positions, input_batch.input_ids, next_ids)
        offsets = np.cumsum(counts) - counts
        seqs = [SeqSlice(rid, int(off), int(n), int(pos))
                for rid, off, n, pos in zip(self._batch.req_ids, offsets, counts, first, strict=True)]
        seqs, in_prefill = prompt_roles(seqs, input_batch.prefill_len_np[:num_reqs])
        rows = torch.from_numpy(rows_np)

        def build(k: int) -> tuple[DraftStep, torch.Tensor]:
            step = DraftStep(speculation.stats.steps, k, seqs, input_ids)
            self.prompts.attach(step, self.new_requests)  # prefix caching: first steps carry prompts
            hidden = torch.cat(aux_hidden_states, dim=-1) if self.eagle3 and aux_hidden_states else last_hidden_states
            hidden = hidden[rows.to(self.device, non_blocking=True)]
            self._attach_images(step, mm_inputs, rows, int(qsl[-1]), hidden.dtype)
            return step, hidden

        speculation.propose(seqs, in_prefill, build)
        return placeholders

    def _attach_images(self, step: DraftStep, mm_inputs: Any, rows: torch.Tensor, num_tokens: int,
                       dtype: torch.dtype) -> None:
        """The step's image rows and embeddings, travelling like the hidden rows (``encode_hidden``)."""
        stats = self.speculation.stats
        stats.mm_steps += mm_inputs is not None
        picked, embeds = mm_rows(mm_inputs, rows, num_tokens, padded=True)
        if embeds is not None:
            step.mm_rows, (step.mm_embeds, _) = picked, encode_hidden(embeds.to(dtype))
            stats.mm_rows_shipped += len(picked)

    def take(self, placeholders: DraftTokenIds | None) -> DraftTokenIds | None:
        """vLLM's ``take_draft_token_ids``. Synchronous scheduling: the step's drafts, waited for now, as the
        scheduler's lists: each as long as ``Drafts.lengths`` says (empty: no draft slot for that sequence).
        Asynchronous scheduling asks only to check structured outputs' drafts against their grammar: the drafts are
        waited for and written now (``begin_step`` then has none left to write), and handed over as written.

        Worked example (synchronous): req_ids [a, b], drafts [[5, 6], [8, 9]] with b short -> [[5, 6], []]."""
        if placeholders is None:
            return None
        if self.async_scheduling:
            written = self._write_awaited_drafts()
            return placeholders if written is None else DraftTokenIds(list(placeholders.req_ids), written.tolist())
        if self.speculation is None:
            return placeholders
        drafts = self.speculation.collect()
        if drafts is None or len(drafts.ids) != len(placeholders.req_ids):
            return DraftTokenIds(list(placeholders.req_ids), [[] for _ in placeholders.req_ids])
        ids = [row[:n] for row, n in zip(drafts.ids.tolist(), drafts.lengths(), strict=True)]
        return DraftTokenIds(list(placeholders.req_ids), ids)

    def nothing_to_take(self) -> bool:
        return self.speculation is not None and self.speculation.nothing_to_take()

    def begin_step(self, scheduler_output: Any) -> None:
        """The worker's ``execute_model``, before V2 prepares the step: the drafts scheduled for it written where V2
        reads them (every rank), then the sequences the scheduler finished freed (the driver)."""
        if self.async_scheduling:
            self._write_awaited_drafts()
        else:
            self._write_scheduled_drafts(scheduler_output.scheduled_spec_decode_tokens)
        for new in scheduler_output.scheduled_new_reqs:
            self.new_requests[new.req_id] = new
        finished = scheduler_output.finished_req_ids
        for rid in finished:
            self.new_requests.pop(rid, None)
        if self.speculation is None:
            return
        self.speculation.settle()
        if finished:
            self.prompts.finished(finished)
            self.speculation.finish(sorted(finished))
        if scheduler_output.total_num_scheduled_tokens == 0:
            self.speculation.idle()

    def _write_scheduled_drafts(self, scheduled: dict[str, list[int]]) -> None:
        """Synchronous scheduling: the scheduler carries the driver's drafts to every rank; V2 reads them from
        ``req_states.draft_tokens`` (the first len(drafts) of each row)."""
        scheduled = {rid: ids for rid, ids in scheduled.items() if ids}
        if not scheduled:
            self.plain_steps[0] += 1
            return
        index = self.req_states.req_id_to_index
        rids = [rid for rid in scheduled if rid in index]
        ids = np.zeros((len(rids), self.num_speculative_steps), np.int64)
        for i, rid in enumerate(rids):
            ids[i, : len(scheduled[rid])] = scheduled[rid]
        self._write(np.array([index[rid] for rid in rids], np.int64), torch.from_numpy(ids))

    def _write_awaited_drafts(self) -> torch.Tensor | None:  # [B, K] the ids written, None: nothing awaited
        """Asynchronous scheduling: the last step's drafts, waited for on the driver and broadcast to the other
        ranks (every rank calls this at the same step, with the same batch)."""
        batch, self._batch = self._batch, None
        if batch is None:
            return None
        ids = torch.full((len(batch.req_ids), self.num_speculative_steps), FILLER_TOKEN, dtype=torch.int64)
        if self.speculation is not None:
            drafts = self.speculation.collect()
            if drafts is not None and len(drafts.ids) == len(batch.req_ids):
                ids = torch.from_numpy(_filled(drafts, self.num_speculative_steps))
        ids = ids.to(self.device, non_blocking=True)
        if self.tp_size > 1:
            from vllm.distributed.parallel_state import get_tp_group

            ids = get_tp_group().broadcast(ids, src=0)
        self._write(batch.idx, ids)
        return ids

    def _write(self, idx: np.ndarray, ids: torch.Tensor) -> None:  # idx: [n] slots; ids: [n, K]
        ids = ids.to(self.device, non_blocking=True)  # small uploads, not waited for
        self.req_states.draft_tokens[torch.from_numpy(idx).to(self.device, non_blocking=True)] = ids
        self.writes += 1
        self._digest += ids.sum()

    def digest(self) -> int:
        """The sum of every draft id written on this rank (a device sync: for statistics, not the step)."""
        return int(self._digest)


def _filled(drafts: Drafts, k_max: int) -> np.ndarray:  # [B, k_max] int64
    """The drafts as K slots per sequence: a short sequence's, and the slots past the step's k, ``FILLER_TOKEN``.

    Worked example: k_max 3, ids [[5, 6], [8, 9]] (k = 2), row 1 short -> [[5, 6, F], [F, F, F]]."""
    out = np.full((len(drafts.ids), k_max), FILLER_TOKEN, np.int64)
    for i, n in enumerate(drafts.lengths()):
        out[i, :n] = drafts.ids[i, :n]
    return out
