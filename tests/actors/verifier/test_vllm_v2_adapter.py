"""``RemoteSpeculatorV2`` (``actors.verifier.vllm_v2_adapter``) on hand-made V2 inputs, over a fake speculator: which
rows a step ships and with which input tokens, the drafts handed to the scheduler, and where they are written in
``req_states.draft_tokens`` (a shuffled slot mapping), for synchronous and asynchronous scheduling. No vLLM engine.

The batch, in V2's terms (K = 2):

    a: slot 5, a decode step of 1 + 2 draft rows at positions 10-12, 1 rejected -> ships rows 0, 1
    b: slot 2, a prompt chunk of 2 rows at positions 0-1 of a 6-token prompt -> ships rows 3, 4 (a partial prefill)

    input_ids [100, 101, 102, 200, 201]; a's last sampled token 77, b's next prompt token 55
    -> shipped input ids [101, 77, 201, 55] (EAGLE pairs token t + 1 with hidden state t)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from actors.messages import SeqRole
from actors.verifier.speculator import Drafts, Short
from actors.verifier.vllm_v2_adapter import FILLER_TOKEN, RemoteSpeculatorV2, _filled
from tests.actors.fake_speculator import DRAFT, FakeSpeculator, speculation

K, MAX_REQS, WIDTH = 2, 8, 3


def config(async_scheduling: bool, method: str = "eagle3") -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, method=method),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, max_num_seqs=MAX_REQS),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        cache_config=SimpleNamespace(block_size=16, enable_prefix_caching=False),
        model_config=SimpleNamespace(supports_multimodal_inputs=False))


def req_states() -> SimpleNamespace:
    return SimpleNamespace(draft_tokens=torch.full((MAX_REQS, K), -5, dtype=torch.int64),
                           req_id_to_index={"a": 5, "b": 2}, num_computed_tokens_np=np.zeros(MAX_REQS, np.int32))


def make(async_scheduling: bool, fake: FakeSpeculator | None = None) -> tuple[RemoteSpeculatorV2, FakeSpeculator]:
    fake = fake or FakeSpeculator()
    adapter = RemoteSpeculatorV2(config(async_scheduling), torch.device("cpu"), req_states())
    adapter.attach(speculation(fake))
    adapter.live = True
    return adapter, fake


def propose(adapter: RemoteSpeculatorV2, **kwargs) -> torch.Tensor:
    batch = SimpleNamespace(
        num_reqs=2, req_ids=["a", "b"], idx_mapping=torch.tensor([5, 2]), idx_mapping_np=np.array([5, 2], np.int32),
        query_start_loc_np=np.array([0, 3, 5], np.int32), query_start_loc=torch.tensor([0, 3, 5], dtype=torch.int32),
        prefill_len_np=np.array([4, 6], np.int32),
        positions=torch.tensor([10, 11, 12, 0, 1]),
        input_ids=torch.tensor([100, 101, 102, 200, 201], dtype=torch.int32))
    last_sampled = torch.zeros(MAX_REQS, 1, dtype=torch.int64)
    last_sampled[5, 0] = 77
    next_prefill = torch.zeros(1, MAX_REQS, dtype=torch.int32)
    next_prefill[0, 2] = 55
    aux = [torch.arange(5, dtype=torch.float32)[:, None].expand(5, WIDTH) * (layer + 1) for layer in range(2)]
    return adapter.propose(batch, {}, {}, torch.zeros(5, WIDTH), aux, num_sampled=torch.tensor([2, 0]),
                           num_rejected=torch.tensor([1, 0]), last_sampled=last_sampled,
                           next_prefill_tokens=next_prefill, temperature=torch.zeros(MAX_REQS),
                           seeds=torch.zeros(MAX_REQS), **kwargs)


def scheduler_output(spec_tokens: dict[str, list[int]] | None = None, finished: set[str] | None = None):
    return SimpleNamespace(scheduled_spec_decode_tokens=spec_tokens or {}, scheduled_new_reqs=[],
                           finished_req_ids=finished or set(), total_num_scheduled_tokens=3)


def test_a_step_ships_each_sequences_accepted_rows_with_the_token_after_each():
    adapter, fake = make(async_scheduling=False)
    placeholders = propose(adapter)
    assert placeholders.shape == (2, K)
    step = fake.steps[-1]
    assert step.input_ids.tolist() == [101, 77, 201, 55]
    a, b = step.seqs
    assert (a.req_id, a.start, a.num_tokens, a.start_position, a.role) == ("a", 0, 2, 10, SeqRole.DRAFT)
    assert (b.req_id, b.start, b.num_tokens, b.start_position, b.role) == ("b", 2, 2, 0, SeqRole.PREFILL)
    # EAGLE-3: the aux layers side by side, rows 0, 1, 3, 4
    assert fake.hidden[-1][:, 0].tolist() == [0, 1, 3, 4] and fake.hidden[-1][:, WIDTH].tolist() == [0, 2, 6, 8]


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that read a tensor back to the host (on a GPU each waits for the device). A ``.to`` cannot be
    told apart here (every tensor is on the CPU), and the adapter reads back with ``.cpu()`` only."""

    READS = {"cpu", "item", "tolist", "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def test_a_step_reads_back_once_before_its_hidden_rows():
    """What the step needs on the host (rejected counts, first positions, input ids) comes back in one copy; the
    hidden rows stay on the device (the speculator sends them)."""
    adapter, fake = make(async_scheduling=False)
    with HostReads() as mode:
        propose(adapter)
    assert mode.reads == ["cpu", "numpy"] and not fake.hidden[-1].is_meta  # one copy: .cpu(), then its numpy view


@pytest.mark.parametrize("why", ["dummy-run", "warming-up"])
def test_warm_up_and_dummy_steps_send_nothing(why):
    adapter, fake = make(async_scheduling=False)
    adapter.live = why != "warming-up"
    propose(adapter, dummy_run=why == "dummy-run")
    assert fake.steps == []


def test_synchronous_drafts_reach_the_scheduler_then_every_slot_they_were_scheduled_for():
    from vllm.v1.outputs import DraftTokenIds

    adapter, fake = make(async_scheduling=False)
    propose(adapter)
    taken = adapter.take(DraftTokenIds(["a", "b"], [[-1] * K, [-1] * K]))
    assert taken.req_ids == ["a", "b"] and taken.draft_token_ids == [[DRAFT] * K, [DRAFT] * K]
    adapter.begin_step(scheduler_output({"a": [7, 8], "b": [9]}))  # what the scheduler scheduled, any lengths
    drafts = adapter.req_states.draft_tokens
    assert drafts[5].tolist() == [7, 8] and drafts[2, 0].item() == 9 and drafts[0].tolist() == [-5, -5]
    assert adapter.writes == 1 and adapter.digest() == 7 + 8 + 9 + 0  # b's unscheduled slot written as 0


def test_a_short_sequence_gets_an_empty_list_under_synchronous_scheduling():
    from vllm.v1.outputs import DraftTokenIds

    class ShortB(FakeSpeculator):
        def draft(self, step):
            return Drafts(np.full((2, step.num_speculative_tokens), DRAFT, np.int64), {1: Short.FAILED})

    adapter, _ = make(async_scheduling=False, fake=ShortB())
    propose(adapter)
    assert adapter.take(DraftTokenIds(["a", "b"], [[-1] * K] * 2)).draft_token_ids == [[DRAFT] * K, []]


def test_asynchronous_drafts_are_awaited_and_written_before_the_next_step():
    adapter, fake = make(async_scheduling=True)
    propose(adapter)
    adapter.begin_step(scheduler_output({"a": [-1] * K, "b": [-1] * K}))  # the async scheduler's placeholders
    drafts = adapter.req_states.draft_tokens
    assert drafts[5].tolist() == [DRAFT] * K and drafts[2].tolist() == [DRAFT] * K
    adapter.begin_step(scheduler_output())  # nothing proposed since: nothing written
    assert adapter.writes == 1


def test_asynchronous_scheduling_without_a_drafter_writes_filler_tokens():
    fake = FakeSpeculator()
    fake.drafters = 0
    adapter, _ = make(async_scheduling=True, fake=fake)
    propose(adapter)
    adapter.begin_step(scheduler_output())
    assert fake.steps == []  # nothing shipped
    assert adapter.req_states.draft_tokens[[5, 2]].tolist() == [[FILLER_TOKEN] * K] * 2


def test_finished_sequences_are_freed_on_the_drafters():
    adapter, fake = make(async_scheduling=False)
    propose(adapter)
    adapter.begin_step(scheduler_output(finished={"b"}))
    assert fake.freed == ["b"]


def test_filled_worked_example():
    drafts = Drafts(np.array([[5, 6], [8, 9]]), {1: Short.FAILED})
    assert _filled(drafts, 3).tolist() == [[5, 6, FILLER_TOKEN], [FILLER_TOKEN] * 3]


def test_asynchronous_take_hands_the_drafts_over_once():
    """Under asynchronous scheduling vLLM asks for the drafts only to check structured outputs' grammar: they are
    written then, and the next step's ``begin_step`` writes nothing more."""
    from vllm.v1.outputs import DraftTokenIds

    adapter, _ = make(async_scheduling=True)
    propose(adapter)
    taken = adapter.take(DraftTokenIds(["a", "b"], [[-1] * K] * 2))
    assert taken.draft_token_ids == [[DRAFT] * K] * 2 and adapter.writes == 1
    adapter.begin_step(scheduler_output({"a": [-1] * K, "b": [-1] * K}))
    assert adapter.writes == 1 and adapter.req_states.draft_tokens[5].tolist() == [DRAFT] * K
