"""Trains EAGLE-1 and EAGLE-3 heads on the target's own hidden states.

Data flow: packed token rows -> ``collect_features`` (one no-grad target pass: post-norm last hidden state,
and the aux layers EAGLE-3 fuses) -> ``train_head`` (a ``DraftHead``, the same module the drafter runs)
-> ``actors.eagle.checkpoint.save_head`` in vLLM's layout.

Recipes, as the papers do them:

- EAGLE-1: one step; feature regression (smooth L1 from the head's output to the target's next hidden state)
  plus 0.1 x token loss (cross-entropy against the target's next-token distribution), uniform feature noise.
- EAGLE-3: token loss only, with training-time test: the head is unrolled ``unroll`` steps, each step fed its
  own previous output; step j's query at anchor t sits at position t + j and sees the real context up to t
  plus its own earlier steps for the same anchor (the mask below), exactly what the drafter sees at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import Llama4ForCausalLM

from actors.eagle.heads import DraftHead
from actors.eagle.spec import DraftMethod, HeadSpec
from training.target import cosine_lr

FEATURE_NOISE = 0.1
CLS_WEIGHT = 0.1
STEP_DECAY = 0.8


def eagle1_config(target_cfg: dict, num_layers: int) -> dict:
    """``EagleLlama4ForCausalLM`` config: the target's Llama 4 text config with dense RoPE draft layers."""
    if num_layers < 1:
        raise ValueError(f"num_layers: an EAGLE head needs at least one layer, got {num_layers}")
    cfg = {k: v for k, v in target_cfg.items() if not k.startswith("_")}
    cfg.update(
        architectures=["EagleLlama4ForCausalLM"],
        model_type="llama4_text",
        num_hidden_layers=num_layers,
        interleave_moe_layer_step=0,
        moe_layers=[],
        no_rope_layers=[1] * num_layers,
        layer_types=["chunked_attention"] * num_layers,
        yoco_global_kv_layer=None,
        yoco_local_kv_layer=None,
        draft_vocab_size=target_cfg["vocab_size"],
        dtype="bfloat16",
    )
    cfg.pop("torch_dtype", None)
    return cfg


