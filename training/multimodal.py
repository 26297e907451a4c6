"""A small multimodal Llama 4 (``Llama4ForConditionalGeneration``) around the shipped text model.

``python -m training.cli multimodal`` takes ``models/llama4-tiny`` (trained) and adds, seeded and *untrained*:

- six Llama 4 image tokens (ids 4096..4101: ``IMAGE_TOKENS``), so the text vocabulary grows to 4102; their
  embedding rows are drawn like the others' scale, their ``lm_head`` rows are zero;
- a two-layer Llama 4 vision encoder on 64 x 64 tiles of 8 x 8 patches (pixel shuffle 0.5: 16 embeddings per
  tile) and the projector onto the text model's width, rescaled so that image embeddings have the RMS of the
  text embeddings (so images change what the model says);
- the Llama 4 processor files (image processor: at most ``MAX_TILES`` tiles plus the global one per image) and
  the text model's chat template.

It also writes, for each shipped draft head, a folder whose ``config.json`` names the grown vocabulary (the head's
weights are the text model's, linked, not copied: EAGLE heads share the target's embedding, and the EAGLE-3
draft vocabulary maps into the old ids).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

IMAGE_TOKENS = ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                "<|tile_y_separator|>"]
TILE = 64
PATCH = 8
MAX_TILES = 4
MM_DIR = "llama4-tiny-mm"
HEADS = {"eagle-llama4-tiny-1l": "eagle-llama4-tiny-mm-1l", "eagle3-llama4-tiny": "eagle3-llama4-tiny-mm"}


def vision_config() -> dict:
    return dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=TILE,
        patch_size=PATCH, pixel_shuffle_ratio=0.5, projector_input_dim=128, projector_output_dim=128,
        vision_output_dim=128, norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def _tokenizer(text_dir: Path, out: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(text_dir / "tokenizer.json"))
    base = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS])
    ids = {t: tok.token_to_id(t) for t in IMAGE_TOKENS}
    if sorted(ids.values()) != list(range(base, base + len(IMAGE_TOKENS))):
        raise ValueError(f"image tokens got ids {ids}, expected {base}..{base + len(IMAGE_TOKENS) - 1}")
    tok.save(str(out / "tokenizer.json"))
    return ids


def build(text_dir: Path, out_root: Path, seed: int = 0) -> Path:
    """Writes ``out_root/llama4-tiny-mm`` and the heads' folders; returns the checkpoint's folder."""
    from safetensors.torch import load_file
    from transformers import (
        Llama4Config,
        Llama4ForConditionalGeneration,
        Llama4Processor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.llama4 import Llama4ImageProcessor

    out = out_root / MM_DIR
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(text_dir, out)
    text_cfg = json.loads((text_dir / "config.json").read_text())
    text_cfg.pop("architectures", None)
    old_vocab = int(text_cfg["vocab_size"])
    text_cfg["vocab_size"] = old_vocab + len(IMAGE_TOKENS)
    cfg = Llama4Config(
        text_config=text_cfg, vision_config=vision_config(), boi_token_index=ids["<|image_start|>"],
        eoi_token_index=ids["<|image_end|>"], image_token_index=ids["<|patch|>"], tie_word_embeddings=False,
    )
    cfg.architectures = ["Llama4ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Llama4ForConditionalGeneration(cfg).float().eval()
    text = load_file(str(text_dir / "model.safetensors"))
    lm = model.language_model if hasattr(model, "language_model") else model.model.language_model
    lm_state = lm.state_dict()
    embed = text["model.embed_tokens.weight"].float()
    new_rows = torch.randn(len(IMAGE_TOKENS), embed.shape[1], generator=torch.Generator().manual_seed(seed))
    text["model.embed_tokens.weight"] = torch.cat([embed, new_rows * embed.std()])
    head = text["lm_head.weight"].float()
    text["lm_head.weight"] = torch.cat([head, torch.zeros(len(IMAGE_TOKENS), head.shape[1])])
    for name, t in text.items():  # names relative to the language model, with or without the "model." level
        key = name if name in lm_state else name.removeprefix("model.")
        if key not in lm_state:
            raise ValueError(f"text weight {name} has no place in the multimodal model")
        lm_state[key] = t.float()
    lm.load_state_dict(lm_state)
    # Image embeddings with the text embeddings' RMS: measured on one random tile.
    with torch.no_grad():
        pixels = torch.rand(1, 3, TILE, TILE) * 2 - 1
        feats = model.get_image_features(pixel_values=pixels) if hasattr(model, "get_image_features") else None
        if isinstance(feats, (tuple, list)):
            feats = feats[0]
        if hasattr(feats, "pooler_output") and feats.pooler_output is not None:
            feats = feats.pooler_output
        if isinstance(feats, torch.Tensor):
            proj = model.multi_modal_projector if hasattr(model, "multi_modal_projector") else (
                model.model.multi_modal_projector)
            emb = proj(feats.reshape(-1, feats.shape[-1]))
            proj.linear_1.weight.mul_(embed.pow(2).mean().sqrt() / emb.pow(2).mean().sqrt())
    model.to(torch.bfloat16).save_pretrained(out)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"), bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
        pad_token="<|pad|>", model_max_length=int(text_cfg["max_position_embeddings"]),
    )
    tok.save_pretrained(out)
    template = (text_dir / "chat_template.jinja").read_text()
    image_proc = Llama4ImageProcessor(size={"height": TILE, "width": TILE}, max_patches=MAX_TILES,
                                      resize_to_max_canvas=False)
    Llama4Processor(image_processor=image_proc, tokenizer=tok, patch_size=PATCH, pixel_shuffle_ratio=0.5,
                    chat_template=template).save_pretrained(out)
    for name in ("generation_config.json",):
        if (text_dir / name).is_file():
            (out / name).write_text((text_dir / name).read_text())
    _heads(text_dir.parent, out_root, old_vocab + len(IMAGE_TOKENS))
    (out / "README.md").write_text(card(old_vocab, ids))
    return out


def _heads(models: Path, out_root: Path, vocab: int) -> None:
    for src_name, dst_name in HEADS.items():
        src, dst = models / src_name, out_root / dst_name
        if not (src / "config.json").is_file():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        cfg = json.loads((src / "config.json").read_text())
        if cfg.get("draft_vocab_size") == cfg["vocab_size"]:  # EAGLE-1: drafts over the whole (shared) lm_head
            cfg["draft_vocab_size"] = vocab
        cfg["vocab_size"] = vocab
        (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        link = dst / "model.safetensors"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(src / "model.safetensors", dst), link)
        (dst / "README.md").write_text(
            f"# {dst_name}\n\nThe draft head `../{src_name}` (its weights, linked) for `../{MM_DIR}`: the config "
            f"names the multimodal target's vocabulary ({vocab}: the text model's plus the six image tokens). "
            "Made by `python -m training.cli multimodal`. The head was trained on text only; at image "
            "positions it reads the target's merged image embeddings, as vLLM's EAGLE heads do.\n")


def card(old_vocab: int, ids: dict[str, int]) -> str:
    vc = vision_config()
    per_tile = (TILE // PATCH) ** 2 // 4
    return f"""# llama4-tiny-mm

