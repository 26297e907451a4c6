"""``python -m training.cli {all,target,heads,multimodal}``: makes the checkpoints shipped under ``models/``.

    all         tokenizer + target + every head (``make models`` runs it, then ``multimodal``)
    target      tokenizer + the Llama 4 target
    heads       the EAGLE-1 and EAGLE-3 heads, on a target folder made before
    multimodal  ``llama4-tiny-mm``: the target with a random vision encoder (``training.multimodal``)

Every stage is seeded; progress bars show loss and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from actors.eagle.checkpoint import save_head
from actors.eagle.spec import head_spec_from_dict
from training import corpus, heads, target

TARGET_DIR = "llama4-tiny"


@dataclass(frozen=True)
class HeadRecipe:
    name: str
    method: str  # "eagle" | "eagle3"
    num_layers: int = 1
    unroll: int = 1
    aux_layer_ids: tuple[int, ...] = ()
    draft_vocab_fraction: float = 0.5  # EAGLE-3 draft vocabulary, as a fraction of the target's


HEAD_RECIPES = [
    HeadRecipe("eagle-llama4-tiny-1l", "eagle", num_layers=1),
    HeadRecipe("eagle-llama4-tiny-3l", "eagle", num_layers=3),
    HeadRecipe("eagle3-llama4-tiny", "eagle3", unroll=3, aux_layer_ids=(1, 2, 3)),
]


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
`python -m training.cli target` on the Python standard library's `.py` files (1 file in
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


def _head_card(recipe: HeadRecipe, cfg: dict, train: heads.HeadTrainSpec, loss: float, top1: float) -> str:
    if recipe.method == "eagle":
        kind = (
            f"EAGLE-1 head in vLLM's `EagleLlama4ForCausalLM` layout: `fc` on concat(embeds, hidden), "
            f"{recipe.num_layers} dense Llama 4 decoder layer(s) (RoPE, QK-norm, chunked attention), `norm`; "
            "embed_tokens and lm_head are shared with the target (not stored here). Trained per the EAGLE "
            "paper: feature regression + 0.1 x token loss, uniform feature noise."
        )
    else:
        kind = (
            "EAGLE-3 head in vLLM's `Eagle3LlamaForCausalLM` layout: `fc` fuses target layers "
            f"{list(recipe.aux_layer_ids)} (`eagle_aux_hidden_state_layer_ids`), `midlayer` (q/k/v take 2H), "
            f"`norm`, `lm_head` over a {cfg['draft_vocab_size']}-token draft vocabulary with `d2t` / `t2d` maps; "
            "embed_tokens shared with the target. Trained per the EAGLE-3 paper: token loss with "
            f"training-time test over {recipe.unroll} steps."
        )
    return f"""# {recipe.name}

Draft head for `../{TARGET_DIR}`, made by `python -m training.cli heads`.

{kind}

- trained {train.steps} steps x {train.batch_size} rows on the target's own hidden states, seed {train.seed}
- final loss {loss:.3f}, top-1 agreement of the first draft with the target on training rows {top1:.2f}
- use with vLLM: `speculative_config={{"method": "{recipe.method}", "model": "models/{recipe.name}",
  "num_speculative_tokens": 3}}`; acceptance figures are in `docs/BENCHMARKS.md`
