"""``RemoteEagleProposer``: vLLM's ``EagleProposer`` with the draft model replaced by a remote drafter.

vLLM's model runner still does everything around drafting: its scheduler, paged KV cache (target layers
only: no draft layers are built here), rejection sampler and metrics, and its ``prepare_next_token_ids_*`` /
``prepare_inputs_*`` (inherited). ``propose`` gets what the runner gives vLLM's own EAGLE head each step:

    target_token_ids      [num_tokens]               tokens verified this step, all sequences, flattened
    target_positions      [num_tokens]
    target_hidden_states  [num_tokens, width]        EAGLE: last layer (post-norm); EAGLE-3: aux layers, concat
    next_token_ids        [batch_size]               the token sampled after each sequence's last accepted one
    token_indices_to_sample [batch_size] | None      row of each sequence's last accepted token (padded path)

and returns draft token ids ``[batch_size, k]``. Sequence i's rows are ``query_start_loc[i]`` up to its last
accepted row; rows after it (rejected drafts, padded path) are dropped before shipping. Sequences are in
``runner.input_batch.req_ids`` order.

Which sequences' draft state is freed: only those vLLM's scheduler finished (or aborted), which the worker hands
over from each ``SchedulerOutput.finished_req_ids`` (``scheduler_finished``). A running request missing from a
step's batch is *not* finished: vLLM's runner takes every request the scheduler did not schedule this step out of
``input_batch`` (a tight token budget, or a preemption) and puts it back when it is scheduled again; its drafter
keeps its draft KV cache meanwhile, so it comes back drafting with its context (its rows continue where they
stopped; a preempted one restarts from an earlier position, which the drafter rewrites).

Only tensor-parallel rank 0 talks to the drafter: vLLM's scheduler takes draft tokens from that rank's output
and broadcasts them with the next step, so other ranks return placeholders of the right shape. That holds with
async scheduling off and one pipeline stage, which ``actors.verifier.options`` enforces.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from dataclasses import replace as dataclass_replace
from typing import NamedTuple

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.utils import CpuGpuBuffer

from actors.messages import DraftStatus, DraftStep, SeqRole, SeqSlice
from actors.metrics import ProposerStats, SpecDecodeStats, WaitHistogram
from actors.timing import ms_since
from actors.verifier.client import BatchTiming, DraftClient, StepInFlight, Undrafted, check_drafts
from actors.verifier.draft_length import DraftLength, FixedDraftLength, bucket, build_draft_length
from actors.verifier.prefix import PromptAnnouncer
from actors.wire import encode_hidden

logger = logging.getLogger(__name__)
MAX_PER_REQUEST = 4096
MAX_TIMINGS = 65536  # per-step timings kept (the latest)


@dataclass
class StepTiming:
    batch_size: int
    num_tokens: int
    propose_ms: float  # the verifier's time on the step's drafts: propose() and collect_drafts() (not the gap)
    ship_ms: float
    wait_ms: float  # blocked on drafters (beyond their compute, when an answer was awaited)
    compute_ms: float
    all_hits: bool  # no drafter answer was awaited (every sequence a branch hit, or a prompt step)


class _InFlight(NamedTuple):
    """A step ``propose`` sent to the drafters, until ``collect_drafts`` reads its drafts."""

    run: StepInFlight  # the client's
    step: DraftStep  # one SeqSlice per sequence of the runner's batch, in its order; its k is this step's (<= vLLM's)
    device: torch.device  # the verifier's, where the drafts go
    propose_ms: float  # the time propose() took


class _TimedStep(NamedTuple):
    """A decode step whose period (from its ``propose`` to the next) ``auto`` may be handed."""

    start: float  # when its propose() began (perf_counter seconds)
    batch_size: int
    k: int  # draft tokens per sequence it proposed
    previous_k: int | None  # the k of the decode step just before it; None: it followed a prompt step or a gap


class SentDrafts(NamedTuple):
    """Drafts proposed for a sequence, awaiting the step that says how many were accepted."""

    num_drafts: int
    last_position: int  # of the row the drafts follow: the next step starts at last_position + 1
    source: str  # "on_demand" or "branch" (precomputed)


@dataclass
class ProposerState:
    """What the proposer has learnt, read by the worker's RPCs."""

    steps: int = 0
    failures: int = 0
    timings: deque[StepTiming] = field(default_factory=lambda: deque(maxlen=MAX_TIMINGS))
    per_request: OrderedDict[str, SpecDecodeStats] = field(default_factory=OrderedDict)  # the latest requests
    pending: dict[str, SentDrafts] = field(default_factory=dict)
    # Asynchronous drafting: sequences that had precomputed drafts, the hits among them, per-request hits, and
    # acceptance by where the drafts came from ("branch": precomputed; "on_demand": drafted for this step).
    branch_lookups: int = 0
    branch_hits: int = 0
    per_request_hits: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, SpecDecodeStats] = field(default_factory=dict)
    waits: WaitHistogram = field(default_factory=WaitHistogram)  # each step's wait for the drafters, for /metrics
    # Sequences proposed no draft tokens, by reason (``actors.verifier.client.Undrafted``), and the steps none of
    # whose sequences got drafts because no drafter could draft them (verified target-only).
    undrafted: dict[str, int] = field(default_factory=dict)
    steps_without_drafts: int = 0
    # The draft length chosen per step (``actors.verifier.draft_length``): steps per k, [K + 1]; and the policy's
    # estimated output tokens per second for the last step (0 when it has no estimate).
    speculative_tokens: list[int] = field(default_factory=list)
    estimated_goodput: float = 0.0
    # Images: rows whose input embedding was the target's image embedding, and steps whose propose() was handed
    # image embeddings (the runner gathered them).
    mm_rows_shipped: int = 0
    mm_steps: int = 0

    def reset_measurements(self) -> None:
        """Forget the timings, the per-request tables and the branch counters (``eagle_cluster_reset_stats``, between
        a benchmark's runs); the other counters and the drafts awaiting their step stay."""
        self.timings.clear()
        self.per_request.clear()
        self.per_request_hits.clear()
        self.by_source.clear()
        self.branch_lookups = self.branch_hits = 0

    def stats(self, client: dict | None = None, counters_only: bool = False,
              goodput_by_k: dict[str, list[float | None]] | None = None) -> ProposerStats:
        """``counters_only``: without the per-request tables (what ``/metrics`` reads); ``goodput_by_k``: the
        draft-length policy's estimates (``DraftLength.goodput_table``)."""
        per_request = {} if counters_only else dict(self.per_request)
        hits = {} if counters_only else dict(self.per_request_hits)
        return ProposerStats(self.steps, self.failures, per_request, self.branch_lookups, self.branch_hits, hits,
                             dict(self.by_source), dict(client or {}),
                             step_waits=replace(self.waits, counts=list(self.waits.counts)),
                             undrafted=dict(self.undrafted), steps_without_drafts=self.steps_without_drafts,
                             speculative_tokens=list(self.speculative_tokens),
                             estimated_goodput=self.estimated_goodput,
                             goodput_by_k=dict(goodput_by_k or {}))