A Hugging Face `Llama4ForConditionalGeneration` made by `python -m training.cli multimodal` (seeded, about
a minute on CPU) to exercise Llama 4's image path (vLLM's `mllama4.py`) at toy scale. It describes nothing: the
vision part is **random, not trained**.

- language model: `../llama4-tiny` (trained on Python source), its vocabulary grown from {old_vocab} to
  {old_vocab + len(IMAGE_TOKENS)} by the image tokens {", ".join(f"`{t}` {i}" for t, i in ids.items())}
  (new embedding rows random, new `lm_head` rows zero)
- vision encoder: Llama 4's (`Llama4VisionModel`), {vc["num_hidden_layers"]} layers, width {vc["hidden_size"]},
  {TILE} x {TILE} tiles of {PATCH} x {PATCH} patches, pixel shuffle 0.5, then the projector to the text width:
  {per_tile} `<|patch|>` embeddings per tile; an image is at most {MAX_TILES} tiles plus a global tile
  (`preprocessor_config.json`); projector rescaled so image embeddings have the text embeddings' RMS
- processor: `Llama4Processor` (`processor_config.json`), chat template as `../llama4-tiny` (vLLM puts
  `<|image|>` in the text for each image part of a chat message); vLLM needs `torchvision` importable for
  Llama 4's image processor (see `actors/torchvision_cpu.py`)
- draft heads: `../eagle-llama4-tiny-mm-1l`, `../eagle3-llama4-tiny-mm` (the text heads' weights, configs naming
  this vocabulary)
"""
