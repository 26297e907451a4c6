"""``actors.verifier.draft_handoff``: an executor skips ``take_draft_token_ids`` right after a ``sample_tokens`` whose
output carries the worker's "no drafts" mark, and only then (the real engine: ``test_no_drafter_engine``)."""

from __future__ import annotations

from types import SimpleNamespace

from actors.verifier.draft_handoff import mark_no_drafts, patch


class Executor:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.next_output = SimpleNamespace()

    def execute_model(self, scheduler_output, non_block=False):
        self.calls.append("execute_model")

    def sample_tokens(self, grammar_output, non_block=False):
        self.calls.append("sample_tokens")
        return self.next_output

    def take_draft_token_ids(self):
        self.calls.append("take_draft_token_ids")
        return "drafts"


patch(Executor)
patch(Executor)  # once only


def step(executor: Executor, marked: bool):
    executor.next_output = SimpleNamespace()
    if marked:
        mark_no_drafts(executor.next_output)
    executor.calls.clear()
    executor.execute_model(None)
    executor.sample_tokens(None)
    return executor.take_draft_token_ids()


def test_a_marked_step_skips_the_round_trip_and_the_next_one_asks_again():
    executor = Executor()
    assert step(executor, marked=True) is None
    assert executor.calls == ["execute_model", "sample_tokens"]
    assert step(executor, marked=False) == "drafts"
    assert executor.calls == ["execute_model", "sample_tokens", "take_draft_token_ids"]


def test_the_mark_lasts_one_take_only():
    executor = Executor()
    step(executor, marked=True)
    assert executor.take_draft_token_ids() == "drafts"  # a second ask (none in vLLM) goes through


def test_a_step_sampled_inside_execute_model_asks_as_vllm_does():
    executor = Executor()
    step(executor, marked=True)
    executor.calls.clear()
    executor.execute_model(None)  # no sample_tokens this step: the last mark does not carry over
    assert executor.take_draft_token_ids() == "drafts"