"""


def run_heads(args: argparse.Namespace) -> list[Path]:
    torch.set_num_threads(args.threads)
    out_root = _out_dir(args.out)
    target_dir = out_root / TARGET_DIR
    if not (target_dir / "config.json").is_file():
        raise ValueError(f"--out: {target_dir} holds no target checkpoint; run the 'target' stage first")
    target_cfg = json.loads((target_dir / "config.json").read_text())
    recipes = [r for r in HEAD_RECIPES if not args.only or r.name in args.only]
    configs = {}
    for r in recipes:  # validate every config before spending time on features
        if r.method == "eagle":
            configs[r.name] = heads.eagle1_config(target_cfg, r.num_layers)
        else:
            draft_vocab = int(target_cfg["vocab_size"] * r.draft_vocab_fraction)
            configs[r.name] = heads.eagle3_config(target_cfg, list(r.aux_layer_ids), draft_vocab)
    tgt = target.load_target(target_dir)
    tok = corpus.Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    train_files, _ = corpus.split_files(Path(args.corpus), seed=args.seed)
    seq = target.TrainSpec.seq_len
    skip = args.target_steps * args.batch_size * seq + seq  # the tokens the target was trained on
    stream = corpus.encode_files(tok, train_files, max_tokens=skip + args.head_rows * seq)
    rows = corpus.pack(stream[skip:], seq)
    aux_ids = sorted({i for r in recipes for i in r.aux_layer_ids})
    bar = tqdm(total=rows.shape[0], desc="target features", unit="row", disable=args.quiet)
    feats = heads.collect_features(tgt, rows, aux_ids, on_batch=bar.update)
    bar.close()
    written = []
    for r in recipes:
        cfg = configs[r.name]
        spec = head_spec_from_dict(cfg)
        d2t = None
        if r.method == "eagle3":
            d2t = heads.draft_vocab_from_counts(rows, spec.vocab_size, spec.draft_vocab_size)
            sel = [aux_ids.index(i) for i in r.aux_layer_ids]
            h = spec.hidden_size
            aux = feats.aux.view(*feats.aux.shape[:2], len(aux_ids), h)[:, :, sel].flatten(-2)
            f = heads.Features(feats.hidden, aux)
        else:
            f = heads.Features(feats.hidden, None)
        head = heads.init_head(spec, tgt, args.seed, d2t)
        train = heads.HeadTrainSpec(steps=args.head_steps, unroll=r.unroll, seed=args.seed)
        bar = tqdm(total=train.steps, desc=r.name, unit="step", disable=args.quiet)
        last = [float("nan"), float("nan")]

        def on_step(step: int, loss: float, top1: float, bar=bar, last=last) -> None:
            last[:] = [loss, top1]
            bar.set_postfix(loss=f"{loss:.3f}", top1=f"{top1:.2f}")
            bar.update()

        heads.train_head(head, tgt.lm_head.weight.detach().float(), rows, f, train, on_step)
        bar.close()
        out = out_root / r.name
        save_head(head, out, cfg)
        (out / "README.md").write_text(_head_card(r, cfg, train, *last))
        print(f"{r.name} -> {out} (loss {last[0]:.3f}, top1 {last[1]:.2f})")
        written.append(out)
    return written


def run_multimodal(args: argparse.Namespace) -> Path:
    from training import multimodal

    out_root = _out_dir(args.out)
    target_dir = out_root / TARGET_DIR
    if not (target_dir / "model.safetensors").is_file():
        raise ValueError(f"--out: {target_dir} holds no target checkpoint; run the 'target' stage first")
    out = multimodal.build(target_dir, out_root, seed=args.seed)
    print(f"multimodal -> {out}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.cli", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["all", "target", "heads", "multimodal"])
    p.add_argument("--out", default="models", help="folder that receives the checkpoint folders")
    p.add_argument("--corpus", default=str(corpus.default_corpus_dir()), help="folder of .py files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--target-steps", type=int, default=target.TrainSpec.steps)
    p.add_argument("--batch-size", type=int, default=target.TrainSpec.batch_size)
    p.add_argument("--head-steps", type=int, default=heads.HeadTrainSpec.steps)
    p.add_argument("--head-rows", type=int, default=1024, help="rows of 256 tokens for head training")
    p.add_argument("--only", nargs="*", help="head names to train (default: all)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.stage in ("all", "target"):
            run_target(args)
        if args.stage in ("all", "heads"):
            run_heads(args)
        if args.stage == "multimodal":  # needs torchvision (transformers' Llama 4 processor): not part of "all"
            run_multimodal(args)
    except (corpus.CorpusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
