"""The training corpus: the Python standard library's own ``.py`` files, present offline on every machine.

Data flow: ``stdlib_files`` -> ``split_files`` (train / held-out, by a hash of the path, so the split does not
depend on the machine) -> ``train_tokenizer`` (byte-level BPE, Hugging Face ``tokenizers``) -> ``encode_files``
(one flat int32 token stream, ``<|end_of_text|>`` between files) -> ``pack`` into fixed-length rows.
Held-out prompts for acceptance measurements come from ``heldout_prompts``.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
HEADER_START = "<|header_start|>"
HEADER_END = "<|header_end|>"
EOT = "<|eot|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END, EOT, PAD]

# Llama 4's chat format, with this tokenizer's special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\n\n' + message['content'] + '<|eot|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|header_start|>assistant<|header_end|>\n\n' }}{% endif %}"
)

HELDOUT_EVERY = 25  # one file in 25 is held out


class CorpusError(ValueError):
    """The corpus folder is missing or holds no usable files."""


def default_corpus_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """All ``.py`` files under ``root`` (sorted, so every machine reads them in the same order)."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"corpus: {root} is not a folder (expected e.g. the Python standard library)")
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    if not files:
        raise CorpusError(f"corpus: no .py files under {root}")
    return files


def is_heldout(path: Path, root: Path) -> bool:
    digest = hashlib.sha1(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_EVERY == 0


def split_files(root: Path, seed: int = 0) -> tuple[list[Path], list[Path]]:
    """(train, held-out) files; the train files are shuffled by ``seed`` so a prefix of them is diverse."""
    files = stdlib_files(root)
    train = [p for p in files if not is_heldout(p, root)]
    random.Random(seed).shuffle(train)
    heldout = [p for p in files if is_heldout(p, root)]
    return train, heldout


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int, max_chars: int = 8_000_000) -> Tokenizer:
    """A byte-level BPE tokenizer (as Llama's) trained on the first ``max_chars`` characters of ``files``."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size: {vocab_size} is smaller than 256 bytes + {len(SPECIAL_TOKENS)} specials")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()

    def texts():
        budget = max_chars
        for path in files:
            if budget <= 0:
                return
            text = read_text(path)[:budget]
            budget -= len(text)
            yield text

    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def encode_files(tok: Tokenizer, files: list[Path], max_tokens: int | None = None) -> torch.Tensor:
    """One flat token stream: ``<bos> file0 <eos> <bos> file1 <eos> ...``, cut at ``max_tokens``."""
    eos = tok.token_to_id(EOS)
    out: list[int] = []
    batch = 64
    for start in range(0, len(files), batch):
        encs = tok.encode_batch([read_text(p) for p in files[start : start + batch]])
        for enc in encs:
            out.extend(enc.ids)
            out.append(eos)
        if max_tokens is not None and len(out) >= max_tokens:
            break
    ids = torch.tensor(out[:max_tokens] if max_tokens else out, dtype=torch.int32)
    return ids


def pack(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cut a flat stream into ``[num_rows, seq_len]`` rows (the tail that does not fill a row is dropped)."""
    rows = stream.numel() // seq_len
    if rows == 0:
        raise CorpusError(f"corpus: {stream.numel()} tokens do not fill one row of {seq_len}")
    return stream[: rows * seq_len].view(rows, seq_len).long()


def heldout_prompts(root: Path, num: int, seed: int = 0, min_lines: int = 4, max_lines: int = 10) -> list[str]:
    """Prompts cut from held-out files at line boundaries: the opening lines of a function or class body."""
    _, heldout = split_files(Path(root))
    rng = random.Random(seed)
    candidates: list[str] = []
    for path in heldout:
        lines = read_text(path).splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("def ", "class ")) and i + max_lines < len(lines):
                candidates.append("".join(lines[i : i + rng.randint(min_lines, max_lines)]))
    if len(candidates) < num:
        raise CorpusError(f"corpus: only {len(candidates)} held-out prompts, {num} asked")
    rng.shuffle(candidates)
    return candidates[:num]
