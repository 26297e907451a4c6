"""The thin vLLM adapter: vLLM's EAGLE proposer slot, filled by ``RemoteEagleProposer``, which turns the rows vLLM
verified into one ``DraftStep`` and the ``Drafts`` that come back into vLLM's ``DraftTokenIds``.

Where it sits: ``actors.verifier.worker`` (vLLM's ``worker_cls``) puts it in ``model_runner.drafter`` before the
model loads, so no draft weights are ever loaded here. vLLM's model runner still does everything around drafting:
its scheduler, paged KV cache (target layers only), rejection sampler and metrics, and the inherited
``prepare_next_token_ids_*`` / ``prepare_inputs_*``. What happens to a step is ``actors.verifier.speculation``'s.

``VLLM_INTERNALS`` lists the internals of runner V1 this module reads or writes; ``check_vllm`` refuses an engine
where one has moved, so a vLLM upgrade fails loudly at start, not silently in a step.

Only tensor-parallel rank 0 (the driver) drafts: vLLM's scheduler takes draft tokens from that rank's output and
broadcasts them with the next step, so the other ranks return placeholders of the right shape. That holds with
async scheduling off and one pipeline stage (``actors.verifier.options``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.utils import CpuGpuBuffer

from actors.messages import DraftStep, SeqSlice
from actors.verifier import vllm_internals
from actors.verifier.prefix import PromptAnnouncer
from actors.verifier.speculation import Speculation
from actors.verifier.step_rows import mm_rows, packed_step_rows, prompt_roles
from actors.wire import encode_hidden

# (class, attribute): what this module relies on. Model runner V1 (GPU and CPU alike), its input batch, its proposer.
VLLM_INTERNALS = (
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "_prepare_inputs"),  # wrapped: plain steps without drafts
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "propose_draft_token_ids"),  # calls our propose; wrapped
    ("vllm.v1.worker.gpu_input_batch:InputBatch", "num_reqs"),
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "take_draft_token_ids"),  # our drafts' placeholders
    ("vllm.v1.worker.gpu_input_batch:CachedRequestState", "prompt_token_ids"),  # prefix caching: prompts announced
    ("vllm.v1.worker.gpu_input_batch:CachedRequestState", "mm_features"),  # images ahead
    ("vllm.v1.worker.gpu_input_batch:CachedRequestState", "num_computed_tokens"),
    ("vllm.v1.spec_decode.eagle:EagleProposer", "propose"),
    ("vllm.v1.spec_decode.eagle:EagleProposer", "prepare_next_token_ids_padded"),
)


def check_vllm() -> None:
    """``RuntimeError`` naming each of ``VLLM_INTERNALS`` this vLLM lacks."""
    vllm_internals.check(VLLM_INTERNALS, "model runner V1 (see actors.verifier.vllm_adapter)")


class RemoteEagleProposer(EagleProposer):
    def __init__(self, vllm_config: Any, device: torch.device, runner: Any, speculation: Speculation | None,
                 ship_mm_embeds: bool = True) -> None:
        """``speculation``: None on the ranks other than the driver. ``ship_mm_embeds``: False only to measure
        drafting from image placeholder ids.

        Of vLLM's device buffers, the inherited code the runner calls reads ``input_ids`` and
        ``backup_next_token_ids``; the rest (hidden states and input embeddings of [max_num_batched_tokens, H],
        positions, slot mappings: ~1.6 GB per rank on Scout) feed a draft model that does not run here. vLLM's
        constructor makes them on the meta device (no memory); the two read are made on the real device, and the
        others become None, so a code path that would use them fails loudly."""
        self.runner, self.ship_mm_embeds, self._mm_capable = runner, ship_mm_embeds, False  # vLLM's __init__ reads
        super().__init__(vllm_config, torch.device("meta"), runner)  # supports_mm_inputs
        self.device = device
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) and value.is_meta:
                setattr(self, name, None)
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)
        self.backup_next_token_ids = CpuGpuBuffer(self.max_batch_size, dtype=torch.int32, device=device,
                                                  with_numpy=True)
        self.speculation = speculation
        self.kv_cache_gid = 0
        self.prompts = PromptAnnouncer(0, bool(vllm_config.cache_config.enable_prefix_caching))
        self.plain_steps = _plain_steps_without_drafts(runner)
        _no_proposal_without_drafter(runner, speculation)

    # --- images: vLLM gathers image embeddings for the drafter (every step) when its proposer says it takes them;
    # this one says so only while a request of the batch still has image positions ahead of what it computed.
    @property
    def supports_mm_inputs(self) -> bool:
        return self._mm_capable and self.ship_mm_embeds and self._images_ahead()

    @supports_mm_inputs.setter
    def supports_mm_inputs(self, value: bool) -> None:  # set by vLLM's constructor: the target takes images
        self._mm_capable = bool(value)

    def _images_ahead(self) -> bool:
        requests = self.runner.requests
        for rid in self.runner.input_batch.req_ids:
            state = requests.get(rid)
            if state is not None and any(f.mm_position.offset + f.mm_position.length > state.num_computed_tokens + 1
                                         for f in state.mm_features or ()):  # the drafter's rows look one ahead
                return True
        return False

    # --- no draft model in this process --------------------------------------------------------------------------
    def load_model(self, target_model: torch.nn.Module) -> None:
        return None

    def initialize_attn_backend(self, kv_cache_config: Any, kernel_block_sizes: Any = None) -> None:
        self.draft_attn_groups = []  # the inherited prepare_inputs_* read block_size; no draft attention groups
        self.block_size = self.prompts.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size

    def validate_same_kv_cache_group(self, kv_cache_config: Any) -> None:
        return None

    def initialize_cudagraph_keys(self, cudagraph_mode: Any) -> None:
        return None

    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        return None

    # --- one step ------------------------------------------------------------------------------------------------
    def propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,  # [N]
        target_positions: torch.Tensor,  # [N]
        target_hidden_states: torch.Tensor,  # [N, width]
        next_token_ids: torch.Tensor,  # [B]
        token_indices_to_sample: torch.Tensor | None,  # [B]
        common_attn_metadata: Any,
        sampling_metadata: Any,
        mm_embed_inputs: Any = None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,
        slot_mappings: Any = None,
    ) -> torch.Tensor:  # [B, K] placeholders: the drafts go to vLLM's scheduler through take_draft_token_ids
        batch_size = common_attn_metadata.batch_size()
        placeholder = torch.zeros(batch_size, num_speculative_tokens, dtype=torch.long, device=target_token_ids.device)
        if self.speculation is None:
            return placeholder
        # Sequence i's rows: its scheduled tokens up to its last accepted one; on vLLM's padded path its rejected
        # drafts stay after it (token_indices_to_sample: each one's last accepted row), else they were dropped.
        qsl = common_attn_metadata.query_start_loc_cpu[: batch_size + 1].numpy().astype(np.int64)
        qsl_dev = common_attn_metadata.query_start_loc[: batch_size + 1].long()
        if token_indices_to_sample is None:
            num_rejected = torch.zeros(batch_size, dtype=torch.int64, device=qsl_dev.device)
        else:
            num_rejected = qsl_dev[1:] - 1 - token_indices_to_sample[:batch_size].long()
        rows_np, counts, first, input_ids = packed_step_rows(  # the step's one device-to-host copy
            qsl, qsl_dev, num_rejected, target_positions, target_token_ids, next_token_ids[:batch_size])
        offsets = np.cumsum(counts) - counts
        seqs = [SeqSlice(rid, int(off), int(n), int(pos)) for rid, off, n, pos
                in zip(self.runner.input_batch.req_ids[:batch_size], offsets, counts, first, strict=True)]
        seqs, in_prefill = prompt_roles(seqs, self.runner.input_batch.num_prompt_tokens)
        rows = torch.from_numpy(rows_np)

        def build(k: int) -> tuple[DraftStep, torch.Tensor]:
            step = DraftStep(self.speculation.stats.steps, k, seqs, input_ids)
            self.prompts.attach(step, self.runner.requests)  # prefix caching: first steps carry prompts
            hidden = target_hidden_states[rows.to(target_hidden_states.device, non_blocking=True)]
            self._attach_images(step, mm_embed_inputs, rows, int(qsl[-1]), token_indices_to_sample is not None,
                                hidden.dtype)
            return step, hidden

        self.speculation.propose(seqs, in_prefill, build)
        return placeholder

    def _attach_images(self, step: DraftStep, mm_embed_inputs: Any, rows: torch.Tensor, num_tokens: int,
                       padded: bool, dtype: torch.dtype) -> None:
        """The step's image rows and embeddings, travelling like the hidden rows (``encode_hidden``)."""
        stats = self.speculation.stats
        stats.mm_steps += mm_embed_inputs is not None
        picked, embeds = mm_rows(mm_embed_inputs, rows, num_tokens, padded)
        if embeds is not None:
            step.mm_rows, (step.mm_embeds, _) = picked, encode_hidden(embeds.to(dtype))
            stats.mm_rows_shipped += len(picked)

    def take(self, placeholders: DraftTokenIds | None) -> DraftTokenIds | None:
        """vLLM's ``take_draft_token_ids``: the runner's ``placeholders`` (the step's req_ids, ``[B, K]`` ids)
        replaced by the drafts, each request's list as long as ``Drafts.lengths`` says (empty: vLLM schedules and
        verifies no draft token for it).

        Worked example: req_ids [a, b], drafts [[5, 6], [8, 9]] with b short -> [[5, 6], []]."""
        drafts = self.speculation.collect() if self.speculation is not None else None
        if drafts is None or placeholders is None:
            return placeholders
        if len(drafts.ids) != len(placeholders.req_ids):  # not the batch propose saw: no drafts rather than wrong ones
            return replace(placeholders, draft_token_ids=[[] for _ in placeholders.req_ids])
        ids = [row[:n] for row, n in zip(drafts.ids.tolist(), drafts.lengths(), strict=True)]
        return replace(placeholders, draft_token_ids=ids)

    def nothing_to_take(self) -> bool:
        """Whether this step hands vLLM no draft token at all (``actors.verifier.draft_handoff`` then skips the
        engine core's round trip for them)."""
        return self.speculation is not None and self.speculation.nothing_to_take()

    def begin_step(self, scheduler_output: Any) -> None:
        """The worker's ``execute_model``, before the step: the sequences vLLM's scheduler finished are freed (on
        their drafters and in every table: one path); an idle step tells the draft-length policy."""
        if self.speculation is None:
            return
        self.speculation.settle()
        finished = scheduler_output.finished_req_ids
        if finished:
            self.prompts.finished(finished)
            self.speculation.finish(sorted(finished))
        if scheduler_output.total_num_scheduled_tokens == 0:
            self.speculation.idle()


