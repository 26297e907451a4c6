"""Malformed ``DraftStep``s, for fuzzing a drafter (in process, ``tests/actors/drafter/test_draft_step_fuzz.py``, and
served, ``tests/cluster/drafter_pool/test_pool_serve.py``): a good step, random mutations of its bytes and hidden
array, and the check every answer must pass."""

from __future__ import annotations

import random

import msgpack
import numpy as np

from actors.messages import MAX_POSITION, DraftResult, DraftStatus, DraftStep, SeqRole, SeqSlice

K = 3


def good_step(width: int, ids=("a", "b"), seed: int = 0) -> tuple[DraftStep, np.ndarray]:
    rng = np.random.default_rng(seed)
    seqs = [SeqSlice(ids[0], 0, 3, 0), SeqSlice(ids[1], 3, 2, 0, SeqRole.DRAFT)]
    return (DraftStep(7, K, seqs, rng.integers(0, 200, 5).astype(np.int32)),
            rng.standard_normal((5, width)).astype(np.float32))


JUNK = [None, True, False, -1, 0, 1, 3, 2**31, 2**63 - 1, -(2**63), 1.5, float("nan"), "", "x", "draft", b"",
        b"\x00\x01\x02", [], [1], ["a"], [[1, 2]], {}, {"a": 1}]


def mutations(rng: random.Random, packed: bytes, hidden: np.ndarray):
    """(step bytes, hidden) pairs, each with something wrong (or, rarely, harmless)."""
    d = msgpack.unpackb(packed, raw=False)
    width = hidden.shape[1]
    kind = rng.randrange(9)
    if kind == 0:  # truncated, or trailing bytes, or random bytes, or not bytes at all
        choice = rng.randrange(4)
        if choice == 0:
            return packed[: rng.randrange(len(packed))], hidden
        if choice == 1:
            return packed + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))), hidden
        if choice == 2:
            return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))), hidden
        return rng.choice([None, "step", 3, [packed]]), hidden
    if kind == 1:  # a field replaced or missing
        key = rng.choice(sorted(d))
        if rng.random() < 0.2:
            d.pop(key)
        else:
            d[key] = rng.choice(JUNK)
    elif kind == 2:  # k out of bounds
        d["k"] = rng.choice([-5, -1, 5, 17, 1000, 2**31, 2**63 - 1])
    elif kind == 3:  # one field of a sequence
        row = d["seqs"][rng.randrange(len(d["seqs"]))]
        j = rng.randrange(5)
        row[j] = rng.choice(JUNK + [-(10**6), 10**6, MAX_POSITION, 2**40, "context", "nope"])
    elif kind == 4:  # a sequence row of the wrong length, or sequences that do not tile
        if rng.random() < 0.5:
            d["seqs"][0] = d["seqs"][0][: rng.randrange(5)] + ([0] * rng.randrange(2))
        else:
            d["seqs"].append(d["seqs"][rng.randrange(len(d["seqs"]))])
    elif kind == 5:  # input ids: wrong byte count, outside the vocabulary, another length
        d["input_ids"] = rng.choice([
            d["input_ids"][:-1], d["input_ids"] + b"\x00",
            np.array([0, 1, 2, 3, 10**8], np.int32).tobytes(), np.array([0, -1, 2, 3, 4], np.int32).tobytes(),
            np.arange(4, dtype=np.int32).tobytes(), "ids",
        ])
    elif kind == 6:  # hidden_dtype
        d["hidden_dtype"] = rng.choice(["bfloat16", "float16", "float64", "int8", "", "x" * 1000])
    elif kind == 7:  # the hidden array's dtype, shape or type
        hidden = rng.choice([
            hidden.astype(np.float64), hidden.astype(np.float16), hidden.view(np.int32), hidden.astype(np.int64),
            hidden[:, : width - 1], hidden[:-1], np.concatenate([hidden, hidden]), hidden.reshape(-1),
            hidden[None], np.zeros((0, width), np.float32), hidden.astype(bool), hidden.tolist(), None, b"hidden",
            hidden.astype(object),
        ])
    else:  # positions past what int32 holds
        d["seqs"][rng.randrange(len(d["seqs"]))][3] = rng.choice([MAX_POSITION, 2**40, 2**63 - 1])
    return msgpack.packb(d, use_bin_type=True), hidden


def check_answer(answer: bytes, vocab: int, max_k: int = 4) -> DraftResult:
    result = DraftResult.unpack(answer)
    if result.status is DraftStatus.FAILED:
        assert result.error.startswith("draft step: "), result.error  # a BadStep's reason, not a traceback
    else:  # a harmless mutation (a step id, an extra sequence field that still holds up)
        assert result.status is DraftStatus.OK
        assert result.draft_token_ids.ndim == 2 and result.draft_token_ids.shape[1] <= max_k
        assert ((result.draft_token_ids >= 0) & (result.draft_token_ids < vocab)).all()
    return result
