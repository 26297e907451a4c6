"""Which of a verified step's rows go to the drafters, and what travels with each: pure functions over the tensors
vLLM's model runners hand their EAGLE proposer (``actors.verifier.vllm_adapter`` and ``vllm_v2_adapter`` call them).

The runner hands, for a step of B sequences and N scheduled tokens in ``runner.input_batch.req_ids`` order:

    target_token_ids      [N]                 tokens verified this step, all sequences, flattened
    target_positions      [N]
    target_hidden_states  [N, width]          EAGLE: the last layer (post-norm); EAGLE-3: the aux layers, concatenated
    next_token_ids        [B]                 the token sampled after each sequence's last accepted one
    token_indices_to_sample [B] | None        row of each sequence's last accepted token (padded path)

Sequence i's rows are ``query_start_loc[i]`` up to its last accepted row; the rows after it (its rejected drafts,
padded path) are not shipped.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from actors.messages import SeqRole, SeqSlice


def prompt_roles(seqs: list[SeqSlice], prompt_lens: np.ndarray | None) -> tuple[list[SeqSlice], list[bool]]:
    """(``seqs`` with the role of each where a step's rows end in the prompt, whether each is a partial prefill):
    ``SeqRole.PREFILL`` for a partial prefill (vLLM discards its drafts: no drafter is waited for), ``CONTEXT`` for
    the prompt's last chunk (a pipelined drafter drafts its branches from it; a synchronous one drafts it, waited
    for). ``prompt_lens``: [B] each sequence's prompt length (None: unknown, all decode).

    Worked example: prompts of 10, 6 and 4 tokens; a ships positions 0-5, c positions 0-5, b positions 4-4 -> a
    PREFILL, c CONTEXT (its prompt's last chunk), b DRAFT."""
    if prompt_lens is None:
        return seqs, [False] * len(seqs)
    ends = [s.start_position + s.num_tokens for s in seqs]
    in_prefill = [end < int(prompt_lens[i]) for i, end in enumerate(ends)]
    seqs = [replace(s, role=SeqRole.PREFILL if partial else SeqRole.CONTEXT) if end <= int(prompt_lens[i]) else s
            for i, (s, end, partial) in enumerate(zip(seqs, ends, in_prefill, strict=True))]
    return seqs, in_prefill


def packed_step_rows(
    query_start_loc: np.ndarray,  # [B + 1] (host)
    query_start_loc_dev: torch.Tensor,  # [B + 1] the same, on the step's device
    num_rejected: torch.Tensor,  # [B] draft slots each sequence had rejected this step (device)
    positions: torch.Tensor,  # [N] (device)
    input_ids: torch.Tensor,  # [N] the step's scheduled tokens (device)
    next_token_ids: torch.Tensor,  # [B] the token after each sequence's last accepted row (device)
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows a step ships, each sequence's first position and each row's input token (the token after it: the
    next one scheduled, or the sampled next token after a sequence's last accepted row; EAGLE pairs token t + 1 with
    hidden state t), for both model runners: rejected rows stay in place (V2, and V1's padded path) and
    ``num_rejected`` says how many end each sequence (0 where vLLM dropped them). One device-to-host copy: the
    rejected counts, the first positions and the shifted input ids of all N rows travel back together, and the rows
    are chosen on the host. Returns (rows [kept] int64, counts [B], first positions [B], input ids [kept] int32).

    Worked example: query_start_loc [0, 3, 5], num_rejected [1, 0], positions [10, 11, 12, 0, 1], input ids
    [100, 101, 102, 200, 201], next tokens [77, 55] -> rows [0, 1, 3, 4], counts [2, 2], first positions [10, 0],
    input ids [101, 77, 201, 55]."""
    batch, num_tokens = len(query_start_loc) - 1, int(query_start_loc[-1])
    qsl = query_start_loc_dev[: batch + 1].long()
    shifted = torch.zeros(num_tokens, dtype=torch.int64, device=input_ids.device)
    shifted[:-1] = input_ids[1:num_tokens]
    shifted[qsl[1:] - 1 - num_rejected[:batch].long()] = next_token_ids.long()
    host = torch.cat([num_rejected[:batch].long(), positions[qsl[:-1]].long(), shifted]).cpu().numpy()
    rejected, first, shifted_host = host[:batch], host[batch: 2 * batch], host[2 * batch:]
    starts = np.asarray(query_start_loc[:-1], dtype=np.int64)
    counts = np.asarray(query_start_loc[1:], dtype=np.int64) - starts - rejected
    offsets = np.cumsum(counts) - counts
    rows = np.repeat(starts - offsets, counts) + np.arange(int(counts.sum()))
    return rows, counts, first, shifted_host[rows].astype(np.int32)


def mm_rows(
    mm_embed_inputs: tuple[list[torch.Tensor], torch.Tensor] | None,
    rows: torch.Tensor,  # [num_kept] rows shipped, indices into the step's scheduled tokens (cpu)
    num_tokens: int,
    padded: bool = True,
) -> tuple[np.ndarray, torch.Tensor | None]:  # ([M] int32 indices into rows, [M, H] embeddings)
    """The shipped rows whose input token is an image position, and their merged embeddings: from vLLM's
    ``(mm_embeds, is_mm_embed)`` (``is_mm_embed`` over the step's scheduled tokens, shifted by one as the drafter's
    input ids are; the embeddings of its True rows, in order).

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
