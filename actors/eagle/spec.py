"""Typed description of a draft head, read from its ``config.json`` in one of vLLM's layouts.

Layouts understood (``architectures[0]``):

- ``EagleLlama4ForCausalLM`` (EAGLE-1, Llama 4 dense layers; Meta's Scout drafter), ``model_type: llama4_text``.
- ``Eagle3LlamaForCausalLM`` (EAGLE-3, Llama layers; NVIDIA's Maverick head), ``model_type: llama``.
- RedHatAI "speculators" EAGLE-3 configs (``speculators_model_type: eagle3``, layer config nested in
  ``transformer_layer_config``), which vLLM also reads.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DraftMethod(enum.StrEnum):
    EAGLE = "eagle"
    EAGLE3 = "eagle3"


class HeadConfigError(ValueError):
    """A draft head config that cannot be used (names the field)."""


@dataclass(frozen=True)
class RopeSpec:
    rope_type: str = "default"
    theta: float = 500000.0
    params: dict[str, Any] = field(default_factory=dict)  # the full rope_parameters dict


@dataclass(frozen=True)
class HeadSpec:
    method: DraftMethod
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    rope: RopeSpec
    # Llama 4 specifics (EAGLE-1 heads); per draft layer.
    use_rope: tuple[bool, ...] = ()
    use_qk_norm: bool = False
    attention_chunk_size: int | None = None
    attn_temperature_tuning: bool = False
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    # EAGLE-3 specifics.
    target_hidden_size: int | None = None
    aux_layer_ids: tuple[int, ...] = ()
    norm_before_residual: bool = False
    norm_output: bool = False
    attention_bias: bool = False
    # The head's hf config dict, as read (kept for saving and for building HF rope configs).
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def permute_qk(self) -> bool:
        """vLLM permutes q/k rows of Llama 4 checkpoints (interleaved rotary) to neox order on load."""
        return self.method is DraftMethod.EAGLE

    @property
    def fused_hidden_size(self) -> int:
        """Width of the hidden state the verifier ships per token: H (EAGLE) or len(aux) * H_target (EAGLE-3)."""
        if self.method is DraftMethod.EAGLE3:
            return (self.target_hidden_size or self.hidden_size) * (len(self.aux_layer_ids) or 3)
        return self.hidden_size


def _rope(cfg: dict[str, Any]) -> RopeSpec:
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    params["rope_theta"] = theta
    params["rope_type"] = rope_type
    return RopeSpec(rope_type=rope_type, theta=theta, params=params)


def _require(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise HeadConfigError(f"draft config: missing field {key!r}")
    return cfg[key]


def _from_speculators(cfg: dict[str, Any]) -> dict[str, Any]:
    """Flatten a "speculators" config (RedHatAI) into the ``Eagle3LlamaForCausalLM`` shape."""
    layer = dict(_require(cfg, "transformer_layer_config"))
    flat = {**layer}
    flat["architectures"] = ["Eagle3LlamaForCausalLM"]
    flat["draft_vocab_size"] = cfg.get("draft_vocab_size", layer.get("vocab_size"))
    flat["target_hidden_size"] = cfg.get("target_hidden_size") or layer.get("hidden_size")
    flat["norm_before_residual"] = cfg.get("norm_before_residual", False)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        flat["eagle_aux_hidden_state_layer_ids"] = ids
    return flat


def head_spec_from_dict(cfg: dict[str, Any]) -> HeadSpec:
    if cfg.get("speculators_model_type") == "eagle3":
        cfg = _from_speculators(cfg)
    arch = (cfg.get("architectures") or [""])[0]
    if arch in ("EagleLlama4ForCausalLM",):
        method = DraftMethod.EAGLE
    elif arch in ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Llama4ForCausalLM"):
        method = DraftMethod.EAGLE3
    else:
        raise HeadConfigError(
            f"draft config: architectures {cfg.get('architectures')!r} is not an EAGLE Llama 4 head "
            "(expected EagleLlama4ForCausalLM or Eagle3LlamaForCausalLM)"
        )
    hidden = int(_require(cfg, "hidden_size"))
    heads = int(_require(cfg, "num_attention_heads"))
    n_layers = int(_require(cfg, "num_hidden_layers"))
    vocab = int(_require(cfg, "vocab_size"))
    eagle_cfg = cfg.get("eagle_config") or {}
    common = dict(
        method=method,
        hidden_size=hidden,
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=vocab,
        draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope=_rope(cfg),
        raw=dict(cfg),
    )
    if method is DraftMethod.EAGLE:
        if (cfg.get("interleave_moe_layer_step") or 0) > 0 or cfg.get("moe_layers"):
            raise HeadConfigError("draft config: MoE draft layers are not supported (interleave_moe_layer_step)")
        no_rope = cfg.get("no_rope_layers") or [1] * n_layers
        if len(no_rope) != n_layers:
            raise HeadConfigError(
                f"draft config: no_rope_layers has {len(no_rope)} entries for {n_layers} layers"
            )
        return HeadSpec(
            **common,
            intermediate_size=int(cfg.get("intermediate_size_mlp") or _require(cfg, "intermediate_size")),
            use_rope=tuple(bool(x) for x in no_rope),
            use_qk_norm=bool(cfg.get("use_qk_norm", False)),
            attention_chunk_size=cfg.get("attention_chunk_size"),
            attn_temperature_tuning=bool(cfg.get("attn_temperature_tuning", False)),
            floor_scale=float(cfg.get("floor_scale", 8192.0)),
            attn_scale=float(cfg.get("attn_scale", 0.1)),
        )
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or ()
    return HeadSpec(
        **common,
        intermediate_size=int(_require(cfg, "intermediate_size")),
        use_rope=(True,) * n_layers,
        target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
        aux_layer_ids=tuple(int(i) for i in ids),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        norm_output=bool(cfg.get("norm_output", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
    )


def load_head_spec(path: str | Path) -> HeadSpec:
    path = Path(path)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise HeadConfigError(f"draft model: no config.json at {cfg_path}")
    return head_spec_from_dict(json.loads(cfg_path.read_text()))
