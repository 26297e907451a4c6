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

Pipelined drafting adds a third message: after each step the drafter drafts the next step's *branches* (one per
guessed outcome, ``actors.drafter.branches``) and answers ``DrafterActor.branches`` with a ``BranchTable``; the
verifier keeps its object ref and, at the next step, looks each sequence's real outcome up in it locally.

Images (multimodal targets): at the rows whose input token is an image position, vLLM's EAGLE heads take the
target's merged multimodal embedding (the vision encoder's output) instead of ``embed_tokens(placeholder id)``.
The step carries those rows (``mm_rows``, indices into the step's rows) and their embeddings (``mm_embeds``,
``[M, hidden_size]`` in ``hidden_dtype``) in the message itself; they only occur in the steps that ship a prompt's
image positions (once per image per sequence), and a step without them packs no extra field.

A drafter trusts nothing it is sent: ``DraftStep.unpack`` refuses malformed bytes and fields of the wrong type,
``DraftStep.validate`` the values (k, sequences, positions, token ids, the hidden array's rows, width and dtype),
both with ``BadStep`` naming what is wrong; the drafter answers that as a ``FAILED`` result.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgpack
import numpy as np

MAX_SPECULATIVE_TOKENS = 16  # the most draft tokens per step a config may ask for (SpeculativeConfig)
MAX_STEP_SEQS = 16384  # more sequences than any verifier batch holds
MAX_POSITION = 2**31 - 1  # positions are int32 in vLLM; rows past a drafter's max_model_len get no drafts there
HIDDEN_WIRE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.int16)}  # hidden_dtype -> array dtype


class BadStep(ValueError):
    """A ``DraftStep`` (bytes or values) a drafter cannot draft from; the message says what is wrong."""


def _int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadStep(f"draft step: {name} must be an integer, got {type(value).__name__}")
    return value


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise BadStep(f"draft step: {name} must be a string, got {type(value).__name__}")
    return value


