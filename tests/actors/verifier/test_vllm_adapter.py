"""The thin vLLM adapter (``actors.verifier.vllm_adapter``), built for real on the CPU from the shipped tiny
checkpoints' vLLM config with a stand-in model runner (``conftest``; no engine, no model) over a fake speculator:

- it allocates none of vLLM's draft-model buffers (``hidden_states``, ``inputs_embeds``: ``[max_num_batched_tokens,
  H]`` each, ~1.6 GB per rank on Scout at 80k batched tokens); it keeps only what the inherited step preparation
  reads;
- ``check_vllm`` refuses a vLLM that lacks one of ``VLLM_INTERNALS``, naming it;
- ``propose`` ships the rows vLLM verified; ``take`` cuts each request's list to ``Drafts.lengths`` (empty for a
  short sequence: vLLM's scheduler schedules no draft token for it), also through the worker;
- ``begin_step`` (the worker's ``execute_model``) frees what the scheduler finished, at once, and idles;
- the runner gathers image embeddings only while images lie ahead; plain steps run without the speculative path."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.outputs import DraftTokenIds

from actors.messages import DraftStep, SeqRole, SeqSlice
from actors.verifier import vllm_adapter
from actors.verifier.speculator import Drafts, Short
from actors.verifier.vllm_adapter import check_vllm
from tests.actors.fake_speculator import (
    DRAFT,
    FakeSpeculator,
    K,
    fake_runner,
    fake_worker,
    propose,
    run_step,
    speculation,
)


@pytest.fixture
def proposer(make_adapter):
    return make_adapter(None)  # a rank other than the driver


def _tensors(obj) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}
    for k, v in vars(obj).items():
        if hasattr(v, "cpu") and hasattr(v, "gpu"):  # vLLM's CpuGpuBuffer
            out[f"{k}.gpu"] = v.gpu
    return out


def test_no_draft_model_buffers(vllm_config, proposer):
    for name in ("hidden_states", "inputs_embeds", "positions", "arange", "_slot_mapping_buffer"):
        assert getattr(proposer, name, None) is None, name
    tensors = _tensors(proposer)
    assert set(tensors) == {"input_ids", "backup_next_token_ids.gpu"}
    assert all(t.device == torch.device("cpu") for t in tensors.values())
    max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
    assert sum(t.numel() * t.element_size() for t in tensors.values()) <= 4 * (max_tokens + 1024)  # int32 ids only
    assert proposer.device == torch.device("cpu")


def test_step_preparation_still_works(proposer):
    """``prepare_next_token_ids_cpu`` (the runner's non-padded path) makes its tensor on ``input_ids``' device;
    ``backup_next_token_ids`` is a real buffer of ``max_num_seqs`` rows."""
    batch = SimpleNamespace(req_ids=["a", "b"])
    requests = {"b": SimpleNamespace(num_computed_tokens=5, get_token_id=lambda i: 100 + i)}
    ids = proposer.prepare_next_token_ids_cpu([[7, 8], []], requests, batch, {"a": 3, "b": 2})
    assert ids.tolist() == [8, 107] and ids.device == torch.device("cpu")
    buf = proposer.backup_next_token_ids
    assert buf.gpu.shape == (proposer.max_batch_size,) and not buf.gpu.is_meta
    buf.np[:2] = [3, 4]
    assert buf.copy_to_gpu(2).tolist() == [3, 4]


# --- check_vllm ---------------------------------------------------------------------------------------------------
def test_check_vllm_passes_on_the_installed_vllm():
    check_vllm()


def test_check_vllm_names_each_internal_that_moved(monkeypatch):
    monkeypatch.setattr(vllm_adapter, "VLLM_INTERNALS", (
        *vllm_adapter.VLLM_INTERNALS,
        ("vllm.v1.spec_decode.eagle:EagleProposer", "no_such_hook"),
        ("vllm.v1.worker.gpu_input_batch:CachedRequestState", "no_such_field"),  # a dataclass: fields count too
    ))
    with pytest.raises(RuntimeError) as e:
        check_vllm()
    assert ("lacks vllm.v1.spec_decode.eagle:EagleProposer.no_such_hook, "
            "vllm.v1.worker.gpu_input_batch:CachedRequestState.no_such_field;") in str(e.value)
    assert "prompt_token_ids" not in str(e.value)  # the entries this vLLM has are not named


# --- propose and take ---------------------------------------------------------------------------------------------
def _meta(qsl: list[int]) -> SimpleNamespace:
    return SimpleNamespace(batch_size=lambda: len(qsl) - 1, query_start_loc_cpu=torch.tensor(qsl),
                           query_start_loc=torch.tensor(qsl))


def test_propose_ships_the_verified_rows(make_adapter):
    """The padded path: query_start_loc [0, 4, 5], last accepted rows [1, 4] (a's rows 2, 3 were rejected drafts):
    rows [0, 1, 4] shipped, input ids paired with the token after each row, roles from the prompt lengths; the
    runner gets zero placeholders [B, K] and the drafts later, through ``take``."""
    s = speculation()
    adapter = make_adapter(s, fake_runner(["a", "b", "idle"], prompt_lens=np.array([9, 2, 5])))
    tokens, positions = torch.tensor([10, 11, 12, 13, 20]), torch.tensor([7, 8, 9, 10, 3])
    hidden = torch.arange(5, dtype=torch.float32)[:, None].expand(5, 4)
    placeholder = adapter.propose(K, tokens, positions, hidden, torch.tensor([90, 91]), torch.tensor([1, 4]),
                                  _meta([0, 4, 5]), None)
    assert placeholder.shape == (2, K) and not placeholder.any()
    step, shipped = s.speculator.steps[-1], s.speculator.hidden[-1]
    assert step.input_ids.tolist() == [11, 90, 91] and shipped[:, 0].tolist() == [0, 1, 4]
    # a's rows end at its prompt's end (position 8 of 9): a CONTEXT row; b is past its prompt
    assert step.seqs == [SeqSlice("a", 0, 2, 7, SeqRole.CONTEXT), SeqSlice("b", 2, 1, 3)]
    assert (step.num_speculative_tokens, step.finished, step.num_mm_rows) == (K, [], 0)
    assert s.stats.mm_steps == 0 and s.stats.mm_rows_shipped == 0
    out = adapter.take(DraftTokenIds(["a", "b"], placeholder.tolist()))
    assert out.req_ids == ["a", "b"] and out.draft_token_ids == [[DRAFT] * K] * 2


def test_propose_ships_image_rows(make_adapter):
    """vLLM's (mm_embeds, is_mm_embed) over the scheduled tokens (``step_rows.mm_rows``'s worked example): the
    shipped rows whose input token is an image position, and their embeddings, in the hidden rows' dtype."""
    s = speculation()
    adapter = make_adapter(s, fake_runner(["a", "b"]))
    e = torch.arange(3 * 4, dtype=torch.float32).view(3, 4)
    is_mm = torch.tensor([False, True, True, False, True])
    hidden = torch.zeros(5, 4, dtype=torch.bfloat16)
    adapter.propose(K, torch.arange(5), torch.tensor([7, 8, 9, 10, 3]), hidden, torch.tensor([90, 91]),
                    torch.tensor([1, 4]), _meta([0, 4, 5]), None, mm_embed_inputs=([e[:2], e[2:]], is_mm))
    step = s.speculator.steps[-1]
    assert step.mm_rows.tolist() == [1, 2] and step.mm_embeds.dtype == np.int16  # bf16 travels as its bits
    assert torch.equal(torch.from_numpy(step.mm_embeds).view(torch.bfloat16).float(), e[[0, 2]])
    assert (s.stats.mm_steps, s.stats.mm_rows_shipped) == (1, 2)
    adapter.take(None)
    adapter.propose(K, torch.arange(2), torch.tensor([9, 4]), hidden[:2], torch.tensor([90, 91]), None,
                    _meta([0, 1, 2]), None)  # no image embeddings gathered this step
    assert s.speculator.steps[-1].num_mm_rows == 0 and (s.stats.mm_steps, s.stats.mm_rows_shipped) == (1, 2)


class Answer(FakeSpeculator):
    """Answers every step with ``drafts``."""

    def __init__(self, drafts: Drafts) -> None:
        super().__init__()
        self.drafts = drafts

    def draft(self, step: DraftStep) -> Drafts:
        return self.drafts


def test_take_worked_example(make_adapter):
    """req_ids [a, b], drafts [[5, 6], [8, 9]] with b short -> [[5, 6], []]."""
    s = speculation(Answer(Drafts(np.array([[5, 6], [8, 9]]), {1: Short.FULL})))
    adapter = make_adapter(s)
    propose(s, [("a", 0, 2), ("b", 0, 2)])
    out = adapter.take(DraftTokenIds(["a", "b"], [[0, 0], [0, 0]]))
    assert out.req_ids == ["a", "b"] and out.draft_token_ids == [[5, 6], []]
    assert set(s.acceptance.pending) == {"a"}  # taken: awaited as vLLM will verify them


def test_take_edge_cases(make_adapter):
    placeholders = DraftTokenIds(["a", "b"], [[0, 0], [0, 0]])
    s = speculation()
    adapter = make_adapter(s)
    assert adapter.take(placeholders) is placeholders  # nothing proposed: vLLM's own placeholders
    assert adapter.take(None) is None
    propose(s, [("a", 0, 2), ("b", 0, 2)])
    assert adapter.take(None) is None and s.collect() is None  # the runner had nothing: the drafts were read
    propose(s, [("a", 2, 1)])  # not the batch the runner hands back: no drafts rather than wrong ones
    assert adapter.take(placeholders).draft_token_ids == [[], []]
    s.speculator.drafters = 0
    propose(s, [("a", 3, 1), ("b", 2, 1)])
    assert adapter.nothing_to_take() and adapter.take(placeholders).draft_token_ids == [[], []]
    assert make_adapter(None).take(placeholders) is placeholders  # not the driver: placeholders as they are


def test_a_rank_other_than_the_driver_drafts_nothing(proposer):
    placeholder = proposer.propose(K, torch.arange(3), torch.arange(3), torch.zeros(3, 4), torch.tensor([9]), None,
                                   _meta([0, 3]), None)
    assert placeholder.tolist() == [[0] * K] and not proposer.nothing_to_take()
    proposer.begin_step(SimpleNamespace(finished_req_ids={"a"}, total_num_scheduled_tokens=0))  # nothing kept


class PartlyFailing(FakeSpeculator):
    def draft(self, step: DraftStep) -> Drafts:
        drafts = super().draft(step)
        drafts.short = {i: Short.FAILED for i, s in enumerate(step.seqs) if s.req_id == "b"}
        return drafts


def test_the_worker_hands_vllm_no_draft_tokens_for_short_sequences(monkeypatch, make_adapter):
    """What vLLM's scheduler gets through the worker's ``take_draft_token_ids``: the runner's [B, K] placeholders
    cut by the adapter; empty lists (not placeholders to reject) for sequences without drafts this step."""
    s = speculation()
    w = fake_worker(monkeypatch, make_adapter(s), DraftTokenIds(["a"], [[0] * K]))
    run_step(s, [("a", 0, 3)])  # collected: nothing left to take
    propose(s, [("a", 3, 1)])
    assert w.take_draft_token_ids().draft_token_ids == [[DRAFT] * K]
    s.speculator.drafters = 0  # the only drafter is gone
    propose(s, [("a", 4, 1)])
    assert w.take_draft_token_ids().draft_token_ids == [[]]

    s = speculation(PartlyFailing())
    w = fake_worker(monkeypatch, make_adapter(s), DraftTokenIds(["a", "b"], [[0] * K] * 2))
    propose(s, [("a", 0, 3), ("b", 0, 3)])
    assert w.take_draft_token_ids().draft_token_ids == [[DRAFT] * K, []]


def test_no_proposal_without_a_ready_drafter(make_adapter):
    """With no drafter ready, the runner's ``propose_draft_token_ids`` (which would prepare next tokens and slice the
    target's hidden rows, then call ``propose``) answers an empty list per request at once: nothing prepared, shipped
    or waited for; the engine core need not ask for drafts. With one ready, the runner's own runs. Not the driver:
    the runner's own, always."""
    s = speculation()
    runner = fake_runner(["a", "b"])
    adapter = make_adapter(s, runner)
    assert runner.propose_draft_token_ids("x", k=1) == "proposed" and runner.proposals == [(("x",), {"k": 1})]
    s.speculator.drafters = 0
    assert runner.propose_draft_token_ids("x", k=1) == [[], []] and len(runner.proposals) == 1
    assert adapter.nothing_to_take() and s.stats.short == {Short.NO_DRAFTER: 2} and s.stats.steps_without_drafts == 1
    assert adapter.take(DraftTokenIds(["a", "b"], [[0] * K] * 2)).draft_token_ids == [[], []]
    assert s.speculator.steps == []

    runner = fake_runner(["a"])
    make_adapter(None, runner)
    assert runner.propose_draft_token_ids() == "proposed"


# --- begin_step ---------------------------------------------------------------------------------------------------
def test_begin_step_settles_drafts_not_taken(make_adapter):
    s = speculation()
    adapter = make_adapter(s)
    propose(s, [("a", 0, 3)])
    adapter.begin_step(SimpleNamespace(total_num_scheduled_tokens=1, finished_req_ids=set()))
    assert len(s.stats.timings) == 1 and s.acceptance.pending == {} and s.collect() is None


# --- images, plain steps ------------------------------------------------------------------------------------------
def test_runner_gathers_image_embeddings_only_while_images_lie_ahead(make_adapter):
    """``supports_mm_inputs`` (read by vLLM's runner each step): off for a text-only target, for text-only
    requests, and once every image position is behind the computed tokens; off with ``ship_mm_embeds`` false."""
    from types import SimpleNamespace as NS

    def req(computed, *images):
        feats = [NS(mm_position=NS(offset=o, length=n)) for o, n in images]
        return NS(num_computed_tokens=computed, mm_features=feats)

    runner = fake_runner(["t", "i"], requests={"t": req(0), "i": req(0, (5, 16))})
    proposer = make_adapter(None, runner)
    assert proposer.supports_mm_inputs is False  # the target (the tiny text-only checkpoint) takes no images
    proposer.supports_mm_inputs = True  # what vLLM's constructor sets for a multimodal target
    assert proposer.supports_mm_inputs is True
    runner.requests["i"] = req(20, (5, 16))  # image at 5..20: its last row's input is position 21 > 20
    assert proposer.supports_mm_inputs is False
    runner.requests["i"] = req(19, (5, 16), (40, 4))
    assert proposer.supports_mm_inputs is True
    proposer.ship_mm_embeds = False
    assert proposer.supports_mm_inputs is False
    proposer.ship_mm_embeds = True
    runner.input_batch.req_ids = ["t"]  # the image request is not in this step's batch
    assert proposer.supports_mm_inputs is False
    runner.input_batch.req_ids = ["t", "i"]
    off = make_adapter(None, runner, ship_mm_embeds=False)  # mm_embeds: False (measuring placeholder-id drafting)
    off.supports_mm_inputs = True
    assert off.supports_mm_inputs is False


def test_a_decode_step_without_drafts_runs_as_a_plain_step(make_adapter):
    """``_prepare_inputs`` runs without the speculative config for a decode-only step none of whose requests was
    scheduled a draft token (and restores it); a step with drafts, or with a prompt chunk, keeps the spec path."""
    runner = fake_runner()
    adapter = make_adapter(None, runner)

    def out(spec: dict[str, list[int]], tokens: dict[str, int]) -> SimpleNamespace:
        return SimpleNamespace(scheduled_spec_decode_tokens=spec, num_scheduled_tokens=tokens,
                               total_num_scheduled_tokens=sum(tokens.values()))

    runner._prepare_inputs(out({"a": [], "b": []}, {"a": 1, "b": 1}))
    runner._prepare_inputs(out({"a": [5, 6]}, {"a": 3}))  # drafted
    runner._prepare_inputs(out({}, {"a": 5}))  # a prompt chunk
    assert runner.prepared == [None, "spec", "spec"] and runner.speculative_config == "spec"
    assert adapter.plain_steps == [1]
