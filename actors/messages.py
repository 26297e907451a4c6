"""The typed messages between the verifier (vLLM worker) and a drafter, one pair per verification step.

Wire format: msgpack for the small metadata (never pickle: a drafter may sit behind a network hop), and the
target hidden states as one numpy array put once into the Ray object store (``ray.put``); the drafter gets
the ``ObjectRef`` and reads the array zero-copy from its node's store.

For a step with B sequences and N tokens in all (``hidden``: ``[N, fused_hidden_size]``), sequence i owns
rows ``[start_i, start_i + num_tokens_i)`` of the flat arrays. Row r of sequence i sits at position
``start_position_i + (r - start_i)``; its input token is the token *after* that position (the target's next
token for the last row), which is how EAGLE pairs token t+1 with hidden state t.

Worked example: a sequence whose accepted tokens this step are ``[a, b]`` at positions 7, 8, and whose
bonus / recovered token is ``c``: rows (position 7: input b, hidden h7), (position 8: input c, hidden h8).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgpack
import numpy as np


class DraftStatus(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"  # the drafter raised; the verifier drafts nothing this step


@dataclass(frozen=True)
class SeqSlice:
    req_id: str
    start: int  # first row in the step's flat arrays
    num_tokens: int  # rows of this sequence this step (>= 1)
    start_position: int  # position of the first row


@dataclass
class DraftStep:
    step_id: int
    num_speculative_tokens: int
    seqs: list[SeqSlice]
    input_ids: np.ndarray  # [N] int32: the token after each row's position
    finished: list[str] = field(default_factory=list)  # sequences whose draft state can be freed
    hidden_dtype: str = "float32"  # "bfloat16" travels as int16 bits (numpy has no bf16)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "step_id": self.step_id,
                "k": self.num_speculative_tokens,
                "seqs": [[s.req_id, s.start, s.num_tokens, s.start_position] for s in self.seqs],
                "input_ids": self.input_ids.astype(np.int32).tobytes(),
                "finished": list(self.finished),
                "hidden_dtype": self.hidden_dtype,
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, data: bytes) -> DraftStep:
        d = msgpack.unpackb(data, raw=False)
        return cls(
            step_id=int(d["step_id"]),
            num_speculative_tokens=int(d["k"]),
            seqs=[SeqSlice(str(r), int(s), int(n), int(p)) for r, s, n, p in d["seqs"]],
            input_ids=np.frombuffer(d["input_ids"], dtype=np.int32),
            finished=[str(x) for x in d["finished"]],
            hidden_dtype=str(d["hidden_dtype"]),
        )

    def validate(self, hidden_rows: int, hidden_width: int, expected_width: int) -> None:
        if hidden_rows != self.num_tokens:
            raise ValueError(f"draft step: {hidden_rows} hidden rows for {self.num_tokens} tokens")
        if hidden_width != expected_width:
            raise ValueError(f"draft step: hidden width {hidden_width}, the head expects {expected_width}")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"draft step: num_speculative_tokens {self.num_speculative_tokens} < 0")
        end = 0
        for s in self.seqs:
            if s.start != end or s.num_tokens < 1 or s.start_position < 0:
                raise ValueError(f"draft step: bad slice for {s.req_id}: {s}")
            end = s.start + s.num_tokens
        if end != self.num_tokens:
            raise ValueError(f"draft step: slices cover {end} of {self.num_tokens} rows")


@dataclass
class DraftResult:
    step_id: int
    status: DraftStatus
    draft_token_ids: np.ndarray  # [B, k] int32, rows in the step's sequence order
    compute_ms: float = 0.0
    error: str = ""

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "step_id": self.step_id,
                "status": self.status.value,
                "shape": list(self.draft_token_ids.shape),
                "drafts": self.draft_token_ids.astype(np.int32).tobytes(),
                "compute_ms": self.compute_ms,
                "error": self.error,
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, data: bytes) -> DraftResult:
        d = msgpack.unpackb(data, raw=False)
        drafts = np.frombuffer(d["drafts"], dtype=np.int32).reshape(d["shape"])
        return cls(int(d["step_id"]), DraftStatus(d["status"]), drafts, float(d["compute_ms"]), str(d["error"]))