def _plain_steps_without_drafts(runner: Any) -> list[int]:
    """A decode step none of whose requests was scheduled a draft token runs as a target-only runner's step.

    vLLM's V1 runner takes its speculative path on every step once a ``speculative_config`` is set
    (``_prepare_inputs``: ``use_spec_decode = self.speculative_config is not None``): spec-decode metadata, its
    rejection sampler, a ``[batch, 1 + k]`` output, also when no request has drafts. So for a step with no draft
    tokens and one token per request (decode only: a prompt chunk keeps the padded layout images are read in),
    ``_prepare_inputs`` runs with no speculative config: logits at each request's last row, vLLM's plain sampler.
    Sampling one token from the target's logits is what the rejection sampler does with no drafts (its bonus token),
    so outputs are unchanged. The runner still calls ``propose`` after sampling, so the policy keeps choosing k.

    Returns a one-element list counting the steps that ran so."""
    prepare = runner._prepare_inputs
    count = [0]

    def _prepare_inputs(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
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


def _no_proposal_without_drafter(runner: Any, speculation: Speculation | None) -> None:
    """With no drafter ready, a step proposes nothing before vLLM prepares anything for a proposal: the runner's
    ``propose_draft_token_ids`` (next tokens, the target's hidden rows sliced and concatenated, then ``propose``)
    answers an empty list per request at once, as a runner without a drafter has none; the scheduler then schedules
    no draft token. Only the driver rank knows whether a drafter is ready; the others propose placeholders."""
    if speculation is None:
        return
    propose = runner.propose_draft_token_ids

    def propose_draft_token_ids(*args: Any, **kwargs: Any) -> Any:
        batch_size = runner.input_batch.num_reqs
        if speculation.without_drafter(batch_size):
            return [[] for _ in range(batch_size)]
        return propose(*args, **kwargs)

    runner.propose_draft_token_ids = propose_draft_token_ids
