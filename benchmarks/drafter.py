"""Drafter micro-benchmarks, the drafter alone: its engine on an accelerator at Llama 4 Scout shapes (``device``),
its synchronous step on the shipped heads on one CPU core (``step``), and what one drafting call costs on Ray
(``ray-call``).

    python -m benchmarks.drafter device                       # Scout shapes, bf16, on CUDA if there is one
    python -m benchmarks.drafter device --small               # tiny shapes: seconds on a CPU
    python -m benchmarks.drafter device --heads eagle3 --batch 1 32 --context 1024 --steps 10
    taskset -c 1 python -m benchmarks.drafter step [--heads eagle eagle3] [--batch 1 16] [--steps 200] [--k 3]
        [--shuffled] [--gap-ms 0 20] [--profile]
    python -m benchmarks.drafter ray-call
    RAY_TMPDIR=/tmp/ray-bench python -m benchmarks.drafter transport [--repeats 30] [--json out.json]

This module imports only torch, numpy, the project's drafter code and ``benchmarks.stamp`` at the top (the GPU
machine has no vLLM, Ray, pydantic or transformers; ``benchmarks/device_check.sh`` runs ``device`` there); ``step``
reads the shipped checkpoints and ``ray-call`` needs Ray, both imported when run. Each run prints the stamp's line
first (commit, date, hardware; the machine's other busy processes where psutil is installed).

``device``: milliseconds per draft step and draft KV memory for Scout-shaped EAGLE-1 and EAGLE-3 heads, against the
same head without a KV cache. No checkpoint files: the heads have random weights, which cost what trained ones cost.
Shapes (``--small`` off): hidden 5120, 40 heads,
8 KV heads, head dim 128, MLP 16384, target vocabulary 202048; EAGLE-1 is one Llama 4 layer (QK-norm, chunked
attention 8192) sharing the target's vocabulary; EAGLE-3 is one layer reading three aux layers (3 x 5120 in)
with a 32000-token draft vocabulary. Rotary is plain (theta 5e5): Scout's llama3 scaling changes the
frequencies, not the cost, and needs ``transformers``.

Per (head, batch, context): every sequence is first filled to ``context`` positions (prefill steps, not timed),
then ``--steps`` decode steps are timed, each shipping 2 rows per sequence (one accepted draft and the bonus
token) and drafting k=3. Contexts stay below Scout's 8192-token attention chunk, so EAGLE-1 attends over all of
it. On CUDA each step is bracketed by ``torch.cuda.synchronize``. Columns:

- ``kernel``: the attention kernel the engine chose (``actors.drafter.slot_attention``), ``+graphs`` when its decode
  steps replayed CUDA graphs (``actors.drafter.decode_step``);
- ``engine``: median ms per step of ``DrafterEngine.draft_tensors`` (hidden states arrive in host memory, as
  they do from the verifier); ``host``: the part of it before the step's device work was all launched;
- ``eager floor``: the same head's passes for the same rows, attending only to each row itself (no KV cache read or
  write, no bookkeeping), launched eagerly; ``graph floor``: the same passes replayed from one CUDA graph, their
  inputs already on the device (what a step costs at least);
- ``attention``: the step's attention calls alone (one over 2 rows per sequence, k - 1 over one), the engine's
  kernel over the same cache, replayed from a CUDA graph; ``attn TB/s``: the K/V bytes they must read over that time;
- ``roofline``: the bytes a step must read (the weights once per pass, each sequence's cached K/V once per pass) at
  the device's copy bandwidth, measured in the same run (``# copy bandwidth``, bytes read and written);
- ``goal``: engine / bound, where the bound is 1.3x the graph floor at batch <= 8 and 1.5x (graph floor +
  attention) above (issue 43's goals; <= 1.00 meets it);
- ``recompute``: a plain PyTorch loop without cache reuse, each of the k passes re-running the head over a
  sequence's whole context, one sequence after another (skipped past ``--recompute-max-tokens``);
- ``KV MiB/seq``: draft KV cache bytes per sequence slot (dense ``[max_len, kv_heads, head_dim]`` per layer, K
  and V); ``KV MiB``: what the cache holds for the batch (the engine's slot cap is the batch).

``--branches`` also times pipelined drafting at the smallest context: the step's answer, the work after it
(``after_step``) and the branch passes inside it (``actors.drafter.branch_passes``), with the branch rows a step
drafted. ``--sweep`` also times the attention alone under a few Triton launch settings
(``slot_attention.launch_config``), for EAGLE-3 at the smallest and largest batch.

``step``: the drafter engine on a shipped head, median milliseconds per synchronous draft step, one torch thread.
Each sequence first ships a 100-row prompt, then decode steps of 2 rows each (one accepted draft and the bonus /
recovered token), random ids and hidden states. ``--shuffled`` lists the decode steps' sequences in a fixed
shuffled order (vLLM's persistent batch reorders its requests as others finish, so a live drafter's slots come
shuffled). ``--gap-ms`` sleeps that long after each step, as a served drafter idles while the verifier verifies (a
step after an idle gap costs more than the same step back to back). ``--profile``: cProfile's top functions over
100 more steps. The number ``benchmarks.offline drafter-speed`` puts beside vLLM's own draft step.

``ray-call``: a plain actor with ``max_concurrency=1`` (as ``DrafterActor``), called with a 200-byte message and
hidden rows of two shapes: the call waited for with the array inline, with ``ray.put`` + ObjectRef, the same
through a streaming generator's first item, a call submitted and not waited for (what a pipelined hit costs the
verifier), and reading a ready result (the branch table, drafted in time). Medians over 200 calls, idle.

``transport``: a step's hidden rows verifier -> drafter through the project's own seam (``actors.verifier.transport``)
at Llama 4 Scout's EAGLE-3 bytes, ``[rows, 15360]`` bf16 (sent as int16 bits): batches 1 / 8 / 32 / 128 of 4 rows
each, and prompt chunks of 2k and 32k tokens, on each path: ``host`` (the rows fancy-indexed out of the step's
array and passed as the call's argument: Ray inlines it or puts it in the object store) and ``shm`` (the rows
written once into a slot of the pair's shared-memory region, only metadata over Ray). The actor is a plain one
with the drafter's ``draft_step`` / ``draft_step_shm`` signatures that reads the rows where they arrive (the shm
one through ``actors.shm_rows.RowsReader``, generations checked) and answers 200 bytes. Per figure: ``host-side``,
the median ms from the step's tensor to the call submitted (the copies and the Ray call: what the verifier's step
pays), and ``round trip``, to the answer read; ``copies``: host copies of the rows on that path
(``transport.COPIES``). A shm slot is sized to the case's rows (the default 16 MiB slot sends a 2k chunk by host).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DrafterEngineConfig
from actors.drafter.engine import DrafterEngine
from actors.drafter.slot_attention import SlotRows, launch_config, slot_attention
from actors.eagle.heads import DraftHead
from actors.eagle.layers import sdpa_attend
from actors.eagle.spec import HeadSpec, head_spec_from_dict
from actors.messages import DraftStep, SeqSlice
from benchmarks import stamp

K = 3
ROWS_PER_DECODE = 2  # one accepted draft and the bonus token per sequence and step

SCOUT = dict(hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128, vocab_size=202048,
             intermediate_size=16384, rms_norm_eps=1e-5, max_position_embeddings=131072,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
             intermediate_size=128, rms_norm_eps=1e-5, max_position_embeddings=4096,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


def head_config(method: str, small: bool) -> dict[str, Any]:
    """A head ``config.json`` in vLLM's layout, Scout-shaped (or tiny)."""
    base = dict(SMALL if small else SCOUT, num_hidden_layers=1)
    if method == "eagle":
        return dict(base, architectures=["EagleLlama4ForCausalLM"], model_type="llama4_text",
                    intermediate_size_mlp=base["intermediate_size"], no_rope_layers=[1], use_qk_norm=True,
                    attention_chunk_size=128 if small else 8192, interleave_moe_layer_step=0)
    return dict(base, architectures=["Eagle3LlamaForCausalLM"], model_type="llama",
                draft_vocab_size=128 if small else 32000, target_hidden_size=base["hidden_size"],
                eagle_aux_hidden_state_layer_ids=[1, 23, 44])


