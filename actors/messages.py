"""The typed messages between the verifier (vLLM worker) and a drafter, one pair per verification step.

Wire format: msgpack for the small metadata (never pickle: a drafter may sit behind a network hop), and the
target hidden states as one numpy array passed as the drafter call's second argument (Ray inlines a small array in
the call and passes a large one through the object store, where the drafter reads it zero-copy). How the rows are
encoded into that array (bf16 as int16 bits) and decoded back is ``actors.wire``'s (``HIDDEN_WIRE_DTYPES``,
``encode_hidden``, ``decode_hidden``).

For a step with B sequences and N tokens in all (``hidden``: ``[N, fused_hidden_size]``), sequence i owns
rows ``[start_i, start_i + num_tokens_i)`` of the flat arrays. Row r of sequence i sits at position
``start_position_i + (r - start_i)``; its input token is the token *after* that position (the target's next
token for the last row), which is how EAGLE pairs token t+1 with hidden state t.

Worked example: a sequence whose accepted tokens this step are ``[a, b]`` at positions 7, 8, and whose
bonus / recovered token is ``c``: rows (position 7: input b, hidden h7), (position 8: input c, hidden h8).

Pipelined drafting adds a third message: after each step the drafter drafts the next step's *branches* (one per
guessed outcome, ``actors.drafter.branches``) and answers ``DrafterActor.branches`` with a ``BranchTable``; the
verifier keeps its object ref and, at the next step, looks each sequence's real outcome up in it locally
(``BranchTable.lookup``, the lookup the drafter engine runs on its own table too).

Images (multimodal targets): at the rows whose input token is an image position, vLLM's EAGLE heads take the
target's merged multimodal embedding (the vision encoder's output) instead of ``embed_tokens(placeholder id)``.
The step carries those rows (``mm_rows``, indices into the step's rows) and their embeddings (``mm_embeds``,
``[M, hidden_size]`` in ``hidden_dtype``) in the message itself; they only occur in the steps that ship a prompt's
image positions (once per image per sequence), and a step without them packs no extra field.

Prefix caching: with a prefix-cache hit vLLM computes, and ships hidden rows for, only the tokens past the cached
prefix, so a sequence's first step may start at ``start_position`` P > 0. That step carries the sequence's prompt
token ids (``DraftStep.prompts``) and vLLM's KV block size (``block_size``): the drafter hashes the prompt's blocks
(``actors.drafter.prefix_cache``) and finds positions [0, P) in its own prefix cache, or drafts from what follows.

Each message is a dataclass whose fields say once how they travel (``wire``: a codec, and the msgpack key when it
is not the field's name); ``pack`` writes a map of them and ``unpack`` reads it back, refusing malformed bytes,
missing fields and fields of the wrong type with a ``BadMessage`` that names the field.

A drafter trusts nothing it is sent: ``DraftStep.unpack`` refuses what does not decode (as ``BadStep``),
``DraftStep.validate`` the values (k, sequences, positions, token ids, the hidden array's rows, width and dtype),
both with ``BadStep`` naming what is wrong; the drafter answers that as a ``FAILED`` result.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, NamedTuple, Self

import msgpack
import numpy as np

from actors.wire import HIDDEN_WIRE_DTYPES

MAX_SPECULATIVE_TOKENS = 16  # the most draft tokens per step a config may ask for (SpeculativeConfig)
MAX_STEP_SEQS = 16384  # more sequences than any verifier batch holds
MAX_POSITION = 2**31 - 1  # positions are int32 in vLLM; rows past a drafter's max_model_len get no drafts there
MAX_BLOCK_SIZE = 2**16  # the largest KV block size a step may name (vLLM's are 16 to 256)


class BadMessage(ValueError):
    """Bytes that do not decode into the message expected; the message names the field."""


class BadStep(BadMessage):
    """A ``DraftStep`` (bytes or values) a drafter cannot draft from; the message says what is wrong."""


# --- the wire: each field's codec, declared once beside it (``wire``) ------------------------------------------
@dataclass(frozen=True)
class _Codec:
    encode: Callable[[Any], Any]  # value -> msgpack-able
    decode: Callable[[Any, str], Any]  # (wire value, field name) -> value, or BadMessage naming the field


def wire(codec: _Codec, key: str | None = None, **kw: Any) -> Any:
    """A message field that travels with ``codec``, under ``key`` (default: the field's name)."""
    return field(metadata={"codec": codec, "key": key}, **kw)


def _key(f: Field) -> str:
    return f.metadata["key"] or f.name


def _int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadMessage(f"{name} must be an integer, got {type(value).__name__}")
    return value


def _float(value: object, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadMessage(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise BadMessage(f"{name} must be a string, got {type(value).__name__}")
    return value


def _list(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise BadMessage(f"{name} must be a list, got {type(value).__name__}")
    return value


def _ids(value: object, name: str) -> np.ndarray:
    if not isinstance(value, bytes) or len(value) % 4:
        raise BadMessage(f"{name} must be int32 bytes")
    return np.frombuffer(value, dtype=np.int32)


def _array(value: object, name: str) -> np.ndarray:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], bytes)):
        raise BadMessage(f"{name} must be [shape, int32 bytes]")
    shape, raw = [_int(n, name) for n in _list(value[0], name)], value[1]
    if any(n < 0 for n in shape) or math.prod(shape) * 4 != len(raw):
        raise BadMessage(f"{name}: {len(raw)} bytes are no int32 array of shape {shape}")
    return np.frombuffer(raw, dtype=np.int32).reshape(shape)  # the shape asked for is the receiver's to check


def _enum(cls: type[enum.Enum]) -> _Codec:
    def decode(value: object, name: str) -> enum.Enum:
        value = _str(value, name)
        try:
            return cls(value)
        except ValueError as e:
            raise BadMessage(f"{name}: {e}") from None

    return _Codec(lambda v: v.value, decode)


def _list_of(item: _Codec) -> _Codec:
    return _Codec(lambda v: [item.encode(x) for x in v],
                  lambda v, name: [item.decode(x, name) for x in _list(v, name)])


def _map_of(item: _Codec) -> _Codec:
    def decode(value: object, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise BadMessage(f"{name} must be a map, got {type(value).__name__}")
        return {_str(k, name): item.decode(x, name) for k, x in value.items()}

    return _Codec(lambda v: {k: item.encode(x) for k, x in v.items()}, decode)


def _row(cls: type) -> _Codec:
    """A dataclass as the list of its fields, in order."""

    def decode(value: object, name: str) -> Any:
        fs = fields(cls)
        if not isinstance(value, list) or len(value) != len(fs):
            raise BadMessage(f"each of {name} must be [{', '.join(f.name for f in fs)}]")
        return cls(*(f.metadata["codec"].decode(x, f.name) for f, x in zip(fs, value, strict=True)))

    return _Codec(lambda obj: [f.metadata["codec"].encode(getattr(obj, f.name)) for f in fields(cls)], decode)


INT = _Codec(int, _int)
FLOAT = _Codec(float, _float)
STR = _Codec(str, _str)
INTS = _list_of(INT)
INT32_IDS = _Codec(lambda a: np.asarray(a).astype(np.int32).tobytes(), _ids)  # [N]
_PROMPTS = _map_of(INT32_IDS)  # req_id -> [L] int32 token ids
INT32_ARRAY = _Codec(lambda a: [list(np.shape(a)), np.asarray(a).astype(np.int32).tobytes()], _array)  # with its shape


class _Message:
    """``pack`` / ``unpack`` over a dataclass's ``wire`` fields: a msgpack map, every field required. A message
    with more on the wire than its fields (``DraftStep``'s images) extends ``_to_map`` / ``_from_map``."""

    _what: ClassVar[str] = "message"
    _error: ClassVar[type[BadMessage]] = BadMessage

    @classmethod
    def _wire_fields(cls) -> list[Field]:
        return [f for f in fields(cls) if "codec" in f.metadata]

    def _to_map(self) -> dict[str, Any]:
        return {_key(f): f.metadata["codec"].encode(getattr(self, f.name)) for f in self._wire_fields()}

    @classmethod
    def _from_map(cls, d: dict[str, Any]) -> Self:
        missing = {_key(f) for f in cls._wire_fields()} - set(d)
        if missing:
            raise BadMessage(f"missing fields {sorted(missing)}")
        return cls(**{f.name: f.metadata["codec"].decode(d[_key(f)], _key(f)) for f in cls._wire_fields()})

    def pack(self) -> bytes:
        return msgpack.packb(self._to_map(), use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> Self:
        """The message in ``data``, or ``cls._error``: not msgpack (truncated, trailing bytes), not a map with the
        fields ``pack`` writes, or a field of the wrong type."""
        try:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise BadMessage(f"expected bytes, got {type(data).__name__}")
            try:
                d = msgpack.unpackb(data, raw=False, strict_map_key=True)
            except Exception as e:  # msgpack's ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError...
                raise BadMessage(f"not a msgpack message ({type(e).__name__})") from None
            if not isinstance(d, dict):
                raise BadMessage(f"expected a map, got {type(d).__name__}")
            return cls._from_map(d)
        except BadMessage as e:
            raise cls._error(f"{cls._what}: {e}") from None


class SeqRole(enum.StrEnum):
    """What the verifier does with a sequence's drafts this step."""

    DRAFT = "draft"  # proposes the drafter's drafts: from the branch table (a hit) or drafted now (it waits)
    CONTEXT = "context"  # proposed placeholders without waiting (a prompt step): cache the rows, draft branches
    PREFILL = "prefill"  # a prompt chunk before the prompt's end (vLLM discards its drafts): as CONTEXT, for every
    # drafter: never drafted for, never waited for


class DraftStatus(enum.StrEnum):
    OK = "ok"
    PARTIAL = "partial"  # a pool's drafter failed for some sequences: their rows hold placeholder drafts
    FAILED = "failed"  # the drafter raised; the verifier drafts nothing this step


@dataclass(frozen=True)
class SeqSlice:  # travels as a row: [req_id, start, num_tokens, start_position, role]
    req_id: str = wire(STR)
    start: int = wire(INT)  # first row in the step's flat arrays
    num_tokens: int = wire(INT)  # rows of this sequence this step (>= 1)
    start_position: int = wire(INT)  # position of the first row
    role: SeqRole = wire(_enum(SeqRole), default=SeqRole.DRAFT)


@dataclass
class DraftStep(_Message):
    _what = "draft step"
    _error = BadStep

    step_id: int = wire(INT)
    num_speculative_tokens: int = wire(INT, key="k")
    seqs: list[SeqSlice] = wire(_list_of(_row(SeqSlice)))
    input_ids: np.ndarray = wire(INT32_IDS)  # [N] int32: the token after each row's position
    finished: list[str] = wire(_list_of(STR), default_factory=list)  # sequences whose draft state can be freed
    hidden_dtype: str = wire(STR, default="float32")  # "bfloat16" travels as int16 bits (numpy has no bf16)
    # Rows (ascending) whose input embedding is the target's merged multimodal embedding, and those embeddings.
    # Not ``wire`` fields: they travel together under "mm" only when there are any (``_to_map`` / ``_from_map``).
    mm_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [M] int32
    mm_embeds: np.ndarray | None = None  # [M, hidden_size] float32 (int16 bits for bfloat16); None when M = 0
    # Prefix caching: the prompt token ids of the sequences whose first step this is ([L] int32 each; the drafter
    # hashes their blocks), and the verifier's KV block size that the hashes are taken over (0: none sent). Not
    # ``wire`` fields either: they travel under "prefix" as [block_size, {req_id: ids}] only when there are prompts.
    prompts: dict[str, np.ndarray] = field(default_factory=dict)
    block_size: int = 0

    @property
    def num_mm_rows(self) -> int:
        return int(np.asarray(self.mm_rows).shape[0]) if np.asarray(self.mm_rows).ndim else 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def _to_map(self) -> dict[str, Any]:
        d = super()._to_map()
        if self.num_mm_rows:  # text-only steps pack nothing more
            emb = np.ascontiguousarray(self.mm_embeds)
            d["mm"] = [np.asarray(self.mm_rows, np.int32).tobytes(), list(emb.shape), emb.tobytes()]
        if self.prompts:  # only a sequence's first step sends its prompt
            d["prefix"] = [int(self.block_size), _PROMPTS.encode(self.prompts)]
        return d

    @classmethod
    def _from_map(cls, d: dict[str, Any]) -> Self:
        step = super()._from_map(d)
        if "mm" in d:
            wire_dtype = HIDDEN_WIRE_DTYPES.get(step.hidden_dtype)
            if wire_dtype is None:
                raise BadMessage(f"hidden_dtype {step.hidden_dtype[:40]!r} is none of {sorted(HIDDEN_WIRE_DTYPES)}")
            mm = _list(d["mm"], "mm")
            if len(mm) != 3 or not isinstance(mm[0], bytes) or not isinstance(mm[2], bytes) or len(mm[0]) % 4:
                raise BadMessage("mm must be [int32 row bytes, [rows, width], embedding bytes]")
            shape = [_int(x, "mm shape") for x in _list(mm[1], "mm shape")]
            rows = np.frombuffer(mm[0], dtype=np.int32)
            if len(shape) != 2 or shape[0] != rows.shape[0] or shape[1] < 1 or (
                    len(mm[2]) != shape[0] * shape[1] * wire_dtype.itemsize):
                raise BadMessage(f"mm embeddings of shape {shape[:3]} and {len(mm[2])} bytes for {rows.shape[0]} rows")
            step.mm_rows, step.mm_embeds = rows, np.frombuffer(mm[2], dtype=wire_dtype).reshape(shape)
        if "prefix" in d:
            prefix = _list(d["prefix"], "prefix")
            if len(prefix) != 2:
                raise BadMessage("prefix must be [block_size, {req_id: int32 prompt ids}]")
            step.block_size = _int(prefix[0], "prefix block_size")
            step.prompts = _PROMPTS.decode(prefix[1], "prefix prompts")
        return step

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
        sub = DraftStep(self.step_id, self.num_speculative_tokens, seqs, self.input_ids[idx], [], self.hidden_dtype,
                        prompts={s.req_id: self.prompts[s.req_id] for s in seqs if s.req_id in self.prompts},
                        block_size=self.block_size)
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
        self.validate_prompts(vocab_size)
        self.validate_mm(embed_width)

    def validate_prompts(self, vocab_size: int | None) -> None:
        """``prompts``: only for sequences of this step, each 1..``MAX_POSITION`` token ids of the vocabulary, with
        ``block_size`` in [1, ``MAX_BLOCK_SIZE``] (any when no prompt is sent)."""
        if not isinstance(self.block_size, int) or not 0 <= self.block_size <= MAX_BLOCK_SIZE:
            raise BadStep(f"draft step: block_size {self.block_size} outside [0, {MAX_BLOCK_SIZE}]")
        if not self.prompts:
            return
        if self.block_size < 1:
            raise BadStep("draft step: prompts without a block_size")
        if not isinstance(self.prompts, dict):
            raise BadStep(f"draft step: prompts must be a map, got {type(self.prompts).__name__}")
        ids = {s.req_id for s in self.seqs}
        for rid, prompt in self.prompts.items():
            if rid not in ids:
                raise BadStep(f"draft step: prompts for {str(rid)[:80]!r}, which is not in the step")
            if not isinstance(prompt, np.ndarray) or prompt.ndim != 1 or not 1 <= prompt.size <= MAX_POSITION:
                raise BadStep(f"draft step: prompts[{rid[:80]!r}] must be 1-D int32 ids, got "
                              f"{list(getattr(prompt, 'shape', [])) or type(prompt).__name__}")
            if int(prompt.min()) < 0 or (vocab_size is not None and int(prompt.max()) >= vocab_size):
                raise BadStep(f"draft step: prompts[{rid[:80]!r}] ids in [{int(prompt.min())}, {int(prompt.max())}], "
                              f"outside the vocabulary [0, {vocab_size})")

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


class BadDrafts(ValueError):
    """A drafter's answer that the verifier must not use: the drafter is treated as failed."""


def check_drafts(drafts: Any, rows: int, k: int, vocab_size: int | None) -> np.ndarray:
    """A drafter's ``[rows, k]`` draft token ids, checked: an integer array of that shape, every id in
    ``[0, vocab_size)`` (``vocab_size`` None: only ``>= 0``); vLLM indexes its logits with them. Else ``BadDrafts``
    saying what is wrong. The verifier's one check of what a drafter answers (``DraftResult``, ``BranchTable``)."""
    if not isinstance(drafts, np.ndarray) or not np.issubdtype(drafts.dtype, np.integer):
        raise BadDrafts(f"drafts are {type(drafts).__name__} of {getattr(drafts, 'dtype', '?')}, not integer ids")
    if drafts.shape != (rows, k):
        raise BadDrafts(f"drafts of shape {list(drafts.shape)} for [{rows}, {k}]")
    if drafts.size and (int(drafts.min()) < 0 or (vocab_size is not None and int(drafts.max()) >= vocab_size)):
        raise BadDrafts(f"draft token ids in [{int(drafts.min())}, {int(drafts.max())}], outside the target's "
                        f"vocabulary [0, {vocab_size})")
    return drafts


@dataclass(frozen=True)
class ShmRows(_Message):
    """Where a step's hidden rows lie in the (verifier, drafter) pair's shared-memory region (``actors.shm_rows``):
    the second argument of ``DrafterActor.draft_step_shm`` in place of the rows themselves. Their dtype is the one
    the step's ``hidden_dtype`` travels as. A drafter checks every field against its region (``RowsReader.view``)."""

    _what = "shared-memory rows"
    _error = BadStep

    region: str = wire(STR)  # the region's name (its file in /dev/shm, unlinked once the drafter mapped it)
    slot: int = wire(INT)
    generation: int = wire(INT, key="gen")  # the write's; the slot's header must still say so
    offset: int = wire(INT)  # bytes from the region's start: the slot's rows
    rows: int = wire(INT)  # the rows' shape: [rows, width]
    width: int = wire(INT)


@dataclass
class DraftResult(_Message):
    _what = "draft result"

    step_id: int = wire(INT)
    status: DraftStatus = wire(_enum(DraftStatus))
    draft_token_ids: np.ndarray = wire(INT32_ARRAY, key="drafts")  # [B, k] int32, rows in the step's order
    compute_ms: float = wire(FLOAT, default=0.0)
    error: str = wire(STR, default="")
    drafter_id: str = wire(STR, default="")  # who drafted (a pool's replica id), so a sequence can go back there
    active_sequences: int = wire(INT, default=0)  # sequences the drafter holds draft state for, after this step
    cold_sequences: int = wire(INT, default=0)  # first seen mid-stream (re-homed): drafted without earlier context
    branch_lookups: int = wire(INT, default=0)  # sequences that had drafts precomputed for this step (async)
    hit_seqs: list[int] = wire(INTS, default_factory=list)  # sequences (indices) answered from those: the hits
    full_seqs: list[int] = wire(INTS, default_factory=list)  # sequences with no room here: placeholder drafts
    # Prefix caching: of the positions vLLM skipped (a prefix-cache hit: a sequence's first step at P > 0), those
    # this drafter found in its own prefix cache (hit) and those it lacked (miss), since its last result.
    prefix_hit_tokens: int = wire(INT, default=0)
    prefix_miss_tokens: int = wire(INT, default=0)

    @property
    def branch_hits(self) -> int:
        return len(self.hit_seqs)


def _branches(value: object, name: str) -> dict[tuple[int, int], list[int]]:
    rows = [[_int(x, name) for x in _list(b, name)] for b in _list(value, name)]
    if any(len(b) < 2 for b in rows):
        raise BadMessage(f"each of {name} must be [a, y, drafts...]")
    return {(b[0], b[1]): b[2:] for b in rows}


BRANCHES = _Codec(lambda v: [[int(a), int(y), *map(int, d)] for (a, y), d in v.items()], _branches)


@dataclass
class BranchEntry:  # travels as a row: [last_position, served, [[a, y, drafts...], ...]]
    """One sequence's precomputed next-step drafts, valid for the step that ships rows from position L+1
    (notation: ``actors.drafter.branches``)."""

    last_position: int = wire(INT)  # L
    served: list[int] = wire(INTS)  # T_1..T_s: the drafts proposed for the step these branches follow (s <= k)
    drafts: dict[tuple[int, int], list[int]] = wire(BRANCHES, default_factory=dict)  # (a, y) -> k draft token ids

    def follows(self, start_position: int) -> bool:
        """Whether these branches are for the step whose rows start at ``start_position`` (L + 1)."""
        return start_position == self.last_position + 1

    def branch(self, input_ids: list[int]) -> list[int] | None:
        """The branch for the inputs of the step these branches follow (``follows``), if any."""
        a = len(input_ids) - 1
        if a > len(self.served) or input_ids[:a] != self.served[:a]:
            return None
        return self.drafts.get((a, input_ids[a]))

    def lookup(self, start_position: int, input_ids: list[int]) -> list[int] | None:
        """The branch for a step's rows (positions from ``start_position``, inputs ``input_ids``), if any.

        Worked example: L = 9, served [t1, t2]; a step shipping positions 10, 11 with inputs [t1, y] accepted
        a = 1 draft and emitted y, so it is answered by ``drafts[(1, y)]``; inputs [t2, y] match no branch."""
        return self.branch(input_ids) if self.follows(start_position) else None


class StepLookup(NamedTuple):
    """A step's sequences (indices into its ``seqs``) as its branch table answers them (``BranchTable.lookup``)."""

    hits: list[int]  # answered: a branch of the step's k drafts
    drafts: list[list[int]]  # the k drafts of each hit, in ``hits``' order
    misses: list[int]  # no branch for their real outcome (or none of k drafts): drafted on demand, or not at all
    context: list[int]  # ``SeqRole.CONTEXT`` / ``PREFILL``: not looked up (no drafts this step)
    lookups: int  # sequences that had branches for this step (the hits, and misses whose outcome was unguessed)


@dataclass
class BranchTable(_Message):
    """A drafter's branches for the sequences of the step it just answered, and its load."""

    _what = "branch table"

    entries: dict[str, BranchEntry] = wire(_map_of(_row(BranchEntry)))
    active_sequences: int = wire(INT, default=0)  # sequences the drafter holds draft state for (all verifiers)
    compute_ms: float = wire(FLOAT, default=0.0)  # drafting the branches (and folding the step's hits)

    def check(self, vocab_size: int | None) -> BranchTable:
        """This table, checked as ``check_drafts`` checks drafts: every branch's ids in the vocabulary (a branch
        shorter or longer than a step's k is only a miss, ``lookup``); else ``BadDrafts``."""
        for rid, entry in self.entries.items():
            for (a, y), drafts in entry.drafts.items():
                if a < 0 or not drafts:
                    raise BadDrafts(f"branch table for {rid!r}: branch {(a, y)} with {len(drafts)} drafts")
                check_drafts(np.asarray([drafts], np.int64), 1, len(drafts), vocab_size)
        return self

    def lookup(self, step: DraftStep) -> StepLookup:
        """Each sequence of ``step`` looked up: its real outcome (its rows' input ids) against its branches, a hit
        when they hold one of the step's k drafts. The one lookup, on both sides: the verifier's client (the table
        a home answered) and the drafter engine (its own table).

        Worked example: k = 2; seqs a (CONTEXT), b (positions 10, 11, inputs [t1, y]) and c (position 5, input
        [z]); entries b: L = 9, served [t1, t2], {(1, y): [1, 2]} and c: L = 4, served [], {} -> hits [1]
        (drafts [[1, 2]]), misses [2], context [0], lookups 2."""
        hits: list[int] = []
        drafts: list[list[int]] = []
        misses: list[int] = []
        context: list[int] = []
        lookups = 0
        k = step.num_speculative_tokens
        for i, s in enumerate(step.seqs):
            if s.role is not SeqRole.DRAFT:  # CONTEXT, PREFILL
                context.append(i)
                continue
            entry = self.entries.get(s.req_id)
            found = None
            if entry is not None and entry.follows(s.start_position):
                lookups += 1
                found = entry.branch(step.input_ids[s.start : s.start + s.num_tokens].tolist())
            if found is not None and len(found) == k:
                hits.append(i)
                drafts.append(found)
            else:
                misses.append(i)
        return StepLookup(hits, drafts, misses, context, lookups)