def step_rows(
    query_start_loc: torch.Tensor,  # [batch_size + 1] (cpu)
    last_rows: torch.Tensor,  # [batch_size] row of each sequence's last accepted token
) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_kept] rows to ship, sequence by sequence; [batch_size] counts)
    """Worked example: query_start_loc [0, 4, 5], last rows [1, 4] -> keep rows [0, 1, 4] (rows 2, 3 were the
    rejected drafts of sequence 0), counts [2, 1]."""
    starts = query_start_loc[:-1]
    counts = last_rows - starts + 1
    seq = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return starts[seq] + offsets, counts


def step_seqs(
    req_ids: list[str],  # [batch_size], in the runner's batch order
    query_start_loc: torch.Tensor,  # [batch_size + 1] (cpu)
    last_rows: torch.Tensor,  # [batch_size] row of each sequence's last accepted token (cpu)
    positions: torch.Tensor,  # [num_tokens] target_positions (any device)
) -> tuple[torch.Tensor, list[SeqSlice]]:  # ([num_kept] rows to ship (cpu), each sequence's slice of them)
    """The rows a step ships (``step_rows``) and the ``SeqSlice`` of each sequence over them (role ``DRAFT``;
    ``RemoteEagleProposer._prompt_roles`` marks prompt steps).

    Worked example: req_ids [a, b], query_start_loc [0, 4, 5], last rows [1, 4], positions [7, 8, 9, 10, 3] -> rows
    [0, 1, 4]; a: start 0, 2 rows from position 7; b: start 2, 1 row from position 3."""
    rows, counts = step_rows(query_start_loc, last_rows)
    first = positions[rows.to(positions.device)].cpu()
    offsets = (torch.cumsum(counts, 0) - counts).tolist()
    return rows, [SeqSlice(rid, off, n, int(first[off]))
                  for rid, off, n in zip(req_ids, offsets, counts.tolist(), strict=True)]


