"""``python -m actors.train.cli {all,target,heads}``: makes the checkpoints shipped under ``models/``.

    all     tokenizer + target + every head (what ``make models`` runs)
    target  tokenizer + the Llama 4 target
    heads   the EAGLE-1 and EAGLE-3 heads, on a target folder made before

Every stage is seeded; progress bars show loss and tokens/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from actors.train import corpus, target

TARGET_DIR = "llama4-tiny"


def _out_dir(path: str) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: --out {out} cannot be created: {e.strerror}") from None
    return out


def _target_card(spec: target.TargetSpec, train: target.TrainSpec, final_loss: float, tokens: int) -> str:
    return f"""# llama4-tiny

A {spec.num_hidden_layers}-layer Hugging Face `Llama4ForCausalLM` (`model_type: llama4_text`) trained by
`python -m actors.train.cli target` on the Python standard library's `.py` files (1 file in
{corpus.HELDOUT_EVERY} held out). Made to exercise Llama 4's structure at toy scale, not to be useful.

- hidden {spec.hidden_size}, {spec.num_attention_heads} heads, {spec.num_key_value_heads} KV heads, vocab
  {spec.vocab_size} (byte-level BPE, `tokenizer.json`)
- MoE every {spec.interleave_moe_layer_step}nd layer: {spec.num_local_experts} routed experts (top-1, sigmoid
  router) + a shared expert; NoPE every {spec.no_rope_layer_interval}th layer; chunked attention
  ({spec.attention_chunk_size}) and QK-norm on the RoPE layers; llama3 rope scaling
- trained {train.steps} steps x {train.batch_size} x {train.seq_len} tokens ({tokens:,} tokens), seed
  {train.seed}, final training loss {final_loss:.2f}; weights stored in bf16
"""


def run_target(args: argparse.Namespace) -> Path:
    torch.set_num_threads(args.threads)
    out = _out_dir(args.out) / TARGET_DIR
    spec = target.TargetSpec(vocab_size=args.vocab_size)
    train = target.TrainSpec(steps=args.target_steps, batch_size=args.batch_size, seed=args.seed)
    train_files, _ = corpus.split_files(Path(args.corpus), seed=args.seed)
    tok = corpus.train_tokenizer(train_files, spec.vocab_size)
    need = train.steps * train.batch_size * train.seq_len + train.seq_len
    rows = corpus.pack(corpus.encode_files(tok, train_files, max_tokens=need), train.seq_len)
    bar = tqdm(total=train.steps, desc="target", unit="step", disable=args.quiet)
    tput = target.Throughput()
    last = [float("nan")]

    def on_step(step: int, loss: float) -> None:
        last[0] = loss
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tput.add(train.batch_size * train.seq_len):.0f}")
        bar.update()

    model = target.train_target(rows, spec, train, on_step)
    bar.close()
    target.save_target(model, tok, out, _target_card(spec, train, last[0], need))
    print(f"target -> {out} (loss {last[0]:.3f})")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m actors.train.cli", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["all", "target", "heads"])
    p.add_argument("--out", default="models", help="folder that receives the checkpoint folders")
    p.add_argument("--corpus", default=str(corpus.default_corpus_dir()), help="folder of .py files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--target-steps", type=int, default=target.TrainSpec.steps)
    p.add_argument("--batch-size", type=int, default=target.TrainSpec.batch_size)
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.stage in ("all", "target"):
            run_target(args)
    except (corpus.CorpusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