def _list(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise BadStep(f"draft step: {name} must be a list, got {type(value).__name__}")
    return value


class SeqRole(enum.StrEnum):
    """What the verifier does with a sequence's drafts this step."""

    DRAFT = "draft"  # proposes the drafter's drafts: from the branch table (a hit) or drafted now (it waits)
    CONTEXT = "context"  # proposed placeholders without waiting (a prompt step): cache the rows, draft branches


class DraftStatus(enum.StrEnum):
    OK = "ok"
    PARTIAL = "partial"  # a pool's drafter failed for some sequences: their rows hold placeholder drafts
    FAILED = "failed"  # the drafter raised; the verifier drafts nothing this step


@dataclass(frozen=True)
class SeqSlice:
    req_id: str
    start: int  # first row in the step's flat arrays
    num_tokens: int  # rows of this sequence this step (>= 1)
    start_position: int  # position of the first row
    role: SeqRole = SeqRole.DRAFT


@dataclass
class DraftStep:
    step_id: int
    num_speculative_tokens: int
    seqs: list[SeqSlice]
    input_ids: np.ndarray  # [N] int32: the token after each row's position
    finished: list[str] = field(default_factory=list)  # sequences whose draft state can be freed
    hidden_dtype: str = "float32"  # "bfloat16" travels as int16 bits (numpy has no bf16)
    # Rows (ascending) whose input embedding is the target's merged multimodal embedding, and those embeddings.
    mm_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [M] int32
    mm_embeds: np.ndarray | None = None  # [M, hidden_size] float32 (int16 bits for bfloat16); None when M = 0

    @property
    def num_mm_rows(self) -> int:
        return int(np.asarray(self.mm_rows).shape[0]) if np.asarray(self.mm_rows).ndim else 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def pack(self) -> bytes:
        d = {
            "step_id": self.step_id,
            "k": self.num_speculative_tokens,
            "seqs": [[s.req_id, s.start, s.num_tokens, s.start_position, s.role.value] for s in self.seqs],
            "input_ids": self.input_ids.astype(np.int32).tobytes(),
            "finished": list(self.finished),
            "hidden_dtype": self.hidden_dtype,
        }
        if self.num_mm_rows:  # text-only steps pack nothing more
            emb = np.ascontiguousarray(self.mm_embeds)
            d["mm"] = [np.asarray(self.mm_rows, np.int32).tobytes(), list(emb.shape), emb.tobytes()]
        return msgpack.packb(d, use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> DraftStep:
        """The step in ``data``, or ``BadStep``: not msgpack (truncated, trailing bytes), not a map with the fields
        ``pack`` writes, or a field of the wrong type. Values are checked by ``validate``."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadStep(f"draft step: expected bytes, got {type(data).__name__}")
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as e:  # msgpack's ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError...
            raise BadStep(f"draft step: not a msgpack message ({type(e).__name__})") from None
        if not isinstance(d, dict):
            raise BadStep(f"draft step: expected a map, got {type(d).__name__}")
        missing = {"step_id", "k", "seqs", "input_ids", "finished", "hidden_dtype"} - set(d)
        if missing:
            raise BadStep(f"draft step: missing fields {sorted(missing)}")
        seqs = []
        for row in _list(d["seqs"], "seqs"):
            if not isinstance(row, list) or len(row) != 5:
                raise BadStep("draft step: each sequence must be [req_id, start, num_tokens, start_position, role]")
            rid, start, n, pos, role = row
            try:
                role = SeqRole(_str(role, "role"))
            except ValueError as e:
                raise BadStep(f"draft step: role: {e}") from None
            seqs.append(SeqSlice(_str(rid, "req_id"), _int(start, "start"), _int(n, "num_tokens"),
                                 _int(pos, "start_position"), role))
        raw_ids = d["input_ids"]
        if not isinstance(raw_ids, bytes) or len(raw_ids) % 4:
            raise BadStep("draft step: input_ids must be int32 bytes")
        mm_rows, mm_embeds = np.zeros(0, np.int32), None
        if "mm" in d:
            hidden_dtype = _str(d["hidden_dtype"], "hidden_dtype")
            if hidden_dtype not in HIDDEN_WIRE_DTYPES:
                raise BadStep(f"draft step: hidden_dtype {hidden_dtype[:40]!r} is none of {sorted(HIDDEN_WIRE_DTYPES)}")
            mm = _list(d["mm"], "mm")
            if len(mm) != 3 or not isinstance(mm[0], bytes) or not isinstance(mm[2], bytes) or len(mm[0]) % 4:
                raise BadStep("draft step: mm must be [int32 row bytes, [rows, width], embedding bytes]")
            shape = [_int(x, "mm shape") for x in _list(mm[1], "mm shape")]
            wire = HIDDEN_WIRE_DTYPES[hidden_dtype]
            mm_rows = np.frombuffer(mm[0], dtype=np.int32)
            if len(shape) != 2 or shape[0] != mm_rows.shape[0] or shape[1] < 1 or (
                    len(mm[2]) != shape[0] * shape[1] * wire.itemsize):
                raise BadStep(f"draft step: mm embeddings of shape {shape[:3]} and {len(mm[2])} bytes for "
                              f"{mm_rows.shape[0]} rows")
            mm_embeds = np.frombuffer(mm[2], dtype=wire).reshape(shape)
        return cls(
            step_id=_int(d["step_id"], "step_id"),
            num_speculative_tokens=_int(d["k"], "k"),
            seqs=seqs,
            input_ids=np.frombuffer(raw_ids, dtype=np.int32),
            finished=[_str(x, "finished") for x in _list(d["finished"], "finished")],
            hidden_dtype=_str(d["hidden_dtype"], "hidden_dtype"),
            mm_rows=mm_rows,
            mm_embeds=mm_embeds,
        )

    def select(self, seq_indices: list[int]) -> tuple[DraftStep, np.ndarray]:
        """The sub-step of some of this step's sequences (what one drafter of a pool gets), and the rows
        ``[M]`` of this step's flat arrays that it covers, in its order. ``finished`` is left empty.

        Worked example: seqs a (rows 0-1), b (row 2), c (rows 3-5); ``select([2, 0])`` -> seqs c (rows 0-2 of
        the sub-step), a (rows 3-4), and rows ``[3, 4, 5, 0, 1]``."""
        seqs, rows, off = [], [], 0
        for i in seq_indices:
            s = self.seqs[i]
            seqs.append(SeqSlice(s.req_id, off, s.num_tokens, s.start_position, s.role))
            rows.append(np.arange(s.start, s.start + s.num_tokens))
            off += s.num_tokens
        idx = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        sub = DraftStep(self.step_id, self.num_speculative_tokens, seqs, self.input_ids[idx], [], self.hidden_dtype)
        if self.num_mm_rows:
            mm_rows = np.asarray(self.mm_rows)
            keep = np.isin(idx, mm_rows)
            if keep.any():
                sub.mm_rows = np.nonzero(keep)[0].astype(np.int32)
                sub.mm_embeds = self.mm_embeds[np.searchsorted(mm_rows, idx[keep])]
        return sub, idx

    def check_hidden(self, hidden: object) -> None:
        """The hidden states as they came over the wire, or ``BadStep``: a 2-D numpy array of the dtype that
        ``hidden_dtype`` travels as (``HIDDEN_WIRE_DTYPES``: bfloat16 as int16 bits)."""
        if self.hidden_dtype not in HIDDEN_WIRE_DTYPES:
            raise BadStep(f"draft step: hidden_dtype {self.hidden_dtype[:40]!r} is none of "
                          f"{sorted(HIDDEN_WIRE_DTYPES)}")
        if not isinstance(hidden, np.ndarray) or hidden.ndim != 2:
            raise BadStep(f"draft step: hidden must be a 2-D array, got {type(hidden).__name__} "
                          f"{list(getattr(hidden, 'shape', []))}")
        if hidden.dtype != HIDDEN_WIRE_DTYPES[self.hidden_dtype]:
            raise BadStep(f"draft step: hidden array of {hidden.dtype} for hidden_dtype {self.hidden_dtype} "
                          f"(travels as {HIDDEN_WIRE_DTYPES[self.hidden_dtype]})")

    def validate(self, hidden_rows: int, hidden_width: int, expected_width: int, vocab_size: int | None = None,
                 max_k: int = MAX_SPECULATIVE_TOKENS, embed_width: int | None = None) -> None:
        """A step fit to draft from, or ``BadStep`` (a ``ValueError``) saying what is wrong: 0 <= k <= ``max_k``
        (the drafter's configured bound), at most ``MAX_STEP_SEQS`` sequences, the hidden rows match the tokens,
        the slices tile the rows in order (each sequence once, >= 1 row, positions in ``[0, MAX_POSITION]``), the
        input ids are integer token ids of the vocabulary (``vocab_size``; the head's embedding is indexed with
        them). Rows past the drafter's ``max_model_len`` are no error: those sequences get no drafts
        (``DrafterEngine.no_room``). Multimodal rows: ``validate_mm``."""
        if not 0 <= self.num_speculative_tokens <= max_k:
            raise BadStep(f"draft step: num_speculative_tokens {self.num_speculative_tokens} outside [0, {max_k}]")
        if len(self.seqs) > MAX_STEP_SEQS:
            raise BadStep(f"draft step: {len(self.seqs)} sequences, at most {MAX_STEP_SEQS}")
        if not isinstance(self.input_ids, np.ndarray) or self.input_ids.ndim != 1 or not np.issubdtype(
                self.input_ids.dtype, np.integer):
            raise BadStep(f"draft step: input_ids must be a 1-D integer array, got "
                          f"{getattr(self.input_ids, 'dtype', type(self.input_ids).__name__)} "
                          f"{list(getattr(self.input_ids, 'shape', []))}")
        if self.input_ids.size and (int(self.input_ids.min()) < 0 or (
                vocab_size is not None and int(self.input_ids.max()) >= vocab_size)):
            raise BadStep(f"draft step: input ids in [{int(self.input_ids.min())}, {int(self.input_ids.max())}], "
                          f"outside the vocabulary [0, {vocab_size})")
        if len({s.req_id for s in self.seqs}) != len(self.seqs):
            raise BadStep("draft step: a sequence appears twice")
        if hidden_rows != self.num_tokens:
            raise BadStep(f"draft step: {hidden_rows} hidden rows for {self.num_tokens} tokens")
        if hidden_width != expected_width:
            raise BadStep(f"draft step: hidden width {hidden_width}, the head expects {expected_width}")
        end = 0
        for s in self.seqs:
            if (s.start != end or s.num_tokens < 1 or s.start_position < 0
                    or s.start_position + s.num_tokens - 1 > MAX_POSITION):
                raise BadStep(f"draft step: bad slice for {s.req_id[:80]!r}: start {s.start}, "
                              f"{s.num_tokens} rows from position {s.start_position}")
            end = s.start + s.num_tokens
        if end != self.num_tokens:
            raise BadStep(f"draft step: slices cover {end} of {self.num_tokens} rows")
        self.validate_mm(embed_width)

    def validate_mm(self, embed_width: int | None) -> None:
        """The multimodal rows: ascending, unique, inside the step's rows, with one embedding row each of the head's
        input-embedding width (``embed_width``), in the dtype that ``hidden_dtype`` travels as."""
        rows = self.mm_rows
        if not isinstance(rows, np.ndarray) or rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
            raise BadStep(f"draft step: mm_rows must be a 1-D integer array, got "
                          f"{getattr(rows, 'dtype', type(rows).__name__)}")
        if rows.size == 0:
            return
        if int(rows.min()) < 0 or int(rows.max()) >= self.num_tokens or (rows.size > 1 and (
                np.diff(rows.astype(np.int64)) <= 0).any()):
            raise BadStep(f"draft step: mm_rows must be ascending rows of the step's {self.num_tokens}, got "
                          f"[{int(rows.min())}, {int(rows.max())}] ({rows.size} rows)")
        emb = self.mm_embeds
        wire = HIDDEN_WIRE_DTYPES.get(self.hidden_dtype)
        if not isinstance(emb, np.ndarray) or emb.ndim != 2 or emb.shape[0] != rows.size:
            raise BadStep(f"draft step: mm_embeds must be [{rows.size}, width], got "
                          f"{list(getattr(emb, 'shape', [])) or type(emb).__name__}")
        if emb.dtype != wire:
            raise BadStep(f"draft step: mm_embeds of {emb.dtype} for hidden_dtype {self.hidden_dtype} "
                          f"(travels as {wire})")
        if embed_width is not None and emb.shape[1] != embed_width:
            raise BadStep(f"draft step: mm_embeds width {emb.shape[1]}, the head's embeddings are {embed_width} wide")


@dataclass
class DraftResult:
    step_id: int
    status: DraftStatus
    draft_token_ids: np.ndarray  # [B, k] int32, rows in the step's sequence order
    compute_ms: float = 0.0
    error: str = ""
    drafter_id: str = ""  # who drafted (a pool's replica id), so a router can send a sequence back there
    active_sequences: int = 0  # sequences the drafter holds draft state for, after this step
    cold_sequences: int = 0  # sequences first seen mid-stream (re-homed): drafted without their earlier context
    branch_lookups: int = 0  # sequences that had drafts precomputed for this step (asynchronous drafting)
    hit_rows: list[int] = field(default_factory=list)  # sequences (rows) answered from those drafts: the hits
    full_rows: list[int] = field(default_factory=list)  # sequences the drafter had no room for: placeholder drafts

    @property
    def branch_hits(self) -> int:
        return len(self.hit_rows)

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "step_id": self.step_id,
                "status": self.status.value,
                "shape": list(self.draft_token_ids.shape),
                "drafts": self.draft_token_ids.astype(np.int32).tobytes(),
                "compute_ms": self.compute_ms,
                "error": self.error,
                "drafter_id": self.drafter_id,
                "active_sequences": self.active_sequences,
                "cold_sequences": self.cold_sequences,
                "branch_lookups": self.branch_lookups,
                "hit_rows": list(self.hit_rows),
                "full_rows": list(self.full_rows),
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, data: bytes) -> DraftResult:
        d = msgpack.unpackb(data, raw=False)
        drafts = np.frombuffer(d["drafts"], dtype=np.int32).reshape(d["shape"])
        return cls(
            int(d["step_id"]), DraftStatus(d["status"]), drafts, float(d["compute_ms"]), str(d["error"]),
            str(d.get("drafter_id", "")), int(d.get("active_sequences", 0)), int(d.get("cold_sequences", 0)),
            int(d.get("branch_lookups", 0)), [int(i) for i in d.get("hit_rows", [])],
            [int(i) for i in d.get("full_rows", [])],
        )


@dataclass
class BranchEntry:
    """One sequence's precomputed next-step drafts, valid for the step that ships rows from position L+1
    (notation: ``actors.drafter.branches``)."""

    last_position: int  # L
    served: list[int]  # T_1..T_s: the drafts the verifier proposed for the step these branches follow (s <= k)
    drafts: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (a, y) -> k draft token ids

    def lookup(self, start_position: int, input_ids: list[int]) -> list[int] | None:
        """The branch for a step's rows (positions from ``start_position``, inputs ``input_ids``), if any.

        Worked example: L = 9, served [t1, t2]; a step shipping positions 10, 11 with inputs [t1, y] accepted
        a = 1 draft and emitted y, so it is answered by ``drafts[(1, y)]``; inputs [t2, y] match no branch."""
        a = len(input_ids) - 1
        if start_position != self.last_position + 1 or a > len(self.served) or input_ids[:a] != self.served[:a]:
            return None
        return self.drafts.get((a, input_ids[a]))


@dataclass
class BranchTable:
    """A drafter's branches for the sequences of the step it just answered, and its load."""

    entries: dict[str, BranchEntry]
    active_sequences: int = 0  # sequences the drafter holds draft state for (all verifiers)
    compute_ms: float = 0.0  # drafting the branches (and folding the step's hits)

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "entries": {rid: [e.last_position, e.served, [[a, y, *d] for (a, y), d in e.drafts.items()]]
                            for rid, e in self.entries.items()},
                "active_sequences": self.active_sequences,
                "compute_ms": self.compute_ms,
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, data: bytes) -> BranchTable:
        d = msgpack.unpackb(data, raw=False)
        entries = {
            str(rid): BranchEntry(int(last), [int(t) for t in served],
                                  {(int(b[0]), int(b[1])): [int(t) for t in b[2:]] for b in branches})
            for rid, (last, served, branches) in d["entries"].items()
        }
        return cls(entries, int(d["active_sequences"]), float(d["compute_ms"]))