def step_input_ids(
    target_token_ids: torch.Tensor,  # [num_tokens]
    next_token_ids: torch.Tensor,  # [batch_size] the token sampled after each sequence's last accepted one
    query_start_loc: torch.Tensor,  # [batch_size + 1] (cpu)
    last_rows: torch.Tensor,  # [batch_size] (cpu)
    rows: torch.Tensor,  # [num_kept] rows shipped (``step_rows``), on target_token_ids' device
) -> np.ndarray:  # [num_kept] int32
    """Each shipped row's input token: the token after it, ``target_token_ids[j + 1]``, or the sampled next token
    for each sequence's last row (EAGLE pairs token t + 1 with hidden state t).

    Worked example: tokens [t0, t1, t2, t3, u0], next [n0, n1], query_start_loc [0, 4, 5], last rows [1, 4], rows
    [0, 1, 4] -> [t1, n0, n1]."""
    end = int(query_start_loc[-1])
    shifted = torch.empty_like(target_token_ids[:end])
    shifted[:-1] = target_token_ids[1:end]
    shifted[last_rows.to(shifted.device)] = next_token_ids.to(shifted.dtype)
    return shifted[rows].cpu().numpy().astype(np.int32)


class RemoteEagleProposer(EagleProposer):
    def __init__(self, vllm_config, device, runner, client: DraftClient | None, is_driver: bool) -> None:
        # Of vLLM's device buffers, the inherited code the runner calls (``prepare_next_token_ids_*``,
        # ``prepare_inputs*``) reads ``input_ids`` (its device) and ``backup_next_token_ids``. The rest
        # (``hidden_states`` and ``inputs_embeds`` of [max_num_batched_tokens, H], positions, slot mappings,
        # aranges, masks) feed a draft model that does not run here: ~1.6 GB per rank on Scout at 80k batched
        # tokens. vLLM's constructor makes them on the meta device (no memory); the two read are then made on the
        # real device, and the others become None, so a code path that would use them fails loudly.
        super().__init__(vllm_config, torch.device("meta"), runner)
        self.device = device
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) and value.is_meta:
                setattr(self, name, None)
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)
        self.backup_next_token_ids = CpuGpuBuffer(self.max_batch_size, dtype=torch.int32, device=device,
                                                  with_numpy=True)
        self.runner = runner
        self.client = client
        self.is_driver = is_driver
        self.kv_cache_gid = 0
        self.ship_mm_embeds = True
        self.state = ProposerState()
        self._finished: set[str] = set()  # finished by the scheduler, not yet sent to the drafters
        self.draft_lengths: dict[str, int] = {}  # req_id -> draft tokens proposed this step, where fewer than k
        # Prefix caching: a sequence's first step carries its prompt (block size set in initialize_attn_backend).
        self.prompts = PromptAnnouncer(0, bool(vllm_config.cache_config.enable_prefix_caching))
        # --- issue 23: the draft length per step (``actors.verifier.draft_length``) ---
        spec_k = vllm_config.speculative_config.num_speculative_tokens
        cfg = (vllm_config.additional_config or {}).get("eagle_cluster", {})
        self.draft_length: DraftLength = build_draft_length(cfg.get("draft_length"), spec_k,
                                                            vllm_config.scheduler_config.max_num_seqs)
        self.state.speculative_tokens = [0] * (spec_k + 1)
        self._last_step: _TimedStep | None = None
        self._in_flight: _InFlight | None = None  # sent by propose, read by collect_drafts

    # --- images ------------------------------------------------------------------------------------
    # vLLM's runner gathers the image embeddings for the drafter (``_gather_mm_embeddings``, every step) when the
    # target and the drafter both say ``supports_mm_inputs``. vLLM's own proposer decides that in ``load_model``
    # (never called here); this one says yes only while a request of the batch still has image positions ahead of
    # what it has computed, so text-only batches and decode steps gather nothing.
    @property
    def supports_mm_inputs(self) -> bool:
        return self._mm_capable and self.ship_mm_embeds and self._batch_has_images_ahead()

    @supports_mm_inputs.setter
    def supports_mm_inputs(self, value: bool) -> None:  # set by vLLM's constructor: the target takes images
        self._mm_capable = bool(value)

    draft_length: DraftLength = FixedDraftLength(0)  # class defaults (issue 23): k = K, as before
    _last_step: _TimedStep | None = None
    _mm_capable = False  # class defaults: for proposers built without __init__ (tests)
    prompts = PromptAnnouncer(0, False)
    ship_mm_embeds = True

    def _batch_has_images_ahead(self) -> bool:
        runner = getattr(self, "runner", None)
        if runner is None:
            return False
        requests = runner.requests
        for rid in runner.input_batch.req_ids:
            state = requests.get(rid)
            if state is None or not state.mm_features:
                continue
            done = state.num_computed_tokens + 1  # the drafter's rows look one position ahead
            if any(f.mm_position.offset + f.mm_position.length > done for f in state.mm_features):
                return True
        return False

    def _mm_rows(
        self,
        mm_embed_inputs: tuple[list[torch.Tensor], torch.Tensor] | None,
        rows: torch.Tensor,  # [num_kept] rows shipped, indices into the step's scheduled tokens (cpu)
        num_tokens: int,
        padded: bool = True,
    ) -> tuple[np.ndarray, torch.Tensor | None]:
        """The shipped rows (indices into ``rows``) whose input token is an image position, and their merged
        embeddings ``[M, H]``: vLLM's ``(mm_embeds, is_mm_embed)`` (``is_mm_embed`` over the step's scheduled
        tokens, shifted by one as the drafter's input ids are; the embeddings of its True rows, in order).

        Worked example: is_mm_embed [0, 1, 1, 0, 1], embeds e1, e2, e3 (for rows 1, 2, 4); rows kept [0, 1, 4]
        -> mm rows [1, 2] (kept rows 1 and 4), embeddings [e1, e3].

        vLLM's non-padded path (``disable_padded_drafter_batch``) has dropped rejected rows before ``propose``, so
        its rows no longer line up with the scheduled tokens whenever some were dropped: then no image rows are
        shipped (the drafter embeds the placeholder ids; lossless either way)."""
        none = np.zeros(0, np.int32), None
        if not mm_embed_inputs:
            return none
        embeds, is_mm = mm_embed_inputs
        if not embeds or is_mm is None:
            return none
        if is_mm.shape[0] < num_tokens or (not padded and is_mm.shape[0] != num_tokens):
            return none
        is_mm = is_mm[:num_tokens].cpu()
        if not bool(is_mm.any()):
            return none
        flat = torch.cat([e.reshape(-1, e.shape[-1]) for e in embeds])  # [sum(is_mm), H]
        order = torch.cumsum(is_mm.long(), 0) - 1  # index into flat of each True row
        sel = is_mm[rows]
        if not bool(sel.any()):
            return none
        picked = order[rows[sel]].to(flat.device)
        return torch.nonzero(sel).flatten().numpy().astype(np.int32), flat[picked]

    # --- no draft model in this process --------------------------------------------------------------
    def load_model(self, target_model: torch.nn.Module) -> None:
        return None

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        # The proposer's inherited prepare_inputs_* read block_size; no draft attention groups exist.
        self.kv_cache_gid = 0
        self.draft_attn_groups = []
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.prompts.block_size = self.block_size  # prefix caching: the drafters hash blocks of this size

    def validate_same_kv_cache_group(self, kv_cache_config) -> None:
        return None

    def initialize_cudagraph_keys(self, cudagraph_mode) -> None:
        return None

    def dummy_run(self, *args, **kwargs) -> None:
        return None

    # --- one step ------------------------------------------------------------------------------------
    def propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,  # [num_tokens]
        target_positions: torch.Tensor,  # [num_tokens]
        target_hidden_states: torch.Tensor,  # [num_tokens, width]
        next_token_ids: torch.Tensor,  # [batch_size]
        token_indices_to_sample: torch.Tensor | None,  # [batch_size]
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,
        slot_mappings=None,
    ) -> torch.Tensor:  # [batch_size, k]
        start = time.perf_counter()
        k = num_speculative_tokens
        batch_size = common_attn_metadata.batch_size()
        placeholder = torch.zeros(batch_size, k, dtype=torch.long, device=target_token_ids.device)
        self.settle()
        self.draft_lengths = {}
        if not self.is_driver or self.client is None:
            return placeholder
        qsl = common_attn_metadata.query_start_loc_cpu[: batch_size + 1].long()
        if token_indices_to_sample is None:
            last = qsl[1:] - 1
        else:
            last = token_indices_to_sample[:batch_size].long().cpu()
        rows, seqs = step_seqs(list(self.runner.input_batch.req_ids[:batch_size]), qsl, last, target_positions)
        finished, self._finished = sorted(self._finished), set()
        seqs, in_prefill = self._prompt_roles(seqs)
        self._account(seqs, finished, k, in_prefill)
        k_step = self._choose_draft_length(start, batch_size, k, seqs, in_prefill)
        if k_step == 0:  # a target-only step: nothing shipped, drafted or verified
            if finished:
                self.client.free(finished)
            for s in seqs:
                self.limit_drafts(s.req_id, 0)
            return placeholder
        if not self.client.usable():
            # No drafter can draft (none found yet, all dropped, the pool gone): nothing is shipped or waited
            # for, no sequence gets draft tokens, and vLLM verifies none: the step runs at target-only speed.
            if finished:
                self.client.free(finished)
            self._undraft(seqs, dict.fromkeys(range(len(seqs)), Undrafted.NO_DRAFTER))
            return placeholder
        rows_dev = rows.to(target_token_ids.device)
        input_ids = step_input_ids(target_token_ids, next_token_ids[:batch_size], qsl, last, rows_dev)
        hidden = target_hidden_states[rows_dev]
        if k_step < k:  # the drafter drafts k_step tokens, not k; acceptance is counted over those
            for s in seqs:
                self.limit_drafts(s.req_id, k_step)
        step = DraftStep(self.state.steps, k_step, seqs, input_ids, finished)
        self.prompts.attach(step, getattr(self.runner, "requests", {}))  # prefix caching: first steps carry prompts
        self._attach_images(step, mm_embed_inputs, rows, int(qsl[-1]), token_indices_to_sample is not None,
                            hidden.dtype)
        self.state.steps += 1
        try:
            run = self.client.send_batch(step, hidden)
        except Exception as e:
            self._step_failed(step, e)
            return placeholder
        self._in_flight = _InFlight(run, step, placeholder.device,
                                    (time.perf_counter() - start) * 1e3)
        return placeholder

    def collect_drafts(self) -> torch.Tensor | None:  # [batch_size, k_step]
        """The drafts of the step ``propose`` sent, waited for now: the worker's ``take_draft_token_ids``, which
        vLLM's engine core calls after it has sent the step's tokens to the clients (``post_step``), so the
        drafter drafts while the verifier's outputs travel. None when this step shipped nothing (a target-only
        step, no usable drafter, a tensor-parallel rank other than the driver); each sequence without drafts gets
        none this step (``limit_drafts``)."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return None
        start = time.perf_counter()
        answer = self._read_answer(flight)
        if answer is None:
            return None
        drafts, timing = answer
        step = flight.step
        self.state.timings.append(
            StepTiming(len(step.seqs), len(step.input_ids), flight.propose_ms + ms_since(start, self.device),
                       timing.ship_ms, timing.wait_ms, timing.compute_ms, timing.all_hits)
        )
        self.state.waits.observe(timing.wait_ms)  # /metrics: eagle_cluster_step_wait_seconds
        return drafts

    def nothing_to_take(self, req_ids: list[str]) -> bool:
        """Whether this step's ``take_draft_token_ids`` would hand vLLM no draft token at all: nothing was shipped
        (k = 0, no usable drafter) and every request of the batch ``req_ids`` is limited to 0 drafts. The engine core
        then skips that call (``actors.verifier.draft_handoff``)."""
        lengths = self.draft_lengths
        return self._in_flight is None and bool(lengths) and all(lengths.get(rid, 1) == 0 for rid in req_ids)

    def settle(self) -> None:
        """A step's drafts that vLLM never took (it calls ``take_draft_token_ids`` after every step that ran the
        model, so this is a guard): read and dropped before the next step, so the client's state stays whole."""
        if self._in_flight is not None:
            self.collect_drafts()

    def _attach_images(self, step: DraftStep, mm_embed_inputs, rows: torch.Tensor, num_tokens: int, padded: bool,
                       dtype: torch.dtype) -> None:
        """The step's image rows and embeddings (``_mm_rows``), travelling like the hidden rows (``encode_hidden``).
        Padded layout (rows are the step's scheduled tokens), the one this project runs; vLLM gathers the image
        embeddings over the scheduled tokens too."""
        self.state.mm_steps += mm_embed_inputs is not None
        mm_rows, mm_embeds = self._mm_rows(mm_embed_inputs, rows, num_tokens, padded)
        if mm_embeds is not None:
            step.mm_rows = mm_rows
            step.mm_embeds, _ = encode_hidden(mm_embeds.to(dtype))
            self.state.mm_rows_shipped += len(mm_rows)

    def _read_answer(self, flight: _InFlight) -> tuple[torch.Tensor, BatchTiming] | None:
        """The client's drafts ``[batch_size, k]`` on the verifier's device and its timing, the sequences it has
        none for undrafted; None (every sequence undrafted) when it raises: a drafter that errors or dies never
        fails a request."""
        step = flight.step
        seqs, k = step.seqs, step.num_speculative_tokens
        try:
            reply, timing = self.client.collect_batch(flight.run)
            if reply.status is not DraftStatus.OK:  # some drafter failed: its sequences get no drafts this step
                self.state.failures += 1
                logger.warning("drafter failed for %s of step %d (%s)",
                               "all" if reply.status is DraftStatus.FAILED else "part", step.step_id, reply.error)
            # Whatever client is configured, vLLM gets [batch_size, k] ids of its vocabulary.
            checked = check_drafts(np.asarray(reply.draft_token_ids), len(seqs), k,
                                   getattr(self.client, "vocab_size", None))
            drafts = torch.from_numpy(checked.astype(np.int64)).to(flight.device)
            self._record_hits(seqs, reply.branch_lookups, reply.hit_seqs)
        except Exception as e:
            self._step_failed(step, e)
            return None
        self._undraft(seqs, reply.undrafted)
        return drafts, timing

    def _step_failed(self, step: DraftStep, error: Exception) -> None:
        """Sending the step or reading its answer raised: no sequence of it gets drafts this step."""
        self.state.failures += 1
        logger.warning("drafter failed at step %d (%s); this step proposes no drafts", step.step_id, error)
        self._undraft(step.seqs, dict.fromkeys(range(len(step.seqs)), Undrafted.FAILED))

    def _prompt_roles(self, seqs: list[SeqSlice]) -> tuple[list[SeqSlice], list[bool]]:
        """(seqs with ``SeqRole.CONTEXT`` for a step whose rows end in the prompt, whether each is a partial
        prefill): a partial prefill (vLLM discards its drafts), or the prompt's last chunk. A pipelined drafter
        does not make the verifier wait for those."""
        prompt_lens = getattr(self.runner.input_batch, "num_prompt_tokens", None)
        if prompt_lens is None:
            return seqs, [False] * len(seqs)
        ends = [s.start_position + s.num_tokens for s in seqs]
        in_prefill = [end < int(prompt_lens[i]) for i, end in enumerate(ends)]
        seqs = [replace(s, role=SeqRole.CONTEXT) if end <= int(prompt_lens[i]) else s
                for i, (s, end) in enumerate(zip(seqs, ends, strict=True))]
        return seqs, in_prefill

    # --- draft lengths: how many of its k drafts each sequence gets this step ------------------------------------
    def _choose_draft_length(self, start: float, batch_size: int, k: int, seqs: list[SeqSlice],
                             in_prefill: list[bool]) -> int:
        """This step's k (0..k) from the policy (``self.draft_length``), after handing it the last step's period
        (from its ``propose`` to this one: that step's drafting and the forward that verified its drafts) and the
        k of the step before it, when those three steps were decode-only, in one batch-size bucket, with no idle gap
        (``note_idle``)."""
        policy = self.draft_length
        if type(policy) is FixedDraftLength:
            k_step = k
        else:
            clean = not any(in_prefill) and all(s.role is SeqRole.DRAFT for s in seqs)
            last, self._last_step = self._last_step, None
            follows = last is not None and clean and bucket(last.batch_size) == bucket(batch_size)
            if follows and last.previous_k is not None:  # steady periods only: the policy compares the two k
                policy.observe_period(last.batch_size, last.k, (start - last.start) * 1e3, previous_k=last.previous_k)
            k_step = max(0, min(k, policy.choose(batch_size)))
            if clean:
                self._last_step = _TimedStep(start, batch_size, k_step, last.k if follows else None)
            self.state.estimated_goodput = policy.goodput(batch_size, k_step) or 0.0
        if k_step < len(self.state.speculative_tokens):
            self.state.speculative_tokens[k_step] += 1
        return k_step

    def note_idle(self) -> None:
        """The engine went idle: the next step's period would include the gap, so it is not measured."""
        self._last_step = None

    def _undraft(self, seqs: list[SeqSlice], rows: dict[int, str]) -> None:
        """These sequences (index -> ``Undrafted`` reason) get no draft tokens this step: vLLM schedules and
        verifies none for them (``trim_drafts``), and no acceptance is counted for them. A step none of whose
        sequences got drafts because no drafter could draft them counts in ``steps_without_drafts``."""
        st = self.state
        for i, reason in rows.items():
            self.limit_drafts(seqs[i].req_id, 0)
            st.undrafted[reason] = st.undrafted.get(reason, 0) + 1
        if seqs and len(rows) == len(seqs) and any(r in (Undrafted.NO_DRAFTER, Undrafted.FAILED)
                                                   for r in rows.values()):
            st.steps_without_drafts += 1

    def limit_drafts(self, req_id: str, n: int) -> None:
        """Propose at most ``n`` draft tokens for ``req_id`` this step (0: none; vLLM then schedules only the
        sampled token for it): the one way this proposer drafts fewer than k for a sequence."""
        self.draft_lengths[req_id] = min(n, self.draft_lengths.get(req_id, n))
        sent = self.state.pending.get(req_id)
        if sent is not None:
            if n > 0:
                self.state.pending[req_id] = sent._replace(num_drafts=min(n, sent.num_drafts))
            else:
                del self.state.pending[req_id]

    def trim_drafts(self, drafts: DraftTokenIds) -> DraftTokenIds:
        """vLLM's draft token ids for its scheduler (``take_draft_token_ids``), each request's list cut to its
        length this step (``limit_drafts``); the scheduler schedules as many draft tokens as a list holds, and
        none for an empty one. Worked example: req_ids [a, b], ids [[5, 6, 7], [8, 9, 1]], lengths {b: 0} ->
        [[5, 6, 7], []]."""
        if not self.draft_lengths:
            return drafts
        lengths = self.draft_lengths
        ids = [list(t)[: lengths.get(rid, len(t))] for rid, t in zip(drafts.req_ids, drafts.draft_token_ids,
                                                                    strict=True)]
        return dataclass_replace(drafts, draft_token_ids=ids)

    def _record_hits(self, seqs: list[SeqSlice], lookups: int, hit_seqs: list[int]) -> None:
        st = self.state
        st.branch_lookups += lookups
        st.branch_hits += len(hit_seqs)
        for i in hit_seqs:
            rid = seqs[i].req_id
            st.per_request_hits[rid] = st.per_request_hits.get(rid, 0) + 1
        self._set_source(seqs, hit_seqs, "branch")

    def _set_source(self, seqs: list[SeqSlice], rows: list[int], source: str) -> None:
        """Where the drafts of these sequences came from (acceptance is counted by source)."""
        for i in rows:
            sent = self.state.pending.get(seqs[i].req_id)
            if sent is not None:
                self.state.pending[seqs[i].req_id] = sent._replace(source=source)

    def scheduler_finished(self, req_ids: set[str] | list[str]) -> None:
        """Requests vLLM's scheduler finished or aborted (``SchedulerOutput.finished_req_ids``): their draft state
        is freed with the next step (``DraftStep.finished``). The only way a sequence's draft state is freed: one
        that is merely absent from a step's batch was not scheduled, and will be back."""
        if self.is_driver and self.client is not None:
            self._finished.update(req_ids)
            self.prompts.finished(req_ids)

    def free_now(self, req_ids: list[str]) -> None:
        """Free finished sequences' draft state at once (the engine is going idle: no step will carry them), with
        those finished before and not yet freed."""
        if not self.is_driver or self.client is None:
            return
        req_ids, self._finished = sorted(self._finished | set(req_ids)), set()
        if not req_ids:
            return
        self.prompts.finished(req_ids)
        for rid in req_ids:
            self.state.pending.pop(rid, None)
        try:
            self.client.free(req_ids)
        except Exception as e:  # the drafter is gone, and its state with it
            logger.info("freeing %d finished sequences failed (%s)", len(req_ids), e)

    def _account(self, seqs: list[SeqSlice], finished: list[str], k: int, in_prefill: list[bool]) -> None:
        """Per-request acceptance, vLLM's definitions: a decode step that follows k drafts and ships
        1 + a rows accepted a drafts (positions 0..a-1). Drafts made during a partial prefill are discarded
        by vLLM, so they are not counted."""
        st = self.state
        for rid in finished:
            st.pending.pop(rid, None)
        for s, prefill in zip(seqs, in_prefill, strict=True):
            sent = st.pending.get(s.req_id)
            if sent is not None and s.start_position == sent.last_position + 1:
                n_drafts, source = sent.num_drafts, sent.source
                accepted = max(0, min(n_drafts, s.num_tokens - 1))
                stats = st.per_request.get(s.req_id)
                if stats is None:
                    stats = st.per_request[s.req_id] = SpecDecodeStats(accepted_per_pos=[0] * n_drafts)
                    if len(st.per_request) > MAX_PER_REQUEST:  # a server's lifetime of requests: keep the latest
                        oldest, _ = st.per_request.popitem(last=False)
                        st.per_request_hits.pop(oldest, None)
                self.draft_length.observe_acceptance(n_drafts, accepted)  # issue 23: acceptance by position
                by_source = st.by_source.setdefault(source, SpecDecodeStats(accepted_per_pos=[0] * n_drafts))
                for agg in (stats, by_source):
                    agg.num_drafts += 1
                    agg.num_draft_tokens += n_drafts
                    agg.num_accepted_tokens += accepted
                    for i in range(min(accepted, len(agg.accepted_per_pos))):
                        agg.accepted_per_pos[i] += 1
            if k > 0 and not prefill:
                st.pending[s.req_id] = SentDrafts(k, s.start_position + s.num_tokens - 1, "on_demand")
            else:
                st.pending.pop(s.req_id, None)
