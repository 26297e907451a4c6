"""Does a draft head fit a target? Checked before anything starts, with a message naming the mismatch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from actors.eagle.spec import DraftMethod, HeadConfigError, HeadSpec


def target_text_config(target_dir: str | Path) -> dict[str, Any]:
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    return cfg.get("text_config", cfg)  # multimodal Llama 4 checkpoints nest the text config


def check_head_fits_target(head: HeadSpec, target: dict[str, Any]) -> None:
    t_hidden = int(target["hidden_size"])
    t_vocab = int(target["vocab_size"])
    t_layers = int(target["num_hidden_layers"])
    if head.vocab_size != t_vocab:
        raise HeadConfigError(f"draft head: vocab_size {head.vocab_size} != the target's vocab_size {t_vocab}")
    if head.draft_vocab_size > t_vocab:
        raise HeadConfigError(f"draft head: draft_vocab_size {head.draft_vocab_size} > the target's vocab {t_vocab}")
    if head.method is DraftMethod.EAGLE:
        if head.hidden_size != t_hidden:
            raise HeadConfigError(
                f"draft head: hidden_size {head.hidden_size} != the target's hidden_size {t_hidden} "
                "(an EAGLE head reads the target's last hidden state)"
            )
        return
    if (head.target_hidden_size or head.hidden_size) != t_hidden:
        raise HeadConfigError(
            f"draft head: target_hidden_size {head.target_hidden_size} != the target's hidden_size {t_hidden}"
        )
    bad = [i for i in head.aux_layer_ids if not 0 <= i < t_layers]
    if bad:
        raise HeadConfigError(
            f"draft head: eagle_aux_hidden_state_layer_ids {bad} are outside the target's layers 0..{t_layers - 1}"
        )