def random_head(spec: HeadSpec, device: str, dtype: torch.dtype, seed: int = 0) -> DraftHead:
    """Random weights made in place on ``device`` (a Scout-sized vocabulary is 2 GB in bf16: never on the host)."""
    with torch.device("meta"):
        head = DraftHead(spec).to(dtype)
    head = head.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        if spec.draft_vocab_size < spec.vocab_size:  # EAGLE-3: draft id i -> a sorted random subset of the vocab
            keep = torch.randperm(spec.vocab_size, generator=gen, device=device)[: spec.draft_vocab_size].sort()
            head.d2t.copy_(keep.values - torch.arange(spec.draft_vocab_size, device=device))
    return head.cast(dtype)  # also recomputes the rotary frequencies that to_empty left unset


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls (after one untimed call)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


_HIDDEN: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def host_hidden(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Random hidden states [rows, width] in host memory, as the verifier ships them (made once per shape)."""
    t = _HIDDEN.get((width, dtype))
    if t is None or t.shape[0] < rows:
        _HIDDEN.clear()
        t = _HIDDEN[(width, dtype)] = torch.randn(rows, width, dtype=dtype)
    return t[:rows]


def make_step(step_id: int, seqs: list[tuple[str, int, int]], vocab: int, hidden: torch.Tensor
              ) -> tuple[DraftStep, torch.Tensor]:
    """seqs: (req_id, first position, rows) -> the step and its hidden rows (a slice of ``hidden``, on the host)."""
    slices, off = [], 0
    for rid, pos, rows in seqs:
        slices.append(SeqSlice(rid, off, rows, pos))
        off += rows
    ids = np.random.randint(0, vocab, off).astype(np.int32)
    return DraftStep(step_id, K, slices, ids), hidden[:off]


def fill(engine: DrafterEngine, batch: int, context: int, hidden: torch.Tensor, max_rows: int) -> None:
    """Prefill every sequence to ``context`` positions, as many sequences per step as ``max_rows`` allows."""
    per_step = max(1, max_rows // context)
    for first in range(0, batch, per_step):
        seqs = [(f"s{b}", 0, context) for b in range(first, min(batch, first + per_step))]
        engine.draft_tensors(*make_step(-1, seqs, engine.spec.vocab_size, hidden), precompute=False)


def self_attend(layer: int, q, k, v, positions) -> torch.Tensor:
    """Each row attends to itself only: the attention math of a pass without any cache."""
    mask = torch.ones(q.shape[0], 1, 1, dtype=torch.bool, device=q.device)
    return sdpa_attend(q[:, None], k[:, None], v[:, None], mask)[:, 0]


def causal_attend(chunk: int | None) -> Callable:
    def attend(layer: int, q, k, v, positions) -> torch.Tensor:
        n = q.shape[0]
        m = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if chunk:
            m &= (positions[:, None] // chunk) == (positions[None, :] // chunk)
        return sdpa_attend(q[None], k[None], v[None], m[None])[0]

    return attend


@torch.inference_mode()
def floor_passes(head: DraftHead, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``floor_step``'s passes with every input already on the device (what a CUDA graph replays)."""
    out, fed = head(ids, head.combine(hidden), positions, self_attend)
    last = torch.arange(ROWS_PER_DECODE - 1, ids.shape[0], ROWS_PER_DECODE, device=ids.device)
    out, fed, pos = out[last], fed[last], positions[last]
    drafts = []
    for j in range(K):
        tok = head.greedy(out)
        drafts.append(tok)
        if j + 1 < K:
            out, fed = head(tok, fed, pos + j + 1, self_attend)
    return torch.stack(drafts, dim=1)


@torch.inference_mode()
def floor_step(head: DraftHead, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """ids [B * 2], hidden [B * 2, fused] (host), positions [B * 2] -> drafts [B, K]: the engine's passes, no cache,
    the inputs copied from the host first."""
    weight = head.embed_tokens.weight
    return floor_passes(head, ids.to(weight.device), hidden.to(weight.device, weight.dtype),
                        positions.to(weight.device)).cpu()


@torch.inference_mode()
def recompute_step(head: DraftHead, batch: int, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Per sequence (all share the context ids [T] / hidden [T, fused], on the device): K passes over the whole
    context and the drafts so far, no cache."""
    chunk = head.layers[0].self_attn.chunk_size
    drafts = []
    for _ in range(batch):
        tok_ids, hid = ids, head.combine(hidden)
        seq = []
        for _ in range(K):
            pos = torch.arange(tok_ids.shape[0], device=ids.device)
            out, fed = head(tok_ids, hid, pos, causal_attend(chunk))
            tok = head.greedy(out[-1:])
            seq.append(tok)
            tok_ids, hid = torch.cat([tok_ids, tok]), torch.cat([hid, fed[-1:]])
        drafts.append(torch.cat(seq))
    return torch.stack(drafts).cpu()


def graph_timed(device: str, fn: Callable[[], Any], repeats: int) -> float | None:
    """Median ms of one replay of ``fn`` captured in a CUDA graph (None on a CPU)."""
    if not device.startswith("cuda"):
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(device, graph.replay, repeats)


def copy_bandwidth(device: str) -> float | None:
    """Bytes read plus written per second by a device-to-device copy of 2 GiB (None on a CPU)."""
    if not device.startswith("cuda"):
        return None
    src = torch.empty(2**30, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = timed(device, lambda: dst.copy_(src), 10)
    return 2 * 2**31 / (ms / 1e3)


def step_bytes(head: DraftHead, batch: int, context: int) -> tuple[int, int]:
    """(weights, K/V) bytes one decode step must read: the weights once per pass (all but the embedding, whose rows
    are gathered; EAGLE-3's ``fc`` in the context pass only), each sequence's cached K/V once per pass."""
    spec = head.spec
    size = head.embed_tokens.weight.element_size()
    weights = sum(p.numel() for name, p in head.named_parameters() if not name.startswith("embed_tokens")) * size
    fc = head.fc.weight.numel() * size if spec.method.value == "eagle3" else 0
    kv_row = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * size  # K and V, one position, all layers
    keys = sum(context + ROWS_PER_DECODE + j for j in range(K))  # keys each sequence reads, pass by pass
    return K * weights - (K - 1) * fc, batch * keys * kv_row


def attention_alone(engine: DrafterEngine, batch: int, position: int, device: str, repeats: int) -> float | None:
    """ms of one step's attention calls alone (2 rows per sequence, then k - 1 passes of one), on the engine's cache
    with its kernel, replayed from a CUDA graph (None on a CPU)."""
    if not device.startswith("cuda"):
        return None
    spec, cache = engine.spec, engine.cache
    dev = torch.device(device)
    slots = torch.arange(batch, device=dev)
    zeros = torch.zeros(batch, dtype=torch.long, device=dev)
    calls = []
    for rows in [torch.arange(position, position + ROWS_PER_DECODE)] + [
            torch.tensor([position + ROWS_PER_DECODE + j]) for j in range(K - 1)]:
        q_pos = rows.to(dev)[None].expand(batch, -1).contiguous()
        q = torch.randn(batch, rows.numel(), spec.num_heads, spec.head_dim, dtype=engine.dtype, device=dev)
        calls.append((q, SlotRows(slots, q_pos, zeros, zeros, zeros)))
    width = min(cache.max_len, position + ROWS_PER_DECODE + K)

    def run() -> None:
        for layer in range(spec.num_layers):
            for q, rows in calls:
                slot_attention(q, cache.k[layer], cache.v[layer], rows, engine.chunks[layer],
                               engine.attention_backend, width)

    return graph_timed(device, run, repeats)


def measure(method: str, batch: int, context: int, args: argparse.Namespace, device: str, dtype: torch.dtype
            ) -> dict[str, Any]:
    spec = head_spec_from_dict(head_config(method, args.small))
    head = random_head(spec, device, dtype)
    max_len = context + ROWS_PER_DECODE * (args.steps + 2) + K + 1
    fixed = {"auto": None, "on": True, "off": False}[args.fixed_shape]
    engine = DrafterEngine(head, DrafterEngineConfig(max_model_len=max_len, max_num_seqs=batch,
                                                     fixed_shape_steps=fixed), device=device, dtype=dtype)
    rows = max(args.prefill_rows, context, batch * ROWS_PER_DECODE)
    hidden = host_hidden(rows, spec.fused_hidden_size, dtype)
    fill(engine, batch, context, hidden, args.prefill_rows)
    position = context
    times, host, bookkeeping = [], [], []
    for i in range(args.steps + 1):  # the first step is a warm-up (and captures the step's graph)
        step, h = make_step(i, [(f"s{b}", position, ROWS_PER_DECODE) for b in range(batch)], spec.vocab_size, hidden)
        sync(device)
        start = time.perf_counter()
        engine.draft_tensors(step, h, precompute=False)
        sync(device)
        if i:
            times.append((time.perf_counter() - start) * 1e3)
            if engine.decode is not None:
                host.append((engine.decode.launched_at - start) * 1e3)
                bookkeeping.append((engine.decode.started_at - start) * 1e3)
        position += ROWS_PER_DECODE
    cache = engine.cache
    slot_bytes = sum(t[0].numel() * t[0].element_size() for t in (*cache.k, *cache.v))
    graphs = engine.decode is not None and engine.decode.graphs is not None and engine.decode.graphs.replays > 0
    result: dict[str, Any] = {
        "kernel": engine.attention_backend + ("+graphs" if graphs else ""),
        "engine": statistics.median(times),
        "host": statistics.median(host) if host else None,
        "bookkeeping": statistics.median(bookkeeping) if bookkeeping else None,
        "kv_mib_seq": slot_bytes / 2**20,
        "kv_mib": slot_bytes * cache.num_slots / 2**20,
        "attention": attention_alone(engine, batch, position, device, args.steps),
    }
    if args.sweep and device.startswith("cuda") and method == "eagle3" and batch in (min(args.batch), max(args.batch)):
        result["sweep"] = []
        default = launch_config()
        for block_n, warps, stages in SWEEP:
            launch_config(block_n, warps, stages)
            result["sweep"].append((block_n, warps, stages, attention_alone(engine, batch, position, device,
                                                                            args.steps)))
        launch_config(**default)
    del engine, cache
    step_ids = torch.from_numpy(np.random.randint(0, spec.vocab_size, batch * ROWS_PER_DECODE))
    pos = torch.arange(context, context + ROWS_PER_DECODE).repeat(batch)
    result["floor"] = timed(device, lambda: floor_step(head, step_ids, hidden[: batch * ROWS_PER_DECODE], pos),
                            args.steps)
    dev_ids, dev_pos = step_ids.to(device), pos.to(device)
    dev_hidden = hidden[: batch * ROWS_PER_DECODE].to(device)
    result["graph_floor"] = graph_timed(device, lambda: floor_passes(head, dev_ids, dev_hidden, dev_pos), args.steps)
    result["weight_bytes"], result["kv_bytes"] = step_bytes(head, batch, context)
    result["recompute"] = None
    if batch * context <= args.recompute_max_tokens:
        ctx_ids = torch.from_numpy(np.random.randint(0, spec.vocab_size, context)).to(device)
        ctx_hidden = hidden[:context].to(device)
        result["recompute"] = timed(device, lambda: recompute_step(head, batch, ctx_ids, ctx_hidden),
                                    args.recompute_repeats)
    return result


def measure_branches(method: str, batch: int, context: int, args: argparse.Namespace, device: str,
                     dtype: torch.dtype) -> dict[str, Any]:
    """Pipelined drafting (``actors.drafter.branches``): ms of the step's answer (``draft_tensors``), of the work
    after it (``after_step``) and of the branch passes inside that, median over ``--steps`` steps, each sequence
    with up to 2 + k branches (a fan-out of 2 bonus guesses and one recovered guess per position, at most 128 rows)."""
    spec = head_spec_from_dict(head_config(method, args.small))
    head = random_head(spec, device, dtype)
    max_len = context + ROWS_PER_DECODE * (args.steps + 2) + 2 * K + 1
    config = DrafterEngineConfig(max_model_len=max_len, max_num_seqs=batch,
                                 fixed_shape_steps={"auto": None, "on": True, "off": False}[args.fixed_shape],
                                 branches=BranchConfig(bonus_fanout=2, recovered_fanout=1, max_branch_rows=128))
    engine = DrafterEngine(head, config, device=device, dtype=dtype)
    hidden = host_hidden(max(args.prefill_rows, context, batch * ROWS_PER_DECODE), spec.fused_hidden_size, dtype)
    fill(engine, batch, context, hidden, args.prefill_rows)
    engine.after_step()
    passes = engine.branch_passes
    inner: list[float] = []
    if passes is not None:
        run = passes.run

        def timed_run(*a, **kw):
            sync(device)
            start = time.perf_counter()
            out = run(*a, **kw)
            inner.append((time.perf_counter() - start) * 1e3)
            return out

        passes.run = timed_run
    answer, after, rows, position = [], [], [], context
    for i in range(args.steps + 1):
        step, h = make_step(i, [(f"s{b}", position, ROWS_PER_DECODE) for b in range(batch)], spec.vocab_size, hidden)
        sync(device)
        start = time.perf_counter()
        engine.draft_tensors(step, h)
        sync(device)
        middle = time.perf_counter()
        made = engine.after_step()
        sync(device)
        if i:
            answer.append((middle - start) * 1e3)
            after.append((time.perf_counter() - middle) * 1e3)
            rows.append(sum(len(entry.drafts) for entry in made.values()))
        position += ROWS_PER_DECODE
    graphs = passes is not None and passes.graphs is not None and passes.graphs.replays > 0
    return {"rows": statistics.median(rows), "answer": statistics.median(answer), "after": statistics.median(after),
            "passes": statistics.median(inner[1:]) if len(inner) > 1 else None,
            "kernel": engine.attention_backend + ("+graphs" if graphs else "")}


SWEEP = [(32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 4, 2)]  # (block_n, warps, stages)


def row(method: str, batch: int, context: int, r: dict[str, Any], bandwidth: float | None) -> str:
    """One table row (``main``'s header names the columns)."""
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    floor = r["graph_floor"] or r["floor"]
    bound = 1.3 * floor if batch <= 8 else 1.5 * (floor + (r["attention"] or 0.0))
    tbs = r["kv_bytes"] / (r["attention"] / 1e3) / 1e12 if r["attention"] else None
    roof = (r["weight_bytes"] + r["kv_bytes"]) / bandwidth * 1e3 if bandwidth else None
    return " | ".join([
        method, str(batch), str(context), r["kernel"], ms(r["engine"]), ms(r["host"]), ms(r["floor"]),
        ms(r["graph_floor"]), ms(r["attention"]), "-" if tbs is None else f"{tbs:.2f}", ms(roof),
        ms(r["recompute"]), f"{r['engine'] / floor:.2f}", f"{r['engine'] / bound:.2f}", f"{r['kv_mib_seq']:.4g}",
        f"{r['kv_mib']:.4g}",
    ])


def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--small", action="store_true", help="tiny shapes, for a CPU (seconds)")
    p.add_argument("--heads", nargs="*", choices=["eagle", "eagle3"], default=["eagle", "eagle3"])
    p.add_argument("--batch", type=int, nargs="*", default=None, help="default 1 8 32 64 128 (--small: 1 4)")
    p.add_argument("--context", type=int, nargs="*", default=None, help="default 1024 8000 (--small: 32 96)")
    p.add_argument("--steps", type=int, default=None, help="timed decode steps (default 20, --small 3)")
    p.add_argument("--device", default=None, help="default: cuda if torch sees one, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    p.add_argument("--prefill-rows", type=int, default=16384, help="rows per prefill step")
    p.add_argument("--recompute-max-tokens", type=int, default=262144, help="skip recompute past batch x context")
    p.add_argument("--recompute-repeats", type=int, default=2)
    p.add_argument("--fixed-shape", choices=["auto", "on", "off"], default="auto",
                   help="decode steps on fixed-shape buffers (actors.drafter.decode_step); auto: on CUDA only")
    p.add_argument("--branches", action="store_true",
                   help="also time pipelined drafting's steps and branch passes (smallest context)")
    p.add_argument("--sweep", action="store_true", help="also time the attention under a few Triton launch settings")


def run_device(args: argparse.Namespace) -> None:
    """``device``: the engine at Scout (or ``--small``) shapes, one row per head, context and batch."""
    args.batch = args.batch or ([1, 4] if args.small else [1, 8, 32, 64, 128])
    args.context = args.context or ([32, 96] if args.small else [1024, 8000])
    args.steps = args.steps or (3 if args.small else 20)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")]
    if device == "cpu":
        torch.set_num_threads(args.threads)
    np.random.seed(0)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    bandwidth = copy_bandwidth(device)
    print(f"# drafter device: {name}, {str(dtype).removeprefix('torch.')}, torch {torch.__version__}, k={K}, "
          f"{'small' if args.small else 'Scout'} shapes, {args.steps} timed steps")
    if bandwidth:
        print(f"# copy bandwidth: {bandwidth / 1e12:.2f} TB/s (bytes read and written)")
    print("head | batch | context | kernel | engine ms | host ms | eager floor ms | graph floor ms | attention ms | "
          "attn TB/s | roofline ms | recompute ms | engine/floor | goal | KV MiB/seq | KV MiB")
    sweeps, splits = [], []
    for method in args.heads:
        for context in args.context:
            for batch in args.batch:
                with torch.inference_mode():
                    r = measure(method, batch, context, args, device, dtype)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()  # the last configuration's head and cache are gone: hand memory back
                print(row(method, batch, context, r, bandwidth), flush=True)
                sweeps += [(method, batch, context, *s) for s in r.get("sweep", [])]
                if r["bookkeeping"] is not None:
                    splits.append(f"host: {method} | {batch} | {context} | {r['bookkeeping']:.3f} | "
                                  f"{r['host'] - r['bookkeeping']:.3f}")
    if splits:
        print("host: head | batch | context | engine bookkeeping ms | fixed-shape step's pack, copies, launch ms")
        print("\n".join(splits))
    if args.branches:
        print("branches: head | batch | context | kernel | branch rows | answer ms | after_step ms | branch passes ms")
        for method in args.heads:
            for batch in args.batch:
                context = min(args.context)
                with torch.inference_mode():
                    b = measure_branches(method, batch, context, args, device, dtype)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                passes = "-" if b["passes"] is None else f"{b['passes']:.2f}"
                print(f"branches: {method} | {batch} | {context} | {b['kernel']} | {b['rows']:.0f} | "
                      f"{b['answer']:.2f} | {b['after']:.2f} | {passes}", flush=True)
    if sweeps:
        print("sweep: head | batch | context | block_n | warps | stages | attention ms")
        for method, batch, context, block_n, warps, stages, ms in sweeps:
            print(f"sweep: {method} | {batch} | {context} | {block_n} | {warps} | {stages} | {ms:.3f}")


# --- step: the engine on a shipped head, one CPU core ----------------------------------------------------------------
def synthetic_step(step_id: int, batch: int, position: int, rows: int, k: int, width: int,
                   order: list[int] | None = None) -> tuple[DraftStep, torch.Tensor]:
    """A step of ``rows`` random rows per sequence (in ``order``, else in arrival order) at ``position``."""
    seqs = [SeqSlice(f"s{b}", i * rows, rows, position) for i, b in enumerate(order or range(batch))]
    ids = np.random.randint(0, 4000, batch * rows).astype(np.int32)
    return DraftStep(step_id, k, seqs, ids), torch.randn(batch * rows, width)


def step_ms(method: str, batch: int, steps: int, k: int, profile: bool, shuffled: bool = False,
            gap_ms: float = 0.0) -> float:
    """Median ms of a synchronous decode step of the shipped ``method`` head (``--gap-ms`` idle after each)."""
    from cluster.harness import HEADS, TARGET

    engine = DrafterEngine.from_checkpoint(HEADS[method], TARGET, DrafterEngineConfig(max_model_len=1032))
    width = engine.spec.fused_hidden_size
    engine.draft_tensors(*synthetic_step(0, batch, 0, 100, k, width))
    order = [int(i) for i in np.random.RandomState(batch).permutation(batch)] if shuffled else None
    times, position = [], 100
    for i in range(steps):
        step, hidden = synthetic_step(i + 1, batch, position, 2, k, width, order)
        position += 2
        start = time.perf_counter()
        engine.draft_tensors(step, hidden)
        times.append((time.perf_counter() - start) * 1e3)
        if gap_ms:
            time.sleep(gap_ms / 1e3)  # idle between steps, as a served drafter waits for the verifier's next one
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for i in range(100):
            engine.draft_tensors(*synthetic_step(steps + i + 1, batch, position + 2 * i, 2, k, width, order))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return statistics.median(times)


def run_step(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    print("head | batch | idle ms between steps | ms per step (median)")
    for method in args.heads:
        for batch in args.batch:
            for gap in args.gap_ms:
                ms = step_ms(method, batch, args.steps, args.k, args.profile, args.shuffled, gap)
                print(f"{method} | {batch} | {gap:g} | {ms:.2f}", flush=True)


# --- ray-call: what one drafting call costs on Ray -------------------------------------------------------------------
def median_ms(fn: Callable[[], Any], n: int = 200) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_ray_call(args: argparse.Namespace) -> None:
    import ray

    @ray.remote(max_concurrency=1)
    class Echo:
        def call(self, message: bytes, hidden: Any) -> bytes:
            return message

        def table(self) -> bytes:
            return b"x" * 200

        def stream(self, message: bytes, hidden: Any) -> Any:
            yield message
            yield b"table"

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = Echo.remote()
    ray.get(actor.table.remote())
    message = b"s" * 200
    print("call | [4, 256] fp32 | [16, 768] fp32 (EAGLE-3 rows of the tiny target)")
    rows: dict[str, list[float]] = {}
    for shape in ((4, 256), (16, 768)):
        hidden = np.random.rand(*shape).astype(np.float32)
        for name, fn in {
            "actor call, array inline, waited": lambda h=hidden: ray.get(actor.call.remote(message, h)),
            "actor call, ray.put + ObjectRef, waited": lambda h=hidden: ray.get(actor.call.remote(message, ray.put(h))),
            "streaming generator, first item": lambda h=hidden: ray.get(
                next(actor.stream.options(num_returns="streaming").remote(message, h))),
            "actor call submitted, not waited for": lambda h=hidden: actor.call.remote(message, h),
        }.items():
            rows.setdefault(name, []).append(median_ms(fn))
    ready = actor.table.remote()
    ray.get(ready)
    rows["a ready result: ray.wait(timeout=0) + ray.get"] = [median_ms(lambda: (ray.wait([ready], timeout=0),
                                                                                 ray.get(ready)))] * 2
    for name, (a, b) in rows.items():
        print(f"{name} | {a:.3f} ms | {b:.3f} ms")
    ray.shutdown()


# --- transport: the hidden rows' trip, host vs shared memory, at Scout's bytes ------------------------------------
SCOUT_EAGLE3_WIDTH = 3 * 5120  # three aux layers of Scout's hidden size
TRANSPORT_CASES = [("batch 1 x 4 rows", 4), ("batch 8 x 4", 32), ("batch 32 x 4", 128), ("batch 128 x 4", 512),
                   ("prompt 2k", 2048), ("prompt 32k", 32768)]


def run_transport(args: argparse.Namespace) -> None:
    import json

    import ray

    from actors.messages import ShmRows
    from actors.shm_rows import RowsReader
    from actors.verifier.transport import HostRows, ShmTransport, StepRows, TransportConfig, TransportStats, host_copies

    @ray.remote(max_concurrency=1)
    class Sink:
        """A drafter's call signatures; reads the first and last row where they arrived."""

        def __init__(self) -> None:
            self.reader = RowsReader()

        def draft_step(self, message: bytes, hidden: np.ndarray) -> bytes:
            return message[:8] + hidden[0, :1].tobytes() + hidden[-1, -1:].tobytes()

        def draft_step_shm(self, message: bytes, meta: bytes) -> bytes:
            m = ShmRows.unpack(meta)
            hidden = self.reader.view(m, "bfloat16")
            out = message[:8] + hidden[0, :1].tobytes() + hidden[-1, -1:].tobytes()
            del hidden
            self.reader.check_unchanged(m)
            return out

        def open_rows(self, name: str, nonce: str) -> bool:
            self.reader.open(name, nonce)
            return True

        def close_rows(self, name: str) -> None:
            self.reader.close(name)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = Sink.remote()
    message = b"s" * 200  # a sub-step's msgpack, about
    cases = [c for c in TRANSPORT_CASES if c[1] <= args.max_rows]
    print("case | rows | MB | path | host copies | host-side ms | round trip ms")
    out = []
    for name, n in cases:
        hidden = torch.randint(-2000, 2000, (n, SCOUT_EAGLE3_WIDTH), dtype=torch.int16).view(torch.bfloat16)
        rows = StepRows(hidden)  # [n, 15360] int16 bits
        idx = np.arange(n)  # one home, the whole step
        mb = rows.nbytes(idx) / 1e6
        for path in ("host", "shm"):
            stats = TransportStats()
            if path == "host":
                transport: Any = HostRows(stats)
            else:
                transport = ShmTransport(actor, TransportConfig("shm", 2, rows.nbytes(idx) / 2**20 + 1), stats)
                assert transport.wait_open(30), "the actor did not map the region"
            ship, trip = [], []
            for i in range(args.repeats + 3):
                start = time.perf_counter()
                ref = transport.send(actor, message, rows, idx)
                sent = time.perf_counter()
                ray.get(ref)
                done = time.perf_counter()
                if i >= 3:  # the first touch of each slot's pages is not a step's cost
                    ship.append((sent - start) * 1e3)
                    trip.append((done - start) * 1e3)
                del ref
            assert stats.sent == {path: args.repeats + 3}, stats.as_dict()  # no fallback: the path named
            transport.close()
            copies = host_copies(path, whole_step=True)  # one home takes the step
            r = [name, str(n), f"{mb:.2f}", path, str(copies), f"{statistics.median(ship):.3f}",
                 f"{statistics.median(trip):.3f}"]
            out.append(r)
            print(" | ".join(r), flush=True)
        del hidden, rows
    ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


# --- the command line -----------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="run", required=True)
    add_device_args(sub.add_parser("device", help="the engine at Scout shapes on an accelerator (--small: a CPU)"))
    s = sub.add_parser("step", help="the engine on a shipped head, synchronous steps, one torch thread")
    s.add_argument("--heads", nargs="*", choices=["eagle", "eagle3"], default=["eagle", "eagle3"])
    s.add_argument("--batch", type=int, nargs="*", default=[1, 16])
    s.add_argument("--steps", type=int, default=200)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--profile", action="store_true")
    s.add_argument("--shuffled", action="store_true", help="decode steps list their sequences shuffled")
    s.add_argument("--gap-ms", type=float, nargs="*", default=[0.0],
                   help="idle milliseconds after each step (a served drafter idles while the verifier verifies); "
                        "several: one row each")
    sub.add_parser("ray-call", help="what one drafting call costs on Ray (needs Ray)")
    t = sub.add_parser("transport", help="a step's hidden rows at Scout's bytes, host vs shared memory (needs Ray)")
    t.add_argument("--repeats", type=int, default=30)
    t.add_argument("--max-rows", type=int, default=32768, help="leave out the cases with more rows")
    t.add_argument("--json", help="also write the rows here")
    return p


# Where each run's processes are (the stamp's hardware).
PLACEMENT = {"device": "the drafter engine alone in this process",
             "step": "the drafter engine alone in this process, one torch thread",
             "ray-call": "this driver and one Ray actor, nothing pinned",
             "transport": "this driver and one Ray actor on one node, nothing pinned"}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    print(stamp.line(stamp.stamp(PLACEMENT[args.run])), flush=True)
    {"device": run_device, "step": run_step, "ray-call": run_ray_call, "transport": run_transport}[args.run](args)


if __name__ == "__main__":
    main()
