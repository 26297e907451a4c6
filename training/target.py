"""Trains the small Llama 4 target (Hugging Face ``Llama4ForCausalLM``, ``model_type: llama4_text``).

It keeps what makes Llama 4 itself, at toy scale: interleaved MoE layers (routed experts, top-1, sigmoid router,
plus a shared expert), NoPE layers (no rotary, every 4th layer), chunked local attention on the RoPE layers,
QK-norm, llama3 rope scaling. The output folder loads with ``transformers`` and vLLM with no network:
``config.json``, ``model.safetensors`` (bf16), ``tokenizer.json`` + ``tokenizer_config.json`` (chat template),
``generation_config.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, Llama4ForCausalLM, Llama4TextConfig, PreTrainedTokenizerFast

from training import corpus


@dataclass(frozen=True)
class TargetSpec:
    """Sizes of the target; the defaults are the shipped ``models/llama4-tiny``."""

    vocab_size: int = 4096
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int = 512  # each routed expert and the shared expert
    intermediate_size_mlp: int = 768  # dense layers
    num_local_experts: int = 4
    interleave_moe_layer_step: int = 2  # MoE on layers 1, 3
    no_rope_layer_interval: int = 4  # NoPE on layer 3
    attention_chunk_size: int = 128
    max_position_embeddings: int = 4096

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size: {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers: must be >= 1, got {self.num_hidden_layers}")

    def hf_config(self) -> Llama4TextConfig:
        self.validate()
        n = self.num_hidden_layers
        return Llama4TextConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            intermediate_size_mlp=self.intermediate_size_mlp,
            num_hidden_layers=n,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.hidden_size // self.num_attention_heads,
            num_local_experts=self.num_local_experts,
            num_experts_per_tok=1,
            interleave_moe_layer_step=self.interleave_moe_layer_step,
            no_rope_layers=[int((i + 1) % self.no_rope_layer_interval != 0) for i in range(n)],
            attention_chunk_size=self.attention_chunk_size,
            use_qk_norm=True,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0 * 4,
                "original_max_position_embeddings": 1024,
            },
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=5,
            tie_word_embeddings=False,
            attn_temperature_tuning=True,
            architectures=["Llama4ForCausalLM"],
        )


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 500
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.1
    seed: int = 0


def cosine_lr(step: int, peak: float, warmup: int, steps: int, floor: float) -> float:
    """Linear warm-up to ``peak``, then cosine decay to ``floor * peak`` at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at(step: int, spec: TrainSpec) -> float:
    return cosine_lr(step, spec.lr, spec.warmup, spec.steps, floor=0.1)


def build_model(spec: TargetSpec, seed: int) -> Llama4ForCausalLM:
    torch.manual_seed(seed)
    config = spec.hf_config()
    config._attn_implementation = "sdpa"
    return Llama4ForCausalLM(config)


def train_target(
    rows: torch.Tensor,  # [num_rows, seq_len] token ids
    spec: TargetSpec,
    train: TrainSpec,
    on_step: Callable[[int, float], None] | None = None,
) -> Llama4ForCausalLM:
    """Next-token training on packed rows; deterministic for a seed (fixed data order, fixed init)."""
    if rows.shape[1] < train.seq_len:
        raise ValueError(f"seq_len: rows hold {rows.shape[1]} tokens, {train.seq_len} asked")
    model = build_model(spec, train.seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(train.seed)
    order = torch.randperm(rows.shape[0], generator=gen)
    for step in range(train.steps):
        idx = order[(torch.arange(train.batch_size) + step * train.batch_size) % rows.shape[0]]
        batch = rows[idx, : train.seq_len]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, train)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step(step, loss.item())
    model.eval()
    return model


def save_target(model: Llama4ForCausalLM, tok: Tokenizer, out: Path, card: str) -> None:
    """Save in bf16 (half the bytes; vLLM and the heads' training both read it back as float32)."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=corpus.BOS,
        eos_token=corpus.EOS,
        pad_token=corpus.PAD,
        model_max_length=model.config.max_position_embeddings,
    )
    fast.chat_template = corpus.CHAT_TEMPLATE
    fast.save_pretrained(out)
    eot = tok.token_to_id(corpus.EOT)
    GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=[model.config.eos_token_id, eot],
        pad_token_id=model.config.pad_token_id,
    ).save_pretrained(out)
    (out / "README.md").write_text(card)


def load_target(path: Path) -> Llama4ForCausalLM:
    model = Llama4ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    return model


class Throughput:
    """Tokens per second since construction (for progress bars)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0

    def add(self, n: int) -> float:
        self.tokens += n
        return self.tokens / max(1e-9, time.perf_counter() - self.start)