def eagle3_config(target_cfg: dict, aux_layer_ids: list[int], draft_vocab_size: int) -> dict:
    """``Eagle3LlamaForCausalLM`` config (a Llama layer fusing ``aux_layer_ids`` of the target)."""
    n = target_cfg["num_hidden_layers"]
    bad = [i for i in aux_layer_ids if not 0 <= i < n]
    if bad:
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids: {bad} outside the target's layers 0..{n - 1} "
            f"(the target has num_hidden_layers={n})"
        )
    if len(aux_layer_ids) < 1:
        raise ValueError("eagle_aux_hidden_state_layer_ids: at least one target layer is needed")
    vocab = target_cfg["vocab_size"]
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size: {draft_vocab_size} must be in 1..{vocab} (the target's vocab_size)")
    h = target_cfg["hidden_size"]
    return {
        "architectures": ["Eagle3LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "target_hidden_size": h,
        "intermediate_size": target_cfg["intermediate_size_mlp"],
        "num_hidden_layers": 1,
        "num_attention_heads": target_cfg["num_attention_heads"],
        "num_key_value_heads": target_cfg["num_key_value_heads"],
        "head_dim": target_cfg["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": target_cfg["rms_norm_eps"],
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "rope_parameters": target_cfg["rope_parameters"],
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids), "use_aux_hidden_state": True},
        "tie_word_embeddings": False,
        "bos_token_id": target_cfg.get("bos_token_id"),
        "eos_token_id": target_cfg.get("eos_token_id"),
        "dtype": "bfloat16",
    }


@dataclass
class Features:
    hidden: torch.Tensor  # [rows, seq_len, H] target post-final-norm hidden states
    aux: torch.Tensor | None  # [rows, seq_len, len(aux_ids) * H] residual stream entering each aux layer


@torch.no_grad()
def collect_features(
    target: Llama4ForCausalLM,
    rows: torch.Tensor,  # [rows, seq_len]
    aux_layer_ids: list[int] | None,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> Features:
    """One pass of the target. ``hidden_states[i]`` of Hugging Face is the input of layer i, which is what
    vLLM captures for aux layer id i; the last entry is post-final-norm, what vLLM ships to EAGLE-1 heads."""
    hidden, aux = [], []
    for start in range(0, rows.shape[0], batch_size):
        out = target.model(input_ids=rows[start : start + batch_size], output_hidden_states=True)
        hidden.append(out.last_hidden_state.float())
        if aux_layer_ids:
            aux.append(torch.cat([out.hidden_states[i].float() for i in aux_layer_ids], dim=-1))
        if on_batch is not None:
            on_batch(min(batch_size, rows.shape[0] - start))
    return Features(torch.cat(hidden), torch.cat(aux) if aux else None)


def draft_vocab_from_counts(rows: torch.Tensor, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """EAGLE-3's draft vocabulary: the ``draft_vocab_size`` most frequent tokens, as ``d2t`` offsets.

    Worked example: vocab 6, draft vocab 3, most frequent tokens {4, 0, 2} -> sorted draft->target ids
    [0, 2, 4] -> d2t = [0 - 0, 2 - 1, 4 - 2] = [0, 1, 2]; draft id 2 means target id 2 + d2t[2] = 4.
    """
    counts = torch.bincount(rows.flatten(), minlength=vocab_size)
    top = torch.topk(counts, draft_vocab_size).indices.sort().values
    return top - torch.arange(draft_vocab_size)


class UnrolledAttention:
    """The training-time-test attention mask, as an ``AttendFn``.

    Step j (0-based) holds one query per anchor t, at position t + j. It sees step-0 keys at positions
    s <= t (the real context, computed from target features) and, for every earlier step i in 1..j, the single
    key of the same anchor t (position t + i). Chunked layers also require the same attention chunk.
    Worked example, T = 3, step 1: anchor 0 sees {s0: pos 0, s1: pos 1}; anchor 2 sees {s0: 0..2, s1: pos 3}.
    """

    def __init__(self, head: DraftHead, seq_len: int) -> None:
        self.chunks = {i: layer.self_attn.chunk_size for i, layer in enumerate(head.layers)}
        self.blocks: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.t = torch.arange(seq_len)
        self.step = 0

    def __call__(self, layer: int, q, k, v, positions) -> torch.Tensor:
        # q: [B, T, heads, d]; k, v: [B, T, kv_heads, d]
        blocks = self.blocks.setdefault(layer, [])
        blocks.append((k, v))
        j = len(blocks) - 1
        rep = q.shape[2] // k.shape[2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qh = q.transpose(1, 2)  # [B, h, T, d]

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.repeat_interleave(rep, dim=2).transpose(1, 2)  # [B, h, T, d]

        t = self.t
        chunk = self.chunks[layer]
        mask0 = t[None, :] <= t[:, None]  # [Tq, Tk]: s <= anchor
        if chunk:
            mask0 &= ((t[:, None] + j) // chunk) == (t[None, :] // chunk)
        s0 = (qh @ heads(blocks[0][0]).transpose(-1, -2)) * scale
        s0 = s0.masked_fill(~mask0, float("-inf"))
        diag = []
        for i in range(1, j + 1):
            si = (qh * heads(blocks[i][0])).sum(-1) * scale  # [B, h, T]
            if chunk:
                si = si.masked_fill(((t + j) // chunk) != ((t + i) // chunk), float("-inf"))
            diag.append(si)
        scores = torch.cat([s0, torch.stack(diag, -1)], dim=-1) if diag else s0
        probs = scores.softmax(-1)
        out = probs[..., : t.numel()] @ heads(blocks[0][1])
        for i in range(1, j + 1):
            out = out + probs[..., t.numel() + i - 1, None] * heads(blocks[i][1])
        return out.transpose(1, 2).flatten(-2)  # [B, T, h * d]


@dataclass(frozen=True)
class HeadTrainSpec:
    steps: int = 600
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 20
    unroll: int = 1  # EAGLE-1: 1 (paper); EAGLE-3: training-time test over 3 steps
    seed: int = 0


def _lr(step: int, spec: HeadTrainSpec) -> float:
    return cosine_lr(step, spec.lr, spec.warmup, spec.steps, floor=0.05)


def init_head(spec: HeadSpec, target: Llama4ForCausalLM, seed: int, d2t: torch.Tensor | None = None) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(spec)
    for p in head.parameters():
        if p.ndim >= 2:
            torch.nn.init.normal_(p, std=0.02)
    head.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.float())
    head.embed_tokens.weight.requires_grad_(False)
    lm = target.lm_head.weight.float()
    if spec.method is DraftMethod.EAGLE:
        head.lm_head.weight.data.copy_(lm)
        head.lm_head.weight.requires_grad_(False)
        # Start near "copy the target feature through": fc picks the hidden half.
        eye = torch.eye(spec.hidden_size)
        head.fc.weight.data.copy_(torch.cat([0.1 * eye, eye], dim=1))
    else:
        assert d2t is not None
        head.d2t.copy_(d2t)
        head.lm_head.weight.data.copy_(lm[torch.arange(spec.draft_vocab_size) + d2t])
    return head


def train_head(
    head: DraftHead,
    target_lm_head: torch.Tensor,  # [vocab, H]
    rows: torch.Tensor,  # [rows, T]
    feats: Features,
    spec: HeadTrainSpec,
    on_step: Callable[[int, float, float], None] | None = None,
) -> DraftHead:
    """Returns the trained head; ``on_step(step, loss, top1)`` with top-1 agreement of the first draft."""
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed)
    order = torch.randperm(rows.shape[0], generator=gen)
    n_rows, seq = rows.shape
    eagle3 = head.method is DraftMethod.EAGLE3
    draft_ids = torch.arange(head.spec.draft_vocab_size) + head.d2t if eagle3 else None
    for step in range(spec.steps):
        idx = order[(torch.arange(spec.batch_size) + step * spec.batch_size) % n_rows]
        ids, hid = rows[idx], feats.hidden[idx]  # [B, T], [B, T, H]
        with torch.no_grad():
            target_logits = hid @ target_lm_head.T  # [B, T, V]: distribution of the token after position t
            if eagle3:
                target_logits = target_logits[..., draft_ids]
            target_p = target_logits.softmax(-1)
        if eagle3:
            x = head.combine(feats.aux[idx])
        else:
            x = hid + (torch.rand(hid.shape, generator=gen) * 2 - 1) * FEATURE_NOISE
        attend = UnrolledAttention(head, seq)
        base = torch.arange(seq)
        loss = torch.zeros(())
        top1 = float("nan")
        for j in range(spec.unroll):
            # Row t of step j: input token x[t + j + 1] at position t + j; predicts the token after t + j + 1.
            src = (base + j + 1).clamp(max=seq - 1)
            valid = (base + j + 1) <= seq - 1  # [T]
            out, fed = head(ids[:, src], x, (base + j).expand(ids.shape[0], -1), attend)
            logp = head.draft_logits(out).log_softmax(-1)  # [B, T, Vd]
            tp = target_p[:, src]
            ce = -(tp * logp).sum(-1)[:, valid].mean()
            if eagle3:
                loss = loss + (STEP_DECAY**j) * ce
            else:
                reg = F.smooth_l1_loss(out[:, valid], hid[:, src][:, valid])
                loss = loss + reg + CLS_WEIGHT * ce
            if j == 0:
                top1 = (logp.argmax(-1) == tp.argmax(-1))[:, valid].float().mean().item()
            x = fed
        for group in opt.param_groups:
            group["lr"] = _lr(step, spec)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if on_step is not None:
            on_step(step, loss.item(), top1)
    head.eval()
    return head

