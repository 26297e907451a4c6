"""The draft heads: one ``DraftHead`` module for vLLM's ``EagleLlama4ForCausalLM`` and
``Eagle3LlamaForCausalLM``, written to match vLLM's forward passes step for step.

One draft step, for N tokens (any leading shape), where ``hidden`` is what the verifier shipped for the
previous position (EAGLE: the target's post-final-norm hidden state; EAGLE-3: ``combine(aux)``) or what this
head returned at the previous draft step:

    EAGLE-1 (Llama 4)                          EAGLE-3
    x = fc(cat(embed(ids), hidden))            e = input_layernorm(embed(ids)); r = hidden
    for layer: Llama 4 dense decoder layer     x = cat(e, hidden_norm(hidden)) -> attention (2H in) -> MLP
    out = norm(x + residual)                   out = norm(x + r); logits over the draft vocab, d2t -> target ids
    returns (out, out)                         returns (out, x + r)   # (for logits, fed back)

Images: at the rows ``mm`` names, ``embed(ids)`` is replaced by the target's merged multimodal embedding (what
vLLM's ``embed_input_ids(ids, multimodal_embeddings, is_multimodal)`` does for its EAGLE heads), in both kinds.
"""

from __future__ import annotations

import torch
from torch import nn

from actors.eagle import kernels
from actors.eagle.layers import MLP, AttendFn, DraftAttention, RMSNorm
from actors.eagle.spec import DraftMethod, HeadSpec


class Llama4DraftLayer(nn.Module):
    """vLLM's ``Llama4DecoderLayer`` with a dense MLP (the only kind an EAGLE Llama 4 head has)."""

    def __init__(self, spec: HeadSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.self_attn = DraftAttention(spec, layer, spec.hidden_size)
        self.feed_forward = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x, residual, positions, attend: AttendFn):
        residual = x if residual is None else x + residual
        h = self.input_layernorm(residual)
        q, k, v = self.self_attn.qkv(h, positions)
        residual = self.self_attn.out(attend(self.layer, q, k, v, positions)) + residual
        return self.feed_forward(self.post_attention_layernorm(residual)), residual


class Eagle3DraftLayer(nn.Module):
    """vLLM's EAGLE-3 ``LlamaDecoderLayer``: layer 0 attends over cat(embeds, hidden) (2H wide)."""

    def __init__(self, spec: HeadSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.first = layer == 0
        self.norm_before_residual = spec.norm_before_residual
        width = 2 * spec.hidden_size if self.first else spec.hidden_size
        self.self_attn = DraftAttention(spec, layer, width)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        if self.first:
            self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x, residual, positions, attend: AttendFn, embeds=None):
        if self.first:
            normed = self.hidden_norm(x)
            residual = normed if self.norm_before_residual else x
            h = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual = x + residual
            h = self.input_layernorm(residual)
        q, k, v = self.self_attn.qkv(h, positions)
        residual = self.self_attn.out(attend(self.layer, q, k, v, positions)) + residual
        return self.mlp(self.post_attention_layernorm(residual)), residual


class DraftHead(nn.Module):
    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, h)
        self.lm_head = nn.Linear(h, spec.draft_vocab_size, bias=False)
        self.norm = RMSNorm(h, spec.rms_norm_eps)
        if spec.method is DraftMethod.EAGLE:
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.layers = nn.ModuleList(Llama4DraftLayer(spec, i) for i in range(spec.num_layers))
        else:
            self.fc = nn.Linear(spec.fused_hidden_size, h, bias=False)
            self.layers = nn.ModuleList(Eagle3DraftLayer(spec, i) for i in range(spec.num_layers))
            # target id = draft id + d2t[draft id]
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))

    def cast(self, dtype: torch.dtype) -> DraftHead:
        """Weights in ``dtype``; the rotary frequencies stay float32 (vLLM computes rotary angles in float32: in
        bfloat16 a frequency's rounding error times a position in the thousands would be radians off)."""
        self.to(dtype)
        for layer in self.layers:
            layer.self_attn.reset_freqs()
        return self

    def fuse(self, max_positions: int | None = None) -> DraftHead:
        """For inference (the drafter engine), after ``cast`` and the move to the device: q/k/v and gate/up
        projections as one matmul each, and where vLLM is installed its kernels for RMSNorm, rotary (positions below
        ``max_positions``) and SiLU-and-multiply (``actors.eagle.kernels``)."""
        use_kernels = kernels.available()
        for layer in self.layers:
            layer.self_attn.fuse(max_positions, use_kernels)
            (layer.feed_forward if hasattr(layer, "feed_forward") else layer.mlp).fuse(use_kernels)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.use_kernel = use_kernels
        return self

    @property
    def method(self) -> DraftMethod:
        return self.spec.method

    def combine(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """What the verifier ships -> the head's hidden width (EAGLE-3 fuses the aux layers with ``fc``)."""
        if self.method is DraftMethod.EAGLE3 and target_hidden.shape[-1] != self.spec.hidden_size:
            return self.fc(target_hidden)  # [..., 3 * H_target] -> [..., H]
        return target_hidden

    def forward(
        self,
        input_ids: torch.Tensor,  # [...]
        hidden: torch.Tensor,  # [..., hidden_size]
        positions: torch.Tensor,  # [...]
        attend: AttendFn,
        mm: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([M] flat rows, [M, hidden_size] embeddings)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (for logits, fed back), each [..., hidden_size]
        embeds = self.embed_tokens(input_ids)
        if mm is not None and mm[0].numel():
            flat = embeds.reshape(-1, embeds.shape[-1]).index_put((mm[0],), mm[1].to(embeds.dtype))
            embeds = flat.view(embeds.shape)
        if self.method is DraftMethod.EAGLE:
            x = self.fc(torch.cat([embeds, hidden], dim=-1))
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual, positions, attend)
            out = self.norm(x + residual)
            return out, out
        x, residual = hidden, None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, attend, embeds=embeds if layer.first else None)
        pre = x + residual
        out = self.norm(pre)
        return out, (out if self.spec.norm_output else pre)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., draft_vocab_size]
        return self.lm_head(out)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.method is DraftMethod.EAGLE3:
            return draft_ids + self.d2t[draft_ids]
        return draft_ids

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Inverse of ``to_target_ids`` for tokens in the draft vocabulary (others map to draft id 0)."""
        if self.method is DraftMethod.EAGLE3:
            if getattr(self, "_t2d", None) is None or self._t2d.device != self.d2t.device:
                draft = torch.arange(self.spec.draft_vocab_size, device=self.d2t.device)
                self._t2d = torch.zeros(self.spec.vocab_size, dtype=torch.long, device=self.d2t.device)
                self._t2d[draft + self.d2t] = draft
            return self._t2d[target_ids]
        return target_ids

    def greedy(self, out: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [...] target token ids
        return self.to_target_ids(self.draft_logits(out).argmax(-1))
