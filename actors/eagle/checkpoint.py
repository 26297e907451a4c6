"""Loads and saves draft heads in vLLM's checkpoint layouts (safetensors only: nothing is unpickled).

Name mapping, checkpoint -> ``DraftHead``:

- a leading ``model.`` is dropped (both spellings occur in public heads);
- EAGLE-3: ``midlayer.`` -> ``layers.0.``; ``d2t`` kept; ``t2d`` ignored (it is implied by ``d2t``);
- EAGLE-1 Llama 4: q/k rows permuted from interleaved to neox order (``permute_for_rotary``), as vLLM does;
- ``embed_tokens`` (and, for EAGLE-1, ``lm_head``) come from the target checkpoint when the head has none,
  as vLLM shares them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from actors.eagle.heads import DraftHead
from actors.eagle.layers import permute_for_rotary, unpermute_for_rotary
from actors.eagle.spec import DraftMethod, HeadConfigError, HeadSpec, load_head_spec


def _safetensors_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise HeadConfigError(f"checkpoint: no *.safetensors in {folder} (only safetensors are read)")
    return files


def read_tensors(folder: Path, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in _safetensors_files(folder):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if names is None or key in names:
                    out[key] = st.get_tensor(key)
    return out


def _head_name(name: str) -> str | None:
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer.") :]
    if name == "t2d":
        return None
    return name


def _qk_heads(name: str, spec: HeadSpec) -> int | None:
    if name.endswith("q_proj.weight"):
        return spec.num_heads
    if name.endswith("k_proj.weight"):
        return spec.num_kv_heads
    return None


# The target tensors a head may share, under the names of text-only and multimodal Llama 4 checkpoints.
SHARED_TENSOR_NAMES = frozenset({"model.embed_tokens.weight", "lm_head.weight",
                                 "language_model.model.embed_tokens.weight", "language_model.lm_head.weight"})


def target_shared_weights(target_dir: Path) -> dict[str, torch.Tensor]:
    """``embed_tokens`` and ``lm_head`` of a Hugging Face Llama 4 text checkpoint."""
    cfg = json.loads((target_dir / "config.json").read_text())
    raw = read_tensors(target_dir, set(SHARED_TENSOR_NAMES))
    embed = raw.get("model.embed_tokens.weight", raw.get("language_model.model.embed_tokens.weight"))
    head = raw.get("lm_head.weight", raw.get("language_model.lm_head.weight"))
    if head is None and cfg.get("tie_word_embeddings"):
        head = embed
    out = {}
    if embed is not None:
        out["embed_tokens.weight"] = embed
    if head is not None:
        out["lm_head.weight"] = head
    return out


def load_head(
    head_dir: str | Path,
    target_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> DraftHead:
    head_dir = Path(head_dir)
    spec = load_head_spec(head_dir)
    head = DraftHead(spec)
    state: dict[str, torch.Tensor] = {}
    for name, t in read_tensors(head_dir).items():
        mapped = _head_name(name)
        if mapped is None:
            continue
        n_heads = _qk_heads(mapped, spec)
        if spec.permute_qk and n_heads is not None:
            t = permute_for_rotary(t, n_heads)
        state[mapped] = t
    missing = [k for k in ("embed_tokens.weight", "lm_head.weight") if k not in state]
    if missing:
        if target_dir is None:
            raise HeadConfigError(f"checkpoint: {head_dir} has no {missing} and no target checkpoint was given")
        shared = target_shared_weights(Path(target_dir))
        for k in missing:
            if k not in shared:
                raise HeadConfigError(f"checkpoint: {k} is in neither {head_dir} nor the target {target_dir}")
            state[k] = shared[k]
    expected = head.state_dict()
    for k, t in state.items():
        if k not in expected:
            raise HeadConfigError(f"checkpoint: unexpected tensor {k!r} in {head_dir}")
        if tuple(t.shape) != tuple(expected[k].shape):
            raise HeadConfigError(
                f"checkpoint: {k} has shape {tuple(t.shape)}, the config implies {tuple(expected[k].shape)}"
            )
    absent = sorted(set(expected) - set(state))
    if absent:
        raise HeadConfigError(f"checkpoint: {head_dir} lacks {absent}")
    head.load_state_dict({k: (v if v.dtype in (torch.long, torch.bool) else v.to(dtype)) for k, v in state.items()})
    return head.cast(dtype).eval() if dtype != torch.float32 else head.eval()


def head_state_for_saving(head: DraftHead, share_embed: bool = True, share_lm_head: bool | None = None
                          ) -> dict[str, torch.Tensor]:
    """The head's tensors under the checkpoint names vLLM reads (inverse of ``load_head``)."""
    spec = head.spec
    if share_lm_head is None:
        share_lm_head = spec.method is DraftMethod.EAGLE
    out: dict[str, torch.Tensor] = {}
    for name, t in head.state_dict().items():
        if (share_embed and name.startswith("embed_tokens")) or (share_lm_head and name.startswith("lm_head")):
            continue
        n_heads = _qk_heads(name, spec)
        if spec.permute_qk and n_heads is not None:
            t = unpermute_for_rotary(t, n_heads)
        if spec.method is DraftMethod.EAGLE3 and name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0.") :]
        out[name] = t.detach().contiguous()
    if spec.method is DraftMethod.EAGLE3:
        d2t = out["d2t"]
        t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
        t2d[torch.arange(spec.draft_vocab_size) + d2t] = True
        out["t2d"] = t2d
    return out


def save_head(head: DraftHead, out_dir: Path, config: dict, dtype: torch.dtype = torch.bfloat16) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v if v.dtype in (torch.long, torch.bool) else v.to(dtype))
        for k, v in head_state_for_saving(head).items()
    }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
